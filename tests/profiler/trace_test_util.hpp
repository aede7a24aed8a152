// Helpers shared by the trace tests: temporary paths, reading a trace back, counting events.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "poolscope/analysis/trace_check.hpp"

namespace poolscope::profiler::testing {

/// A fresh path under the test temp dir, removed by the destructor.
class temp_file {
 public:
  explicit temp_file(const std::string& suffix) {
    static std::atomic<int> n{0};
    path_ = ::testing::TempDir() + "poolscope_trace_" + std::to_string(::getpid()) + "_" +
            std::to_string(n.fetch_add(1)) + suffix;
  }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;
  ~temp_file() { std::remove(path_.c_str()); }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

/// The raw bytes of a file.
inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Every event of a trace (plain or gzip), through the library's streaming reader.
inline std::vector<nlohmann::json> read_events(const std::string& path,
                                               analysis::trace_read_info* info = nullptr) {
  std::vector<nlohmann::json> out;
  const analysis::trace_read_info i =
      analysis::read_trace(path, [&](std::uint64_t, const nlohmann::json& e) { out.push_back(e); });
  if (info != nullptr) {
    *info = i;
  }
  return out;
}

/// Runs the checker and fails the test with its report if the trace is invalid.
inline void expect_valid_trace(const std::string& path) {
  const analysis::trace_check_result r = analysis::check_trace(path);
  EXPECT_TRUE(r.ok()) << r.to_text();
}

/// Events with phase `ph` (and, if given, category `cat`).
inline std::vector<nlohmann::json> events_of(const std::vector<nlohmann::json>& all,
                                             const std::string& ph, const std::string& cat = "") {
  std::vector<nlohmann::json> out;
  for (const auto& e : all) {
    if (e.value("ph", "") == ph && (cat.empty() || e.value("cat", "") == cat)) {
      out.push_back(e);
    }
  }
  return out;
}

/// ts or dur (µs with three decimals) back to integer ns.
inline long long to_ns(const nlohmann::json& us) {
  return std::llround(us.get<double>() * 1000.0);
}

}  // namespace poolscope::profiler::testing
