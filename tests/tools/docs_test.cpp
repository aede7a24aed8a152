// What README.md and the guides say about the code, checked against the code: the names the
// plug-in's POOLSCOPE_RESOURCE accepts, the unwinders a line profile can name, and the profiling
// example's use of function_profiler (whose constructor starts it). The files are read from the
// source tree this test was built from.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "poolscope/pool/factory.hpp"

#ifdef POOLSCOPE_TEST_REPLAY_CLI  // the profiler is linked
#include "poolscope/profiler/line_profiler.hpp"
#endif

namespace {

std::string read_source(const std::string& relative) {
  // The source root comes from the build (a compile definition): __FILE__ may be relative when a
  // compiler cache rewrites paths, and the test runs from the build tree.
  std::ifstream f(std::filesystem::path(POOLSCOPE_SOURCE_DIR) / relative);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The line of `text` that contains `key`; "" if none.
std::string line_with(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(key) != std::string::npos) {
      return line;
    }
  }
  return {};
}

TEST(docs, readme_lists_every_plugin_resource) {
  const std::string readme = read_source("README.md");
  ASSERT_FALSE(readme.empty()) << "README.md not found beside the tests";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(readme, m, std::regex("POOLSCOPE_RESOURCE=([a-z_|]+)")));
  const std::string listed = "|" + m[1].str() + "|";
  for (const std::string& name : poolscope::pool::resource_names()) {
    EXPECT_NE(listed.find("|" + name + "|"), std::string::npos)
        << "README's POOLSCOPE_RESOURCE list lacks '" << name << "': " << m[0];
  }
}

TEST(docs, readme_profiling_example_does_not_start_a_started_profiler) {
  const std::string readme = read_source("README.md");
  const auto section = readme.find("## Profiling");
  ASSERT_NE(section, std::string::npos);
  const auto begin = readme.find("```cpp", section);
  const auto end = readme.find("```", begin + 6);
  ASSERT_NE(begin, std::string::npos);
  const std::string code = readme.substr(begin, end - begin);
  ASSERT_NE(code.find("function_profiler scopes"), std::string::npos) << code;
  // The constructor starts it; start() again before a stop() throws logic_error.
  const auto start = code.find("scopes.start()");
  const auto stop = code.find("scopes.stop()");
  EXPECT_TRUE(start == std::string::npos || (stop != std::string::npos && stop < start)) << code;
}

#ifdef POOLSCOPE_TEST_REPLAY_CLI
TEST(docs, line_profile_schema_lists_the_unwinders_a_profile_names) {
  namespace prof = poolscope::profiler;
  const std::string row = line_with(read_source("docs/line_profile.md"), "| `unwinder` |");
  ASSERT_FALSE(row.empty()) << "no `unwinder` row in docs/line_profile.md";
  for (const auto u : {prof::stack_unwinder::libunwind, prof::stack_unwinder::glibc_backtrace,
                       prof::stack_unwinder::frame_pointer, prof::stack_unwinder::cached_dwarf}) {
    EXPECT_NE(row.find("`" + std::string(prof::to_string(u)) + "`"), std::string::npos)
        << prof::to_string(u) << " missing from: " << row;
  }
  // What a default profiler writes.
  prof::line_profiler lines;
  const std::string written = lines.report().unwinder;
  EXPECT_NE(row.find("`" + written + "`"), std::string::npos) << written << " missing: " << row;
}
#endif

// Every POOLSCOPE_* variable the tree names in a string (what getenv and the tests' env helpers
// read) has a row in README's environment-variable table.
TEST(docs, readme_env_table_has_every_variable_the_tree_reads) {
  namespace fs = std::filesystem;
  const std::string readme = read_source("README.md");
  const auto table = readme.find("## Environment variables");
  ASSERT_NE(table, std::string::npos) << "README has no \"Environment variables\" section";
  const std::string section = readme.substr(table, readme.find("\n## ", table + 1) - table);
  const std::regex name("\"(POOLSCOPE_[A-Z0-9_]+)\"");
  std::set<std::string> names;
  for (const char* dir : {"core", "hooks", "pool", "profiler", "plugin", "darray", "analysis",
                          "tools", "bench", "tests", "python"}) {
    const fs::path root = fs::path(POOLSCOPE_SOURCE_DIR) / dir;
    if (!fs::exists(root)) {
      continue;
    }
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() ||
          (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".cu" && ext != ".py")) {
        continue;
      }
      std::ifstream f(e.path());
      std::stringstream text;
      text << f.rdbuf();
      const std::string body = text.str();
      for (std::sregex_iterator it(body.begin(), body.end(), name), end; it != end; ++it) {
        names.insert((*it)[1].str());
      }
    }
  }
  EXPECT_GE(names.size(), 5U) << "the scan found too few names to be right";
  for (const std::string& n : names) {
    EXPECT_NE(section.find("`" + n + "`"), std::string::npos)
        << n << " is read by the tree but has no row in README's environment-variable table";
  }
}

}  // namespace
