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
// Usage: poolscope_alloc_pairs WORKLOAD PAIRS [TARGET] [THREADS]
//   WORKLOAD  A1 (1 MiB pairs), A2 (1000 live blocks of log-uniform sizes 512 B-64 MiB, random
//             free+alloc pairs, the choices drawn beforehand and cycled, seed 1) or A3 (64 KiB
//             pairs on THREADS threads, PAIRS in all)
//   TARGET    bfc (the default composition, as make_allocator builds it: a per-thread cache in
//             front of the pool) or bfc-tc (the pool alone); default bfc
//   THREADS   A3's thread count (default 8)
// Everything runs over the host resource, capped as the bench caps it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "poolscope/bench/workloads.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_resource.hpp"

namespace {

using namespace poolscope;

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
    const std::size_t j = i & (plan - 1);
    auto& b = blocks[slot[j]];
    a.deallocate(stream_view{}, b.first, b.second);
    b.second = bytes[j];
    b.first = a.allocate(stream_view{}, bytes[j]);
  }
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

std::unique_ptr<pool::allocator> make_target(const std::string& target, pool::resource& r) {
  if (target == "bfc") {
    return pool::make_allocator("bfc", r);
  }
  if (target == "bfc-tc") {
    return pool::make_allocator("bfc", r, {.thread_cache = false});
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: poolscope_alloc_pairs A1|A2|A3 PAIRS [bfc|bfc-tc] [THREADS]\n";
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
  pool::host_resource host(std::size_t{80} << 30);  // the bench's cap on the host resource
  auto a = make_target(target, host);
  if (a == nullptr) {
    std::fprintf(stderr, "poolscope_alloc_pairs: unknown target '%s'\n%s", target.c_str(), usage);
    return 2;
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
  return 0;
}
