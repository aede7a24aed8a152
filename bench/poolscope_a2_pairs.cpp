// poolscope_a2_pairs: the A2 loop of `poolscope bench alloc` (docs/design.md §4: bfc over the host
// resource, 1000 live blocks of log-uniform sizes 512 B-64 MiB, random free+alloc pairs, the
// random choices drawn beforehand and cycled, seed 1) for a fixed number of pairs, untimed, so
// that a simulator counts the same work on every run. Instructions per pair are the difference
// of two runs over the difference of their pair counts (set-up and tear-down cancel):
//
//   for n in 100000 200000; do
//     valgrind --tool=callgrind --callgrind-out-file=cg.$n ./poolscope_a2_pairs $n 1  # 0: no cache
//   done
//   echo $(( ($(awk '/^totals/{print $2}' cg.200000) - $(awk '/^totals/{print $2}' cg.100000))
//            / 100000 ))
//
// (--cache-sim=yes adds D1 misses per pair the same way.) The count includes the loop's own few
// instructions per pair. Usage: poolscope_a2_pairs PAIRS [THREAD_CACHE=1] [LOCK_BIAS=1].
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "poolscope/bench/workloads.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"

int main(int argc, char** argv) {
  using namespace poolscope;
  if (argc < 2) {
    std::fprintf(stderr, "usage: poolscope_a2_pairs PAIRS [THREAD_CACHE=1] [LOCK_BIAS=1]\n");
    return 2;
  }
  const std::size_t pairs = std::strtoull(argv[1], nullptr, 10);
  pool::bfc_options o;
  o.thread_cache.enabled = argc <= 2 || std::atoi(argv[2]) != 0;
  o.lock_bias = argc <= 3 || std::atoi(argv[3]) != 0;
  o.thread_cache.owner_bias = o.lock_bias;
  pool::host_resource host(std::size_t{80} << 30);  // the bench's cap on the host resource
  pool::bfc_allocator a(host, o);

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
    const std::size_t j = i & (plan - 1);
    auto& b = blocks[slot[j]];
    a.deallocate(stream_view{}, b.first, b.second);
    b.second = bytes[j];
    b.first = a.allocate(stream_view{}, bytes[j]);
  }
  for (auto& b : blocks) {
    a.deallocate(stream_view{}, b.first, b.second);
  }
  const pool::allocator_stats s = a.stats();
  std::printf("pairs %zu, peak in use %zu, peak reserved %zu, upstream allocs %llu\n", pairs,
              s.peak_in_use, s.peak_reserved, static_cast<unsigned long long>(s.upstream_allocs));
  return 0;
}
