// Each GPU's clock against the host's (CLOCK_MONOTONIC, what every poolscope timeline uses): how
// far the times of CUDA events drift from host time, which is why darray's GPU spans place their
// times between anchors rather than from one (darray/src/gpu_spans.hpp).
//
// Per GPU, an anchor every 250 ms for --seconds (default 10): an event recorded on an idle stream,
// its host time the middle of the narrowest of 8 windows between the record and the moment it was
// seen complete. Its GPU time is summed from the elapsed times between consecutive anchors (each
// short, so float milliseconds keep nanoseconds). The host time against the GPU time is fitted by
// least squares: the slope gives the GPU clock's rate against the host's (ppm), the residuals how
// straight the drift is, the anchors' windows how wide each reading is.
//
// Rows per GPU: rate (ppm, negative: the GPU clock runs fast), drift over 10 s placed by one
// anchor (µs), the residuals' rms and largest (ns), the median anchor window (ns). Without a GPU
// it prints why and exits 0.
//   build/bin/gpu_clock_drift [--seconds S]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "poolscope/detail/cuda_check.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"

namespace {

struct reading {
  cudaEvent_t event = nullptr;
  double host_ns = 0;
  double window_ns = 0;
};

reading anchor(cudaStream_t idle) {
  reading best{nullptr, 0, 1e300};
  for (int attempt = 0; attempt < 8; ++attempt) {
    cudaEvent_t e = nullptr;
    POOLSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
    const std::uint64_t before = poolscope::hooks::now_ns();
    POOLSCOPE_CUDA_CHECK(cudaEventRecord(e, idle));
    cudaError_t q = cudaErrorNotReady;
    while ((q = cudaEventQuery(e)) == cudaErrorNotReady) {
    }
    POOLSCOPE_CUDA_CHECK(q);
    const auto window = static_cast<double>(poolscope::hooks::now_ns() - before);
    if (window < best.window_ns) {
      if (best.event != nullptr) {
        POOLSCOPE_CUDA_CHECK(cudaEventDestroy(best.event));
      }
      best = {e, static_cast<double>(before) + window / 2, window};
    } else {
      POOLSCOPE_CUDA_CHECK(cudaEventDestroy(e));
    }
  }
  return best;
}

struct drift {
  double ppm = 0;
  double rms_ns = 0;
  double max_ns = 0;
  double median_window_ns = 0;
};

drift measure(int ordinal, double seconds) {
  POOLSCOPE_CUDA_CHECK(cudaSetDevice(ordinal));
  cudaStream_t idle = nullptr;
  POOLSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking));
  std::vector<double> gpu{0};
  std::vector<double> host;
  std::vector<double> windows;
  reading last = anchor(idle);
  host.push_back(last.host_ns);
  windows.push_back(last.window_ns);
  const auto steps = static_cast<int>(seconds * 4);
  for (int k = 0; k < steps; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    const reading next = anchor(idle);
    float ms = 0;
    POOLSCOPE_CUDA_CHECK(cudaEventElapsedTime(&ms, last.event, next.event));
    POOLSCOPE_CUDA_CHECK(cudaEventDestroy(last.event));
    gpu.push_back(gpu.back() + static_cast<double>(ms) * 1e6);
    host.push_back(next.host_ns);
    windows.push_back(next.window_ns);
    last = next;
  }
  POOLSCOPE_CUDA_CHECK(cudaEventDestroy(last.event));
  POOLSCOPE_CUDA_CHECK(cudaStreamDestroy(idle));
  // host - host[0] = slope * gpu + intercept, by least squares.
  const auto n = static_cast<double>(gpu.size());
  double sg = 0, sh = 0, sgg = 0, sgh = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const double h = host[i] - host[0];
    sg += gpu[i];
    sh += h;
    sgg += gpu[i] * gpu[i];
    sgh += gpu[i] * h;
  }
  const double slope = (n * sgh - sg * sh) / (n * sgg - sg * sg);
  const double intercept = (sh - slope * sg) / n;
  drift d;
  d.ppm = (slope - 1) * 1e6;
  double sum2 = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const double r = host[i] - host[0] - (slope * gpu[i] + intercept);
    sum2 += r * r;
    d.max_ns = std::max(d.max_ns, std::abs(r));
  }
  d.rms_ns = std::sqrt(sum2 / n);
  std::nth_element(windows.begin(), windows.begin() + windows.size() / 2, windows.end());
  d.median_window_ns = windows[windows.size() / 2];
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      char* end = nullptr;
      seconds = std::strtod(argv[++i], &end);
      if (*end != '\0' || !(seconds >= 1 && seconds <= 3600)) {
        std::fprintf(stderr, "gpu_clock_drift: --seconds '%s' is not a number from 1 to 3600\n",
                     argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "gpu_clock_drift: unknown argument '%s' (usage: [--seconds S])\n",
                   a.c_str());
      return 2;
    }
  }
  int count = 0;
  if (const cudaError_t r = cudaGetDeviceCount(&count); r != cudaSuccess || count == 0) {
    std::printf("gpu_clock_drift: no GPU (%s)\n",
                r != cudaSuccess ? cudaGetErrorString(r) : "none found");
    return 0;
  }
  try {
    std::printf("%-6s %12s %16s %14s %14s %16s\n", "gpu", "rate ppm", "over 10 s (us)",
                "residual rms", "residual max", "anchor window");
    double worst = 0;
    for (int g = 0; g < count; ++g) {
      const drift d = measure(g, seconds);
      std::printf("%-6d %+12.2f %+16.1f %11.0f ns %11.0f ns %13.0f ns\n", g, d.ppm, d.ppm * 10,
                  d.rms_ns, d.max_ns, d.median_window_ns);
      worst = std::max(worst, std::abs(d.ppm));
    }
    std::printf(
        "summary: %d GPU(s) over %.0f s; largest rate against the host %.2f ppm (%.1f us "
        "over 10 s)\n",
        count, seconds, worst, worst * 10);
  } catch (const poolscope::cuda_error& e) {
    std::fprintf(stderr, "gpu_clock_drift: %s\n", e.what());
    return 1;
  }
  return 0;
}
