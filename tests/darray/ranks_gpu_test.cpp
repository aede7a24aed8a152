// DistributedArrays over GPUs of several ranks (one GPU per rank, NCCL between them, or on a
// machine of one GPU each rank a host of its own to NCCL by NCCL_HOSTID; or with
// POOLSCOPE_TEST_BETWEEN_RANKS=mpi, MPI through pinned host memory, the ranks possibly sharing a
// GPU): the seed example piece by piece and as one group, a partial sum completed across ranks,
// and a rank that stops mid-reshard, which the others name once the timeout passes (NCCL's
// watchdog, or the MPI receive's bound). Run under mpirun on a GPU machine
// (scripts/gpu-check.sh); without a GPU every test skips with the reason, and alone (a group of
// one) the first two run on one GPU with nothing to cross.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/error.hpp"
#include "test_support.hpp"
#include "tools/subprocess.hpp"

namespace poolscope::darray {
namespace {

using i64 = std::int64_t;

// One GPU per rank over the test program's group, or the reason there is none.
std::shared_ptr<backend> gpu_per_rank(transport how, std::string& why_not) {
  backend_options o;
  o.group = test_support::test_group();
  o.transfers = how;
  o.between_ranks = test_support::test_between_ranks();
  try {
    return make_cuda_backend(1, o);
  } catch (const device_unavailable& e) {
    why_not = e.what();
  }
  return nullptr;
}

class darray_ranks_gpu : public ::testing::TestWithParam<transport> {};

TEST_P(darray_ranks_gpu, seed_example_and_a_partial_sum_cross_ranks) {
  std::string why_not;
  const auto be = gpu_per_rank(GetParam(), why_not);
  if (!be) {
    GTEST_SKIP() << "no GPU: " << why_not;
  }
  const int devs = be->device_count();
  const i64 n = (i64{1} << 20) * devs + 17;
  std::vector<i64> ha(static_cast<std::size_t>(n)), hc(ha.size());
  std::iota(ha.begin(), ha.end(), 0);
  std::iota(hc.begin(), hc.end(), 5000000);
  std::vector<std::tuple<int, i64, i64>> shifted;
  for (int d = 0; d < devs; ++d) {
    const i64 lo = d == 0 ? 0 : (n * d + n * 4 / 10) / devs;
    const i64 hi = d + 1 == devs ? n : (n * (d + 1) + n * 4 / 10) / devs;
    shifted.emplace_back(d, lo, hi);
  }
  const auto a_map = index_map::blocks({n}, 0, devs);
  auto a = distributed_array<i64>::from_host(be, ha, {n}, a_map);
  auto c = distributed_array<i64>::from_host(be, hc, {n}, index_map::split({n}, 0, shifted));
  const auto d = a + c.reshard(a_map, {.how = GetParam()});
  std::vector<i64> want(ha.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    want[i] = ha[i] + hc[i];
  }
  EXPECT_EQ(d.to_host(), want);
  test_support::expect_chunks_match(d, want);
  const i64 total = std::accumulate(want.begin(), want.end(), i64{0});
  EXPECT_EQ(sum(d).change_mode(array_mode::replica).to_host(), std::vector<i64>{total});
  if (be->group()->size() > 1) {
    EXPECT_GT(be->stats().bytes_between_ranks, 0U);
  }
  be->synchronize();
}

INSTANTIATE_TEST_SUITE_P(transports, darray_ranks_gpu,
                         ::testing::Values(transport::automatic, transport::nccl),
                         [](const auto& p) { return std::string(to_string(p.param)); });

// Rank 1 stops before a reshard rank 0 makes (rank 0's receive waits on its GPU): rank 0's
// watchdog aborts the communicators once POOLSCOPE_RANK_TIMEOUT passes and names what waited.
TEST(darray_ranks_gpu_fault, rank_stops_mid_reshard) {
  if (std::getenv("POOLSCOPE_TEST_FAULT") == nullptr) {
    GTEST_SKIP() << "a fault scenario: darray_ranks_gpu_faults runs it under mpirun";
  }
  std::string why_not;
  const auto be = gpu_per_rank(transport::automatic, why_not);
  ASSERT_TRUE(be) << why_not;
  ASSERT_GE(be->group()->size(), 2) << "a fault scenario runs under mpirun -np 2";
  const int devs = be->device_count();
  const i64 n = i64{1} << 20;
  auto x = distributed_array<i64>::full(be, 1, {n}, index_map::blocks({n}, 0, devs));
  if (be->group()->rank() == 1) {
    std::printf("rank 1 stops\n");
    return;
  }
  try {
    (void)x.reshard(index_map::replicated({n}, {0})).to_host();
    ADD_FAILURE() << "rank 0 finished a reshard whose pieces rank 1 never sent";
  } catch (const std::exception& e) {
    std::printf("rank 0 failed: %s\n", e.what());
  }
}

#ifdef POOLSCOPE_MPIEXEC
// darray_ranks_gpu_fault under mpirun -np 2 with `between` (POOLSCOPE_TEST_BETWEEN_RANKS) and a
// 5 s bound: what the launch printed once it has ended with rank 0 reporting its failure (checked
// here), or nothing with a skip's reason in `why_not`.
std::optional<std::string> silent_rank_launch(const char* between, std::string& why_not) {
  if (process_group::launched() != 0) {
    why_not = "starts launches of its own: not run under a launcher";
    return std::nullopt;
  }
  if (!gpu_per_rank(transport::automatic, why_not)) {
    why_not = "no GPU: " + why_not;
    return std::nullopt;
  }
  std::vector<char> self(4096);
  const ssize_t len = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  EXPECT_GT(len, 0);
  std::vector<std::string> argv{POOLSCOPE_MPIEXEC, "-np", "2"};
  std::map<std::string, std::string> env{
      {"POOLSCOPE_TEST_FAULT", "1"},           {"POOLSCOPE_TEST_BETWEEN_RANKS", between},
      {"POOLSCOPE_RANK_TIMEOUT", "5"},         {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
      {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}, {"OMPI_MCA_rmaps_base_oversubscribe", "1"}};
  if (std::string(between) == "nccl" && make_cuda_backend(-1)->device_count() < 2) {
    // NCCL refuses two ranks of a host on one GPU: each rank a host of its own to NCCL
    // (NCCL_HOSTID), which NCCL then joins by its network transport over loopback.
    argv.insert(argv.end(),
                {"sh", "-c", "NCCL_HOSTID=poolscope-rank$OMPI_COMM_WORLD_RANK exec \"$0\" \"$@\""});
    env["NCCL_SOCKET_IFNAME"] = "lo";
  }
  argv.emplace_back(self.data(), static_cast<std::size_t>(len));
  argv.emplace_back("--gtest_filter=darray_ranks_gpu_fault.*");
  const auto r = testing::run_process(argv, env, std::chrono::seconds(180));
  const std::string all = r.out + r.err;
  EXPECT_FALSE(r.timed_out) << all;
  EXPECT_NE(all.find("rank 0 failed: "), std::string::npos) << all;
  return all;
}

TEST(darray_ranks_gpu_faults, a_silent_rank_is_named_and_nccl_aborted) {
  std::string why_not;
  const auto all = silent_rank_launch("nccl", why_not);
  if (!all) {
    GTEST_SKIP() << why_not;
  }
  // Waiting on the GPU, or in the host call that connects to the peer (NCCL's first transfer):
  // what rank 0 throws names the wait, not only NCCL's error after the abort.
  const std::size_t at = all->find("rank 0 failed: ");
  ASSERT_NE(at, std::string::npos) << *all;
  const std::string failed = all->substr(at, all->find('\n', at) - at);
  EXPECT_TRUE(failed.find("has not completed in") != std::string::npos ||
              failed.find("for its peer") != std::string::npos)
      << failed;
}

// Between ranks by MPI (the two ranks may share the GPU): rank 0's receive gives up after the
// bound, naming rank 1 and the receive.
TEST(darray_ranks_gpu_faults, a_silent_rank_is_named_by_the_mpi_receive) {
  std::string why_not;
  const auto all = silent_rank_launch("mpi", why_not);
  if (!all) {
    GTEST_SKIP() << why_not;
  }
  EXPECT_NE(all->find("for rank 1 while receiving"), std::string::npos) << *all;
}
#endif

}  // namespace
}  // namespace poolscope::darray
