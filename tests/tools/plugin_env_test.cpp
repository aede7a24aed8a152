// The plug-in's POOLSCOPE_RECORD and POOLSCOPE_PROFILE: a child process loads the plug-in with
// them set, allocates, and exits normally; the parent reads the event log and the line profile.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#ifdef POOLSCOPE_ALLOC_PLUGIN_PATH

namespace {

/// What a child process does: the plug-in's environment, where its stderr goes, its workload.
struct child_setup {
  std::string record;       ///< POOLSCOPE_RECORD
  std::string profile;      ///< POOLSCOPE_PROFILE (empty: unset)
  std::string stderr_path;  ///< the child's stderr goes there (empty: inherited)
  int pairs = 0;            ///< malloc/free pairs of `bytes` on device key 7
  long bytes = 0;
  /// Then a block of late_bytes, freed by an exit handler that runs after the plug-in's.
  bool late_free = false;
};

using plugin_malloc_fn = void* (*)(ssize_t, int, void*);
using plugin_free_fn = void (*)(void*, ssize_t, int, void*);
plugin_free_fn g_free = nullptr;
void* g_late_block = nullptr;
constexpr long late_bytes = 5000;

void free_late_block() {
  g_free(g_late_block, late_bytes, 7, nullptr);
}

/// In the child: load the plug-in, run the workload, write "workload done" to stderr, and exit
/// normally (which runs the plug-in's exit handler).
[[noreturn]] void child_main(const child_setup& s) {
  if (!s.stderr_path.empty() && std::freopen(s.stderr_path.c_str(), "w", stderr) == nullptr) {
    std::_Exit(13);
  }
  ::setenv("POOLSCOPE_RESOURCE", "host", 1);
  ::setenv("POOLSCOPE_ALLOCATOR", "best_fit", 1);
  ::setenv("POOLSCOPE_RECORD", s.record.c_str(), 1);
  if (s.profile.empty()) {
    ::unsetenv("POOLSCOPE_PROFILE");
  } else {
    ::setenv("POOLSCOPE_PROFILE", s.profile.c_str(), 1);
  }
  ::setenv("POOLSCOPE_LOG", "warn", 1);
  // A copy of the plug-in, so that the child gets a fresh one: the forked test process may have
  // loaded (and initialized) it already, and dlopen of the same file would return that instance,
  // whose environment was read before this child set its own (the tests failed when another
  // plug-in test ran first in the same process: --gtest_shuffle, --gtest_repeat).
  std::error_code ec;
  const auto copy = std::filesystem::temp_directory_path() /
                    ("poolscope_alloc_child_" + std::to_string(::getpid()) + ".so");
  if (!std::filesystem::copy_file(POOLSCOPE_ALLOC_PLUGIN_PATH, copy,
                                  std::filesystem::copy_options::overwrite_existing, ec)) {
    std::_Exit(15);
  }
  void* h = ::dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::filesystem::remove(copy, ec);  // the mapping stays
  if (h == nullptr) {
    std::_Exit(10);
  }
  auto m = reinterpret_cast<plugin_malloc_fn>(::dlsym(h, "poolscope_malloc"));
  g_free = reinterpret_cast<plugin_free_fn>(::dlsym(h, "poolscope_free"));
  if (m == nullptr || g_free == nullptr) {
    std::_Exit(11);
  }
  // Registered before the plug-in's first use registers its own handler: runs after it.
  if (s.late_free && std::atexit(free_late_block) != 0) {
    std::_Exit(14);
  }
  for (int i = 0; i < s.pairs; ++i) {
    void* p = m(s.bytes, 7, nullptr);
    if (p == nullptr) {
      std::_Exit(12);
    }
    g_free(p, s.bytes, 7, nullptr);
  }
  if (s.late_free && (g_late_block = m(late_bytes, 7, nullptr)) == nullptr) {
    std::_Exit(12);
  }
  std::fputs("workload done\n", stderr);
  std::fflush(stderr);
  std::exit(0);
}

/// Runs child_main(s) in a child process; its exit status (100 + signal if killed).
int run_child(const child_setup& s) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    child_main(s);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::filesystem::path fresh_dir(const char* stem) {
  const auto dir = std::filesystem::temp_directory_path() /
                   (std::string(stem) + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// The event log at `path` (docs/event_log.md): its header, its records (the lines with an
/// "action"), the count of other lines, and the first line that is not a JSON object.
struct event_log_lines {
  bool opened = false;
  nlohmann::json header;
  std::vector<nlohmann::json> records;
  int others = 0;        ///< lines after the header without an "action"
  std::string bad_line;  ///< empty when every line is a JSON object
  [[nodiscard]] int count(const char* action) const {
    return static_cast<int>(std::count_if(
        records.begin(), records.end(), [action](const auto& j) { return j["action"] == action; }));
  }
};

event_log_lines read_event_log(const std::string& path) {
  event_log_lines out;
  std::ifstream in(path);
  out.opened = in.good();
  std::string line;
  for (bool first = true; std::getline(in, line); first = false) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      if (out.bad_line.empty()) {
        out.bad_line = line;
      }
    } else if (first) {
      out.header = std::move(j);
    } else if (j.contains("action")) {
      out.records.push_back(std::move(j));
    } else {
      ++out.others;
    }
  }
  return out;
}

TEST(plugin_env, record_and_profile_files_are_written_at_exit) {
  const auto dir = fresh_dir("poolscope_plugin_env");
  const std::string record = (dir / "events.jsonl").string();
  const std::string profile = (dir / "profile.json").string();
  constexpr int pairs = 5;
  constexpr long bytes = 3000;  // best_fit rounds to 3072
  ASSERT_EQ(run_child({.record = record,
                       .profile = profile,
                       .stderr_path = "",
                       .pairs = pairs,
                       .bytes = bytes,
                       .late_free = false}),
            0);

  // The event log: every line is JSON; the pool mallocs and frees are all there.
  const auto log = read_event_log(record);
  ASSERT_TRUE(log.opened) << record;
  EXPECT_EQ(log.bad_line, "");
  EXPECT_EQ(log.count("malloc"), pairs);
  EXPECT_EQ(log.count("free"), pairs);

  // The line profile: a report in the documented format, with every malloc's bytes counted.
  std::ifstream in(profile);
  ASSERT_TRUE(in.good()) << profile;
  const auto report = nlohmann::json::parse(in);
  EXPECT_EQ(report.value("format", ""), "poolscope.line_profile");
  EXPECT_NE(report.dump().find(std::to_string(pairs * bytes)), std::string::npos)
      << "total used bytes " << pairs * bytes << " not found in " << report.dump();
  // Each stack starts at the caller of poolscope_malloc (this test's child), not inside the
  // plug-in: its frames are poolscope's own and dropped like those of the libraries it links.
  std::vector<const nlohmann::json*> leaves;  // the nodes the mallocs were counted at
  std::vector<const nlohmann::json*> todo{&report["root"]};
  while (!todo.empty()) {
    const nlohmann::json* n = todo.back();
    todo.pop_back();
    if ((*n)["self"].value("count", 0) > 0) {
      leaves.push_back(n);
    }
    if (n->contains("children")) {
      for (const auto& c : (*n)["children"]) {
        todo.push_back(&c);
      }
    }
  }
  // The child is a fork of this program: its caller's frame is in this executable (named by
  // module with or without libdw; the file and line only with it).
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  ASSERT_FALSE(leaves.empty()) << report.dump();
  for (const nlohmann::json* n : leaves) {
    EXPECT_EQ(n->value("function", "").find("poolscope_"), std::string::npos) << n->dump();
    EXPECT_EQ(n->value("module", ""), self) << n->dump();
  }
  std::filesystem::remove_all(dir);
}

// POOLSCOPE_PROFILE naming the file POOLSCOPE_RECORD writes: the profile, written at exit,
// used to overwrite the whole event log. The profile is refused (one error line naming both),
// and the event log stays complete.
TEST(plugin_env, profile_on_the_record_file_is_refused_and_the_event_log_kept) {
  const auto dir = fresh_dir("poolscope_plugin_env_same");
  const std::string record = (dir / "events.jsonl").string();
  const std::string err = (dir / "stderr.txt").string();
  constexpr int pairs = 4;
  constexpr long bytes = 2000;
  ASSERT_EQ(run_child({.record = record,
                       .profile = record,
                       .stderr_path = err,
                       .pairs = pairs,
                       .bytes = bytes,
                       .late_free = false}),
            0);

  const auto log = read_event_log(record);
  ASSERT_TRUE(log.opened) << record;
  EXPECT_EQ(log.bad_line, "");
  EXPECT_EQ(log.header.value("format", ""), "poolscope.events") << log.header.dump();
  EXPECT_EQ(log.others, 0);
  EXPECT_EQ(log.count("malloc"), pairs);
  EXPECT_EQ(log.count("free"), pairs);

  const std::string text = slurp(err);
  const auto refused = text.find("POOLSCOPE_PROFILE ignored");
  ASSERT_NE(refused, std::string::npos) << text;
  EXPECT_NE(text.find("POOLSCOPE_RECORD", refused), std::string::npos) << text;
  EXPECT_LT(refused, text.find("workload done")) << "refused at first use, not at exit:\n" << text;
  std::filesystem::remove_all(dir);
}

// An unwritable POOLSCOPE_PROFILE used to be found out only at exit, after the whole run had
// been profiled for nothing. It is now refused at the first use, naming the path and the
// reason, and nothing more is said at exit.
TEST(plugin_env, unwritable_profile_path_is_refused_at_first_use) {
  const auto dir = fresh_dir("poolscope_plugin_env_unwritable");
  const std::string record = (dir / "events.jsonl").string();
  const std::string profile = (dir / "no_such_dir" / "profile.json").string();
  const std::string err = (dir / "stderr.txt").string();
  ASSERT_EQ(run_child({.record = record,
                       .profile = profile,
                       .stderr_path = err,
                       .pairs = 3,
                       .bytes = 1000,
                       .late_free = false}),
            0);
  const std::string text = slurp(err);
  const auto refused = text.find("POOLSCOPE_PROFILE ignored: '" + profile + "'");
  ASSERT_NE(refused, std::string::npos) << text;
  EXPECT_NE(text.find("No such file or directory", refused), std::string::npos) << text;
  const auto done = text.find("workload done");
  ASSERT_NE(done, std::string::npos) << text;
  EXPECT_LT(refused, done) << text;
  EXPECT_EQ(text.find("[poolscope", done), std::string::npos) << "nothing more to say at exit:\n"
                                                              << text;
  EXPECT_FALSE(std::filesystem::exists(profile));
  // The event log is unaffected.
  EXPECT_NE(slurp(record).find("\"action\":\"malloc\""), std::string::npos);
  std::filesystem::remove_all(dir);
}

// Frees that come after the plug-in's exit handler (PyTorch's static destructors, exit handlers
// registered before the plug-in's first use) used to stay in the recorder's buffer and never
// reach the file: the log showed blocks never freed. The child registers its exit handler before
// the first poolscope_malloc, so it runs after the plug-in's, and frees a block there.
TEST(plugin_env, frees_after_the_exit_handler_reach_the_event_log) {
  const auto dir = fresh_dir("poolscope_plugin_env_late");
  const std::string record = (dir / "events.jsonl").string();
  constexpr int pairs = 3;
  constexpr long bytes = 1000;
  ASSERT_EQ(run_child({.record = record,
                       .profile = "",
                       .stderr_path = "",
                       .pairs = pairs,
                       .bytes = bytes,
                       .late_free = true}),
            0);

  const auto log = read_event_log(record);
  ASSERT_TRUE(log.opened) << record;
  EXPECT_EQ(log.bad_line, "");
  std::string late_ptr;
  bool late_freed = false;
  for (const auto& j : log.records) {
    if (j["action"] == "malloc" && j["size"] == late_bytes) {
      late_ptr = j["ptr"].get<std::string>();
    } else if (j["action"] == "free") {
      late_freed = late_freed || (!late_ptr.empty() && j["ptr"] == late_ptr);
    }
  }
  const int mallocs = log.count("malloc");
  const int frees = log.count("free");
  EXPECT_EQ(mallocs, pairs + 1);
  EXPECT_EQ(frees, pairs + 1);
  EXPECT_FALSE(late_ptr.empty()) << "the late block's malloc is missing";
  EXPECT_TRUE(late_freed) << "the free made after the plug-in's exit handler is missing:\n"
                          << slurp(record);
  std::filesystem::remove_all(dir);
}

}  // namespace

#endif  // POOLSCOPE_ALLOC_PLUGIN_PATH
