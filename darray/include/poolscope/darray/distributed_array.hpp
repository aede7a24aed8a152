// DistributedArray: an N-D array spread over the devices of one backend, whose reshard moves only
// what must move while compute on data already in place runs.
//
//   using namespace poolscope::darray;
//   auto be = make_backend("auto");                         // every GPU, or host:2 without one
//   const std::int64_t n = 1 << 20;
//   std::vector<float> a_host(n, 1.0f), c_host(n, 2.0f);
//   auto a = distributed_array<float>::from_host(be, a_host, {n},
//                                                index_map::split({n}, 0, {{0, 0, n / 2},
//                                                                          {1, n / 2, n}}));
//   auto c = distributed_array<float>::from_host(be, c_host, {n},
//                                                index_map::split({n}, 0, {{0, 0, 7 * n / 10},
//                                                                          {1, 7 * n / 10, n}}));
//   auto d = a + c.reshard(a.index_map());                  // the transfer overlaps the add
//   auto s = sum(d).change_mode(array_mode::replica);       // partial sums, then all-reduced
//   std::vector<float> out = d.to_host();
//
// Storage: each chunk (a box of the map on one device) is made of parts; a part is a region of
// the chunk, the buffer holding it (densely, in the layout of a `storage` box that contains the
// region) and the event after which it is valid. A freshly built chunk has one part. A reshard
// gives each destination chunk the parts of its pieces: data already on the device is not copied
// (the part aliases the source's buffer: arrays are immutable, so sharing is safe), data from
// other devices lands in a new buffer piece by piece, each piece with its own event. Ops wait only
// on the events of the parts they read, so `a + c.reshard(m)` adds the local parts at once and
// each received piece as soon as it has arrived.
// Modes: replica (each element's value is what any chunk holding it holds), or partial sum / prod
// / max / min (the value is the reduction over every chunk holding the element; elements of no
// chunk hold the identity), as CuPy's distributed arrays. Reductions give partial arrays without
// communication; change_mode(replica) or a reshard completes them.
//
// Ownership: an array is a cheap handle to immutable shared state (copying shares it); buffers
// return to the device allocators when no array or pending work uses them. Thread safety: arrays
// may be used from several threads at once (all operations are const and the backend's enqueue is
// thread-safe). Stream semantics: operations return once their work is enqueued; to_host() and
// wait() block. Errors: bad maps, shape or rank mismatches, unsupported dtype/op combinations
// throw invalid_index_map / invalid_argument naming the offending value before any work is
// enqueued, so no half-built array is ever returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "poolscope/darray/backend.hpp"
#include "poolscope/darray/geometry.hpp"
#include "poolscope/darray/index_map.hpp"
#include "poolscope/darray/planner.hpp"

namespace poolscope::darray {

/// What an array's values mean: replica, or a pending partial reduction.
enum class array_mode : std::uint8_t { replica, sum, prod, max, min };
[[nodiscard]] std::string_view to_string(array_mode m) noexcept;

/// A region of a chunk and where it lives. See the file comment.
struct chunk_part {
  box region;                       ///< global indices
  std::shared_ptr<buffer> storage;  ///< null only for empty regions
  box storage_box;                  ///< the box the buffer holds densely (contains region)
  event ready;                      ///< complete when the region's data is valid
};

/// One chunk: a box of the map on one device.
struct chunk {
  int device = 0;
  box region;
  std::vector<chunk_part> parts;  ///< disjoint, covering `region` (replica mode)
};

/// Which device's transfer queue issues a copy between two devices.
enum class copy_queue : std::uint8_t {
  source,       ///< the sender pushes (copy engines write over the link)
  destination,  ///< the receiver pulls
};

/// How a reshard moves data.
struct reshard_options {
  transport how = transport::automatic;
  /// Remote pieces above this are split so compute on the first part starts early (0: never).
  /// Larger pieces waste less link time between copies (docs/perf.md, "Reshard piece size").
  std::int64_t split_bytes = std::int64_t{64} << 20;
  /// Who issues each copy (either way both link directions run at once: each device's queue
  /// carries its own pieces). Pieces of at most 64 KiB are pulled by the receiver on its compute
  /// queue whatever this says (no event between queues for the op that reads them).
  copy_queue issue_on = copy_queue::source;
};

namespace detail {
/// The plan of an array no reshard made: no pieces.
[[nodiscard]] const std::shared_ptr<const reshard_plan>& empty_plan();
}  // namespace detail

/// What the last reshard of an array did (for demos, reports and tests).
struct reshard_info {
  /// Never null. Immutable and shared (with the backend's plan_cache and every array the same
  /// plan made), so passing it on costs a reference count.
  std::shared_ptr<const reshard_plan> plan = detail::empty_plan();
  std::size_t transfers = 0;  ///< copies enqueued between devices
};

namespace detail {
struct array_state;
}  // namespace detail

/// The type-erased array every distributed_array<T> wraps. See the file comment.
class array_handle {
 public:
  array_handle() = default;

  [[nodiscard]] const shape_t& shape() const;
  [[nodiscard]] dtype type() const;
  [[nodiscard]] const darray::index_map& index_map() const;
  [[nodiscard]] array_mode mode() const;
  [[nodiscard]] std::vector<int> devices() const;
  [[nodiscard]] const std::vector<chunk>& chunks() const;
  /// Chunk `index` (in chunks() order). Throws invalid_argument naming an index out of range.
  [[nodiscard]] const chunk& chunk_at(std::size_t index) const;
  [[nodiscard]] const std::shared_ptr<backend>& owner() const;
  /// The plan of the reshard that produced this array (empty plan otherwise).
  [[nodiscard]] const reshard_info& last_reshard() const;
  /// Blocks until every part of every chunk is valid.
  void wait() const;
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }

  [[nodiscard]] static array_handle from_host(std::shared_ptr<backend> be, dtype t,
                                              const void* data, std::size_t elements,
                                              const shape_t& shape, const darray::index_map& map);
  [[nodiscard]] static array_handle full(std::shared_ptr<backend> be, dtype t, scalar value,
                                         const shape_t& shape, const darray::index_map& map);
  /// Copies the values into `out` (shape order); a partial array is completed first. Throws
  /// invalid_argument, before any work is enqueued, if `elements` is not the shape's size.
  void to_host(void* out, std::size_t elements) const;
  /// Copies chunk `index` (in chunks() order) into `out` densely. Throws invalid_argument naming
  /// an index out of range or a wrong `elements`.
  void chunk_to_host(std::size_t index, void* out, std::size_t elements) const;

  [[nodiscard]] array_handle reshard(const darray::index_map& map,
                                     const reshard_options& options = {}) const;
  [[nodiscard]] array_handle change_mode(array_mode m) const;
  [[nodiscard]] array_handle unary(unary_op op) const;
  [[nodiscard]] static array_handle binary(binary_op op, const array_handle& a,
                                           const array_handle& b);
  [[nodiscard]] static array_handle binary(binary_op op, const array_handle& a, scalar b);
  [[nodiscard]] static array_handle binary(binary_op op, scalar a, const array_handle& b);
  /// Reduction over `axis` (nullopt: all axes, giving a 0-D array): a partial array.
  [[nodiscard]] array_handle reduce(reduce_op op, std::optional<std::size_t> axis) const;
  [[nodiscard]] static array_handle matmul(const array_handle& a, const array_handle& b);

 private:
  explicit array_handle(std::shared_ptr<const detail::array_state> s) : state_(std::move(s)) {}
  [[nodiscard]] const detail::array_state& state() const;
  std::shared_ptr<const detail::array_state> state_;
};

/// A typed distributed array of float, double, int32_t or int64_t. See the file comment.
template <typename T>
class distributed_array {
  static_assert(is_element_type_v<T>, "distributed_array holds float, double, int32_t, int64_t");

 public:
  distributed_array() = default;
  explicit distributed_array(array_handle h) : h_(std::move(h)) {}

  /// Builds an array of `shape` from row-major host data, placed as `map` says. Throws
  /// invalid_index_map for a bad map, invalid_argument if data.size() is not the shape's size.
  [[nodiscard]] static distributed_array from_host(std::shared_ptr<backend> be,
                                                   std::span<const T> data, const shape_t& shape,
                                                   const darray::index_map& map) {
    return distributed_array(array_handle::from_host(std::move(be), dtype_of<T>(), data.data(),
                                                     data.size(), shape, map));
  }
  /// An array of `shape` whose every element is `value`.
  [[nodiscard]] static distributed_array full(std::shared_ptr<backend> be, T value,
                                              const shape_t& shape, const darray::index_map& map) {
    return distributed_array(
        array_handle::full(std::move(be), dtype_of<T>(), scalar::of(value), shape, map));
  }

  /// The values in row-major order (blocks until they are computed).
  [[nodiscard]] std::vector<T> to_host() const {
    std::vector<T> out(static_cast<std::size_t>(element_count(h_.shape())));
    h_.to_host(out.data(), out.size());
    return out;
  }
  /// Chunk `index` (in chunks() order) densely, in its box's row-major order. Throws
  /// invalid_argument naming an index out of range.
  [[nodiscard]] std::vector<T> chunk_to_host(std::size_t index) const {
    const chunk& c = h_.chunk_at(index);
    std::vector<T> out(static_cast<std::size_t>(c.region.size()));
    h_.chunk_to_host(index, out.data(), out.size());
    return out;
  }

  [[nodiscard]] const shape_t& shape() const { return h_.shape(); }
  [[nodiscard]] const darray::index_map& index_map() const { return h_.index_map(); }
  [[nodiscard]] array_mode mode() const { return h_.mode(); }
  [[nodiscard]] std::vector<int> devices() const { return h_.devices(); }
  [[nodiscard]] const std::vector<chunk>& chunks() const { return h_.chunks(); }
  [[nodiscard]] const array_handle& handle() const noexcept { return h_; }
  void wait() const { h_.wait(); }

  /// The same values placed as `map` says (only what must move moves). A partial array is
  /// completed into the new map (reduce-scatter / all-reduce).
  [[nodiscard]] distributed_array reshard(const darray::index_map& map,
                                          const reshard_options& options = {}) const {
    return distributed_array(h_.reshard(map, options));
  }
  /// Completes a partial array (mode replica) on its own map. Other changes throw logic_error.
  [[nodiscard]] distributed_array change_mode(array_mode m) const {
    return distributed_array(h_.change_mode(m));
  }

 private:
  array_handle h_;
};

/// CuPy-style name.
template <typename T>
using DistributedArray = distributed_array<T>;

// --- elementwise: the result has the left array operand's map (the right one's for scalar @
// array); the other operand is resharded to it piece by piece, compute following each piece ---
#define POOLSCOPE_DARRAY_BINARY(name, op)                                             \
  template <typename T>                                                               \
  [[nodiscard]] distributed_array<T> name(const distributed_array<T>& a,              \
                                          const distributed_array<T>& b) {            \
    return distributed_array<T>(array_handle::binary(op, a.handle(), b.handle()));    \
  }                                                                                   \
  template <typename T>                                                               \
  [[nodiscard]] distributed_array<T> name(const distributed_array<T>& a, T b) {       \
    return distributed_array<T>(array_handle::binary(op, a.handle(), scalar::of(b))); \
  }                                                                                   \
  template <typename T>                                                               \
  [[nodiscard]] distributed_array<T> name(T a, const distributed_array<T>& b) {       \
    return distributed_array<T>(array_handle::binary(op, scalar::of(a), b.handle())); \
  }
POOLSCOPE_DARRAY_BINARY(add, binary_op::add)
POOLSCOPE_DARRAY_BINARY(subtract, binary_op::sub)
POOLSCOPE_DARRAY_BINARY(multiply, binary_op::mul)
POOLSCOPE_DARRAY_BINARY(divide, binary_op::div)
POOLSCOPE_DARRAY_BINARY(maximum, binary_op::maximum)
POOLSCOPE_DARRAY_BINARY(minimum, binary_op::minimum)
POOLSCOPE_DARRAY_BINARY(pow, binary_op::pow)
POOLSCOPE_DARRAY_BINARY(operator+, binary_op::add)
POOLSCOPE_DARRAY_BINARY(operator-, binary_op::sub)
POOLSCOPE_DARRAY_BINARY(operator*, binary_op::mul)
POOLSCOPE_DARRAY_BINARY(operator/, binary_op::div)
#undef POOLSCOPE_DARRAY_BINARY

#define POOLSCOPE_DARRAY_UNARY(name, op)                                   \
  template <typename T>                                                    \
  [[nodiscard]] distributed_array<T> name(const distributed_array<T>& a) { \
    return distributed_array<T>(a.handle().unary(op));                     \
  }
POOLSCOPE_DARRAY_UNARY(negative, unary_op::neg)
POOLSCOPE_DARRAY_UNARY(operator-, unary_op::neg)
POOLSCOPE_DARRAY_UNARY(abs, unary_op::abs)
POOLSCOPE_DARRAY_UNARY(exp, unary_op::exp)
POOLSCOPE_DARRAY_UNARY(log, unary_op::log)
POOLSCOPE_DARRAY_UNARY(sin, unary_op::sin)
POOLSCOPE_DARRAY_UNARY(cos, unary_op::cos)
POOLSCOPE_DARRAY_UNARY(sqrt, unary_op::sqrt)
#undef POOLSCOPE_DARRAY_UNARY

// --- reductions: partial arrays, no communication ---
#define POOLSCOPE_DARRAY_REDUCE(name, op)                                         \
  template <typename T>                                                           \
  [[nodiscard]] distributed_array<T> name(const distributed_array<T>& a,          \
                                          std::optional<std::size_t> axis = {}) { \
    return distributed_array<T>(a.handle().reduce(op, axis));                     \
  }
POOLSCOPE_DARRAY_REDUCE(sum, reduce_op::sum)
POOLSCOPE_DARRAY_REDUCE(prod, reduce_op::prod)
POOLSCOPE_DARRAY_REDUCE(max, reduce_op::max)
POOLSCOPE_DARRAY_REDUCE(min, reduce_op::min)
#undef POOLSCOPE_DARRAY_REDUCE

/// a @ b for 2-D arrays: a partial-sum array (blocks of b move to the devices of a while earlier
/// blocks multiply). change_mode(replica) completes it. Block maps (unit steps) multiply a block
/// per gemm; where a strided chunk (a replica of every other row, say) makes the inner axis or
/// b's columns strided, a gemm per index of that axis.
/// Throws invalid_argument naming the shape when the result's bytes exceed INT64_MAX.
template <typename T>
[[nodiscard]] distributed_array<T> matmul(const distributed_array<T>& a,
                                          const distributed_array<T>& b) {
  return distributed_array<T>(array_handle::matmul(a.handle(), b.handle()));
}

}  // namespace poolscope::darray
