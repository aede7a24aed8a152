// poolscope_alloc_pairs: the A1, A2 and A3 loops of `poolscope bench alloc` (docs/design.md §4) for
// a fixed number of pairs, untimed, so that a simulator counts the same work on every run.
// Instructions per pair are the difference of two runs over the difference of their pair counts
// (set-up and tear-down cancel):
//
//   for n in 100000 200000; do
//     valgrind --tool=callgrind --callgrind-out-file=cg.$n ./poolscope_alloc_pairs A2 $n bfc
//   done
//   echo $(( ($(awk '/^totals/{print $2}' cg.200000) - $(awk '/^totals/{print $2}' cg.100000))
//            / 100000 ))
//
// (--cache-sim=yes adds D1 misses per pair the same way.) The count includes the loop's own few
// instructions per pair.
//
// Over host_vmm (targets bfc-vmm, bfc-tc-vmm) it also counts bfc's map and unmap calls, in all
// and over the second half of the pairs (the steady state, past the fill and the pool's growth),
// a figure the same on every run:
//
//   ./poolscope_alloc_pairs A2 400000 bfc-vmm
//
// Usage: poolscope_alloc_pairs WORKLOAD PAIRS [TARGET] [THREADS]
//   WORKLOAD  A1 (1 MiB pairs), A2 (1000 live blocks of log-uniform sizes 512 B-64 MiB, random
//             free+alloc pairs, the choices drawn beforehand and cycled, seed 1) or A3 (64 KiB
//             pairs on THREADS threads, PAIRS in all)
//   TARGET    bfc (the default composition, as make_allocator builds it: a per-thread cache in
//             front of the pool) or bfc-tc (the pool alone); default bfc. With -vmm (bfc-vmm,
//             bfc-tc-vmm): over host_vmm instead of the host resource.
//   THREADS   A3's thread count (default 8)
// Everything runs over the host resource or host_vmm (2 MiB granules), capped as the bench caps
// them.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "poolscope/bench/workloads.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/host_vmm_resource.hpp"

namespace {

using namespace poolscope;

constexpr std::size_t host_cap = std::size_t{80} << 30;  // the bench's cap on host memory

/// The bytes bfc maps and unmaps (its segment_map and segment_unmap events): on a GPU each granule
/// is a driver call or two of its own, so the bytes, not only the calls, say what mapping costs.
/// Installed on the one thread A2 runs on.
class mapped_bytes_hook final : public hooks::hook {
 public:
  void on_event(const hooks::event& e) noexcept override {
    (e.kind == hooks::event_kind::segment_map ? mapped : unmapped) += e.rounded;
  }
  [[nodiscard]] hooks::event_filter interests() const noexcept override {
    return hooks::event_filter{}
        .add(hooks::event_kind::segment_map, hooks::event_phase::post)
        .add(hooks::event_kind::segment_unmap, hooks::event_phase::post);
  }
  [[nodiscard]] bool wants_sequence() const noexcept override { return false; }
  [[nodiscard]] bool wants_time() const noexcept override { return false; }
  std::size_t mapped = 0;
  std::size_t unmapped = 0;
};

/// What the counts say at one point of the run.
struct counts_at {
  pool::allocator_stats stats;
  std::size_t mapped = 0;
  std::size_t unmapped = 0;
};

mapped_bytes_hook map_bytes;
/// The counts at the middle and at the end of the pairs, before the drain (A2 sets them), for
/// the steady-state figures.
counts_at halfway;
counts_at after_pairs;

counts_at now(const pool::allocator& a) {
  return {a.stats(), map_bytes.mapped, map_bytes.unmapped};
}

void run_a1(pool::allocator& a, std::size_t pairs) {
  constexpr std::size_t bytes = std::size_t{1} << 20;
  for (std::size_t i = 0; i < pairs; ++i) {
    a.deallocate(stream_view{}, a.allocate(stream_view{}, bytes), bytes);
  }
}

void run_a2(pool::allocator& a, std::size_t pairs) {
  // As the bench's run_a2 draws them: the live blocks, then the plan, from one generator.
  const bench::log_uniform_sizes size(512, std::size_t{64} << 20);
  std::mt19937_64 rng(1);
  constexpr std::size_t live = 1000;
  std::vector<std::pair<void*, std::size_t>> blocks(live);
  for (auto& b : blocks) {
    b.second = size(rng);
    b.first = a.allocate(stream_view{}, b.second);
  }
  constexpr std::size_t plan = 1 << 16;
  std::vector<std::uint32_t> slot(plan);
  std::vector<std::size_t> bytes(plan);
  std::uniform_int_distribution<std::uint32_t> pick(0, live - 1);
  for (std::size_t i = 0; i < plan; ++i) {
    slot[i] = pick(rng);
    bytes[i] = size(rng);
  }
  for (std::size_t i = 0; i < pairs; ++i) {
    if (i == pairs / 2) {
      halfway = now(a);
    }
    const std::size_t j = i & (plan - 1);
    auto& b = blocks[slot[j]];
    a.deallocate(stream_view{}, b.first, b.second);
    b.second = bytes[j];
    b.first = a.allocate(stream_view{}, bytes[j]);
  }
  after_pairs = now(a);
  for (auto& b : blocks) {
    a.deallocate(stream_view{}, b.first, b.second);
  }
}

void run_a3(pool::allocator& a, std::size_t pairs, unsigned threads) {
  constexpr std::size_t bytes = std::size_t{64} << 10;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&a, n = pairs / threads] {
      for (std::size_t i = 0; i < n; ++i) {
        a.deallocate(stream_view{}, a.allocate(stream_view{}, bytes), bytes);
      }
    });
  }
  for (auto& w : workers) {
    w.join();
  }
}

/// The resource of `target`: host_vmm for the -vmm targets (its address range twice the cap, as
/// the bench makes it), else the host resource.
std::unique_ptr<pool::resource> make_resource(const std::string& target) {
  if (target.ends_with("-vmm")) {
    return std::make_unique<pool::host_vmm_resource>(
        pool::host_vmm_options{.address_range_bytes = 2 * host_cap, .capacity = host_cap});
  }
  return std::make_unique<pool::host_resource>(host_cap);
}

std::unique_ptr<pool::allocator> make_target(const std::string& target, pool::resource& r) {
  if (target == "bfc" || target == "bfc-vmm") {
    return pool::make_allocator("bfc", r);
  }
  if (target == "bfc-tc" || target == "bfc-tc-vmm") {
    return pool::make_allocator("bfc", r, {.thread_cache = false});
  }
  return nullptr;
}

/// Calls (or bytes) per 1000 pairs.
double per_thousand(std::uint64_t calls, std::size_t pairs) {
  return pairs == 0 ? 0.0 : 1000.0 * static_cast<double>(calls) / static_cast<double>(pairs);
}

constexpr double MiB = 1024.0 * 1024.0;

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: poolscope_alloc_pairs A1|A2|A3 PAIRS [bfc|bfc-tc|bfc-vmm|bfc-tc-vmm] [THREADS]\n";
  if (argc < 3) {
    std::fputs(usage, stderr);
    return 2;
  }
  const std::string workload = argv[1];
  const std::size_t pairs = std::strtoull(argv[2], nullptr, 10);
  const std::string target = argc > 3 ? argv[3] : "bfc";
  const long threads = argc > 4 ? std::strtol(argv[4], nullptr, 10) : 8;
  if (threads < 1 || threads > 1024) {
    std::fprintf(stderr, "poolscope_alloc_pairs: THREADS %s is not in [1, 1024]\n", argv[4]);
    return 2;
  }
  const auto upstream = make_resource(target);
  auto a = make_target(target, *upstream);
  if (a == nullptr) {
    std::fprintf(stderr, "poolscope_alloc_pairs: unknown target '%s'\n%s", target.c_str(), usage);
    return 2;
  }
  // Only over host_vmm: elsewhere a hook would add to the instructions counted per pair.
  std::optional<hooks::scoped_hook> counting;
  if (target.ends_with("-vmm")) {
    counting.emplace(map_bytes, hooks::scope::thread);
  }
  if (workload == "A1") {
    run_a1(*a, pairs);
  } else if (workload == "A2") {
    run_a2(*a, pairs);
  } else if (workload == "A3") {
    run_a3(*a, pairs, static_cast<unsigned>(threads));
  } else {
    std::fprintf(stderr, "poolscope_alloc_pairs: unknown workload '%s'\n%s", workload.c_str(),
                 usage);
    return 2;
  }
  const pool::allocator_stats s = a->stats();
  std::printf("%s %s: pairs %zu, peak in use %zu, peak reserved %zu, upstream allocs %llu\n",
              workload.c_str(), target.c_str(), pairs, s.peak_in_use, s.peak_reserved,
              static_cast<unsigned long long>(s.upstream_allocs));
  if (s.maps != 0) {
    std::printf("%s %s: maps %llu, unmaps %llu in all (%.0f MiB, %.0f MiB)\n", workload.c_str(),
                target.c_str(), static_cast<unsigned long long>(s.maps),
                static_cast<unsigned long long>(s.unmaps),
                static_cast<double>(map_bytes.mapped) / MiB,
                static_cast<double>(map_bytes.unmapped) / MiB);
  }
  if (s.maps != 0 && workload == "A2") {
    const std::size_t second_half = pairs - pairs / 2;
    const pool::allocator_stats& h = halfway.stats;
    const pool::allocator_stats& e = after_pairs.stats;
    std::printf(
        "%s %s, second half of the pairs, per 1000 pairs: %.2f maps (%.1f MiB), %.2f unmaps "
        "(%.1f MiB)\n",
        workload.c_str(), target.c_str(), per_thousand(e.maps - h.maps, second_half),
        per_thousand(after_pairs.mapped - halfway.mapped, second_half) / MiB,
        per_thousand(e.unmaps - h.unmaps, second_half),
        per_thousand(after_pairs.unmapped - halfway.unmapped, second_half) / MiB);
  }
  return 0;
}
