// mpi_staging (darray/src/mpi_staging.hpp), the CUDA backend's way between ranks by MPI, driven
// here through host queues standing in for the GPUs' transfer streams: each copy runs on its
// device's queue after the work enqueued there before it, as cudaMemcpyAsync on a stream does.
// Under mpirun (ctest's darray.mpi tests) the ranks run one random plan of transfers between
// two devices each, small and large (beyond MPI's eager sizes), each source written by queue
// work enqueued just before its send (so a copy made before its queue reached it would send
// stale bytes); every received byte is checked. Alone: a send returns while its data is not yet
// ready on the queue; a send that fails is reported by check(), naming it; a receive that cannot
// be made throws; either way the staging goes back to the pool.
#include "mpi_staging.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ordered_worker.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "test_support.hpp"

namespace poolscope::darray::detail {
namespace {

// Host stand-ins for the transfer streams of `devices` devices: in-order queues of their own.
class host_queues final : public mpi_staging::device_copies {
 public:
  explicit host_queues(int devices) {
    for (int d = 0; d < devices; ++d) {
      queues_.push_back(std::make_unique<ordered_worker>("queue " + std::to_string(d)));
    }
  }
  [[nodiscard]] std::function<void()> enqueue_copy(int device, void* to, const void* from,
                                                   std::size_t bytes, bool /*to_host*/) override {
    auto done = std::make_shared<std::promise<void>>();
    std::shared_future<void> finished = done->get_future().share();
    queue(device).push([to, from, bytes, done] {
      std::memcpy(to, from, bytes);
      done->set_value();
    });
    ++copies_;
    return [finished] { finished.wait(); };
  }
  ordered_worker& queue(int device) { return *queues_.at(static_cast<std::size_t>(device)); }
  void drain() {
    for (auto& q : queues_) {
      q->drain();
    }
  }
  [[nodiscard]] int copies() const noexcept { return copies_.load(); }

 private:
  std::vector<std::unique_ptr<ordered_worker>> queues_;
  std::atomic<int> copies_{0};
};

std::unique_ptr<pool::resource> host_memory() {
  return std::make_unique<pool::host_resource>();
}

TEST(mpi_staging, a_failed_send_is_reported_by_check_naming_it) {
  host_queues queues(1);
  mpi_staging staging(process_group::single(), 1, queues, host_memory());
  std::vector<std::int32_t> src(16, 7);
  // A group of one has no rank 1: the send fails on the worker, after its copy.
  staging.send(0, src.data(), src.size() * 4, 1, 3, "a send of 64 B to device 1 of rank 1");
  staging.drain();
  EXPECT_EQ(queues.copies(), 1);
  try {
    staging.check();
    ADD_FAILURE() << "the failed send was not reported";
  } catch (const communication_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a send of 64 B to device 1 of rank 1: "), std::string::npos) << what;
    EXPECT_NE(what.find("peer 1"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(staging.check());  // reported once
  EXPECT_EQ(staging.staging_stats().in_use, 0U);
  EXPECT_EQ(staging.staging_stats().allocations, 1U);
}

TEST(mpi_staging, a_send_returns_before_its_data_is_ready) {
  host_queues queues(1);
  mpi_staging staging(process_group::single(), 1, queues, host_memory());
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  queues.queue(0).push([opened] { opened.wait(); });  // the data's producer, held back
  std::vector<std::int32_t> src(16, 7);
  // Returns with its copy enqueued behind the held work (a send that waited here would hang).
  staging.send(0, src.data(), src.size() * 4, 1, 0, "a held send");
  EXPECT_EQ(queues.copies(), 1);
  EXPECT_GT(staging.staging_stats().in_use, 0U);  // the staging waits with the send
  open.set_value();
  staging.drain();
  EXPECT_THROW(staging.check(), communication_error);  // a group of one has no rank 1
  EXPECT_EQ(staging.staging_stats().in_use, 0U);
}

TEST(mpi_staging, a_receive_that_cannot_be_made_throws_and_gives_back_its_staging) {
  host_queues queues(2);
  mpi_staging staging(process_group::single(), 2, queues, host_memory());
  std::vector<std::int32_t> dst(16, 0);
  EXPECT_THROW(staging.receive(1, dst.data(), 64, 1, 0, "a receive"), invalid_argument);
  EXPECT_THROW(staging.receive(2, dst.data(), 64, 1, 0, "a receive"), invalid_argument);
  staging.drain();
  EXPECT_EQ(queues.copies(), 0);  // nothing arrived, so nothing is copied to the device
  EXPECT_EQ(staging.staging_stats().in_use, 0U);
  EXPECT_NO_THROW(staging.check());
}

// One transfer of the plan every rank runs: `count` int32 from device `src_dev` of rank `src` to
// device `dst_dev` of rank `dst`.
struct planned {
  int src = 0;
  int src_dev = 0;
  int dst = 0;
  int dst_dev = 0;
  std::size_t count = 0;
};

std::int32_t payload(std::size_t k, std::size_t i) {
  return static_cast<std::int32_t>(k * 1000003 + i);
}

TEST(mpi_staging, a_random_plan_crosses_ranks_in_order) {
  const auto group = test_support::test_group();
  if (group->size() < 2) {
    GTEST_SKIP() << "moves data between ranks: ctest's darray.mpi tests run it under mpirun";
  }
  constexpr int devices = 2;
  const int ranks = group->size();
  const int me = group->rank();
  auto seed = test_support::test_seed(static_cast<std::uint64_t>(std::random_device{}()));
  group->broadcast(&seed, sizeof seed, 0);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::printf("mpi_staging seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  // Two large transfers both ways first (8 MiB: far beyond MPI's eager sizes), then a mix.
  std::vector<planned> plan{{0, 0, 1, 0, std::size_t{2} << 20}, {1, 0, 0, 0, std::size_t{2} << 20}};
  for (int k = 0; k < 60; ++k) {
    planned p;
    p.src = pick(0, ranks - 1);
    p.dst = (p.src + pick(1, ranks - 1)) % ranks;
    p.src_dev = pick(0, devices - 1);
    p.dst_dev = pick(0, devices - 1);
    const int size_class = pick(0, 2);
    p.count = size_class == 0   ? static_cast<std::size_t>(pick(1, 64))
              : size_class == 1 ? static_cast<std::size_t>(pick(1000, 100000))
                                : static_cast<std::size_t>(pick(1, 3)) << 18;
    plan.push_back(p);
  }
  host_queues queues(devices);
  std::vector<std::vector<std::int32_t>> sources(plan.size());
  std::vector<std::vector<std::int32_t>> received(plan.size());
  int mine = 0;
  {
    mpi_staging staging(group, devices, queues, host_memory());
    for (std::size_t k = 0; k < plan.size(); ++k) {
      const planned& p = plan[k];
      // As the backend tags them: one tag per pair of devices.
      const int tag = (p.src * devices + p.src_dev) * 64 + p.dst * devices + p.dst_dev;
      const std::string what = "transfer " + std::to_string(k);
      if (p.src == me) {
        sources[k].assign(p.count, -1);  // stale until the queue's work writes it
        auto* data = sources[k].data();
        const std::size_t count = p.count;
        const bool slow = k % 3 == 0;
        queues.queue(p.src_dev).push([data, count, k, slow] {
          if (slow) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
          for (std::size_t i = 0; i < count; ++i) {
            data[i] = payload(k, i);
          }
        });
        staging.send(p.src_dev, data, count * 4, p.dst, tag, what);
        ++mine;
      }
      if (p.dst == me) {
        received[k].assign(p.count, -2);
        staging.receive(p.dst_dev, received[k].data(), p.count * 4, p.src, tag, what);
        ++mine;
      }
    }
    staging.drain();
    queues.drain();
    EXPECT_NO_THROW(staging.check());
    EXPECT_EQ(staging.staging_stats().in_use, 0U);
  }
  EXPECT_EQ(queues.copies(), mine);
  for (std::size_t k = 0; k < plan.size(); ++k) {
    if (plan[k].dst != me) {
      continue;
    }
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < plan[k].count; ++i) {
      wrong += received[k][i] != payload(k, i) ? 1 : 0;
    }
    EXPECT_EQ(wrong, 0U) << "transfer " << k << " from rank " << plan[k].src;
  }
  group->barrier();
}

}  // namespace
}  // namespace poolscope::darray::detail
