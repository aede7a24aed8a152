// gpu_spans (gpu_spans.hpp): the slices of transfers with other ranks timed on the GPU.
#include "gpu_spans.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "poolscope/hooks/event.hpp"

namespace poolscope::darray::detail {

namespace {
using seam::device_guard;
using seam::log_failure;

// A span's first anchor is at most this old when it ends (flush() renews anchors far more often
// while spans complete): cudaEventElapsedTime's float milliseconds keep a tenth of a µs from it.
constexpr std::uint64_t anchor_life_ns = 1'000'000'000;
constexpr int anchor_attempts = 8;
constexpr std::uint64_t anchor_window_ns = 20'000;  // narrow enough: no more attempts

// GPU ns from event `a` to `e` (both complete; negative when e ran first).
double gpu_ns(cudaEvent_t a, cudaEvent_t e) {
  float ms = 0;
  POOLSCOPE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, e));
  return static_cast<double>(ms) * 1e6;
}

void destroy(cudaEvent_t e) noexcept {
  if (e != nullptr) {
    log_failure("cudaEventDestroy", [e] { POOLSCOPE_CUDA_CHECK(cudaEventDestroy(e)); });
  }
}
}  // namespace

host_reading clock_map(host_reading a, host_reading b, double gpu_ab_ns,
                       double gpu_ax_ns) noexcept {
  if (!(gpu_ab_ns > 0)) {
    return {a.ns + gpu_ax_ns, a.error_ns};
  }
  const double w = gpu_ax_ns / gpu_ab_ns;
  return {a.ns + w * (b.ns - a.ns), std::abs(1 - w) * a.error_ns + std::abs(w) * b.error_ns};
}

host_reading clock_place(const std::deque<clock_point>& chain, double gpu_ns) noexcept {
  if (chain.size() < 2) {
    return clock_map(chain.front().host, chain.front().host, 0, gpu_ns - chain.front().gpu_ns);
  }
  const auto after = std::upper_bound(chain.begin(), chain.end(), gpu_ns,
                                      [](double g, const clock_point& p) { return g < p.gpu_ns; });
  const std::size_t hi =
      std::clamp<std::size_t>(static_cast<std::size_t>(after - chain.begin()), 1, chain.size() - 1);
  const clock_point& a = chain[hi - 1];
  const clock_point& b = chain[hi];
  return clock_map(a.host, b.host, b.gpu_ns - a.gpu_ns, gpu_ns - a.gpu_ns);
}

gpu_spans::anchor::~anchor() {
  destroy(event);
}

gpu_spans::~gpu_spans() {
  for (const span& s : spans_) {
    destroy(s.begin);
    destroy(s.end);
  }
  spans_.clear();
  for (auto& [ordinal, c] : clocks_) {
    c.last.reset();
    if (c.idle != nullptr) {
      const cudaStream_t s = c.idle;
      log_failure("cudaStreamDestroy", [s] { POOLSCOPE_CUDA_CHECK(cudaStreamDestroy(s)); });
    }
  }
}

cudaEvent_t gpu_spans::begin(int ordinal, cudaStream_t s) {
  const device_guard on(ordinal);
  cudaEvent_t e = nullptr;
  POOLSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  const cudaError_t r = cudaEventRecord(e, s);
  if (r != cudaSuccess) {
    destroy(e);
    POOLSCOPE_CUDA_CHECK(r);
  }
  return e;
}

std::shared_ptr<const gpu_spans::anchor> gpu_spans::clock_locked(int ordinal,
                                                                 std::uint64_t life_ns) {
  gpu_clock& c = clocks_[ordinal];
  const std::uint64_t now = hooks::now_ns();
  if (c.last && now - c.last->recorded_ns < life_ns) {
    return c.last;
  }
  if (c.idle == nullptr) {
    POOLSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&c.idle, cudaStreamNonBlocking));
  }
  // The stream holds nothing else: the event completes as soon as the GPU reaches it, between the
  // two host readings. A reading this thread was taken off its core during is wide: the
  // narrowest of a few is kept.
  std::shared_ptr<anchor> best;
  std::uint64_t best_window = UINT64_MAX;
  for (int attempt = 0; attempt < anchor_attempts && best_window > anchor_window_ns; ++attempt) {
    auto a = std::make_shared<anchor>();
    POOLSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&a->event, cudaEventDefault));
    a->recorded_ns = hooks::now_ns();
    POOLSCOPE_CUDA_CHECK(cudaEventRecord(a->event, c.idle));
    cudaError_t q = cudaErrorNotReady;
    while ((q = cudaEventQuery(a->event)) == cudaErrorNotReady) {
    }
    POOLSCOPE_CUDA_CHECK(q);
    const std::uint64_t window = hooks::now_ns() - a->recorded_ns;
    a->at.host.ns = static_cast<double>(a->recorded_ns) + static_cast<double>(window) / 2;
    // The event's elapsed times are float milliseconds: about 0.5 us of resolution on top.
    a->at.host.error_ns = static_cast<double>(window) / 2 + 500;
    if (window < best_window) {
      best_window = window;
      best = std::move(a);
    }
  }
  if (c.last) {
    // The gap is float milliseconds: after a long idle stretch (minutes) their rounding, a few
    // µs, counts in this anchor's error.
    float ms = 0;
    POOLSCOPE_CUDA_CHECK(cudaEventElapsedTime(&ms, c.last->event, best->event));
    const double rounding =
        (static_cast<double>(std::nextafter(ms, std::numeric_limits<float>::infinity())) - ms) *
        0.5e6;
    best->at.gpu_ns = c.last->at.gpu_ns + static_cast<double>(ms) * 1e6;
    best->at.host.error_ns += rounding;
  }
  c.chain.push_back(best->at);
  while (c.chain.size() > 2 &&
         best->at.host.ns - c.chain.front().host.ns > static_cast<double>(chain_keep_ns)) {
    c.chain.pop_front();
  }
  c.last = std::move(best);  // an older anchor lives on with the spans that use it
  return c.last;
}

void gpu_spans::end(int ordinal, cudaStream_t s, cudaEvent_t begin, std::vector<transfer_ends> ends,
                    int device, profiler::timeline* tl) {
  span x{nullptr, begin, nullptr, std::move(ends), device, tl, ordinal};
  try {
    const device_guard on(ordinal);
    POOLSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&x.end, cudaEventDefault));
    POOLSCOPE_CUDA_CHECK(cudaEventRecord(x.end, s));
    const std::lock_guard lock(mutex_);
    x.clock = clock_locked(ordinal, anchor_life_ns);
    spans_.push_back(std::move(x));
  } catch (...) {
    destroy(x.begin);
    destroy(x.end);
    throw;
  }
}

void gpu_spans::discard(cudaEvent_t begin) noexcept {
  destroy(begin);
}

void gpu_spans::flush(profiler::timeline* current, bool settle) {
  const std::lock_guard lock(mutex_);
  // Which spans have run, before any anchor is recorded: an anchor recorded after `seen` is later
  // on its GPU than each of them.
  std::map<int, std::uint64_t> waiting;  // per ordinal with spans to place: the latest seen
  for (span& x : spans_) {
    if (x.seen_ns == 0 && cudaEventQuery(x.end) != cudaErrorNotReady) {
      (void)cudaGetLastError();  // a failed query (a faulted stream) drops the span, not the flush
      x.seen_ns = 1;             // set below, once every query is done
    }
  }
  const std::uint64_t seen = hooks::now_ns();
  for (span& x : spans_) {
    if (x.seen_ns == 1) {
      x.seen_ns = seen;
    }
    if (x.seen_ns != 0 && x.tl != nullptr && x.tl == current) {
      std::uint64_t& latest = waiting[x.ordinal];
      latest = std::max(latest, x.seen_ns);
    }
  }
  for (const auto& [ordinal, latest] : waiting) {
    const gpu_clock& c = clocks_[ordinal];
    if (c.last && c.last->recorded_ns > latest) {
      continue;  // an anchor after all of them already
    }
    try {
      const device_guard on(ordinal);
      (void)clock_locked(ordinal, settle ? min_anchor_gap_ns : anchor_interval_ns);
    } catch (const cuda_error&) {
      // A GPU that cannot time an anchor (a faulted context): its spans wait, and go with the
      // timeline.
    }
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < spans_.size(); ++i) {
    span& x = spans_[i];
    const bool wanted = x.tl != nullptr && x.tl == current;
    const bool placed =
        wanted && x.seen_ns != 0 && (settle || clocks_[x.ordinal].last->recorded_ns > x.seen_ns);
    if (x.seen_ns == 0 || (wanted && !placed)) {
      if (kept != i) {
        spans_[kept] = std::move(x);
      }
      ++kept;
      continue;
    }
    if (placed) {
      add_slices(x, *current);
    }
    destroy(x.begin);
    destroy(x.end);
  }
  spans_.resize(kept);
}

void gpu_spans::add_slices(const span& x, profiler::timeline& tl) {
  try {
    const anchor& a = *x.clock;
    const std::deque<clock_point>& chain = clocks_.at(x.ordinal).chain;
    const host_reading begin = clock_place(chain, a.at.gpu_ns + gpu_ns(a.event, x.begin));
    const host_reading end = clock_place(chain, a.at.gpu_ns + gpu_ns(a.event, x.end));
    // A device's spans follow each other on its stream: placed within a few ns of each other
    // where the GPU ran them back to back, they are kept in order.
    std::uint64_t& last = last_end_[x.device];
    const auto b = std::max(last, static_cast<std::uint64_t>(std::llround(begin.ns)));
    const auto e = std::max(b, static_cast<std::uint64_t>(std::llround(end.ns)));
    last = e;
    const auto error =
        static_cast<std::uint64_t>(std::ceil(std::max(begin.error_ns, end.error_ns)));
    const std::string name = "transfers with other ranks, device " + std::to_string(x.device);
    for (const transfer_ends& t : x.ends) {
      add_transfer_slice(tl, t, x.device, rank_piece_category, b, e, track(x.device), name, error);
    }
  } catch (const cuda_error&) {
    // The events of a failed transfer carry no times: no slice for it.
  }
}

}  // namespace poolscope::darray::detail
