// `poolscope report` of a line profile recorded from a real Python process: python3 loads the
// plug-in through ctypes (host resource) and allocates from known lines, the plug-in writes its
// profile (POOLSCOPE_PROFILE), and the report shows the Python lines with each run of the
// interpreter's own frames (the evaluator, ctypes, libffi) as one node; --full-stacks shows them
// all. Checked against the same report with --full-stacks: every frame accounted for, the figures
// unchanged. (The rule of what counts as an interpreter frame, on profiles built by hand:
// tests/analysis/interpreter_frames_test.cpp.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "subprocess.hpp"

#if defined(POOLSCOPE_ALLOC_PLUGIN_PATH) && defined(POOLSCOPE_TEST_REPLAY_CLI)

#include <CLI/CLI.hpp>

#include "in_process_cli.hpp"

namespace poolscope::tools {
void register_report(CLI::App& app);
}  // namespace poolscope::tools

namespace {

// Line 8 allocates, called from a method through map(): the evaluator runs between the Python
// frames and, below the last one, ctypes and libffi run before the plug-in.
constexpr const char* workload = R"(import ctypes, sys
plugin = ctypes.CDLL(sys.argv[1])
malloc = plugin.poolscope_malloc
malloc.restype = ctypes.c_void_p
malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

def allocate_weights(n):
    return malloc(n, 0, None)

class Model:
    def step(self):
        return list(map(allocate_weights, [1 << 20] * 4))

blocks = Model().step()
)";

std::string report(const std::vector<std::string>& args) {
  std::vector<std::string> all{"report"};
  all.insert(all.end(), args.begin(), args.end());
  return poolscope::testing::run_in_process(all, poolscope::tools::register_report);
}

// The rows of a report's table: the lines after the column names.
std::vector<std::string> rows_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> rows;
  bool table = false;
  for (std::string line; std::getline(in, line);) {
    if (table) {
      rows.push_back(line);
    }
    table = table || line.find("call site (figures include its callees)") != std::string::npos;
  }
  return rows;
}

// The sum of the values of folded stacks.
std::uint64_t folded_sum(const std::string& folded) {
  std::istringstream in(folded);
  std::uint64_t sum = 0;
  for (std::string line; std::getline(in, line);) {
    sum += std::stoull(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

TEST(report_python, interpreter_frames_are_one_node_per_run_unless_asked) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "python3 cannot load a plug-in built with a sanitizer unless its runtime is "
                  "preloaded";
#endif
  if (std::system("python3 -c 'import ctypes' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with ctypes is not here";
  }
  const auto dir = std::filesystem::temp_directory_path() /
                   ("poolscope_report_python_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string script = (dir / "workload.py").string();
  std::ofstream(script) << workload;
  const std::string profile = (dir / "profile.json").string();
  const auto r = poolscope::testing::run_process(
      {"/bin/sh", "-c", "exec python3 " + script + " " + POOLSCOPE_ALLOC_PLUGIN_PATH},
      {{"POOLSCOPE_RESOURCE", "host"}, {"POOLSCOPE_PROFILE", profile}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  const std::vector<std::string> every_node{profile, "--threshold", "0", "--top", "0"};
  const std::string shown = report(every_node);
  std::vector<std::string> full_args = every_node;
  full_args.push_back("--full-stacks");
  const std::string full = report(full_args);

  // The recorded stacks hold the interpreter's frames (the fixture is what it should be), and the
  // default report shows none of them by name.
  for (const char* name : {"_PyEval_EvalFrameDefault", "ffi_call"}) {
    EXPECT_NE(full.find(name), std::string::npos) << name << " not recorded:\n" << full;
    EXPECT_EQ(shown.find(name), std::string::npos) << name << " shown:\n" << shown;
  }
  EXPECT_NE(shown.find(" interpreter frames"), std::string::npos) << shown;
  // The user's Python lines are there in both.
  for (const std::string& text : {shown, full}) {
    EXPECT_NE(text.find("allocate_weights (workload.py:8)"), std::string::npos) << text;
    EXPECT_NE(text.find("step (workload.py:12)"), std::string::npos) << text;
  }

  // Every frame accounted for: the header's "N Python interpreter frames shown as M nodes", and
  // with every node a row, the full report has N - M rows more.
  std::smatch counts;
  ASSERT_TRUE(std::regex_search(
      shown, counts, std::regex(R"((\d+) Python interpreter frames shown as (\d+) node)")))
      << shown;
  const std::size_t n = std::stoul(counts[1].str());
  const std::size_t m = std::stoul(counts[2].str());
  EXPECT_GE(n, 2 * m) << "runs of at least two frames on average:\n" << shown;
  EXPECT_EQ(rows_of(full).size() - rows_of(shown).size(), n - m) << shown << "\n" << full;
  EXPECT_EQ(full.find("Python interpreter frames shown as"), std::string::npos) << full;
  // The figures are unchanged: the root's row, and every folded stack's bytes summed.
  ASSERT_FALSE(rows_of(shown).empty());
  EXPECT_EQ(rows_of(shown).front(), rows_of(full).front());
  for (const char* metric : {"used", "acquired", "count"}) {
    EXPECT_EQ(folded_sum(report({profile, "--folded", "--metric", metric})),
              folded_sum(report({profile, "--folded", "--metric", metric, "--full-stacks"})))
        << metric;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

#endif
