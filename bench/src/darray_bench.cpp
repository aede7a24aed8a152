#include "poolscope/bench/darray_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "cuda_seam.hpp"
#include "poolscope/bench/text_table.hpp"
#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/darray/rank_trace.hpp"
#include "poolscope/byte_size.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/scope.hpp"
#include "poolscope/profiler/timeline.hpp"

namespace poolscope::bench {

namespace {

using darray::index_map;
using darray::shape_t;
using farray = darray::distributed_array<float>;
using detail::baseline_seconds;
using detail::device_link;

constexpr std::int64_t f32_bytes = 4;

std::string fmt(const char* f, double v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string mib(double bytes) {
  return fmt("%.2f MiB", bytes / (1024.0 * 1024.0));
}

// Best and median of timed samples (seconds).
baseline_seconds summarize(std::vector<double> s) {
  std::sort(s.begin(), s.end());
  baseline_seconds out;
  out.samples = static_cast<int>(s.size());
  out.best = s.empty() ? 0.0 : s.front();
  const std::size_t mid = s.size() / 2;
  out.median = s.empty() ? 0.0 : s.size() % 2 == 1 ? s[mid] : 0.5 * (s[mid - 1] + s[mid]);
  return out;
}

// Wall time of `op` (which returns once its work is complete): one untimed warm-up, then `runs`.
// Each run (the warm-up too) is a profiler scope named `scope` when one is given: a host slice of
// that name in the trace of `--trace` (nothing is recorded without a timeline or profiler).
// With `ranks` (a backend's group), each run starts after a barrier and a run's time is its
// slowest rank's: each rank waits for its own devices only (a group of one: no barrier, its own).
baseline_seconds time_op(int runs, const std::function<void()>& op, std::string_view scope = {},
                         darray::process_group* ranks = nullptr) {
  const auto one = [&] {
    if (scope.empty()) {
      op();
    } else {
      const profiler::scope s{scope};
      op();
    }
  };
  one();
  std::vector<std::int64_t> ns;
  for (int i = 0; i < std::max(runs, 1); ++i) {
    if (ranks != nullptr) {
      ranks->barrier();
    }
    const auto t0 = std::chrono::steady_clock::now();
    one();
    const auto t1 = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
  }
  if (ranks != nullptr) {
    ns = ranks->all_reduce(ns, darray::process_group::reduction::max);
  }
  std::vector<double> s;
  for (const std::int64_t t : ns) {
    s.push_back(static_cast<double>(t) * 1e-9);
  }
  return summarize(std::move(s));
}

// The time of an op in whole, and split into issuing it (until `make` returns its result) and
// waiting for that result (wait()). Samples are taken a round at a time, so that the rounds of
// several ops (and of their floor) can be interleaved and all see the same host state.
struct split_seconds {
  baseline_seconds total;
  baseline_seconds issue;
  baseline_seconds wait;
};
// Each run is a profiler scope of `site` (a slice of `--trace`'s trace, as time_op's).
struct split_samples {
  explicit split_samples(const profiler::scope_site& scope_of) : site(scope_of) {}

  const profiler::scope_site& site;
  std::vector<double> total;
  std::vector<double> issue;
  std::vector<double> wait;

  // One timed run of make().wait().
  template <typename Make>
  void take(Make& make) {
    const profiler::scope s(site);
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = make();
    const auto t1 = std::chrono::steady_clock::now();
    r.wait();
    const auto t2 = std::chrono::steady_clock::now();
    total.push_back(std::chrono::duration<double>(t2 - t0).count());
    issue.push_back(std::chrono::duration<double>(t1 - t0).count());
    wait.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  [[nodiscard]] split_seconds summary() const {
    return {summarize(total), summarize(issue), summarize(wait)};
  }
};

// Seconds per op of a chain of `length` ops issued back to back, each given the previous one's
// result (the first `start`), with one wait at the end: the rate a loop of dependent ops sustains,
// where each op's round trip to the devices hides behind the issuing of the next. Timed a chain
// at a time (to interleave with others); the last chain's result is kept for checking.
// Each chain (the warm-up too) is a profiler scope of `site`.
template <typename Array, typename Step>
struct chain_samples {
  const Array& start;
  int length;
  Step step;
  const profiler::scope_site& site;
  std::vector<double> per_op;
  Array last;

  chain_samples(const Array& s, int n, Step f, const profiler::scope_site& scope_of)
      : start(s), length(std::max(n, 1)), step(f), site(scope_of) {
    last = run();  // untimed warm-up
  }
  Array run() {
    const profiler::scope s(site);
    Array x = start;
    for (int k = 0; k < length; ++k) {
      x = step(x);
    }
    x.wait();
    return x;
  }
  void take() {
    const auto t0 = std::chrono::steady_clock::now();
    last = run();
    const auto t1 = std::chrono::steady_clock::now();
    per_op.push_back(std::chrono::duration<double>(t1 - t0).count() / length);
  }
};

// Runs `rounds` rounds of each of `takers` (callables taking one sample), in blocks of `block`
// rounds of one, then the next, round robin: interleaved, so that a host whose speed drifts
// during the run (the lent hosts do, by 20 % and more) moves every figure alike and their ratios
// hold; blocked, so that each op still runs with its code and data warm.
void interleave(int rounds, int block, const std::vector<std::function<void()>>& takers) {
  for (int done = 0; done < rounds;) {
    const int n = std::min(block, rounds - done);
    for (const auto& take : takers) {
      for (int i = 0; i < n; ++i) {
        take();
      }
    }
    done += n;
  }
}

// The memcpy stand-in for raw device copies on host devices: every link copied at once, one thread
// per link (the calling thread takes the first), between buffers touched beforehand.
baseline_seconds time_host_copies(const std::vector<device_link>& links, int runs) {
  std::vector<std::vector<char>> src;
  std::vector<std::vector<char>> dst;
  for (const auto& l : links) {
    src.emplace_back(std::max<std::size_t>(l.bytes, 1), '\1');
    dst.emplace_back(std::max<std::size_t>(l.bytes, 1), '\0');
  }
  volatile char sink = 0;
  const auto copy = [&](std::size_t i) {
    std::memcpy(dst[i].data(), src[i].data(), links[i].bytes);
  };
  const auto t = time_op(runs, [&] {
    std::vector<std::thread> helpers;
    for (std::size_t i = 1; i < links.size(); ++i) {
      helpers.emplace_back(copy, i);
    }
    if (!links.empty()) {
      copy(0);
    }
    for (auto& h : helpers) {
      h.join();
    }
    // Reading the copies keeps the compiler from dropping them as dead stores.
    for (const auto& d : dst) {
      sink = static_cast<char>(sink + d.back());
    }
  });
  (void)sink;
  return t;
}

// Equal blocks of [0, n) over `parts` devices, each boundary moved right by `shift_tenths` tenths
// of a block (integer arithmetic, so 2 parts shifted by 4 split at exactly 0.7 n for n % 20 == 0).
index_map shifted_blocks(std::int64_t n, int parts, std::int64_t shift_tenths) {
  std::vector<std::tuple<int, std::int64_t, std::int64_t>> ranges;
  std::int64_t start = 0;
  for (int d = 0; d < parts; ++d) {
    std::int64_t stop = n;
    if (d + 1 < parts) {
      stop = std::clamp<std::int64_t>(((d + 1) * 10 + shift_tenths) * n / (10 * parts), start, n);
    }
    ranges.emplace_back(d, start, stop);
    start = stop;
  }
  return index_map::split({n}, 0, ranges);
}

// [start, stop) of each device's single chunk along `axis` of a map built by split/blocks.
std::vector<std::pair<std::int64_t, std::int64_t>> ranges_of(const index_map& m, std::size_t axis,
                                                             int devices) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out(static_cast<std::size_t>(devices), {0, 0});
  for (const auto& c : m.chunks()) {
    const auto& s = c.region.dims.at(axis);
    out.at(static_cast<std::size_t>(c.device)) = {s.start, s.stop};
  }
  return out;
}

std::int64_t overlap(std::pair<std::int64_t, std::int64_t> a,
                     std::pair<std::int64_t, std::int64_t> b) {
  return std::max<std::int64_t>(0, std::min(a.second, b.second) - std::max(a.first, b.first));
}

// The links (src, dst, bytes) of a reshard plan, zero-byte ones dropped.
std::vector<device_link> links_of(const darray::reshard_plan& p) {
  std::vector<device_link> out;
  for (const auto& [src, dst, bytes] : p.link_bytes) {
    if (bytes > 0) {
      out.push_back({src, dst, static_cast<std::size_t>(bytes)});
    }
  }
  return out;
}

std::int64_t total_bytes(const std::vector<device_link>& links) {
  std::int64_t b = 0;
  for (const auto& l : links) {
    b += static_cast<std::int64_t>(l.bytes);
  }
  return b;
}

darray_baseline make_baseline(std::string method, std::int64_t bytes, const baseline_seconds& t) {
  darray_baseline b;
  b.method = std::move(method);
  b.bytes = bytes;
  b.best_ms = t.best * 1e3;
  b.median_ms = t.median * 1e3;
  b.gbps = t.best > 0 ? static_cast<double>(bytes) / t.best / 1e9 : 0.0;
  return b;
}

// `--trace`: a timeline attached to the backend for the runs (CUPTI's device activity on GPUs),
// detached and written when this goes, however the runs end. Nothing without a path. Over several
// ranks it records what `trace merge` needs (darray/rank_trace.hpp: distributedInfo, clocks
// sampled around barriers at the start and, by finish(), at the end), as the demo's does.
class bench_trace {
 public:
  bench_trace(std::shared_ptr<darray::backend> be, const std::string& path,
              const profiler::cupti_options& cupti, std::string_view between_ranks)
      : be_(std::move(be)) {
    if (path.empty()) {
      return;
    }
    profiler::timeline_options to;
    to.trace_path = path;
    to.cupti = be_->is_gpu();
    to.cupti_settings = cupti;
    to.distributed = darray::rank_trace_info(*be_, be_->is_gpu() ? between_ranks : "mpi");
    tl_.emplace(std::move(to));
    tl_->start();
    darray::sync_rank_clocks(*be_->group(), *tl_, "start");
    be_->set_timeline(&*tl_);
  }
  bench_trace(const bench_trace&) = delete;
  bench_trace& operator=(const bench_trace&) = delete;
  ~bench_trace() { stop(); }

  /// Detaches the timeline, samples the clocks at the end (collective: every rank's runs ended)
  /// and writes the trace.
  void finish() {
    if (tl_ && tl_->running()) {
      be_->synchronize();  // the transfers still being traced on workers end first
      be_->set_timeline(nullptr);
      darray::sync_rank_clocks(*be_->group(), *tl_, "end");
      tl_->stop();
    }
  }

 private:
  // Detaches the timeline and writes the trace, without the end's clocks (a run that threw: the
  // other ranks may not pass the barriers). Idempotent; never throws.
  void stop() noexcept {
    if (tl_ && tl_->running()) {
      be_->set_timeline(nullptr);
      tl_->stop();
    }
  }

  std::shared_ptr<darray::backend> be_;
  std::optional<profiler::timeline> tl_;
};

// Runs a workload's body, turning a failure into the workload's error (the run goes on).
class bench_run {
 public:
  bench_run(const darray_bench_options& o, std::shared_ptr<darray::backend> be,
            std::ostream* progress)
      : o_(o), be_(std::move(be)), progress_(progress) {
    devs_ = be_->device_count();
    gpu_ = be_->is_gpu();
    ranks_ = be_->group().get();
    n_ = o.n > 0 ? o.n : (gpu_ ? std::int64_t{1} << 29 : std::int64_t{1} << 20);
    mm_ = o.matmul_n > 0 ? o.matmul_n : (gpu_ ? 8192 : 256);
    how_ = o.transport == "peer"   ? darray::transport::peer
           : o.transport == "nccl" ? darray::transport::nccl
                                   : darray::transport::automatic;
  }

  [[nodiscard]] std::int64_t n() const noexcept { return n_; }

  darray_workload_result run(const std::string& name) {
    darray_workload_result w;
    w.name = name;
    say(name + " ...");
    const profiler::scope workload_scope{"bench." + name};
    try {
      if (name == "D1") {
        d1(w);
      } else if (name == "D2") {
        d2(w);
      } else if (name == "D3") {
        d3(w);
      } else if (name == "D4") {
        d4(w);
      } else {
        d5(w);
      }
    } catch (const std::exception& e) {
      w.error = e.what();
      say(name + " failed: " + w.error);
    }
    try {
      be_->synchronize();  // return every buffer of this workload before the next one
    } catch (const std::exception& e) {
      if (w.error.empty()) {
        w.error = e.what();
      }
    }
    return w;
  }

 private:
  void say(const std::string& s) const {
    if (progress_ != nullptr) {
      *progress_ << "[bench darray] " << s << '\n' << std::flush;
    }
  }

  // The seed example's arrays of n elements, ready: A = 1 and B = 2 in equal blocks, C = 3 in
  // blocks shifted by 0.4 block (so A + C.reshard(A.index_map()) moves 0.4 block per boundary).
  struct seed {
    index_map a_map;
    index_map c_map;
    farray a;
    farray b;
    farray c;
  };
  [[nodiscard]] seed seed_arrays(std::int64_t n) const {
    const shape_t shape{n};
    seed s{shifted_blocks(n, devs_, 0), shifted_blocks(n, devs_, devs_ > 1 ? 4 : 0), {}, {}, {}};
    s.a = farray::full(be_, 1.0f, shape, s.a_map);
    s.b = farray::full(be_, 2.0f, shape, s.a_map);
    s.c = farray::full(be_, 3.0f, shape, s.c_map);
    s.a.wait();
    s.b.wait();
    s.c.wait();
    return s;
  }

  [[nodiscard]] darray::reshard_options reshard_options() const {
    darray::reshard_options r;
    r.how = how_;
    r.split_bytes = o_.split_mib << 20;
    return r;
  }

  // Raw copies of `links` with the baseline of this machine (CUDA peer copies or memcpy).
  [[nodiscard]] darray_baseline raw_copies(const std::vector<device_link>& links, int runs) const {
    const std::int64_t bytes = total_bytes(links);
    if (gpu_) {
      return make_baseline("cudaMemcpyPeerAsync", bytes, detail::time_peer_copies(links, runs));
    }
    return make_baseline("memcpy", bytes, time_host_copies(links, runs));
  }

  // The baselines of a reshard's links: raw copies, and on GPUs NCCL send/recv. Their calls move
  // between one process's devices: none in a run of several ranks.
  void link_baselines(darray_workload_result& w, const std::vector<device_link>& links) const {
    if (links.empty() || ranks_->size() > 1) {
      return;
    }
    w.baselines["peer"] = raw_copies(links, o_.repeat);
    if (gpu_) {
      w.baselines["nccl"] = make_baseline("ncclSend/ncclRecv", total_bytes(links),
                                          detail::time_nccl_send_recv(links, devs_, o_.repeat));
    }
  }

  void d1(darray_workload_result& w) {
    w.what = "1-D float32 A + C.reshard(A.index_map()), A at n/2, C at 0.7 n (2 devices)";
    const auto [a_map, c_map, a, b, c] = seed_arrays(n_);
    const auto t_add = time_op(
        o_.repeat, [&] { (a + b).wait(); }, "bench.D1.add", ranks_);
    std::shared_ptr<const darray::reshard_plan> plan;
    const auto t_reshard = time_op(
        o_.repeat,
        [&] {
          const auto moved = c.reshard(a.index_map(), reshard_options());
          moved.wait();
          plan = moved.handle().last_reshard().plan;
        },
        "bench.D1.reshard", ranks_);
    const auto t_fused = time_op(
        o_.repeat, [&] { (a + c.reshard(a.index_map(), reshard_options())).wait(); },
        "bench.D1.fused", ranks_);
    // The same with the reshard inside the op (maps differ; default reshard options): the adds
    // of the parts in place are enqueued once every link's first copy is (docs/darray.md).
    const auto t_inside = time_op(
        o_.repeat, [&] { (a + c).wait(); }, "bench.D1.fused_inside", ranks_);

    // What must move, from the maps alone: each device's A range minus its C range.
    const auto ar = ranges_of(a_map, 0, devs_);
    const auto cr = ranges_of(c_map, 0, devs_);
    std::int64_t expected = 0;
    for (std::size_t d = 0; d < ar.size(); ++d) {
      expected += (ar[d].second - ar[d].first - overlap(ar[d], cr[d])) * f32_bytes;
    }
    auto& f = w.figures;
    f["n"] = static_cast<double>(n_);
    f["bytes_moved"] = static_cast<double>(plan->bytes_remote);
    f["bytes_local"] = static_cast<double>(plan->bytes_local);
    f["bytes_expected"] = static_cast<double>(expected);
    f["t_add_ms"] = t_add.best * 1e3;
    f["t_reshard_ms"] = t_reshard.best * 1e3;
    f["t_fused_ms"] = t_fused.best * 1e3;
    f["t_add_median_ms"] = t_add.median * 1e3;
    f["t_reshard_median_ms"] = t_reshard.median * 1e3;
    f["t_fused_median_ms"] = t_fused.median * 1e3;
    f["t_fused_inside_ms"] = t_inside.best * 1e3;
    f["t_fused_inside_median_ms"] = t_inside.median * 1e3;
    if (const auto eta =
            fusion_eta(f["t_add_ms"], f["t_reshard_ms"], f["t_fused_ms"], plan->bytes_remote)) {
      f["eta"] = *eta;  // absent when nothing moves (one device)
    }
    f["reshard_gbps"] = static_cast<double>(plan->bytes_remote) / t_reshard.best / 1e9;

    link_baselines(w, links_of(*plan));
    if (devs_ > 1 && plan->bytes_remote > 0 && ranks_->size() == 1) {
      // The bare link between devices 0 and 1 with the same bytes: one way, and both at once.
      const auto bytes = static_cast<std::size_t>(plan->bytes_remote);
      w.baselines["peer_one_way"] = raw_copies({{0, 1, bytes}}, o_.repeat);
      w.baselines["peer_bidirectional"] = raw_copies({{0, 1, bytes}, {1, 0, bytes}}, o_.repeat);
    }
    for (const char* k : {"peer", "nccl"}) {
      const auto it = w.baselines.find(k);
      if (it != w.baselines.end() && it->second.gbps > 0) {
        f[std::string("ratio_") + k] = f["reshard_gbps"] / it->second.gbps;
      }
    }
  }

  void d2(darray_workload_result& w) {
    w.what = "2-D float32 full swap rows -> columns, fused with an add: X.reshard(cols) + Z";
    const std::int64_t side = d2_side(n_, devs_);
    const shape_t shape{side, side};
    const index_map rows = index_map::blocks(shape, 0, devs_);
    const index_map cols = index_map::blocks(shape, 1, devs_);
    const auto x = farray::full(be_, 1.0f, shape, rows);
    const auto z = farray::full(be_, 2.0f, shape, cols);
    x.wait();
    z.wait();
    std::shared_ptr<const darray::reshard_plan> plan;
    const auto t_reshard = time_op(
        o_.repeat,
        [&] {
          const auto moved = x.reshard(cols, reshard_options());
          moved.wait();
          plan = moved.handle().last_reshard().plan;
        },
        "bench.D2.reshard", ranks_);
    const auto t_fused = time_op(
        o_.repeat, [&] { (x.reshard(cols, reshard_options()) + z).wait(); }, "bench.D2.fused",
        ranks_);

    // Device d keeps the rows-block d x cols-block d square; the rest of its column block moves.
    const auto rr = ranges_of(rows, 0, devs_);
    const auto cr = ranges_of(cols, 1, devs_);
    std::int64_t expected = 0;
    for (std::size_t d = 0; d < rr.size(); ++d) {
      expected += (side - (rr[d].second - rr[d].first)) * (cr[d].second - cr[d].first) * f32_bytes;
    }
    auto& f = w.figures;
    f["side"] = static_cast<double>(side);
    f["bytes_array"] = static_cast<double>(side * side * f32_bytes);
    f["bytes_moved"] = static_cast<double>(plan->bytes_remote);
    f["bytes_expected"] = static_cast<double>(expected);
    f["t_reshard_ms"] = t_reshard.best * 1e3;
    f["t_fused_ms"] = t_fused.best * 1e3;
    f["t_reshard_median_ms"] = t_reshard.median * 1e3;
    f["t_fused_median_ms"] = t_fused.median * 1e3;
    f["reshard_gbps"] = static_cast<double>(plan->bytes_remote) / t_reshard.best / 1e9;
    link_baselines(w, links_of(*plan));
    for (const char* k : {"peer", "nccl"}) {
      const auto it = w.baselines.find(k);
      if (it != w.baselines.end() && f["t_fused_ms"] > 0) {
        f[std::string("ratio_") + k] = it->second.best_ms / f["t_fused_ms"];
      }
    }
  }

  void d3(darray_workload_result& w) {
    w.what = "D1's ops at n = 4096: per-op overhead";
    const std::int64_t n = 4096;
    const int runs = std::max(100, 20 * o_.repeat);
    const auto [a_map, c_map, a, b, c] = seed_arrays(n);
    std::shared_ptr<const darray::reshard_plan> plan;
    const auto add = [&] { return a + b; };
    const auto fused = [&] {
      const auto moved = c.reshard(a.index_map(), reshard_options());
      plan = moved.handle().last_reshard().plan;
      return a + moved;
    };
    // What A + B cannot avoid on GPUs: one async call and one event per device, a sync per event.
    const auto per_device =
        static_cast<std::size_t>(n) * sizeof(float) / static_cast<std::size_t>(std::max(devs_, 1));
    std::unique_ptr<detail::async_floor> floor_calls;
    // The op's own calls without its bookkeeping: a one-kernel graph launched as it is and an
    // event per GPU (what the backend issues when it launches kernels as graphs).
    std::unique_ptr<detail::async_floor> graph_floor_calls;
    if (gpu_) {
      floor_calls = std::make_unique<detail::async_floor>(devs_, per_device);
      graph_floor_calls = std::make_unique<detail::async_floor>(
          devs_, per_device, std::vector<detail::device_link>{}, detail::floor_call::kernel_graph);
    }
    // The same ops chained: x = x + B (x = x + C.reshard(A.index_map())) `chain` times, one wait.
    constexpr int chain = 64;
    const int chains = std::max(10, runs / 10);
    const auto add_step = [&](const farray& x) { return x + b; };
    const auto fused_step = [&](const farray& x) {
      return x + c.reshard(a.index_map(), reshard_options());
    };
    // One untimed round of each, then the op, the fused op and the floors in interleaved blocks;
    // each run of the ops (their warm-ups too), of the floors and each chain a profiler scope: a
    // slice of `--trace`'s trace (bench.D3.add, .fused, .floor, .floor_fused, .add_chain, ...).
    static const profiler::scope_site add_site{"bench.D3.add"};
    static const profiler::scope_site fused_site{"bench.D3.fused"};
    static const profiler::scope_site floor_site{"bench.D3.floor"};
    static const profiler::scope_site floor_fused_site{"bench.D3.floor_fused"};
    static const profiler::scope_site add_chain_site{"bench.D3.add_chain"};
    static const profiler::scope_site fused_chain_site{"bench.D3.fused_chain"};
    static const profiler::scope_site floor_chain_site{"bench.D3.floor_chain"};
    static const profiler::scope_site floor_graphs_site{"bench.D3.floor_graphs"};
    static const profiler::scope_site floor_graphs_chain_site{"bench.D3.floor_graphs_chain"};
    static const profiler::scope_site floor_fused_graphs_site{"bench.D3.floor_fused_graphs"};
    split_samples(add_site).take(add);
    split_samples(fused_site).take(fused);
    split_samples add_samples(add_site);
    split_samples fused_samples(fused_site);
    // The fused op's floors: the same calls after the reshard's copies, each receiver waiting
    // (cudaMemcpyPeerAsync and memsets; the op's own launches: kernel graphs for both).
    std::unique_ptr<detail::async_floor> fused_floor_calls;
    std::unique_ptr<detail::async_floor> fused_graph_floor_calls;
    if (gpu_) {
      fused_floor_calls = std::make_unique<detail::async_floor>(devs_, per_device, links_of(*plan));
      fused_graph_floor_calls = std::make_unique<detail::async_floor>(
          devs_, per_device, links_of(*plan), detail::floor_call::kernel_graph);
    }
    std::vector<double> floor_samples;
    std::vector<double> floor_chain_samples;
    std::vector<double> graph_floor_samples;
    std::vector<double> graph_floor_chain_samples;
    std::vector<double> fused_floor_samples;
    std::vector<double> fused_graph_floor_samples;
    const auto time_floor = [](detail::async_floor& calls, std::vector<double>& out, int length,
                               const profiler::scope_site& site) {
      const profiler::scope sc{site};
      const auto t0 = std::chrono::steady_clock::now();
      calls.issue(length);
      calls.wait();
      const auto t1 = std::chrono::steady_clock::now();
      out.push_back(std::chrono::duration<double>(t1 - t0).count() / length);
    };
    // A floor (when it has calls) as one more round of `rounds`: `length` calls, one wait.
    const auto add_floor = [&time_floor](std::vector<std::function<void()>>& rounds,
                                         detail::async_floor* calls, std::vector<double>& out,
                                         int length, const profiler::scope_site& site) {
      if (calls != nullptr) {
        rounds.emplace_back(
            [&time_floor, calls, &out, length, &site] { time_floor(*calls, out, length, site); });
      }
    };
    std::vector<std::function<void()>> singles{[&] { add_samples.take(add); },
                                               [&] { fused_samples.take(fused); }};
    // Each floor's calls once untimed, then a single round in the interleaved blocks.
    for (detail::async_floor* calls : {floor_calls.get(), graph_floor_calls.get(),
                                       fused_floor_calls.get(), fused_graph_floor_calls.get()}) {
      if (calls != nullptr) {
        calls->issue();
        calls->wait();
      }
    }
    add_floor(singles, floor_calls.get(), floor_samples, 1, floor_site);
    add_floor(singles, graph_floor_calls.get(), graph_floor_samples, 1, floor_graphs_site);
    add_floor(singles, fused_floor_calls.get(), fused_floor_samples, 1, floor_fused_site);
    add_floor(singles, fused_graph_floor_calls.get(), fused_graph_floor_samples, 1,
              floor_fused_graphs_site);
    interleave(runs, 10, singles);
    chain_samples add_chain(a, chain, add_step, add_chain_site);
    chain_samples fused_chain(a, chain, fused_step, fused_chain_site);
    std::vector<std::function<void()>> chained{[&] { add_chain.take(); },
                                               [&] { fused_chain.take(); }};
    add_floor(chained, floor_calls.get(), floor_chain_samples, chain, floor_chain_site);
    add_floor(chained, graph_floor_calls.get(), graph_floor_chain_samples, chain,
              floor_graphs_chain_site);
    interleave(chains, 1, chained);
    const split_seconds t_add = add_samples.summary();
    const split_seconds t_fused = fused_samples.summary();
    const baseline_seconds t_add_chain = summarize(add_chain.per_op);
    const baseline_seconds t_fused_chain = summarize(fused_chain.per_op);
    const farray& add_last = add_chain.last;
    const farray& fused_last = fused_chain.last;
    // The values too: a wrong result at this size would make the times meaningless.
    const auto every = [](const std::vector<float>& v, float want) {
      return std::all_of(v.begin(), v.end(), [want](float e) { return e == want; });
    };
    if (!every((a + c.reshard(a.index_map(), reshard_options())).to_host(), 4.0f)) {
      throw runtime_error("bench darray D3: A + C.reshard(A.index_map()) is not 4 everywhere");
    }
    // 1 + 64 * 2 and 1 + 64 * 3: exact in float.
    if (!every(add_last.to_host(), 1.0f + 2.0f * chain) ||
        !every(fused_last.to_host(), 1.0f + 3.0f * chain)) {
      throw runtime_error("bench darray D3: a chain of 64 ops did not sum to 129 / 193 everywhere");
    }
    auto& f = w.figures;
    f["n"] = static_cast<double>(n);
    f["runs"] = runs;
    f["bytes_moved"] = static_cast<double>(plan->bytes_remote);
    f["t_add_us"] = t_add.total.median * 1e6;
    f["t_fused_us"] = t_fused.total.median * 1e6;
    f["t_add_enqueue_us"] = t_add.issue.median * 1e6;
    f["t_add_wait_us"] = t_add.wait.median * 1e6;
    f["t_fused_enqueue_us"] = t_fused.issue.median * 1e6;
    f["t_fused_wait_us"] = t_fused.wait.median * 1e6;
    f["chain"] = chain;
    f["t_add_chained_us"] = t_add_chain.median * 1e6;
    f["t_fused_chained_us"] = t_fused_chain.median * 1e6;
    f["t_add_best_us"] = t_add.total.best * 1e6;
    f["t_fused_best_us"] = t_fused.total.best * 1e6;
    const auto links = links_of(*plan);
    if (!links.empty()) {
      w.baselines["peer"] = raw_copies(links, runs);
    }
    if (floor_calls) {
      w.baselines["floor"] = make_baseline("a memset + event per GPU", 0, summarize(floor_samples));
      w.baselines["floor_chained"] =
          make_baseline("memsets + events chained, one wait", 0, summarize(floor_chain_samples));
      w.baselines["floor_fused"] =
          make_baseline("memsets after cudaMemcpyPeerAsync", 0, summarize(fused_floor_samples));
      w.baselines["floor_graphs"] =
          make_baseline("a kernel graph + event per GPU", 0, summarize(graph_floor_samples));
      w.baselines["floor_graphs_chained"] = make_baseline(
          "kernel graphs + events chained, one wait", 0, summarize(graph_floor_chain_samples));
      w.baselines["floor_fused_graphs"] = make_baseline("kernel graphs after a kernel-graph copy",
                                                        0, summarize(fused_graph_floor_samples));
      // Their streams and buffers go before the threaded floor's are made.
      floor_calls.reset();
      graph_floor_calls.reset();
      fused_floor_calls.reset();
      fused_graph_floor_calls.reset();
      // Apart, not interleaved: its spinning threads would take the cores the ops issue from.
      w.baselines["floor_threaded"] =
          make_baseline("memsets, a thread per GPU", 0,
                        detail::time_async_floor_threaded(devs_, per_device, runs));
      // Last, and apart: whether the driver takes it is part of what it tells (a failure is a
      // row, not the workload's end).
      try {
        w.baselines["floor_graph"] =
            make_baseline("memsets as one graph for all GPUs", 0,
                          detail::time_graph_floor(devs_, per_device, runs));
      } catch (const std::exception& e) {
        darray_baseline failed;
        failed.method = std::string("one graph for all GPUs failed: ") + e.what();
        failed.best_ms = failed.median_ms = -1.0;
        w.baselines["floor_graph"] = failed;
      }
    }
  }

  void d4(darray_workload_result& w) {
    w.what = "one device: A + B bandwidth (2 reads + 1 write) over copy bandwidth (1 + 1)";
    const shape_t shape{n_};
    const index_map one = index_map::split(shape, 0, {{0, 0, n_}});
    const auto a = farray::full(be_, 1.0f, shape, one);
    const auto b = farray::full(be_, 2.0f, shape, one);
    a.wait();
    b.wait();
    const auto t_add = time_op(
        o_.repeat, [&] { (a + b).wait(); }, "bench.D4.add");
    const auto bytes = static_cast<std::size_t>(n_ * f32_bytes);
    const darray_baseline copy = gpu_ ? make_baseline("cudaMemcpyAsync d2d", n_ * f32_bytes,
                                                      detail::time_d2d_copy(0, bytes, o_.repeat))
                                      : make_baseline("memcpy", n_ * f32_bytes,
                                                      time_host_copies({{0, 0, bytes}}, o_.repeat));
    auto& f = w.figures;
    f["n"] = static_cast<double>(n_);
    f["t_add_ms"] = t_add.best * 1e3;
    f["t_add_median_ms"] = t_add.median * 1e3;
    f["add_gbps"] = 3.0 * static_cast<double>(n_ * f32_bytes) / t_add.best / 1e9;
    // A copy moves each byte twice (read + write): its bandwidth counts both, like the add's.
    f["copy_gbps"] = 2.0 * copy.gbps;
    f["ratio"] = f["copy_gbps"] > 0 ? f["add_gbps"] / f["copy_gbps"] : 0.0;
    w.baselines["copy"] = copy;
  }

  void d5(darray_workload_result& w) {
    w.what = "block matmul on grid maps, matmul(x, y).change_mode(replica)";
    const std::int64_t m = mm_;
    const shape_t sq{m, m};
    // x: devs x 2 blocks, y: 2 x devs blocks; block (i, j) on device (i + j) % devs.
    std::vector<std::vector<int>> gx(static_cast<std::size_t>(devs_), std::vector<int>(2));
    std::vector<std::vector<int>> gy(2, std::vector<int>(static_cast<std::size_t>(devs_)));
    for (int i = 0; i < devs_; ++i) {
      for (int j = 0; j < 2; ++j) {
        gx[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = (i + j) % devs_;
        gy[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)] = (i + j) % devs_;
      }
    }
    const auto x = farray::full(be_, 0.5f, sq, index_map::grid(sq, devs_, 2, gx));
    const auto y = farray::full(be_, 0.25f, sq, index_map::grid(sq, 2, devs_, gy));
    const index_map one = index_map::split(sq, 0, {{0, 0, m}});
    const auto x1 = farray::full(be_, 0.5f, sq, one);
    const auto y1 = farray::full(be_, 0.25f, sq, one);
    x.wait();
    y.wait();
    x1.wait();
    y1.wait();
    const auto replica = darray::array_mode::replica;
    const auto t = time_op(
        o_.repeat, [&] { darray::matmul(x, y).change_mode(replica).wait(); }, "bench.D5.matmul",
        ranks_);
    const auto t1 = time_op(
        o_.repeat, [&] { darray::matmul(x1, y1).change_mode(replica).wait(); }, {}, ranks_);
    const double flop =
        2.0 * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(m);
    auto& f = w.figures;
    f["m"] = static_cast<double>(m);
    f["t_ms"] = t.best * 1e3;
    f["t_median_ms"] = t.median * 1e3;
    f["tflops"] = flop / t.best / 1e12;
    f["t_one_device_ms"] = t1.best * 1e3;
    f["tflops_one_device"] = flop / t1.best / 1e12;
    f["speedup"] = t1.best / t.best;
    w.baselines["one_device"] =
        darray_baseline{"darray matmul on device 0", 0, t1.best * 1e3, t1.median * 1e3, 0.0};
  }

  const darray_bench_options& o_;
  std::shared_ptr<darray::backend> be_;
  std::ostream* progress_;
  int devs_ = 0;
  bool gpu_ = false;
  darray::process_group* ranks_ = nullptr;  // be_'s group
  std::int64_t n_ = 0;
  std::int64_t mm_ = 0;
  darray::transport how_ = darray::transport::automatic;
};

// --- the table ---

std::string ms(double v) {
  return fmt("%.3f ms", v);
}
std::string gbps(double v) {
  return fmt("%.1f GB/s", v);
}

const darray_baseline* find_baseline(const darray_workload_result& w, const std::string& k) {
  const auto it = w.baselines.find(k);
  return it == w.baselines.end() ? nullptr : &it->second;
}

double figure(const darray_workload_result& w, const std::string& k) {
  const auto it = w.figures.find(k);
  return it == w.figures.end() ? 0.0 : it->second;
}

// Adds the rows of one workload. `gpu` decides whether targets are checked; `at_scale` whether
// the absolute-time targets (set for 2^29 elements / 16384^2 on two GPUs) apply.
void add_rows(const darray_workload_result& w, bool gpu, bool at_scale, const std::string& raw,
              std::vector<darray_bench_row>& rows) {
  const auto row = [&](std::string figure_name, std::string value, std::string baseline = "",
                       std::string ratio = "", std::string target = "",
                       std::optional<bool> met = std::nullopt) {
    rows.push_back(darray_bench_row{w.name, std::move(figure_name), std::move(value),
                                    std::move(baseline), std::move(ratio), std::move(target),
                                    gpu ? met : std::nullopt});
  };
  if (!w.error.empty()) {
    row("FAILED", w.error);
    return;
  }
  if (w.name == "D1") {
    const double fused = figure(w, "t_fused_ms");
    const bool has_eta = w.figures.count("eta") != 0;
    const double eta = has_eta ? figure(w, "eta") : 0.0;
    row("A + B", ms(figure(w, "t_add_ms")));
    row("C.reshard(A.index_map())", ms(figure(w, "t_reshard_ms")),
        "moves " + mib(figure(w, "bytes_moved")));
    row("A + C.reshard(A.index_map())", ms(fused), "", "", at_scale ? "<= 1.3 ms" : "",
        at_scale ? std::optional<bool>(fused <= 1.3) : std::nullopt);
    row("A + C (the reshard inside the op)", ms(figure(w, "t_fused_inside_ms")),
        ms(fused) + " with C.reshard(...) first");
    if (has_eta) {
      row("eta", fmt("%.2f", eta), "", "", ">= 0.85", eta >= 0.85);
    } else {
      row("eta", "n/a", "nothing moves between devices");
    }
    if (const auto* p = find_baseline(w, "peer")) {
      const double r = figure(w, "ratio_peer");
      row("reshard bandwidth / raw copy", gbps(figure(w, "reshard_gbps")),
          gbps(p->gbps) + " " + raw, format_ratio(r), ">= 0.95", r >= 0.95);
    }
    if (const auto* p = find_baseline(w, "nccl")) {
      row("reshard bandwidth / NCCL", gbps(figure(w, "reshard_gbps")),
          gbps(p->gbps) + " NCCL send/recv", format_ratio(figure(w, "ratio_nccl")));
    }
    if (const auto* p = find_baseline(w, "peer_one_way")) {
      row("raw link 0 -> 1, same bytes", gbps(p->gbps), raw);
    }
    if (const auto* p = find_baseline(w, "peer_bidirectional")) {
      row("raw link 0 <-> 1 at once, total", gbps(p->gbps), raw);
    }
  } else if (w.name == "D2") {
    const double fused = figure(w, "t_fused_ms");
    row("side x side", fmt("%.0f^2", figure(w, "side")), mib(figure(w, "bytes_array")));
    row("X.reshard(cols)", ms(figure(w, "t_reshard_ms")), "moves " + mib(figure(w, "bytes_moved")));
    const auto* p = find_baseline(w, "peer");
    row("X.reshard(cols) + Z", ms(fused), p != nullptr ? ms(p->best_ms) + " " + raw : "",
        p != nullptr ? format_ratio(figure(w, "ratio_peer")) : "", at_scale ? "<= 0.9 ms" : "",
        at_scale ? std::optional<bool>(fused <= 0.9) : std::nullopt);
    if (const auto* q = find_baseline(w, "nccl")) {
      row("X.reshard(cols) + Z vs NCCL", ms(fused), ms(q->best_ms) + " NCCL send/recv",
          format_ratio(figure(w, "ratio_nccl")));
    }
  } else if (w.name == "D3") {
    const double add = figure(w, "t_add_us");
    const double fused = figure(w, "t_fused_us");
    const double chained = figure(w, "t_add_chained_us");
    const auto cell = [](const darray_baseline* b) {
      if (b == nullptr) {
        return std::string();
      }
      return b->median_ms < 0 ? b->method : fmt("%.1f us ", b->median_ms * 1e3) + b->method;
    };
    const auto ratio = [](const darray_baseline* b, double value) {
      return b != nullptr && b->median_ms > 0 && value > 0
                 ? format_ratio(b->median_ms * 1e3 / value)
                 : std::string();
    };
    // A floor of its own row (when the run measured it).
    const auto floor_row = [&](const char* label, const char* key, double value) {
      if (const auto* b = find_baseline(w, key)) {
        row(label, "", cell(b), ratio(b, value));
      }
    };
    // The ops beside their own calls without their bookkeeping (kernel graphs, the small copy a
    // kernel too) when measured; the memset floors in rows of their own.
    const auto* graphs = find_baseline(w, "floor_graphs");
    const auto* floor = graphs != nullptr ? graphs : find_baseline(w, "floor");
    row("A + B, n = 4096 (median)", fmt("%.1f us", add), cell(floor), ratio(floor, add), "<= 8 us",
        add <= 8.0);
    if (graphs != nullptr) {
      floor_row("  floor with memsets (median)", "floor", add);
    }
    floor_row("  floor with parallel issue (median)", "floor_threaded", add);
    floor_row("  floor as one graph (median)", "floor_graph", add);
    const auto* p = find_baseline(w, "peer");
    row("A + C.reshard(A.index_map()) (median)", fmt("%.1f us", fused),
        p != nullptr ? fmt("%.1f us ", p->median_ms * 1e3) + raw : "", ratio(p, fused), "<= 20 us",
        fused <= 20.0);
    floor_row("  floor with its calls (median)", "floor_fused_graphs", fused);
    floor_row("  floor with memsets, peer copy (median)", "floor_fused", fused);
    row("  of which issuing / waiting (medians)",
        fmt("%.1f / ", figure(w, "t_add_enqueue_us")) + fmt("%.1f us", figure(w, "t_add_wait_us")),
        fmt("%.1f / ", figure(w, "t_fused_enqueue_us")) +
            fmt("%.1f us fused", figure(w, "t_fused_wait_us")));
    const auto* graphs_chained = find_baseline(w, "floor_graphs_chained");
    const auto* chained_floor =
        graphs_chained != nullptr ? graphs_chained : find_baseline(w, "floor_chained");
    row("  per op in a chain of 64, one wait (medians)", fmt("%.1f us", chained),
        cell(chained_floor), ratio(chained_floor, chained));
    if (graphs_chained != nullptr) {
      floor_row("  floor with memsets, chained", "floor_chained", chained);
    }
    row("  fused, per op in a chain of 64", fmt("%.1f us", figure(w, "t_fused_chained_us")));
  } else if (w.name == "D4") {
    const double r = figure(w, "ratio");
    const auto* p = find_baseline(w, "copy");
    row("A + B on one device", ms(figure(w, "t_add_ms")), p != nullptr ? ms(p->best_ms) : "");
    row("add bandwidth / copy bandwidth", gbps(figure(w, "add_gbps")),
        gbps(figure(w, "copy_gbps")) + " " + (p != nullptr ? p->method : ""), format_ratio(r),
        ">= 0.90", r >= 0.9);
  } else if (w.name == "D5") {
    row("matmul " + fmt("%.0f", figure(w, "m")) + "^2, change_mode(replica)", ms(figure(w, "t_ms")),
        ms(figure(w, "t_one_device_ms")) + " on device 0", format_ratio(figure(w, "speedup")));
    row("achieved", fmt("%.3f TFLOP/s", figure(w, "tflops")),
        fmt("%.3f TFLOP/s", figure(w, "tflops_one_device")));
  }
}

}  // namespace

std::vector<std::string> darray_workload_names() {
  return {"D1", "D2", "D3", "D4", "D5"};
}

void darray_bench_report::print_table(std::ostream& out) const {
  out << text;
}

bool darray_bench_report::any_error() const {
  return std::any_of(workloads.begin(), workloads.end(),
                     [](const darray_workload_result& w) { return !w.error.empty(); });
}

std::string darray_bench_report::to_json() const {
  nlohmann::json j;
  j["benchmark"] = "darray";
  j["backend"] = backend;
  j["devices"] = devices;
  j["gpu"] = gpu;
  j["device_names"] = device_names;
  j["baselines"] = baselines;
  j["allocator"] = allocator;
  j["transport"] = transport;
  j["between_ranks"] = between_ranks;
  j["staging_chunk_bytes"] = staging_chunk_bytes;
  j["issue_threads"] = issue_threads;
  j["kernel_graphs"] = kernel_graphs;
  j["yield_to_copies"] = yield_to_copies;
  j["split_mib"] = split_mib;
  j["repeat"] = repeat;
  j["n"] = n;
  j["trace"] = trace_path;
  j["cupti_kinds"] = cupti_kinds;
  j["timing"] =
      "wall clock from the first enqueue to the end of wait(); one untimed warm-up, then repeat "
      "runs (D3: max(100, 20 * repeat)); *_ms figures are the best run, *_median_ms the median; "
      "D3's *_us figures are medians";
  nlohmann::json ws = nlohmann::json::object();
  for (const auto& w : workloads) {
    nlohmann::json jw;
    jw["what"] = w.what;
    jw["figures"] = w.figures;
    nlohmann::json bs = nlohmann::json::object();
    for (const auto& [k, b] : w.baselines) {
      bs[k] = {{"method", b.method},
               {"bytes", b.bytes},
               {"best_ms", b.best_ms},
               {"median_ms", b.median_ms},
               {"gbps", b.gbps}};
    }
    jw["baselines"] = bs;
    jw["backend"] = w.backend;
    jw["error"] = w.error;
    ws[w.name] = jw;
  }
  j["workloads"] = ws;
  nlohmann::json rs = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json jr{{"workload", r.workload}, {"figure", r.figure}, {"value", r.value},
                      {"baseline", r.baseline}, {"ratio", r.ratio},   {"target", r.target}};
    if (r.met) {
      jr["met"] = *r.met;
    }
    rs.push_back(jr);
  }
  j["rows"] = rs;
  j["summary"] = summary;
  return j.dump(2);
}

darray_bench_report run_darray_bench(const darray_bench_options& o, std::ostream* progress) {
  if (o.split_mib < 0 || o.split_mib > (std::int64_t{1} << 30)) {
    throw invalid_argument("poolscope bench darray: split " + std::to_string(o.split_mib) +
                           " MiB is out of range (0 to 2^30 MiB; 0: never split)");
  }
  if (o.transport != "auto" && o.transport != "peer" && o.transport != "nccl") {
    throw invalid_argument("poolscope bench darray: transport '" + o.transport +
                           "' (expected auto, peer or nccl)");
  }
  if (o.repeat < 1) {
    throw invalid_argument("poolscope bench darray: repeat " + std::to_string(o.repeat) +
                           " (at least 1)");
  }
  if (o.n < 0 || o.matmul_n < 0) {
    throw invalid_argument("poolscope bench darray: n " + std::to_string(o.n) + ", matmul_n " +
                           std::to_string(o.matmul_n) + " (must not be negative)");
  }
  // Checked before any device is touched: a bad list is the caller's error, not CUPTI's.
  const profiler::cupti_options cupti = profiler::with_activity_kinds(o.cupti_kinds);
  const auto all = darray_workload_names();
  for (const auto& w : o.only) {
    if (std::find(all.begin(), all.end(), w) == all.end()) {
      throw invalid_argument("poolscope bench darray: workload '" + w +
                             "' (expected D1, D2, D3, D4 or D5)");
    }
  }
  darray::backend_options bo;
  bo.allocator = o.allocator;
  bo.issue_threads = o.issue_threads;
  bo.kernel_graphs = o.kernel_graphs;
  bo.yield_to_copies = o.yield_to_copies;
  bo.transfers = o.transport == "peer"   ? darray::transport::peer
                 : o.transport == "nccl" ? darray::transport::nccl
                                         : darray::transport::automatic;
  bo.between_ranks = darray::parse_rank_transport(o.between_ranks);
  bo.staging_chunk_bytes = parse_byte_size(o.staging_chunk);
  bo.group = o.group;
  auto be = darray::make_backend(o.devices, bo);
  const bool ranks = be->group()->size() > 1;
  // D3 and D4 measure the floors and copies of one process's CUDA calls: not across ranks.
  const auto one_process_only = [](const std::string& w) { return w == "D3" || w == "D4"; };
  for (const auto& w : o.only) {
    if (ranks && one_process_only(w)) {
      throw invalid_argument("poolscope bench darray: " + w +
                             " measures one process's calls: run it without a launcher");
    }
  }

  darray_bench_report rep;
  rep.backend = be->name();
  rep.devices = be->device_count();
  rep.gpu = be->is_gpu();
  for (int d = 0; d < rep.devices; ++d) {
    rep.device_names.push_back(be->device_name(d));
  }
  rep.baselines = rep.gpu ? "cuda" : "memcpy";
  rep.allocator = o.allocator;
  rep.transport = o.transport;
  rep.between_ranks = o.between_ranks;
  rep.staging_chunk_bytes = bo.staging_chunk_bytes;
  rep.issue_threads = be->issue_threads();
  rep.kernel_graphs = o.kernel_graphs;
  rep.yield_to_copies = o.yield_to_copies;
  rep.split_mib = o.split_mib;
  rep.repeat = o.repeat;
  bench_run run(o, be, progress);
  rep.n = run.n();
  if (rep.n < rep.devices) {
    throw invalid_argument("poolscope bench darray: n " + std::to_string(rep.n) + " is below the " +
                           std::to_string(rep.devices) + " devices");
  }
  rep.trace_path = o.trace_path;
  if (!o.trace_path.empty() && rep.gpu) {
    rep.cupti_kinds = profiler::activity_kinds_of(cupti);
  }
  bench_trace trace(be, o.trace_path, cupti, o.between_ranks);
  for (const auto& name : all) {
    if ((o.only.empty() && !(ranks && one_process_only(name))) ||
        std::find(o.only.begin(), o.only.end(), name) != o.only.end()) {
      const darray::backend_stats before = be->stats();
      rep.workloads.push_back(run.run(name));
      const darray::backend_stats after = be->stats();
      for (const auto& [field_name, field] : darray::backend_stats_fields) {
        rep.workloads.back().backend[std::string(field_name)] = after.*field - before.*field;
      }
    }
  }

  trace.finish();

  const bool at_scale = rep.gpu && rep.devices == 2 && rep.n == (std::int64_t{1} << 29);
  const std::string raw = rep.gpu ? "raw cudaMemcpyPeerAsync" : "memcpy";
  for (const auto& w : rep.workloads) {
    add_rows(w, rep.gpu, at_scale, raw, rep.rows);
  }

  std::ostringstream t;
  t << "poolscope bench darray on " << rep.backend << " (";
  for (std::size_t d = 0; d < rep.device_names.size(); ++d) {
    t << (d > 0 ? ", " : "") << rep.device_names[d];
  }
  t << "), n = " << rep.n << " float32, allocator " << rep.allocator << ", transport "
    << rep.transport
    << (rep.gpu && ranks ? ", between ranks " + darray::describe_between_ranks(
                                                    darray::parse_rank_transport(rep.between_ranks),
                                                    rep.staging_chunk_bytes)
                         : std::string())
    << ", issuing threads " << rep.issue_threads << ", kernels launched "
    << (rep.kernel_graphs ? "as graphs" : "plainly")
    << (rep.yield_to_copies ? ", compute yielding to copies out" : ", compute at full occupancy")
    << ", pieces split above " << rep.split_mib << " MiB, best of " << rep.repeat
    << " after a warm-up\n";
  if (!rep.trace_path.empty()) {
    t << "traced to " << rep.trace_path
      << " (times include the tracing's cost; each run: poolscope trace summary " << rep.trace_path
      << " --range bench.D1.fused --each)\n";
  }
  if (ranks) {
    t << be->group()->size()
      << " ranks: each run starts after a barrier and takes its slowest rank's time; the "
         "baselines (one process's calls) and D3, D4 need a run without a launcher\n";
  } else {
    t << (rep.gpu ? "baselines: raw CUDA / NCCL calls in this run\n"
                  : "no GPU: host devices; the CUDA baselines are replaced by memcpy (one thread "
                    "per link); targets apply to GPUs and are not checked\n");
  }
  t << '\n';
  text_table table({"workload", "figure", "value", "baseline", "ratio", "target"}, 2);
  std::string last;
  for (const auto& r : rep.rows) {
    if (!last.empty() && r.workload != last) {
      table.add_rule();
    }
    last = r.workload;
    std::string target = r.target;
    if (r.met) {
      target += *r.met ? "  ok" : "  MISSED";
    }
    table.add_row({r.workload, r.figure, r.value, r.baseline, r.ratio, target});
  }
  std::ostringstream tt;
  table.print(tt);
  t << tt.str();

  // The summary line: the headline figure of each workload, then failures and targets.
  std::ostringstream s;
  s << "summary: darray on " << rep.backend << " (" << rep.baselines << " baselines):";
  for (const auto& w : rep.workloads) {
    s << ' ' << w.name << ' ';
    if (!w.error.empty()) {
      s << "FAILED;";
      continue;
    }
    if (w.name == "D1") {
      s << "fused " << ms(figure(w, "t_fused_ms"))
        << (w.figures.count("eta") != 0 ? fmt(", eta %.2f", figure(w, "eta")) : ", eta n/a");
      if (w.figures.count("ratio_peer") != 0) {
        s << fmt(", reshard/raw %.2f", figure(w, "ratio_peer"));
      }
    } else if (w.name == "D2") {
      s << "swap+add " << ms(figure(w, "t_fused_ms"));
    } else if (w.name == "D3") {
      s << fmt("%.1f", figure(w, "t_add_us")) << fmt("/%.1f us", figure(w, "t_fused_us"))
        << fmt(" (chained %.1f", figure(w, "t_add_chained_us"))
        << fmt("/%.1f)", figure(w, "t_fused_chained_us"));
    } else if (w.name == "D4") {
      s << "add/copy " << format_ratio(figure(w, "ratio"));
    } else {
      s << fmt("%.3f TFLOP/s", figure(w, "tflops"));
    }
    s << ';';
  }
  const auto checked = std::count_if(rep.rows.begin(), rep.rows.end(),
                                     [](const darray_bench_row& r) { return r.met.has_value(); });
  const auto met = std::count_if(rep.rows.begin(), rep.rows.end(),
                                 [](const darray_bench_row& r) { return r.met.value_or(false); });
  if (rep.gpu) {
    s << ' ' << met << '/' << checked << " targets met";
  } else {
    s << " targets not checked (no GPU)";
  }
  rep.summary = s.str();
  t << rep.summary << '\n';
  rep.text = t.str();
  return rep;
}

}  // namespace poolscope::bench
