// Randomized sequences of reshards and ops (random maps with strided replicas, piece by piece
// or as one group, split or not; elementwise ops, reductions along an axis and whole) on host:2..4
// and the CUDA backend, every result and every chunk against a host reference. The same test
// runs under a launcher across ranks (see darray_random below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/error.hpp"
#include "test_support.hpp"

namespace poolscope::darray {
namespace {

using i64 = std::int64_t;

// A random map of `shape` over `devices`: a partition along a random axis (so every element is
// covered), plus random strided replicas.
index_map random_map(std::mt19937_64& rng, const shape_t& shape, int devices) {
  auto pick = [&](i64 lo, i64 hi) { return std::uniform_int_distribution<i64>(lo, hi)(rng); };
  index_map m;
  const auto axis = static_cast<std::size_t>(pick(0, static_cast<i64>(shape.size()) - 1));
  const i64 parts = pick(1, std::min<i64>(4, shape[axis]));
  std::vector<i64> cuts{0, shape[axis]};
  while (static_cast<i64>(cuts.size()) < parts + 1) {
    cuts.push_back(pick(1, shape[axis] - 1));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  }
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    box b = box::full(shape);
    b.dims[axis] = slice{cuts[i], cuts[i + 1]};
    m.add(static_cast<int>(pick(0, devices - 1)), b);
  }
  const i64 replicas = pick(0, 2);
  for (i64 r = 0; r < replicas; ++r) {
    box b;
    for (i64 extent : shape) {
      const i64 start = pick(0, extent - 1);
      const i64 stop = pick(start + 1, extent);
      b.dims.push_back(slice{start, stop, pick(1, 3)});
    }
    m.add(static_cast<int>(pick(0, devices - 1)), b);
  }
  return m;
}

// The same randomized sequences on host:2..4 and, when GPUs are present, on the CUDA backend;
// under a launcher (mpirun -np 2, 3: ctest's darray.mpi tests) each spec is every rank's, the maps
// spread over the devices of every rank, and each rank checks its chunks and what to_host
// gathers against the same host reference (the seed is rank 0's).
class darray_random : public ::testing::TestWithParam<std::string> {};

TEST_P(darray_random, reshards_and_ops_match_the_host) {
  std::shared_ptr<backend> be;
  // "<spec>+issue": every device's share of an elementwise op from a thread of its own;
  // "<spec>+noissue": all from the calling thread; "<spec>+nographs": kernels launched plainly.
  std::string spec = GetParam();
  backend_options options;
  options.group = test_support::test_group();
  options.between_ranks = test_support::test_between_ranks();
  if (spec.ends_with("+nographs")) {
    spec.resize(spec.size() - 9);
    options.kernel_graphs = false;
  }
  if (spec.ends_with("+issue")) {
    spec.resize(spec.size() - 6);
    options.issue_threads = 8;
  } else if (spec.ends_with("+noissue")) {
    spec.resize(spec.size() - 8);
    options.issue_threads = 0;
  }
  try {
    be = make_backend(spec, options);
    if (options.issue_threads > 0) {
      ASSERT_EQ(be->issue_threads(), static_cast<std::size_t>(be->local_device_count() - 1));
    }
  } catch (const device_unavailable& e) {
    GTEST_SKIP() << "no GPU for " << GetParam() << ": " << e.what();
  }
  const int devices = be->device_count();
  // POOLSCOPE_TEST_SEED replays a printed seed; without it every run draws a new one.
  auto seed = std::getenv("POOLSCOPE_TEST_SEED") != nullptr
                  ? test_support::test_seed()
                  : static_cast<std::uint64_t>(std::random_device{}()) ^
                        (static_cast<std::uint64_t>(devices) << 32);
  be->group()->broadcast(&seed, sizeof seed, 0);  // every rank plays rank 0's sequence
  SCOPED_TRACE("seed " + std::to_string(seed) + " (" + be->name() + ")");
  std::printf("darray_random seed %llu on %s\n", static_cast<unsigned long long>(seed),
              be->name().c_str());
  std::mt19937_64 rng(seed);
  auto pick = [&](i64 lo, i64 hi) { return std::uniform_int_distribution<i64>(lo, hi)(rng); };
  const bool verbose = std::getenv("POOLSCOPE_TEST_VERBOSE") != nullptr;
  // Pieces that took a region another destination chunk on their device received (overlapping
  // destination chunks: the region crossed once).
  std::size_t reused = 0;
  const auto count_reused = [&](const array_handle& h) {
    for (const piece& p : h.last_reshard().plan->pieces) {
      reused += p.from_dst ? 1 : 0;
    }
  };
  for (int round = 0; round < 12; ++round) {
    shape_t shape;
    const i64 rank = pick(1, 3);
    for (i64 r = 0; r < rank; ++r) {
      shape.push_back(pick(1, rank == 1 ? 40 : 9));
    }
    const i64 count = element_count(shape);
    std::vector<i64> hx(static_cast<std::size_t>(count)), hy(hx.size());
    for (std::size_t i = 0; i < hx.size(); ++i) {
      hx[i] = pick(-50, 50);
      hy[i] = pick(-50, 50);
    }
    auto x = distributed_array<i64>::from_host(be, hx, shape, random_map(rng, shape, devices));
    auto y = distributed_array<i64>::from_host(be, hy, shape, random_map(rng, shape, devices));
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE("round " + std::to_string(round) + " step " + std::to_string(step) + " x " +
                   x.index_map().to_string() + " y " + y.index_map().to_string());
      const i64 what = pick(0, 5);
      if (verbose) {  // which step a hang or a crash stopped at
        std::fprintf(stderr, "round %d step %d op %lld x %s y %s\n", round, step,
                     static_cast<long long>(what), x.index_map().to_string().c_str(),
                     y.index_map().to_string().c_str());
      }
      switch (what) {
        case 0: {
          // Piece by piece or as one group (NCCL on GPUs), split or not.
          x = x.reshard(random_map(rng, shape, devices),
                        {.how = pick(0, 1) == 1 ? transport::nccl : transport::automatic,
                         .split_bytes = pick(0, 1) * 64});
          count_reused(x.handle());
          break;
        }
        case 1: {
          x = x + y;
          count_reused(x.handle());
          for (std::size_t i = 0; i < hx.size(); ++i) {
            hx[i] += hy[i];
          }
          break;
        }
        case 2: {
          x = y * x - i64{3};
          for (std::size_t i = 0; i < hx.size(); ++i) {
            hx[i] = hy[i] * hx[i] - 3;
          }
          break;
        }
        case 3: {
          const auto moved = y.reshard(random_map(rng, shape, devices));
          count_reused(moved.handle());
          test_support::expect_chunks_match(moved, hy);
          ASSERT_FALSE(HasFailure());
          x = maximum(-x, moved);
          for (std::size_t i = 0; i < hx.size(); ++i) {
            hx[i] = std::max(-hx[i], hy[i]);
          }
          break;
        }
        case 4: {
          const auto axis = static_cast<std::size_t>(pick(0, rank - 1));
          auto s = sum(x, axis);
          shape_t rs = shape;
          rs.erase(rs.begin() + static_cast<std::ptrdiff_t>(axis));
          std::vector<i64> want(static_cast<std::size_t>(element_count(rs)), 0);
          // Row-major index arithmetic for the reference.
          std::vector<i64> idx(shape.size(), 0);
          for (std::size_t lin = 0; lin < hx.size(); ++lin) {
            i64 rem = static_cast<i64>(lin);
            for (std::size_t d = shape.size(); d-- > 0;) {
              idx[d] = rem % shape[d];
              rem /= shape[d];
            }
            i64 out = 0;
            for (std::size_t d = 0; d < shape.size(); ++d) {
              if (d != axis) {
                out = out * shape[d] + idx[d];
              }
            }
            want[static_cast<std::size_t>(out)] += hx[lin];
          }
          ASSERT_EQ(s.to_host(), want);
          ASSERT_EQ(s.change_mode(array_mode::replica).to_host(), want);
          break;
        }
        default: {
          auto total = max(x);
          ASSERT_EQ(total.to_host(), std::vector<i64>{*std::max_element(hx.begin(), hx.end())});
          break;
        }
      }
      ASSERT_EQ(x.to_host(), hx);
      test_support::expect_chunks_match(x,
                                        hx);  // each replica, not only the last one to_host writes
      ASSERT_FALSE(HasFailure());
    }
  }
  std::printf("darray_random: %zu pieces took a region another chunk on their device received\n",
              reused);
  be->synchronize();
}

INSTANTIATE_TEST_SUITE_P(backends, darray_random,
                         ::testing::Values("host:2", "host:3", "host:4", "host:3+issue", "cuda",
                                           "cuda:1", "cuda+issue", "cuda+nographs"),
                         [](const auto& p) {
                           std::string name = p.param;
                           std::erase(name, ':');
                           std::replace(name.begin(), name.end(), '+', '_');
                           return name;
                         });

}  // namespace
}  // namespace poolscope::darray
