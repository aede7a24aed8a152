#include "poolscope/profiler/overlap.hpp"

#include <algorithm>
#include <climits>

namespace poolscope::profiler {
namespace {

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

}  // namespace

std::string_view to_string(activity_class c) noexcept {
  switch (c) {
    case activity_class::compute:
      return "compute";
    case activity_class::transfer:
      return "transfer";
    case activity_class::other:
      return "other";
  }
  return "unknown";
}

std::optional<activity_class> classify_category(std::string_view cat) noexcept {
  if (cat == "kernel" || cat == "darray.compute") {
    return activity_class::compute;
  }
  if (cat == "memcpy" || cat == "nccl" || cat == "darray.transfer") {
    return activity_class::transfer;
  }
  if (cat == "memset") {
    return activity_class::other;
  }
  return std::nullopt;
}

bool is_nccl_kernel(std::string_view name) noexcept {
  return name.starts_with("ncclDevKernel") || name.starts_with("ncclKernel");
}

std::vector<interval> merge_intervals(std::vector<interval> v) {
  std::erase_if(v, [](const interval& i) { return i.end_ns <= i.begin_ns; });
  std::sort(v.begin(), v.end(), [](const interval& a, const interval& b) {
    return a.begin_ns < b.begin_ns || (a.begin_ns == b.begin_ns && a.end_ns > b.end_ns);
  });
  std::size_t out = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (out > 0 && v[i].begin_ns <= v[out - 1].end_ns) {
      v[out - 1].end_ns = std::max(v[out - 1].end_ns, v[i].end_ns);
    } else {
      v[out++] = v[i];
    }
  }
  v.resize(out);
  return v;
}

std::uint64_t total_length(std::span<const interval> merged) noexcept {
  std::uint64_t n = 0;
  for (const interval& i : merged) {
    n += i.length();
  }
  return n;
}

std::vector<interval> intersect_intervals(std::span<const interval> a,
                                          std::span<const interval> b) {
  std::vector<interval> out;
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t lo = std::max(a[i].begin_ns, b[j].begin_ns);
    const std::int64_t hi = std::min(a[i].end_ns, b[j].end_ns);
    if (lo < hi) {
      out.push_back({lo, hi});
    }
    if (a[i].end_ns < b[j].end_ns) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

nlohmann::json device_overlap::to_json() const {
  return {{"device", device},           {"window_ns", window_ns},
          {"first_ns", first_ns},       {"last_ns", last_ns},
          {"compute_ns", compute_ns},   {"transfer_ns", transfer_ns},
          {"other_ns", other_ns},       {"both_ns", both_ns},
          {"busy_ns", busy_ns},         {"idle_ns", idle_ns},
          {"compute_ops", compute_ops}, {"transfer_ops", transfer_ops},
          {"other_ops", other_ops},     {"overlap_ratio", overlap_ratio}};
}

// ---------------------------------------------------------------------------------------------
// overlap_analyzer

overlap_analyzer::overlap_analyzer(std::size_t max_intervals, std::size_t compact_at)
    : max_intervals_(max_intervals), compact_at_(std::max<std::size_t>(compact_at, 16)) {}

void overlap_analyzer::compact(std::vector<interval>& v) {
  const std::size_t before = v.size();
  v = merge_intervals(std::move(v));
  held_ -= before - v.size();
}

void overlap_analyzer::add(int device, activity_class c, std::int64_t begin_ns, std::int64_t end_ns,
                           std::uint64_t ops) {
  lists& l = devices_[device];
  const auto k = static_cast<std::size_t>(c);
  l.ops[k] += ops;
  if (end_ns <= begin_ns) {
    return;
  }
  std::vector<interval>& v = l.of[k];
  if (held_ >= max_intervals_) {
    compact(v);
    if (held_ >= max_intervals_) {
      ++dropped_;
      return;
    }
  }
  // Back-to-back work on one class extends the last interval instead of adding one.
  if (!v.empty() && begin_ns >= v.back().begin_ns && begin_ns <= v.back().end_ns) {
    v.back().end_ns = std::max(v.back().end_ns, end_ns);
  } else {
    v.push_back({begin_ns, end_ns});
    ++held_;
    if (v.size() >= compact_at_) {
      compact(v);
    }
  }
  min_ns_ = std::min(min_ns_, begin_ns);
  max_ns_ = std::max(max_ns_, end_ns);
}

void overlap_analyzer::set_window(std::int64_t begin_ns, std::int64_t end_ns) noexcept {
  window_ = interval{begin_ns, std::max(begin_ns, end_ns)};
}

void overlap_analyzer::set_windows(std::vector<interval> windows) {
  windows_ = merge_intervals(std::move(windows));
}

std::vector<device_overlap> overlap_analyzer::analyze() const {
  std::vector<device_overlap> out;
  std::vector<interval> windows = windows_;
  if (windows.empty()) {
    windows.push_back(window_ ? *window_
                              : (min_ns_ <= max_ns_ ? interval{min_ns_, max_ns_} : interval{0, 0}));
  }
  const std::uint64_t window_ns = total_length(windows);
  for (const auto& [device, l] : devices_) {
    device_overlap d;
    d.device = device;
    d.window_ns = window_ns;
    const auto compute = merge_intervals(l.of[0]);
    const auto transfer = merge_intervals(l.of[1]);
    const auto other = merge_intervals(l.of[2]);
    d.compute_ns = total_length(compute);
    d.transfer_ns = total_length(transfer);
    d.other_ns = total_length(other);
    d.both_ns = total_length(intersect_intervals(compute, transfer));
    std::vector<interval> all;
    all.reserve(compute.size() + transfer.size() + other.size());
    all.insert(all.end(), compute.begin(), compute.end());
    all.insert(all.end(), transfer.begin(), transfer.end());
    all.insert(all.end(), other.begin(), other.end());
    const auto busy = merge_intervals(std::move(all));
    d.busy_ns = total_length(busy);
    if (!busy.empty()) {
      d.first_ns = busy.front().begin_ns;
      d.last_ns = busy.back().end_ns;
    }
    // Only the busy time inside the window counts against it.
    const std::uint64_t busy_in_window = total_length(intersect_intervals(busy, windows));
    d.idle_ns = d.window_ns - std::min(d.window_ns, busy_in_window);
    d.compute_ops = l.ops[0];
    d.transfer_ops = l.ops[1];
    d.other_ops = l.ops[2];
    d.overlap_ratio = d.transfer_ns == 0
                          ? 0.0
                          : static_cast<double>(d.both_ns) / static_cast<double>(d.transfer_ns);
    out.push_back(d);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// op_summary

void op_summary::add(std::uint64_t dur_ns, std::uint64_t op_bytes) noexcept {
  min_ns = count == 0 ? dur_ns : std::min(min_ns, dur_ns);
  max_ns = std::max(max_ns, dur_ns);
  ++count;
  total_ns = saturating_add(total_ns, dur_ns);
  bytes = saturating_add(bytes, op_bytes);
}

double op_summary::mean_ns() const noexcept {
  return count == 0 ? 0.0 : static_cast<double>(total_ns) / static_cast<double>(count);
}

double op_summary::gbps() const noexcept {
  return total_ns == 0 ? 0.0 : static_cast<double>(bytes) / static_cast<double>(total_ns);
}

nlohmann::json op_summary::to_json() const {
  nlohmann::json j = {{"name", name},     {"category", category}, {"device", device},
                      {"count", count},   {"total_ns", total_ns}, {"mean_ns", mean_ns()},
                      {"min_ns", min_ns}, {"max_ns", max_ns}};
  if (category == "memcpy" || category == "memset" || bytes != 0) {
    j["bytes"] = bytes;
    j["gbps"] = gbps();
  }
  return j;
}

}  // namespace poolscope::profiler
