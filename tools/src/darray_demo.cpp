// `poolscope demo` (darray_demo.hpp): set up, the timed seed example, the checks against the
// host, what the trace shows, the report, and the summary rank 0 prints of every rank.
#include "darray_demo.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "cli_files.hpp"
#include "host_memory.hpp"
#include "launch.hpp"
#include "poolscope/analysis/trace_check.hpp"
#include "poolscope/analysis/trace_summary.hpp"
#include "poolscope/bench/darray_bench.hpp"
#include "poolscope/bench/text_table.hpp"
#include "poolscope/bench/timing.hpp"
#include "poolscope/byte_size.hpp"
#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/darray/fork_join.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/darray/rank_trace.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/profiler/function_profiler.hpp"
#include "poolscope/profiler/line_profiler.hpp"
#include "poolscope/profiler/report.hpp"
#include "poolscope/profiler/scope.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "rank_files.hpp"
#include "rank_traces.hpp"

namespace poolscope::tools {

bool darray_demo_result::ok() const {
  return !checks.empty() &&
         std::all_of(checks.begin(), checks.end(), [](const demo_check& c) { return c.ok; }) &&
         std::all_of(failed_per_rank.begin(), failed_per_rank.end(),
                     [](std::size_t f) { return f == 0; });
}

namespace {

using darray::distributed_array;
using darray::index_map;
using darray::shape_t;
using farray = distributed_array<float>;

// The demo's reference for the block matmul: x * y of two m x m row-major matrices, in double,
// the rows split over the host's hardware threads through the darray's fork_join (on one thread
// it is most of a GPU run's time: docs/perf.md, "The demo's host reference"). Each part writes
// only its own rows; if no thread can be started, the calling thread does them all.
std::vector<double> host_matmul(const std::vector<float>& x, const std::vector<float>& y,
                                std::int64_t m) {
  std::vector<double> out(x.size(), 0.0);
  const auto parts =
      static_cast<std::size_t>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 32));
  auto rows = [&](std::size_t part) noexcept {  // not const: fork_join takes a task_ref
    const auto p = static_cast<std::int64_t>(parts);
    const auto t = static_cast<std::int64_t>(part);
    for (std::int64_t i = m * t / p; i < m * (t + 1) / p; ++i) {
      for (std::int64_t k = 0; k < m; ++k) {
        const double xv = x[static_cast<std::size_t>(i * m + k)];
        for (std::int64_t j = 0; j < m; ++j) {
          out[static_cast<std::size_t>(i * m + j)] += xv * y[static_cast<std::size_t>(k * m + j)];
        }
      }
    }
  };
  try {
    darray::detail::fork_join helpers(parts - 1);
    helpers.run(parts, rows);
  } catch (const std::system_error&) {  // no threads to be had (the parts had not begun)
    for (std::size_t part = 0; part < parts; ++part) {
      rows(part);
    }
  }
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Bytes in the unit that reads best: a few KiB moved at a small --n are not "0.00 MiB".
std::string size_text(std::int64_t bytes) {
  return bench::format_size(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 0)));
}

// Wall time of `fn` (which returns once its result is complete), in milliseconds.
double time_ms(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// An overlap ratio as the text shows it; NaN (unknown: no device activity traced) as "n/a".
std::string overlap_text(double ov) {
  return std::isnan(ov) ? std::string("n/a") : fmt("%.2f", ov);
}

// eta as the text shows it; NaN (nothing moved: nothing to hide) as "n/a".
std::string eta_text(double eta) {
  return std::isnan(eta) ? std::string("n/a") : fmt("%.2f", eta);
}

// Boundaries of `parts` equal blocks of n, shifted by `shift` (a fraction of a block).
index_map split_map(std::int64_t n, int parts, double shift) {
  std::vector<std::tuple<int, std::int64_t, std::int64_t>> ranges;
  std::int64_t start = 0;
  for (int d = 0; d < parts; ++d) {
    std::int64_t stop = n;
    if (d + 1 < parts) {
      const double b = (static_cast<double>(d + 1) + shift) * static_cast<double>(n) / parts;
      stop = std::clamp<std::int64_t>(static_cast<std::int64_t>(b), start, n);
    }
    ranges.emplace_back(d, start, stop);
    start = stop;
  }
  return index_map::split({n}, 0, ranges);
}

demo_check compare(const std::string& what, const std::vector<float>& got,
                   const std::vector<double>& want, double rel_tol) {
  demo_check c{what, true, 0.0, {}};
  if (got.size() != want.size()) {
    c.ok = false;
    c.detail = "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
    return c;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double tol = rel_tol * std::max(1.0, std::abs(want[i]));
    c.max_error = std::max(c.max_error, err / std::max(1.0, std::abs(want[i])));
    if (!(err <= tol) && c.ok) {
      c.ok = false;
      c.detail = "element " + std::to_string(i) + ": " + fmt("%.9g", got[i]) + " != host " +
                 fmt("%.9g", want[i]);
    }
  }
  return c;
}

// Refuses sizes whose host memory clearly cannot be had, before anything is allocated. A lower
// bound of what the demo holds at once: the 1-D part keeps A, B, C on the host (3 x 4n bytes),
// the double reference (8n) and one result brought back (4n); the matmul, while those live, X
// and Y (8 m^2), its double reference (8 m^2) and the product brought back (4 m^2). On host
// devices the arrays are host memory too: A, B, C, A + B and the fused result (20n); X, Y (8 m^2)
// and the product as a replica on every device (4 m^2 each).
void check_demo_memory(std::int64_t n, std::int64_t m, int devices, bool gpu) {
  const double nd = static_cast<double>(n);
  const double m2 = static_cast<double>(m) * static_cast<double>(m);
  const double vectors = (24.0 + (gpu ? 0.0 : 20.0)) * nd;
  const double matmul = (20.0 + (gpu ? 0.0 : 8.0 + 4.0 * devices)) * m2;
  const std::string what =
      vectors >= matmul
          ? "--n " + std::to_string(n) + " (with --matmul-n " + std::to_string(m) + ")"
          : "--matmul-n " + std::to_string(m) + " (with --n " + std::to_string(n) + ")";
  check_host_memory("poolscope demo", what, vectors + matmul);
}

// --- setup ---

// What the demo runs on, derived once from the options, the ranks and the backend.
struct demo_setup {
  std::shared_ptr<darray::process_group> group;
  std::shared_ptr<darray::backend> be;
  profiler::cupti_options cupti;
  std::int64_t n = 0;
  std::int64_t matmul_n = 0;
  int rounds = 0;
  int devs = 0;  ///< the devices of every rank
  bool gpu = false;
  std::string trace_path;   ///< this rank's
  std::string report_path;  ///< this rank's
};

darray::backend_options backend_options_of(const darray_demo_options& o) {
  darray::backend_options bo;
  bo.allocator = o.allocator;
  bo.resource = o.resource;
  bo.kernel_graphs = o.kernel_graphs;
  bo.yield_to_copies = o.yield_to_copies;
  if (o.transport == "auto") {
    bo.transfers = darray::transport::automatic;
  } else if (o.transport == "peer") {
    bo.transfers = darray::transport::peer;
  } else if (o.transport == "nccl") {
    bo.transfers = darray::transport::nccl;
  } else {
    throw invalid_argument("poolscope demo: transport '" + o.transport +
                           "' (expected auto, peer or nccl)");
  }
  bo.between_ranks = darray::parse_rank_transport(o.between_ranks);
  bo.staging_chunk_bytes = parse_byte_size(o.staging_chunk);
  return bo;
}

demo_setup set_up(const darray_demo_options& o,
                  const std::function<void(const std::string&)>& say) {
  demo_setup s;
  s.group = darray::process_group::from_launcher();
  darray::backend_options bo = backend_options_of(o);
  s.trace_path = rank_output_path(o.trace_path, *s.group);
  s.report_path = rank_output_path(o.report_path, *s.group);
  // Checked before anything is written: an output must not overwrite the other.
  check_file_arguments("poolscope demo",
                       {{"--trace", s.trace_path, true}, {"--report", s.report_path, true}},
                       o.overwrite);
  // Checked before any device is touched: a bad list is the caller's error, not CUPTI's.
  s.cupti = profiler::with_activity_kinds(o.cupti_kinds);
  if (o.repeat < 0) {
    throw invalid_argument("poolscope demo: repeat " + std::to_string(o.repeat) +
                           " (at least 1, or 0 for the default)");
  }
  bo.group = s.group;
  s.be = darray::make_backend(o.devices, bo);
  s.devs = s.be->device_count();
  s.gpu = s.be->is_gpu();
  // On host devices 2^22: each device's chunk (2^21 elements) is large enough that the fused op
  // adds each part as it lands (darray batches the parts of chunks below 2^20 elements into one
  // task after the last piece), so the trace has an overlap to show. On GPUs 2^26 on one or two,
  // times (devices / 2)^2 on more: the fused op's copies must outlast the host's issuing to every
  // device, or each copy ends before its receiver's adds are enqueued and nothing overlaps
  // (docs/perf.md, "The demo's size on more GPUs").
  const std::int64_t gpu_n = (std::int64_t{1} << 26) * std::max(1, s.devs * s.devs / 4);
  s.n = o.n > 0 ? o.n : (s.gpu ? gpu_n : std::int64_t{1} << 22);
  s.matmul_n = o.matmul_n > 0 ? o.matmul_n : (s.gpu ? 2048 : 192);
  // Host devices share a few CPU cores with the demo's own thread, so their times scatter more:
  // more rounds (each takes a few milliseconds at the host's default size).
  s.rounds = o.repeat > 0 ? o.repeat : (s.gpu ? 3 : 20);
  if (s.n < s.devs) {
    throw invalid_argument("poolscope demo: n " + std::to_string(s.n) + " is below the " +
                           std::to_string(s.devs) + " devices");
  }
  check_demo_memory(s.n, s.matmul_n, s.be->local_device_count(), s.gpu);
  say("backend " + s.be->name() + ", n = " + std::to_string(s.n));
  return s;
}

// --- the seed example, timed ---

// The seed example's arrays and the host data they were made from.
struct seed_arrays {
  std::vector<float> ha, hb, hc;
  farray a, b, c;
};

seed_arrays build_seed_arrays(const demo_setup& s, std::mt19937_64& rng,
                              const std::function<void(const std::string&)>& say) {
  POOLSCOPE_SCOPE("demo.build");
  seed_arrays x;
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  x.ha.resize(static_cast<std::size_t>(s.n));
  x.hb.resize(x.ha.size());
  x.hc.resize(x.ha.size());
  for (std::size_t i = 0; i < x.ha.size(); ++i) {
    x.ha[i] = uni(rng);
    x.hb[i] = uni(rng);
    x.hc[i] = uni(rng);
  }
  const index_map a_map = split_map(s.n, s.devs, 0.0);
  const index_map c_map = split_map(s.n, s.devs, s.devs > 1 ? 0.4 : 0.0);
  say("A, B: " + a_map.to_string() + "; C: " + c_map.to_string());
  x.a = farray::from_host(s.be, x.ha, {s.n}, a_map);
  x.b = farray::from_host(s.be, x.hb, {s.n}, a_map);
  x.c = farray::from_host(s.be, x.hc, {s.n}, c_map);
  return x;
}

// The fused op's timed runs on this rank's clock (its trace's), and the best one's.
struct fused_windows {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
  std::pair<std::uint64_t, std::uint64_t> best{0, 0};
};

// eta of every timed round from its own three times (ns, 3 per round): their minimum, median and
// maximum, NaN when nothing moved.
void eta_spread(const std::vector<std::int64_t>& times, darray_demo_result& res) {
  std::vector<double> etas;
  for (std::size_t r = 0; r + 2 < times.size(); r += 3) {
    if (const auto e = bench::fusion_eta(
            static_cast<double>(times[r]) / 1e6, static_cast<double>(times[r + 1]) / 1e6,
            static_cast<double>(times[r + 2]) / 1e6, res.bytes_moved)) {
      etas.push_back(*e);
    }
  }
  if (etas.empty()) {
    res.eta_min = res.eta_median = res.eta_max = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  std::sort(etas.begin(), etas.end());
  res.eta_min = etas.front();
  res.eta_max = etas.back();
  const std::size_t mid = etas.size() / 2;
  res.eta_median = etas.size() % 2 == 1 ? etas[mid] : (etas[mid - 1] + etas[mid]) / 2;
}

// The three steps take turns, one run each per round after a warm-up round, and each keeps its
// best: a machine whose speed drifts (clocks, other tenants, a worker moved to a slower core)
// then slows all three alike, and eta compares like with like. The trace's overlap is that of
// the best fused run. Each step's previous result is dropped before it runs, so its buffers go
// back to the pools and are reused: the pools grow in the warm-up round only (a result kept alive
// while its successor is computed made the first timed runs grow them too, which on GPUs blocks
// the host in cudaMalloc before it enqueues the op). With several ranks every step starts after
// a barrier, and a run's time is its slowest rank's (each rank waits for its own devices only).
fused_windows time_seed_example(const demo_setup& s, const seed_arrays& x, farray& sum_ab,
                                farray& fused, darray_demo_result& res) {
  fused_windows w;
  std::vector<std::int64_t> times;  // ns: per timed round, A + B, the reshard, the fused op
  const auto timed_ns = [&](const std::function<void()>& fn) {
    s.group->barrier();
    return static_cast<std::int64_t>(time_ms(fn) * 1e6);
  };
  for (int round = -1; round < s.rounds; ++round) {
    const bool timed = round >= 0;
    std::int64_t t_add = 0, t_reshard = 0, t_fused = 0;
    {
      POOLSCOPE_SCOPE("demo.add");
      sum_ab = farray{};
      t_add = timed_ns([&] {
        sum_ab = x.a + x.b;
        sum_ab.wait();
      });
    }
    {
      POOLSCOPE_SCOPE("demo.reshard");
      t_reshard = timed_ns([&] {
        auto moved = x.c.reshard(x.a.index_map());
        moved.wait();
        res.bytes_moved = moved.handle().last_reshard().plan->bytes_remote;
        res.bytes_local = moved.handle().last_reshard().plan->bytes_local;
      });
    }
    {
      POOLSCOPE_SCOPE("demo.fused");
      fused = farray{};
      s.group->barrier();
      const std::uint64_t begin = hooks::now_ns();
      t_fused = static_cast<std::int64_t>(time_ms([&] {
                                            fused = x.a + x.c.reshard(x.a.index_map());
                                            fused.wait();
                                          }) *
                                          1e6);
      if (timed) {
        w.runs.emplace_back(begin, hooks::now_ns());
      }
    }
    if (timed) {
      times.insert(times.end(), {t_add, t_reshard, t_fused});
    }
  }
  times = s.group->all_reduce(times, darray::process_group::reduction::max);
  res.t_add_ms = res.t_reshard_ms = res.t_fused_ms = std::numeric_limits<double>::infinity();
  for (std::size_t r = 0; r < w.runs.size(); ++r) {
    res.t_add_ms = std::min(res.t_add_ms, static_cast<double>(times[3 * r]) / 1e6);
    res.t_reshard_ms = std::min(res.t_reshard_ms, static_cast<double>(times[3 * r + 1]) / 1e6);
    const double fused_ms = static_cast<double>(times[3 * r + 2]) / 1e6;
    if (fused_ms < res.t_fused_ms) {
      res.t_fused_ms = fused_ms;
      w.best = w.runs[r];
    }
  }
  res.eta = bench::fusion_eta(res.t_add_ms, res.t_reshard_ms, res.t_fused_ms, res.bytes_moved)
                .value_or(std::numeric_limits<double>::quiet_NaN());
  eta_spread(times, res);
  return w;
}

// --- checks against the host ---

// The 1-D results: A + B, the fused op, an elementwise chain, reductions.
void check_vectors(const seed_arrays& x, const farray& sum_ab, const farray& fused,
                   darray_demo_result& res) {
  POOLSCOPE_SCOPE("demo.check");
  const std::vector<float>& ha = x.ha;
  const std::vector<float>& hc = x.hc;
  std::vector<double> want(ha.size());
  for (std::size_t i = 0; i < ha.size(); ++i) {
    want[i] = static_cast<double>(ha[i] + x.hb[i]);
  }
  res.checks.push_back(compare("A + B", sum_ab.to_host(), want, 0.0));
  for (std::size_t i = 0; i < ha.size(); ++i) {
    want[i] = static_cast<double>(ha[i] + hc[i]);
  }
  res.checks.push_back(compare("A + C.reshard(A.index_map())", fused.to_host(), want, 0.0));

  // Elementwise chain with scalars and unary ops.
  auto chain = darray::sqrt(darray::abs(fused)) * 2.0f - darray::sin(x.a);
  for (std::size_t i = 0; i < ha.size(); ++i) {
    want[i] = static_cast<double>(std::sqrt(std::abs(ha[i] + hc[i])) * 2.0f - std::sin(ha[i]));
  }
  res.checks.push_back(compare("sqrt(abs(A + C')) * 2 - sin(A)", chain.to_host(), want, 1e-5));

  // Reductions: partial per device, completed by an all-reduce.
  double s = 0, mx = -1e300, mn = 1e300, abs_sum = 0;
  for (std::size_t i = 0; i < ha.size(); ++i) {
    const double v = static_cast<double>(ha[i] + hc[i]);
    s += v;
    abs_sum += std::abs(v);
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  auto total = darray::sum(fused).change_mode(darray::array_mode::replica).to_host();
  demo_check cs{"sum(A + C')", true, 0, {}};
  cs.max_error = std::abs(static_cast<double>(total.at(0)) - s) / std::max(1.0, abs_sum);
  cs.ok = cs.max_error <= 1e-5;
  cs.detail = "device " + fmt("%.6g", total.at(0)) + ", host " + fmt("%.6g", s);
  res.checks.push_back(cs);
  res.checks.push_back(compare("max(A + C')", darray::max(fused).to_host(), {mx}, 0.0));
  res.checks.push_back(compare("min(A + C')", darray::min(fused).to_host(), {mn}, 0.0));
}

// A 2-D array split by rows: reductions along each axis, and a block matmul. The matmul's host
// reference is rank 0's, sent to the others (its m^3 products are the demo's largest host work).
void check_matrices(const demo_setup& s, std::mt19937_64& rng, darray_demo_result& res) {
  POOLSCOPE_SCOPE("demo.matmul");
  const std::int64_t m = s.matmul_n;
  const int devs = s.devs;
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> hx(static_cast<std::size_t>(m * m)), hy(hx.size());
  for (std::size_t i = 0; i < hx.size(); ++i) {
    hx[i] = uni(rng);
    hy[i] = uni(rng);
  }
  const shape_t sq{m, m};
  // x: a grid of devs x 2 blocks; y: 2 x devs blocks; block (i, j) on device (i + j) % devs.
  std::vector<std::vector<int>> gx(static_cast<std::size_t>(devs), std::vector<int>(2));
  std::vector<std::vector<int>> gy(2, std::vector<int>(static_cast<std::size_t>(devs)));
  for (int i = 0; i < devs; ++i) {
    for (int j = 0; j < 2; ++j) {
      gx[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = (i + j) % devs;
      gy[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)] = (i + j) % devs;
    }
  }
  auto x = farray::from_host(s.be, hx, sq, index_map::grid(sq, devs, 2, gx));
  auto y = farray::from_host(s.be, hy, sq, index_map::grid(sq, 2, devs, gy));
  auto prod = darray::matmul(x, y).change_mode(darray::array_mode::replica);
  std::vector<double> want(hx.size());
  if (s.group->rank() == 0) {
    want = host_matmul(hx, hy, m);
  }
  s.group->broadcast(want.data(), want.size() * sizeof(double), 0);
  res.checks.push_back(
      compare("matmul " + std::to_string(m) + "^3 (block maps)", prod.to_host(), want, 1e-3));
  for (std::size_t axis = 0; axis < 2; ++axis) {
    auto r = darray::sum(x, axis).change_mode(darray::array_mode::replica).to_host();
    std::vector<double> w(static_cast<std::size_t>(m), 0.0);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < m; ++j) {
        w[static_cast<std::size_t>(axis == 0 ? j : i)] += hx[static_cast<std::size_t>(i * m + j)];
      }
    }
    res.checks.push_back(compare("sum(X, axis=" + std::to_string(axis) + ")", r, w, 1e-4));
  }
}

// --- what the trace shows ---

// The fused op's overlap on this rank's devices (res.overlap and res.overlap_median, indexed by
// device over every rank; the other ranks' entries stay unknown here), from one reading of the
// trace: the best run's and the median over every timed run (the best run alone may be one
// where the copies and the adds did not meet: host devices share the CPU cores, and the fastest
// run can be the one whose copy ran before the adds started).
void measure_overlap(const demo_setup& s, const profiler::timeline& tl, const fused_windows& w,
                     bool device_activity, darray_demo_result& res) {
  const auto devs = static_cast<std::size_t>(s.devs);
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  res.overlap.assign(devs, unknown);
  res.overlap_median.assign(devs, unknown);
  const darray::backend& be = *s.be;
  for (int d = be.first_local_device(); d < be.first_local_device() + be.local_device_count();
       ++d) {
    // On GPUs the device activity comes from CUPTI: without it, or without its kernel or copy
    // records (the two sides of the overlap), the overlap is unknown, not 0.
    res.overlap[static_cast<std::size_t>(d)] = device_activity ? 0.0 : unknown;
  }
  if (!device_activity || w.runs.empty()) {
    return;
  }
  const auto origin = static_cast<std::int64_t>(tl.origin_ns());
  const auto window_of = [origin](std::uint64_t begin, std::uint64_t end) {
    return profiler::interval{static_cast<std::int64_t>(begin) - origin,
                              static_cast<std::int64_t>(end) - origin};
  };
  std::vector<profiler::interval> windows;
  for (const auto& [begin, end] : w.runs) {
    windows.push_back(window_of(begin, end));
  }
  const profiler::interval best = window_of(w.best.first, w.best.second);
  const auto runs = analysis::summarize_trace(s.trace_path, windows, /*each=*/true);
  std::vector<std::vector<double>> per_device(devs);
  for (const auto& run : runs.each) {
    for (const auto& ov : run.devices) {
      if (ov.device < 0 || ov.device >= s.devs) {
        continue;
      }
      const auto d = static_cast<std::size_t>(ov.device);
      if (run.window == best) {
        res.overlap[d] = ov.overlap_ratio;
      }
      if (ov.transfer_ns > 0) {
        per_device[d].push_back(ov.overlap_ratio);
      }
    }
  }
  for (std::size_t d = 0; d < per_device.size(); ++d) {
    if (!per_device[d].empty()) {
      res.overlap_median[d] = bench::summarize(std::move(per_device[d])).median;
    }
  }
}

nlohmann::json number_or_null(double v) {
  return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v);
}

// The demo's figures for the report's metadata (this rank's, with the whole run's times).
nlohmann::json demo_metadata(const darray_demo_options& o, const demo_setup& s,
                             const darray_demo_result& res, const nlohmann::json& allocators,
                             const darray::backend_stats& bs) {
  nlohmann::json demo;
  demo["backend"] = s.be->name();
  demo["devices"] = s.devs;
  demo["rank"] = s.group->rank();
  demo["ranks"] = s.group->size();
  demo["n"] = s.n;
  demo["matmul_n"] = s.matmul_n;
  demo["allocator"] = o.allocator;
  demo["transport"] = o.transport;
  demo["between_ranks"] = o.between_ranks;
  demo["staging_chunk_bytes"] = parse_byte_size(o.staging_chunk);
  demo["kernel_graphs"] = o.kernel_graphs;
  demo["yield_to_copies"] = o.yield_to_copies;
  demo["cupti_kinds"] = s.gpu && o.cupti ? profiler::activity_kinds_of(s.cupti) : "";
  demo["rounds"] = s.rounds;
  demo["t_add_ms"] = res.t_add_ms;
  demo["t_reshard_ms"] = res.t_reshard_ms;
  demo["t_fused_ms"] = res.t_fused_ms;
  demo["eta"] = number_or_null(res.eta);
  demo["eta_rounds"] = {{"min", number_or_null(res.eta_min)},
                        {"median", number_or_null(res.eta_median)},
                        {"max", number_or_null(res.eta_max)}};
  demo["bytes_moved"] = res.bytes_moved;
  demo["bytes_local"] = res.bytes_local;
  // Per device, during A + C.reshard(A.index_map()); null where unknown (CUPTI off, or another
  // rank's device).
  demo["overlap_fused"] = nlohmann::json::array();
  for (double ov : res.overlap) {
    demo["overlap_fused"].push_back(number_or_null(ov));
  }
  // The same, the median over every timed run; null where unknown or nothing moved there.
  demo["overlap_fused_median"] = nlohmann::json::array();
  for (double ov : res.overlap_median) {
    demo["overlap_fused_median"].push_back(number_or_null(ov));
  }
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : res.checks) {
    checks.push_back(
        {{"what", c.what}, {"ok", c.ok}, {"max_error", c.max_error}, {"detail", c.detail}});
  }
  demo["checks"] = checks;
  demo["allocators"] = allocators;
  nlohmann::json counts = nlohmann::json::object();
  for (const auto& [name, field] : darray::backend_stats_fields) {
    counts[std::string(name)] = bs.*field;
  }
  demo["backend_stats"] = std::move(counts);
  return demo;
}

// What rank 0 prints of every rank: each rank's part, gathered (one JSON text per rank).
struct rank_part {
  nlohmann::json allocators;  ///< [{device, peak_in_use, peak_reserved, upstream_allocs}]
  std::vector<double> overlap, overlap_median;  ///< its devices' entries (NaN elsewhere)
  std::size_t failed = 0;                       ///< its failed checks
  std::string trace_path;
  std::size_t trace_events = 0;
  std::string report_path;
};

// Every rank's part, in rank order (collective).
std::vector<rank_part> gather_parts(const demo_setup& s, const rank_part& mine) {
  nlohmann::json j;
  j["allocators"] = mine.allocators;
  j["overlap"] = nlohmann::json::array();
  j["overlap_median"] = nlohmann::json::array();
  for (std::size_t d = 0; d < mine.overlap.size(); ++d) {
    j["overlap"].push_back(number_or_null(mine.overlap[d]));
    j["overlap_median"].push_back(number_or_null(mine.overlap_median[d]));
  }
  j["failed"] = mine.failed;
  j["trace"] = mine.trace_path;
  j["trace_events"] = mine.trace_events;
  j["report"] = mine.report_path;
  std::vector<rank_part> out;
  for (const std::string& text : s.group->all_gather(j.dump())) {
    const nlohmann::json r = nlohmann::json::parse(text);
    rank_part p;
    p.allocators = r.at("allocators");
    for (const auto& v : r.at("overlap")) {
      p.overlap.push_back(v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>());
    }
    for (const auto& v : r.at("overlap_median")) {
      p.overlap_median.push_back(v.is_null() ? std::numeric_limits<double>::quiet_NaN()
                                             : v.get<double>());
    }
    p.failed = r.at("failed").get<std::size_t>();
    p.trace_path = r.at("trace").get<std::string>();
    p.trace_events = r.at("trace_events").get<std::size_t>();
    p.report_path = r.at("report").get<std::string>();
    out.push_back(std::move(p));
  }
  return out;
}

// --- one trace of every rank ---

// Each device's figure from the rank holding it.
std::vector<double> per_device(const demo_setup& s, const std::vector<rank_part>& parts,
                               std::vector<double> rank_part::*which) {
  std::vector<double> out(static_cast<std::size_t>(s.devs),
                          std::numeric_limits<double>::quiet_NaN());
  for (int d = 0; d < s.devs; ++d) {
    const auto& values = parts[static_cast<std::size_t>(s.be->rank_of(d))].*which;
    if (static_cast<std::size_t>(d) < values.size()) {
      out[static_cast<std::size_t>(d)] = values[static_cast<std::size_t>(d)];
    }
  }
  return out;
}

// --- the summary (rank 0 prints it) ---

// The header and the timings.
void write_timings(std::ostream& t, const darray_demo_options& o, const demo_setup& s,
                   const darray_demo_result& res) {
  t << "poolscope demo on " << s.be->name() << " (";
  for (int d = 0; d < s.devs; ++d) {
    t << (d ? ", " : "")
      << (s.group->size() > 1 ? "rank " + std::to_string(s.be->rank_of(d)) + ": " : "")
      << s.be->device_name(d);
  }
  t << "), N = " << s.n << " float32, allocator " << o.allocator << ", transport " << o.transport
    << (s.group->size() > 1 && s.gpu
            ? ", between ranks " +
                  darray::describe_between_ranks(darray::parse_rank_transport(o.between_ranks),
                                                 parse_byte_size(o.staging_chunk))
            : std::string())
    << "\n\n";
  t << fmt("  A + B                      %9.3f ms\n", res.t_add_ms);
  t << fmt("  C.reshard(A.index_map())   %9.3f ms", res.t_reshard_ms) << "   moved "
    << size_text(res.bytes_moved) << ", already in place " << size_text(res.bytes_local) << "\n";
  t << fmt("  A + C.reshard(A.index_map) %9.3f ms", res.t_fused_ms)
    << (std::isnan(res.eta)
            ? std::string("   eta n/a  (nothing moves between devices: no transfer to hide)\n")
            : fmt("   eta = %.2f", res.eta) + fmt("  (per round: median %.2f", res.eta_median) +
                  fmt(", from %.2f", res.eta_min) + fmt(" to %.2f)\n", res.eta_max));
  if (!std::isnan(res.eta)) {
    t << "  eta = (T_reshard + T_add - T_fused) / min(T_reshard, T_add), from the best times: the\n"
         "  share of the shorter step hidden by running both at once. 1: hidden entirely; 0: the\n"
         "  fused op took as long as the two one after the other; below 0: longer than that; "
         "above\n"
         "  1: shorter than the longer step alone (it ran faster fused: caches, warmer clocks).\n";
  }
  if (s.group->size() > 1) {
    t << "  (" << s.group->size()
      << " ranks: each step starts after a barrier; a run takes its slowest rank's time)\n";
  }
  if (!s.gpu) {
    // Host devices run on the CPU cores: copies and adds share them, so the times say how the OS
    // scheduled the worker threads, not what hardware overlaps; the trace's overlap (the share of
    // the transfer during which an add ran) is the figure that shows the op's structure.
    const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
    const unsigned workers = 2U * static_cast<unsigned>(s.devs);
    t << "  (host devices: " << cores << " CPU core" << (cores == 1 ? "" : "s") << " run "
      << workers
      << " worker threads, copies and adds alike,\n"
         "   so eta measures the OS scheduler, not hardware overlap, and scatters from run to\n"
         "   run; the overlap in the trace below is the figure to read here. On GPUs copy\n"
         "   engines move the data beside the kernels.)\n";
  }
}

void write_overlap(std::ostream& t, const demo_setup& s, const darray_demo_result& res,
                   bool device_activity, std::size_t runs) {
  t << "  overlap during A + C.reshard in the trace (share of transfer time with compute running,\n"
       "  per device):";
  for (double ov : res.overlap) {
    t << ' ' << overlap_text(ov);
  }
  if (!device_activity) {
    t << " (CUPTI off: the trace has no device activity)";
  } else {
    t << " in the best fused run,";
    for (double ov : res.overlap_median) {
      t << ' ' << overlap_text(ov);
    }
    t << " the median of its " << runs << " run" << (runs == 1 ? "" : "s");
  }
  t << "\n  (each run: poolscope trace summary " << s.trace_path << " --range demo.fused --each)";
}

void write_checks(std::ostream& t, const demo_setup& s, const darray_demo_result& res) {
  t << "\n\n  checks against the host" << (s.group->size() > 1 ? " (rank 0's)" : "") << ":\n";
  for (const auto& c : res.checks) {
    t << "    " << (c.ok ? "ok   " : "FAIL ") << c.what;
    if (c.max_error > 0) {
      t << fmt("  (max error %.2g)", c.max_error);
    }
    if (!c.ok) {
      t << "  " << c.detail;
    }
    t << "\n";
  }
  for (std::size_t r = 1; r < res.failed_per_rank.size(); ++r) {
    t << "    rank " << r << ": "
      << (res.failed_per_rank[r] == 0 ? "every check passed"
                                      : std::to_string(res.failed_per_rank[r]) + " checks FAILED")
      << "\n";
  }
}

void write_allocators(std::ostream& t, const darray_demo_options& o,
                      const std::vector<rank_part>& parts, const darray::backend_stats& bs) {
  t << "\n  allocators (" << o.allocator << "):\n";
  for (const rank_part& p : parts) {
    for (const auto& m : p.allocators) {
      t << "    device " << m["device"].get<int>() << ": peak in use "
        << size_text(m["peak_in_use"].get<std::int64_t>()) << ", peak reserved "
        << size_text(m["peak_reserved"].get<std::int64_t>()) << ", upstream allocations "
        << m["upstream_allocs"].get<std::int64_t>() << "\n";
    }
  }
  t << "    buffers handed on in queue order (no allocator call): " << bs.buffers_reused
    << "; queue waits enqueued " << bs.waits << ", elided " << bs.waits_elided
    << "; compute yielding to copies out of its device " << bs.compute_yielding;
  if (bs.kernel_graphs_made != 0) {
    t << "; kernel graphs made " << bs.kernel_graphs_made << ", launched with new arguments "
      << bs.kernel_graph_updates;
  }
  if (bs.copies_between_ranks != 0) {
    t << "; transfers with other ranks " << bs.copies_between_ranks << " ("
      << size_text(static_cast<std::int64_t>(bs.bytes_between_ranks));
    if (bs.bytes_ipc != 0) {
      t << ", " << size_text(static_cast<std::int64_t>(bs.bytes_ipc))
        << " received through CUDA IPC";
    }
    t << ")";
  }
  t << "\n";
}

// `scope_table`: the function profiler's table.
void write_profiles(std::ostream& t, const std::string& scope_table,
                    const profiler::line_profile& lines) {
  t << "\n  top scopes (function profiler):\n";
  {
    std::istringstream table(scope_table);
    std::string line;
    for (int i = 0; i < 8 && std::getline(table, line); ++i) {
      t << "    " << line << "\n";
    }
  }
  t << "\n  top call sites in the demo (line profiler: bytes used / acquired below each line):\n";
  // The demo's own frames, wherever they sit in the tree, by bytes used.
  std::vector<std::pair<std::uint64_t, std::string>> sites;
  std::function<void(const profiler::profile_node&)> visit = [&](const profiler::profile_node& nd) {
    if (nd.file.find("darray_demo.cpp") != std::string::npos && nd.total.used > 0) {
      sites.emplace_back(nd.total.used,
                         "line " + std::to_string(nd.line) + ": " +
                             size_text(static_cast<std::int64_t>(nd.total.used)) + " used, " +
                             size_text(static_cast<std::int64_t>(nd.total.acquired)) +
                             " acquired in " + std::to_string(nd.total.count) + " allocations");
    }
    for (const auto& ch : nd.children) {
      visit(ch);
    }
  };
  visit(lines.root);
  std::sort(sites.begin(), sites.end(),
            [](const auto& l, const auto& r) { return l.first > r.first; });
  if (sites.empty()) {
    t << "    (no file:line for the demo's frames: a build without debug info; "
         "RelWithDebInfo, the default, has them)\n";
  }
  for (std::size_t i = 0; i < sites.size() && i < 6; ++i) {
    t << "    darray_demo.cpp " << sites[i].second << "\n";
  }
}

// The outputs (where rank 0 has each rank's: `merged.rank_paths`, `reports`) and the summary
// line.
void write_footer(std::ostream& t, const demo_setup& s, const darray_demo_result& res,
                  const std::vector<rank_part>& parts, const merged_trace& merged,
                  const rank_files& reports, bool device_activity) {
  if (parts.size() == 1) {
    t << "\n  trace: " << parts[0].trace_path << " (" << parts[0].trace_events
      << " events; open in Perfetto)"
      << ", report: " << parts[0].report_path << "\n";
  } else {
    t << "\n  trace of every rank: " << merged.path << " (" << merged.summary
      << "; open in Perfetto, or poolscope trace summary " << merged.path << ")";
    t << "\n  traces, one per rank:";
    for (std::size_t r = 0; r < parts.size(); ++r) {
      t << "\n    rank " << r << ": "
        << (r < merged.rank_paths.size() ? merged.rank_paths[r] : parts[r].trace_path) << " ("
        << parts[r].trace_events << " events), report "
        << (r < reports.paths.size() ? reports.paths[r] : parts[r].report_path);
    }
    if (!reports.problem.empty()) {
      t << "\n  reports: " << reports.problem;
    }
    t << "\n";
  }
  std::size_t checks = 0;
  std::size_t failed = 0;
  for (std::size_t r = 0; r < res.failed_per_rank.size(); ++r) {
    checks += res.checks.size();  // every rank runs the same checks
    failed += res.failed_per_rank[r];
  }
  const std::string each = s.group->size() > 1
                               ? " (" + std::to_string(res.checks.size()) + " on each of " +
                                     std::to_string(s.group->size()) + " ranks)"
                               : "";
  t << "summary: "
    << (failed == 0 ? "all " + std::to_string(checks) + " checks passed" + each
                    : std::to_string(failed) + " checks FAILED" + each)
    << "; overlap";
  for (double ov : res.overlap) {
    t << ' ' << overlap_text(ov);
  }
  if (device_activity) {
    t << " (best run),";
    for (double ov : res.overlap_median) {
      t << ' ' << overlap_text(ov);
    }
    t << " (median)";
  }
  t << "; eta " << eta_text(res.eta);
  if (!std::isnan(res.eta)) {
    t << " (rounds " << eta_text(res.eta_min) << " to " << eta_text(res.eta_max)
      << (s.gpu ? ")" : "; host devices: the scheduler's)");
  }
  t << "; moved " << size_text(res.bytes_moved) << "\n";
}

}  // namespace

darray_demo_result run_darray_demo(const darray_demo_options& o, std::ostream* progress) {
  auto say = [&](const std::string& s) {
    if (progress != nullptr) {
      *progress << "[demo] " << s << '\n';
    }
  };
  const demo_setup s = set_up(o, say);
  darray_demo_result res;
  profiler::timeline_options to;
  to.trace_path = s.trace_path;
  to.distributed = darray::rank_trace_info(*s.be, s.gpu ? o.between_ranks : "mpi");
  to.cupti = s.gpu && o.cupti;
  to.cupti_settings = s.cupti;
  profiler::timeline tl{to};
  profiler::line_profiler lines;
  tl.start();
  darray::sync_rank_clocks(*s.group, tl, "start");
  s.be->set_timeline(&tl);
  profiler::function_profiler scopes;
  fused_windows windows;
  {
    hooks::scoped_hook line_hook{lines};
    std::mt19937_64 rng(o.seed);
    const seed_arrays x = build_seed_arrays(s, rng, say);
    farray sum_ab, fused;
    windows = time_seed_example(s, x, sum_ab, fused, res);
    say("A+B " + fmt("%.3f", res.t_add_ms) + " ms, reshard " + fmt("%.3f", res.t_reshard_ms) +
        " ms, fused " + fmt("%.3f", res.t_fused_ms) + " ms, eta " + eta_text(res.eta));
    check_vectors(x, sum_ab, fused, res);
    check_matrices(s, rng, res);
    s.be->synchronize();
  }
  scopes.stop();
  s.be->set_timeline(nullptr);
  darray::sync_rank_clocks(*s.group, tl, "end");
  tl.stop();

  auto rep = profiler::run_report::from(tl);
  rep.add_profile("function", nlohmann::json::parse(scopes.report().to_json()));
  const auto line_profile = lines.report();
  rep.add_profile("line", nlohmann::json::parse(line_profile.to_json()));
  const bool device_activity = !s.gpu || (to.cupti && s.cupti.kernels && s.cupti.copies);
  measure_overlap(s, tl, windows, device_activity, res);
  rank_part mine;
  for (int d = s.be->first_local_device();
       d < s.be->first_local_device() + s.be->local_device_count(); ++d) {
    const auto st = s.be->allocator(d).stats();
    mine.allocators.push_back({{"device", d},
                               {"peak_in_use", st.peak_in_use},
                               {"peak_reserved", st.peak_reserved},
                               {"upstream_allocs", st.upstream_allocs}});
  }
  const darray::backend_stats bs = s.be->stats();
  rep.set_metadata("demo", demo_metadata(o, s, res, mine.allocators, bs));
  rep.write(s.report_path);
  res.report = rep.to_json();
  const auto check = analysis::check_trace(s.trace_path);
  res.checks.push_back(demo_check{"trace passes `poolscope trace check`", check.ok(), 0,
                                  check.ok() ? "" : check.to_text()});

  merged_trace merged;
  rank_files reports;
  if (s.group->size() > 1) {
    // One of every rank's checks: a merge that fails fails every rank.
    merged = merge_rank_traces(*s.group, o.trace_path, s.trace_path);
    res.checks.push_back(demo_check{"merged trace of " + std::to_string(s.group->size()) +
                                        " ranks passes `poolscope trace check`",
                                    merged.problem.empty(), 0, merged.problem});
    // Every rank's report beside rank 0's (`poolscope report r.rank*.json` there).
    const std::filesystem::path beside = std::filesystem::path(s.report_path).parent_path();
    reports = gather_rank_files(*s.group, s.report_path, beside.empty() ? "." : beside.string(),
                                "report");
  }
  mine.overlap = res.overlap;
  mine.overlap_median = res.overlap_median;
  mine.failed = static_cast<std::size_t>(
      std::count_if(res.checks.begin(), res.checks.end(), [](const auto& c) { return !c.ok; }));
  mine.trace_path = s.trace_path;
  mine.trace_events = check.events;
  mine.report_path = s.report_path;
  const std::vector<rank_part> parts = gather_parts(s, mine);
  for (const rank_part& p : parts) {
    res.failed_per_rank.push_back(p.failed);
  }
  res.overlap = per_device(s, parts, &rank_part::overlap);
  res.overlap_median = per_device(s, parts, &rank_part::overlap_median);
  if (s.group->rank() != 0) {
    return res;  // rank 0 prints every rank's part
  }
  std::ostringstream t;
  write_timings(t, o, s, res);
  write_overlap(t, s, res, device_activity, windows.runs.size());
  write_checks(t, s, res);
  write_allocators(t, o, parts, bs);
  write_profiles(t, scopes.report().to_table(), line_profile);
  write_footer(t, s, res, parts, merged, reports, device_activity);
  res.text = t.str();
  return res;
}

}  // namespace poolscope::tools
