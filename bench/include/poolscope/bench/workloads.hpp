// Allocation workloads shared by `poolscope bench alloc`, poolscope_bench_alloc and
// `poolscope demo`: size distributions and traces (ordered alloc/free operations on numbered
// slots) that any allocator or resource can replay.
//
//   auto t = poolscope::bench::sequence_batch_trace(poolscope::bench::sequence_model{}, 5, seed);
//   for (const auto& op : t.ops) {
//     if (op.is_free) pool.deallocate(s, live[op.slot], op.bytes);
//     else live[op.slot] = pool.allocate(s, op.bytes);
//   }
//
// Determinism: every generator is a pure function of its arguments (std::mt19937_64 seeded with
// `seed`), so a test can regenerate exactly the trace a command ran.
// Thread safety: pure functions; traces are plain values.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace poolscope::bench {

/// Sizes whose logarithm is uniform over [log lo, log hi] (A2: 512 B - 64 MiB).
class log_uniform_sizes {
 public:
  /// Requires 0 < lo <= hi.
  log_uniform_sizes(std::size_t lo, std::size_t hi);
  /// One size in [lo, hi].
  template <typename Rng>
  [[nodiscard]] std::size_t operator()(Rng& rng) const {
    std::uniform_real_distribution<double> d(log_lo_, log_hi_);
    const auto v = static_cast<std::size_t>(std::llround(std::exp(d(rng))));
    return v < lo_ ? lo_ : (v > hi_ ? hi_ : v);
  }
  [[nodiscard]] std::size_t lo() const noexcept { return lo_; }
  [[nodiscard]] std::size_t hi() const noexcept { return hi_; }

 private:
  std::size_t lo_;
  std::size_t hi_;
  double log_lo_;
  double log_hi_;
};

/// One operation of a trace: allocate `bytes` into `slot`, or free the block in `slot`
/// (`bytes` then repeats the size it was allocated with).
struct trace_op {
  std::uint32_t slot = 0;
  bool is_free = false;
  std::size_t bytes = 0;
};

/// An ordered list of operations. Every slot is allocated before it is freed, holds at most one
/// live block at a time, and every allocated block is freed by the end.
struct trace {
  std::vector<trace_op> ops;
  std::size_t slots = 0;               ///< slot numbers are < slots
  std::vector<std::size_t> step_ends;  ///< ops[step_ends[k-1] .. step_ends[k]) is step k
  std::string description;
};

/// A small transformer's training step, for the "sequence batch" workload (A5). Per step a
/// length L is drawn uniformly from [min_len, max_len]; each layer allocates activations of
/// batch*L*hidden*4 bytes (and 3x, 4x that for qkv and the MLP) and attention scores of
/// batch*heads*L*L*4 bytes, in forward order; the backward pass allocates gradient temporaries and
/// frees each layer's activations in reverse order. Weights (12*hidden^2*4 bytes per layer) are
/// allocated before the first step and freed after the last.
struct sequence_model {
  std::size_t batch = 4;
  std::size_t hidden = 1024;
  std::size_t heads = 8;
  std::size_t layers = 6;
  std::size_t min_len = 32;
  std::size_t max_len = 2048;
};

/// The A5 trace: `steps` training steps of `model` (step 0 also allocates the weights, the last
/// step also frees them).
[[nodiscard]] trace sequence_batch_trace(const sequence_model& model, std::size_t steps,
                                         std::uint64_t seed);

/// A random mix: `live` blocks of log-uniform sizes in [lo, hi] are allocated, then `pairs` times
/// a random live block is freed and a new one allocated in its place, then everything is freed.
/// step_ends: the fill, the pairs, the drain.
[[nodiscard]] trace random_mix_trace(std::size_t live, std::size_t pairs, std::size_t lo,
                                     std::size_t hi, std::uint64_t seed);

/// `a` followed by `b` (b's slots renumbered after a's; step ends concatenated).
[[nodiscard]] trace concat(trace a, const trace& b);

/// The largest sum of live requested bytes at any point of `t` (what an allocator's
/// peak_requested must equal after replaying it).
[[nodiscard]] std::size_t peak_live_bytes(const trace& t);

/// What `poolscope demo` replays on every strategy: `steps` sequence-batch steps of a model sized
/// for the memory kind (small on host, where the demo writes every block) followed by a random
/// mix of steps*100 pairs over 64 live blocks.
struct demo_plan {
  sequence_model model;
  std::size_t mix_live = 64;
  std::size_t mix_pairs = 0;
  std::size_t mix_lo = 256;
  std::size_t mix_hi = 0;
};
/// The plan for `steps` steps on device memory (`on_device`) or host memory.
[[nodiscard]] demo_plan make_demo_plan(bool on_device, std::size_t steps);
/// The plan's trace.
[[nodiscard]] trace demo_trace(const demo_plan& plan, std::size_t steps, std::uint64_t seed);

}  // namespace poolscope::bench
