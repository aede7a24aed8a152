// graph_launcher (kernels.hpp): kernels launched as one-node CUDA graphs.
#include <algorithm>

#include "cuda_seam.hpp"
#include "kernels.hpp"

namespace poolscope::darray::detail {

namespace {

bool same(const dim3& a, const dim3& b) noexcept {
  return a.x == b.x && a.y == b.y && a.z == b.z;
}

}  // namespace

graph_launcher::~graph_launcher() {
  for (entry& e : entries_) {
    destroy(e);
  }
}

void graph_launcher::destroy(entry& e) noexcept {
  if (e.exec != nullptr) {
    seam::log_failure("destroy a launch graph",
                      [&] { POOLSCOPE_DARRAY_CHECK(cudaGraphExecDestroy(e.exec)); });
  }
  if (e.graph != nullptr) {
    seam::log_failure("destroy a launch graph",
                      [&] { POOLSCOPE_DARRAY_CHECK(cudaGraphDestroy(e.graph)); });
  }
  e = entry{};
}

void graph_launcher::launch(cudaStream_t stream, const void* kernel, dim3 grid, dim3 block,
                            void** args) {
  cudaKernelNodeParams params{};
  params.func = const_cast<void*>(kernel);
  params.gridDim = grid;
  params.blockDim = block;
  params.sharedMemBytes = 0;
  params.kernelParams = args;
  const std::lock_guard lock(mutex_);
  const auto it = std::find_if(entries_.begin(), entries_.end(), [&](const entry& e) {
    return e.stream == stream && e.kernel == kernel && same(e.block, block);
  });
  if (it != entries_.end()) {
    it->used = ++clock_;
    if (cudaGraphExecKernelNodeSetParams(it->exec, it->node, &params) == cudaSuccess) {
      POOLSCOPE_DARRAY_CHECK(cudaGraphLaunch(it->exec, stream));
      return;
    }
    // The executable would not take the parameters: drop it and make a new one below (whose
    // own failure, if any, is reported).
    (void)cudaGetLastError();
    destroy(*it);
    *it = std::move(entries_.back());
    entries_.pop_back();
  }
  if (entries_.size() >= capacity_ && !entries_.empty()) {
    const auto lru =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const entry& a, const entry& b) { return a.used < b.used; });
    destroy(*lru);
    *lru = std::move(entries_.back());
    entries_.pop_back();
  }
  entry e;
  e.stream = stream;
  e.kernel = kernel;
  e.block = block;
  e.used = ++clock_;
  // Whatever fails below leaves nothing behind: `e` is destroyed unless it was stored.
  struct guard {
    entry& e;
    bool keep = false;
    ~guard() {
      if (!keep) {
        destroy(e);
      }
    }
  } g{e};
  POOLSCOPE_DARRAY_CHECK(cudaGraphCreate(&e.graph, 0));
  POOLSCOPE_DARRAY_CHECK(cudaGraphAddKernelNode(&e.node, e.graph, nullptr, 0, &params));
  POOLSCOPE_DARRAY_CHECK(cudaGraphInstantiate(&e.exec, e.graph, 0));
  if (instantiations_ != nullptr) {
    instantiations_->fetch_add(1, std::memory_order_relaxed);
  }
  entries_.reserve(entries_.size() + 1);
  POOLSCOPE_DARRAY_CHECK(cudaGraphLaunch(e.exec, stream));
  entries_.push_back(e);
  g.keep = true;
}

}  // namespace poolscope::darray::detail
