// Output options under a launcher: `--json out.%r.json` is the rank's file (%r from the launcher's
// environment, %p the pid), and a bad '%' is refused as the option is parsed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>

#include "output_option.hpp"

namespace {

// Sets an environment variable for the test's length, restoring what was there.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) {
      old_ = old;
      had_ = true;
    }
    ::setenv(name, value, 1);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
  ~scoped_env() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

std::string parse_json_option(const std::string& value) {
  CLI::App app;
  std::string path;
  app.add_option("--json", path)->transform(poolscope::tools::output_path_option());
  const char* argv[] = {"x", "--json", value.c_str()};
  app.parse(3, argv);
  return path;
}

TEST(output_option, expands_rank_and_pid_as_parsed) {
  const scoped_env rank("OMPI_COMM_WORLD_RANK", "3");
  EXPECT_EQ(parse_json_option("out.%r.json"), "out.3.json");
  EXPECT_EQ(parse_json_option("out.%p.json"), "out." + std::to_string(::getpid()) + ".json");
  EXPECT_EQ(parse_json_option("100%%.json"), "100%.json");
  EXPECT_EQ(parse_json_option("-"), "-");
  EXPECT_THROW((void)parse_json_option("out.%x.json"), CLI::ValidationError);
}

}  // namespace
