#include "poolscope/bench/workloads.hpp"

#include <algorithm>

#include "poolscope/error.hpp"

namespace poolscope::bench {

log_uniform_sizes::log_uniform_sizes(std::size_t lo, std::size_t hi)
    : lo_(lo),
      hi_(hi),
      log_lo_(std::log(static_cast<double>(lo))),
      log_hi_(std::log(static_cast<double>(hi))) {
  if (lo == 0 || hi < lo) {
    throw invalid_argument("poolscope::bench::log_uniform_sizes: bad range [" + std::to_string(lo) +
                           ", " + std::to_string(hi) + "]");
  }
}

namespace {

/// Builds a trace; hands out fresh slots and remembers each slot's size.
class trace_builder {
 public:
  std::uint32_t alloc(std::size_t bytes) {
    const auto slot = static_cast<std::uint32_t>(sizes_.size());
    sizes_.push_back(bytes);
    t_.ops.push_back({slot, false, bytes});
    return slot;
  }
  void alloc_into(std::uint32_t slot, std::size_t bytes) {
    if (slot >= sizes_.size()) {
      sizes_.resize(slot + 1, 0);
    }
    sizes_[slot] = bytes;
    t_.ops.push_back({slot, false, bytes});
  }
  void free(std::uint32_t slot) { t_.ops.push_back({slot, true, sizes_[slot]}); }
  void end_step() { t_.step_ends.push_back(t_.ops.size()); }
  trace take(std::string description) {
    t_.slots = sizes_.size();
    t_.description = std::move(description);
    return std::move(t_);
  }

 private:
  trace t_;
  std::vector<std::size_t> sizes_;
};

}  // namespace

trace sequence_batch_trace(const sequence_model& m, std::size_t steps, std::uint64_t seed) {
  if (m.min_len == 0 || m.max_len < m.min_len || m.batch == 0 || m.hidden == 0 || m.heads == 0 ||
      m.layers == 0) {
    throw invalid_argument("poolscope::bench::sequence_batch_trace: bad model");
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> len(m.min_len, m.max_len);
  trace_builder b;
  std::vector<std::uint32_t> weights;
  constexpr std::size_t f32 = 4;
  for (std::size_t step = 0; step < steps; ++step) {
    const std::size_t L = len(rng);
    if (step == 0) {
      for (std::size_t l = 0; l < m.layers; ++l) {
        weights.push_back(b.alloc(12 * m.hidden * m.hidden * f32));
      }
    }
    const std::size_t act = m.batch * L * m.hidden * f32;
    const std::size_t scores = m.batch * m.heads * L * L * f32;
    std::vector<std::vector<std::uint32_t>> kept(m.layers);
    for (std::size_t l = 0; l < m.layers; ++l) {
      auto& k = kept[l];
      k.push_back(b.alloc(act));      // layer-norm output
      k.push_back(b.alloc(3 * act));  // q, k, v
      const auto s = b.alloc(scores);
      k.push_back(b.alloc(scores));  // softmax(scores), kept for backward
      b.free(s);
      k.push_back(b.alloc(act));      // attention output
      k.push_back(b.alloc(act));      // projection
      k.push_back(b.alloc(4 * act));  // MLP in
      k.push_back(b.alloc(4 * act));  // activation
      k.push_back(b.alloc(act));      // MLP out
    }
    const auto loss = b.alloc(m.batch * L * f32);
    b.free(loss);
    const auto grad = b.alloc(act);
    for (std::size_t l = m.layers; l-- > 0;) {
      const auto g_mlp = b.alloc(4 * act);
      b.free(g_mlp);
      const auto g_scores = b.alloc(scores);
      b.free(g_scores);
      for (auto it = kept[l].rbegin(); it != kept[l].rend(); ++it) {
        b.free(*it);
      }
    }
    b.free(grad);
    if (step + 1 == steps) {
      for (auto it = weights.rbegin(); it != weights.rend(); ++it) {
        b.free(*it);
      }
    }
    b.end_step();
  }
  return b.take("sequence batches: " + std::to_string(steps) + " steps, L in [" +
                std::to_string(m.min_len) + ", " + std::to_string(m.max_len) + "], batch " +
                std::to_string(m.batch) + ", hidden " + std::to_string(m.hidden) + ", heads " +
                std::to_string(m.heads) + ", layers " + std::to_string(m.layers));
}

trace random_mix_trace(std::size_t live, std::size_t pairs, std::size_t lo, std::size_t hi,
                       std::uint64_t seed) {
  if (live == 0) {
    throw invalid_argument("poolscope::bench::random_mix_trace: live must be > 0");
  }
  const log_uniform_sizes size(lo, hi);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> pick(0, static_cast<std::uint32_t>(live - 1));
  trace_builder b;
  for (std::size_t s = 0; s < live; ++s) {
    b.alloc_into(static_cast<std::uint32_t>(s), size(rng));
  }
  b.end_step();
  for (std::size_t i = 0; i < pairs; ++i) {
    const auto s = pick(rng);
    b.free(s);
    b.alloc_into(s, size(rng));
  }
  b.end_step();
  for (std::size_t s = 0; s < live; ++s) {
    b.free(static_cast<std::uint32_t>(s));
  }
  b.end_step();
  return b.take("random mix: " + std::to_string(live) + " live blocks, " + std::to_string(pairs) +
                " free+alloc pairs, sizes log-uniform in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "] B");
}

trace concat(trace a, const trace& b) {
  const auto base = static_cast<std::uint32_t>(a.slots);
  const std::size_t offset = a.ops.size();
  a.ops.reserve(a.ops.size() + b.ops.size());
  for (trace_op op : b.ops) {
    op.slot += base;
    a.ops.push_back(op);
  }
  for (std::size_t e : b.step_ends) {
    a.step_ends.push_back(e + offset);
  }
  a.slots += b.slots;
  a.description += a.description.empty() ? b.description : "; then " + b.description;
  return a;
}

std::size_t peak_live_bytes(const trace& t) {
  std::size_t live = 0;
  std::size_t peak = 0;
  for (const auto& op : t.ops) {
    if (op.is_free) {
      live -= op.bytes;
    } else {
      live += op.bytes;
      peak = std::max(peak, live);
    }
  }
  return peak;
}

demo_plan make_demo_plan(bool on_device, std::size_t steps) {
  demo_plan p;
  if (on_device) {
    p.model = sequence_model{4, 1024, 8, 4, 32, 2048};
    p.mix_hi = std::size_t{64} << 20;
  } else {
    // The demo writes and checks every block: keep host memory modest (peak ~ 100 MiB).
    p.model = sequence_model{2, 256, 4, 2, 16, 512};
    p.mix_hi = std::size_t{4} << 20;
  }
  p.mix_live = 64;
  p.mix_pairs = steps * 100;
  p.mix_lo = 256;
  return p;
}

trace demo_trace(const demo_plan& plan, std::size_t steps, std::uint64_t seed) {
  trace t = sequence_batch_trace(plan.model, steps, seed);
  return concat(std::move(t), random_mix_trace(plan.mix_live, plan.mix_pairs, plan.mix_lo,
                                               plan.mix_hi, seed ^ 0x9e3779b97f4a7c15ULL));
}

}  // namespace poolscope::bench
