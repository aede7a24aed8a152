// Helpers shared by the darray tests.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <memory>

#include "poolscope/darray/backend.hpp"
#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/darray/geometry.hpp"
#include "poolscope/darray/process_group.hpp"

namespace poolscope::darray::test_support {

/// The process group of the test program: MPI_COMM_WORLD when a launcher started it (mpirun: the
/// tests written for several ranks run on each, SPMD), else a group of one.
inline std::shared_ptr<process_group> test_group() {
  return process_group::from_launcher();
}

/// How the GPU tests written for several ranks move data between them:
/// POOLSCOPE_TEST_BETWEEN_RANKS (auto, nccl or mpi), else auto (backend_options' default).
inline rank_transport test_between_ranks() {
  const char* env = std::getenv("POOLSCOPE_TEST_BETWEEN_RANKS");
  return env != nullptr && *env != '\0' ? parse_rank_transport(env) : rank_transport::automatic;
}

/// Seed of the randomized tests: POOLSCOPE_TEST_SEED if set, else `fallback`.
inline std::uint64_t test_seed(std::uint64_t fallback = 20240611) {
  const char* env = std::getenv("POOLSCOPE_TEST_SEED");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : fallback;
}

// An event of no backend that completes when the test opens it: a queue waiting for it stays
// blocked, so what follows is checked while the events behind it are certainly pending.
class gate final : public detail::event_state {
 public:
  [[nodiscard]] bool ready() const override { return open_.load(); }
  void wait() const override {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return open_.load(); });
  }
  void open() {
    {
      const std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::atomic<bool> open_{false};
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
};

using point = std::vector<std::int64_t>;

/// The index set of a slice, by walking it (small slices only; safe up to the int64 limits).
inline std::set<std::int64_t> indices(const slice& s) {
  std::set<std::int64_t> out;
  for (std::int64_t i = s.start; i < s.stop; i += s.step) {
    out.insert(i);
    if (s.stop - i <= s.step) {
      break;  // the next step could overflow int64
    }
  }
  return out;
}

/// The element set of a box, by walking every axis with its step (small boxes only).
inline std::set<point> points(const box& b) {
  std::set<point> out;
  if (b.empty()) {
    return out;
  }
  point p(b.rank());
  const auto walk = [&](const auto& self, std::size_t axis) -> void {
    if (axis == b.rank()) {
      out.insert(p);
      return;
    }
    for (const std::int64_t i : indices(b.dims[axis])) {
      p[axis] = i;
      self(self, axis + 1);
    }
  };
  walk(walk, 0);
  return out;
}

/// a ** b of a signed integer type as backend.hpp states it, by repeated multiplication in 128
/// bits: exact, saturated to T's range; a negative exponent gives the real result truncated
/// toward zero (0 ** negative is +inf, saturated).
template <typename T>
T reference_pow(T a, T b) {
  __extension__ using wide = __int128;
  if (a == 0) {
    return b < 0 ? std::numeric_limits<T>::max() : static_cast<T>(b == 0 ? 1 : 0);
  }
  if (a == 1 || a == -1) {
    return static_cast<T>(b % 2 == 0 ? 1 : a);
  }
  if (b < 0) {
    return 0;  // |a ** b| < 1
  }
  // |a| ** b, stopped once past every value of T (|a| >= 2: within 64 multiplications).
  const wide cap = wide{1} << 64;
  wide r = 1;
  for (T i = 0; i < b && r <= cap; ++i) {
    r *= a < 0 ? -wide{a} : wide{a};
  }
  if (a < 0 && b % 2 != 0) {
    r = -r;
  }
  return static_cast<T>(
      std::clamp<wide>(r, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
}

/// The elements of `b` in a host array `h` of `shape`, in b's row-major order (what chunk_to_host
/// gives for a chunk of box b).
inline std::vector<std::int64_t> elements_of(const std::vector<std::int64_t>& h,
                                             const shape_t& shape, const box& b) {
  std::vector<std::int64_t> out;
  if (b.empty()) {
    return out;
  }
  out.reserve(static_cast<std::size_t>(b.size()));
  std::vector<std::int64_t> at(b.rank());
  for (std::size_t a = 0; a < b.rank(); ++a) {
    at[a] = b.dims[a].start;
  }
  while (true) {
    std::int64_t lin = 0;
    for (std::size_t a = 0; a < b.rank(); ++a) {
      lin = lin * shape[a] + at[a];
    }
    out.push_back(h[static_cast<std::size_t>(lin)]);
    std::size_t a = b.rank();
    while (a > 0) {
      --a;
      at[a] += b.dims[a].step;
      if (at[a] < b.dims[a].stop) {
        break;
      }
      at[a] = b.dims[a].start;
      if (a == 0) {
        return out;
      }
    }
  }
}

/// Every chunk of `x` this process holds against the host array `h` (chunk access, so a chunk
/// that is wrong where a replica on another chunk is right is caught).
inline void expect_chunks_match(const distributed_array<std::int64_t>& x,
                                const std::vector<std::int64_t>& h) {
  for (std::size_t k = 0; k < x.chunks().size(); ++k) {
    if (!x.handle().owner()->is_local(x.chunks()[k].device)) {
      continue;  // another rank's: that rank checks it
    }
    EXPECT_EQ(x.chunk_to_host(k), elements_of(h, x.shape(), x.chunks()[k].region))
        << "chunk " << k << " (device " << x.chunks()[k].device << ", box "
        << x.chunks()[k].region.to_string() << ")";
  }
}

/// Element i of the k-th piece rank r sends along expect_chain_transfers' chain.
inline std::int64_t chain_value(int r, int k, std::int64_t i) {
  return std::int64_t{r} * 1'000'000'000 + std::int64_t{k} * 100'000 + i;
}

/// backend::send() and receive() from two threads at once per rank: each rank's first device
/// receives `pieces` pieces from the previous rank's first device on one thread while another
/// thread sends as many to the next rank's, each piece of 1 to 65536 elements (so a middle rank's
/// transfer queue holds both threads' calls, interleaved in whatever order they come). The chain
/// is open: a receive waits only for ranks before it and a send only for ranks after, so no order
/// of the two threads' calls can deadlock. A ring could: with NCCL's sends, which wait until the
/// receiver's queue reaches the receive, or copies through CUDA IPC, whose receiver's queue waits
/// for the sender's copy, every rank's queue could wait at a receive whose send stands behind a
/// receive on its sender's queue. Every piece received is checked against chain_value(); a
/// failure on a thread is reported, not lost.
inline void expect_chain_transfers(const std::shared_ptr<backend>& be, int pieces) {
  const auto& g = *be->group();
  const int r = g.rank();
  const int dev = be->first_local_device();
  const auto elements = [](int k) { return 1 + (std::int64_t{k} * 7919) % 65536; };
  std::vector<std::shared_ptr<buffer>> sent;
  std::vector<std::shared_ptr<buffer>> received;
  std::mutex failures_lock;
  std::vector<std::string> failures;
  const auto guarded = [&](const char* what, auto&& body) {
    try {
      body();
    } catch (const std::exception& e) {
      const std::lock_guard lock(failures_lock);
      failures.push_back(std::string(what) + ": " + e.what());
    }
  };
  std::thread sender;
  std::thread receiver;
  if (r + 1 < g.size()) {
    sender = std::thread([&] {
      guarded("send", [&] {
        const int to = be->first_device_of(r + 1);
        for (int k = 0; k < pieces; ++k) {
          const std::int64_t n = elements(k);
          std::vector<std::int64_t> h(static_cast<std::size_t>(n));
          for (std::int64_t i = 0; i < n; ++i) {
            h[static_cast<std::size_t>(i)] = chain_value(r, k, i);
          }
          auto b = be->allocate(dev, static_cast<std::size_t>(n) * sizeof(std::int64_t));
          const view v = view::dense(b->data(), {n});
          be->upload(dev, dtype::i64, v, view::dense(h.data(), {n}));
          be->send(dev, dtype::i64, v, to);
          sent.push_back(std::move(b));  // kept until the queue has sent it (synchronize)
        }
      });
    });
  }
  if (r > 0) {
    receiver = std::thread([&] {
      guarded("receive", [&] {
        const int from = be->first_device_of(r - 1);
        for (int k = 0; k < pieces; ++k) {
          const std::int64_t n = elements(k);
          auto b = be->allocate(dev, static_cast<std::size_t>(n) * sizeof(std::int64_t));
          be->receive(dev, dtype::i64, view::dense(b->data(), {n}), from);
          received.push_back(std::move(b));
        }
      });
    });
  }
  if (sender.joinable()) {
    sender.join();
  }
  if (receiver.joinable()) {
    receiver.join();
  }
  guarded("synchronize", [&] { be->synchronize(); });
  for (const std::string& f : failures) {
    ADD_FAILURE() << "rank " << r << ", " << f;
  }
  if (!failures.empty()) {
    return;
  }
  ASSERT_EQ(received.size(), static_cast<std::size_t>(r > 0 ? pieces : 0));
  std::size_t wrong = 0;
  for (int k = 0; k < static_cast<int>(received.size()); ++k) {
    const std::int64_t n = elements(k);
    std::vector<std::int64_t> got(static_cast<std::size_t>(n));
    be->download(dev, dtype::i64, view::dense(got.data(), {n}),
                 view::dense(received[static_cast<std::size_t>(k)]->data(), {n}));
    for (std::int64_t i = 0; i < n; ++i) {
      if (got[static_cast<std::size_t>(i)] != chain_value(r - 1, k, i) && ++wrong <= 5) {
        ADD_FAILURE() << "rank " << r << ", piece " << k << " from rank " << r - 1 << ", element "
                      << i << ": " << got[static_cast<std::size_t>(i)] << ", not "
                      << chain_value(r - 1, k, i);
      }
    }
  }
  EXPECT_EQ(wrong, 0U) << "elements wrong on rank " << r;
}

}  // namespace poolscope::darray::test_support
