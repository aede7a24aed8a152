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
  for (combination& c : combinations_) {
    for (executable& x : c.executables) {
      destroy(x);
    }
  }
}

void graph_launcher::destroy(executable& x) noexcept {
  if (x.exec != nullptr) {
    seam::log_failure("destroy a launch graph",
                      [&] { POOLSCOPE_CUDA_CHECK(cudaGraphExecDestroy(x.exec)); });
  }
  if (x.graph != nullptr) {
    seam::log_failure("destroy a launch graph",
                      [&] { POOLSCOPE_CUDA_CHECK(cudaGraphDestroy(x.graph)); });
  }
  x = executable{};
}

void graph_launcher::launch(cudaStream_t stream, const void* kernel, dim3 grid, dim3 block,
                            void** args, const void* bytes, std::size_t size,
                            seam::device_guard* current) {
  const auto* key = static_cast<const std::byte*>(bytes);
  const std::lock_guard lock(mutex_);
  auto c = std::find_if(combinations_.begin(), combinations_.end(), [&](const combination& k) {
    return k.stream == stream && k.kernel == kernel && same(k.block, block);
  });
  if (c == combinations_.end()) {
    if (current != nullptr) {
      current->engage();  // (a new executable follows)
    }
    if (combinations_.size() >= capacity_ && !combinations_.empty()) {
      // The least recently used combination makes room, its executables with it.
      c = std::min_element(
          combinations_.begin(), combinations_.end(),
          [](const combination& a, const combination& b) { return a.used < b.used; });
      for (executable& x : c->executables) {
        destroy(x);
      }
      c->executables.clear();
    } else {
      c = combinations_.emplace(combinations_.end());
    }
    c->stream = stream;
    c->kernel = kernel;
    c->block = block;
  }
  c->used = ++clock_;
  // One of its executables launched last with these very arguments is launched as it is; else a
  // new one while it has fewer than per_kernel, or the least recently used takes them.
  executable* lru = nullptr;
  for (executable& x : c->executables) {
    if (same(x.grid, grid) && x.bytes.size() == size &&
        (size == 0 || std::memcmp(x.bytes.data(), key, size) == 0)) {
      x.used = c->used;
      // (From any device: the executable and the stream are of the stream's device.)
      POOLSCOPE_CUDA_CHECK(cudaGraphLaunch(x.exec, stream));
      return;
    }
    if (lru == nullptr || x.used < lru->used) {
      lru = &x;
    }
  }
  // New parameters or a new executable: with the stream's device current.
  if (current != nullptr) {
    current->engage();
  }
  if (c->executables.size() < per_kernel) {
    instantiate(*c, c->executables.size(), kernel, grid, args, bytes, size);
    return;
  }
  const cudaKernelNodeParams params = node_params(kernel, grid, block, args);
  if (cudaGraphExecKernelNodeSetParams(lru->exec, lru->node, &params) == cudaSuccess) {
    if (updates_ != nullptr) {
      updates_->fetch_add(1, std::memory_order_relaxed);
    }
    lru->used = c->used;
    lru->grid = grid;
    lru->bytes.assign(key, key + size);
    POOLSCOPE_CUDA_CHECK(cudaGraphLaunch(lru->exec, stream));
    return;
  }
  // The executable would not take the parameters: a new one takes its place (whose own failure,
  // if any, is reported).
  (void)cudaGetLastError();
  instantiate(*c, static_cast<std::size_t>(lru - c->executables.data()), kernel, grid, args, bytes,
              size);
}

void graph_launcher::instantiate(combination& c, std::size_t slot, const void* kernel, dim3 grid,
                                 void** args, const void* bytes, std::size_t size) {
  if (slot < c.executables.size()) {
    // The executable it replaces goes first (and with it, if what follows fails, its place).
    destroy(c.executables[slot]);
    c.executables.erase(c.executables.begin() + static_cast<std::ptrdiff_t>(slot));
  }
  const cudaKernelNodeParams params = node_params(kernel, grid, c.block, args);
  executable x;
  x.grid = grid;
  const auto* key = static_cast<const std::byte*>(bytes);
  x.bytes.assign(key, key + size);
  x.used = c.used;
  // Whatever fails below leaves nothing behind: `x` is destroyed unless it was stored.
  struct guard {
    executable& x;
    bool keep = false;
    ~guard() {
      if (!keep) {
        destroy(x);
      }
    }
  } g{x};
  POOLSCOPE_CUDA_CHECK(cudaGraphCreate(&x.graph, 0));
  POOLSCOPE_CUDA_CHECK(cudaGraphAddKernelNode(&x.node, x.graph, nullptr, 0, &params));
  POOLSCOPE_CUDA_CHECK(cudaGraphInstantiate(&x.exec, x.graph, 0));
  if (instantiations_ != nullptr) {
    instantiations_->fetch_add(1, std::memory_order_relaxed);
  }
  c.executables.reserve(per_kernel);
  POOLSCOPE_CUDA_CHECK(cudaGraphLaunch(x.exec, c.stream));
  c.executables.push_back(std::move(x));
  g.keep = true;
}

}  // namespace poolscope::darray::detail
