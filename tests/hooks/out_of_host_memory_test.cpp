// The hooks when the host runs out of memory: a workload of allocations and frees through a real
// pool (bfc over the host resource) runs with each operator new it reaches made to fail in turn
// (a sweep: the 1st, the 2nd, ... until a run reaches no failure). The workload must go on (an
// allocation may fail only with the pool's own std::bad_alloc, a free always completes), the
// process must not end, and each hook must stay valid: every event it saw is counted or written,
// or its loss is logged. Also: a log line on stderr needs no memory. Skipped under sanitizers
// (the failing operator new is left out there; see tests/support/failing_new.hpp).
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "poolscope/hooks/counting_hook.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/hooks/jsonl_hook.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "support/failing_new.hpp"
#include "support/failing_new_operators.hpp"  // the hooks test program's one inclusion
#include "support/fixed_log_capture.hpp"
#include "support/three_pool_workload.hpp"

namespace {

namespace ph = poolscope::hooks;
using poolscope::testing::cancel_failing_new;
using poolscope::testing::fail_nth_new;
using poolscope::testing::failing_new_available;
using poolscope::testing::fixed_log_capture;

char g_stream;
const poolscope::stream_view S{&g_stream};

/// What one run of the workload did.
struct outcome {
  int allocations = 0;  // that succeeded
  int frees = 0;
  int left = 0;  // cancel_failing_new(): > 0 when the failure was not reached
};

/// The sweep's workload (support/three_pool_workload.hpp) with the k-th operator new failing.
outcome run_workload(poolscope::pool::allocator& alloc, int k) {
  fail_nth_new(k);
  const auto c = poolscope::testing::run_three_pool_workload(alloc, S);
  return {c.allocations, c.frees, cancel_failing_new()};
}

class hooks_out_of_host_memory : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!failing_new_available) {
      GTEST_SKIP() << "needs the failing operator new, left out under a sanitizer";
    }
  }
};

// The counting hook allocates nothing: every event of every run is counted, whatever failed.
TEST_F(hooks_out_of_host_memory, counting_hook_counts_every_event) {
  poolscope::pool::host_resource host;
  poolscope::pool::bfc_allocator alloc{host};
  ph::counting_hook counts;
  ph::scoped_hook on{counts};
  int allocations = 0;
  int frees = 0;
  for (int k = 1; k < 1000; ++k) {
    const outcome o = run_workload(alloc, k);
    allocations += o.allocations;
    frees += o.frees;
    const auto c = counts.snapshot();
    EXPECT_EQ(c.of(ph::event_kind::pool_malloc).calls, static_cast<std::uint64_t>(allocations))
        << "new #" << k << " failing";
    EXPECT_EQ(c.of(ph::event_kind::pool_free, ph::event_phase::pre).calls,
              static_cast<std::uint64_t>(frees))
        << "new #" << k << " failing";
    if (o.left > 0) {
      EXPECT_EQ(o.allocations, 3);
      return;
    }
  }
  ADD_FAILURE() << "the workload reached 1000 allocations";
}

// The JSON Lines hook to a file it owns and to a borrowed stream that allocates as it grows: the
// run completes; each line written parses; lines() counts them; a hook that had to give up says
// so in the log.
TEST_F(hooks_out_of_host_memory, jsonl_hook_writes_whole_lines_or_says_it_stopped) {
  poolscope::pool::host_resource host;
  poolscope::pool::bfc_allocator alloc{host};
  const std::string path = ::testing::TempDir() + "poolscope_hooks_oom.jsonl";
  for (int k = 1; k < 1000; ++k) {
    fixed_log_capture log;
    std::ostringstream borrowed;
    outcome o;
    std::uint64_t file_lines = 0;
    bool file_enabled = true;
    bool borrowed_enabled = true;
    std::uint64_t borrowed_lines = 0;
    {
      ph::jsonl_hook to_file{path};
      ph::jsonl_hook to_stream{borrowed};
      ph::scoped_hook a{to_file};
      ph::scoped_hook b{to_stream};
      o = run_workload(alloc, k);
      to_file.flush();
      file_lines = to_file.lines();
      file_enabled = to_file.enabled();
      borrowed_lines = to_stream.lines();
      borrowed_enabled = to_stream.enabled();
    }
    // Whole lines parse. A write that failed may have left part of its text behind (documented:
    // a stream cannot take back what it accepted): only then, and only at the end, a line
    // without its newline; it is not counted in lines().
    const auto count_lines = [&](std::istream& in, bool enabled) {
      std::uint64_t n = 0;
      std::string line;
      while (std::getline(in, line)) {
        if (in.eof() && !enabled) {
          break;  // the unterminated text of the failed write
        }
        EXPECT_TRUE(nlohmann::json::accept(line)) << "new #" << k << ": " << line;
        ++n;
      }
      return n;
    };
    std::ifstream file(path);
    EXPECT_EQ(count_lines(file, file_enabled), file_lines) << "new #" << k;
    std::istringstream stream(borrowed.str());
    EXPECT_EQ(count_lines(stream, borrowed_enabled), borrowed_lines) << "new #" << k;
    if (!file_enabled || !borrowed_enabled) {
      EXPECT_TRUE(log.saw("the hook is disabled")) << "new #" << k;
    }
    if (o.left > 0) {
      EXPECT_TRUE(file_enabled);
      EXPECT_TRUE(borrowed_enabled);
      EXPECT_EQ(file_lines, borrowed_lines);
      std::remove(path.c_str());
      return;
    }
  }
  std::remove(path.c_str());
  ADD_FAILURE() << "the workload reached 1000 allocations";
}

// A hook that must give up logs why, and the line reaches stderr even when no memory is left to
// format it (poolscope::log is how every collector reports its losses).
TEST_F(hooks_out_of_host_memory, log_line_reaches_stderr_without_memory) {
  ::testing::internal::CaptureStderr();
  fail_nth_new(1);
  poolscope::log(poolscope::log_level::error, "collector disabled: no memory left (test)");
  const int left = cancel_failing_new();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("[poolscope error] collector disabled: no memory left (test)\n"),
            std::string::npos)
      << "stderr was: " << err;
  EXPECT_EQ(left, 1) << "logging allocated";
}

// A message longer than any stack buffer is still written whole, on one line.
TEST_F(hooks_out_of_host_memory, long_log_line_reaches_stderr_whole) {
  const std::string long_message(5000, 'x');
  ::testing::internal::CaptureStderr();
  fail_nth_new(1);
  poolscope::log(poolscope::log_level::error, long_message);
  (void)cancel_failing_new();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "[poolscope error] " + long_message + "\n");
}

}  // namespace
