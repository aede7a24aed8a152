#include "poolscope/profiler/timeline.hpp"

#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "detail/scope_timelines.hpp"
#include "poolscope/error.hpp"
#include "poolscope/log.hpp"
#include "poolscope/profiler/scope.hpp"

namespace poolscope::profiler {
namespace {

// ---- timelines that closed scopes are fed to (detail/scope_timelines.hpp) -------------------

struct running_timeline {
  timeline* t;
  std::uint64_t origin_ns;
};

struct scope_timeline_registry {
  std::mutex mutex;  // held while feeding, so removal waits for the feeds in progress
  std::vector<running_timeline> running;
};

scope_timeline_registry& scope_timelines() {
  static auto* r = new scope_timeline_registry;  // leaked: scopes may close at static destruction
  return *r;
}

// How many recent slices of a device track are kept to clip CUPTI's rare neighbour overlaps.
constexpr std::size_t recent_per_track = 32;

std::string read_comm(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string host_thread_label(std::uint64_t tid) {
  const std::string comm = read_comm("/proc/self/task/" + std::to_string(tid) + "/comm");
  if (comm.empty()) {
    return "thread " + std::to_string(tid);
  }
  return comm + " (tid " + std::to_string(tid) + ")";
}

std::string default_process_name() {
  std::string comm = read_comm("/proc/self/comm");
  if (comm.empty()) {
    comm = "program";
  }
  return "host: " + comm + " (pid " + std::to_string(::getpid()) + ")";
}

// The "distributedInfo" member up to its clock_sync array: "distributedInfo":{...,"clock_sync":
std::string distributed_head(const distributed_info& d) {
  std::string out = "\"distributedInfo\":{\"backend\":";
  append_trace_string(out, d.backend);
  out += ",\"rank\":" + std::to_string(d.rank) + ",\"world_size\":" + std::to_string(d.world_size);
  out += ",\"host\":";
  append_trace_string(out, d.host.empty() ? host_name() : d.host);
  out += ",\"pid\":" + std::to_string(::getpid()) + ",\"devices\":[";
  for (std::size_t i = 0; i < d.devices.size(); ++i) {
    out += i == 0 ? "" : ",";
    append_trace_string(out, d.devices[i]);
  }
  out += "],\"clock_sync\":";
  return out;
}

std::string demangle(std::string_view mangled) {
  const std::string s(mangled);
  int status = 0;
  char* d = abi::__cxa_demangle(s.c_str(), nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) {
    std::free(d);
    return s;
  }
  std::string out(d);
  std::free(d);
  return out;
}

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string dims(const std::array<std::int32_t, 3>& d) {
  return "[" + std::to_string(d[0]) + "," + std::to_string(d[1]) + "," + std::to_string(d[2]) + "]";
}

}  // namespace

struct timeline::impl {
  explicit impl(const timeline_options& o) : opts(o) {}

  const timeline_options& opts;
  std::atomic<bool> accepting{false};

  mutable std::mutex mutex;  // guards everything below
  enum class phase : std::uint8_t { idle, running, stopping, stopped };
  phase ph = phase::idle;
  std::uint64_t origin = 0;
  std::uint64_t stop_ns = 0;

  // Output: the chunk being filled, the queue to the writer thread, spare strings.
  std::unique_ptr<trace_writer> writer;
  std::thread writer_thread;
  std::condition_variable to_writer;
  std::condition_variable room;
  std::string current;
  std::uint64_t current_events = 0;
  std::deque<std::pair<std::string, std::uint64_t>> queue;
  std::vector<std::string> spare;
  std::string other_data;  // stop()'s otherData text (reserved at start())
  // The "distributedInfo" member as stop() writes it (made whole by start() and each
  // add_clock_sync, so stop() allocates nothing for it); "" without options.distributed.
  std::string distributed_member;
  std::string distributed_head;  // the member up to its clock_sync array
  std::string clock_sync;        // the clock_sync array's items, comma-joined
  bool stopping = false;

  // Tracks named so far.
  std::set<std::int64_t> named_pids;
  std::set<std::pair<std::int64_t, std::int64_t>> named_threads;
  std::vector<std::string> device_names;

  // Correlation: API calls and device operations waiting for each other, open NVTX ranges.
  struct launch {
    std::uint64_t thread = 0;
    std::uint64_t start = 0;
    bool runtime = false;
  };
  struct waiting_op {
    std::int64_t pid = 0;
    std::int64_t tid = 0;
    std::uint64_t ts = 0;
  };
  struct open_marker {
    std::uint64_t thread = 0;
    std::uint64_t ts = 0;
    std::string name;
    std::string domain;
  };
  std::map<std::uint32_t, launch> launches;
  std::map<std::uint32_t, std::vector<waiting_op>> waiting_ops;
  std::size_t waiting_count = 0;
  std::map<std::uint32_t, open_marker> markers;
  std::uint64_t next_flow_id = 1;
  std::uint64_t next_async_id = 1;
  std::map<std::pair<std::int64_t, std::int64_t>, std::deque<interval>> recent;

  // Aggregates.
  std::map<std::tuple<int, std::string, std::string>, op_summary> kernels;
  std::map<std::tuple<int, std::string, std::string>, op_summary> copies;
  std::map<std::pair<std::string, std::string>, scope_summary> scopes;
  std::map<std::uint32_t, memory_peak> memory;
  std::map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> counter_written;
  std::map<int, std::pair<std::uint64_t, std::uint64_t>> device_current;
  std::map<int, device_memory_peak> device_memory;
  overlap_analyzer overlap;
  std::unordered_map<std::string, std::string> demangled;
  timeline_stats stats;

  std::unique_ptr<cupti_collector> collector;
  std::unique_ptr<timeline_hook> hook;
  bool hook_installed = false;
  bool scopes_registered = false;  // in the running-timeline registry (start and stop only)
  bool memory_loss_logged = false;

  // --- output -------------------------------------------------------------------------------

  std::string take_spare() {
    std::string s;
    if (!spare.empty()) {
      s = std::move(spare.back());
      spare.pop_back();
    }
    s.clear();
    s.reserve(opts.chunk_bytes + 4096);
    return s;
  }

  // Makes room for one event group in `current`; false if it has to be dropped. CUPTI's
  // records (may_wait) wait for the writer; host events never do.
  bool make_room(std::unique_lock<std::mutex>& lock, bool may_wait) {
    while (!stats.write_failed && !stopping && current.size() >= opts.chunk_bytes) {
      if (queue.size() < opts.max_pending_chunks) {
        queue.emplace_back(std::move(current), current_events);
        current = take_spare();
        current_events = 0;
        to_writer.notify_one();
        return true;
      }
      if (!may_wait) {
        return false;
      }
      room.wait(lock);
    }
    // stop() took the last chunk while this thread waited: too late for this event.
    return !stats.write_failed && !stopping;
  }

  // Formats one event group (an event and the metadata it needs) into `current`, whole or not
  // at all: if formatting throws (no memory for a longer chunk), what the group appended is cut
  // off again, so `current` only ever holds whole events and the counts match it. Caller holds
  // mutex; rethrows.
  template <typename Format>
  void append_whole(Format&& format) {
    const std::size_t bytes = current.size();
    const std::uint64_t events = current_events;
    const std::uint64_t written = stats.events_written;
    try {
      format();
    } catch (...) {
      current.resize(std::min(current.size(), bytes));  // shrinks: allocates nothing
      current_events = events;
      stats.events_written = written;
      throw;
    }
  }

  // A host event lost for lack of memory: counted with the dropped ones, and said once.
  void lost_to_memory() noexcept {
    ++stats.events_dropped;
    if (!memory_loss_logged) {
      memory_loss_logged = true;
      log(log_level::error,
          "poolscope: the timeline is out of host memory and drops events; they are counted in "
          "events_dropped");
    }
  }

  // The trace events of one allocator event (its instant, its counters, and for the post event
  // of an upstream call whose pre event this thread raised, the call as a slice from
  // `upstream_begin_ns`); caller holds mutex.
  void format_allocator_event(const hooks::event& e, const memory_peak& p,
                              const std::pair<std::uint64_t, std::uint64_t>& dev_now,
                              bool counter_changed, std::optional<std::uint64_t> upstream_begin_ns);

  void put(const trace_event& e) {
    append_trace_event(current, e, origin);
    ++current_events;
    ++stats.events_written;
  }

  // The track is marked named only once its metadata is in `current` (an exception in between
  // leaves it unnamed, and append_whole takes the metadata out again).
  void name_process(std::int64_t pid, const std::string& name, std::int64_t sort) {
    if (named_pids.count(pid) == 0) {
      append_process_name(current, pid, name);
      append_process_sort_index(current, pid, sort);
      current_events += 2;
      stats.events_written += 2;
      named_pids.insert(pid);
    }
  }

  void name_thread(std::int64_t pid, std::int64_t tid, const std::string& label,
                   std::int64_t sort) {
    if (named_threads.count({pid, tid}) == 0) {
      append_thread_name(current, pid, tid, label);
      append_thread_sort_index(current, pid, tid, sort);
      current_events += 2;
      stats.events_written += 2;
      named_threads.insert({pid, tid});
    }
  }

  void name_host_thread(std::uint64_t tid, std::string_view label = {}) {
    if (named_threads.count({host_pid, static_cast<std::int64_t>(tid)}) == 0) {
      name_thread(host_pid, static_cast<std::int64_t>(tid),
                  label.empty() ? host_thread_label(tid) : std::string(label),
                  static_cast<std::int64_t>(tid));
    }
  }

  void name_device(int device) {
    if (named_pids.count(device_pid(device)) != 0) {
      return;
    }
    std::string name = device < 0 ? std::string("host") : "GPU " + std::to_string(device);
    if (device >= 0 && static_cast<std::size_t>(device) < device_names.size() &&
        !device_names[static_cast<std::size_t>(device)].empty()) {
      name += ": " + device_names[static_cast<std::size_t>(device)];
    }
    name_process(device_pid(device), name, 1 + static_cast<std::int64_t>(device));
  }

  // The pid an allocator's counters go to: its device's process, or the host for host memory.
  std::int64_t memory_pid(int device) {
    if (device < 0) {
      return host_pid;
    }
    name_device(device);
    return device_pid(device);
  }

  void writer_loop() {
    std::unique_lock lock(mutex);
    for (;;) {
      to_writer.wait(lock, [this] { return !queue.empty() || stopping; });
      if (queue.empty()) {
        return;  // stopping, and everything is written
      }
      auto [chunk, count] = std::move(queue.front());
      queue.pop_front();
      room.notify_all();
      const bool failed = stats.write_failed;
      lock.unlock();
      char error[512] = "";  // a fixed buffer: this thread must not need memory to fail
      bool write_error = false;
      std::uint64_t written = 0;
      if (!failed) {
        try {
          writer->write_formatted(chunk, count);
        } catch (const std::exception& e) {
          write_error = true;
          std::snprintf(error, sizeof error, "%s", e.what());
        }
        written = writer->bytes();  // this thread is the writer's only user until stop() joins
      }
      lock.lock();
      stats.bytes_written = std::max(stats.bytes_written, written);
      if (write_error) {
        write_failed(error);
      }
      chunk.clear();
      if (spare.size() < spare.capacity()) {  // reserved at start(): never allocates here
        spare.push_back(std::move(chunk));
      }
    }
  }

  // Records the first write failure, says it once; allocates nothing beyond the message kept in
  // stats (if even that fails, a fixed one). Caller holds mutex.
  void write_failed(const char* error, const char* what = "stopped writing") noexcept {
    if (stats.write_failed) {
      return;
    }
    stats.write_failed = true;
    try {
      stats.write_error = error;
    } catch (...) {
      stats.write_error.clear();  // empty: shrinking only
    }
    room.notify_all();
    char message[512];
    std::snprintf(message, sizeof message, "poolscope: the timeline %s its trace: %s", what, error);
    log(log_level::error, message);
  }

  // --- links --------------------------------------------------------------------------------

  void flow(std::uint64_t thread, std::uint64_t api_ts, const waiting_op& op) {
    const std::uint64_t id = next_flow_id++;
    trace_event s;
    s.phase = trace_phase::flow_start;
    s.name = "launch";
    s.cat = "launch";
    s.pid = host_pid;
    s.tid = static_cast<std::int64_t>(thread);
    s.ts_ns = api_ts;
    s.id = id;
    put(s);
    trace_event f = s;
    f.phase = trace_phase::flow_end;
    f.pid = op.pid;
    f.tid = op.tid;
    f.ts_ns = op.ts;
    f.bind_enclosing = true;
    put(f);
    ++stats.flows;
  }

  void remember_launch(std::uint32_t corr, const launch& l) {
    auto it = launches.find(corr);
    if (it == launches.end()) {
      launches.emplace(corr, l);
      while (launches.size() > opts.max_pending_links) {
        launches.erase(launches.begin());  // the oldest correlation id
      }
    } else if (l.runtime && !it->second.runtime) {
      it->second = l;  // the runtime call encloses the driver call: the flow starts there
    }
  }

  void wait_for_launch(std::uint32_t corr, const waiting_op& op) {
    waiting_ops[corr].push_back(op);
    ++waiting_count;
    while (waiting_count > opts.max_pending_links && !waiting_ops.empty()) {
      waiting_count -= waiting_ops.begin()->second.size();
      stats.unlinked_device_ops += waiting_ops.begin()->second.size();
      waiting_ops.erase(waiting_ops.begin());
    }
  }

  // Clips [b, e) against the recent slices of its device track so the track stays nested.
  bool clip(std::pair<std::int64_t, std::int64_t> track, std::uint64_t& b, std::uint64_t& e) {
    auto& r = recent[track];
    bool clipped = false;
    auto ib = static_cast<std::int64_t>(b);
    auto ie = static_cast<std::int64_t>(e);
    for (const interval& x : r) {
      if (ib < x.end_ns && ie > x.end_ns && ib > x.begin_ns) {
        ib = x.end_ns;  // starts inside x, ends after it
        clipped = true;
      } else if (ib < x.begin_ns && ie > x.begin_ns && ie < x.end_ns) {
        ie = x.begin_ns;  // starts before x, ends inside it
        clipped = true;
      }
    }
    if (ie < ib) {
      ie = ib;
    }
    b = static_cast<std::uint64_t>(ib);
    e = static_cast<std::uint64_t>(ie);
    r.push_back({ib, ie});
    if (r.size() > recent_per_track) {
      r.pop_front();
    }
    return clipped;
  }

  // --- records ------------------------------------------------------------------------------

  void device_op(std::unique_lock<std::mutex>& lock, const device_activity& a) {
    const int dev = static_cast<int>(a.device);
    std::string name;
    std::string_view cat;
    std::optional<activity_class> cls;
    if (a.kind == activity_kind::kernel) {
      auto it = demangled.find(std::string(a.name));
      if (it == demangled.end()) {
        it = demangled.emplace(std::string(a.name), demangle(a.name)).first;
      }
      name = it->second;
      const bool nccl = is_nccl_kernel(name);
      cat = nccl ? "nccl" : "kernel";
      cls = nccl ? activity_class::transfer : activity_class::compute;
    } else if (a.kind == activity_kind::memcpy) {
      name = "Memcpy " + std::string(to_string(a.copy));
      cat = "memcpy";
      cls = activity_class::transfer;
    } else {
      name = "Memset";
      cat = "memset";
      cls = activity_class::other;
    }
    const std::uint64_t dur = a.end_ns - a.start_ns;
    if (a.kind == activity_kind::kernel) {
      op_summary& k = kernels[{dev, name, std::string(cat)}];
      k.name = name;
      k.category = cat;
      k.device = dev;
      k.add(dur, 0);
    } else {
      op_summary& c = copies[{dev, name, std::string(cat)}];
      c.name = name;
      c.category = cat;
      c.device = dev;
      c.add(dur, a.bytes);
    }
    overlap.add(dev, *cls, static_cast<std::int64_t>(a.start_ns),
                static_cast<std::int64_t>(a.end_ns));
    // A peer copy moves data into (or out of) the other device as well: it is transfer time there
    // too (the receiving device is where a reshard's overlap with compute matters).
    if (a.peer) {
      for (const auto other : {a.src_device, a.dst_device}) {
        if (static_cast<int>(other) != dev) {
          overlap.add(static_cast<int>(other), *cls, static_cast<std::int64_t>(a.start_ns),
                      static_cast<std::int64_t>(a.end_ns));
        }
      }
    }

    const std::int64_t pid = device_pid(dev);
    const auto tid = static_cast<std::int64_t>(a.stream);
    std::uint64_t b = a.start_ns;
    std::uint64_t e = a.end_ns;
    const bool clipped = clip({pid, tid}, b, e);
    if (clipped) {
      ++stats.device_clipped;
    }
    if (!make_room(lock, true)) {
      ++stats.events_dropped;
      return;
    }
    name_device(dev);
    name_thread(
        pid, tid,
        a.stream == no_stream ? std::string("stream ?") : "stream " + std::to_string(a.stream),
        tid);
    const double gbps = dur == 0 ? 0.0 : static_cast<double>(a.bytes) / static_cast<double>(dur);
    trace_event ev;
    ev.phase = trace_phase::complete;
    ev.name = name;
    ev.cat = cat;
    ev.pid = pid;
    ev.tid = tid;
    ev.ts_ns = b;
    ev.dur_ns = e - b;
    if (a.kind == activity_kind::kernel) {
      const std::string grid = dims(a.grid);
      const std::string block = dims(a.block);
      const trace_arg args[] = {{"device", dev},
                                {"stream", a.stream},
                                {"correlation", a.correlation},
                                {"grid", grid},
                                {"block", block},
                                {"registers_per_thread", a.registers},
                                {"static_shared_bytes", a.static_shared_bytes},
                                {"dynamic_shared_bytes", a.dynamic_shared_bytes},
                                {"mangled", a.name},
                                {"clipped_ns", (a.end_ns - a.start_ns) - (e - b)}};
      ev.args = std::span<const trace_arg>(args, clipped ? 10 : 9);
      put(ev);
    } else if (a.kind == activity_kind::memcpy) {
      const trace_arg args[] = {{"device", dev},
                                {"stream", a.stream},
                                {"correlation", a.correlation},
                                {"bytes", a.bytes},
                                {"gbps", gbps},
                                {"kind", to_string(a.copy)},
                                {"src_kind", to_string(a.src_kind)},
                                {"dst_kind", to_string(a.dst_kind)},
                                {"src_device", a.src_device},
                                {"dst_device", a.dst_device},
                                {"clipped_ns", (a.end_ns - a.start_ns) - (e - b)}};
      std::vector<trace_arg> v(args, args + 8);
      if (a.peer) {
        v.push_back(args[8]);
        v.push_back(args[9]);
      }
      if (clipped) {
        v.push_back(args[10]);
      }
      ev.args = v;
      put(ev);
    } else {
      const trace_arg args[] = {{"device", dev},
                                {"stream", a.stream},
                                {"correlation", a.correlation},
                                {"bytes", a.bytes},
                                {"gbps", gbps},
                                {"memory_kind", to_string(a.dst_kind)},
                                {"clipped_ns", (a.end_ns - a.start_ns) - (e - b)}};
      ev.args = std::span<const trace_arg>(args, clipped ? 7 : 6);
      put(ev);
    }
    const waiting_op op{pid, tid, b};
    if (const auto it = launches.find(a.correlation); it != launches.end()) {
      flow(it->second.thread, it->second.start, op);
    } else if (a.correlation != 0) {
      wait_for_launch(a.correlation, op);
    } else {
      ++stats.unlinked_device_ops;
    }
  }

  void api_call(std::unique_lock<std::mutex>& lock, const device_activity& a) {
    if (!make_room(lock, true)) {
      ++stats.events_dropped;
      return;
    }
    name_host_thread(a.thread);
    trace_event ev;
    ev.phase = trace_phase::complete;
    ev.name = a.name;
    ev.cat = "cuda_api";
    ev.pid = host_pid;
    ev.tid = static_cast<std::int64_t>(a.thread);
    ev.ts_ns = a.start_ns;
    ev.dur_ns = a.end_ns >= a.start_ns ? a.end_ns - a.start_ns : 0;
    const trace_arg args[] = {{"correlation", a.correlation},
                              {"api", a.kind == activity_kind::runtime_api ? "runtime" : "driver"},
                              {"return_value", a.return_value}};
    ev.args = std::span<const trace_arg>(args, a.return_value != 0 ? 3 : 2);
    put(ev);
    const launch l{a.thread, a.start_ns, a.kind == activity_kind::runtime_api};
    remember_launch(a.correlation, l);
    if (const auto it = waiting_ops.find(a.correlation); it != waiting_ops.end()) {
      for (const waiting_op& op : it->second) {
        flow(a.thread, a.start_ns, op);
      }
      waiting_count -= it->second.size();
      waiting_ops.erase(it);
    }
  }

  void synchronization(std::unique_lock<std::mutex>& lock, const device_activity& a) {
    if (!make_room(lock, true)) {
      ++stats.events_dropped;
      return;
    }
    name_process(host_pid, opts.process_name.empty() ? default_process_name() : opts.process_name,
                 0);
    const auto it = launches.find(a.correlation);
    const std::uint64_t thread = it != launches.end() ? it->second.thread : 0;
    trace_event ev;
    ev.phase = trace_phase::async_begin;
    ev.name = to_string(a.sync);
    ev.cat = "sync";
    ev.pid = host_pid;
    ev.tid = static_cast<std::int64_t>(thread);
    ev.ts_ns = a.start_ns;
    ev.id = next_async_id++;
    std::vector<trace_arg> args = {{"correlation", a.correlation}, {"context", a.context}};
    if (a.stream != no_stream) {
      args.emplace_back("stream", a.stream);
    }
    if (thread != 0) {
      args.emplace_back("thread", thread);
    }
    ev.args = args;
    put(ev);
    ev.phase = trace_phase::async_end;
    ev.ts_ns = std::max(a.start_ns, a.end_ns);
    ev.args = {};
    put(ev);
  }

  void marker(std::unique_lock<std::mutex>& lock, const device_activity& a) {
    switch (a.marker) {
      case marker_phase::start: {
        markers[a.marker_id] = {a.thread, a.start_ns, std::string(a.name), std::string(a.domain)};
        while (markers.size() > opts.max_pending_links) {
          markers.erase(markers.begin());
          ++stats.nvtx_unmatched;
        }
        return;
      }
      case marker_phase::end: {
        const auto it = markers.find(a.marker_id);
        if (it == markers.end()) {
          ++stats.nvtx_unmatched;
          return;
        }
        const open_marker m = std::move(it->second);
        markers.erase(it);
        if (!make_room(lock, true)) {
          ++stats.events_dropped;
          return;
        }
        trace_event ev;
        ev.phase = trace_phase::async_begin;
        ev.name = m.name.empty() ? std::string_view("(unnamed range)") : std::string_view(m.name);
        ev.cat = "nvtx";
        ev.pid = host_pid;
        ev.tid = static_cast<std::int64_t>(m.thread);
        ev.ts_ns = m.ts;
        ev.id = next_async_id++;
        const trace_arg args[] = {{"domain", m.domain}, {"thread", m.thread}};
        ev.args = args;
        put(ev);
        ev.phase = trace_phase::async_end;
        ev.ts_ns = std::max(m.ts, a.start_ns);
        ev.args = {};
        put(ev);
        return;
      }
      case marker_phase::instant: {
        if (!make_room(lock, true)) {
          ++stats.events_dropped;
          return;
        }
        trace_event ev;
        ev.phase = trace_phase::instant;
        ev.name = a.name.empty() ? std::string_view("(unnamed mark)") : a.name;
        ev.cat = "nvtx";
        ev.pid = host_pid;
        ev.tid = static_cast<std::int64_t>(a.thread);
        ev.ts_ns = a.start_ns;
        if (a.thread != 0) {
          name_host_thread(a.thread);
        } else {
          ev.instant_scope = 'p';
        }
        const trace_arg args[] = {{"domain", a.domain}};
        ev.args = args;
        put(ev);
        return;
      }
    }
  }

  void cuda_memory(std::unique_lock<std::mutex>& lock, const device_activity& a) {
    if (!make_room(lock, true)) {
      ++stats.events_dropped;
      return;
    }
    const int dev = static_cast<int>(a.device);
    name_device(dev);
    name_thread(device_pid(dev), cuda_memory_tid, "CUDA memory (cudaMalloc/cudaFree)",
                cuda_memory_tid);
    const std::string address = hex(a.address);
    trace_event ev;
    ev.phase = trace_phase::instant;
    ev.name = a.memory_free ? "cuda free" : "cuda alloc";
    ev.cat = "cuda_memory";
    ev.pid = device_pid(dev);
    ev.tid = cuda_memory_tid;
    ev.ts_ns = a.start_ns;
    const trace_arg args[] = {{"device", dev},
                              {"bytes", a.bytes},
                              {"address", address},
                              {"memory_kind", to_string(a.dst_kind)},
                              {"correlation", a.correlation}};
    ev.args = args;
    put(ev);
  }
};

// ---------------------------------------------------------------------------------------------
// running timelines

namespace detail {

void add_running_timeline(timeline& t, std::uint64_t origin_ns) {
  auto& r = scope_timelines();
  std::lock_guard lock(r.mutex);
  r.running.push_back({&t, origin_ns});
  g_scope_flags.fetch_or(flag_timeline, std::memory_order_release);
}

void remove_running_timeline(const timeline& t) noexcept {
  auto& r = scope_timelines();
  std::lock_guard lock(r.mutex);
  std::erase_if(r.running, [&](const running_timeline& x) { return x.t == &t; });
  if (r.running.empty()) {
    g_scope_flags.fetch_and(~flag_timeline, std::memory_order_release);
  }
}

void feed_running_timelines(const host_slice& s) noexcept {
  auto& r = scope_timelines();
  std::lock_guard lock(r.mutex);
  for (const running_timeline& x : r.running) {
    if (x.origin_ns <= s.begin_ns) {
      x.t->add_host_slice(s);
    }
  }
}

void lost_on_running_timelines() noexcept {
  auto& r = scope_timelines();
  std::lock_guard lock(r.mutex);
  for (const running_timeline& x : r.running) {
    x.t->lost_host_events(1);
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// timeline

timeline::timeline(timeline_options options)
    : options_(std::move(options)), impl_(std::make_unique<impl>(options_)) {
  if (options_.trace_path.empty()) {
    throw invalid_argument("poolscope: timeline_options.trace_path is empty");
  }
  if (options_.max_pending_chunks == 0) {
    options_.max_pending_chunks = 1;
  }
  if (options_.chunk_bytes < 4096) {
    options_.chunk_bytes = 4096;
  }
  if (options_.max_pending_links == 0) {
    options_.max_pending_links = 1;
  }
}

timeline::~timeline() {
  stop();
}

void timeline::start() {
  impl& m = *impl_;
  {
    std::lock_guard lock(m.mutex);
    if (m.ph != impl::phase::idle) {
      throw logic_error("poolscope: a timeline starts once; create a new one for another run");
    }
    m.origin = hooks::now_ns();
    m.writer = std::make_unique<trace_writer>(options_.trace_path, m.origin, options_.writer);
    m.current = m.take_spare();
    m.spare.reserve(2);          // the writer thread gives chunks back without allocating
    m.other_data.reserve(1024);  // stop() writes otherData there
    if (options_.distributed) {
      m.distributed_head = distributed_head(*options_.distributed);
      m.distributed_member = m.distributed_head + "[]}";
    }
    m.name_process(host_pid,
                   options_.process_name.empty() ? default_process_name() : options_.process_name,
                   0);
    m.name_host_thread(hooks::current_thread_id());
    m.ph = impl::phase::running;
    m.writer_thread = std::thread([&m] { m.writer_loop(); });
  }
  if (options_.cupti) {
    // Names first: the CUDA runtime may not be called from CUPTI's callbacks.
    std::vector<std::string> names = cupti_collector::device_names();
    {
      std::lock_guard lock(m.mutex);
      m.device_names = std::move(names);
    }
    m.collector = std::make_unique<cupti_collector>(
        [this](const device_activity& a) { add_device_activity(a); }, options_.cupti_settings);
  }
  m.accepting.store(true, std::memory_order_release);
  if (m.collector != nullptr) {
    (void)m.collector->start();  // false: logged once by the collector; host events go on
  }
  if (options_.allocator_events) {
    m.hook = std::make_unique<timeline_hook>(*this);
    hooks::install(*m.hook, hooks::scope::process);
    m.hook_installed = true;
  }
  if (options_.scopes) {
    try {
      detail::add_running_timeline(*this, m.origin);
      m.scopes_registered = true;
    } catch (const std::bad_alloc&) {
      log(log_level::warn,
          "poolscope: out of memory registering the timeline for scopes; "
          "POOLSCOPE_SCOPEs will not be on this trace");
    }
  }
}

void timeline::stop() noexcept {
  impl& m = *impl_;
  {
    std::lock_guard lock(m.mutex);
    if (m.ph != impl::phase::running) {
      return;  // never started, already stopped, or another thread is stopping it
    }
    m.ph = impl::phase::stopping;
  }
  if (m.scopes_registered) {
    detail::remove_running_timeline(*this);  // no scope feeds this timeline after this
    m.scopes_registered = false;
  }
  if (m.hook_installed) {
    (void)hooks::uninstall(*m.hook, hooks::scope::process);
    m.hook_installed = false;
  }
  if (m.collector != nullptr) {
    m.collector->stop();  // delivers the last records through add_device_activity
  }
  {
    std::lock_guard lock(m.mutex);
    m.accepting.store(false, std::memory_order_release);
    m.stop_ns = hooks::now_ns();
    m.stats.nvtx_unmatched += m.markers.size();
    m.markers.clear();
    for (const auto& [corr, ops] : m.waiting_ops) {
      m.stats.unlinked_device_ops += ops.size();
    }
    m.waiting_ops.clear();
    m.waiting_count = 0;
    m.stopping = true;
    m.to_writer.notify_all();
    m.room.notify_all();
  }
  m.writer_thread.join();
  // The last, partly filled chunk: written here, after the writer thread has written the queue
  // and ended (queueing it could need memory that stop() may not have).
  if (!m.current.empty() && !m.stats.write_failed) {
    try {
      m.writer->write_formatted(m.current, m.current_events);
    } catch (const std::exception& e) {
      std::lock_guard lock(m.mutex);
      m.write_failed(e.what());
    }
  }
  m.current.clear();
  m.current_events = 0;
  // otherData as text in a buffer reserved at start(): stop() must finish the trace with the host
  // out of memory, and a nlohmann::json object allocates even to be destroyed (and is left
  // unusable when an insertion into a null value fails). Past the reserve (a long CUPTI reason)
  // the text may still grow; without memory for that it is left {}.
  std::string& other = m.other_data;
  other.clear();
  try {
    const auto number = [&other](std::uint64_t v) {
      char digits[24];
      other.append(digits, std::to_chars(digits, digits + sizeof digits, v).ptr);
    };
    std::lock_guard lock(m.mutex);
    other += "{\"generator\":\"poolscope\",\"clock\":\"CLOCK_MONOTONIC\",\"origin_ns\":";
    number(m.origin);
    other += ",\"stop_ns\":";
    number(m.stop_ns);
    other += ",\"pids\":\"host 1; CUDA device d: 100 + d\",\"events_written\":";
    number(m.stats.events_written);
    other += ",\"events_dropped\":";
    number(m.stats.events_dropped);
    if (m.collector != nullptr) {
      const cupti_status c = m.collector->status();
      other += ",\"cupti\":{\"state\":";
      append_trace_string(other, to_string(c.state));
      other += ",\"reason\":";
      append_trace_string(other, c.reason);
      other += ",\"records\":";
      number(c.records);
      other += ",\"dropped_records\":";
      number(c.dropped_records);
      other += ",\"buffers_refused\":";
      number(c.buffers_refused);
      other += '}';
    }
    other += '}';
  } catch (...) {
    other = "{}";  // within the reserve: allocates nothing
    log(log_level::warn,
        "poolscope: out of host memory at the timeline's stop; the trace's otherData is left "
        "empty");
  }
  try {
    m.writer->close_text(other, m.distributed_member);
  } catch (const std::exception& e) {
    std::lock_guard lock(m.mutex);
    m.write_failed(e.what(), "could not finish");
  }
  std::lock_guard lock(m.mutex);
  m.stats.bytes_written = m.writer->bytes();
  m.overlap.set_window(static_cast<std::int64_t>(m.origin), static_cast<std::int64_t>(m.stop_ns));
  m.ph = impl::phase::stopped;
}

void timeline::add_clock_sync(std::string_view label, std::span<const clock_sync_round> rounds) {
  if (!options_.distributed) {
    throw logic_error("poolscope: add_clock_sync on a timeline without options.distributed");
  }
  if (label.empty() || rounds.empty()) {
    throw invalid_argument("poolscope: add_clock_sync '" + std::string(label) + "' with " +
                           std::to_string(rounds.size()) +
                           " rounds (a label and a round at least)");
  }
  std::string item = "{\"label\":";
  append_trace_string(item, label);
  item += ",\"rounds\":[";
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    item += (i == 0 ? "[" : ",[") + std::to_string(rounds[i].before_ns) + "," +
            std::to_string(rounds[i].after_ns) + "]";
  }
  item += "]}";
  impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  if (m.ph == impl::phase::stopping || m.ph == impl::phase::stopped) {
    throw logic_error("poolscope: add_clock_sync '" + std::string(label) +
                      "' after the timeline stopped");
  }
  std::string clock_sync = m.clock_sync + (m.clock_sync.empty() ? "" : ",") + item;
  std::string member =
      (m.distributed_head.empty() ? distributed_head(*options_.distributed) : m.distributed_head) +
      "[" + clock_sync + "]}";
  m.clock_sync = std::move(clock_sync);
  m.distributed_member = std::move(member);
}

bool timeline::running() const noexcept {
  return impl_->accepting.load(std::memory_order_acquire);
}

std::uint64_t timeline::origin_ns() const noexcept {
  std::lock_guard lock(impl_->mutex);
  return impl_->origin;
}

void timeline::add_host_slice(const host_slice& s) noexcept {
  impl& m = *impl_;
  try {
    std::unique_lock lock(m.mutex);
    if (!m.accepting.load(std::memory_order_relaxed)) {
      ++m.stats.outside_session;
      return;
    }
    ++m.stats.host_slices;
    const std::uint64_t tid = s.thread != 0 ? s.thread : hooks::current_thread_id();
    const std::uint64_t end = std::max(s.begin_ns, s.end_ns);
    scope_summary& sum = m.scopes[{std::string(s.name), std::string(s.category)}];
    if (sum.count == 0) {
      sum.name = s.name;
      sum.category = s.category;
    }
    ++sum.count;
    sum.total_ns += end - s.begin_ns;
    sum.max_ns = std::max(sum.max_ns, end - s.begin_ns);
    // Slices naming no device (scopes among them) stay out, as in `poolscope trace summary`.
    const bool peer = s.src_device >= 0 && s.dst_device >= 0;
    if (s.device >= 0 && (s.category == "darray.transfer" || s.category == "darray.compute")) {
      const activity_class klass = *classify_category(s.category);
      m.overlap.add(s.device, klass, static_cast<std::int64_t>(s.begin_ns),
                    static_cast<std::int64_t>(end));
      // A copy between devices is time on both (as summarize_trace counts it).
      for (const int other : {s.src_device, s.dst_device}) {
        if (peer && other != s.device) {
          m.overlap.add(other, klass, static_cast<std::int64_t>(s.begin_ns),
                        static_cast<std::int64_t>(end));
        }
      }
    }
    if (!m.make_room(lock, false)) {
      ++m.stats.events_dropped;
      return;
    }
    m.append_whole([&] {
      m.name_host_thread(tid, s.track_name);
      trace_event ev;
      ev.phase = trace_phase::complete;
      ev.name = s.name;
      ev.cat = s.category;
      ev.pid = host_pid;
      ev.tid = static_cast<std::int64_t>(tid);
      ev.ts_ns = s.begin_ns;
      ev.dur_ns = end - s.begin_ns;
      trace_arg args[] = {{"device", s.device},
                          {"src_device", s.src_device},
                          {"dst_device", s.dst_device},
                          {"clock_error_ns", s.clock_error_ns}};
      if (s.device >= 0) {
        std::size_t n = peer ? 3 : 1;
        if (s.clock_error_ns != 0) {
          args[n++] = args[3];
        }
        ev.args = std::span<const trace_arg>(args, n);
      }
      m.put(ev);
    });
  } catch (...) {
    // No memory for the name or the chunk: the slice (already in host_slices) is lost and
    // counted as dropped; the program goes on.
    lost_host_events(0);
  }
}

void timeline::lost_host_events(std::uint64_t host_slices) noexcept {
  impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  if (!m.accepting.load(std::memory_order_relaxed)) {
    return;
  }
  m.stats.host_slices += host_slices;
  m.lost_to_memory();
}

namespace {
// The pre event of the upstream call (device_alloc, device_free, segment_map, segment_unmap) this
// thread is in, if any: its post event makes the call a slice. An upstream allocation that fails
// raises no post event; the next pre replaces it.
struct upstream_call {
  const void* timeline = nullptr;
  std::uint64_t allocator_id = 0;
  hooks::event_kind kind = hooks::event_kind::device_alloc;
  std::uint64_t begin_ns = 0;
};
thread_local upstream_call t_upstream;

bool is_upstream_call(hooks::event_kind k) noexcept {
  return k == hooks::event_kind::device_alloc || k == hooks::event_kind::device_free ||
         k == hooks::event_kind::segment_map || k == hooks::event_kind::segment_unmap;
}
}  // namespace

void timeline::add_allocator_event(const hooks::event& e) noexcept {
  if (e.phase == hooks::event_phase::pre) {
    // The post (or instant) event of the same operation carries the outcome; an upstream call's
    // pre event marks where the call began.
    if (is_upstream_call(e.kind)) {
      t_upstream = {impl_.get(), e.allocator_id, e.kind, e.time_ns};
    }
    return;
  }
  std::optional<std::uint64_t> upstream_begin;
  if (is_upstream_call(e.kind) && t_upstream.timeline == impl_.get() &&
      t_upstream.allocator_id == e.allocator_id && t_upstream.kind == e.kind &&
      t_upstream.begin_ns <= e.time_ns) {
    upstream_begin = t_upstream.begin_ns;
    t_upstream = {};
  }
  impl& m = *impl_;
  try {
    std::unique_lock lock(m.mutex);
    if (!m.accepting.load(std::memory_order_relaxed)) {
      ++m.stats.outside_session;
      return;
    }
    ++m.stats.allocator_events;
    memory_peak& p = m.memory[e.allocator_id];
    if (p.events == 0) {
      p.device = e.device;
      p.allocator = e.allocator_name != nullptr ? e.allocator_name : "";
      p.allocator_id = e.allocator_id;
    }
    auto& dev_now = m.device_current[e.device];
    dev_now.first += e.in_use - p.final_in_use;  // wraps back correctly when it shrinks
    dev_now.second += e.reserved - p.final_reserved;
    ++p.events;
    p.final_in_use = e.in_use;
    p.final_reserved = e.reserved;
    p.peak_in_use = std::max<std::uint64_t>(p.peak_in_use, e.in_use);
    p.peak_reserved = std::max<std::uint64_t>(p.peak_reserved, e.reserved);
    device_memory_peak& dp = m.device_memory[e.device];
    dp.device = e.device;
    dp.peak_in_use = std::max(dp.peak_in_use, dev_now.first);
    dp.peak_reserved = std::max(dp.peak_reserved, dev_now.second);

    const auto written = m.counter_written.find(e.allocator_id);
    const bool counter_changed =
        written == m.counter_written.end() ||
        written->second != std::pair<std::uint64_t, std::uint64_t>(e.in_use, e.reserved);
    if (!m.opts.allocator_instants && !counter_changed) {
      return;
    }
    if (!m.make_room(lock, false)) {
      ++m.stats.events_dropped;
      return;
    }
    m.append_whole(
        [&] { m.format_allocator_event(e, p, dev_now, counter_changed, upstream_begin); });
  } catch (...) {
    // Out of memory: the event is lost (counted), the program goes on.
    lost_host_events(0);
  }
}

void timeline::impl::format_allocator_event(const hooks::event& e, const memory_peak& p,
                                            const std::pair<std::uint64_t, std::uint64_t>& dev_now,
                                            bool counter_changed,
                                            std::optional<std::uint64_t> upstream_begin_ns) {
  impl& m = *this;
  if (upstream_begin_ns) {
    // The upstream call itself (cudaMalloc, cudaFree: hundreds of µs for large blocks, the host
    // blocked; cuMemMap and cuMemUnmap of granules) as a slice on the calling thread, where a gap
    // in the host's issuing would be.
    m.name_host_thread(e.thread);
    trace_event s;
    s.phase = trace_phase::complete;
    switch (e.kind) {
      case hooks::event_kind::device_alloc:
        s.name = "upstream alloc";
        break;
      case hooks::event_kind::segment_map:
        s.name = "segment map";  // granules mapped into a virtual resource's range
        break;
      case hooks::event_kind::segment_unmap:
        s.name = "segment unmap";
        break;
      default:
        s.name = "upstream free";
    }
    s.cat = "allocator";
    s.pid = host_pid;
    s.tid = static_cast<std::int64_t>(e.thread);
    s.ts_ns = *upstream_begin_ns;
    s.dur_ns = e.time_ns - *upstream_begin_ns;
    const trace_arg args[] = {{"allocator", p.allocator},
                              {"allocator_id", e.allocator_id},
                              {"device", e.device},
                              {"bytes", e.rounded}};
    s.args = args;
    m.put(s);
  }
  {
    if (m.opts.allocator_instants) {
      m.name_host_thread(e.thread);
      const std::string ptr = hex(reinterpret_cast<std::uintptr_t>(e.ptr));
      const std::string stream = hex(reinterpret_cast<std::uintptr_t>(e.stream));
      trace_event ev;
      ev.phase = trace_phase::instant;
      ev.name = hooks::to_string(e.kind);
      ev.cat = "allocator";
      ev.pid = host_pid;
      ev.tid = static_cast<std::int64_t>(e.thread);
      ev.ts_ns = e.time_ns;
      const trace_arg args[] = {{"allocator", p.allocator},
                                {"allocator_id", e.allocator_id},
                                {"device", e.device},
                                {"phase", hooks::to_string(e.phase)},
                                {"ptr", ptr},
                                {"stream", stream},
                                {"requested", e.requested},
                                {"rounded", e.rounded},
                                {"in_use", e.in_use},
                                {"reserved", e.reserved},
                                {"seq", e.seq},
                                {"error", hooks::to_string(e.error)}};
      ev.args = std::span<const trace_arg>(args, e.error != hooks::free_error::none ? 12 : 11);
      m.put(ev);
    }
    if (counter_changed) {
      const std::int64_t pid = m.memory_pid(e.device);
      const std::string name = "memory " + p.allocator + " #" + std::to_string(e.allocator_id);
      trace_event c;
      c.phase = trace_phase::counter;
      c.name = name;
      c.cat = "memory";
      c.pid = pid;
      c.tid = 0;
      c.ts_ns = e.time_ns;
      const trace_arg args[] = {{"in_use", e.in_use}, {"reserved", e.reserved}};
      c.args = args;
      m.put(c);
      const trace_arg total[] = {{"in_use", dev_now.first}, {"reserved", dev_now.second}};
      c.name = "memory (all pools)";
      c.args = total;
      m.put(c);
      m.counter_written[e.allocator_id] = {e.in_use, e.reserved};
    }
  }
}

void timeline::add_device_activity(const device_activity& a) noexcept {
  impl& m = *impl_;
  try {
    std::unique_lock lock(m.mutex);
    if (!m.accepting.load(std::memory_order_relaxed)) {
      ++m.stats.outside_session;
      return;
    }
    ++m.stats.device_records;
    const bool point = a.kind == activity_kind::marker || a.kind == activity_kind::memory;
    if (a.start_ns == 0 || (!point && (a.end_ns == 0 || a.end_ns < a.start_ns))) {
      ++m.stats.incomplete_records;
      return;
    }
    switch (a.kind) {
      case activity_kind::kernel:
      case activity_kind::memcpy:
      case activity_kind::memset:
        m.device_op(lock, a);
        break;
      case activity_kind::runtime_api:
      case activity_kind::driver_api:
        m.api_call(lock, a);
        break;
      case activity_kind::synchronization:
        m.synchronization(lock, a);
        break;
      case activity_kind::marker:
        m.marker(lock, a);
        break;
      case activity_kind::memory:
        m.cuda_memory(lock, a);
        break;
    }
  } catch (...) {
    // Out of memory: the record is lost.
  }
}

timeline_stats timeline::stats() const {
  std::lock_guard lock(impl_->mutex);
  timeline_stats s = impl_->stats;
  s.overlap_intervals_dropped = impl_->overlap.dropped();
  return s;
}

cupti_status timeline::cupti() const {
  return impl_->collector != nullptr ? impl_->collector->status() : cupti_status{};
}

timeline_summary timeline::summary() const {
  const impl& m = *impl_;
  timeline_summary s;
  s.cupti = cupti();
  s.stats = stats();
  std::lock_guard lock(m.mutex);
  s.trace_path = options_.trace_path;
  s.start_ns = m.origin;
  s.stop_ns = m.stop_ns;
  s.device_names = m.device_names;
  const auto by_total = [](const auto& a, const auto& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  };
  for (const auto& [k, v] : m.kernels) {
    s.kernels.push_back(v);
  }
  for (const auto& [k, v] : m.copies) {
    s.copies.push_back(v);
  }
  for (const auto& [k, v] : m.scopes) {
    s.scopes.push_back(v);
  }
  std::sort(s.kernels.begin(), s.kernels.end(), by_total);
  std::sort(s.copies.begin(), s.copies.end(), by_total);
  std::sort(s.scopes.begin(), s.scopes.end(), by_total);
  for (const auto& [id, p] : m.memory) {
    s.memory.push_back(p);
  }
  for (const auto& [d, p] : m.device_memory) {
    s.device_memory.push_back(p);
  }
  overlap_analyzer copy = m.overlap;
  if (m.ph == impl::phase::running) {
    copy.set_window(static_cast<std::int64_t>(m.origin),
                    static_cast<std::int64_t>(hooks::now_ns()));
  }
  s.overlap = copy.analyze();
  return s;
}

}  // namespace poolscope::profiler
