#include "poolscope/bench/darray_scale_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

#include "poolscope/bench/text_table.hpp"
#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/darray/planner.hpp"
#include "poolscope/error.hpp"

namespace poolscope::bench {

namespace {

using darray::index_map;

// The source and target maps of a planner pattern over `devices` devices, and their shape.
struct planner_maps {
  darray::shape_t shape;
  darray::index_map src;
  darray::index_map dst;
};
planner_maps planner_pattern(std::string_view name, int devices);
using darray::shape_t;
using darray_f64 = darray::distributed_array<double>;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The best of `runs` timed calls of `op` (seconds), after one untimed call; one timed call when
// the untimed one took over a second (planning millions of pieces).
double best_seconds(int runs, const std::function<void()>& op) {
  const auto warm = std::chrono::steady_clock::now();
  op();
  if (std::chrono::duration<double>(std::chrono::steady_clock::now() - warm).count() > 1.0) {
    runs = 1;
  }
  double best = 0.0;
  for (int i = 0; i < std::max(runs, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    op();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = i == 0 ? s : std::min(best, s);
  }
  return best;
}

// `blocks` with block i on device (i + 1) % devices.
index_map rotated_blocks(const shape_t& shape, int devices) {
  const index_map blocks = index_map::blocks(shape, 0, devices);
  index_map out;
  for (const auto& [device, boxes] : blocks.parts()) {
    for (const darray::box& b : boxes) {
      out.add((device + 1) % devices, b);
    }
  }
  return out;
}

// `shape` (1-D) in `p` equal blocks, all on device 0.
index_map blocks_on_one_device(const shape_t& shape, std::int64_t p) {
  index_map out;
  const std::int64_t n = shape[0];
  for (std::int64_t i = 0; i < p; ++i) {
    out.add(0, darray::box{{darray::slice{n * i / p, n * (i + 1) / p}}});
  }
  return out;
}

void check_options(const darray_scale_options& o) {
  if (o.n < 1) {
    throw invalid_argument("darray scale bench: n " + std::to_string(o.n) + " is not positive");
  }
  if (o.max_parts < 1) {
    throw invalid_argument("darray scale bench: max_parts " + std::to_string(o.max_parts) +
                           " is not positive");
  }
  if (o.repeat < 1) {
    throw invalid_argument("darray scale bench: repeat " + std::to_string(o.repeat) +
                           " is not positive");
  }
  for (const std::string& w : o.only) {
    if (w != "parts" && w != "planner") {
      throw invalid_argument("darray scale bench: unknown part '" + w + "' (parts, planner)");
    }
  }
  const auto names = planner_pattern_names();
  for (const std::string& p : o.planner_patterns) {
    if (std::find(names.begin(), names.end(), p) == names.end()) {
      throw invalid_argument("darray scale bench: unknown planner pattern '" + p + "'");
    }
  }
  for (const int d : o.planner_devices) {
    if (d < 2) {
      throw invalid_argument("darray scale bench: planner device count " + std::to_string(d) +
                             " is below 2");
    }
  }
}

bool runs(const darray_scale_options& o, const char* what) {
  return o.only.empty() || std::find(o.only.begin(), o.only.end(), what) != o.only.end();
}

std::uint64_t visited_by(darray::backend& be, const std::function<void()>& op) {
  const std::uint64_t before = be.stats().parts_visited;
  op();
  return be.stats().parts_visited - before;
}

// The array b of the parts rows: `host` with each chunk in `p` parts. With several devices, x (in
// blocks) resharded to the rotated blocks, split_bytes cutting each chunk's piece from the
// previous device into `p` parts (copies between devices). On one device nothing crosses
// devices, so `host` is placed in `p` blocks on device 0 and resharded to one block there: `p`
// local pieces, which the executor never copies or coalesces (each part of the new chunk reads
// its source chunk's buffer), so the chunk holds `p` parts that ops read through its part index.
darray_f64 in_parts(const std::shared_ptr<darray::backend>& be, const std::vector<double>& host,
                    const darray_f64& x, const index_map& moved, std::int64_t chunk_bytes,
                    std::int64_t p) {
  const shape_t shape{static_cast<std::int64_t>(host.size())};
  if (be->device_count() == 1) {
    const auto pieces = darray_f64::from_host(be, host, shape, blocks_on_one_device(shape, p));
    auto b = pieces.reshard(moved);
    b.wait();
    return b;
  }
  darray::reshard_options ro;
  ro.split_bytes = p == 1 ? 0 : std::max<std::int64_t>(8, chunk_bytes / p);
  auto b = x.reshard(moved, ro);
  b.wait();
  return b;
}

std::vector<darray_parts_row> run_parts(const darray_scale_options& o, darray_scale_report& rep,
                                        std::ostream* progress) {
  auto be = darray::make_backend(o.devices);
  rep.backend = be->name();
  const int devices = be->device_count();
  const shape_t shape{o.n};
  std::vector<double> host(static_cast<std::size_t>(o.n));
  for (std::size_t i = 0; i < host.size(); ++i) {
    host[i] = static_cast<double>(i % 1000) * 0.5;
  }
  const index_map blocks = index_map::blocks(shape, 0, devices);
  const index_map moved = devices > 1 ? rotated_blocks(shape, devices) : blocks;
  const auto x = darray_f64::from_host(be, host, shape, blocks);
  const auto a = darray_f64::from_host(be, host, shape, moved);
  // The largest chunk's bytes: split_bytes = that / P gives it P pieces.
  std::int64_t chunk_bytes = 0;
  for (const auto& c : a.chunks()) {
    chunk_bytes = std::max(chunk_bytes, c.region.size() * std::int64_t{8});
  }
  std::vector<darray_parts_row> rows;
  // One device cuts the array into P blocks: at most one element each.
  const std::int64_t most = devices == 1 ? std::min(o.max_parts, o.n) : o.max_parts;
  for (std::int64_t p = 1; p <= most; p *= 4) {
    const auto b = in_parts(be, host, x, moved, chunk_bytes, p);
    darray_parts_row r;
    r.parts = 0;
    for (const auto& c : b.chunks()) {
      r.parts = std::max(r.parts, static_cast<std::int64_t>(c.parts.size()));
    }
    r.unsplit_add_ms = 1e3 * best_seconds(o.repeat, [&] { (a + a).wait(); });
    r.add_ms = 1e3 * best_seconds(o.repeat, [&] { (b + b).wait(); });
    r.mixed_add_ms = 1e3 * best_seconds(o.repeat, [&] { (b + a).wait(); });
    r.sum_ms = 1e3 * best_seconds(o.repeat, [&] { darray::sum(b).wait(); });
    r.add_visited = visited_by(*be, [&] { (b + b).wait(); });
    r.sum_visited = visited_by(*be, [&] { darray::sum(b).wait(); });
    if (progress != nullptr) {
      *progress << "parts " << r.parts << ": b + b " << fmt("%.3f", r.add_ms) << " ms\n";
    }
    rows.push_back(r);
  }
  return rows;
}

std::vector<darray_planner_row> run_planner(const darray_scale_options& o, std::ostream* progress) {
  std::vector<std::string> patterns =
      o.planner_patterns.empty() ? planner_pattern_names() : o.planner_patterns;
  std::vector<darray_planner_row> rows;
  for (const std::string& pattern : patterns) {
    for (const int d : o.planner_devices) {
      const planner_maps m = planner_pattern(pattern, d);
      const auto src = m.src.chunks();
      const auto dst = m.dst.chunks();
      darray::plan_options po;
      po.element_size = 4;
      darray_planner_row r;
      r.pattern = pattern;
      r.devices = d;
      r.src_chunks = src.size();
      r.dst_chunks = dst.size();
      r.validate_ms = 1e3 * best_seconds(o.repeat, [&] { m.dst.validate(m.shape, d); });
      darray::reshard_plan plan;
      r.plan_ms = 1e3 * best_seconds(o.repeat, [&] {
                    plan = darray::reshard_plan{};  // one plan's memory at a time
                    plan = darray::plan_reshard(src, dst, po);
                  });
      r.pieces = plan.pieces.size();
      r.remote_pieces = static_cast<std::size_t>(std::count_if(
          plan.pieces.begin(), plan.pieces.end(), [](const darray::piece& p) { return !p.local; }));
      r.plan_bytes = plan.pieces.capacity() * sizeof(darray::piece);
      for (const auto& list : plan.pieces_of_dst) {
        r.plan_bytes += list.capacity() * sizeof(std::size_t);
      }
      r.boxes_visited = plan.boxes_visited;
      if (progress != nullptr) {
        *progress << "planner " << pattern << " on " << d << " devices: " << r.pieces
                  << " pieces in " << fmt("%.2f", r.plan_ms) << " ms\n";
      }
      rows.push_back(r);
    }
  }
  return rows;
}

double log2_at_least_1(double x) {
  return std::max(1.0, std::log2(x));
}

void render(darray_scale_report& rep) {
  std::ostringstream out;
  if (!rep.parts.empty()) {
    out << "parts: ops on " << rep.backend << " on arrays of " << rep.n
        << " float64 whose chunks arrived in P pieces (b), beside the unsplit a, best of "
        << rep.repeat << " runs\n";
    text_table t{{"P", "a + a", "b + b", "b + a", "sum(b)", "b + b / a + a", "growth (4x P)",
                  "visited / P (b + b)", "visited / P (sum)"}};
    double prev = 0.0;
    for (const auto& r : rep.parts) {
      const auto p = static_cast<double>(r.parts);
      t.add_row({std::to_string(r.parts), fmt("%.3f ms", r.unsplit_add_ms),
                 fmt("%.3f ms", r.add_ms), fmt("%.3f ms", r.mixed_add_ms), fmt("%.3f ms", r.sum_ms),
                 format_ratio(r.add_ms / r.unsplit_add_ms),
                 prev > 0 ? format_ratio(r.add_ms / prev) : "-",
                 fmt("%.1f", static_cast<double>(r.add_visited) / p),
                 fmt("%.1f", static_cast<double>(r.sum_visited) / p)});
      prev = r.add_ms;
    }
    t.print(out);
    out << "\n";
  }
  if (!rep.planner.empty()) {
    out << "planner: plan_reshard between two maps over D devices (float32, no data moved)\n";
    text_table t{{"pattern", "D", "chunks", "pieces", "remote", "plan", "plan / piece", "validate",
                  "plan bytes", "visited / (pieces log2 pieces)"}};
    for (const auto& r : rep.planner) {
      const auto pieces = static_cast<double>(std::max<std::size_t>(r.pieces, 1));
      t.add_row(
          {r.pattern, std::to_string(r.devices),
           std::to_string(r.src_chunks) + " -> " + std::to_string(r.dst_chunks),
           std::to_string(r.pieces), std::to_string(r.remote_pieces), fmt("%.2f ms", r.plan_ms),
           fmt("%.2f us", 1e3 * r.plan_ms / pieces), fmt("%.2f ms", r.validate_ms),
           format_size(r.plan_bytes),
           fmt("%.2f", static_cast<double>(r.boxes_visited) / (pieces * log2_at_least_1(pieces)))});
    }
    t.print(out);
    out << "\n";
  }
  std::string summary = "summary:";
  if (rep.parts.size() >= 2) {
    double worst = 0.0;
    for (std::size_t i = 1; i < rep.parts.size(); ++i) {
      worst = std::max(worst, rep.parts[i].add_ms / rep.parts[i - 1].add_ms);
    }
    const auto& last = rep.parts.back();
    summary += " b + b at P = " + std::to_string(last.parts) + " " +
               fmt("%.2f", last.add_ms / last.unsplit_add_ms) + "x the unsplit op; worst 4x-P " +
               "step " + fmt("%.2f", worst) + "x;";
  }
  if (!rep.planner.empty()) {
    const auto largest =
        std::max_element(rep.planner.begin(), rep.planner.end(),
                         [](const darray_planner_row& l, const darray_planner_row& r) {
                           return l.pieces < r.pieces;
                         });
    summary += " largest plan " + std::to_string(largest->pieces) + " pieces (" + largest->pattern +
               ", " + std::to_string(largest->devices) + " devices) in " +
               fmt("%.1f", largest->plan_ms) + " ms";
  }
  rep.summary = summary;
  rep.text = out.str() + summary + "\n";
}

}  // namespace

std::vector<std::string> planner_pattern_names() {
  return {"rotate", "rows_to_columns", "split_07", "replicate_to_blocks"};
}

namespace {

// Throws invalid_argument naming an unknown pattern or a device count below 2.
planner_maps planner_pattern(std::string_view name, int devices) {
  if (devices < 2) {
    throw invalid_argument("planner_pattern: device count " + std::to_string(devices) +
                           " is below 2");
  }
  planner_maps m;
  const std::int64_t d = devices;
  if (name == "rows_to_columns") {
    m.shape = {64 * d, 64 * d};
    m.src = index_map::blocks(m.shape, 0, devices);
    m.dst = index_map::blocks(m.shape, 1, devices);
    return m;
  }
  m.shape = {d << 20};
  const std::int64_t n = m.shape[0];
  if (name == "rotate") {
    m.src = index_map::blocks(m.shape, 0, devices);
    m.dst = rotated_blocks(m.shape, devices);
  } else if (name == "split_07") {
    // The seed example's C over `devices`: [0, 0.7 n) in equal blocks on the first half of the
    // devices, [0.7 n, n) on the rest.
    m.src = index_map::blocks(m.shape, 0, devices);
    const std::int64_t cut = 7 * n / 10;
    const std::int64_t low = d / 2;
    const std::int64_t high = d - low;
    std::vector<std::tuple<int, std::int64_t, std::int64_t>> ranges;
    for (std::int64_t i = 0; i < low; ++i) {
      ranges.emplace_back(static_cast<int>(i), cut * i / low, cut * (i + 1) / low);
    }
    for (std::int64_t i = 0; i < high; ++i) {
      ranges.emplace_back(static_cast<int>(low + i), cut + (n - cut) * i / high,
                          cut + (n - cut) * (i + 1) / high);
    }
    m.dst = index_map::split(m.shape, 0, ranges);
  } else if (name == "replicate_to_blocks") {
    std::vector<int> all(static_cast<std::size_t>(devices));
    for (int i = 0; i < devices; ++i) {
      all[static_cast<std::size_t>(i)] = i;
    }
    m.src = index_map::replicated(m.shape, all);
    m.dst = index_map::blocks(m.shape, 0, devices);
  } else {
    throw invalid_argument("planner_pattern: unknown pattern '" + std::string(name) +
                           "' (rotate, rows_to_columns, split_07, replicate_to_blocks)");
  }
  return m;
}

}  // namespace

std::string darray_scale_report::to_json() const {
  nlohmann::json j;
  j["backend"] = backend;
  j["n"] = n;
  j["repeat"] = repeat;
  j["parts"] = nlohmann::json::array();
  for (const auto& r : parts) {
    j["parts"].push_back({{"parts", r.parts},
                          {"unsplit_add_ms", r.unsplit_add_ms},
                          {"add_ms", r.add_ms},
                          {"mixed_add_ms", r.mixed_add_ms},
                          {"sum_ms", r.sum_ms},
                          {"add_visited", r.add_visited},
                          {"sum_visited", r.sum_visited}});
  }
  j["planner"] = nlohmann::json::array();
  for (const auto& r : planner) {
    j["planner"].push_back({{"pattern", r.pattern},
                            {"devices", r.devices},
                            {"src_chunks", r.src_chunks},
                            {"dst_chunks", r.dst_chunks},
                            {"pieces", r.pieces},
                            {"remote_pieces", r.remote_pieces},
                            {"plan_bytes", r.plan_bytes},
                            {"plan_ms", r.plan_ms},
                            {"validate_ms", r.validate_ms},
                            {"boxes_visited", r.boxes_visited}});
  }
  j["summary"] = summary;
  return j.dump(2);
}

darray_scale_report run_darray_scale_bench(const darray_scale_options& options,
                                           std::ostream* progress) {
  check_options(options);
  darray_scale_report rep;
  rep.n = options.n;
  rep.repeat = options.repeat;
  if (runs(options, "parts")) {
    rep.parts = run_parts(options, rep, progress);
  }
  if (runs(options, "planner")) {
    rep.planner = run_planner(options, progress);
  }
  render(rep);
  return rep;
}

}  // namespace poolscope::bench
