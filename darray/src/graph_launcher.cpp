// graph_launcher (kernels.hpp): kernels launched as one-node CUDA graphs.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "cuda_seam.hpp"
#include "kernels.hpp"

namespace poolscope::darray::detail {

namespace {

bool same(const dim3& a, const dim3& b) noexcept {
  return a.x == b.x && a.y == b.y && a.z == b.z;
}

cudaKernelNodeParams node_params(const void* kernel, dim3 grid, dim3 block, void** args) noexcept {
  cudaKernelNodeParams params{};
  params.func = const_cast<void*>(kernel);
  params.gridDim = grid;
  params.blockDim = block;
  params.sharedMemBytes = 0;
  params.kernelParams = args;
  return params;
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
                            void** args, const void* bytes, std::size_t size) {
  const auto* key = static_cast<const std::byte*>(bytes);
  const std::lock_guard lock(mutex_);
  // This combination's executables: one launched last with these very arguments is launched as
  // it is; else the least recently used takes them, unless a new one is due.
  entry* lru = nullptr;
  std::size_t mine = 0;
  for (entry& e : entries_) {
    if (e.stream != stream || e.kernel != kernel || !same(e.block, block)) {
      continue;
    }
    if (same(e.grid, grid) && e.bytes.size() == size &&
        (size == 0 || std::memcmp(e.bytes.data(), key, size) == 0)) {
      e.used = ++clock_;
      POOLSCOPE_DARRAY_CHECK(cudaGraphLaunch(e.exec, stream));
      return;
    }
    ++mine;
    if (lru == nullptr || e.used < lru->used) {
      lru = &e;
    }
  }
  if (lru != nullptr && (mine >= per_kernel || entries_.size() >= capacity_)) {
    const cudaKernelNodeParams params = node_params(kernel, grid, block, args);
    if (cudaGraphExecKernelNodeSetParams(lru->exec, lru->node, &params) == cudaSuccess) {
      if (updates_ != nullptr) {
        updates_->fetch_add(1, std::memory_order_relaxed);
      }
      lru->used = ++clock_;
      lru->grid = grid;
      lru->bytes.assign(key, key + size);
      POOLSCOPE_DARRAY_CHECK(cudaGraphLaunch(lru->exec, stream));
      return;
    }
    // The executable would not take the parameters: a new one takes its place (whose own
    // failure, if any, is reported).
    (void)cudaGetLastError();
    instantiate(static_cast<std::size_t>(lru - entries_.data()), stream, kernel, grid, block, args,
                bytes, size);
    return;
  }
  std::size_t slot = entries_.size();
  if (entries_.size() >= capacity_ && !entries_.empty()) {
    slot = static_cast<std::size_t>(
        std::min_element(entries_.begin(), entries_.end(),
                         [](const entry& a, const entry& b) { return a.used < b.used; }) -
        entries_.begin());
  }
  instantiate(slot, stream, kernel, grid, block, args, bytes, size);
}

void graph_launcher::instantiate(std::size_t slot, cudaStream_t stream, const void* kernel,
                                 dim3 grid, dim3 block, void** args, const void* bytes,
                                 std::size_t size) {
  if (slot < entries_.size()) {
    // The entry it replaces goes first (and with it, if what follows fails, its place).
    destroy(entries_[slot]);
    entries_[slot] = std::move(entries_.back());
    entries_.pop_back();
  }
  const cudaKernelNodeParams params = node_params(kernel, grid, block, args);
  entry e;
  e.stream = stream;
  e.kernel = kernel;
  e.block = block;
  e.grid = grid;
  const auto* key = static_cast<const std::byte*>(bytes);
  e.bytes.assign(key, key + size);
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
  entries_.push_back(std::move(e));
  g.keep = true;
}

}  // namespace poolscope::darray::detail
