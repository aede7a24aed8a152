#include "poolscope/analysis/trace_summary.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "detail/trace_json.hpp"
#include "poolscope/analysis/trace_check.hpp"
#include "poolscope/error.hpp"

namespace poolscope::analysis {

using profiler::activity_class;
using profiler::classify_category;
using profiler::device_overlap;
using profiler::interval;
using profiler::merge_intervals;
using profiler::op_summary;
using profiler::overlap_analyzer;
using profiler::total_length;
namespace {

std::string format_ns(double ns) {
  char buf[48];
  const double a = std::fabs(ns);
  if (a >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.3f s", ns / 1e9);
  } else if (a >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3f ms", ns / 1e6);
  } else if (a >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.3f us", ns / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  }
  return buf;
}

std::string percent(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return buf;
}

std::int64_t us_to_ns(double us) {
  return static_cast<std::int64_t>(std::llround(us * 1000.0));
}

}  // namespace

std::string trace_summary::to_text(std::size_t top) const {
  std::string out;
  char line[512];
  std::uint64_t total_transfer = 0;
  std::uint64_t total_both = 0;
  for (const device_overlap& d : devices) {
    const std::string who =
        d.device < 0 ? std::string("host") : "device " + std::to_string(d.device);
    std::snprintf(line, sizeof line, "%s: window %s, busy %s (%s), idle %s\n", who.c_str(),
                  format_ns(static_cast<double>(d.window_ns)).c_str(),
                  format_ns(static_cast<double>(d.busy_ns)).c_str(),
                  percent(static_cast<double>(d.busy_ns), static_cast<double>(d.window_ns)).c_str(),
                  format_ns(static_cast<double>(d.idle_ns)).c_str());
    out += line;
    std::snprintf(line, sizeof line,
                  "  compute %s (%llu ops), transfer %s (%llu ops), other %s (%llu ops)\n",
                  format_ns(static_cast<double>(d.compute_ns)).c_str(),
                  static_cast<unsigned long long>(d.compute_ops),
                  format_ns(static_cast<double>(d.transfer_ns)).c_str(),
                  static_cast<unsigned long long>(d.transfer_ops),
                  format_ns(static_cast<double>(d.other_ns)).c_str(),
                  static_cast<unsigned long long>(d.other_ops));
    out += line;
    std::snprintf(
        line, sizeof line,
        "  both active %s; overlap ratio %.3f (%s of transfer time hidden behind "
        "compute)\n",
        format_ns(static_cast<double>(d.both_ns)).c_str(), d.overlap_ratio,
        percent(static_cast<double>(d.both_ns), static_cast<double>(d.transfer_ns)).c_str());
    out += line;
    total_transfer += d.transfer_ns;
    total_both += d.both_ns;
    std::size_t shown = 0;
    for (const op_summary& k : kernels) {
      if (k.device != d.device || shown == top) {
        continue;
      }
      if (shown++ == 0) {
        out += "  top kernels:        total      count         mean  name\n";
      }
      // The name is appended, not formatted into `line`: demangled template kernels (CUB,
      // CUTLASS) run past any fixed buffer, and a cut line would lose its end of line.
      std::snprintf(line, sizeof line, "    %17s %10llu %12s  ",
                    format_ns(static_cast<double>(k.total_ns)).c_str(),
                    static_cast<unsigned long long>(k.count), format_ns(k.mean_ns()).c_str());
      out += line;
      out += k.name;
      out += k.category == "nccl" ? " [nccl]\n" : "\n";
    }
    shown = 0;
    for (const op_summary& c : copies) {
      if (c.device != d.device || shown == top) {
        continue;
      }
      if (shown++ == 0) {
        out += "  top copies:         total      count        bytes     GB/s  kind\n";
      }
      std::snprintf(line, sizeof line, "    %17s %10llu %12llu %8.2f  ",
                    format_ns(static_cast<double>(c.total_ns)).c_str(),
                    static_cast<unsigned long long>(c.count),
                    static_cast<unsigned long long>(c.bytes), c.gbps());
      out += line;
      out += c.name;
      out += '\n';
    }
  }
  std::size_t shown = 0;
  for (const op_summary& a : api_calls) {
    if (shown == top) {
      break;
    }
    if (shown++ == 0) {
      out += "CUDA API calls (host; a runtime call encloses its driver calls):\n";
      out += "               total      count         mean          max  name\n";
    }
    std::snprintf(line, sizeof line, "  %18s %10llu %12s %12s  ",
                  format_ns(static_cast<double>(a.total_ns)).c_str(),
                  static_cast<unsigned long long>(a.count), format_ns(a.mean_ns()).c_str(),
                  format_ns(static_cast<double>(a.max_ns)).c_str());
    out += line;
    out += a.name;
    out += a.category.empty() ? "\n" : " (" + a.category + ")\n";
  }
  if (!each.empty()) {
    // Per range: when it began (since the trace's origin), how long, each device's overlap ratio
    // there ("-": no transfer in it).
    std::snprintf(line, sizeof line,
                  "per range (%zu): share of transfer time with compute running, per device\n",
                  each.size());
    out += line;
    out += "      #           start          length";
    for (const device_overlap& d : devices) {
      std::snprintf(line, sizeof line, "  %9s", ("device " + std::to_string(d.device)).c_str());
      out += d.device < 0 ? "       host" : line;
    }
    out += "  pools grew\n";
    for (std::size_t w = 0; w < each.size(); ++w) {
      const window_overlap& r = each[w];
      std::snprintf(line, sizeof line, "  %5zu %15s %15s", w + 1,
                    format_ns(static_cast<double>(r.window.begin_ns)).c_str(),
                    format_ns(static_cast<double>(r.window.length())).c_str());
      out += line;
      for (const device_overlap& d : devices) {
        const auto it = std::find_if(r.devices.begin(), r.devices.end(),
                                     [&](const device_overlap& x) { return x.device == d.device; });
        if (it == r.devices.end() || it->transfer_ns == 0) {
          std::snprintf(line, sizeof line, "  %9s", "-");
        } else {
          std::snprintf(line, sizeof line, "  %9.3f", it->overlap_ratio);
        }
        out += line;
      }
      if (r.upstream_allocs == 0) {
        out += "  -\n";
      } else {
        std::snprintf(line, sizeof line, "  %llu time%s, %.1f MiB",
                      static_cast<unsigned long long>(r.upstream_allocs),
                      r.upstream_allocs == 1 ? "" : "s",
                      static_cast<double>(r.upstream_bytes) / (1024.0 * 1024.0));
        out += line;
        out +=
            r.upstream_ns != 0 ? ", " + format_ns(static_cast<double>(r.upstream_ns)) + "\n" : "\n";
      }
    }
  }
  std::snprintf(
      line, sizeof line,
      "%zu device(s), %llu events, window %s%s; transfer %s, %s of it overlapped with "
      "compute\n",
      devices.size(), static_cast<unsigned long long>(events),
      format_ns(!windows.empty() ? static_cast<double>(total_length(windows))
                : window_end_ns >= window_begin_ns
                    ? static_cast<double>(interval{window_begin_ns, window_end_ns}.length())
                    : 0.0)
          .c_str(),
      windows.size() > 1 ? (" in " + std::to_string(windows.size()) + " ranges").c_str() : "",
      format_ns(static_cast<double>(total_transfer)).c_str(),
      percent(static_cast<double>(total_both), static_cast<double>(total_transfer)).c_str());
  out += line;
  if (upstream_allocs != 0) {
    // (allocator device_alloc events; the time from the timeline's "upstream alloc" slices)
    const std::string took = upstream_ns != 0 ? ", " + format_ns(static_cast<double>(upstream_ns)) +
                                                    " of host time in the upstream allocator"
                                              : std::string();
    std::snprintf(line, sizeof line,
                  "pools grew %llu time(s) by %s in %s%s: a cost first runs pay\n",
                  static_cast<unsigned long long>(upstream_allocs),
                  format_bytes(static_cast<std::size_t>(upstream_bytes)).c_str(),
                  windows.empty() ? "the trace" : "the window(s)", took.c_str());
    out += line;
  }
  if (malformed != 0) {
    std::snprintf(line, sizeof line,
                  "%llu event(s) left out: a time, name or device that cannot be read "
                  "(`poolscope trace check` names them)\n",
                  static_cast<unsigned long long>(malformed));
    out += line;
  }
  return out;
}

nlohmann::json trace_summary::to_json(std::size_t top) const {
  nlohmann::json j;
  j["events"] = events;
  j["malformed"] = malformed;
  j["upstream_allocs"] = upstream_allocs;
  j["upstream_bytes"] = upstream_bytes;
  j["upstream_ns"] = upstream_ns;
  j["window_begin_ns"] = window_begin_ns;
  j["window_end_ns"] = window_end_ns;
  if (!windows.empty()) {
    j["windows"] = nlohmann::json::array();
    for (const interval& w : windows) {
      j["windows"].push_back({{"begin_ns", w.begin_ns}, {"end_ns", w.end_ns}});
    }
  }
  if (!each.empty()) {
    j["each"] = nlohmann::json::array();
    for (const window_overlap& r : each) {
      nlohmann::json rj{{"begin_ns", r.window.begin_ns},
                        {"end_ns", r.window.end_ns},
                        {"upstream_allocs", r.upstream_allocs},
                        {"upstream_bytes", r.upstream_bytes},
                        {"upstream_ns", r.upstream_ns}};
      rj["devices"] = nlohmann::json::array();
      for (const device_overlap& d : r.devices) {
        rj["devices"].push_back(d.to_json());
      }
      j["each"].push_back(std::move(rj));
    }
  }
  j["devices"] = nlohmann::json::array();
  for (const device_overlap& d : devices) {
    nlohmann::json dj = d.to_json();
    dj["top_kernels"] = nlohmann::json::array();
    dj["top_copies"] = nlohmann::json::array();
    for (const op_summary& k : kernels) {
      if (k.device == d.device && dj["top_kernels"].size() < top) {
        dj["top_kernels"].push_back(k.to_json());
      }
    }
    for (const op_summary& c : copies) {
      if (c.device == d.device && dj["top_copies"].size() < top) {
        dj["top_copies"].push_back(c.to_json());
      }
    }
    j["devices"].push_back(std::move(dj));
  }
  j["top_api_calls"] = nlohmann::json::array();
  for (const op_summary& a : api_calls) {
    if (j["top_api_calls"].size() == top) {
      break;
    }
    j["top_api_calls"].push_back(a.to_json());
  }
  return j;
}

namespace {

// Reads a time in µs that converts to ns without overflow (about ±285 years) into `us`.
bool time_of(const nlohmann::json& v, double& us) {
  if (!v.is_number()) {
    return false;
  }
  us = v.get<double>();
  return std::isfinite(us) && std::abs(us) <= max_trace_time_us;
}

// The parts of [begin, end) inside `windows` (sorted, disjoint), appended to `out` with the index
// of the window each lies in to `in`; a slice of no length counts where it lies inside (or on the
// edge of) a window.
void clip_to(const std::vector<interval>& windows, std::int64_t begin, std::int64_t end,
             std::vector<interval>& out, std::vector<std::size_t>& in) {
  auto w = std::lower_bound(windows.begin(), windows.end(), begin,
                            [](const interval& x, std::int64_t t) { return x.end_ns < t; });
  for (; w != windows.end() && w->begin_ns <= end; ++w) {
    const std::int64_t b = std::max(begin, w->begin_ns);
    const std::int64_t x = std::min(end, w->end_ns);
    if (x > b || (x == b && end == begin)) {
      out.push_back({b, x});
      in.push_back(static_cast<std::size_t>(w - windows.begin()));
    }
  }
}

// summarize_trace's work; `windows` sorted and disjoint, or null for the whole trace; with
// `each`, also the analysis of every window alone.
trace_summary summarize(const std::string& path, const std::vector<interval>* windows, bool each) {
  trace_summary s;
  overlap_analyzer analyzer;
  std::vector<overlap_analyzer> per_window(each && windows != nullptr ? windows->size() : 0);
  // Per window of `each`: the pools' upstream allocations in it and the host time they took.
  struct growth_in {
    std::uint64_t allocs = 0;
    std::uint64_t bytes = 0;
    std::uint64_t ns = 0;
  };
  std::vector<growth_in> growth(per_window.size());
  std::vector<interval> parts;     // an event's parts that count
  std::vector<std::size_t> where;  // the window of each part (0 without windows)
  // Sets `parts` to what of [begin, end) counts: its parts inside the windows (see clip_to), or
  // all of it without windows. False when nothing counts.
  const auto counted = [&](std::int64_t begin, std::int64_t end) {
    parts.clear();
    where.clear();
    if (windows != nullptr) {
      clip_to(*windows, begin, end, parts, where);
    } else {
      parts.push_back({begin, end});
      where.push_back(0);
    }
    return !parts.empty();
  };
  std::map<std::tuple<int, std::string, std::string>, op_summary> kernels;
  std::map<std::tuple<int, std::string, std::string>, op_summary> copies;
  std::map<std::pair<std::string, std::string>, op_summary> api_calls;  // (name, api)
  std::int64_t lo = INT64_MAX;
  std::int64_t hi = INT64_MIN;
  const trace_read_info info = read_trace(path, [&](std::uint64_t, const nlohmann::json& e) {
    // What `trace check` rejects as unreadable times is left out and counted, never summed: a
    // negative or missing duration would otherwise count as years of device time.
    if (!e.is_object()) {
      ++s.malformed;
      return;
    }
    const auto ph = e.find("ph");
    if (ph == e.end() || !ph->is_string()) {
      ++s.malformed;
      return;
    }
    if (*ph == "M") {
      return;  // metadata: names of processes and threads, no time
    }
    const auto ts = e.find("ts");
    double ts_us = 0;
    if (ts == e.end() || !time_of(*ts, ts_us)) {
      ++s.malformed;
      return;
    }
    std::int64_t begin = us_to_ns(ts_us);
    std::int64_t end = begin;
    const bool complete = *ph == "X";
    if (complete) {
      const auto dur = e.find("dur");
      double dur_us = 0;
      // The end too must lie in the range: begin + dur past INT64_MAX wrapped to a slice that
      // ended before it began.
      if (dur == e.end() || !time_of(*dur, dur_us) || dur_us < 0 ||
          !(ts_us + dur_us <= max_trace_time_us)) {
        ++s.malformed;
        return;
      }
      end = begin + us_to_ns(dur_us);
    }
    // The fields summed below are read before the event counts at all, so that one that cannot
    // be read leaves the whole event out: a name that is not a string, a device that is not an
    // int (get<int>() took 4294967296 as device 0).
    const auto name_it = e.find("name");
    if (name_it != e.end() && !name_it->is_string()) {
      ++s.malformed;
      return;
    }
    const auto cat_it = e.find("cat");
    const auto cls = complete && cat_it != e.end() && cat_it->is_string()
                         ? classify_category(cat_it->get_ref<const std::string&>())
                         : std::nullopt;
    const auto args = e.find("args");
    const bool has_args = args != e.end() && args->is_object();
    std::optional<int> device;
    std::optional<int> peer[2];  // src_device, dst_device
    if (cls && has_args) {
      if (const auto dev = args->find("device"); dev != args->end()) {
        device = detail::trace_device_id(*dev);
        if (!device) {
          ++s.malformed;
          return;
        }
      }
      const char* peer_keys[2] = {"src_device", "dst_device"};
      for (std::size_t k = 0; k < 2; ++k) {
        if (const auto it = args->find(peer_keys[k]); it != args->end()) {
          peer[k] = detail::trace_device_id(*it);
          if (!peer[k]) {
            ++s.malformed;
            return;
          }
        }
      }
    }
    lo = std::min(lo, begin);
    hi = std::max(hi, end);
    if (!complete && name_it != e.end() && *name_it == "device_alloc" && cat_it != e.end() &&
        *cat_it == "allocator") {
      // A pool took memory from its upstream resource: counted where it happened.
      std::uint64_t bytes = 0;
      if (has_args) {
        if (const auto p = args->find("phase"); p != args->end() && *p == "pre") {
          return;
        }
        if (const auto r = args->find("rounded"); r != args->end() && r->is_number_unsigned()) {
          bytes = r->get<std::uint64_t>();
        }
      }
      if (!counted(begin, begin)) {
        return;
      }
      ++s.upstream_allocs;
      s.upstream_bytes += bytes;
      if (!growth.empty()) {
        ++growth[where.front()].allocs;
        growth[where.front()].bytes += bytes;
      }
      return;
    }
    if (complete && name_it != e.end() && *name_it == "upstream alloc" && cat_it != e.end() &&
        *cat_it == "allocator") {
      // The host time of a pool's upstream allocation, inside the windows.
      (void)counted(begin, end);
      for (std::size_t i = 0; i < parts.size(); ++i) {
        const std::uint64_t ns = parts[i].length();
        s.upstream_ns += ns;
        if (!growth.empty()) {
          growth[where[i]].ns += ns;
        }
      }
      return;
    }
    if (complete && !cls && cat_it != e.end() && *cat_it == "cuda_api" && name_it != e.end()) {
      // A CUDA API call: its time inside the windows, under its name and api.
      if (!counted(begin, end)) {
        return;
      }
      std::uint64_t inside = 0;
      for (const interval& p : parts) {
        inside += p.length();
      }
      std::string api;
      if (has_args) {
        if (const auto a = args->find("api"); a != args->end() && a->is_string()) {
          api = a->get<std::string>();
        }
      }
      const std::string& call = name_it->get_ref<const std::string&>();
      op_summary& c = api_calls[{call, api}];
      c.name = call;
      c.category = std::move(api);
      c.device = -1;
      c.add(inside, 0);
      return;
    }
    if (!device || !cls) {  // (a device is read only for a counted category)
      return;
    }
    const activity_class klass = *cls;
    const std::string& cat = cat_it->get_ref<const std::string&>();
    // Only the parts inside the windows count; a slice of no length has none of their time
    // (clip_to gives a slice with length only parts with length).
    if ((windows != nullptr && end <= begin) || !counted(begin, end)) {
      return;
    }
    std::uint64_t dur = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const interval& p = parts[i];
      dur += p.length();
      const std::uint64_t ops = i == 0 ? 1 : 0;  // one slice, however many parts
      const auto add_on = [&](int on) {
        analyzer.add(on, klass, p.begin_ns, p.end_ns, ops);
        if (!per_window.empty()) {
          per_window[where[i]].add(on, klass, p.begin_ns, p.end_ns);  // one op in each window
        }
      };
      add_on(*device);
      // A peer copy is transfer time on both of its devices (see timeline.cpp).
      if (peer[0] && peer[1]) {
        for (const std::optional<int>& other : peer) {
          if (*other != *device) {
            add_on(*other);
          }
        }
      }
    }
    const std::string name =
        name_it != e.end() ? name_it->get_ref<const std::string&>() : std::string();
    std::uint64_t bytes = 0;
    if (const auto b = args->find("bytes"); b != args->end() && b->is_number_unsigned()) {
      bytes = b->get<std::uint64_t>();
    }
    if (cat == "kernel" || cat == "nccl") {
      op_summary& k = kernels[{*device, name, cat}];
      k.name = name;
      k.category = cat;
      k.device = *device;
      k.add(dur, bytes);
    } else if (cat == "memcpy" || cat == "memset") {
      op_summary& c = copies[{*device, name, cat}];
      c.name = name;
      c.category = cat;
      c.device = *device;
      c.add(dur, bytes);
    }
  });
  s.events = info.events;
  if (windows != nullptr) {
    lo = windows->front().begin_ns;
    hi = windows->back().end_ns;
    s.windows = *windows;
    analyzer.set_windows(*windows);
    for (std::size_t w = 0; w < per_window.size(); ++w) {
      per_window[w].set_window((*windows)[w].begin_ns, (*windows)[w].end_ns);
      s.each.push_back({(*windows)[w], per_window[w].analyze(), growth[w].allocs, growth[w].bytes,
                        growth[w].ns});
    }
  } else if (lo <= hi) {
    analyzer.set_window(lo, hi);
  }
  if (lo <= hi) {
    s.window_begin_ns = lo;
    s.window_end_ns = hi;
  }
  s.devices = analyzer.analyze();
  const auto by_total = [](const op_summary& a, const op_summary& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  };
  for (auto& [k, v] : kernels) {
    s.kernels.push_back(std::move(v));
  }
  for (auto& [k, v] : copies) {
    s.copies.push_back(std::move(v));
  }
  std::sort(s.kernels.begin(), s.kernels.end(), by_total);
  std::sort(s.copies.begin(), s.copies.end(), by_total);
  for (auto& [k, v] : api_calls) {
    s.api_calls.push_back(std::move(v));
  }
  std::sort(s.api_calls.begin(), s.api_calls.end(), by_total);
  return s;
}

}  // namespace

trace_summary summarize_trace(const std::string& path, std::optional<interval> window) {
  if (!window) {
    return summarize(path, nullptr, false);
  }
  // One window keeps its edges even where it holds no time (an instant's calls still count).
  const std::vector<interval> one{{window->begin_ns, std::max(window->begin_ns, window->end_ns)}};
  return summarize(path, &one, false);
}

trace_summary summarize_trace(const std::string& path, std::vector<interval> windows, bool each) {
  for (const interval& w : windows) {
    if (w.end_ns < w.begin_ns) {
      throw invalid_argument("summarize_trace: window [" + std::to_string(w.begin_ns) + ", " +
                             std::to_string(w.end_ns) + ") ns ends before it begins");
    }
  }
  const std::vector<interval> merged = merge_intervals(std::move(windows));
  if (merged.empty()) {
    throw invalid_argument("summarize_trace: no window holds any time");
  }
  return summarize(path, &merged, each);
}

trace_ranges find_trace_ranges(const std::string& path, std::string_view name,
                               std::size_t max_names) {
  trace_ranges r;
  std::map<std::string, std::uint64_t, std::less<>> host_names;
  constexpr std::size_t names_kept = 4096;  // distinct names counted, beyond which new ones are not
  (void)read_trace(path, [&](std::uint64_t, const nlohmann::json& e) {
    if (!e.is_object()) {
      return;
    }
    const auto ph = e.find("ph");
    const auto nm = e.find("name");
    if (ph == e.end() || *ph != "X" || nm == e.end() || !nm->is_string()) {
      return;
    }
    const std::string& n = nm->get_ref<const std::string&>();
    if (n == name) {
      const auto ts = e.find("ts");
      const auto dur = e.find("dur");
      double ts_us = 0;
      double dur_us = 0;
      if (ts != e.end() && dur != e.end() && time_of(*ts, ts_us) && time_of(*dur, dur_us) &&
          dur_us >= 0 && ts_us + dur_us <= max_trace_time_us) {
        const std::int64_t b = us_to_ns(ts_us);
        r.found.push_back({b, b + us_to_ns(dur_us)});
      }
      return;
    }
    const auto cat = e.find("cat");
    if (cat != e.end() && *cat == "cuda_api") {
      return;
    }
    const auto args = e.find("args");
    if (args != e.end() && args->is_object() && args->contains("device")) {
      return;  // device activity
    }
    if (const auto it = host_names.find(n); it != host_names.end()) {
      ++it->second;
    } else if (host_names.size() < names_kept) {
      host_names.emplace(n, 1);
    }
  });
  std::vector<std::pair<std::string, std::uint64_t>> by_count(host_names.begin(), host_names.end());
  std::stable_sort(by_count.begin(), by_count.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  for (std::size_t i = 0; i < by_count.size() && i < max_names; ++i) {
    r.host_names.push_back(std::move(by_count[i].first));
  }
  return r;
}

}  // namespace poolscope::analysis
