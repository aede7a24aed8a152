// Output paths of the ranks of a launch: %r is the launcher's rank, %p the pid, %% a '%'; a bad
// escape is a typed error naming it; per_rank_path puts ".rank<r>" before the extension.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "poolscope/error.hpp"
#include "poolscope/profiler/output_path.hpp"

namespace {

using poolscope::profiler::expand_output_path;
using poolscope::profiler::launcher_rank;
using poolscope::profiler::per_rank_path;

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class scoped_env {
 public:
  scoped_env(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
    }
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
  ~scoped_env() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(output_path, rank_and_pid_are_expanded) {
  const scoped_env ompi("OMPI_COMM_WORLD_RANK", "3");
  const scoped_env pmi("PMI_RANK", "7");  // Open MPI's variable comes first
  EXPECT_EQ(launcher_rank(), 3);
  EXPECT_EQ(expand_output_path("t.%r.json"), "t.3.json");
  EXPECT_EQ(expand_output_path("run-%p/%r%%"), "run-" + std::to_string(::getpid()) + "/3%");
  EXPECT_EQ(expand_output_path("plain.json"), "plain.json");
}

TEST(output_path, without_a_launcher_the_rank_is_0) {
  const scoped_env a("OMPI_COMM_WORLD_RANK", std::nullopt);
  const scoped_env b("PMI_RANK", std::nullopt);
  const scoped_env c("SLURM_PROCID", std::nullopt);
  const scoped_env d("RANK", std::nullopt);
  EXPECT_EQ(launcher_rank(), std::nullopt);
  EXPECT_EQ(expand_output_path("t.%r.json"), "t.0.json");
  const scoped_env slurm("SLURM_PROCID", "12");
  EXPECT_EQ(launcher_rank(), 12);
  const scoped_env bad("SLURM_PROCID", "x1");  // not a number: no rank
  EXPECT_EQ(launcher_rank(), std::nullopt);
}

TEST(output_path, a_bad_escape_is_named) {
  try {
    (void)expand_output_path("t.%q.json");
    ADD_FAILURE() << "%q was taken";
  } catch (const poolscope::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'%q' at 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)expand_output_path("t%"), poolscope::invalid_argument);
}

TEST(output_path, per_rank_paths_keep_the_extension) {
  EXPECT_EQ(per_rank_path("t.json", 1), "t.rank1.json");
  EXPECT_EQ(per_rank_path("out/t.json.gz", 0), "out/t.rank0.json.gz");
  EXPECT_EQ(per_rank_path("dir.d/trace", 2), "dir.d/trace.rank2");
  EXPECT_EQ(per_rank_path(".trace", 4), ".trace.rank4");
}

}  // namespace
