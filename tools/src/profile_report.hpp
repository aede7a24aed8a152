// How `poolscope report` prints a line profile: a tree of call sites with labelled columns
// (used, acquired and calls, and with show_live the live figures), each frame's function without
// its parameter list unless asked, call sites below a threshold (by default a share of the
// profile's peak) left out, and at most `top` callees under each call site; what is left out is
// summed on one line, so the totals still add up.
//
//   profile_report_options o;
//   o.threshold_bytes = resolve_threshold("1%", p);   // 1 % of the peak live bytes
//   std::cout << profile_report_text(p, o);
//
// Header-only (the tools' tests compile it). Thread safety: reentrant. Cost: linear in the
// nodes, plus sorting each node's children.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "poolscope/byte_size.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/line_profile.hpp"

namespace poolscope::tools {

/// What profile_report_text shows.
struct profile_report_options {
  std::uint64_t threshold_bytes = 0;  ///< call sites below this in used and acquired are left out
  std::string threshold_text;         ///< how the threshold was given, for the header
  std::size_t top = 10;               ///< callees shown under each call site (0: all)
  bool full_names = false;            ///< keep functions' parameter lists
  bool show_live = false;             ///< also live, live-at-peak bytes
  /// Runs of interpreter frames collapsed into one node each, and the frames they stand for
  /// (analysis/interpreter_frames.hpp), for the header.
  std::size_t interpreter_runs = 0;
  std::size_t interpreter_frames = 0;
};

namespace profile_report_detail {

/// `name` with the parameter list of each function it is nested in (a lambda's or a local class's
/// enclosing function: "f(int, char)::{lambda()#1}") as "(...)", its qualifiers dropped; lists
/// that are empty, "(anonymous namespace)", and lists not followed by "::" (a lambda's own, a
/// function type's) are kept.
inline std::string without_enclosing_lists(std::string_view name) {
  std::string out;
  std::size_t i = 0;
  while (i < name.size()) {
    if (name[i] != '(') {
      out += name[i++];
      continue;
    }
    std::size_t depth = 0;
    std::size_t close = i;
    for (; close < name.size(); ++close) {
      if (name[close] == '(') {
        ++depth;
      } else if (name[close] == ')' && --depth == 0) {
        break;
      }
    }
    if (close == name.size()) {
      out.append(name.substr(i));  // unbalanced: as it is
      break;
    }
    std::size_t next = close + 1;
    for (bool more = true; more;) {
      more = false;
      for (const std::string_view q :
           {" const", " volatile", " &&", " &", "&&", "&", " noexcept"}) {
        if (name.substr(next).starts_with(q)) {
          next += q.size();
          more = true;
        }
      }
    }
    const std::string_view inner = name.substr(i + 1, close - i - 1);
    if (name.substr(next).starts_with("::") && !inner.empty() && inner != "anonymous namespace") {
      out += "(...)";
      i = next;
    } else {
      out += name[i++];
    }
  }
  return out;
}

/// `full` without its trailing parameter list and qualifiers (see short_function_name).
inline std::string without_trailing_list(std::string_view full) {
  // From the end: skip qualifiers after the last ')' (const, &, noexcept...), then find the '('
  // matching it, counting nesting of (), <> and [].
  const std::size_t close = full.rfind(')');
  if (close == std::string_view::npos) {
    return std::string(full);
  }
  const std::string_view after = full.substr(close + 1);
  if (after.find_first_of("(<>[]:") != std::string_view::npos) {
    return std::string(full);  // ")" inside a template argument or a nested name: not a list
  }
  int depth = 0;
  for (std::size_t i = close + 1; i-- > 0;) {
    const char c = full[i];
    if (c == ')' || c == '>' || c == ']') {
      ++depth;
    } else if (c == '(' || c == '<' || c == '[') {
      --depth;
      if (depth == 0) {
        if (c != '(') {
          return std::string(full);
        }
        std::string_view head = full.substr(0, i);
        // "operator()" keeps its own parentheses.
        if (head.ends_with("operator()") || i == 0) {
          return std::string(i == 0 ? full : head);
        }
        if (head.ends_with("operator")) {
          return std::string(full.substr(0, close + 1));
        }
        return std::string(head);
      }
    }
  }
  return std::string(full);
}

}  // namespace profile_report_detail

/// `full` without its trailing parameter list and qualifiers, and with the parameter lists of the
/// functions it is nested in shortened to "(...)": "ns::f<int>(int, char const*) const" ->
/// "ns::f<int>"; "operator()(int)" -> "operator()"; "ns::f(int)::{lambda()#1}::operator()() const"
/// -> "ns::f(...)::{lambda()#1}::operator()". A name without lists is returned as it is.
inline std::string short_function_name(std::string_view full) {
  return profile_report_detail::without_enclosing_lists(
      profile_report_detail::without_trailing_list(full));
}

/// "12.30 MiB", "512 B": bytes in the largest binary unit below them, two decimals.
inline std::string compact_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  std::size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

/// The threshold in bytes from "--threshold": "N%" is that share of the profile's peak live
/// bytes (of its total used bytes when it has no peak), anything else a byte count (1M). Throws
/// invalid_argument naming the text.
inline std::uint64_t resolve_threshold(const std::string& text, const profiler::line_profile& p) {
  if (!text.empty() && text.back() == '%') {
    const std::string number = text.substr(0, text.size() - 1);
    char* end = nullptr;
    const double share = std::strtod(number.c_str(), &end);
    if (number.empty() || end != number.c_str() + number.size() || !(share >= 0) || share > 100) {
      throw invalid_argument("--threshold '" + text +
                             "': a share of the peak must be from 0% to 100%");
    }
    const std::uint64_t peak = p.peak_live != 0 ? p.peak_live : p.root.total.used;
    return static_cast<std::uint64_t>(static_cast<double>(peak) * share / 100.0);
  }
  return parse_byte_size(text);
}

namespace profile_report_detail {

inline bool shown(const profiler::profile_node& n, const profile_report_options& o) {
  return std::max(n.total.used, n.total.acquired) >= o.threshold_bytes;
}

inline std::string label(const profiler::profile_node& n, const profile_report_options& o) {
  if (o.full_names || n.function.empty()) {
    return n.label();
  }
  profiler::profile_node bare;
  bare.function = short_function_name(n.function);
  bare.file = n.file;
  bare.line = n.line;
  bare.module = n.module;
  bare.offset = n.offset;
  bare.address = n.address;
  return bare.label();
}

inline void row(std::vector<std::vector<std::string>>& rows, const profiler::profile_counts& c,
                const profile_report_options& o, std::string site) {
  std::vector<std::string> r{compact_bytes(c.used), compact_bytes(c.acquired),
                             std::to_string(c.count)};
  if (o.show_live) {
    r.push_back(compact_bytes(c.live));
    r.push_back(compact_bytes(c.live_at_peak));
  }
  r.push_back(std::move(site));
  rows.push_back(std::move(r));
}

inline void walk(const profiler::profile_node& n, int depth, const profile_report_options& o,
                 std::vector<std::vector<std::string>>& rows) {
  row(rows, n.total, o, std::string(static_cast<std::size_t>(depth) * 2, ' ') + label(n, o));
  std::vector<const profiler::profile_node*> kids;
  kids.reserve(n.children.size());
  for (const auto& c : n.children) {
    kids.push_back(&c);
  }
  std::sort(kids.begin(), kids.end(), [](const auto* a, const auto* b) {
    return a->total.used != b->total.used ? a->total.used > b->total.used
                                          : a->total.acquired > b->total.acquired;
  });
  profiler::profile_counts hidden;
  std::size_t hidden_sites = 0;
  std::size_t listed = 0;
  for (const auto* c : kids) {
    if (shown(*c, o) && (o.top == 0 || listed < o.top)) {
      walk(*c, depth + 1, o, rows);
      ++listed;
    } else {
      hidden += c->total;
      ++hidden_sites;
    }
  }
  if (hidden_sites != 0) {
    row(rows, hidden, o,
        std::string(static_cast<std::size_t>(depth + 1) * 2, ' ') + "(" +
            std::to_string(hidden_sites) + " more call site" + (hidden_sites == 1 ? "" : "s") +
            ", below the threshold or past --top)");
  }
}

}  // namespace profile_report_detail

/// The profile as a labelled table: a header naming the totals and what was left out, then one
/// row per call site shown (figures of its whole subtree), callees indented under their caller.
inline std::string profile_report_text(const profiler::line_profile& p,
                                       const profile_report_options& o) {
  namespace d = profile_report_detail;
  std::string out = "line profile: " + std::to_string(p.root.total.count) + " allocations, " +
                    compact_bytes(p.root.total.used) + " requested (used), " +
                    compact_bytes(p.root.total.acquired) +
                    " taken from the upstream resource (acquired), peak live " +
                    compact_bytes(p.peak_live) + "\n";
  out += "call sites with at least " + compact_bytes(o.threshold_bytes) + " used or acquired" +
         (o.threshold_text.empty() ? std::string() : " (--threshold " + o.threshold_text + ")") +
         (o.top == 0 ? std::string()
                     : ", at most " + std::to_string(o.top) + " callees each (--top)") +
         (o.full_names ? std::string() : "; functions without parameter lists (--full-names)") +
         "\n";
  if (o.interpreter_runs != 0) {
    out += std::to_string(o.interpreter_frames) + " Python interpreter frames shown as " +
           std::to_string(o.interpreter_runs) + " node" + (o.interpreter_runs == 1 ? "" : "s") +
           " (... N interpreter frames; --full-stacks shows them)\n";
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head{"used", "acquired", "calls"};
  if (o.show_live) {
    head.push_back("live");
    head.push_back("live at peak");
  }
  head.push_back("call site (figures include its callees)");
  rows.push_back(head);
  d::walk(p.root, 0, o, rows);
  // Figures right-aligned, the call site left-aligned and last.
  std::vector<std::size_t> width(head.size(), 0);
  for (const auto& r : rows) {
    for (std::size_t c = 0; c + 1 < r.size(); ++c) {
      width[c] = std::max(width[c], r[c].size());
    }
  }
  for (const auto& r : rows) {
    for (std::size_t c = 0; c + 1 < r.size(); ++c) {
      out += std::string(width[c] - r[c].size(), ' ') + r[c] + "  ";
    }
    out += r.back() + "\n";
  }
  return out;
}

}  // namespace poolscope::tools
