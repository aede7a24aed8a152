#include "poolscope/profiler/line_profile.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

#include "poolscope/error.hpp"

namespace poolscope::profiler {

namespace {

using ojson = nlohmann::ordered_json;

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
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
  j["format"] = line_profile_format;
  j["version"] = line_profile_format_version;
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

}  // namespace poolscope::profiler
