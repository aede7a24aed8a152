#include "poolscope/analysis/snapshot_trace.hpp"

#include <algorithm>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace poolscope::analysis {

using profiler::block_state;
using profiler::memory_snapshot;
using profiler::trace_action;
using profiler::trace_entry;

std::vector<int> snapshot_devices(const memory_snapshot& s) {
  std::set<int> devices;
  for (std::size_t d = 0; d < s.device_traces.size(); ++d) {
    if (!s.device_traces[d].empty()) {
      devices.insert(static_cast<int>(d));
    }
  }
  for (const auto& seg : s.segments) {
    devices.insert(static_cast<int>(seg.device));
  }
  return {devices.begin(), devices.end()};
}

namespace {

/// A block live before the first event: where, its requested bytes, its stream.
struct early_block {
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t stream;
};

log_record record_of(hooks::event_kind kind, const trace_entry& e, int device, std::size_t line) {
  log_record r;
  r.kind = kind;
  r.phase = kind == hooks::event_kind::pool_malloc ? hooks::event_phase::post
            : kind == hooks::event_kind::pool_free ? hooks::event_phase::pre
                                                   : hooks::event_phase::instant;
  r.time_ns = e.time_us * 1000;
  r.device = device;
  r.stream = e.stream;
  r.ptr = kind == hooks::event_kind::oom ? 0 : e.addr;
  r.size = e.size;
  r.line = line;
  return r;
}

/// The segment bytes before the first event and the peak, from the end and the segment entries.
void reserved_figures(const memory_snapshot& s, int device, const std::vector<trace_entry>& trace,
                      snapshot_figures& f) {
  for (const auto& seg : s.segments) {
    if (seg.device == device) {
      f.reserved_at_end += seg.total_size;
    }
  }
  auto delta = [](const trace_entry& e) -> std::int64_t {
    switch (e.action) {
      case trace_action::segment_alloc:
      case trace_action::segment_map:
        return static_cast<std::int64_t>(e.size);
      case trace_action::segment_free:
      case trace_action::segment_unmap:
        return -static_cast<std::int64_t>(e.size);
      default:
        return 0;
    }
  };
  std::int64_t net = 0;
  for (const trace_entry& e : trace) {
    net += delta(e);
  }
  std::int64_t current = static_cast<std::int64_t>(f.reserved_at_end) - net;
  if (current < 0) {
    f.segments_inconsistent = true;
    current = 0;
  }
  f.reserved_at_start = static_cast<std::uint64_t>(current);
  std::int64_t peak = current;
  for (const trace_entry& e : trace) {
    current = std::max<std::int64_t>(current + delta(e), 0);
    peak = std::max(peak, current);
  }
  f.source_peak_reserved = static_cast<std::uint64_t>(peak);
}

}  // namespace

snapshot_trace snapshot_trace_of(const memory_snapshot& s, int device) {
  const auto devices = snapshot_devices(s);
  if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
    throw invalid_argument("poolscope: the snapshot has no trace and no segments on device " +
                           std::to_string(device));
  }
  static const std::vector<trace_entry> no_trace;
  const auto& trace = static_cast<std::size_t>(device) < s.device_traces.size()
                          ? s.device_traces[static_cast<std::size_t>(device)]
                          : no_trace;
  snapshot_trace out;
  out.log.format = log_format::memory_snapshot;
  out.log.allocators.push_back("device " + std::to_string(device));
  snapshot_figures& f = out.figures;
  f.device = device;
  f.entries = trace.size();

  // What the user allocated and freed, in trace order; blocks live before the first event are
  // found on the way (a free of an address the trace never allocated) and at the end (an active
  // block the trace never allocated).
  std::vector<log_record> body;
  std::vector<early_block> early;
  std::unordered_map<std::uint64_t, std::uint64_t> live;  // address -> requested bytes
  std::unordered_set<std::uint64_t> requested;            // free requested, not yet completed
  std::unordered_set<std::uint64_t> seen;                 // allocated in the trace at least once
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const trace_entry& e = trace[i];
    switch (e.action) {
      case trace_action::alloc:
        ++f.allocs;
        live[e.addr] = e.size;
        seen.insert(e.addr);
        requested.erase(e.addr);
        body.push_back(record_of(hooks::event_kind::pool_malloc, e, device, i));
        break;
      case trace_action::free_requested:
        if (live.erase(e.addr) != 0) {
          ++f.frees;
          requested.insert(e.addr);
          body.push_back(record_of(hooks::event_kind::pool_free, e, device, i));
        } else if (seen.insert(e.addr).second) {
          ++f.frees;
          early.push_back({e.addr, e.size, e.stream});
          requested.insert(e.addr);
          body.push_back(record_of(hooks::event_kind::pool_free, e, device, i));
        } else {
          ++f.frees_not_live;
        }
        break;
      case trace_action::free_completed:
        // The user's free is the request; a completion without one in the trace frees a block
        // that is live (its request lost), else one freed before the trace began.
        if (requested.erase(e.addr) == 0 && live.erase(e.addr) != 0) {
          ++f.frees;
          body.push_back(record_of(hooks::event_kind::pool_free, e, device, i));
        }
        break;
      case trace_action::oom:
        ++f.ooms;
        body.push_back(record_of(hooks::event_kind::oom, e, device, i));
        break;
      default:
        break;  // segments: what the recorded allocator did
    }
  }
  for (const auto& seg : s.segments) {
    if (seg.device != device) {
      continue;
    }
    for (const auto& b : seg.blocks) {
      if (b.state == block_state::active_allocated && live.find(b.address) == live.end()) {
        early.push_back({b.address, b.requested_size, seg.stream});
      }
    }
  }
  std::sort(early.begin(), early.end(),
            [](const early_block& a, const early_block& b) { return a.addr < b.addr; });

  const std::uint64_t start_us = trace.empty() ? 0 : trace.front().time_us;
  out.log.records.reserve(early.size() + body.size());
  std::unordered_map<std::uint64_t, std::uint64_t> bytes;  // live address -> requested bytes
  std::uint64_t live_bytes = 0;
  for (const early_block& b : early) {
    log_record r = record_of(
        hooks::event_kind::pool_malloc,
        trace_entry{trace_action::alloc, b.addr, b.size, b.stream, start_us, 0}, device, 0);
    out.log.records.push_back(r);
    bytes[b.addr] = b.size;
    live_bytes += b.size;
    ++f.blocks_before_trace;
    f.bytes_before_trace += b.size;
  }
  f.source_peak_live = live_bytes;
  for (const log_record& r : body) {
    if (r.kind == hooks::event_kind::pool_malloc) {
      auto [it, fresh] = bytes.try_emplace(r.ptr, r.size);
      if (!fresh) {
        live_bytes -= it->second;  // the trace lost its free
        it->second = r.size;
      }
      live_bytes += r.size;
      f.source_peak_live = std::max(f.source_peak_live, live_bytes);
    } else if (r.kind == hooks::event_kind::pool_free) {
      if (auto it = bytes.find(r.ptr); it != bytes.end()) {
        live_bytes -= it->second;
        bytes.erase(it);
      }
    }
    out.log.records.push_back(r);
  }
  for (std::size_t i = 0; i < out.log.records.size(); ++i) {
    out.log.records[i].seq = i + 1;
  }
  reserved_figures(s, device, trace, f);
  return out;
}

}  // namespace poolscope::analysis
