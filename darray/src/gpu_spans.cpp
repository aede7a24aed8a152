// gpu_spans (gpu_spans.hpp): the slices of transfers with other ranks timed on the GPU.
#include "gpu_spans.hpp"

#include <string>
#include <utility>

#include "poolscope/hooks/event.hpp"

namespace poolscope::darray::detail {

namespace {
using seam::device_guard;
using seam::log_failure;

constexpr std::uint64_t anchor_life_ns = 10'000'000'000;  // float ms keep µs over this
constexpr int anchor_attempts = 8;
constexpr std::uint64_t anchor_window_ns = 20'000;  // narrow enough: no more attempts

// Host ns of GPU event `e` from `a` (both complete).
std::uint64_t host_time(const cudaEvent_t a, std::uint64_t a_host_ns, cudaEvent_t e) {
  float ms = 0;
  POOLSCOPE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, e));
  const auto delta = static_cast<std::int64_t>(static_cast<double>(ms) * 1e6);
  return static_cast<std::uint64_t>(static_cast<std::int64_t>(a_host_ns) + delta);
}

void destroy(cudaEvent_t e) noexcept {
  if (e != nullptr) {
    log_failure("cudaEventDestroy", [e] { POOLSCOPE_CUDA_CHECK(cudaEventDestroy(e)); });
  }
}
}  // namespace

gpu_spans::anchor::~anchor() {
  destroy(event);
}

gpu_spans::~gpu_spans() {
  for (const span& s : spans_) {
    destroy(s.begin);
    destroy(s.end);
  }
  anchors_.clear();
  for (auto& [ordinal, s] : idle_) {
    log_failure("cudaStreamDestroy", [s] { POOLSCOPE_CUDA_CHECK(cudaStreamDestroy(s)); });
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

std::shared_ptr<const gpu_spans::anchor> gpu_spans::clock_locked(int ordinal) {
  std::shared_ptr<const anchor>& current = anchors_[ordinal];
  if (current && hooks::now_ns() - current->host_ns < anchor_life_ns) {
    return current;
  }
  cudaStream_t& idle = idle_[ordinal];
  if (idle == nullptr) {
    POOLSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking));
  }
  // The stream holds nothing else: the event completes as soon as the GPU reaches it, between the
  // two host readings. A reading this thread was taken off its core during is wide: the
  // narrowest of a few is kept.
  std::shared_ptr<anchor> best;
  std::uint64_t best_window = UINT64_MAX;
  for (int attempt = 0; attempt < anchor_attempts && best_window > anchor_window_ns; ++attempt) {
    auto a = std::make_shared<anchor>();
    POOLSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&a->event, cudaEventDefault));
    const std::uint64_t before = hooks::now_ns();
    POOLSCOPE_CUDA_CHECK(cudaEventRecord(a->event, idle));
    cudaError_t q = cudaErrorNotReady;
    while ((q = cudaEventQuery(a->event)) == cudaErrorNotReady) {
    }
    POOLSCOPE_CUDA_CHECK(q);
    const std::uint64_t window = hooks::now_ns() - before;
    a->host_ns = before + window / 2;
    // The event's elapsed times are float milliseconds: about 0.5 us of resolution on top.
    a->error_ns = (window + 1) / 2 + 500;
    if (window < best_window) {
      best_window = window;
      best = std::move(a);
    }
  }
  current = std::move(best);  // an older anchor lives on with the spans that use it
  return current;
}

void gpu_spans::end(int ordinal, cudaStream_t s, cudaEvent_t begin, std::vector<transfer_ends> ends,
                    int device, profiler::timeline* tl) {
  span x{nullptr, begin, nullptr, std::move(ends), device, tl};
  try {
    const device_guard on(ordinal);
    POOLSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&x.end, cudaEventDefault));
    POOLSCOPE_CUDA_CHECK(cudaEventRecord(x.end, s));
    const std::lock_guard lock(mutex_);
    x.clock = clock_locked(ordinal);
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

void gpu_spans::flush(profiler::timeline* current) {
  const std::lock_guard lock(mutex_);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < spans_.size(); ++i) {
    span& x = spans_[i];
    if (cudaEventQuery(x.end) == cudaErrorNotReady) {
      if (kept != i) {
        spans_[kept] = std::move(x);
      }
      ++kept;
      continue;
    }
    (void)cudaGetLastError();  // a failed query (a faulted stream) drops the span, not the flush
    if (x.tl != nullptr && x.tl == current) {
      try {
        const std::uint64_t b = host_time(x.clock->event, x.clock->host_ns, x.begin);
        const std::uint64_t e = host_time(x.clock->event, x.clock->host_ns, x.end);
        const std::string name = "transfers with other ranks, device " + std::to_string(x.device);
        for (const transfer_ends& t : x.ends) {
          add_transfer_slice(*current, t, x.device, rank_piece_category, b, e < b ? b : e,
                             track(x.device), name, x.clock->error_ns);
        }
      } catch (const cuda_error&) {
        // The events of a failed transfer carry no times: no slice for it.
      }
    }
    destroy(x.begin);
    destroy(x.end);
  }
  spans_.resize(kept);
}

}  // namespace poolscope::darray::detail
