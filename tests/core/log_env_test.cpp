// POOLSCOPE_LOG, read once per process at the first log call: each case runs this test program
// again as a child (a fresh process, so the threshold is read from its environment) and reads
// the level the child reports and what it wrote to stderr.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "poolscope/log.hpp"
#include "tools/subprocess.hpp"

namespace {

constexpr const char* child_flag = "POOLSCOPE_LOG_TEST_CHILD";

/// The child's side: prints the threshold it read from POOLSCOPE_LOG as "level=N".
TEST(log_env_child, prints_the_threshold) {
  if (std::getenv(child_flag) == nullptr) {
    GTEST_SKIP() << "run as a child process by the log_env tests";
  }
  std::printf("level=%d\n", static_cast<int>(poolscope::get_log_level()));
  std::fflush(stdout);
}

struct child_result {
  int level = -1;
  std::string err;
};

child_result run_with(const std::string& value) {
  const auto r = poolscope::testing::run_process(
      {"/proc/self/exe", "--gtest_filter=log_env_child.prints_the_threshold"},
      {{"POOLSCOPE_LOG", value}, {child_flag, "1"}});
  child_result c;
  c.err = r.err;
  const auto at = r.out.find("level=");
  if (r.exit_code == 0 && at != std::string::npos) {
    c.level = std::stoi(r.out.substr(at + 6));
  }
  return c;
}

TEST(log_env, every_documented_name_sets_its_level_in_any_case) {
  const std::pair<const char*, poolscope::log_level> cases[] = {
      {"off", poolscope::log_level::off},     {"error", poolscope::log_level::error},
      {"warn", poolscope::log_level::warn},   {"info", poolscope::log_level::info},
      {"debug", poolscope::log_level::debug}, {"OFF", poolscope::log_level::off},
      {"Error", poolscope::log_level::error}, {"DEBUG", poolscope::log_level::debug},
  };
  for (const auto& [value, level] : cases) {
    const auto c = run_with(value);
    EXPECT_EQ(c.level, static_cast<int>(level)) << "POOLSCOPE_LOG=" << value << "\n" << c.err;
    EXPECT_EQ(c.err.find("POOLSCOPE_LOG"), std::string::npos) << value << ": " << c.err;
  }
}

// An unrecognised value is not taken silently: POOLSCOPE_LOG=none (meant to silence poolscope)
// would change nothing and say nothing. It means warn, and says so once, naming the value.
TEST(log_env, an_unknown_value_is_reported_naming_it) {
  for (const char* value : {"none", "2", "errors"}) {
    const auto c = run_with(value);
    EXPECT_EQ(c.level, static_cast<int>(poolscope::log_level::warn)) << value << "\n" << c.err;
    const std::string expected = "POOLSCOPE_LOG='" + std::string(value) + "'";
    const auto at = c.err.find(expected);
    ASSERT_NE(at, std::string::npos) << value << ": " << c.err;
    EXPECT_NE(c.err.find("off|error|warn|info|debug", at), std::string::npos) << c.err;
    EXPECT_EQ(c.err.find(expected, at + 1), std::string::npos) << "reported once: " << c.err;
  }
}

}  // namespace
