// The NCCL watchdog's aborts against the backend's NCCL calls (darray/src/nccl_watchdog.hpp),
// without a GPU: a watchdog over no communicators still polls its group's failures and the host
// call in progress, and takes the mutex of NCCL calls before it aborts. A failure found while a
// call holds that mutex waits for it; a call stuck there past the timeout ends the process, named.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>

#include "nccl_watchdog.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/error.hpp"

namespace poolscope::darray::detail {
namespace {

using namespace std::chrono_literals;

// A group of two ranks with no MPI (adopted from a communicator no NCCL call ever sees: the
// watchdog below polls none) and a short timeout.
std::shared_ptr<process_group> group_with_timeout(std::chrono::milliseconds timeout) {
  static int not_a_communicator = 0;
  process_group_options o;
  o.timeout = timeout;
  return process_group::adopt_nccl(&not_a_communicator, 0, 2, o);
}

// Polls `done` every 10 ms for up to `limit`.
template <typename Done>
bool eventually(Done done, std::chrono::milliseconds limit = 5000ms) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) {
      return false;
    }
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// Whether the watchdog has found a failure (check() throws it).
bool found_failure(const nccl_watchdog& w) {
  try {
    w.check();
    return false;
  } catch (const communication_error&) {
    return true;
  }
}

TEST(nccl_watchdog_concurrency, an_abort_waits_for_the_nccl_call_in_progress) {
  std::mutex calls;
  const auto group = group_with_timeout(3000ms);
  nccl_watchdog w({}, /*abort_comms=*/true, group, calls);
  std::unique_lock call(calls);  // a call into NCCL, enqueueing
  group->fail("rank 1 failed: a test");
  ASSERT_TRUE(eventually([&] { return found_failure(w); }));
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(w.aborted()) << "aborted beside a call in NCCL";
  call.unlock();
  EXPECT_TRUE(eventually([&] { return w.aborted(); }));
  EXPECT_THROW(w.check(), communication_error);
}

TEST(nccl_watchdog_concurrency, a_host_call_past_the_timeout_is_named_and_aborted) {
  std::mutex calls;
  nccl_watchdog w({}, /*abort_comms=*/true, group_with_timeout(200ms), calls);
  {
    // Past the timeout, but not holding the mutex (it returned into a wait of its own).
    const nccl_watchdog::host_call slow(w, "a transfer group with other ranks");
    ASSERT_TRUE(eventually([&] { return w.aborted(); }));
  }
  try {
    w.check();
    ADD_FAILURE() << "no failure";
  } catch (const communication_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a transfer group with other ranks"), std::string::npos) << what;
    // A bound under ten seconds in tenths: "0.2 s" (or later, on a loaded machine), never "0 s".
    EXPECT_TRUE(std::regex_search(what, std::regex("has waited [0-9]\\.[0-9] s for its peer")))
        << what;
  }
}

TEST(nccl_watchdog_concurrency, an_application_communicator_is_reported_never_aborted) {
  std::mutex calls;
  const auto group = group_with_timeout(3000ms);
  nccl_watchdog w({}, /*abort_comms=*/false, group, calls);
  const std::lock_guard call(calls);  // held throughout: the watchdog never needs it
  group->fail("rank 1 failed: a test");
  EXPECT_TRUE(eventually([&] { return found_failure(w); }));
  EXPECT_FALSE(w.aborted());
}

TEST(nccl_watchdog_death, a_call_stuck_inside_nccl_past_the_timeout_ends_the_process) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::mutex calls;
        nccl_watchdog w({}, /*abort_comms=*/true, group_with_timeout(200ms), calls);
        const std::lock_guard call(calls);
        const nccl_watchdog::host_call stuck(w, "a transfer group with other ranks");
        std::this_thread::sleep_for(10s);
      },
      ::testing::ExitedWithCode(1),
      "a transfer group with other ranks.*cannot be aborted safely; ending the process");
}

}  // namespace
}  // namespace poolscope::darray::detail
