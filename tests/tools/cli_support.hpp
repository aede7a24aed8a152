// What the tests of the poolscope command share: running it as a subprocess, looking for text in
// its output, and small input files (a Chrome trace with one device).
//
//   const auto r = poolscope::testing::run_cli({"trace", "summary", path});
//   EXPECT_TRUE(poolscope::testing::contains(r.err, "--json"));
//
// Needs POOLSCOPE_CLI_PATH (the tools' tests define it). Not thread-safe (run_process).
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "subprocess.hpp"

#ifdef POOLSCOPE_CLI_PATH

namespace poolscope::testing {

/// Runs `poolscope args...` with POOLSCOPE_LOG=warn.
inline process_result run_cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv{POOLSCOPE_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {{"POOLSCOPE_LOG", "warn"}});
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// A new temporary file (temp_path(stem)) holding `text`; returns its path.
inline std::string write_file(const std::string& stem, const std::string& text) {
  const std::string path = temp_path(stem);
  std::ofstream(path) << text;
  return path;
}

/// A Chrome trace with one device, a kernel and a copy, and two "phase" host slices.
inline const std::string small_trace_text = R"JSON({"traceEvents":[
  {"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"host"}},
  {"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"name":"main"}},
  {"ph":"M","name":"process_name","pid":100,"tid":0,"args":{"name":"GPU 0"}},
  {"ph":"M","name":"thread_name","pid":100,"tid":7,"args":{"name":"stream 7"}},
  {"ph":"X","name":"step","cat":"user","pid":1,"tid":1,"ts":0.000,"dur":100.000},
  {"ph":"X","name":"phase","cat":"user","pid":1,"tid":1,"ts":10.000,"dur":20.000},
  {"ph":"X","name":"phase","cat":"user","pid":1,"tid":1,"ts":50.000,"dur":10.000},
  {"ph":"X","name":"k","cat":"kernel","pid":100,"tid":7,"ts":10.000,"dur":20.000,
   "args":{"device":0}},
  {"ph":"X","name":"Memcpy HtoD","cat":"memcpy","pid":100,"tid":7,"ts":40.000,"dur":10.000,
   "args":{"device":0,"bytes":4000}}],"displayTimeUnit":"ns"})JSON";

}  // namespace poolscope::testing

#endif  // POOLSCOPE_CLI_PATH
