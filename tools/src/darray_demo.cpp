#include "darray_demo.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "cli_files.hpp"
#include "host_memory.hpp"
#include "poolscope/analysis/trace_check.hpp"
#include "poolscope/analysis/trace_summary.hpp"
#include "poolscope/bench/darray_bench.hpp"
#include "poolscope/bench/text_table.hpp"
#include "poolscope/bench/timing.hpp"
#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/darray/fork_join.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/profiler/function_profiler.hpp"
#include "poolscope/profiler/line_profiler.hpp"
#include "poolscope/profiler/report.hpp"
#include "poolscope/profiler/scope.hpp"
#include "poolscope/profiler/timeline.hpp"

namespace poolscope::tools {

bool darray_demo_result::ok() const {
  return !checks.empty() &&
         std::all_of(checks.begin(), checks.end(), [](const demo_check& c) { return c.ok; });
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

}  // namespace

darray_demo_result run_darray_demo(const darray_demo_options& o, std::ostream* progress) {
  auto say = [&](const std::string& s) {
    if (progress != nullptr) {
      *progress << "[demo] " << s << '\n';
    }
  };
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
  // Checked before anything is written: an output must not overwrite the other.
  check_file_arguments("poolscope demo",
                       {{"--trace", o.trace_path, true}, {"--report", o.report_path, true}});
  // Checked before any device is touched: a bad list is the caller's error, not CUPTI's.
  const profiler::cupti_options cupti_settings = profiler::with_activity_kinds(o.cupti_kinds);
  if (o.repeat < 0) {
    throw invalid_argument("poolscope demo: repeat " + std::to_string(o.repeat) +
                           " (at least 1, or 0 for the default)");
  }
  auto be = darray::make_backend(o.devices, bo);
  const int devs = be->device_count();
  const bool gpu = be->is_gpu();
  // On host devices 2^22: each device's chunk (2^21 elements) is large enough that the fused op
  // adds each part as it lands (darray batches the parts of chunks below 2^20 elements into one
  // task after the last piece), so the trace has an overlap to show. On GPUs 2^26 on one or two,
  // times (devices / 2)^2 on more: the fused op's copies must outlast the host's issuing to every
  // device, or each copy ends before its receiver's adds are enqueued and nothing overlaps
  // (docs/perf.md, "The demo's size on more GPUs").
  const std::int64_t gpu_n = (std::int64_t{1} << 26) * std::max(1, devs * devs / 4);
  const std::int64_t n = o.n > 0 ? o.n : (gpu ? gpu_n : std::int64_t{1} << 22);
  const std::int64_t mm = o.matmul_n > 0 ? o.matmul_n : (gpu ? 2048 : 192);
  // Host devices share a few CPU cores with the demo's own thread, so their times scatter more:
  // more rounds (each takes a few milliseconds at the host's default size).
  const int rounds = o.repeat > 0 ? o.repeat : (gpu ? 3 : 20);
  if (n < devs) {
    throw invalid_argument("poolscope demo: n " + std::to_string(n) + " is below the " +
                           std::to_string(devs) + " devices");
  }
  check_demo_memory(n, mm, devs, gpu);
  say("backend " + be->name() + ", n = " + std::to_string(n));

  darray_demo_result res;
  profiler::timeline_options to;
  to.trace_path = o.trace_path;
  to.cupti = gpu && o.cupti;
  to.cupti_settings = cupti_settings;
  profiler::timeline tl{to};
  profiler::line_profiler lines;
  tl.start();
  be->set_timeline(&tl);
  profiler::function_profiler scopes;
  std::uint64_t fused_begin = 0;
  std::uint64_t fused_end = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> fused_runs;  // every timed run's times
  {
    hooks::scoped_hook line_hook{lines};

    std::mt19937_64 rng(o.seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> ha(static_cast<std::size_t>(n)), hb(ha.size()), hc(ha.size());
    for (std::size_t i = 0; i < ha.size(); ++i) {
      ha[i] = uni(rng);
      hb[i] = uni(rng);
      hc[i] = uni(rng);
    }
    const index_map a_map = split_map(n, devs, 0.0);
    const index_map c_map = split_map(n, devs, devs > 1 ? 0.4 : 0.0);
    say("A, B: " + a_map.to_string() + "; C: " + c_map.to_string());
    farray a, b, c;
    {
      POOLSCOPE_SCOPE("demo.build");
      a = farray::from_host(be, ha, {n}, a_map);
      b = farray::from_host(be, hb, {n}, a_map);
      c = farray::from_host(be, hc, {n}, c_map);
    }

    // The three steps take turns, one run each per round after a warm-up round, and each keeps
    // its best: a machine whose speed drifts (clocks, other tenants, a worker moved to a slower
    // core) then slows all three alike, and eta compares like with like. The trace's overlap is
    // that of the best fused run. Each step's previous result is dropped before it runs, so its
    // buffers go back to the pools and are reused: the pools grow in the warm-up round only (a
    // result kept alive while its successor is computed made the first timed runs grow them too,
    // which on GPUs blocks the host in cudaMalloc before it enqueues the op).
    farray sum_ab, fused;
    res.t_add_ms = res.t_reshard_ms = res.t_fused_ms = std::numeric_limits<double>::infinity();
    for (int round = -1; round < rounds; ++round) {
      const bool timed = round >= 0;
      double t = 0;
      {
        POOLSCOPE_SCOPE("demo.add");
        sum_ab = farray{};
        t = time_ms([&] {
          sum_ab = a + b;
          sum_ab.wait();
        });
      }
      res.t_add_ms = timed ? std::min(res.t_add_ms, t) : res.t_add_ms;
      {
        POOLSCOPE_SCOPE("demo.reshard");
        t = time_ms([&] {
          auto moved = c.reshard(a.index_map());
          moved.wait();
          res.bytes_moved = moved.handle().last_reshard().plan->bytes_remote;
          res.bytes_local = moved.handle().last_reshard().plan->bytes_local;
        });
      }
      res.t_reshard_ms = timed ? std::min(res.t_reshard_ms, t) : res.t_reshard_ms;
      {
        POOLSCOPE_SCOPE("demo.fused");
        fused = farray{};
        const std::uint64_t begin = hooks::now_ns();
        t = time_ms([&] {
          fused = a + c.reshard(a.index_map());
          fused.wait();
        });
        const std::uint64_t end = hooks::now_ns();
        if (timed) {
          fused_runs.emplace_back(begin, end);
        }
        if (timed && t < res.t_fused_ms) {
          res.t_fused_ms = t;
          fused_begin = begin;
          fused_end = end;
        }
      }
    }
    res.eta = bench::fusion_eta(res.t_add_ms, res.t_reshard_ms, res.t_fused_ms, res.bytes_moved)
                  .value_or(std::numeric_limits<double>::quiet_NaN());
    say("A+B " + fmt("%.3f", res.t_add_ms) + " ms, reshard " + fmt("%.3f", res.t_reshard_ms) +
        " ms, fused " + fmt("%.3f", res.t_fused_ms) + " ms, eta " + eta_text(res.eta));

    // Checks against the host.
    {
      POOLSCOPE_SCOPE("demo.check");
      std::vector<double> want(ha.size());
      for (std::size_t i = 0; i < ha.size(); ++i) {
        want[i] = static_cast<double>(ha[i] + hb[i]);
      }
      res.checks.push_back(compare("A + B", sum_ab.to_host(), want, 0.0));
      for (std::size_t i = 0; i < ha.size(); ++i) {
        want[i] = static_cast<double>(ha[i] + hc[i]);
      }
      res.checks.push_back(compare("A + C.reshard(A.index_map())", fused.to_host(), want, 0.0));

      // Elementwise chain with scalars and unary ops.
      auto chain = darray::sqrt(darray::abs(fused)) * 2.0f - darray::sin(a);
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

    // A 2-D array split by rows: reductions along each axis, and a block matmul.
    {
      POOLSCOPE_SCOPE("demo.matmul");
      const std::int64_t m = mm;
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
      auto x = farray::from_host(be, hx, sq, index_map::grid(sq, devs, 2, gx));
      auto y = farray::from_host(be, hy, sq, index_map::grid(sq, 2, devs, gy));
      auto prod = darray::matmul(x, y).change_mode(darray::array_mode::replica);
      const std::vector<double> want = host_matmul(hx, hy, m);
      res.checks.push_back(
          compare("matmul " + std::to_string(m) + "^3 (block maps)", prod.to_host(), want, 1e-3));
      for (std::size_t axis = 0; axis < 2; ++axis) {
        auto r = darray::sum(x, axis).change_mode(darray::array_mode::replica).to_host();
        std::vector<double> w(static_cast<std::size_t>(m), 0.0);
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t j = 0; j < m; ++j) {
            w[static_cast<std::size_t>(axis == 0 ? j : i)] +=
                hx[static_cast<std::size_t>(i * m + j)];
          }
        }
        res.checks.push_back(compare("sum(X, axis=" + std::to_string(axis) + ")", r, w, 1e-4));
      }
    }
    be->synchronize();
  }
  scopes.stop();
  be->set_timeline(nullptr);
  tl.stop();

  // Report.
  auto rep = profiler::run_report::from(tl);
  rep.add_profile("function", nlohmann::json::parse(scopes.report().to_json()));
  const auto line_profile = lines.report();
  rep.add_profile("line", nlohmann::json::parse(line_profile.to_json()));
  // The overlap of the fused op alone (the whole run's, uploads included, is in the report).
  // On GPUs the device activity comes from CUPTI: without it, or without its kernel or copy
  // records (the two sides of the overlap), the overlap is unknown, not 0.
  const bool device_activity =
      !gpu || (to.cupti && cupti_settings.kernels && cupti_settings.copies);
  res.overlap.assign(static_cast<std::size_t>(devs),
                     device_activity ? 0.0 : std::numeric_limits<double>::quiet_NaN());
  // The best run's and the median over every timed run, from one reading of the trace: the
  // best run alone may be one where the copies and the adds did not meet (host devices share the
  // CPU cores: the fastest run can be the one whose copy ran before the adds started).
  res.overlap_median.assign(static_cast<std::size_t>(devs),
                            std::numeric_limits<double>::quiet_NaN());
  if (device_activity && !fused_runs.empty()) {
    const auto origin = static_cast<std::int64_t>(tl.origin_ns());
    const auto window_of = [origin](std::uint64_t begin, std::uint64_t end) {
      return profiler::interval{static_cast<std::int64_t>(begin) - origin,
                                static_cast<std::int64_t>(end) - origin};
    };
    std::vector<profiler::interval> windows;
    for (const auto& [begin, end] : fused_runs) {
      windows.push_back(window_of(begin, end));
    }
    const profiler::interval best = window_of(fused_begin, fused_end);
    const auto runs = analysis::summarize_trace(o.trace_path, windows, /*each=*/true);
    std::vector<std::vector<double>> per_device(static_cast<std::size_t>(devs));
    for (const auto& w : runs.each) {
      for (const auto& ov : w.devices) {
        if (ov.device < 0 || ov.device >= devs) {
          continue;
        }
        const auto d = static_cast<std::size_t>(ov.device);
        if (w.window == best) {
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
  nlohmann::json demo;
  demo["backend"] = be->name();
  demo["devices"] = devs;
  demo["n"] = n;
  demo["matmul_n"] = mm;
  demo["allocator"] = o.allocator;
  demo["transport"] = o.transport;
  demo["kernel_graphs"] = o.kernel_graphs;
  demo["yield_to_copies"] = o.yield_to_copies;
  demo["cupti_kinds"] = to.cupti ? profiler::activity_kinds_of(cupti_settings) : "";
  demo["rounds"] = rounds;
  demo["t_add_ms"] = res.t_add_ms;
  demo["t_reshard_ms"] = res.t_reshard_ms;
  demo["t_fused_ms"] = res.t_fused_ms;
  demo["eta"] = std::isnan(res.eta) ? nlohmann::json(nullptr) : nlohmann::json(res.eta);
  demo["bytes_moved"] = res.bytes_moved;
  demo["bytes_local"] = res.bytes_local;
  // Per device, during A + C.reshard(A.index_map()); null where unknown (CUPTI off).
  demo["overlap_fused"] = nlohmann::json::array();
  for (double ov : res.overlap) {
    demo["overlap_fused"].push_back(std::isnan(ov) ? nlohmann::json(nullptr) : nlohmann::json(ov));
  }
  // The same, the median over every timed run; null where unknown or nothing moved there.
  demo["overlap_fused_median"] = nlohmann::json::array();
  for (double ov : res.overlap_median) {
    demo["overlap_fused_median"].push_back(std::isnan(ov) ? nlohmann::json(nullptr)
                                                          : nlohmann::json(ov));
  }
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : res.checks) {
    checks.push_back(
        {{"what", c.what}, {"ok", c.ok}, {"max_error", c.max_error}, {"detail", c.detail}});
  }
  demo["checks"] = checks;
  nlohmann::json mem = nlohmann::json::array();
  for (int d = 0; d < devs; ++d) {
    const auto st = be->allocator(d).stats();
    mem.push_back({{"device", d},
                   {"peak_in_use", st.peak_in_use},
                   {"peak_reserved", st.peak_reserved},
                   {"upstream_allocs", st.upstream_allocs}});
  }
  demo["allocators"] = mem;
  const darray::backend_stats bs = be->stats();
  nlohmann::json counts = nlohmann::json::object();
  for (const auto& [name, field] : darray::backend_stats_fields) {
    counts[std::string(name)] = bs.*field;
  }
  demo["backend_stats"] = std::move(counts);
  rep.set_metadata("demo", demo);
  rep.write(o.report_path);
  res.report = rep.to_json();

  const auto check = analysis::check_trace(o.trace_path);
  res.checks.push_back(demo_check{"trace passes `poolscope trace check`", check.ok(), 0,
                                  check.ok() ? "" : check.to_text()});

  std::ostringstream t;
  t << "poolscope demo on " << be->name() << " (";
  for (int d = 0; d < devs; ++d) {
    t << (d ? ", " : "") << be->device_name(d);
  }
  t << "), N = " << n << " float32, allocator " << o.allocator << ", transport " << o.transport
    << "\n\n";
  t << fmt("  A + B                      %9.3f ms\n", res.t_add_ms);
  t << fmt("  C.reshard(A.index_map())   %9.3f ms", res.t_reshard_ms) << "   moved "
    << size_text(res.bytes_moved) << ", already in place " << size_text(res.bytes_local) << "\n";
  t << fmt("  A + C.reshard(A.index_map) %9.3f ms", res.t_fused_ms)
    << (std::isnan(res.eta)
            ? std::string("   eta n/a  (nothing moves between devices: no transfer to hide)\n")
            : fmt("   eta = %.2f  (1: the transfer is hidden behind the add)\n", res.eta));
  if (!gpu) {
    // Host devices run on the CPU cores: with fewer cores than worker threads (a compute and a
    // transfer worker per device) the copies can only take time from the adds.
    const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
    const unsigned workers = 2U * static_cast<unsigned>(devs);
    if (cores < workers) {
      t << "  (host devices: " << cores << " CPU cores run " << workers
        << " worker threads, so the copies can only take time from\n"
           "   the adds and eta says little here, and the copy overlaps the add of whichever "
           "device\n   the OS runs beside it; on GPUs copy engines move the data beside the "
           "kernels)\n";
    }
  }
  t << "  overlap during A + C.reshard in the trace (share of transfer time with compute running,\n"
       "  per device):";
  for (int d = 0; d < devs; ++d) {
    t << ' ' << overlap_text(res.overlap[static_cast<std::size_t>(d)]);
  }
  if (!device_activity) {
    t << " (CUPTI off: the trace has no device activity)";
  } else {
    t << " in the best fused run,";
    for (int d = 0; d < devs; ++d) {
      t << ' ' << overlap_text(res.overlap_median[static_cast<std::size_t>(d)]);
    }
    t << " the median of its " << fused_runs.size() << " run"
      << (fused_runs.size() == 1 ? "" : "s");
  }
  t << "\n  (each run: poolscope trace summary " << o.trace_path << " --range demo.fused --each)";
  t << "\n\n  checks against the host:\n";
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
  t << "\n  allocators (" << o.allocator << "):\n";
  for (const auto& m : mem) {
    t << "    device " << m["device"].get<int>() << ": peak in use "
      << size_text(m["peak_in_use"].get<std::int64_t>()) << ", peak reserved "
      << size_text(m["peak_reserved"].get<std::int64_t>()) << ", upstream allocations "
      << m["upstream_allocs"].get<std::int64_t>() << "\n";
  }
  t << "    buffers handed on in queue order (no allocator call): " << bs.buffers_reused
    << "; queue waits enqueued " << bs.waits << ", elided " << bs.waits_elided
    << "; compute yielding to copies out of its device " << bs.compute_yielding;
  if (bs.kernel_graphs_made != 0) {
    t << "; kernel graphs made " << bs.kernel_graphs_made << ", launched with new arguments "
      << bs.kernel_graph_updates;
  }
  t << "\n";
  t << "\n  top scopes (function profiler):\n";
  {
    std::istringstream table(scopes.report().to_table());
    std::string line;
    for (int i = 0; i < 8 && std::getline(table, line); ++i) {
      t << "    " << line << "\n";
    }
  }
  t << "\n  top call sites in the demo (line profiler: bytes used / acquired below each line):\n";
  {
    // The demo's own frames, wherever they sit in the tree, by bytes used.
    std::vector<std::pair<std::uint64_t, std::string>> sites;
    std::function<void(const profiler::profile_node&)> visit =
        [&](const profiler::profile_node& nd) {
          if (nd.file.find("darray_demo.cpp") != std::string::npos && nd.total.used > 0) {
            sites.emplace_back(nd.total.used,
                               "line " + std::to_string(nd.line) + ": " +
                                   size_text(static_cast<std::int64_t>(nd.total.used)) + " used, " +
                                   size_text(static_cast<std::int64_t>(nd.total.acquired)) +
                                   " acquired in " + std::to_string(nd.total.count) +
                                   " allocations");
          }
          for (const auto& ch : nd.children) {
            visit(ch);
          }
        };
    visit(line_profile.root);
    std::sort(sites.begin(), sites.end(),
              [](const auto& l, const auto& r) { return l.first > r.first; });
    if (sites.empty()) {
      t << "    (no symbols for the demo's frames)\n";
    }
    for (std::size_t i = 0; i < sites.size() && i < 6; ++i) {
      t << "    darray_demo.cpp " << sites[i].second << "\n";
    }
  }
  t << "\n  trace: " << o.trace_path << " (" << check.events << " events; open in Perfetto)"
    << ", report: " << o.report_path << "\n";
  const std::size_t failed = static_cast<std::size_t>(
      std::count_if(res.checks.begin(), res.checks.end(), [](const auto& c) { return !c.ok; }));
  t << "summary: "
    << (failed == 0 ? "all " + std::to_string(res.checks.size()) + " checks passed"
                    : std::to_string(failed) + " checks FAILED")
    << "; eta " << eta_text(res.eta) << "; overlap";
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
  t << "; moved " << size_text(res.bytes_moved) << "\n";
  res.text = t.str();
  return res;
}

}  // namespace poolscope::tools
