// The kernels of the CUDA backend and the host code that launches them, as templates: included by
// the kernels_<op>_<dtype>.cu translation units, each instantiating one group of entry points
// for one element type (kernels_typed.hpp), so that the kernels compile in parallel. Internal
// to kernels*.cu; the contract is kernels.hpp's, the arithmetic follows the "Arithmetic"
// paragraph of backend.hpp. Everything here has internal linkage but the typed entry points.
#pragma once

#include "kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>

#include "cuda_seam.hpp"
#include "integer_pow.hpp"
#include "kernels_typed.hpp"

namespace poolscope::darray::detail {
namespace {

using i64 = std::int64_t;

// Element arithmetic runs on the device and, for two scalar operands, once on the host.
#define POOLSCOPE_HD __host__ __device__ __forceinline__

/// Threads per block of every kernel (a power of two: the block reductions halve it).
constexpr int block_threads = 256;
/// Resident blocks per SM at block_threads (2048 threads per SM on Hopper).
constexpr int blocks_per_sm = full_blocks_per_sm;
/// Upper bound of the first pass of an all-axes reduction: its partials fit the scratch.
constexpr int reduce_max_blocks = 1024;
/// Vectors each thread keeps in flight per iteration of the vector path.
constexpr int vector_unroll = 2;
/// Edge of the gemm tile (a tile_edge x tile_edge block of threads).
constexpr int tile_edge = 16;

// ------------------------------------------------------------------------------------------
// Arithmetic of one element.

template <typename T>
inline constexpr bool is_integer_v = std::is_integral_v<T>;

template <typename T>
POOLSCOPE_HD T wrap_add(T a, T b) {
  if constexpr (is_integer_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <typename T>
POOLSCOPE_HD T wrap_sub(T a, T b) {
  if constexpr (is_integer_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}

template <typename T>
POOLSCOPE_HD T wrap_mul(T a, T b) {
  if constexpr (is_integer_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

template <typename T>
POOLSCOPE_HD T wrap_neg(T a) {
  if constexpr (is_integer_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(U{0} - static_cast<U>(a));
  } else {
    return -a;
  }
}

// NaN-propagating for floating types (as NumPy's maximum/minimum): a NaN operand wins.
template <typename T>
POOLSCOPE_HD T max_of(T a, T b) {
  if constexpr (!is_integer_v<T>) {
    if (a != a) {
      return a;
    }
    if (b != b) {
      return b;
    }
  }
  return a < b ? b : a;
}

template <typename T>
POOLSCOPE_HD T min_of(T a, T b) {
  if constexpr (!is_integer_v<T>) {
    if (a != a) {
      return a;
    }
    if (b != b) {
      return b;
    }
  }
  return b < a ? b : a;
}

// A double converted to an integer type: truncated toward zero, saturated, NaN -> 0.
template <typename T>
POOLSCOPE_HD T saturate(double d) {
  if (d != d) {
    return T{0};
  }
  // 2^(bits-1) is exact in double; everything at or above it saturates.
  constexpr double limit = static_cast<double>(std::numeric_limits<T>::max() / 2 + 1) * 2.0;
  if (d >= limit) {
    return std::numeric_limits<T>::max();
  }
  if (d < -limit) {
    return std::numeric_limits<T>::min();
  }
  return static_cast<T>(d);
}

template <typename T>
POOLSCOPE_HD T div_of(T a, T b) {
  if constexpr (is_integer_v<T>) {
    if (b == 0) {
      return T{0};
    }
    if (b == -1) {
      return wrap_neg(a);  // min / -1 overflows: wrap like neg
    }
    return a / b;
  } else {
    return a / b;
  }
}

template <typename T>
POOLSCOPE_HD T pow_of(T a, T b) {
  if constexpr (is_integer_v<T>) {
    return integer_pow(a, b);
  } else if constexpr (std::is_same_v<T, float>) {
    return ::powf(a, b);
  } else {
    return ::pow(a, b);
  }
}

template <unary_op Op>
struct unary_fn {
  template <typename T>
  POOLSCOPE_HD T operator()(T x) const {
    if constexpr (Op == unary_op::neg) {
      return wrap_neg(x);
    } else if constexpr (Op == unary_op::abs) {
      if constexpr (is_integer_v<T>) {
        return x < 0 ? wrap_neg(x) : x;
      } else if constexpr (std::is_same_v<T, float>) {
        return ::fabsf(x);
      } else {
        return ::fabs(x);
      }
    } else if constexpr (is_integer_v<T>) {
      return saturate<T>(unary_fn<Op>{}(static_cast<double>(x)));
    } else if constexpr (std::is_same_v<T, float>) {
      if constexpr (Op == unary_op::exp) {
        return ::expf(x);
      } else if constexpr (Op == unary_op::log) {
        return ::logf(x);
      } else if constexpr (Op == unary_op::sin) {
        return ::sinf(x);
      } else if constexpr (Op == unary_op::cos) {
        return ::cosf(x);
      } else {
        return ::sqrtf(x);
      }
    } else {
      if constexpr (Op == unary_op::exp) {
        return ::exp(x);
      } else if constexpr (Op == unary_op::log) {
        return ::log(x);
      } else if constexpr (Op == unary_op::sin) {
        return ::sin(x);
      } else if constexpr (Op == unary_op::cos) {
        return ::cos(x);
      } else {
        return ::sqrt(x);
      }
    }
  }
};

template <binary_op Op>
struct binary_fn {
  static constexpr binary_op op = Op;
  template <typename T>
  POOLSCOPE_HD T operator()(T a, T b) const {
    if constexpr (Op == binary_op::add) {
      return wrap_add(a, b);
    } else if constexpr (Op == binary_op::sub) {
      return wrap_sub(a, b);
    } else if constexpr (Op == binary_op::mul) {
      return wrap_mul(a, b);
    } else if constexpr (Op == binary_op::div) {
      return div_of(a, b);
    } else if constexpr (Op == binary_op::maximum) {
      return max_of(a, b);
    } else if constexpr (Op == binary_op::minimum) {
      return min_of(a, b);
    } else {
      return pow_of(a, b);
    }
  }
};

template <reduce_op Op>
struct reduce_fn {
  template <typename T>
  POOLSCOPE_HD T operator()(T a, T b) const {
    if constexpr (Op == reduce_op::sum) {
      return wrap_add(a, b);
    } else if constexpr (Op == reduce_op::prod) {
      return wrap_mul(a, b);
    } else if constexpr (Op == reduce_op::max) {
      return max_of(a, b);
    } else {
      return min_of(a, b);
    }
  }
  // The neutral element (infinities for floating max/min, so an all -inf input stays -inf).
  template <typename T>
  POOLSCOPE_HD static T identity() {
    if constexpr (Op == reduce_op::sum) {
      return T{0};
    } else if constexpr (Op == reduce_op::prod) {
      return T{1};
    } else if constexpr (Op == reduce_op::max) {
      if constexpr (is_integer_v<T>) {
        return std::numeric_limits<T>::lowest();
      } else {
        return -std::numeric_limits<T>::infinity();
      }
    } else {
      if constexpr (is_integer_v<T>) {
        return std::numeric_limits<T>::max();
      } else {
        return std::numeric_limits<T>::infinity();
      }
    }
  }
};

template <typename T>
struct constant_fn {
  T value;
  POOLSCOPE_HD T operator()() const { return value; }
};

struct identity_fn {
  template <typename T>
  POOLSCOPE_HD T operator()(T x) const {
    return x;
  }
};

// A binary op with a scalar on the left (s op x) or on the right (x op s). The op is stateless
// (binary_fn): only the scalar is stored, so the functor's bytes are the scalar's (no padding).
template <typename F, typename T>
struct scalar_left_fn {
  static_assert(std::is_empty_v<F>, "a stateless op");
  T s;
  POOLSCOPE_HD T operator()(T x) const { return F{}(s, x); }
};
template <typename F, typename T>
struct scalar_right_fn {
  static_assert(std::is_empty_v<F>, "a stateless op");
  T s;
  POOLSCOPE_HD T operator()(T x) const { return F{}(x, s); }
};

template <typename T>
T value_of(const scalar& s) noexcept {
  if constexpr (is_integer_v<T>) {
    return static_cast<T>(s.i);
  } else {
    return static_cast<T>(s.f);
  }
}

// ------------------------------------------------------------------------------------------
// Layouts: extents shared by N views and each view's strides.

template <int N>
struct layout {
  int rank = 1;
  int unused = 0;  // no padding: launches are keyed by their arguments' bytes (launch below)
  i64 extent[max_rank] = {};
  i64 stride[N][max_rank] = {};

  // The element offsets of linear (row-major) index i in each view. The coordinates are
  // computed in I: 32-bit division is several times cheaper than 64-bit, so callers pick
  // std::uint32_t whenever the element count fits.
  template <typename I = i64>
  __device__ __forceinline__ void offsets(i64 i, i64 (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      off[k] = 0;
    }
    I rest = static_cast<I>(i);
#pragma unroll
    for (int d = static_cast<int>(max_rank) - 1; d > 0; --d) {
      if (d < rank) {
        const auto e = static_cast<I>(extent[d]);
        const I c = rest % e;
        rest /= e;
#pragma unroll
        for (int k = 0; k < N; ++k) {
          off[k] += static_cast<i64>(c) * stride[k][d];
        }
      }
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
      off[k] += static_cast<i64>(rest) * stride[k][0];
    }
  }
};

template <int N>
layout<N> layout_of(const std::array<view, N>& v) noexcept {
  layout<N> l;
  l.rank = static_cast<int>(v[0].rank);
  for (std::size_t d = 0; d < v[0].rank; ++d) {
    l.extent[d] = v[0].extent[d];
    for (int k = 0; k < N; ++k) {
      l.stride[k][d] = v[k].stride[d];
    }
  }
  return l;
}

template <typename T>
T* element_ptr(const view& v) noexcept {
  return static_cast<T*>(v.base) + v.offset;
}

// Blocks for `items` units of work, one per thread, capped at a full wave of the device.
inline unsigned grid_for(i64 items, int sm_count) noexcept {
  const i64 wanted = (items + block_threads - 1) / block_threads;
  const i64 cap = static_cast<i64>(std::max(sm_count, 1)) * blocks_per_sm;
  return static_cast<unsigned>(std::clamp<i64>(wanted, 1, cap));
}

// grid_for for the vector path of the element-wise map, capped at on.blocks_per_sm resident
// blocks per SM. Only that path yields (launch_target::blocks_per_sm): its 16-byte accesses, two
// in flight per thread, keep HBM as busy at 2 blocks per SM as at 8, while the one-element-per-
// thread kernels (strided, parts) lose bandwidth (D2's swap + add ran 24 % slower with them
// yielding; docs/darray.md).
inline unsigned vector_grid_for(i64 items, const launch_target& on) noexcept {
  const i64 wanted = (items + block_threads - 1) / block_threads;
  const i64 cap =
      static_cast<i64>(std::max(on.sm_count, 1)) * std::clamp(on.blocks_per_sm, 1, blocks_per_sm);
  return static_cast<unsigned>(std::clamp<i64>(wanted, 1, cap));
}

// ------------------------------------------------------------------------------------------
// Element-wise map: p[0][i] = f(p[1][i], ..., p[N][i]) for N inputs (0, 1 or 2).

template <typename T, int N>
struct operands {
  T* p[N + 1];
};

template <typename T, int N, typename F>
POOLSCOPE_HD T apply(const F& f, const T (&x)[N > 0 ? N : 1]) {
  if constexpr (N == 0) {
    return f();
  } else if constexpr (N == 1) {
    return f(x[0]);
  } else {
    return f(x[0], x[1]);
  }
}

template <typename T>
struct alignas(16) vec16 {
  static constexpr int width = 16 / static_cast<int>(sizeof(T));
  T v[width];
};

template <typename T>
struct alignas(8) vec8 {
  static constexpr int width = 8 / static_cast<int>(sizeof(T));
  T v[width];
};

/// How an input of the vector path is read: each 16-byte vector at once, as two 8-byte halves, or
/// element by element, by the alignment its address has once the output is 16-byte aligned. The
/// choice is the same for every thread (no divergence).
enum class vector_read : unsigned char { whole, halves, elements };

template <int N>
struct vector_reads {
  vector_read r[N > 0 ? N : 1];
};

// Vector `i` of the line at `p` (16 * i bytes in), read as `how` allows.
template <typename T>
__device__ __forceinline__ vec16<T> load_vector(const T* p, i64 i, vector_read how) {
  using V = vec16<T>;
  const T* at = p + i * V::width;
  if (how == vector_read::whole) {
    return *reinterpret_cast<const V*>(at);
  }
  V r;
  if (how == vector_read::halves) {
    using H = vec8<T>;
    const H lo = reinterpret_cast<const H*>(at)[0];
    const H hi = reinterpret_cast<const H*>(at)[1];
#pragma unroll
    for (int w = 0; w < H::width; ++w) {
      r.v[w] = lo.v[w];
      r.v[H::width + w] = hi.v[w];
    }
    return r;
  }
#pragma unroll
  for (int w = 0; w < V::width; ++w) {
    r.v[w] = at[w];
  }
  return r;
}

// Element i of every line: p[0][i] = f(p[1][i], ...).
template <typename T, int N, typename F>
__device__ __forceinline__ void map_element(const operands<T, N>& ops, i64 i, const F& f) {
  T x[N > 0 ? N : 1];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    x[k] = ops.p[k + 1][i];
  }
  ops.p[0][i] = apply<T, N>(f, x);
}

// Contiguous lines: the first `head` elements one per thread, until the output is 16-byte
// aligned; then 16-byte vectors of the output (each input read as reads.r[k] says),
// `vector_unroll` in flight per thread; then the tail of fewer than a vector's elements.
template <typename T, int N, typename F>
__global__ void __launch_bounds__(block_threads)
    map_vector_kernel(operands<T, N> ops, i64 n, i64 head, vector_reads<N> reads, F f) {
  using V = vec16<T>;
  constexpr int W = V::width;
  constexpr int NI = N > 0 ? N : 1;
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  const i64 first = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first < head) {
    map_element(ops, first, f);
  }
  const i64 body = n - head;
  const i64 nvec = body / W;
  V* out = reinterpret_cast<V*>(ops.p[0] + head);
  const T* in_line[NI];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    in_line[k] = ops.p[k + 1] + head;
  }
  i64 i = first;
  for (; i + (vector_unroll - 1) * step < nvec; i += vector_unroll * step) {
    V in[NI][vector_unroll];
#pragma unroll
    for (int k = 0; k < N; ++k) {
#pragma unroll
      for (int u = 0; u < vector_unroll; ++u) {
        in[k][u] = load_vector(in_line[k], i + u * step, reads.r[k]);
      }
    }
#pragma unroll
    for (int u = 0; u < vector_unroll; ++u) {
      V r;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        T x[NI];
#pragma unroll
        for (int k = 0; k < N; ++k) {
          x[k] = in[k][u].v[w];
        }
        r.v[w] = apply<T, N>(f, x);
      }
      out[i + u * step] = r;
    }
  }
  for (; i < nvec; i += step) {
    V in[NI];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      in[k] = load_vector(in_line[k], i, reads.r[k]);
    }
    V r;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      T x[NI];
#pragma unroll
      for (int k = 0; k < N; ++k) {
        x[k] = in[k].v[w];
      }
      r.v[w] = apply<T, N>(f, x);
    }
    out[i] = r;
  }
  if (const i64 t = head + nvec * W + first; t < n) {
    map_element(ops, t, f);
  }
}

// Several contiguous parts in one launch (small ops, where a launch costs more than the work):
// blockIdx.y picks the part, a grid-stride loop over its elements.
template <typename T>
struct part_table {
  T* p[max_binary_parts][3];  // dst, a, b
  i64 n[max_binary_parts];
};

template <typename T, typename F>
__global__ void __launch_bounds__(block_threads) map_parts_kernel(part_table<T> t, F f) {
  const unsigned part = blockIdx.y;
  const i64 n = t.n[part];
  T* dst = t.p[part][0];
  const T* a = t.p[part][1];
  const T* b = t.p[part][2];
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    dst[i] = f(a[i], b[i]);
  }
}

// Any strides: the linear index decomposed into coordinates.
template <typename T, int N, typename F, typename I>
__global__ void __launch_bounds__(block_threads)
    map_strided_kernel(operands<T, N> ops, layout<N + 1> l, i64 n, F f) {
  constexpr int NI = N > 0 ? N : 1;
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    i64 off[N + 1];
    l.template offsets<I>(i, off);
    T x[NI];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      x[k] = ops.p[k + 1][off[k + 1]];
    }
    ops.p[0][off[0]] = apply<T, N>(f, x);
  }
}

// Appends the bytes of `v` to key[used...] (an empty type, a stateless functor, adds none).
template <typename T>
void append_key(std::byte* key, std::size_t& used, const T& v) noexcept {
  if constexpr (!std::is_empty_v<T>) {
    std::memcpy(key + used, &v, sizeof v);
    used += sizeof v;
  }
}

// Enqueues kernel(args...) on on.stream, through on.graphs when the backend has one (kernels.hpp)
// and with cudaLaunchKernel otherwise; throws cuda_error if the launch fails. The graph launcher
// keys a launch by its arguments' bytes, each argument's in turn: the padding between them (and
// an empty functor's byte) is left out, as whatever the stack held there would make equal
// arguments look different (zeroing the tuple's storage first does not help: the compiler may drop
// stores made before an object is constructed over them). The argument types have no padding of
// their own (checked below for those that could).
template <typename... P, typename... A>
void launch(const launch_target& on, void (*kernel)(P...), dim3 grid, dim3 block, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "one argument per kernel parameter");
  static_assert((std::is_trivially_copyable_v<std::decay_t<P>> && ...),
                "kernel arguments are plain bytes");
  std::tuple<std::decay_t<P>...> values{std::forward<A>(args)...};
  std::apply(
      [&](auto&... v) {
        void* pointers[] = {static_cast<void*>(&v)...};
        if (on.graphs != nullptr) {
          std::byte key[(sizeof v + ... + 0)];
          std::size_t used = 0;
          (append_key(key, used, v), ...);
          on.graphs->launch(on.stream, reinterpret_cast<const void*>(kernel), grid, block, pointers,
                            key, used, on.current);
        } else {
          if (on.current != nullptr) {
            on.current->engage();
          }
          POOLSCOPE_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block,
                                                pointers, 0, on.stream));
        }
      },
      values);
}

template <typename T, int N, typename F>
void run_map(const launch_target& on, std::array<view, N + 1> v, const F& f) {
  const i64 n = collapse_jointly(v.data(), v.size());
  if (n == 0) {
    return;
  }
  operands<T, N> ops{};
  bool contiguous = v[0].rank == 1;
  for (int k = 0; k <= N; ++k) {
    ops.p[k] = element_ptr<T>(v[k]);
    contiguous = contiguous && v[k].stride[0] == 1 &&
                 reinterpret_cast<std::uintptr_t>(ops.p[k]) % sizeof(T) == 0;
  }
  if (contiguous) {
    // Elements before the output's first 16-byte boundary go one per thread; from there each
    // input is read by the widest access its alignment allows (misaligned operands are common:
    // a chunk's parts start wherever another map's boundary fell).
    constexpr auto W = static_cast<std::uintptr_t>(vec16<T>::width);
    const auto out_at = reinterpret_cast<std::uintptr_t>(ops.p[0]);
    const i64 head = std::min<i64>(n, static_cast<i64>((16 - out_at % 16) % 16 / sizeof(T)));
    vector_reads<N> reads{};
    for (int k = 0; k < N; ++k) {
      const auto at = reinterpret_cast<std::uintptr_t>(ops.p[k + 1] + head);
      reads.r[k] = at % 16 == 0  ? vector_read::whole
                   : at % 8 == 0 ? vector_read::halves
                                 : vector_read::elements;
    }
    const i64 vectors = (n - head) / static_cast<i64>(W);
    const unsigned blocks =
        vector_grid_for(std::max<i64>({vectors / vector_unroll, head, static_cast<i64>(W)}), on);
    launch(on, &map_vector_kernel<T, N, F>, blocks, block_threads, ops, n, head, reads, f);
  } else {
    const unsigned blocks = grid_for(n, on.sm_count);
    const layout<N + 1> l = layout_of<N + 1>(v);
    if (n <= std::numeric_limits<std::uint32_t>::max()) {
      launch(on, &map_strided_kernel<T, N, F, std::uint32_t>, blocks, block_threads, ops, l, n, f);
    } else {
      launch(on, &map_strided_kernel<T, N, F, i64>, blocks, block_threads, ops, l, n, f);
    }
  }
}

// Calls f(T{}) with T the element type of `t`.
template <typename F>
void with_type(dtype t, F&& f) {
  switch (t) {
    case dtype::f32:
      f(float{});
      break;
    case dtype::f64:
      f(double{});
      break;
    case dtype::i32:
      f(std::int32_t{});
      break;
    case dtype::i64:
      f(std::int64_t{});
      break;
  }
}

// Calls f(binary_fn<op>{}).
template <typename F>
void with_binary(binary_op op, F&& f) {
  switch (op) {
    case binary_op::add:
      f(binary_fn<binary_op::add>{});
      break;
    case binary_op::sub:
      f(binary_fn<binary_op::sub>{});
      break;
    case binary_op::mul:
      f(binary_fn<binary_op::mul>{});
      break;
    case binary_op::div:
      f(binary_fn<binary_op::div>{});
      break;
    case binary_op::maximum:
      f(binary_fn<binary_op::maximum>{});
      break;
    case binary_op::minimum:
      f(binary_fn<binary_op::minimum>{});
      break;
    case binary_op::pow:
      f(binary_fn<binary_op::pow>{});
      break;
  }
}

template <typename F>
void with_unary(unary_op op, F&& f) {
  switch (op) {
    case unary_op::neg:
      f(unary_fn<unary_op::neg>{});
      break;
    case unary_op::abs:
      f(unary_fn<unary_op::abs>{});
      break;
    case unary_op::exp:
      f(unary_fn<unary_op::exp>{});
      break;
    case unary_op::log:
      f(unary_fn<unary_op::log>{});
      break;
    case unary_op::sin:
      f(unary_fn<unary_op::sin>{});
      break;
    case unary_op::cos:
      f(unary_fn<unary_op::cos>{});
      break;
    case unary_op::sqrt:
      f(unary_fn<unary_op::sqrt>{});
      break;
  }
}

template <typename F>
void with_reduce(reduce_op op, F&& f) {
  switch (op) {
    case reduce_op::sum:
      f(reduce_fn<reduce_op::sum>{});
      break;
    case reduce_op::prod:
      f(reduce_fn<reduce_op::prod>{});
      break;
    case reduce_op::max:
      f(reduce_fn<reduce_op::max>{});
      break;
    case reduce_op::min:
      f(reduce_fn<reduce_op::min>{});
      break;
  }
}

// ------------------------------------------------------------------------------------------
// Reductions.

// Combines the block's values in a fixed tree order; every thread gets the result. The caller
// synchronizes before `shared` is written again.
template <typename T, typename R>
__device__ __forceinline__ T block_reduce(T v, const R& r, T* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      shared[threadIdx.x] = r(shared[threadIdx.x], shared[threadIdx.x + s]);
    }
    __syncthreads();
  }
  return shared[0];
}

// First pass of an all-axes reduction: one partial per block.
template <typename T, typename R, bool Contiguous, typename I>
__global__ void __launch_bounds__(block_threads)
    reduce_partials_kernel(const T* src, layout<1> l, i64 n, T* partials, R r) {
  __shared__ T shared[block_threads];
  T v = R::template identity<T>();
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    if constexpr (Contiguous) {
      v = r(v, src[i]);
    } else {
      i64 off[1];
      l.template offsets<I>(i, off);
      v = r(v, src[off[0]]);
    }
  }
  const T total = block_reduce(v, r, shared);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = total;
  }
}

// Second pass: one block combines `count` partials and folds them into *acc.
template <typename T, typename R>
__global__ void __launch_bounds__(block_threads)
    reduce_final_kernel(const T* partials, int count, T* acc, R r) {
  __shared__ T shared[block_threads];
  T v = R::template identity<T>();
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) {
    v = r(v, partials[i]);
  }
  const T total = block_reduce(v, r, shared);
  if (threadIdx.x == 0) {
    *acc = r(*acc, total);
  }
}

// Along one axis, a thread per output element (many outputs or a short axis).
template <typename T, typename R>
__global__ void __launch_bounds__(block_threads)
    reduce_axis_threads_kernel(T* acc, const T* src, layout<2> l, i64 outputs, i64 length,
                               i64 axis_stride, R r) {
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 o = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs; o += step) {
    i64 off[2];
    l.offsets(o, off);
    T v = R::template identity<T>();
    const T* p = src + off[1];
    for (i64 j = 0; j < length; ++j) {
      v = r(v, p[j * axis_stride]);
    }
    acc[off[0]] = r(acc[off[0]], v);
  }
}

// Along one axis, a block per output element (few outputs, a long axis).
template <typename T, typename R>
__global__ void __launch_bounds__(block_threads)
    reduce_axis_blocks_kernel(T* acc, const T* src, layout<2> l, i64 outputs, i64 length,
                              i64 axis_stride, R r) {
  __shared__ T shared[block_threads];
  for (i64 o = blockIdx.x; o < outputs; o += gridDim.x) {
    i64 off[2];
    l.offsets(o, off);
    T v = R::template identity<T>();
    const T* p = src + off[1];
    for (i64 j = threadIdx.x; j < length; j += blockDim.x) {
      v = r(v, p[j * axis_stride]);
    }
    const T total = block_reduce(v, r, shared);
    if (threadIdx.x == 0) {
      acc[off[0]] = r(acc[off[0]], total);
    }
    __syncthreads();
  }
}

template <typename T, typename R>
void run_reduce_all(const launch_target& on, const view& acc, view src, const R& r, void* scratch) {
  const i64 n = collapse_jointly(&src, 1);
  if (n == 0) {
    return;
  }
  const i64 cap = std::min<i64>(static_cast<i64>(std::max(on.sm_count, 1)) * blocks_per_sm / 2,
                                reduce_max_blocks);
  const auto blocks =
      static_cast<unsigned>(std::clamp<i64>((n + block_threads - 1) / block_threads, 1, cap));
  T* partials = static_cast<T*>(scratch);
  const layout<1> l = layout_of<1>(std::array<view, 1>{src});
  const T* first = element_ptr<T>(src);
  if (src.rank == 1 && src.stride[0] == 1) {
    launch(on, &reduce_partials_kernel<T, R, true, i64>, blocks, block_threads, first, l, n,
           partials, r);
  } else if (n <= std::numeric_limits<std::uint32_t>::max()) {
    launch(on, &reduce_partials_kernel<T, R, false, std::uint32_t>, blocks, block_threads, first, l,
           n, partials, r);
  } else {
    launch(on, &reduce_partials_kernel<T, R, false, i64>, blocks, block_threads, first, l, n,
           partials, r);
  }
  launch(on, &reduce_final_kernel<T, R>, 1, block_threads, partials, static_cast<int>(blocks),
         element_ptr<T>(acc), r);
}

template <typename T, typename R>
void run_reduce(const launch_target& on, const view& acc, const view& src, int axis, const R& r,
                void* scratch) {
  if (axis < 0) {
    run_reduce_all<T>(on, acc, src, r, scratch);
    return;
  }
  const auto a = static_cast<std::size_t>(axis);
  const i64 length = src.extent[a];
  const i64 axis_stride = src.stride[a];
  // src without the axis: the same extents as acc.
  view rest = src;
  rest.rank = src.rank - 1;
  for (std::size_t d = a; d + 1 < src.rank; ++d) {
    rest.extent[d] = src.extent[d + 1];
    rest.stride[d] = src.stride[d + 1];
  }
  rest.extent[rest.rank] = 0;
  rest.stride[rest.rank] = 0;
  std::array<view, 2> v{acc, rest};
  const i64 outputs = collapse_jointly(v.data(), v.size());
  if (outputs == 0 || length == 0) {
    return;
  }
  if (outputs == 1) {
    // One output: the all-axes reduction of the axis, spread over the whole device.
    view line = src;
    line.offset = v[1].offset;
    line.rank = 1;
    line.extent = {length, 0, 0, 0};
    line.stride = {axis_stride, 0, 0, 0};
    run_reduce_all<T>(on, v[0], line, r, scratch);
    return;
  }
  const layout<2> l = layout_of<2>(v);
  T* acc_ptr = element_ptr<T>(v[0]);
  const T* src_ptr = element_ptr<T>(v[1]);
  const i64 wave = static_cast<i64>(std::max(on.sm_count, 1)) * blocks_per_sm * block_threads;
  if (length < 64 || outputs >= wave / 4) {
    launch(on, &reduce_axis_threads_kernel<T, R>, grid_for(outputs, on.sm_count), block_threads,
           acc_ptr, src_ptr, l, outputs, length, axis_stride, r);
  } else {
    const auto blocks = static_cast<unsigned>(
        std::min<i64>(outputs, static_cast<i64>(std::max(on.sm_count, 1)) * blocks_per_sm));
    launch(on, &reduce_axis_blocks_kernel<T, R>, blocks, block_threads, acc_ptr, src_ptr, l,
           outputs, length, axis_stride, r);
  }
}

// ------------------------------------------------------------------------------------------
// gemm: c += a @ b with shared-memory tiles; grid-stride over tiles.

template <typename T>
struct matrix {
  T* p;
  i64 row_stride;
  i64 col_stride;
  POOLSCOPE_HD T& at(i64 i, i64 j) const { return p[i * row_stride + j * col_stride]; }
};

template <typename T>
__global__ void __launch_bounds__(tile_edge* tile_edge)
    gemm_kernel(matrix<T> c, matrix<T> a, matrix<T> b, i64 m, i64 n, i64 k) {
  __shared__ T ta[tile_edge][tile_edge];
  __shared__ T tb[tile_edge][tile_edge + 1];
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  for (i64 bi = blockIdx.y; bi * tile_edge < m; bi += gridDim.y) {
    for (i64 bj = blockIdx.x; bj * tile_edge < n; bj += gridDim.x) {
      const i64 row = bi * tile_edge + ty;
      const i64 col = bj * tile_edge + tx;
      T sum{0};
      for (i64 kk = 0; kk < k; kk += tile_edge) {
        ta[ty][tx] = (row < m && kk + tx < k) ? a.at(row, kk + tx) : T{0};
        tb[ty][tx] = (kk + ty < k && col < n) ? b.at(kk + ty, col) : T{0};
        __syncthreads();
#pragma unroll
        for (int q = 0; q < tile_edge; ++q) {
          sum = wrap_add(sum, wrap_mul(ta[ty][q], tb[q][tx]));
        }
        __syncthreads();
      }
      if (row < m && col < n) {
        c.at(row, col) = wrap_add(c.at(row, col), sum);
      }
    }
  }
}

template <typename T>
matrix<T> matrix_of(const view& v) noexcept {
  return matrix<T>{element_ptr<T>(v), v.stride[0], v.stride[1]};
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Entry points for one element type (kernels_typed.hpp), instantiated by kernels_<op>_<dtype>.cu.

// Whether `s op x` equals `x op s` for every value: a scalar on the left of such an op takes the
// right-hand kernels, which halves the scalar forms compiled for it. (maximum and minimum are
// not here: on equal operands they return the first, and +0 and -0 are equal.)
template <binary_op Op>
inline constexpr bool commutes = Op == binary_op::add || Op == binary_op::mul;

template <typename T>
void binary_kernels<T>::binary(const launch_target& on, binary_op op, const view& dst,
                               const view& a, const view& b, const scalar* a_scalar,
                               const scalar* b_scalar) {
  with_binary(op, [&](auto f) {
    using F = decltype(f);
    if (a_scalar != nullptr && b_scalar != nullptr) {
      run_map<T, 0>(on, std::array<view, 1>{dst},
                    constant_fn<T>{f(value_of<T>(*a_scalar), value_of<T>(*b_scalar))});
    } else if (a_scalar != nullptr) {
      if constexpr (commutes<F::op>) {
        run_map<T, 1>(on, std::array<view, 2>{dst, b},
                      scalar_right_fn<F, T>{value_of<T>(*a_scalar)});
      } else {
        run_map<T, 1>(on, std::array<view, 2>{dst, b},
                      scalar_left_fn<F, T>{value_of<T>(*a_scalar)});
      }
    } else if (b_scalar != nullptr) {
      run_map<T, 1>(on, std::array<view, 2>{dst, a}, scalar_right_fn<F, T>{value_of<T>(*b_scalar)});
    } else {
      run_map<T, 2>(on, std::array<view, 3>{dst, a, b}, f);
    }
  });
}

template <typename T>
void binary_kernels<T>::parts(const launch_target& on, binary_op op,
                              const binary_part_lines& lines) {
  part_table<T> table{};
  for (std::size_t i = 0; i < lines.parts; ++i) {
    for (std::size_t k = 0; k < 3; ++k) {
      table.p[i][k] = element_ptr<T>(lines.lines[i][k]);
    }
    table.n[i] = lines.counts[i];
  }
  with_binary(op, [&](auto f) {
    const dim3 grid(grid_for(lines.most, on.sm_count), static_cast<unsigned>(lines.parts));
    launch(on, &map_parts_kernel<T, decltype(f)>, grid, block_threads, table, f);
  });
}

template <typename T>
void typed_kernels<T>::fill(const launch_target& on, const view& dst, scalar value) {
  run_map<T, 0>(on, std::array<view, 1>{dst}, constant_fn<T>{value_of<T>(value)});
}

template <typename T>
void typed_kernels<T>::unary(const launch_target& on, unary_op op, const view& dst,
                             const view& src) {
  with_unary(op, [&](auto f) { run_map<T, 1>(on, std::array<view, 2>{dst, src}, f); });
}

template <typename T>
void typed_kernels<T>::accumulate(const launch_target& on, reduce_op op, const view& acc,
                                  const view& src) {
  with_reduce(op, [&](auto f) { run_map<T, 2>(on, std::array<view, 3>{acc, acc, src}, f); });
}

template <typename T>
void typed_kernels<T>::reduce(const launch_target& on, reduce_op op, const view& acc,
                              const view& src, int axis, void* scratch) {
  with_reduce(op, [&](auto f) { run_reduce<T>(on, acc, src, axis, f, scratch); });
}

template <typename T>
void typed_kernels<T>::gemm_accumulate(const launch_target& on, const view& c, const view& a,
                                       const view& b) {
  const i64 m = c.extent[0];
  const i64 n = c.extent[1];
  const i64 k = a.extent[1];
  if (m == 0 || n == 0 || k == 0) {
    return;
  }
  const dim3 block(tile_edge, tile_edge);
  const dim3 grid(static_cast<unsigned>(std::min<i64>((n + tile_edge - 1) / tile_edge, 65535)),
                  static_cast<unsigned>(std::min<i64>((m + tile_edge - 1) / tile_edge, 65535)));
  launch(on, &gemm_kernel<T>, grid, block, matrix_of<T>(c), matrix_of<T>(a), matrix_of<T>(b), m, n,
         k);
}

}  // namespace poolscope::darray::detail
