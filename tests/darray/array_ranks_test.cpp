// DistributedArrays across the ranks of a launch (SPMD): device numbering over every rank, the
// seed example with pieces crossing ranks, from_host through rank 0, to_host on every rank,
// reductions and matmul, typed errors for another rank's chunk or device, and the process
// group's own collectives. Alone (a group of one) these check the same code with nothing to
// cross; ctest runs them under mpirun -np 2 and 3 too (darray.mpi.*), where each rank checks what
// it holds and what to_host gathers against the host reference.
//
// The faults (a rank that fails mid-reshard, one that goes silent, one that dies) each run as a
// launch of their own, started by darray_ranks_faults below with a timeout: a hang fails it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/error.hpp"
#include "test_support.hpp"
#include "tools/subprocess.hpp"

namespace poolscope::darray {
namespace {

using i64 = std::int64_t;

std::shared_ptr<backend> ranks_backend(int devices_per_rank = 2) {
  backend_options o;
  o.group = test_support::test_group();
  return make_host_backend(devices_per_rank, o);
}

std::vector<i64> iota_values(i64 n, i64 start) {
  std::vector<i64> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(darray_ranks, devices_are_numbered_rank_by_rank) {
  const auto be = ranks_backend(2);
  auto& g = *be->group();
  // Each rank's devices follow those of the ranks before it (the counts as every rank gave them).
  const std::vector<i64> counts = g.all_gather(i64{be->local_device_count()});
  ASSERT_EQ(counts.size(), static_cast<std::size_t>(g.size()));
  i64 first = 0;
  for (int r = 0; r < g.size(); ++r) {
    EXPECT_EQ(be->first_device_of(r), first);
    for (i64 d = first; d < first + counts[static_cast<std::size_t>(r)]; ++d) {
      EXPECT_EQ(be->rank_of(static_cast<int>(d)), r);
      EXPECT_EQ(be->is_local(static_cast<int>(d)), r == g.rank());
    }
    first += counts[static_cast<std::size_t>(r)];
  }
  EXPECT_EQ(be->device_count(), first);
  EXPECT_EQ(be->first_local_device(), be->first_device_of(g.rank()));
  EXPECT_EQ(be->device_name(be->device_count() - 1),
            "host device " + std::to_string(be->device_count() - 1));
  EXPECT_THROW((void)be->rank_of(be->device_count()), invalid_argument);
  EXPECT_THROW((void)be->first_device_of(g.size()), invalid_argument);
}

TEST(darray_ranks, seed_example_moves_pieces_between_ranks) {
  const auto be = ranks_backend(2);
  const int devs = be->device_count();
  const i64 n = 600 * devs;
  const auto ha = iota_values(n, 0);
  const auto hc = iota_values(n, 1000000);
  // A in equal blocks, C in blocks shifted by 0.4 of a block: every boundary moves.
  std::vector<std::tuple<int, i64, i64>> a_ranges, c_ranges;
  for (int d = 0; d < devs; ++d) {
    a_ranges.emplace_back(d, n * d / devs, n * (d + 1) / devs);
    const i64 lo = d == 0 ? 0 : (n * d + n * 4 / 10) / devs;
    const i64 hi = d + 1 == devs ? n : (n * (d + 1) + n * 4 / 10) / devs;
    c_ranges.emplace_back(d, lo, hi);
  }
  const auto a_map = index_map::split({n}, 0, a_ranges);
  const auto c_map = index_map::split({n}, 0, c_ranges);
  auto a = distributed_array<i64>::from_host(be, ha, {n}, a_map);
  auto c = distributed_array<i64>::from_host(be, hc, {n}, c_map);
  // What this rank sends or receives, counted from the maps alone: each element whose C device
  // and A device are on different ranks, one of them this one.
  const int me = be->group()->rank();
  i64 crossing = 0;
  for (i64 i = 0; i < n; ++i) {
    int src = 0;
    int dst = 0;
    for (const auto& [d, lo, hi] : c_ranges) {
      src = i >= lo && i < hi ? d : src;
    }
    for (const auto& [d, lo, hi] : a_ranges) {
      dst = i >= lo && i < hi ? d : dst;
    }
    if (be->rank_of(src) != be->rank_of(dst) &&
        (be->rank_of(src) == me || be->rank_of(dst) == me)) {
      ++crossing;
    }
  }
  const backend_stats before = be->stats();
  auto moved = c.reshard(a.index_map());
  const backend_stats after = be->stats();
  EXPECT_EQ(after.bytes_between_ranks - before.bytes_between_ranks,
            static_cast<std::uint64_t>(crossing) * sizeof(i64));
  test_support::expect_chunks_match(moved, hc);
  auto d = a + c.reshard(a.index_map());
  std::vector<i64> want(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < want.size(); ++i) {
    want[i] = ha[i] + hc[i];
  }
  EXPECT_EQ(d.to_host(), want);
  test_support::expect_chunks_match(d, want);
}

TEST(darray_ranks, from_host_reads_rank_0s_values) {
  const auto be = ranks_backend(1);
  const int devs = be->device_count();
  const i64 n = 50 * devs + 3;
  const auto h = iota_values(n, 7);
  const bool root = be->group()->rank() == 0;
  // Ranks but 0 pass nothing; a replica of the middle lands on the last device too.
  auto m = index_map::blocks({n}, 0, devs);
  m.add(devs - 1, box{{slice{n / 4, 3 * n / 4}}});
  const std::vector<i64> none;
  auto x = distributed_array<i64>::from_host(be, root ? h : none, {n}, m);
  EXPECT_EQ(x.handle().last_reshard().plan->pieces.size(), 0U) << "built, not resharded";
  test_support::expect_chunks_match(x, h);
  EXPECT_EQ(x.to_host(), h);
  // Every rank refuses a wrong count the same way (before any rank sends anything).
  const std::vector<i64> short_data(static_cast<std::size_t>(n - 1));
  EXPECT_THROW((void)distributed_array<i64>::from_host(be, short_data, {n}, m), invalid_argument);
}

TEST(darray_ranks, reductions_and_matmul_span_every_rank) {
  const auto be = ranks_backend(2);
  const int devs = be->device_count();
  const i64 m = 3 * devs + 1;
  std::vector<i64> hx(static_cast<std::size_t>(m * m)), hy(hx.size());
  for (std::size_t i = 0; i < hx.size(); ++i) {
    hx[i] = static_cast<i64>(i % 7) - 3;
    hy[i] = static_cast<i64>(i % 5) - 2;
  }
  const shape_t sq{m, m};
  std::vector<std::vector<int>> gx(static_cast<std::size_t>(devs), std::vector<int>(2));
  std::vector<std::vector<int>> gy(2, std::vector<int>(static_cast<std::size_t>(devs)));
  for (int i = 0; i < devs; ++i) {
    for (int j = 0; j < 2; ++j) {
      gx[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = (i + j) % devs;
      gy[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)] = (i + j + 1) % devs;
    }
  }
  auto x = distributed_array<i64>::from_host(be, hx, sq, index_map::grid(sq, devs, 2, gx));
  auto y = distributed_array<i64>::from_host(be, hy, sq, index_map::grid(sq, 2, devs, gy));
  std::vector<i64> want(hx.size(), 0);
  std::vector<i64> rows(static_cast<std::size_t>(m), 0);
  std::vector<i64> cols(static_cast<std::size_t>(m), 0);
  for (i64 i = 0; i < m; ++i) {
    for (i64 k = 0; k < m; ++k) {
      const i64 v = hx[static_cast<std::size_t>(i * m + k)];
      rows[static_cast<std::size_t>(i)] += v;
      cols[static_cast<std::size_t>(k)] += v;
      for (i64 j = 0; j < m; ++j) {
        want[static_cast<std::size_t>(i * m + j)] += v * hy[static_cast<std::size_t>(k * m + j)];
      }
    }
  }
  auto prod = matmul(x, y);
  EXPECT_EQ(prod.mode(), array_mode::sum);
  EXPECT_EQ(prod.to_host(), want);
  EXPECT_EQ(prod.change_mode(array_mode::replica).to_host(), want);
  EXPECT_EQ(sum(x, 0).to_host(), cols);
  EXPECT_EQ(sum(x, 1).change_mode(array_mode::replica).to_host(), rows);
  EXPECT_EQ(max(x).to_host(), std::vector<i64>{*std::max_element(hx.begin(), hx.end())});
  EXPECT_EQ(min(y).change_mode(array_mode::replica).to_host(),
            std::vector<i64>{*std::min_element(hy.begin(), hy.end())});
}

TEST(darray_ranks, another_ranks_chunk_or_device_is_a_typed_error) {
  const auto be = ranks_backend(1);
  if (be->group()->size() == 1) {
    GTEST_SKIP() << "needs several ranks (ctest's darray.mpi tests run it under mpirun)";
  }
  const int devs = be->device_count();
  const i64 n = 10 * devs;
  auto x = distributed_array<i64>::full(be, 3, {n}, index_map::blocks({n}, 0, devs));
  const int me = be->group()->rank();
  const int other = (me + 1) % be->group()->size();
  const int theirs = be->first_device_of(other);
  try {
    (void)x.chunk_to_host(static_cast<std::size_t>(theirs));
    ADD_FAILURE() << "chunk_to_host of another rank's chunk did not throw";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("of rank " + std::to_string(other)), std::string::npos)
        << e.what();
  }
  const auto buf = be->allocate(be->first_local_device(), 64);
  try {
    be->fill(theirs, queue_kind::compute, dtype::i64, view::dense(buf->data(), {8}), scalar::of(1));
    ADD_FAILURE() << "an enqueue on another rank's device did not throw";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("is rank " + std::to_string(other) + "'s"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(x.to_host(), std::vector<i64>(static_cast<std::size_t>(n), 3));
}

TEST(darray_ranks, group_collectives_combine_every_ranks_values) {
  const auto g = test_support::test_group();
  const int me = g->rank();
  const int size = g->size();
  std::vector<i64> words{me == 0 ? 42 : -1, 7};
  g->broadcast(words.data(), words.size() * sizeof(i64), 0);
  EXPECT_EQ(words, (std::vector<i64>{42, 7}));
  std::vector<i64> ranks(static_cast<std::size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  EXPECT_EQ(g->all_gather(i64{me}), ranks);
  const auto texts = g->all_gather(std::string(static_cast<std::size_t>(me) + 1, 'x'));
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(texts[static_cast<std::size_t>(r)],
              std::string(static_cast<std::size_t>(r) + 1, 'x'));
  }
  const i64 total = static_cast<i64>(size) * (size - 1) / 2;
  EXPECT_EQ(g->all_reduce({me, 1}, process_group::reduction::sum), (std::vector<i64>{total, size}));
  EXPECT_EQ(g->all_reduce({me}, process_group::reduction::max), std::vector<i64>{size - 1});
  EXPECT_EQ(g->all_reduce({me}, process_group::reduction::min), std::vector<i64>{0});
  g->barrier();
  EXPECT_FALSE(g->failure().has_value());
}

TEST(darray_ranks, group_arguments_are_checked) {
  EXPECT_THROW((void)process_group::adopt_nccl(nullptr, 0, 2), invalid_argument);
  int not_a_communicator = 0;
  try {
    (void)process_group::adopt_nccl(&not_a_communicator, 2, 2);
    ADD_FAILURE() << "rank 2 of 2 was taken";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 is not one of the 2 ranks"), std::string::npos)
        << e.what();
  }
  // An adopted group has no MPI: host collectives are refused, by name.
  const auto adopted = process_group::adopt_nccl(&not_a_communicator, 1, 2);
  EXPECT_FALSE(adopted->uses_mpi());
  EXPECT_EQ(adopted->nccl_communicator(), &not_a_communicator);
  try {
    adopted->barrier();
    ADD_FAILURE() << "a barrier without MPI was taken";
  } catch (const logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("barrier needs MPI"), std::string::npos) << e.what();
  }
  // A group of one has no peer, and a negative timeout is no bound.
  const auto one = process_group::single();
  EXPECT_THROW(one->send("x", 1, 1, 0), invalid_argument);
  EXPECT_THROW((void)process_group::adopt_nccl(&not_a_communicator, 0, 1,
                                               {.timeout = std::chrono::milliseconds(-5)}),
               invalid_argument);
  one->barrier();  // alone: returns at once
  EXPECT_EQ(one->all_gather(std::int64_t{7}), std::vector<i64>{7});
}

TEST(darray_ranks, a_bad_rank_timeout_is_named) {
  const char* old = std::getenv("POOLSCOPE_RANK_TIMEOUT");
  const std::string kept = old != nullptr ? old : "";
  ::setenv("POOLSCOPE_RANK_TIMEOUT", "soon", 1);
  try {
    (void)process_group::single();
    ADD_FAILURE() << "POOLSCOPE_RANK_TIMEOUT=soon was taken";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'soon'"), std::string::npos) << e.what();
  }
  ::setenv("POOLSCOPE_RANK_TIMEOUT", "2.5", 1);
  EXPECT_EQ(process_group::single()->timeout(), std::chrono::milliseconds(2500));
  if (old != nullptr) {
    ::setenv("POOLSCOPE_RANK_TIMEOUT", kept.c_str(), 1);
  } else {
    ::unsetenv("POOLSCOPE_RANK_TIMEOUT");
  }
}

// Many threads at once on one group (the host devices' transfer workers and the caller do so):
// transfers on their own tags between every pair of neighbouring ranks, and failures noted while
// others read them. Alone, the transfers have no peer and only the failures run.
TEST(darray_ranks_concurrency, threads_transfer_and_note_failures_at_once) {
  const auto g = test_support::test_group();
  constexpr int threads = 4;
  constexpr std::size_t words = 1000;
  if (g->size() > 1) {
    const int next = (g->rank() + 1) % g->size();
    const int prev = (g->rank() + g->size() - 1) % g->size();
    std::vector<std::vector<i64>> got(threads, std::vector<i64>(words));
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k) {
      pool.emplace_back([&, k] {
        const std::vector<i64> mine(words, g->rank() * 100 + k);
        // Send and receive at once: the send alone may wait for the receive (rendezvous).
        std::thread sender([&] { g->send(mine.data(), words * sizeof(i64), next, k); });
        g->receive(got[static_cast<std::size_t>(k)].data(), words * sizeof(i64), prev, k);
        sender.join();
      });
    }
    for (auto& t : pool) {
      t.join();
    }
    for (int k = 0; k < threads; ++k) {
      EXPECT_EQ(got[static_cast<std::size_t>(k)], std::vector<i64>(words, prev * 100 + k)) << k;
    }
    g->barrier();
    return;  // the world group lives on: its failure would fail the tests after this one
  }
  const auto one = process_group::single();
  std::vector<std::thread> pool;
  std::atomic<int> seen{0};
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      one->fail("failure " + std::to_string(k));
      if (const auto f = one->poll_failure(); f && f->starts_with("failure ")) {
        seen.fetch_add(1);
      }
    });
  }
  for (auto& t : pool) {
    t.join();
  }
  EXPECT_EQ(seen.load(), threads);
  const auto first = one->failure();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first, one->poll_failure()) << "the first failure stays the group's";
  EXPECT_THROW(one->barrier(), communication_error) << "nothing waits after a failure";
}

// backend::send() and receive() from two threads at once on each rank's device, along a chain
// of ranks (MPI between host devices): every piece arrives whole and in order. Alone, nothing
// crosses and the test checks nothing.
TEST(darray_ranks_concurrency, threads_send_and_receive_along_a_chain) {
  test_support::expect_chain_transfers(ranks_backend(1), 60);
}

// --- faults: each scenario is a launch of its own (the group stays failed once a rank fails) ---

// Which fault scenario this launch plays (POOLSCOPE_TEST_FAULT), or skips: the scenarios run only
// under darray_ranks_faults' launches.
std::string fault_scenario() {
  const char* s = std::getenv("POOLSCOPE_TEST_FAULT");
  return s != nullptr ? s : "";
}

// Rank 1 asks for an impossible reshard (a map naming a device no rank has), as a rank whose
// input is bad would; rank 0 reshards correctly and waits for rank 1's pieces. `tell`: rank 1
// tells the others (process_group::fail, what the demo's error handler does) or just stops.
void fault_mid_reshard(bool tell) {
  const auto be = ranks_backend(1);
  ASSERT_GE(be->group()->size(), 2) << "a fault scenario runs under mpirun -np 2";
  const int devs = be->device_count();
  const i64 n = 64 * devs;
  auto x = distributed_array<i64>::from_host(be, iota_values(n, 0), {n},
                                             index_map::blocks({n}, 0, devs));
  index_map target;  // everything moves one device on
  for (int d = 0; d < devs; ++d) {
    target.add((d + 1) % devs, box{{slice{n * d / devs, n * (d + 1) / devs}}});
  }
  if (be->group()->rank() == 1) {
    index_map bad = target;
    bad.add(devs + 5, box{{slice{0, 1}}});
    try {
      (void)x.reshard(bad);
      ADD_FAILURE() << "a map naming device " << devs + 5 << " was taken";
    } catch (const invalid_index_map& e) {
      std::printf("rank 1 refused: %s\n", e.what());
      if (tell) {
        be->group()->fail(e.what());
      }
    }
    return;
  }
  try {
    (void)x.reshard(target).to_host();
    ADD_FAILURE() << "rank 0 finished a reshard whose pieces rank 1 never sent";
  } catch (const std::exception& e) {
    std::printf("rank 0 failed: %s\n", e.what());
  }
}

TEST(darray_ranks_fault, rank_fails_mid_reshard) {
  if (fault_scenario() != "tell") {
    GTEST_SKIP() << "a fault scenario: darray_ranks_faults runs it under mpirun";
  }
  fault_mid_reshard(true);
}

TEST(darray_ranks_fault, rank_stops_silently_mid_reshard) {
  if (fault_scenario() != "silent") {
    GTEST_SKIP() << "a fault scenario: darray_ranks_faults runs it under mpirun";
  }
  fault_mid_reshard(false);
}

TEST(darray_ranks_fault, rank_dies_mid_reshard) {
  if (fault_scenario() != "die") {
    GTEST_SKIP() << "a fault scenario: darray_ranks_faults runs it under mpirun";
  }
  const auto be = ranks_backend(1);
  ASSERT_GE(be->group()->size(), 2) << "a fault scenario runs under mpirun -np 2";
  const int devs = be->device_count();
  const i64 n = 64 * devs;
  auto x = distributed_array<i64>::full(be, 1, {n}, index_map::blocks({n}, 0, devs));
  if (be->group()->rank() == 1) {
    std::fflush(stdout);
    ::_exit(3);  // as a crash would: no handler, no MPI_Finalize
  }
  (void)x.reshard(index_map::replicated({n}, {0})).to_host();
}

// The environment says 2 ranks (as torchrun's WORLD_SIZE does) and no MPI launcher started this
// process: the group refuses to stand for a launch it is not part of.
TEST(darray_ranks_fault, no_launcher_started_the_peers) {
  if (fault_scenario() != "no launcher") {
    GTEST_SKIP() << "a fault scenario: darray_ranks_faults runs it without a launcher";
  }
  try {
    (void)process_group::from_launcher();
    ADD_FAILURE() << "a group of one stood for WORLD_SIZE=2";
  } catch (const communication_error& e) {
    std::printf("refused: %s\n", e.what());
  }
}

#ifdef POOLSCOPE_MPIEXEC
constexpr const char* built_mpiexec = POOLSCOPE_MPIEXEC;
#else
constexpr const char* built_mpiexec = nullptr;
#endif

// The launcher of the fault scenarios: POOLSCOPE_TEST_LAUNCHER when set (a program taking
// mpiexec's "-np N PROGRAM ARGS...": tests/support/two_hosts.sh runs them across two hosts,
// srun_launch.sh under srun; exit 77 and "SKIP: why" where it cannot), else the build's mpiexec.
const char* launcher() {
  const char* env = std::getenv("POOLSCOPE_TEST_LAUNCHER");
  return env != nullptr && *env != '\0' ? env : built_mpiexec;
}

// This test program's path (for the launcher to start it again).
std::string self_path() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<std::size_t>(n)) : std::string();
}

// This process's ASAN_OPTIONS, ready for one more (ends in ':' unless empty).
std::string asan_options() {
  const char* a = std::getenv("ASAN_OPTIONS");
  return a != nullptr && *a != '\0' ? std::string(a) + ":" : std::string();
}

// Starts `scenario` as `mpirun -np 2` of this test program with a short rank timeout; returns
// what it printed. A launch still running after 120 s is ended and fails the test.
testing::process_result launch_fault(const std::string& scenario, const std::string& test) {
  return testing::run_process(
      {launcher(), "-np", "2", self_path(), "--gtest_filter=darray_ranks_fault." + test},
      {{"POOLSCOPE_TEST_FAULT", scenario},
       {"POOLSCOPE_RANK_TIMEOUT", "3"},
       {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
       {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
       {"OMPI_MCA_rmaps_base_oversubscribe", "1"},
       // Under AddressSanitizer: Open MPI keeps what MPI_Init allocates until exit (.ci/run).
       {"ASAN_OPTIONS", asan_options() + "detect_leaks=0"}},
      std::chrono::seconds(120));
}

// Which launcher started this process, from its environment alone: a SLURM allocation (salloc,
// sbatch's script: SLURM_NTASKS) is no launch of ranks; a job step (srun: SLURM_STEP_NUM_TASKS)
// is. Malformed sizes count as none. Not under a launcher (it changes the environment).
TEST(darray_launcher, world_size_from_the_launchers_environment) {
  if (process_group::launched() != 0) {
    GTEST_SKIP() << "changes the launcher's environment: not run under a launcher";
  }
  const auto set = [](const char* name, const char* value) {
    ASSERT_EQ(setenv(name, value, 1), 0);
  };
  const auto clear = [] {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS",
                             "SLURM_NTASKS", "WORLD_SIZE"}) {
      ASSERT_EQ(unsetenv(name), 0);
    }
  };
  clear();
  set("SLURM_NTASKS", "3");  // inside salloc or an sbatch script, before srun
  EXPECT_EQ(process_group::launched(), 0);
  set("SLURM_STEP_NUM_TASKS", "3");  // a step that srun started
  EXPECT_EQ(process_group::launched(), 3);
  set("OMPI_COMM_WORLD_SIZE", "2");  // mpirun inside an allocation: its own ranks
  EXPECT_EQ(process_group::launched(), 2);
  clear();
  set("WORLD_SIZE", "4");  // torchrun
  EXPECT_EQ(process_group::launched(), 4);
  set("WORLD_SIZE", "4x");
  EXPECT_EQ(process_group::launched(), 0);
  set("PMI_SIZE", "0");
  EXPECT_EQ(process_group::launched(), 0);
  clear();
}

// A launcher that cannot run here (two_hosts.sh without root, srun_launch.sh without a cluster)
// exits 77 after "SKIP: why".
#define SKIP_WHERE_THE_LAUNCHER_CANNOT_RUN(r)                   \
  if ((r).exit_code == 77 && (r).out.rfind("SKIP: ", 0) == 0) { \
    GTEST_SKIP() << (r).out.substr(6);                          \
  }

class darray_ranks_faults : public ::testing::Test {
 protected:
  void SetUp() override {
    if (launcher() == nullptr) {
      GTEST_SKIP() << "built without MPI: no launcher to start the scenarios with";
    }
    if (process_group::launched() != 0) {
      GTEST_SKIP() << "starts launches of its own: not run under a launcher";
    }
  }
};

TEST_F(darray_ranks_faults, a_rank_that_fails_tells_the_others_with_its_reason) {
  const auto r = launch_fault("tell", "rank_fails_mid_reshard");
  SKIP_WHERE_THE_LAUNCHER_CANNOT_RUN(r);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("rank 1 refused: "), std::string::npos) << all;
  // Rank 0's error names rank 1 and rank 1's own reason (the map's bad device).
  EXPECT_NE(all.find("rank 1 failed: "), std::string::npos) << all;
  EXPECT_NE(all.find("device " + std::to_string(2 + 5)), std::string::npos) << all;
  EXPECT_EQ(r.exit_code, 0) << all;  // both ranks' scenarios saw what they expected
}

TEST_F(darray_ranks_faults, a_silent_rank_is_named_once_the_timeout_passes) {
  const auto r = launch_fault("silent", "rank_stops_silently_mid_reshard");
  SKIP_WHERE_THE_LAUNCHER_CANNOT_RUN(r);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("rank 0 failed: "), std::string::npos) << all;
  EXPECT_NE(all.find("waited 3 s for rank 1"), std::string::npos) << all;
  EXPECT_EQ(r.exit_code, 0) << all;
}

TEST_F(darray_ranks_faults, peers_no_launcher_started_are_named) {
  const auto r =
      testing::run_process({self_path(), "--gtest_filter=darray_ranks_fault.no_launcher_*"},
                           {{"POOLSCOPE_TEST_FAULT", "no launcher"},
                            {"WORLD_SIZE", "2"},
                            {"ASAN_OPTIONS", asan_options() + "detect_leaks=0"}},
                           std::chrono::seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("refused: darray: WORLD_SIZE=2 says this process is one of 2 ranks, and "
                       "MPI_COMM_WORLD has 1"),
            std::string::npos)
      << r.out << r.err;
}

TEST_F(darray_ranks_faults, a_rank_that_dies_ends_the_launch) {
  const auto r = launch_fault("die", "rank_dies_mid_reshard");
  SKIP_WHERE_THE_LAUNCHER_CANNOT_RUN(r);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;  // the launcher ends every rank and says why
}

}  // namespace
}  // namespace poolscope::darray
