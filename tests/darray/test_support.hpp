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

}  // namespace poolscope::darray::test_support
