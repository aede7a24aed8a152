// ipc_links' decisions, on the CPU: which pairs of a group's GPUs CUDA IPC links (every rank
// fills its own rows and the group reduces them by minimum, so both ends of a piece agree), and
// the check of each piece's message against what its receiver expects. The transfers themselves
// run on GPUs (ranks_gpu_test.cpp, under mpirun: scripts/gpu-check.sh).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ipc_links.hpp"
#include "poolscope/error.hpp"

namespace poolscope::darray::detail {
namespace {

// What the group's reduction gives: each rank's table (its GPUs' rows from `can`, 1 elsewhere),
// the minimum over the ranks.
std::vector<std::int64_t> reduced(const std::vector<std::int64_t>& can,
                                  const std::vector<int>& rank_of) {
  const std::size_t n = rank_of.size();
  std::vector<std::int64_t> out(n * n, 1);
  int ranks = 0;
  for (const int r : rank_of) {
    ranks = std::max(ranks, r + 1);
  }
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t a = 0; a < n; ++a) {
      for (std::size_t b = 0; b < n; ++b) {
        const std::int64_t mine = rank_of[a] == r ? can[a * n + b] : 1;
        out[a * n + b] = std::min(out[a * n + b], mine);
      }
    }
  }
  return out;
}

TEST(ipc_links, pairs_need_both_ends_and_two_ranks) {
  // GPUs 0 and 1 of rank 0, GPU 2 of rank 1, GPU 3 of rank 2; rank 2 does not see GPU 0.
  const std::vector<int> rank_of{0, 0, 1, 2};
  std::vector<std::int64_t> can(16, 1);
  can[3 * 4 + 0] = 0;
  const auto pairs = ipc_pairs(reduced(can, rank_of), rank_of);
  const auto linked = [&](int a, int b) { return pairs[static_cast<std::size_t>(a * 4 + b)] != 0; };
  for (const auto& [a, b] : std::vector<std::pair<int, int>>{{0, 2}, {1, 2}, {1, 3}, {2, 3}}) {
    EXPECT_TRUE(linked(a, b)) << a << "->" << b;
    EXPECT_TRUE(linked(b, a)) << b << "->" << a;
  }
  EXPECT_FALSE(linked(0, 3));  // rank 2 cannot do its part, so rank 0 does not either
  EXPECT_FALSE(linked(3, 0));
  EXPECT_FALSE(linked(0, 1));  // one rank's GPUs: the process's own copies
  for (int a = 0; a < 4; ++a) {
    EXPECT_FALSE(linked(a, a));
  }
}

// Whatever each rank can do, the pairs are symmetric: a piece's sender and receiver agree.
TEST(ipc_links, pairs_are_the_same_seen_from_either_end) {
  std::mt19937 rng(20261129);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 2 + rng() % 7;
    std::vector<int> rank_of;
    int r = 0;
    for (std::size_t g = 0; g < n; ++g) {
      if (g > 0 && rng() % 2 == 0) {
        ++r;
      }
      rank_of.push_back(r);
    }
    std::vector<std::int64_t> can(n * n);
    for (auto& c : can) {
      c = rng() % 4 == 0 ? 0 : 1;
    }
    const auto pairs = ipc_pairs(reduced(can, rank_of), rank_of);
    for (std::size_t a = 0; a < n; ++a) {
      for (std::size_t b = 0; b < n; ++b) {
        EXPECT_EQ(pairs[a * n + b], pairs[b * n + a]);
        const bool want = rank_of[a] != rank_of[b] && can[a * n + b] != 0 && can[b * n + a] != 0;
        EXPECT_EQ(pairs[a * n + b] != 0, want) << a << "->" << b;
      }
    }
  }
}

TEST(ipc_links, a_table_of_another_size_is_refused) {
  try {
    (void)ipc_pairs(std::vector<std::int64_t>(5, 1), {0, 1});
    ADD_FAILURE() << "accepted";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("5 entries for 2 GPUs (expected 4)"), std::string::npos)
        << e.what();
  }
}

TEST(ipc_links, a_piece_out_of_step_is_named) {
  ipc_piece p;
  p.bytes = 4096;
  p.sequence = 3;
  EXPECT_EQ(ipc_mismatch(p, 4096, 3), "");
  EXPECT_EQ(ipc_mismatch(p, 4096, 2), "piece 3 of the pair arrived where piece 2 was expected");
  EXPECT_EQ(ipc_mismatch(p, 8192, 3), "a piece of 4096 bytes arrived where 8192 were expected");
}

}  // namespace
}  // namespace poolscope::darray::detail
