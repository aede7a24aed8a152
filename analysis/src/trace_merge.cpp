// The ranks' traces joined into one timeline (trace_merge.hpp).
#include "poolscope/analysis/trace_merge.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include "poolscope/analysis/trace_check.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "poolscope/profiler/trace_writer.hpp"

namespace poolscope::analysis {

std::optional<int> rank_of_pid(std::int64_t pid) noexcept {
  if (pid < rank_pid_base || pid - rank_pid_base > std::numeric_limits<int>::max()) {
    return std::nullopt;
  }
  return static_cast<int>(pid - rank_pid_base);
}

clock_offset estimate_clock_offset(std::span<const profiler::clock_sync_round> reference,
                                   std::span<const profiler::clock_sync_round> rank) {
  if (reference.size() != rank.size() || rank.empty()) {
    throw invalid_argument("estimate_clock_offset: " + std::to_string(rank.size()) +
                           " rounds against the reference's " + std::to_string(reference.size()) +
                           " (the ranks must sample the same barriers)");
  }
  const auto bound_of = [&](std::size_t k) {
    const auto& r = rank[k];
    const auto& f = reference[k];
    if (r.after_ns < r.before_ns || f.after_ns < f.before_ns) {
      throw invalid_argument("estimate_clock_offset: round " + std::to_string(k) +
                             " leaves its barrier before entering it");
    }
    return std::pair<std::int64_t, std::int64_t>{
        static_cast<std::int64_t>(r.before_ns) - static_cast<std::int64_t>(f.after_ns),
        static_cast<std::int64_t>(r.after_ns) - static_cast<std::int64_t>(f.before_ns)};
  };
  std::int64_t lo = std::numeric_limits<std::int64_t>::min();
  std::int64_t hi = std::numeric_limits<std::int64_t>::max();
  std::pair<std::int64_t, std::int64_t> narrowest = bound_of(0);
  for (std::size_t k = 0; k < rank.size(); ++k) {
    const auto b = bound_of(k);
    lo = std::max(lo, b.first);
    hi = std::min(hi, b.second);
    if (b.second - b.first < narrowest.second - narrowest.first) {
      narrowest = b;
    }
  }
  clock_offset o;
  o.at_ns = static_cast<std::int64_t>(rank.back().after_ns);
  o.consistent = lo <= hi;
  if (!o.consistent) {
    lo = narrowest.first;
    hi = narrowest.second;
  }
  // (lo + hi) / 2 without overflow, rounded toward lo.
  o.offset_ns = lo + (hi - lo) / 2;
  o.uncertainty_ns = (hi - lo + 1) / 2;
  return o;
}

namespace {

std::string us_text(std::int64_t ns) {
  std::string s;
  profiler::append_trace_us(s, ns);
  return s;
}

std::string ns_text(std::int64_t ns) {
  char buf[48];
  const double a = std::fabs(static_cast<double>(ns));
  if (a >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(ns) / 1e6);
  } else if (a >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.3f us", static_cast<double>(ns) / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%lld ns", static_cast<long long>(ns));
  }
  return buf;
}

std::optional<std::int64_t> integer_of(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) {
    return std::nullopt;
  }
  return it->get<std::int64_t>();
}

// A string member, or "" when absent or not a string.
std::string string_of(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// ts (µs, three decimals) as ns, as trace summary reads it.
std::optional<std::int64_t> time_ns(const nlohmann::json& e, const char* key) {
  const auto it = e.find(key);
  if (it == e.end() || !it->is_number()) {
    return std::nullopt;
  }
  const double us = it->get<double>();
  if (!std::isfinite(us) || std::abs(us) > max_trace_time_us) {
    return std::nullopt;
  }
  return static_cast<std::int64_t>(std::llround(us * 1000.0));
}

// Products of two times, exact (the alignment's interpolation).
__extension__ using int128 = __int128;

// A send or receive between ranks, as its rank's trace holds it (times on that rank's clock).
struct transfer_slice {
  int rank = 0;
  std::int64_t pid = 0;
  std::int64_t tid = 0;
  std::int64_t begin_ns = 0;  // absolute, the rank's clock
  std::int64_t end_ns = 0;
  std::int64_t clock_error_ns = 0;  // args.clock_error_ns: how far its times may be off the clock
};

// What the first pass learns of one input.
struct rank_input {
  std::string file;
  int place = 0;  // in the inputs
  int rank = 0;
  int world_size = 0;  // 0: not said
  std::string host;
  std::optional<std::int64_t> pid;
  std::vector<std::string> devices;
  std::int64_t origin_ns = 0;
  std::vector<std::pair<std::string, std::vector<profiler::clock_sync_round>>> clock_sync;
  std::map<std::int64_t, std::string> process_names;
  std::map<std::pair<std::int64_t, std::int64_t>, std::string> thread_names;
  // Tracks of processes other than the host, in order of first use: their tids in the merge.
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> moved_tids;
  std::uint64_t max_id = 0;
  // Alignment: local time t maps to t - offset(t) (see aligned()).
  std::vector<clock_offset> syncs;
  std::string name;

  [[nodiscard]] std::int64_t offset_at(std::int64_t t) const {
    if (syncs.empty() || syncs.front().same_host) {
      return 0;
    }
    const clock_offset& a = syncs.front();
    const clock_offset& b = syncs.back();
    if (syncs.size() == 1 || b.at_ns <= a.at_ns || t <= a.at_ns) {
      return a.offset_ns;
    }
    if (t >= b.at_ns) {
      return b.offset_ns;
    }
    // Linear between the first and last sync; floored, so that t - offset_at(t) never decreases
    // while the offset changes slower than time (checked when the syncs are taken): slices keep
    // their nesting.
    const int128 num = static_cast<int128>(b.offset_ns - a.offset_ns) * (t - a.at_ns);
    const int128 den = b.at_ns - a.at_ns;
    int128 q = num / den;
    if ((num % den != 0) && ((num < 0) != (den < 0))) {
      --q;
    }
    return a.offset_ns + static_cast<std::int64_t>(q);
  }
  // How far an aligned time may be off the reference clock: the widest uncertainty of the
  // offsets applied (0 on the reference's host, whose clock is not shifted).
  [[nodiscard]] std::int64_t alignment_error() const {
    std::int64_t e = 0;
    for (const clock_offset& o : syncs) {
      if (!o.same_host) {
        e = std::max(e, o.uncertainty_ns);
      }
    }
    return e;
  }
  [[nodiscard]] std::int64_t aligned(std::int64_t local_ns) const {
    return local_ns - offset_at(local_ns);
  }
};

// The first tid given to a moved track: above any Linux thread id (at most 2^22). Tids the host
// process already uses (its threads, and tracks a program names there, as darray's NCCL spans)
// are skipped.
constexpr std::int64_t first_moved_tid = std::int64_t{1} << 30;

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// First pass over one input: names, tracks, ids, its send/receive slices, its distributedInfo.
void survey(rank_input& in, std::map<std::pair<int, int>, std::vector<transfer_slice>>& sends,
            std::map<std::pair<int, int>, std::vector<transfer_slice>>& receives) {
  std::vector<std::pair<std::pair<int, int>, transfer_slice>> my_sends, my_receives;
  std::vector<std::pair<std::int64_t, std::int64_t>> moved_in_order;
  std::set<std::int64_t> host_tids;
  const trace_read_info info = read_trace(in.file, [&](std::uint64_t, const nlohmann::json& e) {
    if (!e.is_object()) {
      return;
    }
    const std::string ph = string_of(e, "ph");
    const auto pid = integer_of(e, "pid");
    const auto tid = integer_of(e, "tid");
    const auto name = e.find("name");
    const auto args = e.find("args");
    const bool has_args = args != e.end() && args->is_object();
    if (ph == "M") {
      if (pid && name != e.end() && *name == "process_name" && has_args && args->contains("name") &&
          (*args)["name"].is_string()) {
        in.process_names[*pid] = (*args)["name"].get<std::string>();
      } else if (pid && tid && name != e.end() && *name == "thread_name" && has_args &&
                 args->contains("name") && (*args)["name"].is_string()) {
        in.thread_names[{*pid, *tid}] = (*args)["name"].get<std::string>();
      }
      return;
    }
    for (const char* k : {"id", "bind_id"}) {
      if (const auto it = e.find(k); it != e.end() && it->is_number_unsigned()) {
        in.max_id = std::max(in.max_id, it->get<std::uint64_t>());
      }
    }
    if (pid && tid && *pid == profiler::host_pid) {
      host_tids.insert(*tid);
    } else if (pid && tid && in.moved_tids.try_emplace({*pid, *tid}, 0).second) {
      moved_in_order.emplace_back(*pid, *tid);
    }
    if (ph != "X" || !pid || !tid || name == e.end() || !name->is_string() || !has_args) {
      return;
    }
    const std::string& n = name->get_ref<const std::string&>();
    const bool send = starts_with(n, "darray.send");
    if (!send && !starts_with(n, "darray.receive")) {
      return;
    }
    const auto src = integer_of(*args, "src_device");
    const auto dst = integer_of(*args, "dst_device");
    const auto ts = time_ns(e, "ts");
    const auto dur = time_ns(e, "dur");
    if (!src || !dst || !ts || !dur || *dur < 0) {
      return;
    }
    transfer_slice t{0, *pid, *tid, *ts, *ts + *dur};
    if (const auto error = integer_of(*args, "clock_error_ns"); error && *error > 0) {
      t.clock_error_ns = *error;
    }
    (send ? my_sends : my_receives)
        .emplace_back(std::pair<int, int>{static_cast<int>(*src), static_cast<int>(*dst)}, t);
  });
  // Device tracks move to the host process's pid, in the order they first appeared, on tids its
  // own tracks leave free.
  std::int64_t next_tid = first_moved_tid;
  for (const auto& key : moved_in_order) {
    while (host_tids.contains(next_tid)) {
      ++next_tid;
    }
    in.moved_tids[key] = next_tid++;
  }
  // distributedInfo and the origin come at the file's end: the slices' times are completed here.
  const nlohmann::json& other = info.other;
  if (const auto od = other.find("otherData"); od != other.end() && od->is_object()) {
    in.origin_ns = integer_of(*od, "origin_ns").value_or(0);
  }
  in.rank = in.place;
  if (const auto di = other.find("distributedInfo"); di != other.end() && di->is_object()) {
    const auto rank = integer_of(*di, "rank");
    const auto size = integer_of(*di, "world_size");
    if (!rank || !size || *rank < 0 || *size < 1 || *rank >= *size ||
        *size > std::numeric_limits<int>::max()) {
      throw invalid_argument("trace merge: '" + in.file +
                             "': distributedInfo needs integers rank and world_size, 0 <= rank < "
                             "world_size (it has " +
                             di->dump() + ")");
    }
    in.rank = static_cast<int>(*rank);
    in.world_size = static_cast<int>(*size);
    in.host = string_of(*di, "host");
    in.pid = integer_of(*di, "pid");
    if (const auto d = di->find("devices"); d != di->end() && d->is_array()) {
      for (const auto& x : *d) {
        if (x.is_string()) {
          in.devices.push_back(x.get<std::string>());
        }
      }
    }
    if (const auto cs = di->find("clock_sync"); cs != di->end() && cs->is_array()) {
      for (const auto& s : *cs) {
        std::vector<profiler::clock_sync_round> rounds;
        const auto r = s.find("rounds");
        if (!s.is_object() || !s.contains("label") || !s["label"].is_string() || r == s.end() ||
            !r->is_array()) {
          throw invalid_argument("trace merge: '" + in.file +
                                 "': a distributedInfo.clock_sync entry needs a label and rounds");
        }
        for (const auto& x : *r) {
          if (!x.is_array() || x.size() != 2 || !x[0].is_number_unsigned() ||
              !x[1].is_number_unsigned()) {
            throw invalid_argument("trace merge: '" + in.file + "': clock_sync '" +
                                   s["label"].get<std::string>() + "' has a round " + x.dump() +
                                   " (expected [before_ns, after_ns])");
          }
          rounds.push_back({x[0].get<std::uint64_t>(), x[1].get<std::uint64_t>()});
        }
        in.clock_sync.emplace_back(s["label"].get<std::string>(), std::move(rounds));
      }
    }
  }
  for (auto& [key, t] : my_sends) {
    t.rank = in.rank;
    t.begin_ns += in.origin_ns;
    t.end_ns += in.origin_ns;
    sends[key].push_back(t);
  }
  for (auto& [key, t] : my_receives) {
    t.rank = in.rank;
    t.begin_ns += in.origin_ns;
    t.end_ns += in.origin_ns;
    receives[key].push_back(t);
  }
}

// The rank's offsets from the reference's clock, from the syncs both sampled under one label.
void align(rank_input& in, const rank_input& ref) {
  if (&in == &ref) {
    return;
  }
  for (const auto& [label, rounds] : in.clock_sync) {
    const auto it = std::find_if(ref.clock_sync.begin(), ref.clock_sync.end(),
                                 [&](const auto& s) { return s.first == label; });
    if (it == ref.clock_sync.end()) {
      continue;
    }
    try {
      clock_offset o = estimate_clock_offset(it->second, rounds);
      o.label = label;
      o.same_host = !in.host.empty() && in.host == ref.host;
      in.syncs.push_back(std::move(o));
    } catch (const invalid_argument& e) {
      throw invalid_argument("trace merge: '" + in.file + "' against '" + ref.file +
                             "', clock_sync '" + label + "': " + e.what());
    }
  }
  std::sort(in.syncs.begin(), in.syncs.end(),
            [](const clock_offset& a, const clock_offset& b) { return a.at_ns < b.at_ns; });
  if (in.syncs.size() >= 2) {
    // An offset that changes faster than time is no drift but a broken sample: the clocks are
    // then aligned at the first sync alone.
    const clock_offset& a = in.syncs.front();
    const clock_offset& b = in.syncs.back();
    const std::int64_t span = b.at_ns - a.at_ns;
    if (span <= 0 || std::llabs(b.offset_ns - a.offset_ns) * 2 > span) {
      in.syncs.resize(1);
    }
  }
}

// "rank 1: node-a (pid 4711), host device 1"
std::string process_label(const rank_input& in) {
  std::string s = "rank " + std::to_string(in.rank);
  if (!in.host.empty()) {
    s += ": " + in.host;
  }
  if (in.pid) {
    s += " (pid " + std::to_string(*in.pid) + ")";
  }
  std::vector<std::string> devices = in.devices;
  if (devices.empty()) {
    for (const auto& [pid, name] : in.process_names) {
      if (pid != profiler::host_pid) {
        devices.push_back(name);
      }
    }
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    s += (i == 0 ? (in.host.empty() && !in.pid ? ": " : ", ") : ", ") + devices[i];
  }
  return s;
}

std::string track_label(const rank_input& in, std::int64_t pid) {
  const auto it = in.process_names.find(pid);
  return it != in.process_names.end() ? it->second : "pid " + std::to_string(pid);
}

// Renames the rank's processes and threads into its one process.
void write_names(profiler::trace_writer& w, const rank_input& in) {
  const std::int64_t pid = rank_pid(in.rank);
  std::string s;
  profiler::append_process_name(s, pid, in.name);
  profiler::append_process_sort_index(s, pid, in.rank);
  std::uint64_t count = 2;
  for (const auto& [key, name] : in.thread_names) {
    if (key.first == profiler::host_pid) {
      profiler::append_thread_name(s, pid, key.second, name);
      ++count;
    }
  }
  for (const auto& [key, tid] : in.moved_tids) {
    const auto it = in.thread_names.find(key);
    profiler::append_thread_name(
        s, pid, tid,
        track_label(in, key.first) + ": " +
            (it != in.thread_names.end() ? it->second : "tid " + std::to_string(key.second)));
    profiler::append_thread_sort_index(s, pid, tid, tid - first_moved_tid + 1);
    count += 2;
  }
  w.write_formatted(s, count);
}

// Makes an id of one rank unique across the ranks.
nlohmann::json unique_id(const nlohmann::json& id, const rank_input& in, int world) {
  if (id.is_number_unsigned() || (id.is_number_integer() && id.get<std::int64_t>() >= 0)) {
    const auto v = id.get<std::uint64_t>();
    const auto n = static_cast<std::uint64_t>(world);
    if (v > (std::numeric_limits<std::uint64_t>::max() - static_cast<std::uint64_t>(in.rank)) / n) {
      throw invalid_argument("trace merge: '" + in.file + "': id " + std::to_string(v) +
                             " is too large to be made unique across " + std::to_string(world) +
                             " ranks");
    }
    return v * n + static_cast<std::uint64_t>(in.rank);
  }
  if (id.is_string()) {
    return "r" + std::to_string(in.rank) + ":" + id.get<std::string>();
  }
  return id;
}

// Second pass over one input: its events, on the reference clock, in the rank's process.
std::uint64_t copy_events(profiler::trace_writer& w, const rank_input& in, int world,
                          std::int64_t origin) {
  std::uint64_t copied = 0;
  std::string out;
  (void)read_trace(in.file, [&](std::uint64_t, const nlohmann::json& event) {
    if (!event.is_object() || string_of(event, "ph") == "M") {
      return;  // metadata: the rank's process and threads are named anew
    }
    nlohmann::json e = event;
    const auto pid = integer_of(e, "pid");
    const auto tid = integer_of(e, "tid");
    if (pid) {
      e["pid"] = rank_pid(in.rank);
      if (*pid != profiler::host_pid) {
        if (tid) {
          e["tid"] = in.moved_tids.at({*pid, *tid});
        }
        if (string_of(e, "ph") == "C" && e.contains("name") && e["name"].is_string()) {
          e["name"] = track_label(in, *pid) + ": " + e["name"].get<std::string>();
        }
      }
    }
    for (const char* k : {"id", "bind_id"}) {
      if (const auto it = e.find(k); it != e.end()) {
        *it = unique_id(*it, in, world);
      }
    }
    const auto ts = time_ns(e, "ts");
    const auto dur = time_ns(e, "dur");
    std::string times;
    if (ts) {
      const std::int64_t begin = in.aligned(in.origin_ns + *ts) - origin;
      if (dur && *dur >= 0) {
        const std::int64_t end = in.aligned(in.origin_ns + *ts + *dur) - origin;
        times = "\"dur\":" + us_text(end - begin) + ",";
        e.erase("dur");
      }
      times += "\"ts\":" + us_text(begin);
      e.erase("ts");
    }
    const std::string rest = e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out.assign(",\n{");
    out += times;
    if (rest.size() > 2) {
      out += times.empty() ? "" : ",";
      out.append(rest, 1, rest.size() - 1);
    } else {
      out += '}';
    }
    w.write_formatted(out, 1);
    ++copied;
  });
  return copied;
}

const rank_input& input_of(const std::vector<rank_input>& ins, int rank) {
  return *std::find_if(ins.begin(), ins.end(), [&](const rank_input& i) { return i.rank == rank; });
}

// A slice's track in the merged trace.
std::int64_t merged_tid(const rank_input& in, const transfer_slice& t) {
  return t.pid == profiler::host_pid ? t.tid : in.moved_tids.at({t.pid, t.tid});
}

// What write_flows did.
struct flow_counts {
  std::uint64_t flows = 0;
  std::uint64_t unmatched = 0;  // sends and receives left without a flow
  std::uint64_t reversed = 0;   // of those, paired but the receive ends before the send began
  std::uint64_t within_clock_error = 0;  // pairs whose order their times' errors blur
};

// The flows from each send to its receive.
flow_counts write_flows(profiler::trace_writer& w, const std::vector<rank_input>& ins,
                        std::uint64_t first_id, std::int64_t origin,
                        std::map<std::pair<int, int>, std::vector<transfer_slice>>& sends,
                        std::map<std::pair<int, int>, std::vector<transfer_slice>>& receives) {
  flow_counts c;
  std::set<std::pair<int, int>> keys;
  for (const auto& [k, v] : sends) {
    keys.insert(k);
  }
  for (const auto& [k, v] : receives) {
    keys.insert(k);
  }
  const auto by_begin = [](const transfer_slice& a, const transfer_slice& b) {
    return a.begin_ns < b.begin_ns;
  };
  std::string s;
  for (const auto& key : keys) {
    std::vector<transfer_slice>& from = sends[key];
    std::vector<transfer_slice>& to = receives[key];
    std::stable_sort(from.begin(), from.end(), by_begin);
    std::stable_sort(to.begin(), to.end(), by_begin);
    const std::size_t n = std::min(from.size(), to.size());
    c.unmatched += (from.size() - n) + (to.size() - n);
    const std::string name =
        "piece " + std::to_string(key.first) + "->" + std::to_string(key.second);
    for (std::size_t k = 0; k < n; ++k) {
      const rank_input& a = input_of(ins, from[k].rank);
      const rank_input& b = input_of(ins, to[k].rank);
      const std::int64_t start = a.aligned(from[k].begin_ns);
      const std::int64_t end = b.aligned(to[k].end_ns);
      if (end < start) {
        const std::int64_t error = from[k].clock_error_ns + to[k].clock_error_ns +
                                   a.alignment_error() + b.alignment_error();
        if (start - end > error) {
          c.unmatched += 2;
          c.reversed += 2;
        } else {
          // Within the errors of the ends' times (GPU spans' anchors, the alignment of other
          // hosts' clocks): the pair is joined, but no arrow can go back in time, and each end
          // must lie inside its slice.
          ++c.within_clock_error;
        }
        continue;
      }
      const std::uint64_t id = first_id + c.flows;
      s.clear();
      profiler::append_trace_event(s,
                                   {.phase = profiler::trace_phase::flow_start,
                                    .name = name,
                                    .cat = "darray.piece",
                                    .pid = rank_pid(a.rank),
                                    .tid = merged_tid(a, from[k]),
                                    .ts_ns = static_cast<std::uint64_t>(start),
                                    .id = id},
                                   static_cast<std::uint64_t>(origin));
      profiler::append_trace_event(s,
                                   {.phase = profiler::trace_phase::flow_end,
                                    .name = name,
                                    .cat = "darray.piece",
                                    .pid = rank_pid(b.rank),
                                    .tid = merged_tid(b, to[k]),
                                    .ts_ns = static_cast<std::uint64_t>(end),
                                    .id = id,
                                    .bind_enclosing = true},
                                   static_cast<std::uint64_t>(origin));
      w.write_formatted(s, 2);
      ++c.flows;
    }
  }
  return c;
}

// Refuses inputs named twice and an output among them.
void check_paths(const std::vector<std::string>& inputs, const std::string& output) {
  if (inputs.empty()) {
    throw invalid_argument("trace merge: no input traces");
  }
  const auto same = [](const std::string& a, const std::string& b) {
    std::error_code ec;
    const auto pa = std::filesystem::weakly_canonical(std::filesystem::absolute(a, ec), ec);
    const auto pb = std::filesystem::weakly_canonical(std::filesystem::absolute(b, ec), ec);
    return pa == pb;
  };
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (same(inputs[i], output)) {
      throw invalid_argument("trace merge: the output '" + output + "' is input " +
                             std::to_string(i + 1) + " ('" + inputs[i] + "')");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (same(inputs[i], inputs[j])) {
        throw invalid_argument("trace merge: '" + inputs[i] + "' is given twice (inputs " +
                               std::to_string(j + 1) + " and " + std::to_string(i + 1) + ")");
      }
    }
  }
}

// Ranks unique, one launch's size.
int check_ranks(const std::vector<rank_input>& ins) {
  int world = static_cast<int>(ins.size());
  const rank_input* sized = nullptr;
  for (const rank_input& in : ins) {
    if (in.world_size == 0) {
      continue;
    }
    if (sized != nullptr && in.world_size != sized->world_size) {
      throw invalid_argument("trace merge: '" + in.file + "' is a rank of " +
                             std::to_string(in.world_size) + ", '" + sized->file + "' of " +
                             std::to_string(sized->world_size) + ": not traces of one launch");
    }
    sized = &in;
    world = std::max(world, in.world_size);
  }
  std::map<int, const rank_input*> seen;
  for (const rank_input& in : ins) {
    if (const auto [it, fresh] = seen.emplace(in.rank, &in); !fresh) {
      throw invalid_argument("trace merge: '" + it->second->file + "' and '" + in.file +
                             "' are both rank " + std::to_string(in.rank));
    }
  }
  return world;
}

}  // namespace

std::string merge_result::to_text() const {
  std::string out = "merged " + std::to_string(ranks.size()) + " rank trace(s) of " +
                    std::to_string(world_size) + " into " + output + ": " + std::to_string(events) +
                    " events, " + std::to_string(flows) + " piece flows between ranks";
  if (pairs_within_clock_error != 0) {
    out += " and " + std::to_string(pairs_within_clock_error) +
           " pairs joined without one (the receive ends before its send began, by less than the "
           "error of their times: GPU clock anchors, clocks aligned between hosts)";
  }
  if (unmatched_transfers != reversed_transfers) {
    out += " (" + std::to_string(unmatched_transfers - reversed_transfers) +
           " transfers without their other end)";
  }
  if (reversed_transfers != 0) {
    out += " (" + std::to_string(reversed_transfers) +
           " transfers in pairs whose receive ends before its send began: clocks apart by more "
           "than the transfer took)";
  }
  out += "\n";
  for (const merged_rank& r : ranks) {
    out += "  " + r.name + ": " + r.file + ", " + std::to_string(r.events) + " events";
    if (r.syncs.empty()) {
      out += r.rank == ranks.front().rank ? ", the reference clock" : ", clock not sampled";
    }
    for (const clock_offset& o : r.syncs) {
      out += ", offset at " + o.label + " " + ns_text(o.offset_ns) + " +- " +
             ns_text(o.uncertainty_ns) + (o.consistent ? "" : " (rounds disagreed)");
    }
    if (!r.syncs.empty() && r.syncs.front().same_host) {
      out += " (rank " + std::to_string(ranks.front().rank) + "'s host: one clock, not shifted)";
    }
    out += "\n";
  }
  if (!clocks_measured) {
    out += "clock skew: not measured for every rank (taken as 0)\n";
  } else if (max_skew_ns == 0 && max_uncertainty_ns == 0) {
    out += "clocks: every rank on one host, one clock (its barriers measured up to " +
           ns_text(max_same_host_offset_ns) + ")\n";
  } else {
    out += "clock skew: at most " + ns_text(max_skew_ns) + " between hosts, aligned to within " +
           ns_text(max_uncertainty_ns);
    if (max_same_host_offset_ns != 0) {
      out += "; ranks of one host share its clock (their barriers measured up to " +
             ns_text(max_same_host_offset_ns) + ")";
    }
    out += "\n";
  }
  return out;
}

nlohmann::json merge_result::to_json() const {
  nlohmann::json j;
  j["world_size"] = world_size;
  j["events"] = events;
  j["flows"] = flows;
  j["unmatched_transfers"] = unmatched_transfers;
  j["reversed_transfers"] = reversed_transfers;
  j["pairs_within_clock_error"] = pairs_within_clock_error;
  j["clocks_measured"] = clocks_measured;
  j["max_skew_ns"] = max_skew_ns;
  j["max_uncertainty_ns"] = max_uncertainty_ns;
  j["max_same_host_offset_ns"] = max_same_host_offset_ns;
  j["ranks"] = nlohmann::json::array();
  for (const merged_rank& r : ranks) {
    nlohmann::json rj{{"rank", r.rank},    {"pid", rank_pid(r.rank)}, {"file", r.file},
                      {"name", r.name},    {"host", r.host},          {"devices", r.devices},
                      {"events", r.events}};
    rj["clock"] = nlohmann::json::array();
    for (const clock_offset& o : r.syncs) {
      rj["clock"].push_back({{"label", o.label},
                             {"at_ns", o.at_ns},
                             {"offset_ns", o.offset_ns},
                             {"uncertainty_ns", o.uncertainty_ns},
                             {"consistent", o.consistent},
                             {"same_host", o.same_host}});
    }
    j["ranks"].push_back(std::move(rj));
  }
  return j;
}

merge_result merge_traces(const std::vector<std::string>& inputs, const std::string& output) {
  check_paths(inputs, output);
  std::vector<rank_input> ins(inputs.size());
  std::map<std::pair<int, int>, std::vector<transfer_slice>> sends, receives;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    ins[i].file = inputs[i];
    ins[i].place = static_cast<int>(i);
    survey(ins[i], sends, receives);
  }
  merge_result r;
  r.output = output;
  r.world_size = check_ranks(ins);
  std::sort(ins.begin(), ins.end(),
            [](const rank_input& a, const rank_input& b) { return a.rank < b.rank; });
  const rank_input& ref = ins.front();
  r.clocks_measured = true;
  std::uint64_t max_id = 0;
  for (rank_input& in : ins) {
    align(in, ref);
    if (&in != &ref && in.syncs.empty()) {
      r.clocks_measured = false;
    }
    for (const clock_offset& o : in.syncs) {
      if (o.same_host) {
        r.max_same_host_offset_ns =
            std::max<std::int64_t>(r.max_same_host_offset_ns, std::llabs(o.offset_ns));
      } else {
        r.max_skew_ns = std::max<std::int64_t>(r.max_skew_ns, std::llabs(o.offset_ns));
        r.max_uncertainty_ns = std::max(r.max_uncertainty_ns, o.uncertainty_ns);
      }
    }
    in.name = process_label(in);
    max_id = std::max(max_id, in.max_id);
  }
  std::int64_t origin = std::numeric_limits<std::int64_t>::max();
  for (const rank_input& in : ins) {
    origin = std::min(origin, in.aligned(in.origin_ns));
  }
  profiler::trace_writer w(output, static_cast<std::uint64_t>(origin));
  for (const rank_input& in : ins) {
    write_names(w, in);
  }
  for (const rank_input& in : ins) {
    merged_rank m{in.rank, in.file, in.name, in.host, in.devices, 0, in.syncs};
    m.events = copy_events(w, in, r.world_size, origin);
    r.ranks.push_back(std::move(m));
  }
  // Flow ids above every id the ranks' events were given.
  const auto world = static_cast<std::uint64_t>(r.world_size);
  if (max_id >= std::numeric_limits<std::uint64_t>::max() / world - 1) {
    throw invalid_argument("trace merge: id " + std::to_string(max_id) +
                           " is too large to be made unique across " +
                           std::to_string(r.world_size) + " ranks");
  }
  const std::uint64_t first_id = (max_id + 1) * world;
  const flow_counts fc = write_flows(w, ins, first_id, origin, sends, receives);
  r.flows = fc.flows;
  r.unmatched_transfers = fc.unmatched;
  r.reversed_transfers = fc.reversed;
  r.pairs_within_clock_error = fc.within_clock_error;
  r.events = w.events();
  nlohmann::json other;
  other["generator"] = "poolscope trace merge";
  other["clock"] = "CLOCK_MONOTONIC of rank " + std::to_string(ref.rank);
  other["origin_ns"] = origin;
  other["pids"] = "rank r: " + std::to_string(rank_pid_base) + " + r";
  other["merged"] = r.to_json();
  w.close(other);
  return r;
}

}  // namespace poolscope::analysis
