// expand_path: %p, %r and %% replaced; any other sequence refused, naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "poolscope/error.hpp"
#include "poolscope/path_pattern.hpp"

namespace poolscope {
namespace {

/// Sets or unsets one variable for the scope of the object.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) {
      old_ = old;
      had_ = true;
    }
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~scoped_env() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(path_pattern, pid_rank_and_percent) {
  const scoped_env a("POOLSCOPE_RANK", nullptr);
  const scoped_env b("OMPI_COMM_WORLD_RANK", nullptr);
  const scoped_env c("PMI_RANK", nullptr);
  const scoped_env d("PMIX_RANK", nullptr);
  const scoped_env e("SLURM_PROCID", nullptr);
  const scoped_env f("RANK", "5");
  const std::string pid = std::to_string(::getpid());
  EXPECT_EQ(expand_path("snap-%r-%p.pickle"), "snap-5-" + pid + ".pickle");
  EXPECT_EQ(expand_path("100%%.txt"), "100%.txt");
  EXPECT_EQ(expand_path("plain"), "plain");
  {
    const scoped_env g("OMPI_COMM_WORLD_RANK", "2");  // before RANK in the order
    EXPECT_EQ(expand_path("%r"), "2");
  }
  {
    const scoped_env h("RANK", "not-a-number");
    EXPECT_EQ(process_rank(), 0);
  }
}

TEST(path_pattern, other_sequences_are_refused_naming_them) {
  try {
    (void)expand_path("out-%d.json");
    FAIL() << "accepted %d";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'%d'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("out-%d.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)expand_path("trailing%"), invalid_argument);
}

}  // namespace
}  // namespace poolscope
