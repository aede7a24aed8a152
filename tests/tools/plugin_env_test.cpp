// The plug-in's POOLSCOPE_RECORD and POOLSCOPE_PROFILE: a child process loads the plug-in with
// them set, allocates, and exits normally; the parent reads the event log and the line profile.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#ifdef POOLSCOPE_ALLOC_PLUGIN_PATH

namespace {

/// In the child: load the plug-in, make `pairs` malloc/free pairs of `bytes` on device key 7.
[[noreturn]] void child_workload(int pairs, long bytes) {
  void* h = ::dlopen(POOLSCOPE_ALLOC_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    std::_Exit(10);
  }
  using malloc_fn = void* (*)(ssize_t, int, void*);
  using free_fn = void (*)(void*, ssize_t, int, void*);
  auto m = reinterpret_cast<malloc_fn>(::dlsym(h, "poolscope_malloc"));
  auto f = reinterpret_cast<free_fn>(::dlsym(h, "poolscope_free"));
  if (m == nullptr || f == nullptr) {
    std::_Exit(11);
  }
  for (int i = 0; i < pairs; ++i) {
    void* p = m(bytes, 7, nullptr);
    if (p == nullptr) {
      std::_Exit(12);
    }
    f(p, bytes, 7, nullptr);
  }
  std::exit(0);  // runs the plug-in's exit handler
}

int run_child(const std::string& record, const std::string& profile, int pairs, long bytes) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("POOLSCOPE_RESOURCE", "host", 1);
    ::setenv("POOLSCOPE_ALLOCATOR", "best_fit", 1);
    ::setenv("POOLSCOPE_RECORD", record.c_str(), 1);
    ::setenv("POOLSCOPE_PROFILE", profile.c_str(), 1);
    child_workload(pairs, bytes);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

TEST(plugin_env, record_and_profile_files_are_written_at_exit) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("poolscope_plugin_env_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string record = (dir / "events.jsonl").string();
  const std::string profile = (dir / "profile.json").string();
  constexpr int pairs = 5;
  constexpr long bytes = 3000;  // best_fit rounds to 3072
  ASSERT_EQ(run_child(record, profile, pairs, bytes), 0);

  // The event log: every line is JSON; the pool mallocs and frees are all there.
  std::ifstream log(record);
  ASSERT_TRUE(log.good()) << record;
  int mallocs = 0;
  int frees = 0;
  std::string line;
  while (std::getline(log, line)) {
    const auto j = nlohmann::json::parse(line);  // throws (fails the test) on a bad line
    if (j.contains("action")) {
      const auto action = j["action"].get<std::string>();
      mallocs += action == "malloc" ? 1 : 0;
      frees += action == "free" ? 1 : 0;
    }
  }
  EXPECT_EQ(mallocs, pairs);
  EXPECT_EQ(frees, pairs);

  // The line profile: a report in the documented format, with every malloc's bytes counted.
  std::ifstream in(profile);
  ASSERT_TRUE(in.good()) << profile;
  const auto report = nlohmann::json::parse(in);
  EXPECT_EQ(report.value("format", ""), "poolscope.line_profile");
  EXPECT_NE(report.dump().find(std::to_string(pairs * bytes)), std::string::npos)
      << "total used bytes " << pairs * bytes << " not found in " << report.dump();
  std::filesystem::remove_all(dir);
}

}  // namespace

#endif  // POOLSCOPE_ALLOC_PLUGIN_PATH
