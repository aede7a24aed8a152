// rank_binding (darray/src/rank_binding.hpp): a rank bound to one CPU that moves GPU data between
// ranks by MPI is warned (naming the mask and the launcher's ways out), any other is not; the mask
// is read from the system as /proc says it.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "rank_binding.hpp"

namespace poolscope::darray::detail {
namespace {

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(rank_binding, cpu_lists_join_runs) {
  EXPECT_EQ(cpu_list_text({}), "");
  EXPECT_EQ(cpu_list_text({3}), "3");
  EXPECT_EQ(cpu_list_text({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(cpu_list_text({1, 3, 5}), "1,3,5");
  EXPECT_EQ(cpu_list_text({0, 1, 5, 6, 7, 9, 10}), "0-1,5-7,9-10");
}

TEST(rank_binding, one_cpu_by_mpi_is_warned) {
  const std::string w = binding_warning({5}, rank_transport::mpi);
  EXPECT_TRUE(has(w, "CPU 5 only")) << w;
  EXPECT_TRUE(has(w, "--bind-to none")) << w;
  EXPECT_TRUE(has(w, "--map-by slot:PE=2 --bind-to core")) << w;
  EXPECT_TRUE(has(w, "--between-ranks mpi")) << w;
}

TEST(rank_binding, anything_else_is_not) {
  EXPECT_EQ(binding_warning({5}, rank_transport::nccl), "");
  EXPECT_EQ(binding_warning({4, 5}, rank_transport::mpi), "");
  EXPECT_EQ(binding_warning({0, 7}, rank_transport::mpi), "");
  EXPECT_EQ(binding_warning({}, rank_transport::mpi), "");  // the mask is unknown
}

TEST(rank_binding, the_mask_is_the_systems) {
  // This is the main thread (gtest runs tests there), whose mask /proc/self/status gives.
  std::ifstream status("/proc/self/status");
  std::string line;
  std::string listed;
  while (std::getline(status, line)) {
    if (line.rfind("Cpus_allowed_list:", 0) == 0) {
      listed = line.substr(line.find_first_not_of(" \t", line.find(':') + 1));
    }
  }
  if (listed.empty()) {
    GTEST_SKIP() << "no Cpus_allowed_list in /proc/self/status";
  }
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_EQ(cpu_list_text(cpus), listed);
}

}  // namespace
}  // namespace poolscope::darray::detail
