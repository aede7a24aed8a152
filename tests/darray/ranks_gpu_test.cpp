// DistributedArrays over GPUs of several ranks (by default the copy engines through CUDA IPC
// between the GPUs of one host, the ranks possibly sharing one; with
// POOLSCOPE_TEST_BETWEEN_RANKS=nccl one GPU per rank, NCCL between them, or on a machine of one GPU
// each rank a host of its own to NCCL by NCCL_HOSTID; with =mpi, MPI through pinned host memory):
// the seed example piece by piece and as one group, a partial sum completed across ranks, and a
// rank that stops mid-reshard, which the others name once the timeout passes (NCCL's watchdog, or
// the MPI receive's bound). Run under mpirun on a GPU machine (scripts/gpu-check.sh); without a GPU
// every test skips with the reason, and alone (a group of one) the first two run on one GPU with
// nothing to cross.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
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

// gpu_per_rank() where the group has 2 ranks or more moving GPU data by `between`, or null with
// the reason in `why_not`.
std::shared_ptr<backend> ranks_moving_by(transport how, rank_transport between,
                                         std::string& why_not) {
  auto be = gpu_per_rank(how, why_not);
  if (!be) {
    why_not = "no GPU: " + why_not;
    return nullptr;
  }
  if (be->group()->size() < 2 || test_support::test_between_ranks() != between) {
    why_not = "needs 2 ranks or more with between_ranks = " + std::string(to_string(between));
    return nullptr;
  }
  return be;
}

class darray_ranks_gpu : public ::testing::TestWithParam<transport> {};

// The blocks of n elements over `devs` devices, each block on the next device: resharded to
// plain blocks, every block moves to the device before it (a piece of 8 MiB per device with
// n = 2^20 devs, between ranks when each has one GPU).
index_map rotated_blocks(i64 n, int devs) {
  std::vector<std::tuple<int, i64, i64>> rotated;
  for (int d = 0; d < devs; ++d) {
    rotated.emplace_back((d + 1) % devs, n * d / devs, n * (d + 1) / devs);
  }
  return index_map::split({n}, 0, rotated);
}

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

// Pieces between ranks by NCCL go as one group, each whole, whatever split_bytes says: NCCL runs a
// group's sends at once and pipelines each in its own chunks, where pieces one by one, or several
// per peer, run one after another at a fraction of the link (docs/perf.md, "Across processes").
TEST_P(darray_ranks_gpu, pieces_between_ranks_move_whole_in_one_group) {
  std::string why_not;
  const auto be = ranks_moving_by(GetParam(), rank_transport::nccl, why_not);
  if (!be) {
    GTEST_SKIP() << why_not;
  }
  const int devs = be->device_count();
  const i64 n = (i64{1} << 20) * devs;
  std::vector<i64> hc(static_cast<std::size_t>(n));
  std::iota(hc.begin(), hc.end(), 11);
  const auto blocks = index_map::blocks({n}, 0, devs);
  // A piece of 8 MiB between ranks per device, which a split at 1 MiB would cut in eight.
  const auto c = distributed_array<i64>::from_host(be, hc, {n}, rotated_blocks(n, devs));
  const auto moved = c.reshard(blocks, {.how = GetParam(), .split_bytes = i64{1} << 20});
  test_support::expect_chunks_match(moved, hc);
  const auto& plan = *moved.handle().last_reshard().plan;
  EXPECT_TRUE(be->groups_transfers(plan, GetParam()));
  std::set<std::pair<std::size_t, std::size_t>> links;
  for (const piece& p : plan.pieces) {
    if (!p.local && be->rank_of(p.src_device) != be->rank_of(p.dst_device)) {
      EXPECT_TRUE(links.emplace(p.src_chunk, p.dst_chunk).second)
          << "the piece from chunk " << p.src_chunk << " to chunk " << p.dst_chunk << " was split ("
          << p.bytes << " bytes)";
    }
  }
  EXPECT_EQ(links.size(), static_cast<std::size_t>(devs));
  be->synchronize();
}

// Between GPUs of ranks on one host (between_ranks = automatic), pieces move one by one by the
// copy engines through CUDA IPC, as within a process: split as the plan says, never grouped, and
// every byte this rank receives from another arrives that way. Several reshards in a row reuse the
// pairs' sequence words and the mappings of the pools' segments.
TEST_P(darray_ranks_gpu, pieces_between_ranks_of_one_host_move_by_copy_engines) {
  std::string why_not;
  const auto be = ranks_moving_by(GetParam(), rank_transport::automatic, why_not);
  if (!be) {
    GTEST_SKIP() << why_not;
  }
  const auto hosts = be->group()->all_gather(be->group()->host_name());
  if (std::set<std::string>(hosts.begin(), hosts.end()).size() != 1) {
    GTEST_SKIP() << "the ranks run on several hosts: NCCL joins them";
  }
  const int devs = be->device_count();
  const i64 n = (i64{1} << 20) * devs;
  std::vector<i64> hc(static_cast<std::size_t>(n));
  std::iota(hc.begin(), hc.end(), 23);
  const auto blocks = index_map::blocks({n}, 0, devs);
  auto c = distributed_array<i64>::from_host(be, hc, {n}, rotated_blocks(n, devs));
  const backend_stats before = be->stats();
  // A 8 MiB block per device, split at 1 MiB: eight pieces per pair, each its own IPC transfer.
  for (int round = 0; round < 3; ++round) {
    const auto moved = c.reshard(blocks, {.how = GetParam(), .split_bytes = i64{1} << 20});
    test_support::expect_chunks_match(moved, hc);
    const auto& plan = *moved.handle().last_reshard().plan;
    EXPECT_EQ(be->groups_transfers(plan, GetParam()), GetParam() == transport::nccl);
    c = moved.reshard(c.index_map(), {.how = GetParam(), .split_bytes = i64{1} << 20});
    test_support::expect_chunks_match(c, hc);
  }
  be->synchronize();
  const backend_stats after = be->stats();
  // Each rank received its block twice per round from another rank, all of it through IPC.
  const auto block_bytes = static_cast<std::uint64_t>(n / devs) * sizeof(i64);
  EXPECT_EQ(after.bytes_ipc - before.bytes_ipc, 3 * 2 * block_bytes);
  EXPECT_EQ(after.bytes_between_ranks - before.bytes_between_ranks, 3 * 2 * 2 * block_bytes);
  EXPECT_EQ(after.bytes_nccl, before.bytes_nccl);
}

INSTANTIATE_TEST_SUITE_P(transports, darray_ranks_gpu,
                         ::testing::Values(transport::automatic, transport::nccl),
                         [](const auto& p) { return std::string(to_string(p.param)); });

// backend::send() and receive() from two threads at once on each rank's GPU, along a chain of
// ranks (by CUDA IPC, NCCL or MPI as POOLSCOPE_TEST_BETWEEN_RANKS says; with 3 ranks or more a
// middle rank sends and receives at once): every piece arrives whole and in order.
TEST(darray_ranks, gpu_threads_send_and_receive_along_a_chain) {
  std::string why_not;
  const auto be = gpu_per_rank(transport::automatic, why_not);
  if (!be) {
    GTEST_SKIP() << "no GPU: " << why_not;
  }
  if (be->group()->size() < 2) {
    GTEST_SKIP() << "needs 2 ranks or more (runs under mpirun)";
  }
  test_support::expect_chain_transfers(be, 200);
}

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

// A communicator the application made itself (as PyTorch's ProcessGroupNCCL holds one), adopted:
// the backend takes the GPU current when it was made, moves the pieces between ranks and
// completes the sum on it, and leaves it to the application, which can still use it afterwards.
TEST(darray_ranks_gpu_adopted, seed_example_and_a_sum_on_an_adopted_communicator) {
  const auto world = test_support::test_group();
  if (world->size() < 2) {
    GTEST_SKIP() << "needs 2 ranks or more (runs under mpirun)";
  }
  if (test_support::test_between_ranks() == rank_transport::mpi) {
    GTEST_SKIP() << "an adopted communicator moves data by NCCL only";
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "no GPU";
  }
  if (world->local_size() > gpus && std::getenv("NCCL_HOSTID") == nullptr) {
    GTEST_SKIP() << "ranks share a GPU, which NCCL refuses (unless each is a host of its own to "
                    "it: NCCL_HOSTID)";
  }
  // The application's choice of GPU: its local rank's where each rank of the host can have one.
  const int gpu = world->local_size() <= gpus ? world->local_rank() : 0;
  ASSERT_EQ(cudaSetDevice(gpu), cudaSuccess);
  ncclUniqueId id{};
  if (world->rank() == 0) {
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  world->broadcast(&id, sizeof id, 0);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, world->size(), id, world->rank()), ncclSuccess);
  {
    backend_options o;
    o.group = process_group::adopt_nccl(comm, world->rank(), world->size());
    const auto be = make_cuda_backend(1, o);
    ASSERT_EQ(be->device_count(), world->size());
    const i64 n = (i64{1} << 20) * world->size() + 5;
    std::vector<i64> ha(static_cast<std::size_t>(n)), hc(ha.size());
    std::iota(ha.begin(), ha.end(), 0);
    std::iota(hc.begin(), hc.end(), 7000000);
    const auto a_map = index_map::blocks({n}, 0, world->size());
    // c's blocks shifted by a third of a block: every rank sends to its neighbour and receives.
    std::vector<std::tuple<int, i64, i64>> shifted;
    for (int d = 0; d < world->size(); ++d) {
      const i64 lo = d == 0 ? 0 : (n * d + n / 3) / world->size();
      const i64 hi = d + 1 == world->size() ? n : (n * (d + 1) + n / 3) / world->size();
      shifted.emplace_back(d, lo, hi);
    }
    const auto a = distributed_array<i64>::from_host(be, ha, {n}, a_map);
    const auto c =
        distributed_array<i64>::from_host(be, hc, {n}, index_map::split({n}, 0, shifted));
    const auto d = a + c.reshard(a_map);
    std::vector<i64> want(ha.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      want[i] = ha[i] + hc[i];
    }
    test_support::expect_chunks_match(d, want);
    EXPECT_EQ(d.to_host(), want);
    const i64 total = std::accumulate(want.begin(), want.end(), i64{0});
    EXPECT_EQ(sum(d).change_mode(array_mode::replica).to_host(), std::vector<i64>{total});
    EXPECT_GT(be->stats().bytes_between_ranks, 0U);
    be->synchronize();
  }
  // Still the application's: an all-reduce on it after the backend has gone.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  int* value = nullptr;
  ASSERT_EQ(cudaMalloc(&value, sizeof(int)), cudaSuccess);
  const int mine = world->rank() + 1;
  ASSERT_EQ(cudaMemcpy(value, &mine, sizeof mine, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, comm, stream), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  int reduced = 0;
  ASSERT_EQ(cudaMemcpy(&reduced, value, sizeof reduced, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(reduced, world->size() * (world->size() + 1) / 2);
  EXPECT_EQ(cudaFree(value), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

#ifdef POOLSCOPE_MPIEXEC
// darray_ranks_gpu_fault under mpirun -np 2 with `between` (POOLSCOPE_TEST_BETWEEN_RANKS) and a
// 5 s bound, once the launch has ended: the line where rank 0 reports its failure (checked here;
// the whole output when there is none), or nothing with a skip's reason in `why_not`.
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
  const std::size_t at = all.find("rank 0 failed: ");
  EXPECT_NE(at, std::string::npos) << all;
  return at == std::string::npos ? all : all.substr(at, all.find('\n', at) - at);
}

TEST(darray_ranks_gpu_faults, a_silent_rank_is_named_and_nccl_aborted) {
  std::string why_not;
  const auto failed = silent_rank_launch("nccl", why_not);
  if (!failed) {
    GTEST_SKIP() << why_not;
  }
  // Waiting on the GPU past the bound, or, where NCCL's transport sees rank 1 leave (it ends its
  // backend after stopping; sockets see that, as on a machine of one GPU), NCCL's remote error at
  // once: what rank 0 throws names the wait or the peer's failure, not only NCCL's error after the
  // abort.
  EXPECT_TRUE(failed->find("has not completed in") != std::string::npos ||
              failed->find("another rank failed, or left") != std::string::npos)
      << *failed;
}

// Through CUDA IPC (the two ranks on one host, possibly sharing the GPU): rank 0's receive waits
// on its GPU for a copy rank 1 never makes, and its send for rank 1's message of where the piece
// goes; either is named once the bound has passed (and the GPU's wait let go, or the launch would
// not end).
TEST(darray_ranks_gpu_faults, a_silent_rank_is_named_through_cuda_ipc) {
  std::string why_not;
  const auto failed = silent_rank_launch("auto", why_not);
  if (!failed) {
    GTEST_SKIP() << why_not;
  }
  EXPECT_TRUE(failed->find("through CUDA IPC has not completed in") != std::string::npos ||
              failed->find("for rank 1 while receiving") != std::string::npos)
      << *failed;
  EXPECT_NE(failed->find("CUDA IPC"), std::string::npos) << *failed;
}

// Between ranks by MPI (the two ranks may share the GPU): rank 0's receive gives up after the
// bound, naming rank 1 and the receive.
TEST(darray_ranks_gpu_faults, a_silent_rank_is_named_by_the_mpi_receive) {
  std::string why_not;
  const auto failed = silent_rank_launch("mpi", why_not);
  if (!failed) {
    GTEST_SKIP() << why_not;
  }
  EXPECT_NE(failed->find("for rank 1 while receiving"), std::string::npos) << *failed;
}
#endif

}  // namespace
}  // namespace poolscope::darray
