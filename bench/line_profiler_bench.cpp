// Cost of the line profiler per event, with a 16-frame stack, beside its baselines.
//
// Rows (each at a call depth of at least 16 frames below the benchmark body):
//   pair/no_hook              a 1 KiB allocate+deallocate pair on best_fit/host, no hook
//   pair/counting_hook        the same with hooks::counting_hook installed (4 events per pair)
//   pair/line_profiler/<u>    the same with the line profiler, stacks by unwinder <u>
//   event/line_profiler/<u>   line_profiler::on_event alone: a malloc post (stack capture, trie,
//                             pointer table) and the matching free pre (per pair of events)
//   malloc_event/line_profiler/<u>  on_event for a malloc post alone (the stack-capturing kind)
//   threads/pair/no_hook, threads/pair/line_profiler/<default>
//                             the pair on up to 8 threads at once (as many as the host has
//                             cores), each on its own pool, with one profiler for all of them
// The summary line gives the default unwinder's cost per malloc event, per event averaged over
// a malloc and its free, and the time added to an alloc+free pair per working event ((pair with
// the profiler - pair with no hook) / 2: two of a pair's four events do work, malloc post and
// free pre; this includes the hook registry's dispatch), alone and with every thread at once.
// Times are CPU times (per thread where threads run at once).
// Target (docs/perf.md "Targets"): <= 0.3 us per event with a 16-frame stack.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "poolscope/hooks/counting_hook.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/profiler/line_profiler.hpp"

namespace {

using poolscope::hooks::event;
using poolscope::hooks::event_kind;
using poolscope::hooks::event_phase;
using poolscope::profiler::line_profiler;
using poolscope::profiler::stack_unwinder;

constexpr int k_stack_depth = 16;
constexpr std::size_t k_bytes = 1024;

/// Runs `body` `depth` frames deeper than the caller.
__attribute__((noipa)) void at_depth(int depth, const std::function<void()>& body) {
  if (depth <= 0) {
    body();
  } else {
    at_depth(depth - 1, body);
  }
  asm volatile("" ::: "memory");  // not a tail call: each level keeps its frame
}

void pairs(benchmark::State& state, poolscope::pool::allocator& alloc) {
  at_depth(k_stack_depth, [&] {
    for (auto _ : state) {
      void* p = alloc.allocate({}, k_bytes);
      benchmark::DoNotOptimize(p);
      alloc.deallocate({}, p, k_bytes);
    }
  });
}

void bm_pair_no_hook(benchmark::State& state) {
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator alloc{host};
  pairs(state, alloc);
}

void bm_pair_counting_hook(benchmark::State& state) {
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator alloc{host};
  poolscope::hooks::counting_hook counts;
  poolscope::hooks::scoped_hook on{counts};
  pairs(state, alloc);
}

void bm_pair_line_profiler(benchmark::State& state, stack_unwinder u) {
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator alloc{host};
  line_profiler prof{{.max_depth = k_stack_depth, .unwinder = u}};
  poolscope::hooks::scoped_hook on{prof};
  pairs(state, alloc);
  state.counters["nodes"] = static_cast<double>(prof.node_count());
}

// The pair on every thread of the run at once, each on its own pool; with `profiler`, one
// profiler for all, installed by thread 0 before the timed loop, whose start every thread waits
// for (and removed after its end).
void bm_threads_pair(benchmark::State& state, line_profiler* profiler) {
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator alloc{host};
  static std::optional<poolscope::hooks::scoped_hook> on;
  if (profiler != nullptr && state.thread_index() == 0) {
    on.emplace(*profiler);
  }
  pairs(state, alloc);
  if (state.thread_index() == 0) {
    on.reset();
  }
}

void bm_event_line_profiler(benchmark::State& state, stack_unwinder u) {
  line_profiler prof{{.max_depth = k_stack_depth, .unwinder = u}};
  static char block[k_bytes];
  event malloc_post;
  malloc_post.kind = event_kind::pool_malloc;
  malloc_post.phase = event_phase::post;
  malloc_post.ptr = block;
  malloc_post.requested = k_bytes;
  malloc_post.rounded = k_bytes;
  malloc_post.allocator_id = 1;
  event free_pre = malloc_post;
  free_pre.kind = event_kind::pool_free;
  free_pre.phase = event_phase::pre;
  at_depth(k_stack_depth, [&] {
    for (auto _ : state) {
      prof.on_event(malloc_post);
      prof.on_event(free_pre);
    }
  });
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 2);
}

void bm_malloc_event_line_profiler(benchmark::State& state, stack_unwinder u) {
  line_profiler prof{{.max_depth = k_stack_depth, .unwinder = u}};
  static char block[k_bytes];
  event malloc_post;
  malloc_post.kind = event_kind::pool_malloc;
  malloc_post.phase = event_phase::post;
  malloc_post.ptr = block;
  malloc_post.requested = k_bytes;
  malloc_post.rounded = k_bytes;
  malloc_post.allocator_id = 1;
  // The same pointer each time: the profiler retires the old entry as a block whose free it
  // missed, which costs what a free would.
  at_depth(k_stack_depth, [&] {
    for (auto _ : state) {
      prof.on_event(malloc_post);
    }
  });
}

/// Console output as usual, plus the mean real time per iteration of each run, by name.
class collecting_reporter final : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type == Run::RT_Iteration && r.iterations > 0) {
        // CPU time: on a shared machine wall time also counts other processes' turns.
        ns_[r.benchmark_name()] = r.GetAdjustedCPUTime();  // in the run's time unit (ns)
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  [[nodiscard]] double ns(const std::string& name) const {
    auto it = ns_.find(name);
    return it == ns_.end() ? -1.0 : it->second;
  }

 private:
  std::map<std::string, double> ns_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("pair/no_hook", bm_pair_no_hook);
  benchmark::RegisterBenchmark("pair/counting_hook", bm_pair_counting_hook);
  std::vector<stack_unwinder> unwinders;
  for (auto u : {stack_unwinder::libunwind, stack_unwinder::cached_dwarf,
                 stack_unwinder::glibc_backtrace, stack_unwinder::frame_pointer}) {
    if (poolscope::profiler::unwinder_available(u)) {
      unwinders.push_back(u);
      const std::string name(poolscope::profiler::to_string(u));
      benchmark::RegisterBenchmark(("pair/line_profiler/" + name).c_str(), bm_pair_line_profiler,
                                   u);
      benchmark::RegisterBenchmark(("event/line_profiler/" + name).c_str(), bm_event_line_profiler,
                                   u);
      benchmark::RegisterBenchmark(("malloc_event/line_profiler/" + name).c_str(),
                                   bm_malloc_event_line_profiler, u);
    }
  }
  // Up to 8 threads at once, no more than the host's cores (2 on CI: still contention).
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2U, 8U));
  static line_profiler shared{{.max_depth = k_stack_depth}};
  benchmark::RegisterBenchmark("threads/pair/no_hook", bm_threads_pair, nullptr)->Threads(threads);
  const std::string shared_name(poolscope::profiler::to_string(shared.unwinder()));
  benchmark::RegisterBenchmark(("threads/pair/line_profiler/" + shared_name).c_str(),
                               bm_threads_pair, &shared)
      ->Threads(threads);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  collecting_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  const line_profiler probe;
  const std::string def(poolscope::profiler::to_string(probe.unwinder()));
  const double base = reporter.ns("pair/no_hook");
  const double with = reporter.ns("pair/line_profiler/" + def);
  const double direct = reporter.ns("event/line_profiler/" + def);
  const double malloc_only = reporter.ns("malloc_event/line_profiler/" + def);
  const std::string at = "/threads:" + std::to_string(threads);
  const double base_threads = reporter.ns("threads/pair/no_hook" + at);
  const double with_threads = reporter.ns("threads/pair/line_profiler/" + def + at);
  if (base >= 0 && with >= 0 && direct >= 0 && malloc_only >= 0) {
    std::printf(
        "summary: line profiler (%s, %d-frame stacks, CPU time): %.0f ns per malloc event "
        "(stack captured), %.0f ns per event averaged over malloc+free, %.0f ns added per "
        "working event in an alloc+free pair (target <= 300 ns); pair %.0f ns without a hook",
        def.c_str(), k_stack_depth, malloc_only, direct / 2.0, (with - base) / 2.0, base);
    if (base_threads >= 0 && with_threads >= 0) {
      std::printf("; %.0f ns added per working event with %d threads at once",
                  (with_threads - base_threads) / 2.0, threads);
    }
    std::printf("\n");
  } else {
    std::printf("summary: filtered run, no per-event figure (run without --benchmark_filter)\n");
  }
  return 0;
}
