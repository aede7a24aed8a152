#include "poolscope/profiler/line_profile.hpp"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "detail/json_text.hpp"
#include "poolscope/error.hpp"

namespace poolscope::profiler {

namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* format_name = "poolscope.line_profile";
constexpr int format_version = 1;

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

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
                           detail::json_shown(v) + " is not an integer in [" + std::to_string(lo) +
                           ", " + std::to_string(hi) + "]");
  }
  return v.get<std::int64_t>();
}

std::string short_bytes(std::uint64_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  char buf[32];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 "B", bytes);
    return buf;
  }
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 6) {
    v /= 1024.0;
    ++unit;
  }
  std::snprintf(buf, sizeof buf, "%.2f%s", v, units[unit]);
  return buf;
}

std::string basename_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

ojson counts_to_json(const profile_counts& c) {
  ojson j;
  j["count"] = c.count;
  j["used"] = c.used;
  j["rounded"] = c.rounded;
  j["freed"] = c.freed;
  j["live"] = c.live;
  j["live_at_peak"] = c.live_at_peak;
  j["acquire_count"] = c.acquire_count;
  j["acquired"] = c.acquired;
  j["live_acquired"] = c.live_acquired;
  return j;
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

ojson node_to_json(const profile_node& n) {
  ojson j;
  j["function"] = n.function;
  j["file"] = n.file;
  j["line"] = n.line;
  j["module"] = n.module;
  j["offset"] = hex(n.offset);
  j["address"] = hex(n.address);
  j["label"] = n.label();
  j["self"] = counts_to_json(n.self);
  j["total"] = counts_to_json(n.total);
  ojson kids = ojson::array();
  for (const auto& c : n.children) {
    kids.push_back(node_to_json(c));
  }
  j["children"] = std::move(kids);
  return j;
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

const profile_counts& totals_of(profile_node& n) {
  n.total = n.self;
  for (auto& c : n.children) {
    n.total += totals_of(c);
  }
  return n.total;
}

std::vector<const profile_node*> sorted_children(const profile_node& n) {
  std::vector<const profile_node*> out;
  out.reserve(n.children.size());
  for (const auto& c : n.children) {
    out.push_back(&c);
  }
  std::stable_sort(out.begin(), out.end(), [](const profile_node* a, const profile_node* b) {
    if (a->total.used != b->total.used) {
      return a->total.used > b->total.used;
    }
    return a->total.acquired > b->total.acquired;
  });
  return out;
}

void text_lines(const profile_node& n, int depth, const text_options& o, std::string& out) {
  if (depth > 0 && n.total.used < o.threshold_bytes && n.total.acquired < o.threshold_bytes) {
    return;
  }
  out.append(static_cast<std::size_t>(depth) * 2, ' ');
  out += n.label();
  out += " (";
  out += short_bytes(n.total.used);
  out += ", ";
  out += short_bytes(n.total.acquired);
  out += ')';
  if (o.show_live) {
    out += " live ";
    out += short_bytes(n.total.live);
    out += ", at peak ";
    out += short_bytes(n.total.live_at_peak);
    out += ", calls ";
    out += std::to_string(n.total.count);
  }
  out += '\n';
  for (const profile_node* c : sorted_children(n)) {
    text_lines(*c, depth + 1, o, out);
  }
}

void folded_lines(const profile_node& n, profile_metric m, std::string& path, std::string& out) {
  const std::size_t keep = path.size();
  if (!path.empty()) {
    path += ';';
  }
  path += n.label();
  const std::uint64_t v = profile_node::value(n.self, m);
  if (v != 0) {
    out += path;
    out += ' ';
    out += std::to_string(v);
    out += '\n';
  }
  for (const auto& c : n.children) {
    folded_lines(c, m, path, out);
  }
  path.resize(keep);
}

}  // namespace

profile_counts& profile_counts::operator+=(const profile_counts& o) noexcept {
  count += o.count;
  used += o.used;
  rounded += o.rounded;
  freed += o.freed;
  live += o.live;
  live_at_peak += o.live_at_peak;
  acquire_count += o.acquire_count;
  acquired += o.acquired;
  live_acquired += o.live_acquired;
  return *this;
}

std::string_view to_string(profile_metric m) noexcept {
  switch (m) {
    case profile_metric::used:
      return "used";
    case profile_metric::rounded:
      return "rounded";
    case profile_metric::acquired:
      return "acquired";
    case profile_metric::live:
      return "live";
    case profile_metric::live_at_peak:
      return "live_at_peak";
    case profile_metric::count:
      return "count";
  }
  return "unknown";
}

profile_metric parse_profile_metric(std::string_view name) {
  for (auto m : {profile_metric::used, profile_metric::rounded, profile_metric::acquired,
                 profile_metric::live, profile_metric::live_at_peak, profile_metric::count}) {
    if (to_string(m) == name) {
      return m;
    }
  }
  throw invalid_argument("poolscope: unknown profile metric '" + std::string(name) +
                         "' (expected used|rounded|acquired|live|live_at_peak|count)");
}

std::uint64_t profile_node::value(const profile_counts& c, profile_metric m) noexcept {
  switch (m) {
    case profile_metric::used:
      return c.used;
    case profile_metric::rounded:
      return c.rounded;
    case profile_metric::acquired:
      return c.acquired;
    case profile_metric::live:
      return c.live;
    case profile_metric::live_at_peak:
      return c.live_at_peak;
    case profile_metric::count:
      return c.count;
  }
  return 0;
}

std::string profile_node::label() const {
  std::string s;
  if (!function.empty()) {
    s = function;
    if (!file.empty()) {
      s += " (" + basename_of(file) + ":" + std::to_string(line) + ")";
    } else if (!module.empty()) {
      s += " (" + basename_of(module) + "+" + hex(offset) + ")";
    }
  } else if (!module.empty()) {
    s = basename_of(module) + "+" + hex(offset);
  } else {
    s = hex(address);
  }
  // Folded stacks use ';' between frames and one line per stack.
  for (char& ch : s) {
    if (ch == ';') {
      ch = ',';
    } else if (ch == '\n' || ch == '\r') {
      ch = ' ';
    }
  }
  return s;
}

void line_profile::recompute_totals() {
  (void)totals_of(root);
}

std::string line_profile::to_text(const text_options& options) const {
  std::string out;
  text_lines(root, 0, options, out);
  return out;
}

std::string line_profile::to_folded(profile_metric metric) const {
  std::string out;
  // The synthetic root is left out of the paths; what ended at the root itself (no frame of
  // the application left) is written as "<root>".
  const std::uint64_t own = profile_node::value(root.self, metric);
  if (own != 0) {
    out += "<root> " + std::to_string(own) + "\n";
  }
  std::string path;
  for (const auto& c : root.children) {
    folded_lines(c, metric, path, out);
  }
  return out;
}

std::string line_profile::to_json(int indent) const {
  ojson j;
  j["format"] = format_name;
  j["version"] = format_version;
  j["unwinder"] = unwinder;
  j["symbolizer"] = symbolizer;
  j["max_depth"] = max_depth;
  j["complete"] = complete;
  j["events"] = events;
  j["unmatched_frees"] = unmatched_frees;
  j["truncated_stacks"] = truncated_stacks;
  j["deferred_events"] = deferred_events;
  j["peak_live"] = peak_live;
  j["peak_seq"] = peak_seq;
  j["root"] = node_to_json(root);
  return j.dump(indent);
}

line_profile line_profile::from_json(std::string_view json) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument(std::string("poolscope: not a JSON line profile: ") + e.what());
  }
  return from_json_document(j);
}

line_profile line_profile::from_json_document(const nlohmann::json& j) {
  if (!j.is_object() || get_string(j, "format") != format_name) {
    throw invalid_argument(std::string("poolscope: not a line profile (expected \"format\": \"") +
                           format_name + "\")");
  }
  // Compared as JSON: get<int>() would take 4294967297 for version 1.
  if (auto v = j.find("version");
      v == j.end() || !v->is_number_integer() || *v != nlohmann::json(format_version)) {
    throw invalid_argument("poolscope: unsupported line profile version " +
                           (v == j.end() ? std::string("(none)") : detail::json_shown(*v)) +
                           " (this build reads " + std::to_string(format_version) + ")");
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
    return line_profile::from_json(text.str());
  } catch (const invalid_argument& e) {
    throw invalid_argument(path + ": " + e.what());
  }
}

std::string render_line_profile_file(const std::string& path, const text_options& options) {
  return load_line_profile(path).to_text(options);
}

}  // namespace poolscope::profiler
