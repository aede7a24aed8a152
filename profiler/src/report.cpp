#include "poolscope/profiler/report.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "poolscope/error.hpp"
#include "poolscope/profiler/distributed_info.hpp"

#ifndef POOLSCOPE_VERSION
#define POOLSCOPE_VERSION "unknown"
#endif

namespace poolscope::profiler {
namespace {

using json = nlohmann::json;

const char* const builtin_run_keys[] = {"program",    "pid",      "hostname", "poolscope_version",
                                        "clock",      "start_ns", "stop_ns",  "duration_ns",
                                        "trace_file", "devices",  "cupti",    "timeline"};

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace

json to_json(const cupti_status& s) {
  return {{"state", std::string(to_string(s.state))},
          {"reason", s.reason},
          {"clock", s.clock == clock_mode::callback ? "callback" : "offset"},
          {"offset_ns", s.offset_ns},
          {"records", s.records},
          {"dropped_records", s.dropped_records},
          {"buffers_refused", s.buffers_refused},
          {"buffers_completed", s.buffers_completed},
          {"unmapped_threads", s.unmapped_threads},
          {"system_thread_ids", s.system_thread_ids},
          {"unknown_records", s.unknown_records},
          {"refused_kinds", s.refused_kinds},
          {"nvtx_attached", s.nvtx_attached},
          {"nvtx_note", s.nvtx_note},
          {"buffer_bytes", s.buffer_bytes},
          {"buffer_count", s.buffer_count}};
}

json to_json(const timeline_stats& s) {
  return {{"events_written", s.events_written},
          {"events_dropped", s.events_dropped},
          {"outside_session", s.outside_session},
          {"bytes_written", s.bytes_written},
          {"host_slices", s.host_slices},
          {"allocator_events", s.allocator_events},
          {"device_records", s.device_records},
          {"incomplete_records", s.incomplete_records},
          {"flows", s.flows},
          {"unlinked_device_ops", s.unlinked_device_ops},
          {"device_clipped", s.device_clipped},
          {"nvtx_unmatched", s.nvtx_unmatched},
          {"overlap_intervals_dropped", s.overlap_intervals_dropped},
          {"write_failed", s.write_failed},
          {"write_error", s.write_error}};
}

run_report::run_report(timeline_summary summary) : summary_(std::move(summary)) {}

run_report run_report::from(const timeline& t) {
  return run_report(t.summary());
}

void run_report::add_profile(const std::string& name, json profile) {
  profiles_[name] = std::move(profile);
}

void run_report::set_metadata(const std::string& key, json value) {
  for (const char* k : builtin_run_keys) {
    if (key == k) {
      throw invalid_argument("poolscope: run_report::set_metadata: \"" + key +
                             "\" is a built-in key of the report's run section");
    }
  }
  metadata_[key] = std::move(value);
}

json run_report::to_json() const {
  const timeline_summary& s = summary_;
  json run = metadata_;
  run["program"] = read_first_line("/proc/self/comm");
  run["pid"] = static_cast<long long>(::getpid());
  run["hostname"] = host_name();
  run["poolscope_version"] = POOLSCOPE_VERSION;
  run["clock"] = "CLOCK_MONOTONIC";
  run["start_ns"] = s.start_ns;
  run["stop_ns"] = s.stop_ns;
  run["duration_ns"] = s.stop_ns >= s.start_ns ? s.stop_ns - s.start_ns : 0;
  run["trace_file"] = s.trace_path;
  run["devices"] = json::array();
  for (std::size_t d = 0; d < s.device_names.size(); ++d) {
    run["devices"].push_back({{"id", d}, {"name", s.device_names[d]}});
  }
  run["cupti"] = profiler::to_json(s.cupti);
  run["timeline"] = profiler::to_json(s.stats);

  json kernels = json::array();
  for (const op_summary& k : s.kernels) {
    kernels.push_back(k.to_json());
  }
  json copies = json::array();
  for (const op_summary& c : s.copies) {
    copies.push_back(c.to_json());
  }
  json scopes = json::array();
  for (const scope_summary& sc : s.scopes) {
    scopes.push_back(
        {{"name", sc.name},
         {"category", sc.category},
         {"count", sc.count},
         {"total_ns", sc.total_ns},
         {"mean_ns",
          sc.count == 0 ? 0.0 : static_cast<double>(sc.total_ns) / static_cast<double>(sc.count)},
         {"max_ns", sc.max_ns}});
  }
  json allocators = json::array();
  for (const memory_peak& m : s.memory) {
    allocators.push_back({{"device", m.device},
                          {"allocator", m.allocator},
                          {"allocator_id", m.allocator_id},
                          {"events", m.events},
                          {"peak_in_use", m.peak_in_use},
                          {"peak_reserved", m.peak_reserved},
                          {"final_in_use", m.final_in_use},
                          {"final_reserved", m.final_reserved}});
  }
  json devices = json::array();
  for (const device_memory_peak& d : s.device_memory) {
    devices.push_back(
        {{"device", d.device}, {"peak_in_use", d.peak_in_use}, {"peak_reserved", d.peak_reserved}});
  }
  json overlap = json::array();
  for (const device_overlap& o : s.overlap) {
    overlap.push_back(o.to_json());
  }
  return {{"schema", report_schema},
          {"version", report_schema_version},
          {"run", std::move(run)},
          {"kernels", std::move(kernels)},
          {"copies", std::move(copies)},
          {"scopes", std::move(scopes)},
          {"memory", {{"allocators", std::move(allocators)}, {"devices", std::move(devices)}}},
          {"overlap", std::move(overlap)},
          {"profiles", profiles_}};
}

void run_report::write(const std::string& path) const {
  const std::string text = to_json().dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  std::ofstream f(path, std::ios::out | std::ios::trunc);
  if (!f) {
    throw runtime_error("poolscope: cannot create report '" + path + "': " + std::strerror(errno));
  }
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  if (!f) {
    throw runtime_error("poolscope: writing report '" + path + "' failed");
  }
}

}  // namespace poolscope::profiler
