#include "poolscope/bench/alloc_bench.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "poolscope/bench/capped_resource.hpp"
#include "poolscope/bench/memory_access.hpp"
#include "poolscope/bench/text_table.hpp"
#include "poolscope/bench/workloads.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/counting_hook.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_vmm_resource.hpp"
#include "poolscope/pool/thread_cache_adaptor.hpp"
#include "poolscope/pool/virtual_resource.hpp"
#include "poolscope/profiler/recorder.hpp"
#include "poolscope/profiler/snapshot_recorder.hpp"

namespace poolscope::bench {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::size_t GiB = 1024 * MiB;

/// The sizes of each run mode.
struct run_sizes {
  std::size_t a1_pairs, a2_pairs, a2_live, a3_pairs, a4_pairs, a4_rounds, a5_steps;
  sequence_model a5_model;
  std::uint64_t loop_iterations;
  int loop_repeats;
  std::size_t hook_pairs;
};

run_sizes sizes_for(bool quick) {
  if (quick) {
    return {20000,      5000, 1000, 4000, 20000, 200, 3, sequence_model{2, 256, 4, 2, 16, 512},
            20'000'000, 3,    50000};
  }
  return {1'000'000, 500'000,          1000,        200'000, 1'000'000, 1000,
          20,        sequence_model{}, 400'000'000, 5,       2'000'000};
}

// ---- targets: what a workload allocates from -------------------------------------------------

/// An allocator, on the default stream.
struct allocator_target {
  pool::allocator& a;
  void* alloc(std::size_t n) { return a.allocate(stream_view{}, n); }
  void free(void* p, std::size_t n) noexcept { a.deallocate(stream_view{}, p, n); }
};

/// A resource used raw: the baseline.
struct resource_target {
  pool::resource& r;
  void* alloc(std::size_t n) {
    void* p = r.try_allocate(stream_view{}, n);
    if (p == nullptr) {
      throw runtime_error("resource " + r.name() + " is out of memory allocating " +
                          format_bytes(n));
    }
    return p;
  }
  void free(void* p, std::size_t n) noexcept { r.deallocate(stream_view{}, p, n); }
};

/// Timing results of one workload run, before they become a row.
struct measured {
  std::vector<double> samples;
  std::size_t ops = 0;
  std::size_t batch = 0;
  std::size_t model_peak = 0;  ///< peak live requested bytes, when the workload knows it
  std::string note;
};

/// Blocks a workload holds across the timed part; freed on every exit path.
template <typename Target>
class live_set {
 public:
  explicit live_set(Target& t) : t_(t) {}
  live_set(const live_set&) = delete;
  live_set& operator=(const live_set&) = delete;
  ~live_set() { clear(); }
  void add(void* p, std::size_t n) { blocks_.push_back({p, n}); }
  std::vector<std::pair<void*, std::size_t>>& blocks() { return blocks_; }
  void clear() noexcept {
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
      if (it->first != nullptr) {
        t_.free(it->first, it->second);
      }
    }
    blocks_.clear();
  }

 private:
  Target& t_;
  std::vector<std::pair<void*, std::size_t>> blocks_;
};

template <typename Target>
measured run_a1(Target& t, const run_sizes& z, double budget, double overhead) {
  auto bt = time_in_batches(
      [&](std::size_t) {
        void* p = t.alloc(MiB);
        t.free(p, MiB);
      },
      {z.a1_pairs, budget, 16, 16}, overhead);
  return {std::move(bt.samples), bt.ops, bt.batch, MiB, ""};
}

template <typename Target>
measured run_a2(Target& t, const run_sizes& z, double budget, double overhead, std::uint64_t seed) {
  const log_uniform_sizes size(512, 64 * MiB);
  std::mt19937_64 rng(seed);
  live_set<Target> live(t);
  std::size_t live_bytes = 0;
  for (std::size_t i = 0; i < z.a2_live; ++i) {
    const std::size_t n = size(rng);
    live.add(nullptr, n);
    live.blocks().back().first = t.alloc(n);
    live_bytes += n;
  }
  // The random choices are drawn before timing and cycled.
  constexpr std::size_t plan = 1 << 16;
  std::vector<std::uint32_t> slot(plan);
  std::vector<std::size_t> bytes(plan);
  std::uniform_int_distribution<std::uint32_t> pick(0, static_cast<std::uint32_t>(z.a2_live - 1));
  for (std::size_t i = 0; i < plan; ++i) {
    slot[i] = pick(rng);
    bytes[i] = size(rng);
  }
  auto& blocks = live.blocks();
  std::size_t peak = live_bytes;
  auto bt = time_in_batches(
      [&](std::size_t i) {
        const std::size_t j = i & (plan - 1);
        auto& b = blocks[slot[j]];
        t.free(b.first, b.second);
        live_bytes -= b.second;
        b.first = nullptr;
        b.second = bytes[j];
        b.first = t.alloc(bytes[j]);
        live_bytes += bytes[j];
        peak = std::max(peak, live_bytes);
      },
      {z.a2_pairs, budget, 16, 16}, overhead);
  return {std::move(bt.samples), bt.ops, bt.batch, peak,
          std::to_string(z.a2_live) + " live, 512 B-64 MiB"};
}

/// Times `pair_of(k)(i)` (thread k's i-th pair) in batches of `limits` on `threads` threads
/// started together; every thread's samples pooled, the largest batch kept.
template <typename PairOf>
measured time_on_threads(int threads, const batch_limits& limits, double overhead,
                         PairOf&& pair_of) {
  std::mutex mutex;
  std::vector<double> samples;
  std::size_t ops = 0;
  std::size_t batch = 0;
  std::exception_ptr failure;
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      ready.fetch_add(1);
      while (ready.load() < threads) {
        std::this_thread::yield();  // start together so the threads contend
      }
      try {
        auto bt = time_in_batches(pair_of(k), limits, overhead);
        std::lock_guard lock(mutex);
        samples.insert(samples.end(), bt.samples.begin(), bt.samples.end());
        ops += bt.ops;
        batch = std::max(batch, bt.batch);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!failure) {
          failure = std::current_exception();
        }
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  if (failure) {
    std::rethrow_exception(failure);
  }
  measured m;
  m.samples = std::move(samples);
  m.ops = ops;
  m.batch = batch;
  return m;
}

template <typename Target>
measured run_a3(Target& t, const run_sizes& z, double budget, double overhead, int threads) {
  measured m = time_on_threads(threads, {z.a3_pairs, budget, 16, 16}, overhead, [&](int) {
    return [&](std::size_t) {
      void* p = t.alloc(64 * KiB);
      t.free(p, 64 * KiB);
    };
  });
  m.model_peak = static_cast<std::size_t>(threads) * 64 * KiB;
  m.note = "64 KiB, shared pool";
  return m;
}

template <typename Target>
measured run_a4(Target& t, const run_sizes& z, double budget, double overhead) {
  live_set<Target> keepers(t);
  {
    live_set<Target> holes(t);
    for (std::size_t r = 0; r < z.a4_rounds; ++r) {
      for (std::size_t hole : {4 * KiB, 16 * KiB, 64 * KiB}) {
        holes.add(t.alloc(hole), hole);
        keepers.add(t.alloc(KiB), KiB);
      }
    }
  }  // the holes are freed here, leaving the cache fragmented between the keepers
  auto bt = time_in_batches(
      [&](std::size_t) {
        void* p = t.alloc(KiB);
        t.free(p, KiB);
      },
      {z.a4_pairs, budget, 16, 16}, overhead);
  return {std::move(bt.samples), bt.ops, bt.batch, z.a4_rounds * 3 * KiB + KiB,
          std::to_string(z.a4_rounds * 3) + " holes"};
}

template <typename Target>
measured run_a5(Target& t, const trace& tr, double overhead) {
  std::vector<void*> slot(tr.slots, nullptr);
  std::vector<std::size_t> slot_bytes(tr.slots, 0);
  measured m;
  m.model_peak = peak_live_bytes(tr);
  std::size_t begin = 0;
  try {
    for (std::size_t end : tr.step_ends) {
      std::size_t allocs = 0;
      const std::uint64_t t0 = clock_ns();
      for (std::size_t i = begin; i < end; ++i) {
        const trace_op& op = tr.ops[i];
        if (op.is_free) {
          t.free(slot[op.slot], op.bytes);
          slot[op.slot] = nullptr;
        } else {
          slot[op.slot] = t.alloc(op.bytes);
          slot_bytes[op.slot] = op.bytes;
          ++allocs;
        }
      }
      const double dt = static_cast<double>(clock_ns() - t0) - overhead;
      if (allocs > 0) {
        m.samples.push_back(std::max(0.0, dt) / static_cast<double>(allocs));
      }
      m.ops += allocs;
      begin = end;
    }
  } catch (...) {
    for (std::size_t s = 0; s < slot.size(); ++s) {
      if (slot[s] != nullptr) {
        t.free(slot[s], slot_bytes[s]);
      }
    }
    throw;
  }
  m.batch = 0;  // one sample per step
  m.note = std::to_string(tr.step_ends.size()) + " steps";
  return m;
}

// ---- the hook benchmark ----------------------------------------------------------------------

// Both loops keep `i` and `hits` opaque to the optimizer (the same empty asm in each), so neither
// is vectorized, unrolled into nothing or removed; the only difference is the hooks::active()
// test, a relaxed load and a predicted branch, as on every allocator path.
__attribute__((noinline)) std::uint64_t active_check_loop(std::uint64_t n) {
  std::uint64_t hits = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (hooks::active()) [[unlikely]] {
      ++hits;
    }
    __asm__ __volatile__("" : "+r"(i), "+r"(hits));
  }
  return hits;
}

__attribute__((noinline)) std::uint64_t empty_loop(std::uint64_t n) {
  std::uint64_t hits = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    __asm__ __volatile__("" : "+r"(i), "+r"(hits));
  }
  return hits;
}

/// The fastest of `repeats` runs of `loop(n)`, in ns per iteration.
template <typename Loop>
double best_loop_ns(Loop loop, std::uint64_t n, int repeats, std::uint64_t& sink) {
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const std::uint64_t t0 = clock_ns();
    sink += loop(n);
    const std::uint64_t t1 = clock_ns();
    best = std::min(best, static_cast<double>(t1 - t0) / static_cast<double>(n));
  }
  return best;
}

// ---- rows ------------------------------------------------------------------------------------

bench_row make_row(std::string workload, std::string target, std::string kind, int threads,
                   measured m) {
  bench_row r;
  r.workload = std::move(workload);
  r.target = std::move(target);
  r.kind = std::move(kind);
  r.threads = threads;
  r.ops = m.ops;
  r.batch = m.batch;
  r.ns = summarize(std::move(m.samples));
  r.note = std::move(m.note);
  return r;
}

void add_stats(bench_row& r, const pool::allocator_stats& s) {
  r.stats = s;
  r.peak_requested = s.peak_requested;
  r.peak_reserved = s.peak_reserved;
  if (s.peak_requested > 0) {
    r.ratio = static_cast<double>(s.peak_reserved) / static_cast<double>(s.peak_requested);
  }
}

/// Runs workload `w` on target `t`; a failure becomes the row's error.
template <typename Target>
measured run_workload(const std::string& w, Target& t, const run_sizes& z, double budget,
                      double overhead, int threads, std::uint64_t seed, const trace& a5) {
  if (w == "A1") {
    return run_a1(t, z, budget, overhead);
  }
  if (w == "A2") {
    return run_a2(t, z, budget, overhead, seed);
  }
  if (w == "A3") {
    return run_a3(t, z, budget, overhead, threads);
  }
  if (w == "A4") {
    return run_a4(t, z, budget, overhead);
  }
  return run_a5(t, a5, overhead);
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

void check_names(const std::vector<std::string>& given, const std::vector<std::string>& known,
                 const char* what) {
  for (const auto& g : given) {
    if (!contains(known, g)) {
      std::string list;
      for (const auto& k : known) {
        list += list.empty() ? k : "," + k;
      }
      throw invalid_argument("poolscope bench: unknown " + std::string(what) + " '" + g +
                             "' (expected one of " + list + ")");
    }
  }
}

const bench_row* fastest(const std::vector<bench_row>& rows, const std::string& w, int threads,
                         const char* kind) {
  const bench_row* best = nullptr;
  for (const auto& r : rows) {
    if (r.workload == w && r.kind == kind && r.threads == threads && r.error.empty() &&
        r.ns.samples > 0 && (best == nullptr || r.ns.median < best->ns.median)) {
      best = &r;
    }
  }
  return best;
}

std::string make_summary(const alloc_bench_report& rep, const std::vector<std::string>& workloads,
                         const std::vector<int>& threads) {
  std::ostringstream s;
  s << "summary [" << rep.resource << (rep.quick ? ", quick" : "") << "]:";
  bool first = true;
  auto sep = [&] {
    s << (first ? " " : "; ");
    first = false;
  };
  for (const std::string& w : workloads) {
    if (w == "A5" || w == "H") {
      continue;
    }
    int th = 1;
    if (w == "A3") {
      // The design's headline is 8 threads; otherwise the most threads run.
      th = std::find(threads.begin(), threads.end(), 8) != threads.end() ? 8 : threads.back();
    }
    const bench_row* a = fastest(rep.rows, w, th, "allocator");
    const bench_row* b = fastest(rep.rows, w, th, "baseline");
    if (a == nullptr && b == nullptr) {
      continue;
    }
    sep();
    s << w << (w == "A3" ? "@" + std::to_string(th) : "");
    if (a != nullptr) {
      s << " " << a->target << " " << format_ns(a->ns.median);
    }
    if (b != nullptr) {
      s << " (" << b->target << " raw " << format_ns(b->ns.median) << ")";
    }
  }
  if (contains(workloads, "A5")) {
    std::string ratios;
    for (const auto& r : rep.rows) {
      if (r.workload == "A5" && r.kind == "allocator" && r.ratio && r.error.empty()) {
        ratios += (ratios.empty() ? "" : " ") + r.target + " " + format_ratio(*r.ratio);
      }
    }
    if (!ratios.empty()) {
      sep();
      s << "A5 reserved/requested " << ratios;
    }
  }
  if (rep.hooks) {
    sep();
    s << "hook check " << format_ns(rep.hooks->check_ns) << ", counting hook +"
      << format_ns(rep.hooks->per_event_ns) << "/event";
    if (rep.hooks->threads > 1) {  // the counting hook's alone: the recorders' rows say theirs
      s << " (+" << format_ns(rep.hooks->per_event_threads_ns) << " at " << rep.hooks->threads
        << " threads)";
    }
    s << ", recorder +" << format_ns(rep.hooks->per_event_recorder_ns) << "/event, snapshot +"
      << format_ns(rep.hooks->per_event_snapshot_ns) << "/event";
  }
  std::size_t failed = 0;
  for (const auto& r : rep.rows) {
    failed += r.error.empty() ? 0 : 1;
  }
  if (failed > 0) {
    sep();
    s << failed << " row(s) FAILED";
  }
  return s.str();
}

/// host_vmm with its default granule and address range (raised to hold `capacity`), mapping at
/// most `capacity` bytes.
std::unique_ptr<pool::resource> make_host_vmm(std::size_t capacity) {
  pool::host_vmm_options vo;
  vo.capacity = capacity;
  if (capacity != SIZE_MAX) {
    vo.address_range_bytes = std::max(vo.address_range_bytes, 2 * capacity);
  }
  return std::make_unique<pool::host_vmm_resource>(vo);
}

/// The allocator of a row: `strategy` as make_allocator composes it (a thread cache in front of
/// bfc and best_fit), or without the cache (`cached` false, rows "-tc"), or with no lock biased
/// towards a thread (`bias` false, rows "-bias": the caches' locks and bfc's pool lock), or for
/// bfc over a virtual resource with the plain best fit (`mapped_fit` false, rows "-mapfit").
std::unique_ptr<pool::allocator> make_variant(const std::string& strategy, pool::resource& res,
                                              bool cached, bool bias, bool mapped_fit) {
  pool::allocator_options o;
  o.thread_cache = cached;
  o.cache.owner_bias = bias;
  if (strategy != "bfc" || (bias && mapped_fit)) {
    return pool::make_allocator(strategy, res, o);
  }
  pool::bfc_options bo;
  bo.lock_bias = bias;
  bo.mapped_fit_candidates = mapped_fit ? bo.mapped_fit_candidates : 0;
  auto bfc = std::make_unique<pool::bfc_allocator>(res, bo);
  if (!cached) {
    return bfc;
  }
  o.cache.max_block_bytes =
      std::min(o.cache.max_block_bytes, bo.small_request_max);  // as the factory
  return std::make_unique<pool::thread_cache_adaptor>(std::move(bfc), o.cache);
}

void run_hook_bench(alloc_bench_report& rep, const run_sizes& z, double budget, double overhead,
                    int threads, std::ostream* progress) {
  if (progress != nullptr) {
    *progress << "[bench] H: hook costs on best_fit/host" << std::endl;
  }
  auto host = pool::make_resource("host");
  auto alloc = pool::make_allocator("best_fit", *host);
  allocator_target t{*alloc};
  constexpr std::size_t n = 256;
  auto pair = [&](std::size_t) {
    void* p = t.alloc(n);
    t.free(p, n);
  };
  hook_costs h;
  auto none = time_in_batches(pair, {z.hook_pairs, budget, 16, 1000}, overhead);
  auto none_row = make_row("H", "best_fit, no hook", "hook", 1,
                           {std::move(none.samples), none.ops, none.batch, n, "256 B pairs"});
  h.pair_no_hook_ns = none_row.ns.median;
  hooks::counting_hook counter;
  batch_timing with;
  {
    hooks::scoped_hook on{counter};
    with = time_in_batches(pair, {z.hook_pairs, budget, 16, 1000}, overhead);
  }
  const auto counted = counter.snapshot().total_calls();
  auto with_row = make_row("H", "best_fit, counting hook", "hook", 1,
                           {std::move(with.samples), with.ops, with.batch, n,
                            std::to_string(counted) + " events counted"});
  h.pair_counting_ns = with_row.ns.median;
  h.per_event_ns =
      (h.pair_counting_ns - h.pair_no_hook_ns) / static_cast<double>(h.events_per_pair);
  if (hooks::active()) {
    with_row.note += " (other hooks were installed: the no-hook row is not hook-free)";
  }
  // The recording hooks, each alone: what POOLSCOPE_RECORD and POOLSCOPE_SNAPSHOT cost the
  // allocating thread (their writer threads run beside it).
  const std::string log_path = (std::filesystem::temp_directory_path() /
                                ("poolscope_bench_record_" + std::to_string(::getpid()) + ".jsonl"))
                                   .string();
  std::vector<bench_row> recording_rows;
  {
    profiler::recorder rec{log_path};
    batch_timing timed;
    {
      hooks::scoped_hook on{rec};
      timed = time_in_batches(pair, {z.hook_pairs, budget, 16, 1000}, overhead);
    }
    (void)rec.flush();
    h.recorder_dropped = rec.dropped();
    auto row = make_row("H", "best_fit, recorder", "hook", 1,
                        {std::move(timed.samples), timed.ops, timed.batch, n,
                         std::to_string(rec.lines()) + " lines, " +
                             std::to_string(h.recorder_dropped) + " dropped (ring full)"});
    h.per_event_recorder_ns = (row.ns.median - h.pair_no_hook_ns) / 2.0;
    recording_rows.push_back(std::move(row));
  }
  std::filesystem::remove(log_path);
  {
    profiler::snapshot_recorder snap;
    batch_timing timed;
    {
      hooks::scoped_hook on{snap};
      timed = time_in_batches(pair, {z.hook_pairs, budget, 16, 1000}, overhead);
    }
    const auto st = snap.stats();
    h.snapshot_dropped = st.dropped_events;
    auto row = make_row("H", "best_fit, snapshot recorder", "hook", 1,
                        {std::move(timed.samples), timed.ops, timed.batch, n,
                         std::to_string(st.events) + " events with stacks, " +
                             std::to_string(st.dropped_events) + " dropped (ring full)"});
    h.per_event_snapshot_ns = (row.ns.median - h.pair_no_hook_ns) / 2.0;
    recording_rows.push_back(std::move(row));
  }
  std::vector<bench_row> threaded_rows;
  if (threads > 1) {
    // The same pairs on `threads` threads at once, each on a pool of its own: nothing is shared
    // but what the hooks share, so the difference per event is what delivery costs when threads
    // raise events together.
    std::vector<std::unique_ptr<pool::allocator>> own;
    for (int k = 0; k < threads; ++k) {
      own.push_back(pool::make_allocator("best_fit", *host));
    }
    auto pairs_on = [&](int k) {
      return [a = own[static_cast<std::size_t>(k)].get()](std::size_t) {
        void* p = a->allocate({}, n);
        a->deallocate({}, p, n);
      };
    };
    const batch_limits limits{z.hook_pairs, budget, 16, 1000};
    measured bare = time_on_threads(threads, limits, overhead, pairs_on);
    bare.note = "256 B pairs, a pool per thread";
    measured hooked;
    {
      hooks::scoped_hook on{counter};
      hooked = time_on_threads(threads, limits, overhead, pairs_on);
    }
    hooked.note = "256 B pairs, a pool per thread";
    auto bare_row = make_row("H", "best_fit, no hook", "hook", threads, std::move(bare));
    auto hooked_row = make_row("H", "best_fit, counting hook", "hook", threads, std::move(hooked));
    h.threads = threads;
    h.per_event_threads_ns =
        (hooked_row.ns.median - bare_row.ns.median) / static_cast<double>(h.events_per_pair);
    threaded_rows.push_back(std::move(bare_row));
    threaded_rows.push_back(std::move(hooked_row));
    // The recording hooks with every thread pushing into one ring at once.
    {
      profiler::recorder rec{log_path};
      measured timed;
      {
        hooks::scoped_hook on{rec};
        timed = time_on_threads(threads, limits, overhead, pairs_on);
      }
      (void)rec.flush();
      timed.note = std::to_string(rec.lines()) + " lines, " + std::to_string(rec.dropped()) +
                   " dropped (ring full)";
      threaded_rows.push_back(
          make_row("H", "best_fit, recorder", "hook", threads, std::move(timed)));
    }
    std::filesystem::remove(log_path);
    {
      profiler::snapshot_recorder snap;
      measured timed;
      {
        hooks::scoped_hook on{snap};
        timed = time_on_threads(threads, limits, overhead, pairs_on);
      }
      const auto st = snap.stats();
      timed.note = std::to_string(st.events) + " events with stacks, " +
                   std::to_string(st.dropped_events) + " dropped (ring full)";
      threaded_rows.push_back(
          make_row("H", "best_fit, snapshot recorder", "hook", threads, std::move(timed)));
    }
  }
  std::uint64_t sink = 0;
  h.empty_loop_ns = best_loop_ns(empty_loop, z.loop_iterations, z.loop_repeats, sink);
  h.check_loop_ns = best_loop_ns(active_check_loop, z.loop_iterations, z.loop_repeats, sink);
  h.check_ns = std::max(0.0, h.check_loop_ns - h.empty_loop_ns);
  auto loop_row = [&](const char* target, double ns, std::string note) {
    bench_row r;
    r.workload = "H";
    r.target = target;
    r.kind = "hook";
    r.ops = static_cast<std::size_t>(z.loop_iterations);
    r.ns.samples = static_cast<std::size_t>(z.loop_repeats);
    r.ns.median = r.ns.p99 = r.ns.mean = r.ns.min = r.ns.max = ns;
    r.note = std::move(note);
    return r;
  };
  rep.rows.push_back(std::move(none_row));
  rep.rows.push_back(std::move(with_row));
  for (auto& r : recording_rows) {
    rep.rows.push_back(std::move(r));
  }
  for (auto& r : threaded_rows) {
    rep.rows.push_back(std::move(r));
  }
  rep.rows.push_back(loop_row("empty loop", h.empty_loop_ns, "per iteration, best of repeats"));
  rep.rows.push_back(loop_row("active() check", h.check_ns,
                              "loop with check " + format_ns(h.check_loop_ns) + " - empty loop"));
  (void)sink;  // the loops' results only keep them from being optimized away
  rep.hooks = h;
}

/// The upstream column: resource allocations, or the map and unmap calls of a pool over a
/// virtual resource.
std::string upstream_cell(const pool::allocator_stats& s) {
  return s.maps != 0 ? std::to_string(s.maps) + "m " + std::to_string(s.unmaps) + "u"
                     : std::to_string(s.upstream_allocs);
}

}  // namespace

std::vector<std::string> alloc_workload_names() {
  return {"A1", "A2", "A3", "A4", "A5", "H"};
}

std::string default_resource_name() {
  const auto names = pool::resource_names();
  if (gpu_count() > 0 && contains(names, "cuda")) {
    return "cuda";
  }
  return "host";
}

std::string timing_method() {
  return "Pairs (allocate + deallocate) run back to back in batches of B, B chosen after a "
         "warm-up by timing chunks of 1, 2, 4, ... pairs, so that a batch lasts about 2 us (B = 1 "
         "for slower pairs); each batch gives one "
         "sample, (batch time - timer overhead) / B, timed with steady_clock. median and p99 are "
         "over those samples, so p99 is the 99th percentile of B-pair means (a lone slow pair is "
         "diluted by B). A3 pools the samples of all threads. A5 takes one sample per step: step "
         "time / allocations in the step. Hook check: best of several runs of a tight loop that "
         "tests hooks::active(), minus the same loop without the test.";
}

alloc_bench_report run_alloc_bench(const alloc_bench_options& o, std::ostream* progress) {
  const auto all_allocators = pool::allocator_names();
  const auto all_workloads = alloc_workload_names();
  check_names(o.allocators, all_allocators, "allocator");
  check_names(o.workloads, all_workloads, "workload");
  const std::vector<std::string> allocators = o.allocators.empty() ? all_allocators : o.allocators;
  const std::vector<std::string> workloads = o.workloads.empty() ? all_workloads : o.workloads;
  std::vector<int> threads = o.threads.empty() ? std::vector<int>{1, 2, 4, 8, 16} : o.threads;
  for (int t : threads) {
    if (t < 1 || t > 1024) {
      throw invalid_argument("poolscope bench: thread count " + std::to_string(t) +
                             " is out of range [1, 1024]");
    }
  }

  alloc_bench_report rep;
  rep.resource = o.resource.empty() ? default_resource_name() : o.resource;
  check_names({rep.resource}, pool::resource_names(), "resource");
  rep.device = o.device;
  rep.quick = o.quick;
  rep.seed = o.seed;
  const run_sizes z = sizes_for(o.quick);
  const double budget = o.seconds_per_row > 0 ? o.seconds_per_row : (o.quick ? 0.05 : 1.0);
  rep.timer_overhead_ns = timer_overhead_ns();
  rep.owner_bias = pool::owner_bias_available();
  const double overhead = rep.timer_overhead_ns;

  // The resources: the one benchmarked, and the raw baselines beside it.
  auto main_resource = pool::make_resource(rep.resource, o.device);
  const bool on_device = main_resource->kind() == pool::memory_kind::device;
  double cap_gib = o.capacity_gib;
  if (cap_gib < 0) {
    cap_gib = main_resource->kind() == pool::memory_kind::host ? 80.0 : 0.0;
  }
  std::unique_ptr<capped_resource> capped;
  pool::resource* res = main_resource.get();
  if (cap_gib > 0) {
    rep.capacity = static_cast<std::size_t>(cap_gib * static_cast<double>(GiB));
    if (rep.resource == "host_vmm") {
      // Capped by its own mapping budget: behind a wrapper, bfc would not see a virtual resource.
      main_resource = make_host_vmm(*rep.capacity);
      res = main_resource.get();
    } else {
      capped = std::make_unique<capped_resource>(*main_resource, *rep.capacity);
      res = capped.get();
    }
  }
  const bool res_is_virtual = dynamic_cast<pool::virtual_resource*>(res) != nullptr;
  // bfc over the virtual-memory twin of the resource, beside the other rows.
  const std::string vmm_name = on_device ? "vmm" : "host_vmm";
  std::unique_ptr<pool::resource> vmm_resource;
  if (o.vmm_rows && rep.resource != "vmm" && rep.resource != "host_vmm" &&
      contains(allocators, std::string("bfc"))) {
    vmm_resource = on_device ? pool::make_resource("vmm", o.device)
                             : make_host_vmm(rep.capacity.value_or(SIZE_MAX));
  }
  std::vector<std::pair<std::string, std::unique_ptr<pool::resource>>> baselines;
  if (o.baselines) {
    std::vector<std::string> names{rep.resource};
    if (on_device) {
      for (const char* n : {"cuda", "cuda_async"}) {
        if (n != rep.resource && contains(pool::resource_names(), n)) {
          names.emplace_back(n);
        }
      }
    }
    for (const auto& n : names) {
      baselines.emplace_back(n, n == rep.resource ? nullptr : pool::make_resource(n, o.device));
    }
  }

  const trace a5 = sequence_batch_trace(z.a5_model, z.a5_steps, o.seed);
  for (const std::string& w : workloads) {
    if (w == "H") {
      try {
        run_hook_bench(rep, z, budget, overhead, *std::max_element(threads.begin(), threads.end()),
                       progress);
      } catch (const std::exception& e) {
        bench_row r;
        r.workload = "H";
        r.target = "best_fit/host";
        r.kind = "hook";
        r.error = e.what();
        rep.rows.push_back(std::move(r));
      }
      continue;
    }
    const std::vector<int> thread_counts = w == "A3" ? threads : std::vector<int>{1};
    for (int th : thread_counts) {
      for (auto& [name, own] : baselines) {
        pool::resource& r = own ? *own : *res;
        if (progress != nullptr) {
          *progress << "[bench] " << w << (w == "A3" ? " x" + std::to_string(th) : "") << ": "
                    << name << " (raw)" << std::endl;
        }
        resource_target t{r};
        try {
          auto m = run_workload(w, t, z, budget, overhead, th, o.seed, a5);
          const std::size_t model_peak = m.model_peak;
          auto row = make_row(w, name, "baseline", th, std::move(m));
          if (w == "A2" || w == "A5") {
            row.peak_requested = model_peak;
          }
          rep.rows.push_back(std::move(row));
        } catch (const std::exception& e) {
          bench_row row;
          row.workload = w;
          row.target = name;
          row.kind = "baseline";
          row.threads = th;
          row.error = e.what();
          rep.rows.push_back(std::move(row));
        }
      }
      struct variant {
        std::string target;      // the row's
        bool cached;             // thread cache on
        bool bias;               // locks biased towards the threads using them (caches', bfc's)
        bool mapped_fit = true;  // bfc over a virtual resource: its mapped fit
      };
      std::vector<variant> variants;
      for (const std::string& a : allocators) {
        variants.push_back({a, true, true});
        if (o.compare_mapped_fit && a == "bfc" && res_is_virtual) {
          variants.push_back({"bfc -mapfit", true, true, false});
        }
        if (a == "bfc" && vmm_resource) {
          variants.push_back({"bfc over " + vmm_name, true, true});
          if (o.compare_mapped_fit) {
            variants.push_back({"bfc over " + vmm_name + " -mapfit", true, true, false});
          }
        }
        if (o.compare_thread_cache && (a == "bfc" || a == "best_fit")) {
          variants.push_back({a + " -tc", false, true});
          variants.push_back({a + " -bias", true, false});
          if (a == "bfc") {  // its pool lock's bias alone: against "-tc"
            variants.push_back({a + " -tc -bias", false, false});
          }
        }
      }
      for (const auto& [a, cached, bias, mapped_fit] : variants) {
        if (progress != nullptr) {
          *progress << "[bench] " << w << (w == "A3" ? " x" + std::to_string(th) : "") << ": " << a
                    << std::endl;
        }
        std::unique_ptr<pool::allocator> alloc;
        try {
          const bool over_vmm = a.find(" over ") != std::string::npos;
          alloc = make_variant(a.substr(0, a.find(' ')), over_vmm ? *vmm_resource : *res, cached,
                               bias, mapped_fit);
          allocator_target t{*alloc};
          auto m = run_workload(w, t, z, budget, overhead, th, o.seed, a5);
          auto row = make_row(w, a, "allocator", th, std::move(m));
          add_stats(row, alloc->stats());
          rep.rows.push_back(std::move(row));
        } catch (const std::exception& e) {
          bench_row row;
          row.workload = w;
          row.target = a;
          row.kind = "allocator";
          row.threads = th;
          row.error = e.what();
          if (alloc) {
            add_stats(row, alloc->stats());
          }
          rep.rows.push_back(std::move(row));
        }
      }
    }
  }
  rep.summary = make_summary(rep, workloads, threads);
  return rep;
}

bool alloc_bench_report::any_error() const {
  return std::any_of(rows.begin(), rows.end(), [](const bench_row& r) { return !r.error.empty(); });
}

void alloc_bench_report::print_table(std::ostream& out) const {
  out << "poolscope allocator benchmark: resource " << resource
      << (capacity ? " (capped at " + format_size(*capacity) + ")" : std::string{})
      << (quick ? ", quick" : "") << ", timer overhead " << format_ns(timer_overhead_ns)
      << (owner_bias ? "" : ", locks unbiased (no membarrier)") << " (subtracted)\n";
  text_table t({"workload", "target", "threads", "pairs", "batch", "median", "p99", "peak req",
                "peak res", "res/req", "upstream", "note"},
               2);
  std::string last;
  for (const auto& r : rows) {
    if (!last.empty() && r.workload != last) {
      t.add_rule();
    }
    last = r.workload;
    const std::string target = r.kind == "baseline" ? r.target + " [raw]" : r.target;
    if (!r.error.empty()) {
      t.add_row({r.workload, target, std::to_string(r.threads), "", "", "", "", "", "", "", "",
                 "FAILED: " + r.error});
      continue;
    }
    t.add_row({r.workload, target, std::to_string(r.threads), std::to_string(r.ops),
               r.batch == 0 ? "-" : std::to_string(r.batch), format_ns(r.ns.median),
               format_ns(r.ns.p99), r.peak_requested ? format_size(*r.peak_requested) : "-",
               r.peak_reserved ? format_size(*r.peak_reserved) : "-",
               r.ratio ? format_ratio(*r.ratio) : "-", r.stats ? upstream_cell(*r.stats) : "-",
               r.note});
  }
  t.print(out);
  out << "ns per pair (allocate + deallocate), over a virtual resource including the map and "
         "unmap calls made; upstream = resource allocations made by the allocator, or over a "
         "virtual resource the map and unmap calls (\"m\", \"u\"); [raw] = the resource called "
         "directly\n";
  out << summary << '\n';
}

std::string alloc_bench_report::to_json() const {
  using nlohmann::json;
  auto opt = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  json rows_j = json::array();
  for (const auto& r : rows) {
    json j = {{"workload", r.workload},
              {"target", r.target},
              {"kind", r.kind},
              {"threads", r.threads},
              {"ops", r.ops},
              {"batch", r.batch},
              {"samples", r.ns.samples},
              {"median_ns", r.ns.median},
              {"p99_ns", r.ns.p99},
              {"mean_ns", r.ns.mean},
              {"min_ns", r.ns.min},
              {"max_ns", r.ns.max},
              {"peak_requested", opt(r.peak_requested)},
              {"peak_reserved", opt(r.peak_reserved)},
              {"ratio", opt(r.ratio)},
              {"note", r.note},
              {"error", r.error.empty() ? json(nullptr) : json(r.error)}};
    if (r.stats) {
      j["allocations"] = r.stats->allocations;
      j["deallocations"] = r.stats->deallocations;
      j["upstream_allocs"] = r.stats->upstream_allocs;
      j["upstream_frees"] = r.stats->upstream_frees;
      j["stats"] = json::parse(r.stats->to_json());
    } else {
      j["upstream_allocs"] = nullptr;
    }
    rows_j.push_back(std::move(j));
  }
  json doc = {{"benchmark", "alloc"},
              {"resource", resource},
              {"device", device},
              {"quick", quick},
              {"seed", seed},
              {"capacity", opt(capacity)},
              {"timer_overhead_ns", timer_overhead_ns},
              {"owner_bias", owner_bias},
              {"method", timing_method()},
              {"rows", std::move(rows_j)},
              {"summary", summary}};
  if (hooks) {
    doc["hooks"] = {{"check_ns", hooks->check_ns},
                    {"check_loop_ns", hooks->check_loop_ns},
                    {"empty_loop_ns", hooks->empty_loop_ns},
                    {"pair_no_hook_ns", hooks->pair_no_hook_ns},
                    {"pair_counting_ns", hooks->pair_counting_ns},
                    {"per_event_ns", hooks->per_event_ns},
                    {"threads", hooks->threads},
                    {"per_event_threads_ns", hooks->per_event_threads_ns},
                    {"events_per_pair", hooks->events_per_pair},
                    {"per_event_recorder_ns", hooks->per_event_recorder_ns},
                    {"per_event_snapshot_ns", hooks->per_event_snapshot_ns},
                    {"recorder_dropped", hooks->recorder_dropped},
                    {"snapshot_dropped", hooks->snapshot_dropped}};
  } else {
    doc["hooks"] = nullptr;
  }
  return doc.dump(2);
}

}  // namespace poolscope::bench
