// mpi_staging (darray/src/mpi_staging.hpp), the CUDA backend's way between ranks by MPI, driven
// here through host queues standing in for the GPUs' transfer streams: each copy runs on its
// device's queue after the work enqueued there before it, as cudaMemcpyAsync on a stream does.
// Under mpirun (ctest's darray.mpi tests) the ranks run one random plan of transfers between
// two devices each, small and large (beyond MPI's eager sizes), each source written by queue
// work enqueued just before its send (so a copy made before its queue reached it would send
// stale bytes); every received byte is checked, and the ranks' traces merge into a flow per
// transfer (the slices `poolscope trace merge` joins, as on host devices). A receive returns
// before its peer sends. Alone: a send returns while its data is not yet ready on the queue; a
// send or receive that fails is reported by check(), naming it (a failed receive still opens its
// gate); either way the staging goes back to the pool. In chunks: every chunk of a piece moves and
// lands in order (the random plan in chunks that do not divide its sizes), a chunk reaches the
// device while the later chunks of its piece are still held on the sender, and a chunk that
// fails is named with its piece.
#include "mpi_staging.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "ordered_worker.hpp"
#include "poolscope/analysis/trace_merge.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/profiler/distributed_info.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "test_support.hpp"

namespace poolscope::darray::detail {
namespace {

// Host stand-ins for the transfer streams of `devices` devices: in-order queues of their own. A
// gated upload holds its queue until its gate opens, as cuStreamWaitValue32 holds a stream.
class host_queues final : public mpi_staging::device_copies {
 public:
  explicit host_queues(int devices) {
    for (int d = 0; d < devices; ++d) {
      queues_.push_back(std::make_unique<ordered_worker>("queue " + std::to_string(d)));
    }
  }
  [[nodiscard]] std::function<void()> enqueue_download(int device, void* to, const void* from,
                                                       std::size_t bytes) override {
    return enqueue(device, to, from, bytes, nullptr);
  }
  [[nodiscard]] std::function<void()> enqueue_gated_upload(int device, void* to, const void* from,
                                                           std::size_t bytes,
                                                           std::uint32_t* gate) override {
    return enqueue(device, to, from, bytes, gate);
  }
  ordered_worker& queue(int device) { return *queues_.at(static_cast<std::size_t>(device)); }
  void drain() {
    for (auto& q : queues_) {
      q->drain();
    }
  }
  [[nodiscard]] int copies() const noexcept { return copies_.load(); }
  [[nodiscard]] int copies_run() const noexcept { return copies_run_.load(); }

 private:
  std::function<void()> enqueue(int device, void* to, const void* from, std::size_t bytes,
                                std::uint32_t* gate) {
    auto done = std::make_shared<std::promise<void>>();
    std::shared_future<void> finished = done->get_future().share();
    queue(device).push([this, to, from, bytes, gate, done] {
      if (gate != nullptr) {
        std::atomic_ref<std::uint32_t>(*gate).wait(0, std::memory_order_acquire);
      }
      std::memcpy(to, from, bytes);
      ++copies_run_;
      done->set_value();
    });
    ++copies_;
    return [finished] { finished.wait(); };
  }

  std::atomic<int> copies_{0};
  std::atomic<int> copies_run_{0};
  std::vector<std::unique_ptr<ordered_worker>> queues_;  // last: their jobs count copies_run_
};

// A transfer's slice: from device `from` to device `to` of another rank (numbers over every rank).
detail::transfer_ends traced(bool sending, int from, int to, std::size_t bytes) {
  return rank_transfer_ends(sending, sending ? from : to, sending ? to : from, bytes);
}

std::int32_t payload(std::size_t k, std::size_t i) {
  return static_cast<std::int32_t>(k * 1000003 + i);
}

std::unique_ptr<pool::resource> host_memory() {
  return std::make_unique<pool::host_resource>();
}

TEST(mpi_staging, a_failed_send_is_reported_by_check_naming_it) {
  host_queues queues(1);
  mpi_staging staging(process_group::single(), 1, queues, host_memory());
  std::vector<std::int32_t> src(16, 7);
  // A group of one has no rank 1: the send fails on the worker, after its copy.
  staging.send(0, src.data(), src.size() * 4, 1, 3, traced(true, 0, 1, 64),
               "a send of 64 B to device 1 of rank 1");
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
  staging.send(0, src.data(), src.size() * 4, 1, 0, traced(true, 0, 1, 64), "a held send");
  EXPECT_EQ(queues.copies(), 1);
  EXPECT_GT(staging.staging_stats().in_use, 0U);  // the staging waits with the send
  open.set_value();
  staging.drain();
  EXPECT_THROW(staging.check(), communication_error);  // a group of one has no rank 1
  EXPECT_EQ(staging.staging_stats().in_use, 0U);
}

TEST(mpi_staging, a_receive_of_no_device_of_this_process_is_refused_where_it_is_issued) {
  host_queues queues(2);
  mpi_staging staging(process_group::single(), 2, queues, host_memory());
  std::vector<std::int32_t> dst(16, 0);
  EXPECT_THROW(staging.receive(2, dst.data(), 64, 1, 0, traced(false, 2, 0, 64), "a receive"),
               invalid_argument);
  EXPECT_THROW(staging.receive(-1, dst.data(), 64, 1, 0, traced(false, 2, 0, 64), "a receive"),
               invalid_argument);
  staging.drain();
  EXPECT_EQ(queues.copies(), 0);
  EXPECT_EQ(staging.staging_stats().in_use, 0U);
  EXPECT_NO_THROW(staging.check());
}

// A receive that fails still opens its gate, so the queue behind it goes on (the copy moves stale
// bytes); the failure is reported by check(), naming the receive, and the staging goes back.
TEST(mpi_staging, a_failed_receive_opens_its_gate_and_is_reported_by_check) {
  host_queues queues(1);
  mpi_staging staging(process_group::single(), 1, queues, host_memory());
  std::vector<std::int32_t> dst(16, 0);
  // A group of one has no rank 1: the receive fails on its worker.
  staging.receive(0, dst.data(), 64, 1, 0, traced(false, 1, 0, 64),
                  "a receive of 64 B from device 1 of rank 1");
  bool behind = false;
  queues.queue(0).push([&behind] { behind = true; });  // work ordered after the piece
  staging.drain();
  queues.drain();
  EXPECT_TRUE(behind);
  EXPECT_EQ(queues.copies_run(), 1);
  try {
    staging.check();
    ADD_FAILURE() << "the failed receive was not reported";
  } catch (const communication_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a receive of 64 B from device 1 of rank 1: "), std::string::npos) << what;
    EXPECT_NE(what.find("peer 1"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(staging.check());
  EXPECT_EQ(staging.staging_stats().in_use, 0U);
}

// Each chunk of a receive that fails opens its gate: the queue moves every chunk (stale bytes) and
// goes on; check() names the piece and the first chunk that failed.
TEST(mpi_staging, a_failed_chunked_receive_opens_every_gate_and_names_its_chunk) {
  host_queues queues(1);
  mpi_staging staging(process_group::single(), 1, queues, host_memory(), {}, 1024);
  std::vector<std::int32_t> dst(1000, 0);  // 4000 B: chunks of 1024, 1024, 1024 and 928 B
  EXPECT_EQ(staging.chunks(4000), 4U);
  staging.receive(0, dst.data(), 4000, 1, 0, traced(false, 1, 0, 4000), "a receive of 4000 B");
  bool behind = false;
  queues.queue(0).push([&behind] { behind = true; });
  staging.drain();
  queues.drain();
  EXPECT_TRUE(behind);
  EXPECT_EQ(queues.copies_run(), 4);
  try {
    staging.check();
    ADD_FAILURE() << "the failed receive was not reported";
  } catch (const communication_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a receive of 4000 B (chunk 1 of 4): "), std::string::npos) << what;
  }
  EXPECT_EQ(staging.staging_stats().in_use, 0U);
  EXPECT_EQ(staging.staging_stats().allocations, 1U);  // one staging for the piece
}

// The issuing thread does not wait for a receive's peer: rank 0 issues a receive from rank 1 and
// enqueues work behind it, then passes a barrier that rank 1 enters before it sends (a receive
// that waited for its bytes where it was issued would never reach the barrier). Meanwhile the
// piece's copy waits at its gate and another queue's work (compute on what is in place) runs.
TEST(mpi_staging, a_receive_returns_before_its_peer_sends) {
  const auto group = test_support::test_group();
  if (group->size() < 2) {
    GTEST_SKIP() << "moves data between ranks: ctest's darray.mpi tests run it under mpirun";
  }
  const int me = group->rank();
  constexpr std::size_t count = std::size_t{1} << 20;  // 4 MiB: beyond MPI's eager sizes
  host_queues queues(2);
  std::vector<std::int32_t> data(count, me == 0 ? -1 : 0);
  {
    mpi_staging staging(group, 2, queues, host_memory());
    if (me == 0) {
      staging.receive(0, data.data(), count * 4, 1, 5, traced(false, 2, 0, count * 4), "piece");
      std::promise<void> ran;
      queues.queue(1).push([&ran] { ran.set_value(); });
      ran.get_future().wait();  // the other queue runs while the piece is on its way
      EXPECT_EQ(queues.copies_run(), 0);
      EXPECT_EQ(data.front(), -1);
    }
    group->barrier();
    if (me == 1) {
      for (std::size_t i = 0; i < count; ++i) {
        data[i] = payload(7, i);
      }
      staging.send(0, data.data(), count * 4, 0, 5, traced(true, 2, 0, count * 4), "piece");
    }
    staging.drain();
    queues.drain();
    EXPECT_NO_THROW(staging.check());
  }
  if (me == 0) {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      wrong += data[i] != payload(7, i) ? 1 : 0;
    }
    EXPECT_EQ(wrong, 0U);
  }
  group->barrier();
}

// Host queues whose copies to the host after the first are held: their waits return only once
// release() is called, so a sender's worker sends the first chunk of a piece and then waits.
class held_downloads final : public mpi_staging::device_copies {
 public:
  explicit held_downloads(host_queues& queues) : queues_(queues) {}
  [[nodiscard]] std::function<void()> enqueue_download(int device, void* to, const void* from,
                                                       std::size_t bytes) override {
    auto done = queues_.enqueue_download(device, to, from, bytes);
    if (downloads_++ == 0) {
      return done;
    }
    return [done = std::move(done), released = released_] {
      released.wait();
      done();
    };
  }
  [[nodiscard]] std::function<void()> enqueue_gated_upload(int device, void* to, const void* from,
                                                           std::size_t bytes,
                                                           std::uint32_t* gate) override {
    return queues_.enqueue_gated_upload(device, to, from, bytes, gate);
  }
  void release() { release_.set_value(); }

 private:
  host_queues& queues_;
  int downloads_ = 0;
  std::promise<void> release_;
  std::shared_future<void> released_ = release_.get_future().share();
};

// A piece's chunks pipeline: rank 1 sends a piece of four chunks whose later chunks it holds on
// its host queue; rank 0's first chunk reaches its device meanwhile (a piece moved whole would
// land all at once, or not at all). Then rank 1 lets the rest go and the whole piece lands.
TEST(mpi_staging, a_chunk_lands_while_the_later_chunks_of_its_piece_are_held) {
  const auto group = test_support::test_group();
  if (group->size() < 2) {
    GTEST_SKIP() << "moves data between ranks: ctest's darray.mpi tests run it under mpirun";
  }
  const int me = group->rank();
  constexpr std::size_t chunk = std::size_t{64} << 10;  // beyond MPI's eager sizes
  constexpr std::size_t count = chunk;                  // int32: four chunks
  host_queues queues(1);
  held_downloads copies(queues);
  std::vector<std::int32_t> data(count, -1);
  {
    mpi_staging staging(group, 1, copies, host_memory(), {}, chunk);
    ASSERT_EQ(staging.chunks(count * 4), 4U);
    if (me == 1) {
      for (std::size_t i = 0; i < count; ++i) {
        data[i] = payload(3, i);
      }
      staging.send(0, data.data(), count * 4, 0, 9, traced(true, 1, 0, count * 4), "piece");
    } else if (me == 0) {
      staging.receive(0, data.data(), count * 4, 1, 9, traced(false, 1, 0, count * 4), "piece");
      // A bound, not a timing: the first chunk lands at once unless the chunks do not pipeline.
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (queues.copies_run() == 0 && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_EQ(queues.copies_run(), 1) << "the first chunk did not land alone";
      std::size_t first_wrong = 0;
      std::size_t rest_landed = 0;
      for (std::size_t i = 0; i < count; ++i) {
        if (i < count / 4) {
          first_wrong += data[i] != payload(3, i) ? 1 : 0;
        } else {
          rest_landed += data[i] != -1 ? 1 : 0;
        }
      }
      EXPECT_EQ(first_wrong, 0U);
      EXPECT_EQ(rest_landed, 0U);
    }
    group->barrier();
    if (me == 1) {
      copies.release();
    }
    staging.drain();
    queues.drain();
    EXPECT_NO_THROW(staging.check());
  }
  if (me == 0) {
    EXPECT_EQ(queues.copies_run(), 4);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      wrong += data[i] != payload(3, i) ? 1 : 0;
    }
    EXPECT_EQ(wrong, 0U);
  }
  group->barrier();
}

// This rank's timeline (no CUPTI) with its distributedInfo and clock samples, as the demo's, into
// a file of its own; merge() joins every rank's on rank 0 (collective).
struct rank_trace {
  explicit rank_trace(process_group& g)
      : group(g),
        path((std::filesystem::temp_directory_path() /
              ("poolscope_mpi_staging_" + std::to_string(::getpid()) + ".json"))
                 .string()),
        tl(options(g, path)) {
    tl.start();
    tl.add_clock_sync("start", profiler::sample_barriers([this] { group.barrier(); }));
  }
  static profiler::timeline_options options(const process_group& g, const std::string& path) {
    profiler::timeline_options o;
    o.trace_path = path;
    o.cupti = false;
    o.distributed = profiler::distributed_info{.rank = g.rank(), .world_size = g.size()};
    return o;
  }
  // "N flows, M unmatched" as rank 0's merge found them (every rank gets it), or its error.
  std::string merge() {
    tl.add_clock_sync("end", profiler::sample_barriers([this] { group.barrier(); }));
    tl.stop();
    const std::vector<std::string> paths = group.all_gather(path);
    std::string found;
    if (group.rank() == 0) {
      const std::string out = path + ".merged.json";
      try {
        const auto r = analysis::merge_traces(paths, out);
        found = std::to_string(r.flows + r.pairs_within_clock_error) + " joined, " +
                std::to_string(r.unmatched_transfers) + " unmatched";
      } catch (const std::exception& e) {
        found = e.what();
      }
      std::filesystem::remove(out);
    }
    found = group.all_gather(found).front();
    std::filesystem::remove(path);
    return found;
  }

  process_group& group;
  std::string path;
  profiler::timeline tl;
};

// One transfer of the plan every rank runs: `count` int32 from device `src_dev` of rank `src` to
// device `dst_dev` of rank `dst`.
struct planned {
  int src = 0;
  int src_dev = 0;
  int dst = 0;
  int dst_dev = 0;
  std::size_t count = 0;
};

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
  // Chunks that divide none of the large sizes; small ones move whole.
  constexpr std::size_t chunk = 96 * 1024 + 4;
  const auto chunks_of = [&](std::size_t bytes) {
    return bytes <= chunk ? 1 : (bytes + chunk - 1) / chunk;
  };
  std::size_t mine = 0;
  rank_trace trace(*group);
  {
    mpi_staging staging(
        group, devices, queues, host_memory(), [&trace] { return &trace.tl; }, chunk);
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
        staging.send(
            p.src_dev, data, count * 4, p.dst, tag,
            traced(true, p.src * devices + p.src_dev, p.dst * devices + p.dst_dev, count * 4),
            what);
        mine += chunks_of(p.count * 4);
      }
      if (p.dst == me) {
        received[k].assign(p.count, -2);
        staging.receive(
            p.dst_dev, received[k].data(), p.count * 4, p.src, tag,
            traced(false, p.src * devices + p.src_dev, p.dst * devices + p.dst_dev, p.count * 4),
            what);
        mine += chunks_of(p.count * 4);
      }
    }
    staging.drain();
    queues.drain();
    EXPECT_NO_THROW(staging.check());
    EXPECT_EQ(staging.staging_stats().in_use, 0U);
  }
  EXPECT_EQ(static_cast<std::size_t>(queues.copies()), mine);
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
  // Every transfer crosses two ranks: its send is joined to its receive once (not once per
  // chunk), by a flow, or without one where their order is within the error of their clocks'
  // alignment (ranks of two hosts).
  const std::string merged = trace.merge();
  EXPECT_EQ(merged, std::to_string(plan.size()) + " joined, 0 unmatched");
}

}  // namespace
}  // namespace poolscope::darray::detail
