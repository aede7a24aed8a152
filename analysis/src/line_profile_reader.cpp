#include "poolscope/analysis/line_profile_reader.hpp"

#include <charconv>
#include <cstdint>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "poolscope/error.hpp"
#include "poolscope/profiler/detail/json_text.hpp"

namespace poolscope::analysis {

using profiler::line_profile;
using profiler::line_profile_format;
using profiler::line_profile_format_version;
using profiler::profile_counts;
using profiler::profile_node;
using profiler::text_options;

namespace {

// "0x1a2b" or "1a2b", at most 64 bits. std::stoull would also take "-1" (negated, to 2^64-1),
// " 1a" and "+1a": only hex digits are accepted here.
std::uint64_t parse_hex(const nlohmann::json& j, const char* field) {
  if (j.is_number_unsigned()) {
    return j.get<std::uint64_t>();
  }
  if (!j.is_string()) {
    throw invalid_argument(std::string("poolscope: line profile field '") + field +
                           "' is not a hex string");
  }
  const std::string& s = j.get_ref<const std::string&>();
  std::string_view digits = s;
  if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
    digits.remove_prefix(2);
  }
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v, 16);
  if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size()) {
    throw invalid_argument(
        std::string("poolscope: line profile field '") + field + "' value '" + s +
        (ec == std::errc::result_out_of_range ? "' is out of range (more than 64 bits)"
                                              : "' is not a hex number"));
  }
  return v;
}

/// An integer field that must fit [lo, hi]; get<int>() would wrap 4294967297 to 1.
std::int64_t get_bounded_int(const nlohmann::json& v, const char* field, std::int64_t lo,
                             std::int64_t hi) {
  const bool in_range =
      v.is_number_unsigned()
          ? v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi)
          : v.is_number_integer() && v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi;
  if (!in_range) {
    throw invalid_argument(std::string("poolscope: line profile field '") + field + "' value " +
                           profiler::detail::json_shown(v) + " is not an integer in [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v.get<std::int64_t>();
}

std::uint64_t get_u64(const nlohmann::json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_number_unsigned()) {
    if (it != j.end() && it->is_number_integer() && it->get<std::int64_t>() >= 0) {
      return it->get<std::uint64_t>();
    }
    throw invalid_argument(std::string("poolscope: line profile field '") + field +
                           "' is missing or not a non-negative integer");
  }
  return it->get<std::uint64_t>();
}

profile_counts counts_from_json(const nlohmann::json& j) {
  if (!j.is_object()) {
    throw invalid_argument("poolscope: line profile node figures are not an object");
  }
  profile_counts c;
  c.count = get_u64(j, "count");
  c.used = get_u64(j, "used");
  c.rounded = get_u64(j, "rounded");
  c.freed = get_u64(j, "freed");
  c.live = get_u64(j, "live");
  c.live_at_peak = get_u64(j, "live_at_peak");
  c.acquire_count = get_u64(j, "acquire_count");
  c.acquired = get_u64(j, "acquired");
  c.live_acquired = get_u64(j, "live_acquired");
  return c;
}

std::string get_string(const nlohmann::json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) {
    return {};
  }
  if (!it->is_string()) {
    throw invalid_argument(std::string("poolscope: line profile field '") + field +
                           "' is not a string");
  }
  return it->get<std::string>();
}

// Nodes nested deeper than this are refused: parsing, totals and rendering recurse once per
// level, and a crafted file a million levels deep would overflow the stack. The line profiler
// writes at most 257 levels (the root and max_depth <= 256 frames).
constexpr std::size_t max_json_node_depth = 1024;

profile_node node_from_json(const nlohmann::json& j, std::size_t depth) {
  if (!j.is_object()) {
    throw invalid_argument("poolscope: line profile node is not an object");
  }
  if (depth > max_json_node_depth) {
    throw invalid_argument("poolscope: line profile nodes are nested more than " +
                           std::to_string(max_json_node_depth) +
                           " deep (a line profile has at most 257 levels)");
  }
  profile_node n;
  n.function = get_string(j, "function");
  n.file = get_string(j, "file");
  n.module = get_string(j, "module");
  if (auto it = j.find("line"); it != j.end()) {
    n.line = static_cast<int>(get_bounded_int(*it, "line", 0, std::numeric_limits<int>::max()));
  }
  if (auto it = j.find("offset"); it != j.end()) {
    n.offset = parse_hex(*it, "offset");
  }
  if (auto it = j.find("address"); it != j.end()) {
    n.address = parse_hex(*it, "address");
  }
  auto self = j.find("self");
  if (self == j.end()) {
    throw invalid_argument("poolscope: line profile node has no 'self' figures");
  }
  n.self = counts_from_json(*self);
  if (auto kids = j.find("children"); kids != j.end()) {
    if (!kids->is_array()) {
      throw invalid_argument("poolscope: line profile field 'children' is not an array");
    }
    n.children.reserve(kids->size());
    for (const auto& k : *kids) {
      n.children.push_back(node_from_json(k, depth + 1));
    }
  }
  return n;
}

// totals_of for a loaded document, whose figures are anyone's: a total past 2^64 - 1 is refused
// naming the figure and the node, instead of wrapping. (Depth is bounded by node_from_json.)
const profile_counts& checked_totals_of(profile_node& n) {
  n.total = n.self;
  for (auto& c : n.children) {
    const profile_counts& k = checked_totals_of(c);
    const std::pair<std::uint64_t*, std::uint64_t> sums[] = {
        {&n.total.count, k.count},
        {&n.total.used, k.used},
        {&n.total.rounded, k.rounded},
        {&n.total.freed, k.freed},
        {&n.total.live, k.live},
        {&n.total.live_at_peak, k.live_at_peak},
        {&n.total.acquire_count, k.acquire_count},
        {&n.total.acquired, k.acquired},
        {&n.total.live_acquired, k.live_acquired}};
    static constexpr const char* names[] = {"count",         "used",     "rounded",
                                            "freed",         "live",     "live_at_peak",
                                            "acquire_count", "acquired", "live_acquired"};
    for (std::size_t i = 0; i < std::size(sums); ++i) {
      std::uint64_t& total = *sums[i].first;
      if (total > std::numeric_limits<std::uint64_t>::max() - sums[i].second) {
        throw invalid_argument(std::string("poolscope: line profile figures '") + names[i] +
                               "' of " + n.label() + " and the nodes under it add up to more " +
                               "than 2^64 - 1");
      }
      total += sums[i].second;
    }
  }
  return n.total;
}

}  // namespace

line_profile line_profile_from_json(std::string_view json) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument(std::string("poolscope: not a JSON line profile: ") + e.what());
  }
  return line_profile_from_json_document(j);
}

line_profile line_profile_from_json_document(const nlohmann::json& j) {
  if (!j.is_object() || get_string(j, "format") != line_profile_format) {
    throw invalid_argument(std::string("poolscope: not a line profile (expected \"format\": \"") +
                           line_profile_format + "\")");
  }
  // Compared as JSON: get<int>() would take 4294967297 for version 1.
  if (auto v = j.find("version"); v == j.end() || !v->is_number_integer() ||
                                  *v != nlohmann::json(line_profile_format_version)) {
    throw invalid_argument(
        "poolscope: unsupported line profile version " +
        (v == j.end() ? std::string("(none)") : profiler::detail::json_shown(*v)) +
        " (this build reads " + std::to_string(line_profile_format_version) + ")");
  }
  line_profile p;
  try {
    p.unwinder = get_string(j, "unwinder");
    p.symbolizer = get_string(j, "symbolizer");
    p.max_depth = get_u64(j, "max_depth");
    if (auto c = j.find("complete"); c != j.end() && c->is_boolean()) {
      p.complete = c->get<bool>();
    }
    p.events = get_u64(j, "events");
    p.unmatched_frees = get_u64(j, "unmatched_frees");
    p.truncated_stacks = get_u64(j, "truncated_stacks");
    // Written since the profiler left contended events to the lock's holder; older files lack it.
    p.deferred_events = j.contains("deferred_events") ? get_u64(j, "deferred_events") : 0;
    p.peak_live = get_u64(j, "peak_live");
    p.peak_seq = get_u64(j, "peak_seq");
    auto root = j.find("root");
    if (root == j.end()) {
      throw invalid_argument("poolscope: line profile has no 'root'");
    }
    p.root = node_from_json(*root, 1);
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument(std::string("poolscope: malformed line profile: ") + e.what());
  }
  (void)checked_totals_of(p.root);
  return p;
}

line_profile load_line_profile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw runtime_error("poolscope: cannot open line profile '" + path + "'");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw runtime_error("poolscope: cannot read line profile '" + path + "'");
  }
  try {
    return line_profile_from_json(text.str());
  } catch (const invalid_argument& e) {
    throw invalid_argument(path + ": " + e.what());
  }
}

std::string render_line_profile_file(const std::string& path, const text_options& options) {
  return load_line_profile(path).to_text(options);
}

}  // namespace poolscope::analysis
