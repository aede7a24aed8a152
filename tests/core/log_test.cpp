// poolscope::log with a sink that logs or replaces the sink itself: neither may deadlock (a sink
// run under the log mutex would have the nested call take it again). Each case runs on a
// helper thread with a deadline: a deadlocked case cannot be recovered from (the log mutex stays
// held), so it ends the test program with a message naming the case.
#include "poolscope/log.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

using poolscope::log_level;

/// Runs `body` on another thread; ends the program if it has not returned within 20 s.
void run_or_die(const char* what, std::function<void()> body) {
  std::packaged_task<void()> task(std::move(body));
  auto done = task.get_future();
  std::thread worker(std::move(task));
  if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    // On stdout too: stderr may be captured by the case.
    for (FILE* out : {stdout, stderr}) {
      std::fprintf(out, "FATAL: %s did not return within 20 s: poolscope::log deadlocked\n", what);
      std::fflush(out);
    }
    std::_Exit(3);
  }
  worker.join();
  done.get();
}

/// Restores the stderr sink and the threshold after each case.
class log_reentrancy : public ::testing::Test {
 protected:
  void SetUp() override { poolscope::set_log_level(log_level::warn); }
  void TearDown() override {
    poolscope::set_log_sink({});
    poolscope::set_log_level(saved_);
  }

 private:
  log_level saved_ = poolscope::get_log_level();
};

TEST_F(log_reentrancy, a_sink_that_logs_does_not_deadlock_and_its_message_goes_to_stderr) {
  std::vector<std::string> seen;
  poolscope::set_log_sink([&seen](log_level, std::string_view message) {
    seen.emplace_back(message);
    poolscope::log(log_level::error, "nested from the sink");
  });
  ::testing::internal::CaptureStderr();
  run_or_die("log() from inside the sink", [] { poolscope::log(log_level::error, "outer"); });
  const std::string err = ::testing::internal::GetCapturedStderr();
  // The sink saw the outer message once; the nested one was not fed back into it (no recursion)
  // and was not lost either.
  ASSERT_EQ(seen.size(), 1U);
  EXPECT_EQ(seen[0], "outer");
  EXPECT_EQ(err, "[poolscope error] nested from the sink\n");
  // The sink still receives later messages.
  run_or_die("log() after a nested call", [] { poolscope::log(log_level::warn, "later"); });
  ASSERT_EQ(seen.size(), 2U);
  EXPECT_EQ(seen[1], "later");
}

TEST_F(log_reentrancy, a_sink_that_replaces_itself_does_not_deadlock) {
  std::vector<std::string> first;
  std::vector<std::string> second;
  poolscope::set_log_sink([&first, &second](log_level, std::string_view message) {
    first.emplace_back(message);
    // Replaces the sink that is running: takes effect once it returns.
    poolscope::set_log_sink([&second](log_level, std::string_view m) { second.emplace_back(m); });
    first.emplace_back("still running");
  });
  run_or_die("set_log_sink() from inside the sink", [] {
    poolscope::log(log_level::error, "one");
    poolscope::log(log_level::error, "two");
  });
  EXPECT_EQ(first, (std::vector<std::string>{"one", "still running"}));
  EXPECT_EQ(second, (std::vector<std::string>{"two"}));
}

TEST_F(log_reentrancy, a_throwing_sink_keeps_later_messages_and_its_lines_go_to_stderr) {
  int calls = 0;
  poolscope::set_log_sink([&calls](log_level, std::string_view) {
    ++calls;
    throw std::runtime_error("sink failed");
  });
  ::testing::internal::CaptureStderr();
  run_or_die("log() with a throwing sink", [] {
    poolscope::log(log_level::error, "a");
    poolscope::log(log_level::warn, "b");
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(calls, 2);
  // Not lost: each line the sink failed on is on stderr.
  EXPECT_EQ(err, "[poolscope error] a\n[poolscope warn] b\n");
}

// A sink that allocates fails when the host is out of memory; the line it was given survives.
TEST_F(log_reentrancy, a_line_the_sink_has_no_memory_for_goes_to_stderr) {
  poolscope::set_log_sink([](log_level, std::string_view) { throw std::bad_alloc(); });
  ::testing::internal::CaptureStderr();
  run_or_die("log() with a sink out of memory",
             [] { poolscope::log(log_level::error, "collector stopped: out of host memory"); });
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "[poolscope error] collector stopped: out of host memory\n");
}

}  // namespace
