// kernels: the element-wise, reduction, copy and gemm kernels of the CUDA backend (kernels.cu),
// as host functions that enqueue them on a stream. Internal to poolscope::darray.
//
//   launch_target on{stream, sm_count};
//   launch_binary(on, dtype::f32, binary_op::add, dst, a, b, nullptr, nullptr);
//
// Views are the backend's strided views (rank <= 4, strides in elements, >= 0); all views of one
// call have the extents the backend checked (reduce: acc has src's extents without the axis).
// Values follow the arithmetic paragraph of backend.hpp exactly (integer div by 0 -> 0,
// double round-trips truncated and saturated, NaN -> 0, wrapping add/sub/mul/neg/abs).
// Paths: views are first collapsed jointly (unit dims dropped, dims merged where every view is
// contiguous across them); when every view is then contiguous the element-wise kernels write the
// output's first elements one by one up to a 16-byte boundary, then 16-byte vectors in
// grid-stride loops, reading each input whole, by 8-byte halves or by elements as its alignment
// allows; otherwise a grid-stride loop over the linear index decomposed into coordinates. Grids
// are sized from the device's SM count.
// All-axes reductions are deterministic: block partials in `scratch`, then one block combines
// them in a fixed order (the grid size depends only on the element count and the SM count).
//
// Preconditions: the stream's device is current, or launch_target::current makes it so before a
// call that needs it. Errors: a failed launch throws cuda_error.
// Thread safety: the functions are reentrant; scratch must not be shared by concurrent calls.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "cuda_seam.hpp"
#include "poolscope/darray/backend.hpp"

namespace poolscope::darray::detail {

/// Launches kernels as one-node CUDA graphs: a few executables per (stream, kernel, block
/// size), each remembering the grid and argument bytes it was last launched with. A launch with
/// the same grid and bytes as one of them launches it as it is; otherwise the combination gets a
/// new executable while it has fewer than `per_kernel`, or its least recently used one takes the
/// new grid and arguments (cudaGraphExecKernelNodeSetParams). An op
/// repeated on the same buffers (a pool hands a loop's step the same blocks), or alternating
/// between a few, so pays one graph launch per kernel, the cheapest way to enqueue one: cheaper
/// than with new arguments, far cheaper than cudaLaunchKernel, and about what a memset costs
/// (docs/perf.md, "Graph executables launched as they are"). A launch's key is each argument's
/// bytes in turn, the argument types free of padding. Instantiating an executable costs
/// tens of microseconds of host time, once. The GPU sees the same kernel with the same grid and
/// arguments, in stream order: an executable's launches are ordered behind its earlier ones,
/// which are on the same stream already, and setting parameters affects only later launches.
/// Holds at most `capacity` combinations per launcher (so a launch searches at most that many,
/// then its combination's few executables): a new one when the launcher is full takes the place
/// of the least recently used (CUDA frees an executable still running when it completes).
/// `instantiations` counts each executable made (backend_stats::kernel_graphs_made) and
/// `updates` each launch that set new parameters (backend_stats::kernel_graph_updates), when
/// given; they must outlive the launcher.
/// Ownership: owns its graphs. Thread safety: thread-safe (one mutex per launcher; a backend has
/// one launcher per device, whose work is enqueued by one thread at a time in practice).
/// Preconditions: the device of every stream passed is current, as for <<<...>>>, or `current`
/// (given to launch) makes it so: it is engaged before any call but the launch of a kept
/// executable as it is, which works from any device (cuda_seam.hpp).
class graph_launcher {
 public:
  /// Executables kept per (stream, kernel, block size).
  static constexpr std::size_t per_kernel = 4;

  explicit graph_launcher(std::size_t capacity = 64,
                          std::atomic<std::uint64_t>* instantiations = nullptr,
                          std::atomic<std::uint64_t>* updates = nullptr) noexcept
      : capacity_(capacity), instantiations_(instantiations), updates_(updates) {}
  graph_launcher(const graph_launcher&) = delete;
  graph_launcher& operator=(const graph_launcher&) = delete;
  ~graph_launcher();

  /// Enqueues `kernel(args...)` on `stream` over `grid` (args: pointers to each argument, as for
  /// cudaLaunchKernel; no dynamic shared memory). `bytes` (`size` of them) are the arguments'
  /// values the launch is keyed by: equal bytes must mean equal arguments (kernels.cu passes each
  /// argument's bytes in turn, its argument types having no padding; bytes that differ for equal
  /// arguments, such as stale padding, would only cost parameter updates). Throws cuda_error when
  /// a call fails. An executable that refuses new parameters is replaced by a new one.
  void launch(cudaStream_t stream, const void* kernel, dim3 grid, dim3 block, void** args,
              const void* bytes, std::size_t size, seam::device_guard* current = nullptr);

 private:
  // One executable, with the grid and argument bytes of its last launch.
  struct executable {
    cudaGraph_t graph = nullptr;  // kept: setting a node's parameters names the node of its graph
    cudaGraphNode_t node = nullptr;
    cudaGraphExec_t exec = nullptr;
    dim3 grid;
    std::vector<std::byte> bytes;
    std::uint64_t used = 0;
  };
  // A (stream, kernel, block size) combination and its executables (at most per_kernel).
  struct combination {
    cudaStream_t stream = nullptr;
    const void* kernel = nullptr;
    dim3 block;
    std::vector<executable> executables;
    std::uint64_t used = 0;
  };
  static void destroy(executable& x) noexcept;
  // Makes an executable of kernel(args) over grid, launches it on c's stream and keeps it in c,
  // in place of c.executables[slot] (slot == its size: one more).
  void instantiate(combination& c, std::size_t slot, const void* kernel, dim3 grid, void** args,
                   const void* bytes, std::size_t size);

  std::size_t capacity_;
  std::atomic<std::uint64_t>* instantiations_;
  std::atomic<std::uint64_t>* updates_;
  std::mutex mutex_;
  std::vector<combination> combinations_;  // guarded by mutex_; few, searched linearly
  std::uint64_t clock_ = 0;                // guarded by mutex_
};

/// Resident blocks per SM of a full wave of the element-wise kernels (2048 threads per SM on
/// Hopper at 256 threads per block).
constexpr int full_blocks_per_sm = 8;
/// Blocks per SM of element-wise kernels that yield memory bandwidth to a copy out of their
/// device (backend_options::yield_to_copies; the vector path of the map only).
constexpr int yielding_blocks_per_sm = 2;

/// Where kernels run: the stream and the SM count of its device, the launcher that enqueues
/// them (null: plain launches), how many blocks per SM the vector path of the element-wise map
/// may keep resident (its grid's cap; every other kernel takes a full wave), and the guard that
/// makes the stream's device current where a call needs it (null: it is current already).
struct launch_target {
  cudaStream_t stream = nullptr;
  int sm_count = 1;
  graph_launcher* graphs = nullptr;
  int blocks_per_sm = full_blocks_per_sm;
  seam::device_guard* current = nullptr;
};

/// Bytes of scratch launch_reduce needs for all-axes reductions (any dtype).
[[nodiscard]] std::size_t reduce_scratch_bytes(int sm_count) noexcept;

/// Drops unit dims and merges dims across which every one of `views` (equal extents) is
/// contiguous, in place; the result has rank >= 1. Returns the element count.
std::int64_t collapse_jointly(view* views, std::size_t count) noexcept;

/// dst[i] = value.
void launch_fill(const launch_target& on, dtype t, const view& dst, scalar value);
/// dst[i] = op(src[i]).
void launch_unary(const launch_target& on, dtype t, unary_op op, const view& dst, const view& src);
/// dst[i] = op(a[i], b[i]), with a scalar instead of a or b when a_scalar or b_scalar is set.
void launch_binary(const launch_target& on, dtype t, binary_op op, const view& dst, const view& a,
                   const view& b, const scalar* a_scalar, const scalar* b_scalar);
/// Most parts launch_binary_parts takes.
inline constexpr std::size_t max_binary_parts = 8;
/// launch_binary on each part as one kernel launch, if every part is contiguous (after
/// collapsing) and there are at most max_binary_parts of them; returns false, launching nothing,
/// otherwise.
[[nodiscard]] bool launch_binary_parts(const launch_target& on, dtype t, binary_op op,
                                       const std::vector<backend::binary_part>& parts);
/// acc[i] = op(acc[i], src[i]).
void launch_accumulate(const launch_target& on, dtype t, reduce_op op, const view& acc,
                       const view& src);
/// acc = op(acc, reduce(src along axis)); axis < 0 reduces all axes into the single element of
/// acc using `scratch` (reduce_scratch_bytes(on.sm_count) bytes of device memory of this device).
void launch_reduce(const launch_target& on, dtype t, reduce_op op, const view& acc, const view& src,
                   int axis, void* scratch);
/// dst[i] = src[i] for elements of `element_bytes` (4 or 8); either view may be peer memory.
void launch_copy(const launch_target& on, std::size_t element_bytes, const view& dst,
                 const view& src);
/// c += a @ b (2-D views; a: m x k, b: k x n, c: m x n), any strides. Integer products wrap.
void launch_gemm_accumulate(const launch_target& on, dtype t, const view& c, const view& a,
                            const view& b);

}  // namespace poolscope::darray::detail
