// The plug-in's POOLSCOPE_SNAPSHOT and poolscope_snapshot(): a child process loads the plug-in
// (host resource, each strategy), snapshots mid-run and exits; the files hold what the child
// held then, and load as PyTorch's do (scripts/snapshot_check.py). And Python frames: python3
// loads the plug-in through ctypes and allocates from a known line; the line profile and the
// snapshot show that file and line.
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

#include "poolscope/pool/factory.hpp"
#include "subprocess.hpp"

#if defined(POOLSCOPE_ALLOC_PLUGIN_PATH) && defined(POOLSCOPE_TEST_REPLAY_CLI)

#include "poolscope/analysis/memory_snapshot_reader.hpp"

namespace {

using poolscope::profiler::block_state;
using poolscope::profiler::memory_snapshot;

std::filesystem::path fresh_dir(const std::string& stem) {
  const auto dir =
      std::filesystem::temp_directory_path() / (stem + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

using malloc_fn = void* (*)(ssize_t, int, void*);
using free_fn = void (*)(void*, ssize_t, int, void*);
using snapshot_fn = int (*)(const char*);

/// In the child: the plug-in (a fresh copy) with POOLSCOPE_SNAPSHOT=`pattern`; 8 blocks, a
/// snapshot to `mid` with all 8 live, 5 freed, exit (the exit snapshot holds 3).
[[noreturn]] void child_main(const std::string& strategy, const std::string& pattern,
                             const std::string& mid) {
  ::setenv("POOLSCOPE_RESOURCE", "host", 1);
  ::setenv("POOLSCOPE_ALLOCATOR", strategy.c_str(), 1);
  ::setenv("POOLSCOPE_SNAPSHOT", pattern.c_str(), 1);
  ::unsetenv("POOLSCOPE_RECORD");
  ::unsetenv("POOLSCOPE_PROFILE");
  std::error_code ec;
  const auto copy = std::filesystem::temp_directory_path() /
                    ("poolscope_alloc_snap_" + std::to_string(::getpid()) + ".so");
  if (!std::filesystem::copy_file(POOLSCOPE_ALLOC_PLUGIN_PATH, copy,
                                  std::filesystem::copy_options::overwrite_existing, ec)) {
    std::_Exit(15);
  }
  void* h = ::dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::filesystem::remove(copy, ec);
  if (h == nullptr) {
    std::_Exit(10);
  }
  auto m = reinterpret_cast<malloc_fn>(::dlsym(h, "poolscope_malloc"));
  auto f = reinterpret_cast<free_fn>(::dlsym(h, "poolscope_free"));
  auto snap = reinterpret_cast<snapshot_fn>(::dlsym(h, "poolscope_snapshot"));
  if (m == nullptr || f == nullptr || snap == nullptr) {
    std::_Exit(11);
  }
  std::vector<void*> blocks;
  for (long i = 0; i < 8; ++i) {
    blocks.push_back(m(1000 * (i + 1), 0, nullptr));
  }
  if (snap(mid.c_str()) != 0) {
    std::_Exit(12);
  }
  for (long i = 0; i < 5; ++i) {
    f(blocks[static_cast<std::size_t>(i)], 1000 * (i + 1), 0, nullptr);
  }
  std::exit(0);
}

std::size_t active_blocks(const memory_snapshot& s) {
  std::size_t n = 0;
  for (const auto& seg : s.segments) {
    for (const auto& b : seg.blocks) {
      n += b.state == block_state::active_allocated ? 1 : 0;
    }
  }
  return n;
}

bool have_python3() {
  return std::system("python3 -c 'import pickle' >/dev/null 2>&1") == 0;
}

TEST(plugin_snapshot, written_on_request_and_at_exit_by_every_strategy) {
  for (const std::string& strategy : poolscope::pool::allocator_names()) {
    SCOPED_TRACE(strategy);
    const auto dir = fresh_dir("poolscope_plugin_snapshot_" + strategy);
    const std::string mid = (dir / "mid-%p.pickle").string();
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      child_main(strategy, (dir / "exit-r%r.pickle").string(), mid);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    const std::string mid_path = (dir / ("mid-" + std::to_string(pid) + ".pickle")).string();
    const std::string exit_path = (dir / "exit-r0.pickle").string();
    const memory_snapshot at_mid = poolscope::analysis::read_memory_snapshot(mid_path);
    const memory_snapshot at_exit = poolscope::analysis::read_memory_snapshot(exit_path);
    EXPECT_EQ(active_blocks(at_mid), 8U);
    EXPECT_EQ(active_blocks(at_exit), 3U);
    std::size_t allocs = 0;
    for (const auto& e : at_exit.device_traces.at(0)) {
      allocs += e.action == poolscope::profiler::trace_action::alloc ? 1 : 0;
    }
    EXPECT_EQ(allocs, 8U);
    if (have_python3()) {
      const auto r = poolscope::testing::run_process(
          {"/bin/sh", "-c",
           "python3 " + std::string(POOLSCOPE_SOURCE_DIR) + "/scripts/snapshot_check.py " +
               mid_path + " " + exit_path + " --reference " + POOLSCOPE_SOURCE_DIR +
               "/tests/data/torch_snapshot_varlen.pickle"});
      EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    }
    std::filesystem::remove_all(dir);
  }
}

// Line 8 of this script allocates; the stacks must show it. Forty allocations in all, a kept
// block per model step: the first captures read the frames through the interpreter's C API and
// check the direct reader against it (python_seam.hpp), the later ones read them directly. A
// generator's frame is on the stack of the later ones.
constexpr const char* python_script = R"(import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.poolscope_malloc.restype = ctypes.c_void_p
lib.poolscope_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.poolscope_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

def allocate_weights(n):
    return lib.poolscope_malloc(n, 0, None)

def model_step():
    return [allocate_weights(1 << 20) for _ in range(4)]

def steps(n):
    for _ in range(n):
        yield model_step()

kept = []
for blocks in steps(10):
    kept.append(blocks[0])
    for b in blocks[1:]:
        lib.poolscope_free(b, 1 << 20, 0, None)
)";

/// Why python3 cannot run the plug-in here, or nullptr when it can.
const char* python_plugin_unusable() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return "python3 cannot load a plug-in built with a sanitizer unless its runtime is preloaded";
#else
  return have_python3() ? nullptr : "python3 is not here";
#endif
}

/// The interpreters the Python frames are checked with: python3, and those named in
/// POOLSCOPE_TEST_PYTHONS (colon-separated paths: other CPython versions, each read its own way).
std::vector<std::string> pythons() {
  std::vector<std::string> out{"python3"};
  if (const char* more = std::getenv("POOLSCOPE_TEST_PYTHONS"); more != nullptr) {
    std::string list = more;
    for (std::size_t at = 0; at <= list.size();) {
      const std::size_t end = std::min(list.find(':', at), list.size());
      if (end > at) {
        out.push_back(list.substr(at, end - at));
      }
      at = end + 1;
    }
  }
  return out;
}

/// Runs the script under `python` with the plug-in profiling and snapshotting; checks both.
void check_python_frames(const std::string& python) {
  const auto dir = fresh_dir("poolscope_plugin_python");
  const std::string script = (dir / "workload.py").string();
  std::ofstream(script) << python_script;
  const std::string profile = (dir / "profile.json").string();
  const std::string snapshot = (dir / "snap.pickle").string();
  const auto r = poolscope::testing::run_process(
      {"/bin/sh", "-c", "exec " + python + " " + script + " " + POOLSCOPE_ALLOC_PLUGIN_PATH},
      {{"POOLSCOPE_RESOURCE", "host"},
       {"POOLSCOPE_PROFILE", profile},
       {"POOLSCOPE_SNAPSHOT", snapshot}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  // The line profile: allocate_weights at workload.py:8 holding the 40 MiB.
  std::ifstream in(profile);
  const nlohmann::json p = nlohmann::json::parse(in);
  std::vector<const nlohmann::json*> todo{&p["root"]};
  std::uint64_t used = 0;
  while (!todo.empty()) {
    const nlohmann::json* n = todo.back();
    todo.pop_back();
    if (n->value("function", "") == "allocate_weights" && n->value("file", "") == script) {
      EXPECT_EQ((*n)["line"], 8);
      used += (*n)["total"]["used"].get<std::uint64_t>();
    }
    for (const auto& c : (*n)["children"]) {
      todo.push_back(&c);
    }
  }
  EXPECT_EQ(used, std::uint64_t{40} << 20) << p.dump(1).substr(0, 4000);

  // The snapshot: every alloc entry's innermost Python frame is that line, under model_step.
  const memory_snapshot s = poolscope::analysis::read_memory_snapshot(snapshot);
  std::size_t allocs = 0;
  for (const auto& e : s.device_traces.at(0)) {
    if (e.action != poolscope::profiler::trace_action::alloc) {
      continue;
    }
    ++allocs;
    const auto& frames = s.stacks.at(e.stack);
    const auto at = std::find_if(frames.begin(), frames.end(),
                                 [&](const auto& f) { return f.filename == script; });
    ASSERT_NE(at, frames.end());
    EXPECT_EQ(at->name, "allocate_weights");
    EXPECT_EQ(at->line, 8);
    for (const char* caller : {"model_step", "steps", "<module>"}) {
      EXPECT_NE(std::find_if(at, frames.end(), [&](const auto& f) { return f.name == caller; }),
                frames.end())
          << caller;
    }
  }
  EXPECT_EQ(allocs, 40U);
  std::filesystem::remove_all(dir);
}

TEST(plugin_python_frames, the_python_line_that_allocates_is_in_the_profile_and_the_snapshot) {
  if (const char* why = python_plugin_unusable(); why != nullptr) {
    GTEST_SKIP() << why;
  }
  for (const std::string& python : pythons()) {
    SCOPED_TRACE(python);
    check_python_frames(python);
  }
}

// POOLSCOPE_SNAPSHOT_STACKS: "python" keeps the Python frames alone (the innermost is the line
// that allocates, every frame the script's); "all", the default, and a refused value keep the
// native frames above the interpreter's too.
TEST(plugin_python_frames, snapshot_stacks_python_keeps_the_python_frames_alone) {
  if (const char* why = python_plugin_unusable(); why != nullptr) {
    GTEST_SKIP() << why;
  }
  const auto dir = fresh_dir("poolscope_plugin_snapshot_stacks");
  const std::string script = (dir / "workload.py").string();
  std::ofstream(script) << python_script;
  for (const std::string mode : {"python", "all", "bogus"}) {
    SCOPED_TRACE(mode);
    const std::string snapshot = (dir / ("snap-" + mode + ".pickle")).string();
    const auto r = poolscope::testing::run_process(
        {"/bin/sh", "-c", "exec python3 " + script + " " + POOLSCOPE_ALLOC_PLUGIN_PATH},
        {{"POOLSCOPE_RESOURCE", "host"},
         {"POOLSCOPE_SNAPSHOT", snapshot},
         {"POOLSCOPE_SNAPSHOT_STACKS", mode}});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(r.err.find("POOLSCOPE_SNAPSHOT_STACKS 'bogus'") != std::string::npos, mode == "bogus")
        << r.err;
    const memory_snapshot s = poolscope::analysis::read_memory_snapshot(snapshot);
    std::size_t allocs = 0;
    std::size_t native = 0;  // frames of no Python file
    for (const auto& e : s.device_traces.at(0)) {
      if (e.action != poolscope::profiler::trace_action::alloc) {
        continue;
      }
      ++allocs;
      const auto& frames = s.stacks.at(e.stack);
      ASSERT_FALSE(frames.empty());
      for (const auto& f : frames) {
        native += f.filename == script ? 0 : 1;
      }
      if (mode == "python") {
        EXPECT_EQ(frames.front().name, "allocate_weights");
        EXPECT_EQ(frames.front().line, 8);
        EXPECT_EQ(frames.back().name, "<module>");
      }
    }
    EXPECT_EQ(allocs, 40U);
    if (mode == "python") {
      EXPECT_EQ(native, 0U);
    } else {
      EXPECT_GE(native, allocs);  // each stack has native frames above the interpreter's
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

#endif
