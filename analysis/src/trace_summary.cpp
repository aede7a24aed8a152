#include "poolscope/analysis/trace_summary.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "detail/trace_json.hpp"
#include "poolscope/analysis/trace_check.hpp"
#include "poolscope/analysis/trace_merge.hpp"
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

// One device's lines of to_text: its window, busy and idle time, its classes, its overlap, and
// its `top` kernels and copies.
std::string device_text(const device_overlap& d, const std::vector<op_summary>& kernels,
                        const std::vector<op_summary>& copies, std::size_t top) {
  std::string out;
  char line[512];
  const std::string who =
      (d.rank >= 0 ? "rank " + std::to_string(d.rank) + " " : std::string()) +
      (d.device < 0 ? std::string("host") : "device " + std::to_string(d.device));
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
  std::size_t shown = 0;
  for (const op_summary& k : kernels) {
    if (k.device != d.device || k.rank != d.rank || shown == top) {
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
    if (c.device != d.device || c.rank != d.rank || shown == top) {
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
  return out;
}

// The `top` CUDA API calls of to_text.
std::string api_calls_text(const std::vector<op_summary>& api_calls, std::size_t top) {
  std::string out;
  char line[512];
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
  return out;
}

// The per-range table of to_text (summarize_trace with `each`).
std::string ranges_text(const std::vector<trace_summary::window_overlap>& each,
                        const std::vector<device_overlap>& devices) {
  std::string out;
  char line[512];
  // Per range: when it began (since the trace's origin), how long, each device's overlap ratio
  // there ("-": no transfer in it).
  std::snprintf(line, sizeof line,
                "per range (%zu): share of transfer time with compute running, per device\n",
                each.size());
  out += line;
  out += "      #           start          length";
  for (const device_overlap& d : devices) {
    const std::string who = d.rank >= 0 ? "r" + std::to_string(d.rank) + " dev " +
                                              (d.device < 0 ? "host" : std::to_string(d.device))
                                        : "device " + std::to_string(d.device);
    std::snprintf(line, sizeof line, "  %9s", who.c_str());
    out += d.device < 0 && d.rank < 0 ? "       host" : line;
  }
  out += "  pools grew\n";
  for (std::size_t w = 0; w < each.size(); ++w) {
    const trace_summary::window_overlap& r = each[w];
    std::snprintf(line, sizeof line, "  %5zu %15s %15s", w + 1,
                  format_ns(static_cast<double>(r.window.begin_ns)).c_str(),
                  format_ns(static_cast<double>(r.window.length())).c_str());
    out += line;
    for (const device_overlap& d : devices) {
      const auto it = std::find_if(
          r.devices.begin(), r.devices.end(),
          [&](const device_overlap& x) { return x.device == d.device && x.rank == d.rank; });
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
  return out;
}

// A merged trace's per-rank overlap, its clocks' skew and its piece flows.
std::string ranks_text(const std::vector<trace_summary::rank_overlap>& ranks,
                       const std::optional<trace_summary::clock_skew>& clock,
                       const std::optional<trace_summary::piece_flows>& pieces) {
  std::string out;
  char line[512];
  if (!ranks.empty()) {
    out += "per rank (share of transfer time with compute running on the rank's devices):\n";
  }
  for (const trace_summary::rank_overlap& r : ranks) {
    std::snprintf(line, sizeof line,
                  "  rank %d: %zu device(s), compute %s, transfer %s, both active %s; overlap "
                  "ratio %.3f\n",
                  r.rank, r.devices, format_ns(static_cast<double>(r.compute_ns)).c_str(),
                  format_ns(static_cast<double>(r.transfer_ns)).c_str(),
                  format_ns(static_cast<double>(r.both_ns)).c_str(), r.overlap_ratio);
    out += line;
  }
  if (clock) {
    if (!clock->measured) {
      out += "clocks: skew not measured for every rank (taken as 0)\n";
    } else if (clock->max_skew_ns == 0 && clock->max_uncertainty_ns == 0) {
      out += "clocks: every rank on one host, one clock (its barriers measured up to " +
             format_ns(static_cast<double>(clock->max_same_host_offset_ns)) + ")\n";
    } else {
      out += "clocks: ranks aligned to the first rank's; estimated skew between hosts " +
             format_ns(static_cast<double>(clock->max_skew_ns)) + ", within +-" +
             format_ns(static_cast<double>(clock->max_uncertainty_ns)) + " after alignment";
      if (clock->max_same_host_offset_ns != 0) {
        out += "; ranks of one host share its clock (barriers measured up to " +
               format_ns(static_cast<double>(clock->max_same_host_offset_ns)) + ")";
      }
      out += "\n";
    }
  }
  if (pieces) {
    out += "piece flows between ranks: " + std::to_string(pieces->flows) + " (" +
           std::to_string(pieces->unmatched_transfers) + " sends or receives left unjoined";
    if (pieces->reversed_transfers != 0) {
      out += ", " + std::to_string(pieces->reversed_transfers) +
             " of them in pairs whose receive ends before its send began";
    }
    out += ")";
    if (pieces->pairs_within_clock_error != 0) {
      out += "; " + std::to_string(pieces->pairs_within_clock_error) +
             " pair(s) joined without a flow, reversed by less than the error of their times";
    }
    out += "\n";
  }
  return out;
}

}  // namespace

std::string trace_summary::to_text(std::size_t top) const {
  std::string out;
  char line[512];
  std::uint64_t total_transfer = 0;
  std::uint64_t total_both = 0;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const device_overlap& d = devices[i];
    if (d.rank >= 0 && (i == 0 || devices[i - 1].rank != d.rank)) {
      const auto r = std::find_if(ranks.begin(), ranks.end(),
                                  [&](const rank_overlap& x) { return x.rank == d.rank; });
      out += (r != ranks.end() && !r->name.empty() ? r->name : "rank " + std::to_string(d.rank)) +
             ":\n";
    }
    out += device_text(d, kernels, copies, top);
    total_transfer += d.transfer_ns;
    total_both += d.both_ns;
  }
  out += ranks_text(ranks, clock, pieces);
  out += api_calls_text(api_calls, top);
  if (!each.empty()) {
    out += ranges_text(each, devices);
  }
  std::snprintf(
      line, sizeof line,
      "%zu device(s)%s, %llu events, window %s%s; transfer %s, %s of it overlapped with "
      "compute\n",
      devices.size(),
      ranks.empty() ? "" : (" of " + std::to_string(ranks.size()) + " ranks").c_str(),
      static_cast<unsigned long long>(events),
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
      if (k.device == d.device && k.rank == d.rank && dj["top_kernels"].size() < top) {
        dj["top_kernels"].push_back(k.to_json());
      }
    }
    for (const op_summary& c : copies) {
      if (c.device == d.device && c.rank == d.rank && dj["top_copies"].size() < top) {
        dj["top_copies"].push_back(c.to_json());
      }
    }
    j["devices"].push_back(std::move(dj));
  }
  if (!ranks.empty()) {
    j["ranks"] = nlohmann::json::array();
    for (const rank_overlap& r : ranks) {
      j["ranks"].push_back({{"rank", r.rank},
                            {"name", r.name},
                            {"devices", r.devices},
                            {"compute_ns", r.compute_ns},
                            {"transfer_ns", r.transfer_ns},
                            {"both_ns", r.both_ns},
                            {"overlap_ratio", r.overlap_ratio}});
    }
  }
  if (clock) {
    j["clock"] = {{"measured", clock->measured},
                  {"max_skew_ns", clock->max_skew_ns},
                  {"max_uncertainty_ns", clock->max_uncertainty_ns},
                  {"max_same_host_offset_ns", clock->max_same_host_offset_ns}};
  }
  if (pieces) {
    j["piece_flows"] = {{"flows", pieces->flows},
                        {"unmatched_transfers", pieces->unmatched_transfers},
                        {"reversed_transfers", pieces->reversed_transfers},
                        {"pairs_within_clock_error", pieces->pairs_within_clock_error}};
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

// What of one event the sums read, once its fields are known to be readable.
struct event_fields {
  std::int64_t begin = 0;
  std::int64_t end = 0;                  // begin + dur for X events, begin for the others
  bool complete = false;                 // an X event
  const std::string* name = nullptr;     // null without a name
  const std::string* cat = nullptr;      // null without a string cat
  std::optional<activity_class> cls;     // X events of a counted category
  const nlohmann::json* args = nullptr;  // null unless an object
  std::optional<int> device;
  std::optional<int> peer[2];  // src_device, dst_device
  int rank = -1;               // the rank of its pid in a merged trace
};

// summarize_trace's work: add() takes the events one at a time, finish() sorts the sums.
// `windows` sorted and disjoint, or null for the whole trace; with `each`, also the analysis of
// every window alone.
class summarizer {
 public:
  summarizer(const std::vector<interval>* windows, bool each)
      : windows_(windows),
        window_count_(each && windows != nullptr ? windows->size() : 0),
        growth_(window_count_) {}

  void add(const nlohmann::json& e) {
    event_fields f;
    if (!read(e, f)) {
      return;
    }
    lo_ = std::min(lo_, f.begin);
    hi_ = std::max(hi_, f.end);
    if (!f.complete && is(f.name, "device_alloc") && is(f.cat, "allocator")) {
      add_growth(f);
    } else if (f.complete && is(f.name, "upstream alloc") && is(f.cat, "allocator")) {
      add_upstream_time(f);
    } else if (f.complete && !f.cls && is(f.cat, "cuda_api") && f.name != nullptr) {
      add_api_call(f);
    } else if (f.device && f.cls) {  // (a device is read only for a counted category)
      add_device_activity(f);
    }
  }

  trace_summary finish(std::uint64_t events, const nlohmann::json& other) && {
    s_.events = events;
    if (windows_ != nullptr) {
      lo_ = windows_->front().begin_ns;
      hi_ = windows_->back().end_ns;
      s_.windows = *windows_;
      for (std::size_t w = 0; w < window_count_; ++w) {
        s_.each.push_back({(*windows_)[w], {}, growth_[w].allocs, growth_[w].bytes, growth_[w].ns});
      }
    }
    for (auto& [rank, rs] : ranks_) {
      finish_rank(rank, rs);
    }
    if (lo_ <= hi_) {
      s_.window_begin_ns = lo_;
      s_.window_end_ns = hi_;
    }
    read_clock(other);
    s_.kernels = sorted_by_total(std::move(kernels_));
    s_.copies = sorted_by_total(std::move(copies_));
    s_.api_calls = sorted_by_total(std::move(api_calls_));
    return std::move(s_);
  }

 private:
  // One rank's devices (a trace of one process: rank -1, every device).
  struct rank_state {
    overlap_analyzer analyzer;
    std::vector<overlap_analyzer> per_window;
    std::set<int> own;  // devices its events name as theirs ("device")
    // The other end of its peer copies: counted only where that device is its own (a copy with
    // another rank is that rank's transfer, on its own trace).
    struct peer_end {
      int device;
      activity_class cls;
      interval part;
      std::uint64_t ops;
      std::size_t window;
    };
    std::vector<peer_end> peer_ends;
  };

  rank_state& state_of(int rank) {
    rank_state& rs = ranks_[rank];
    rs.per_window.resize(window_count_);
    return rs;
  }

  void finish_rank(int rank, rank_state& rs) {
    for (const rank_state::peer_end& p : rs.peer_ends) {
      if (rs.own.contains(p.device)) {
        rs.analyzer.add(p.device, p.cls, p.part.begin_ns, p.part.end_ns, p.ops);
        if (!rs.per_window.empty()) {
          rs.per_window[p.window].add(p.device, p.cls, p.part.begin_ns, p.part.end_ns);
        }
      }
    }
    if (windows_ != nullptr) {
      rs.analyzer.set_windows(*windows_);
      for (std::size_t w = 0; w < rs.per_window.size(); ++w) {
        rs.per_window[w].set_window((*windows_)[w].begin_ns, (*windows_)[w].end_ns);
        for (device_overlap d : rs.per_window[w].analyze()) {
          d.rank = rank;
          s_.each[w].devices.push_back(d);
        }
      }
    } else if (lo_ <= hi_) {
      rs.analyzer.set_window(lo_, hi_);
    }
    trace_summary::rank_overlap total{rank, process_names_[rank], 0, 0, 0, 0, 0.0};
    for (device_overlap d : rs.analyzer.analyze()) {
      d.rank = rank;
      ++total.devices;
      total.compute_ns += d.compute_ns;
      total.transfer_ns += d.transfer_ns;
      total.both_ns += d.both_ns;
      s_.devices.push_back(d);
    }
    if (rank >= 0) {
      total.overlap_ratio = total.transfer_ns != 0 ? static_cast<double>(total.both_ns) /
                                                         static_cast<double>(total.transfer_ns)
                                                   : 0.0;
      s_.ranks.push_back(std::move(total));
    }
  }

  // A merged trace's clock alignment (otherData.merged, trace_merge.cpp).
  void read_clock(const nlohmann::json& other) {
    const auto od = other.find("otherData");
    if (od == other.end() || !od->is_object()) {
      return;
    }
    const auto m = od->find("merged");
    if (m == od->end() || !m->is_object()) {
      return;
    }
    // Figures of the wrong type read as 0 (`trace check` does not look into otherData).
    const auto integer = [&m](const char* key) {
      const auto it = m->find(key);
      return it != m->end() && it->is_number_integer() ? it->get<std::int64_t>() : 0;
    };
    trace_summary::clock_skew c;
    const auto measured = m->find("clocks_measured");
    c.measured = measured != m->end() && measured->is_boolean() && measured->get<bool>();
    c.max_skew_ns = integer("max_skew_ns");
    c.max_uncertainty_ns = integer("max_uncertainty_ns");
    c.max_same_host_offset_ns = integer("max_same_host_offset_ns");
    s_.clock = c;
    trace_summary::piece_flows p;
    const auto count = [&m](const char* key) {
      const auto it = m->find(key);
      return it != m->end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
    };
    p.flows = count("flows");
    p.unmatched_transfers = count("unmatched_transfers");
    p.reversed_transfers = count("reversed_transfers");
    p.pairs_within_clock_error = count("pairs_within_clock_error");
    s_.pieces = p;
  }

  // Per window of `each`: the pools' upstream allocations in it and the host time they took.
  struct growth_in {
    std::uint64_t allocs = 0;
    std::uint64_t bytes = 0;
    std::uint64_t ns = 0;
  };

  static bool is(const std::string* field, std::string_view value) {
    return field != nullptr && *field == value;
  }

  template <typename Key>
  static std::vector<op_summary> sorted_by_total(std::map<Key, op_summary> sums) {
    std::vector<op_summary> out;
    out.reserve(sums.size());
    for (auto& [k, v] : sums) {
      out.push_back(std::move(v));
    }
    std::sort(out.begin(), out.end(), [](const op_summary& a, const op_summary& b) {
      return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
    });
    return out;
  }

  // Reads what the sums need of `e` into `f`. What `trace check` rejects as unreadable is left
  // out and counted in `malformed`, never summed: a negative or missing duration would
  // otherwise count as years of device time. False when the event is left out (metadata too).
  bool read(const nlohmann::json& e, event_fields& f) {
    if (!e.is_object()) {
      ++s_.malformed;
      return false;
    }
    const auto ph = e.find("ph");
    if (ph == e.end() || !ph->is_string()) {
      ++s_.malformed;
      return false;
    }
    if (*ph == "M") {
      note_rank_name(e);
      return false;  // metadata: names of processes and threads, no time
    }
    f.complete = *ph == "X";
    if (!read_times(e, f)) {
      ++s_.malformed;
      return false;
    }
    // The fields summed are read before the event counts at all, so that one that cannot be
    // read leaves the whole event out: a name that is not a string, a device that is not an int
    // (get<int>() took 4294967296 as device 0).
    if (const auto it = e.find("name"); it != e.end()) {
      if (!it->is_string()) {
        ++s_.malformed;
        return false;
      }
      f.name = &it->get_ref<const std::string&>();
    }
    if (const auto it = e.find("cat"); it != e.end() && it->is_string()) {
      f.cat = &it->get_ref<const std::string&>();
      f.cls = f.complete ? classify_category(*f.cat) : std::nullopt;
    }
    if (const auto it = e.find("args"); it != e.end() && it->is_object()) {
      f.args = &*it;
    }
    if (const auto it = e.find("pid"); it != e.end() && it->is_number_integer()) {
      f.rank = rank_of_pid(it->get<std::int64_t>()).value_or(-1);
    }
    if (f.cls && f.args != nullptr && !read_devices(f)) {
      ++s_.malformed;
      return false;
    }
    return true;
  }

  // The name of a merged trace's rank process (a process_name of a rank pid).
  void note_rank_name(const nlohmann::json& e) {
    const auto pid = e.find("pid");
    const auto name = e.find("name");
    const auto args = e.find("args");
    if (pid == e.end() || !pid->is_number_integer() || name == e.end() || *name != "process_name" ||
        args == e.end() || !args->is_object()) {
      return;
    }
    const auto rank = rank_of_pid(pid->get<std::int64_t>());
    const auto n = args->find("name");
    if (rank && n != args->end() && n->is_string()) {
      process_names_[*rank] = n->get<std::string>();
    }
  }

  // "ts" and, for X events, "dur": numbers whose begin and end lie in the range.
  static bool read_times(const nlohmann::json& e, event_fields& f) {
    const auto ts = e.find("ts");
    double ts_us = 0;
    if (ts == e.end() || !time_of(*ts, ts_us)) {
      return false;
    }
    f.begin = us_to_ns(ts_us);
    f.end = f.begin;
    if (!f.complete) {
      return true;
    }
    const auto dur = e.find("dur");
    double dur_us = 0;
    // The end too must lie in the range: begin + dur past INT64_MAX wrapped to a slice that
    // ended before it began.
    if (dur == e.end() || !time_of(*dur, dur_us) || dur_us < 0 ||
        !(ts_us + dur_us <= max_trace_time_us)) {
      return false;
    }
    f.end = f.begin + us_to_ns(dur_us);
    return true;
  }

  // args "device", "src_device", "dst_device" where present: trace device ids.
  static bool read_devices(event_fields& f) {
    if (const auto dev = f.args->find("device"); dev != f.args->end()) {
      f.device = detail::trace_device_id(*dev);
      if (!f.device) {
        return false;
      }
    }
    const char* peer_keys[2] = {"src_device", "dst_device"};
    for (std::size_t k = 0; k < 2; ++k) {
      if (const auto it = f.args->find(peer_keys[k]); it != f.args->end()) {
        f.peer[k] = detail::trace_device_id(*it);
        if (!f.peer[k]) {
          return false;
        }
      }
    }
    return true;
  }

  // Sets parts_ to what of [begin, end) counts: its parts inside the windows (see clip_to), or
  // all of it without windows. False when nothing counts.
  bool counted(std::int64_t begin, std::int64_t end) {
    parts_.clear();
    where_.clear();
    if (windows_ != nullptr) {
      clip_to(*windows_, begin, end, parts_, where_);
    } else {
      parts_.push_back({begin, end});
      where_.push_back(0);
    }
    return !parts_.empty();
  }

  // A pool took memory from its upstream resource: counted where it happened.
  void add_growth(const event_fields& f) {
    std::uint64_t bytes = 0;
    if (f.args != nullptr) {
      if (const auto p = f.args->find("phase"); p != f.args->end() && *p == "pre") {
        return;
      }
      if (const auto r = f.args->find("rounded"); r != f.args->end() && r->is_number_unsigned()) {
        bytes = r->get<std::uint64_t>();
      }
    }
    if (!counted(f.begin, f.begin)) {
      return;
    }
    ++s_.upstream_allocs;
    s_.upstream_bytes += bytes;
    if (!growth_.empty()) {
      ++growth_[where_.front()].allocs;
      growth_[where_.front()].bytes += bytes;
    }
  }

  // The host time of a pool's upstream allocation, inside the windows.
  void add_upstream_time(const event_fields& f) {
    (void)counted(f.begin, f.end);
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const std::uint64_t ns = parts_[i].length();
      s_.upstream_ns += ns;
      if (!growth_.empty()) {
        growth_[where_[i]].ns += ns;
      }
    }
  }

  // A CUDA API call: its time inside the windows, under its name and api.
  void add_api_call(const event_fields& f) {
    if (!counted(f.begin, f.end)) {
      return;
    }
    std::uint64_t inside = 0;
    for (const interval& p : parts_) {
      inside += p.length();
    }
    std::string api;
    if (f.args != nullptr) {
      if (const auto a = f.args->find("api"); a != f.args->end() && a->is_string()) {
        api = a->get<std::string>();
      }
    }
    op_summary& c = api_calls_[{*f.name, api}];
    c.name = *f.name;
    c.category = std::move(api);
    c.device = -1;
    c.add(inside, 0);
  }

  // A kernel, copy or memset (or a darray slice) on a device: its time in the overlap analysis
  // and, for kernels and copies, in their sums.
  void add_device_activity(const event_fields& f) {
    // Only the parts inside the windows count; a slice of no length has none of their time
    // (clip_to gives a slice with length only parts with length).
    if ((windows_ != nullptr && f.end <= f.begin) || !counted(f.begin, f.end)) {
      return;
    }
    std::uint64_t dur = 0;
    rank_state& rs = state_of(f.rank);
    rs.own.insert(*f.device);
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const interval& p = parts_[i];
      dur += p.length();
      const std::uint64_t ops = i == 0 ? 1 : 0;  // one slice, however many parts
      rs.analyzer.add(*f.device, *f.cls, p.begin_ns, p.end_ns, ops);
      if (!rs.per_window.empty()) {
        rs.per_window[where_[i]].add(*f.device, *f.cls, p.begin_ns, p.end_ns);  // one op each
      }
      // A peer copy is transfer time on both of its devices (see timeline.cpp).
      if (f.peer[0] && f.peer[1]) {
        for (const std::optional<int>& other : f.peer) {
          if (*other == *f.device) {
            continue;
          }
          if (f.rank < 0) {
            rs.analyzer.add(*other, *f.cls, p.begin_ns, p.end_ns, ops);
            if (!rs.per_window.empty()) {
              rs.per_window[where_[i]].add(*other, *f.cls, p.begin_ns, p.end_ns);
            }
          } else {
            rs.peer_ends.push_back({*other, *f.cls, p, ops, where_[i]});
          }
        }
      }
    }
    const std::string& cat = *f.cat;
    const std::string name = f.name != nullptr ? *f.name : std::string();
    std::uint64_t bytes = 0;
    if (const auto b = f.args->find("bytes"); b != f.args->end() && b->is_number_unsigned()) {
      bytes = b->get<std::uint64_t>();
    }
    const bool kernel = cat == "kernel" || cat == "nccl";
    if (!kernel && cat != "memcpy" && cat != "memset") {
      return;
    }
    op_summary& o = (kernel ? kernels_ : copies_)[{f.rank, *f.device, name, cat}];
    o.name = name;
    o.category = cat;
    o.device = *f.device;
    o.rank = f.rank;
    o.add(dur, bytes);
  }

  const std::vector<interval>* windows_;
  std::size_t window_count_;  // windows analysed alone (`each`)
  trace_summary s_;
  std::map<int, rank_state> ranks_;  // by rank; -1 for a trace of one process
  std::map<int, std::string> process_names_;
  std::vector<growth_in> growth_;
  std::vector<interval> parts_;     // an event's parts that count
  std::vector<std::size_t> where_;  // the window of each part (0 without windows)
  std::map<std::tuple<int, int, std::string, std::string>, op_summary> kernels_;
  std::map<std::tuple<int, int, std::string, std::string>, op_summary> copies_;
  std::map<std::pair<std::string, std::string>, op_summary> api_calls_;  // (name, api)
  std::int64_t lo_ = INT64_MAX;
  std::int64_t hi_ = INT64_MIN;
};

trace_summary summarize(const std::string& path, const std::vector<interval>* windows, bool each) {
  summarizer s(windows, each);
  const trace_read_info info =
      read_trace(path, [&s](std::uint64_t, const nlohmann::json& e) { s.add(e); });
  return std::move(s).finish(info.events, info.other);
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
