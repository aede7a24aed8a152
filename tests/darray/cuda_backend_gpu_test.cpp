// The CUDA backend on real GPUs: every op and dtype against a host reference computed here (small
// sizes and sizes that are not a multiple of the vector width, dense, misaligned, strided and
// transposed views of rank 1-3), copies within a GPU and between GPUs by peer copies and by NCCL,
// reductions along every axis and all axes, gemm against a triple loop, events ordering work
// across devices, and every buffer back in its allocator after synchronize.
// Without a GPU every test skips with the reason. Random values print their seed
// (POOLSCOPE_TEST_SEED overrides it).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "poolscope/darray/backend.hpp"
#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/function_profiler.hpp"
#include "semantics_checks.hpp"
#include "test_support.hpp"

namespace poolscope::darray {
namespace {

std::uint64_t test_seed() {
  return test_support::test_seed(20240923);
}

// One CUDA backend over every GPU for the whole program, released before the CUDA runtime is
// torn down (a gtest environment), or the reason there is none.
struct gpu {
  std::shared_ptr<backend> be;
  std::string why_not;
};

gpu& the_gpu() {
  static gpu g = [] {
    gpu r;
    try {
      r.be = make_cuda_backend(-1);
    } catch (const device_unavailable& e) {
      r.why_not = e.what();
    }
    return r;
  }();
  return g;
}

class release_backend : public ::testing::Environment {
 public:
  void TearDown() override { the_gpu().be.reset(); }
};
[[maybe_unused]] const auto* const registered_environment =
    ::testing::AddGlobalTestEnvironment(new release_backend);

// --- the host reference (backend.hpp's arithmetic paragraph, written independently) ---

template <typename T>
T saturate(double d) {
  if (std::isnan(d)) {
    return 0;
  }
  const double limit = std::ldexp(1.0, std::numeric_limits<T>::digits);  // 2^31 or 2^63
  if (d >= limit) {
    return std::numeric_limits<T>::max();
  }
  if (d < -limit) {
    return std::numeric_limits<T>::min();
  }
  return static_cast<T>(std::trunc(d));
}

template <typename T>
T wrap(T a, T b, int op) {  // 0 add, 1 sub, 2 mul, 3 neg (of b)
  using U = std::make_unsigned_t<T>;
  const U x = static_cast<U>(a);
  const U y = static_cast<U>(b);
  switch (op) {
    case 0:
      return static_cast<T>(x + y);
    case 1:
      return static_cast<T>(x - y);
    case 2:
      return static_cast<T>(x * y);
    default:
      return static_cast<T>(U{0} - y);
  }
}

template <typename T>
T ref_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) {
      return std::numeric_limits<T>::quiet_NaN();
    }
  }
  return a < b ? b : a;
}

template <typename T>
T ref_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) {
      return std::numeric_limits<T>::quiet_NaN();
    }
  }
  return b < a ? b : a;
}

template <typename T>
T ref_unary(unary_op op, T x) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case unary_op::neg:
        return -x;
      case unary_op::abs:
        return std::fabs(x);
      case unary_op::exp:
        return std::exp(x);
      case unary_op::log:
        return std::log(x);
      case unary_op::sin:
        return std::sin(x);
      case unary_op::cos:
        return std::cos(x);
      case unary_op::sqrt:
        return std::sqrt(x);
    }
  } else {
    const auto d = static_cast<double>(x);
    switch (op) {
      case unary_op::neg:
        return wrap<T>(0, x, 3);
      case unary_op::abs:
        return x < 0 ? wrap<T>(0, x, 3) : x;
      case unary_op::exp:
        return saturate<T>(std::exp(d));
      case unary_op::log:
        return saturate<T>(std::log(d));
      case unary_op::sin:
        return saturate<T>(std::sin(d));
      case unary_op::cos:
        return saturate<T>(std::cos(d));
      case unary_op::sqrt:
        return saturate<T>(std::sqrt(d));
    }
  }
  return x;
}

template <typename T>
T ref_binary(binary_op op, T a, T b) {
  constexpr bool integer = std::is_integral_v<T>;
  switch (op) {
    case binary_op::add:
      if constexpr (integer) {
        return wrap(a, b, 0);
      }
      return a + b;
    case binary_op::sub:
      if constexpr (integer) {
        return wrap(a, b, 1);
      }
      return a - b;
    case binary_op::mul:
      if constexpr (integer) {
        return wrap(a, b, 2);
      }
      return a * b;
    case binary_op::div:
      if constexpr (integer) {
        if (b == 0) {
          return 0;
        }
        if (b == -1) {
          return wrap<T>(0, a, 3);
        }
      }
      return a / b;
    case binary_op::maximum:
      return ref_max(a, b);
    case binary_op::minimum:
      return ref_min(a, b);
    case binary_op::pow:
      if constexpr (integer) {
        return test_support::reference_pow(a, b);  // exact, saturated
      } else {
        return std::pow(a, b);
      }
  }
  return a;
}

template <typename T>
T ref_combine(reduce_op op, T a, T b) {
  switch (op) {
    case reduce_op::sum:
      return ref_binary(binary_op::add, a, b);
    case reduce_op::prod:
      return ref_binary(binary_op::mul, a, b);
    case reduce_op::max:
      return ref_max(a, b);
    case reduce_op::min:
      return ref_min(a, b);
  }
  return a;
}

// --- comparisons ---

// Equal, both NaN, or within `tol` relative to max(1, |want|) (floating types); for integers
// within `int_slack` (results computed in double and truncated may differ by one where the
// device's and the host's math functions round differently).
template <typename T>
::testing::AssertionResult close(T got, T want, double tol, std::int64_t int_slack = 0) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(got) && std::isnan(want)) {
      return ::testing::AssertionSuccess();
    }
    if (got == want) {
      return ::testing::AssertionSuccess();
    }
    const double err = std::fabs(static_cast<double>(got) - static_cast<double>(want));
    if (err <= tol * std::max(1.0, std::fabs(static_cast<double>(want)))) {
      return ::testing::AssertionSuccess();
    }
  } else {
    const auto diff = static_cast<long double>(got) - static_cast<long double>(want);
    // Results computed in double and converted (exp, pow, ...): beyond 2^53 one ulp of the
    // double is more than one integer, so the slack scales with the value (a few ulp).
    const long double ulps =
        int_slack > 0 ? std::fabs(static_cast<long double>(want)) * 0x1p-50L : 0;
    if (std::fabs(diff) <= static_cast<long double>(int_slack) + ulps) {
      return ::testing::AssertionSuccess();
    }
  }
  return ::testing::AssertionFailure() << "got " << +got << ", want " << +want;
}

// Relative tolerance of transcendental results (a few ulp of the type).
template <typename T>
constexpr double math_tol() {
  return std::is_same_v<T, float> ? 2e-6 : 1e-14;
}

// --- layouts: a view inside a dense storage buffer ---

struct layout {
  std::string name;
  shape_t storage;  // the buffer's dense extents
  std::int64_t offset = 0;
  shape_t extents;
  shape_t strides;
};

std::int64_t count(const shape_t& s) {
  std::int64_t n = 1;
  for (auto e : s) {
    n *= e;
  }
  return n;
}

view make_view(void* base, const layout& l) {
  view v;
  v.base = base;
  v.offset = l.offset;
  v.rank = l.extents.size();
  for (std::size_t d = 0; d < v.rank; ++d) {
    v.extent[d] = l.extents[d];
    v.stride[d] = l.strides[d];
  }
  return v;
}

// The element offsets of a layout's view in row-major order of its extents.
std::vector<std::int64_t> offsets_of(const layout& l) {
  std::vector<std::int64_t> out;
  const std::size_t rank = l.extents.size();
  if (count(l.extents) == 0) {
    return out;
  }
  std::vector<std::int64_t> idx(rank, 0);
  for (;;) {
    std::int64_t off = l.offset;
    for (std::size_t d = 0; d < rank; ++d) {
      off += idx[d] * l.strides[d];
    }
    out.push_back(off);
    std::size_t d = rank;
    for (; d > 0; --d) {
      if (++idx[d - 1] < l.extents[d - 1]) {
        break;
      }
      idx[d - 1] = 0;
    }
    if (d == 0) {
      return out;
    }
  }
}

// True if the layout's elements are consecutive in row-major order (NCCL moves only those).
bool contiguous(const layout& l) {
  std::int64_t expect = 1;
  for (std::size_t d = l.extents.size(); d-- > 0;) {
    if (l.extents[d] != 1 && l.strides[d] != expect) {
      return false;
    }
    expect *= l.extents[d];
  }
  return true;
}

layout dense_layout(const shape_t& extents) {
  layout l{"dense", extents, 0, extents, shape_t(extents.size(), 1)};
  for (std::size_t d = extents.size(); d-- > 1;) {
    l.strides[d - 1] = l.strides[d] * extents[d];
  }
  for (auto e : extents) {
    l.name += " " + std::to_string(e);
  }
  return l;
}

// The layouts every element-wise op runs on: all views of one op share the extents.
std::vector<std::vector<layout>> elementwise_layout_sets() {
  std::vector<std::vector<layout>> sets;
  for (std::int64_t n : {1, 3, 4, 5, 17, 1000, 4099}) {
    sets.push_back({dense_layout({n}), dense_layout({n}), dense_layout({n})});
  }
  // Misaligned (offset 1) dense lines: contiguous, not 16-byte aligned.
  sets.push_back({layout{"misaligned", {1002}, 1, {1001}, {1}}, dense_layout({1001}),
                  layout{"misaligned", {1003}, 2, {1001}, {1}}});
  // Contiguous lines starting `o` elements into their buffers (output, a, b): the vector path
  // peels the output's head, then reads each input whole, by halves or by elements. (2, 2, 0) is
  // D1's fused add on the receiving GPU.
  for (const auto& [od, oa, ob] : std::vector<std::array<std::int64_t, 3>>{
           {2, 2, 0}, {1, 2, 3}, {3, 3, 3}, {2, 0, 0}, {0, 1, 0}, {0, 0, 2}, {1, 0, 1}}) {
    for (std::int64_t n : {2, 4099}) {
      const auto line = [n](std::int64_t o) {
        return layout{"offset " + std::to_string(o), {n + o}, o, {n}, {1}};
      };
      sets.push_back({line(od), line(oa), line(ob)});
    }
  }
  sets.push_back({dense_layout({13, 17}), dense_layout({13, 17}), dense_layout({13, 17})});
  // Strided rank 3: (5, 6, 7) inside (11, 8, 9), starting at (1, 1, 2), steps (2, 1, 1).
  const layout strided{"strided", {11, 8, 9}, 1 * 72 + 1 * 9 + 2, {5, 6, 7}, {144, 9, 1}};
  // Every other element along the last axis: (4, 3, 10) inside (4, 3, 21).
  const layout stepped{"stepped", {4, 3, 21}, 1, {4, 3, 10}, {63, 21, 2}};
  sets.push_back({strided, dense_layout({5, 6, 7}), strided});
  sets.push_back({dense_layout({4, 3, 10}), stepped, stepped});
  // A transposed (13, 17) view of a dense (17, 13) buffer.
  const layout transposed{"transposed", {17, 13}, 0, {13, 17}, {1, 13}};
  sets.push_back({dense_layout({13, 17}), transposed, dense_layout({13, 17})});
  return sets;
}

// --- typed fixture ---

template <typename T>
class cuda_backend_gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!the_gpu().be) {
      GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
    }
    be_ = the_gpu().be;
    rng_.seed(test_seed());
    RecordProperty("seed", std::to_string(test_seed()));
  }

  void TearDown() override {
    if (!be_) {
      return;
    }
    be_->synchronize();
    for (int d = 0; d < be_->device_count(); ++d) {
      EXPECT_EQ(be_->allocator(d).stats().in_use, 0U)
          << "device " << d << " (seed " << test_seed() << ")";
    }
  }

  static constexpr dtype type = dtype_of<T>();

  // Random values: floating in [lo, hi), integers in [lo, hi].
  std::vector<T> random(std::int64_t n, double lo, double hi) {
    std::vector<T> v(static_cast<std::size_t>(n));
    if constexpr (std::is_floating_point_v<T>) {
      std::uniform_real_distribution<double> dist(lo, hi);
      for (auto& x : v) {
        x = static_cast<T>(dist(rng_));
      }
    } else {
      std::uniform_int_distribution<std::int64_t> dist(static_cast<std::int64_t>(lo),
                                                       static_cast<std::int64_t>(hi));
      for (auto& x : v) {
        x = static_cast<T>(dist(rng_));
      }
    }
    return v;
  }

  // A device buffer holding `values` densely.
  std::shared_ptr<buffer> upload(int device, const std::vector<T>& values) {
    auto buf = be_->allocate(device, values.size() * sizeof(T));
    const auto n = static_cast<std::int64_t>(values.size());
    be_->upload(device, type, view::dense(buf->data(), {n}),
                view::dense(const_cast<T*>(values.data()), {n}));
    return buf;
  }

  std::vector<T> download(int device, const buffer& buf) {
    std::vector<T> out(buf.bytes() / sizeof(T));
    const auto n = static_cast<std::int64_t>(out.size());
    be_->download(device, type, view::dense(out.data(), {n}), view::dense(buf.data(), {n}));
    return out;
  }

  std::shared_ptr<backend> be_;
  std::mt19937_64 rng_;
};

using element_types = ::testing::Types<float, double, std::int32_t, std::int64_t>;
TYPED_TEST_SUITE(cuda_backend_gpu, element_types);

// Checks that dst's storage holds `want` at the view's elements and `before` everywhere else.
template <typename T>
void expect_view(const std::vector<T>& got, const std::vector<T>& before, const layout& l,
                 const std::vector<T>& want, double tol, std::int64_t int_slack,
                 const std::string& what) {
  const auto offs = offsets_of(l);
  std::vector<char> in_view(got.size(), 0);
  int failures = 0;
  for (std::size_t i = 0; i < offs.size() && failures < 5; ++i) {
    const auto o = static_cast<std::size_t>(offs[i]);
    in_view[o] = 1;
    const auto r = close(got[o], want[i], tol, int_slack);
    if (!r) {
      ADD_FAILURE() << what << " [" << l.name << "] element " << i << ": " << r.message()
                    << " (seed " << test_seed() << ")";
      ++failures;
    }
  }
  for (std::size_t o = 0; o < got.size() && failures < 5; ++o) {
    if (in_view[o] == 0 && !close(got[o], before[o], 0.0)) {
      ADD_FAILURE() << what << " [" << l.name << "] wrote outside the view at " << o;
      ++failures;
    }
  }
}

// Operand ranges per op that keep the results meaningful (and exercise NaN and saturation).
template <typename T>
std::pair<double, double> unary_range(unary_op op) {
  if constexpr (std::is_floating_point_v<T>) {
    return op == unary_op::exp ? std::pair{-20.0, 20.0} : std::pair{-4.0, 4.0};
  } else {
    if (op == unary_op::neg || op == unary_op::abs) {
      return {static_cast<double>(std::numeric_limits<T>::min()),
              static_cast<double>(std::numeric_limits<T>::max())};
    }
    return op == unary_op::exp ? std::pair{-5.0, 50.0} : std::pair{-50.0, 1000.0};
  }
}

bool transcendental(unary_op op) {
  return op == unary_op::exp || op == unary_op::log || op == unary_op::sin || op == unary_op::cos;
}

TYPED_TEST(cuda_backend_gpu, fill_every_layout) {
  using T = TypeParam;
  for (const auto& set : elementwise_layout_sets()) {
    const layout& l = set[0];
    const auto before = this->random(count(l.storage), -9, 9);
    auto dst = this->upload(0, before);
    const scalar value = scalar::of(T{7});
    this->be_->fill(0, queue_kind::compute, this->type, make_view(dst->data(), l), value);
    const std::vector<T> want(offsets_of(l).size(), T{7});
    expect_view(this->download(0, *dst), before, l, want, 0.0, 0, "fill");
  }
}

TYPED_TEST(cuda_backend_gpu, unary_ops_every_layout) {
  using T = TypeParam;
  for (unary_op op : {unary_op::neg, unary_op::abs, unary_op::exp, unary_op::log, unary_op::sin,
                      unary_op::cos, unary_op::sqrt}) {
    const auto [lo, hi] = unary_range<T>(op);
    for (const auto& set : elementwise_layout_sets()) {
      const layout& ld = set[0];
      const layout& ls = set[1];
      const auto before = this->random(count(ld.storage), -9, 9);
      auto src_values = this->random(count(ls.storage), lo, hi);
      if constexpr (std::is_integral_v<T>) {
        src_values[0] = std::numeric_limits<T>::min();  // wraps under neg and abs
      }
      auto dst = this->upload(0, before);
      auto src = this->upload(0, src_values);
      this->be_->unary(0, queue_kind::compute, this->type, op, make_view(dst->data(), ld),
                       make_view(src->data(), ls));
      std::vector<T> want;
      for (auto o : offsets_of(ls)) {
        want.push_back(ref_unary(op, src_values[static_cast<std::size_t>(o)]));
      }
      const double tol = transcendental(op) ? math_tol<T>() : 0.0;
      expect_view(this->download(0, *dst), before, ld, want, tol, transcendental(op) ? 1 : 0,
                  std::string(to_string(op)));
    }
  }
}

TYPED_TEST(cuda_backend_gpu, binary_ops_every_layout_and_scalar_side) {
  using T = TypeParam;
  constexpr bool integer = std::is_integral_v<T>;
  for (binary_op op : {binary_op::add, binary_op::sub, binary_op::mul, binary_op::div,
                       binary_op::maximum, binary_op::minimum, binary_op::pow}) {
    for (int side = 0; side < 3; ++side) {  // 0: two views, 1: scalar on the left, 2: on the right
      for (const auto& set : elementwise_layout_sets()) {
        const layout& ld = set[0];
        const layout& la = set[1];
        const layout& lb = set[2];
        const auto before = this->random(count(ld.storage), -9, 9);
        const double hi = op == binary_op::pow ? 6.0 : 50.0;
        auto a_values =
            this->random(count(la.storage), integer ? -10.0 : -4.0, integer ? 10.0 : 4.0);
        auto b_values = this->random(count(lb.storage), integer ? -3.0 : -4.0, integer ? hi : 4.0);
        if constexpr (integer) {
          if (op == binary_op::add || op == binary_op::mul || op == binary_op::sub) {
            a_values[0] = std::numeric_limits<T>::max();  // wraps
          }
          if (op == binary_op::div) {
            a_values[0] = std::numeric_limits<T>::min();  // min / -1 wraps
            b_values[static_cast<std::size_t>(lb.offset)] = T{-1};
          }
        }
        auto dst = this->upload(0, before);
        auto a = this->upload(0, a_values);
        auto b = this->upload(0, b_values);
        const scalar s = scalar::of(integer ? T{3} : static_cast<T>(1.5));
        const T sv = integer ? T{3} : static_cast<T>(1.5);
        this->be_->binary(0, queue_kind::compute, this->type, op, make_view(dst->data(), ld),
                          make_view(a->data(), la), make_view(b->data(), lb),
                          side == 1 ? &s : nullptr, side == 2 ? &s : nullptr);
        const auto oa = offsets_of(la);
        const auto ob = offsets_of(lb);
        std::vector<T> want;
        for (std::size_t i = 0; i < oa.size(); ++i) {
          const T x = side == 1 ? sv : a_values[static_cast<std::size_t>(oa[i])];
          const T y = side == 2 ? sv : b_values[static_cast<std::size_t>(ob[i])];
          want.push_back(ref_binary(op, x, y));
        }
        const bool inexact = op == binary_op::pow && !integer;
        expect_view(this->download(0, *dst), before, ld, want, inexact ? math_tol<T>() : 0.0,
                    inexact ? 1 : 0, std::string(to_string(op)) + " side " + std::to_string(side));
      }
    }
  }
}

// binary_parts: contiguous parts go as one launch (up to 8), anything else one launch per part;
// every part's result matches the host either way.
TYPED_TEST(cuda_backend_gpu, binary_parts_match_the_host) {
  using T = TypeParam;
  const auto sets = elementwise_layout_sets();
  // Set indices (elementwise_layout_sets) and the launches expected.
  const std::vector<std::pair<std::vector<std::size_t>, std::uint64_t>> groups = {
      {{0, 1, 2}, 1},                       // dense lines: one launch
      {{7, 8, 9, 10, sets.size() - 4}, 1},  // misaligned lines, a dense 2-D block: one launch
      {{3, sets.size() - 1, sets.size() - 3}, 3},  // transposed and strided among them: per part
      {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 10},        // more than 8: per part
  };
  for (binary_op op : {binary_op::sub, binary_op::maximum}) {
    for (const auto& [group, expected_launches] : groups) {
      struct buffers {
        std::vector<T> before, a, b;
        std::shared_ptr<buffer> dst, da, db;
      };
      std::vector<buffers> held;
      std::vector<backend::binary_part> parts;
      for (const std::size_t i : group) {
        const auto& set = sets[i];
        buffers h{this->random(count(set[0].storage), -9, 9),
                  this->random(count(set[1].storage), -9, 9),
                  this->random(count(set[2].storage), -9, 9),
                  nullptr,
                  nullptr,
                  nullptr};
        h.dst = this->upload(0, h.before);
        h.da = this->upload(0, h.a);
        h.db = this->upload(0, h.b);
        parts.push_back({make_view(h.dst->data(), set[0]), make_view(h.da->data(), set[1]),
                         make_view(h.db->data(), set[2])});
        held.push_back(std::move(h));
      }
      const auto ops_before = this->be_->stats().ops;
      this->be_->binary_parts(0, queue_kind::compute, this->type, op, parts);
      const auto launches = this->be_->stats().ops - ops_before;
      for (std::size_t k = 0; k < group.size(); ++k) {
        const auto& set = sets[group[k]];
        const auto oa = offsets_of(set[1]);
        const auto ob = offsets_of(set[2]);
        std::vector<T> want;
        for (std::size_t i = 0; i < oa.size(); ++i) {
          want.push_back(ref_binary(op, held[k].a[static_cast<std::size_t>(oa[i])],
                                    held[k].b[static_cast<std::size_t>(ob[i])]));
        }
        expect_view(this->download(0, *held[k].dst), held[k].before, set[0], want, 0.0, 0,
                    "binary_parts " + std::string(to_string(op)) + " part " + std::to_string(k));
      }
      EXPECT_EQ(launches, expected_launches);
    }
  }
}

TYPED_TEST(cuda_backend_gpu, accumulate_every_op) {
  using T = TypeParam;
  for (reduce_op op : {reduce_op::sum, reduce_op::prod, reduce_op::max, reduce_op::min}) {
    for (const auto& set : elementwise_layout_sets()) {
      const layout& lacc = set[0];
      const layout& ls = set[1];
      const auto before = this->random(count(lacc.storage), -9, 9);
      const auto src_values = this->random(count(ls.storage), -9, 9);
      auto acc = this->upload(0, before);
      auto src = this->upload(0, src_values);
      this->be_->accumulate(0, queue_kind::transfer, this->type, op, make_view(acc->data(), lacc),
                            make_view(src->data(), ls));
      const auto oa = offsets_of(lacc);
      const auto os = offsets_of(ls);
      std::vector<T> want;
      for (std::size_t i = 0; i < oa.size(); ++i) {
        want.push_back(ref_combine(op, before[static_cast<std::size_t>(oa[i])],
                                   src_values[static_cast<std::size_t>(os[i])]));
      }
      expect_view(this->download(0, *acc), before, lacc, want, 0.0, 0,
                  "accumulate " + std::string(to_string(op)));
    }
  }
}

TYPED_TEST(cuda_backend_gpu, reduce_along_each_axis_and_all_axes) {
  using T = TypeParam;
  const std::vector<layout> sources = {
      dense_layout({1}),
      dense_layout({5}),
      dense_layout({100000}),  // several blocks in the first pass
      layout{"stepped", {301}, 1, {150}, {2}},
      dense_layout({7, 300}),
      dense_layout({300, 3}),
      layout{"transposed", {9, 4}, 0, {4, 9}, {1, 4}},
      layout{"strided", {11, 8, 9}, 1 * 72 + 1 * 9 + 2, {5, 6, 7}, {144, 9, 1}},
      dense_layout({3, 2, 4000}),
  };
  for (reduce_op op : {reduce_op::sum, reduce_op::prod, reduce_op::max, reduce_op::min}) {
    for (const auto& ls : sources) {
      const std::size_t rank = ls.extents.size();
      for (int axis = -1; axis < static_cast<int>(rank); ++axis) {
        // Products of many floats stay near 1; of integers they wrap (exact in any order).
        const bool prod = op == reduce_op::prod;
        const double lo = prod ? (std::is_floating_point_v<T> ? 0.999 : -3) : -9;
        const double hi = prod ? (std::is_floating_point_v<T> ? 1.001 : 3) : 9;
        const auto src_values = this->random(count(ls.storage), lo, hi);
        shape_t acc_extents;
        if (axis >= 0) {
          for (std::size_t d = 0; d < rank; ++d) {
            if (static_cast<int>(d) != axis) {
              acc_extents.push_back(ls.extents[d]);
            }
          }
        }
        const std::int64_t outputs = count(acc_extents);
        const auto acc_values = prod ? std::vector<T>(static_cast<std::size_t>(outputs), T{1})
                                     : this->random(outputs, -9, 9);
        auto src = this->upload(0, src_values);
        auto acc = this->upload(0, acc_values);
        view acc_view = view::dense(acc->data(), acc_extents);
        this->be_->reduce(0, queue_kind::compute, this->type, op, acc_view,
                          make_view(src->data(), ls), axis);
        // Reference: fold every source element into its output (row-major order).
        std::vector<T> want = acc_values;
        std::vector<double> magnitude(static_cast<std::size_t>(outputs), 0.0);
        std::vector<T> partial(static_cast<std::size_t>(outputs), T{0});
        std::vector<char> started(static_cast<std::size_t>(outputs), 0);
        const auto offs = offsets_of(ls);
        for (std::size_t i = 0; i < offs.size(); ++i) {
          // Coordinates of element i, then its output index without the axis.
          std::int64_t rest = static_cast<std::int64_t>(i);
          std::vector<std::int64_t> c(rank);
          for (std::size_t d = rank; d-- > 0;) {
            c[d] = rest % ls.extents[d];
            rest /= ls.extents[d];
          }
          std::int64_t o = 0;
          for (std::size_t d = 0; d < rank; ++d) {
            if (static_cast<int>(d) != axis && axis >= 0) {
              o = o * ls.extents[d] + c[d];
            }
          }
          const auto oi = static_cast<std::size_t>(o);
          const T x = src_values[static_cast<std::size_t>(offs[i])];
          partial[oi] = started[oi] != 0 ? ref_combine(op, partial[oi], x) : x;
          started[oi] = 1;
          magnitude[oi] += std::fabs(static_cast<double>(x));
        }
        for (std::size_t oi = 0; oi < want.size(); ++oi) {
          want[oi] = ref_combine(op, want[oi], partial[oi]);
        }
        const auto got = this->download(0, *acc);
        for (std::size_t oi = 0; oi < want.size(); ++oi) {
          double tol = 0.0;
          if constexpr (std::is_floating_point_v<T>) {
            const double eps = std::numeric_limits<T>::epsilon();
            tol = (op == reduce_op::sum || prod) ? 4 * eps * (magnitude[oi] + 10) : 0.0;
          }
          EXPECT_TRUE(close(got[oi], want[oi], tol))
              << to_string(op) << " of " << ls.name << " axis " << axis << " output " << oi
              << " (seed " << test_seed() << ")";
        }
      }
    }
  }
}

TYPED_TEST(cuda_backend_gpu, gemm_matches_triple_loop) {
  using T = TypeParam;
  struct gemm_case {
    std::int64_t m, k, n;
    std::int64_t pad;  // extra columns of each operand's storage (row stride > columns)
  };
  for (const auto& g : {gemm_case{1, 1, 1, 0}, gemm_case{5, 7, 3, 0}, gemm_case{33, 17, 65, 0},
                        gemm_case{64, 64, 64, 0}, gemm_case{31, 45, 29, 5}}) {
    const auto a_values = this->random(g.m * (g.k + g.pad), -4, 4);
    const auto b_values = this->random(g.k * (g.n + g.pad), -4, 4);
    const auto c_values = this->random(g.m * (g.n + g.pad), -4, 4);
    auto a = this->upload(0, a_values);
    auto b = this->upload(0, b_values);
    auto c = this->upload(0, c_values);
    const layout la{"a", {g.m, g.k + g.pad}, 0, {g.m, g.k}, {g.k + g.pad, 1}};
    const layout lb{"b", {g.k, g.n + g.pad}, 0, {g.k, g.n}, {g.n + g.pad, 1}};
    const layout lc{"c", {g.m, g.n + g.pad}, 0, {g.m, g.n}, {g.n + g.pad, 1}};
    this->be_->gemm_accumulate(0, queue_kind::compute, this->type, make_view(c->data(), lc),
                               make_view(a->data(), la), make_view(b->data(), lb));
    // Integers: wrapped products and sums, exact. Floating: the sum in long double, allowed a
    // few ulp of the magnitudes summed (the order of additions differs).
    const auto got = this->download(0, *c);
    const std::int64_t ldc = g.n + g.pad;
    for (std::int64_t i = 0; i < g.m; ++i) {
      for (std::int64_t j = 0; j < ldc; ++j) {
        const auto at = static_cast<std::size_t>(i * ldc + j);
        if (j >= g.n) {
          EXPECT_TRUE(close(got[at], c_values[at], 0.0))
              << "gemm wrote padding at " << i << ", " << j;
          continue;
        }
        T exact = c_values[at];
        long double sum = c_values[at];
        long double magnitude = std::fabs(static_cast<long double>(c_values[at]));
        for (std::int64_t q = 0; q < g.k; ++q) {
          const T x = a_values[static_cast<std::size_t>(i * (g.k + g.pad) + q)];
          const T y = b_values[static_cast<std::size_t>(q * (g.n + g.pad) + j)];
          exact = ref_binary(binary_op::add, exact, ref_binary(binary_op::mul, x, y));
          sum += static_cast<long double>(x) * static_cast<long double>(y);
          magnitude += std::fabs(static_cast<long double>(x) * static_cast<long double>(y));
        }
        if constexpr (std::is_floating_point_v<T>) {
          const long double allowed = 2.0L * static_cast<long double>(g.k + 2) *
                                      std::numeric_limits<T>::epsilon() * magnitude;
          EXPECT_LE(std::fabs(static_cast<long double>(got[at]) - sum), allowed)
              << "gemm " << g.m << "x" << g.k << "x" << g.n << " at " << i << ", " << j;
        } else {
          EXPECT_EQ(got[at], exact)
              << "gemm " << g.m << "x" << g.k << "x" << g.n << " at " << i << ", " << j;
        }
      }
    }
  }
}

// Pairs of (dst, src) layouts of equal extents for copies.
std::vector<std::pair<layout, layout>> copy_layouts() {
  return {
      {dense_layout({1}), dense_layout({1})},
      {dense_layout({4099}), dense_layout({4099})},
      {layout{"misaligned", {1002}, 1, {1001}, {1}}, dense_layout({1001})},
      // Rows at a pitch: a (20, 30) block of a (25, 40) storage into a dense one (2-D copies).
      {dense_layout({20, 30}), layout{"pitched", {25, 40}, 2 * 40 + 3, {20, 30}, {40, 1}}},
      {layout{"pitched", {25, 40}, 40 + 1, {20, 30}, {40, 1}}, dense_layout({20, 30})},
      // Strided rank 3 and transposed (the copy kernel).
      {layout{"strided", {11, 8, 9}, 1 * 72 + 1 * 9 + 2, {5, 6, 7}, {144, 9, 1}},
       dense_layout({5, 6, 7})},
      {dense_layout({4, 3, 10}), layout{"stepped", {4, 3, 21}, 1, {4, 3, 10}, {63, 21, 2}}},
      {dense_layout({13, 17}), layout{"transposed", {17, 13}, 0, {13, 17}, {1, 13}}},
  };
}

TYPED_TEST(cuda_backend_gpu, copy_within_a_device) {
  using T = TypeParam;
  for (const auto& [ld, ls] : copy_layouts()) {
    for (queue_kind q : {queue_kind::compute, queue_kind::transfer}) {
      const auto before = this->random(count(ld.storage), -9, 9);
      const auto src_values = this->random(count(ls.storage), -1000, 1000);
      auto dst = this->upload(0, before);
      auto src = this->upload(0, src_values);
      this->be_->copy(0, q, this->type, make_view(dst->data(), ld), 0, make_view(src->data(), ls),
                      0);
      std::vector<T> want;
      for (auto o : offsets_of(ls)) {
        want.push_back(src_values[static_cast<std::size_t>(o)]);
      }
      expect_view(this->download(0, *dst), before, ld, want, 0.0, 0, "copy 0->0");
    }
  }
}

TYPED_TEST(cuda_backend_gpu, copy_between_devices_by_peer_and_nccl) {
  using T = TypeParam;
  if (this->be_->device_count() < 2) {
    GTEST_SKIP() << "needs 2 GPUs, found " << this->be_->device_count();
  }
  const auto stats_before = this->be_->stats();
  std::uint64_t nccl_bytes = 0;
  for (transport how : {transport::peer, transport::nccl, transport::automatic}) {
    for (const auto& [ld, ls] : copy_layouts()) {
      for (int queue_device : {0, 1}) {
        for (queue_kind q : {queue_kind::compute, queue_kind::transfer}) {
          const auto before = this->random(count(ld.storage), -9, 9);
          const auto src_values = this->random(count(ls.storage), -1000, 1000);
          auto dst = this->upload(1, before);
          auto src = this->upload(0, src_values);
          this->be_->copy(queue_device, q, this->type, make_view(dst->data(), ld), 1,
                          make_view(src->data(), ls), 0, how);
          // Ordered on (queue_device, q): an event after it covers the copy.
          this->be_->record(queue_device, q).wait();
          std::vector<T> want;
          for (auto o : offsets_of(ls)) {
            want.push_back(src_values[static_cast<std::size_t>(o)]);
          }
          if (how == transport::nccl && contiguous(ld) && contiguous(ls)) {
            nccl_bytes += static_cast<std::uint64_t>(count(ld.extents)) * sizeof(T);
          }
          expect_view(this->download(1, *dst), before, ld, want, 0.0, 0,
                      "copy 0->1 " + std::string(to_string(how)) + " on device " +
                          std::to_string(queue_device));
        }
      }
    }
  }
  const auto stats_after = this->be_->stats();
  EXPECT_GT(stats_after.copies_peer, stats_before.copies_peer);
  EXPECT_EQ(stats_after.bytes_nccl - stats_before.bytes_nccl, nccl_bytes);
}

TYPED_TEST(cuda_backend_gpu, upload_and_download_strided_views) {
  using T = TypeParam;
  for (const auto& [lh, ld] : copy_layouts()) {
    // Host view lh (inside host storage), device view ld (inside device storage).
    const auto host_values = this->random(count(lh.storage), -1000, 1000);
    const auto before = this->random(count(ld.storage), -9, 9);
    auto dev = this->upload(0, before);
    std::vector<T> host = host_values;
    this->be_->upload(0, this->type, make_view(dev->data(), ld), make_view(host.data(), lh));
    std::vector<T> want;
    for (auto o : offsets_of(lh)) {
      want.push_back(host_values[static_cast<std::size_t>(o)]);
    }
    expect_view(this->download(0, *dev), before, ld, want, 0.0, 0, "upload");
    // And back into a fresh host storage through the same views.
    const auto host_before = this->random(count(lh.storage), -9, 9);
    std::vector<T> back = host_before;
    this->be_->download(0, this->type, make_view(back.data(), lh), make_view(dev->data(), ld));
    expect_view(back, host_before, lh, want, 0.0, 0, "download");
  }
}

// --- events and accounting (one dtype) ---

class cuda_backend_events : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!the_gpu().be) {
      GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
    }
    be_ = the_gpu().be;
  }
  std::shared_ptr<backend> be_;
};

TEST_F(cuda_backend_events, events_order_work_across_queues_and_devices) {
  const int other = be_->device_count() > 1 ? 1 : 0;
  const std::int64_t n = std::int64_t{1} << 25;  // 128 MiB of float: long enough to race
  auto a = be_->allocate(0, static_cast<std::size_t>(n) * 4);
  auto b = be_->allocate(other, static_cast<std::size_t>(n) * 4);
  const view va = view::dense(a->data(), {n});
  const view vb = view::dense(b->data(), {n});
  be_->fill(other, queue_kind::compute, dtype::f32, vb, scalar::of(0.0F));
  be_->synchronize();
  for (int round = 1; round <= 3; ++round) {
    // Several passes on device 0's compute queue, then the copy on the other device's transfer
    // queue, ordered only by the event.
    for (int pass = 0; pass < 4; ++pass) {
      be_->fill(0, queue_kind::compute, dtype::f32, va, scalar::of(static_cast<float>(round)));
      be_->unary(0, queue_kind::compute, dtype::f32, unary_op::abs, va, va);
    }
    const event filled = be_->record(0, queue_kind::compute);
    a->add_use(filled);
    be_->wait(other, queue_kind::transfer, filled);
    be_->copy(other, queue_kind::transfer, dtype::f32, vb, other, va, 0);
    const event copied = be_->record(other, queue_kind::transfer);
    b->add_use(copied);
    copied.wait();
    EXPECT_TRUE(copied.ready());
    EXPECT_TRUE(filled.ready());
    std::vector<float> host(static_cast<std::size_t>(n));
    be_->download(other, dtype::f32, view::dense(host.data(), {n}), vb);
    const auto bad = std::count_if(host.begin(), host.end(),
                                   [round](float x) { return x != static_cast<float>(round); });
    EXPECT_EQ(bad, 0) << "round " << round;
  }
  a.reset();
  b.reset();
  be_->synchronize();
  for (int d = 0; d < be_->device_count(); ++d) {
    EXPECT_EQ(be_->allocator(d).stats().in_use, 0U) << "device " << d;
  }
}

TEST_F(cuda_backend_events, buffers_with_pending_uses_return_after_synchronize) {
  const std::int64_t n = 1 << 20;
  const std::uint64_t ops_before = be_->stats().ops;
  {
    auto buf = be_->allocate(0, static_cast<std::size_t>(n) * 8);
    be_->fill(0, queue_kind::compute, dtype::f64, view::dense(buf->data(), {n}), scalar::of(1.0));
    buf->add_use(be_->record(0, queue_kind::compute));
  }
  be_->synchronize();
  EXPECT_EQ(be_->stats().ops, ops_before + 1);
  EXPECT_EQ(be_->allocator(0).stats().in_use, 0U);
  EXPECT_TRUE(be_->is_gpu());
  EXPECT_EQ(be_->name(), "cuda:" + std::to_string(be_->device_count()));
  EXPECT_FALSE(be_->device_name(0).empty());
  const event empty;
  be_->wait(0, queue_kind::compute, empty);  // an empty event is complete: nothing to wait for
}

// Executables the graph launcher keeps per stream, kernel and block size (graph_launcher::
// per_kernel, darray/src/kernels.hpp).
constexpr std::uint64_t executables_per_kernel = 4;

// Kernels launched as graphs (backend_options::kernel_graphs, the default): a few executables per
// stream, kernel and block size, grids and arguments set at launches while earlier launches of
// them may still be queued. Many sizes (about a hundred grids) on both queues, nothing
// synchronized until the end; then every output against the host, the executables made against
// executables_per_kernel per queue and kernel (fill, mul and neg of dense f32, each on the vector
// path; every job has buffers of its own, so each launch after those sets new arguments), and the
// same work with plain launches (which make none).
TEST(cuda_backend_kernel_graphs, queued_launches_keep_their_own_arguments) {
  if (!the_gpu().be) {
    GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
  }
  for (const bool graphs : {true, false}) {
    backend_options options;
    options.kernel_graphs = graphs;
    const auto be = make_cuda_backend(1, options);
    struct job {
      std::shared_ptr<buffer> in, out;
      std::int64_t n = 0;
      float value = 0;
    };
    std::vector<job> jobs;
    for (int i = 0; i < 300; ++i) {
      job j;
      // Sizes from one block to a few hundred: many grids, most of them seen again later.
      j.n = 1 + (static_cast<std::int64_t>(i) * 7919) % 200 * 1024 + i % 3;
      j.value = static_cast<float>(i % 97) - 40.0F;
      j.in = be->allocate(0, static_cast<std::size_t>(j.n) * 4);
      j.out = be->allocate(0, static_cast<std::size_t>(j.n) * 4);
      const queue_kind q = i % 2 == 0 ? queue_kind::compute : queue_kind::transfer;
      const view in = view::dense(j.in->data(), {j.n});
      const view out = view::dense(j.out->data(), {j.n});
      be->fill(0, q, dtype::f32, in, scalar::of(j.value));
      be->binary(0, q, dtype::f32, binary_op::mul, out, in, in);
      be->unary(0, q, dtype::f32, unary_op::neg, out, out);
      jobs.push_back(std::move(j));
    }
    be->synchronize();
    const std::uint64_t made = graphs ? 2U * 3U * executables_per_kernel : 0U;
    EXPECT_EQ(be->stats().kernel_graphs_made, made);
    EXPECT_EQ(be->stats().kernel_graph_updates, graphs ? 3U * jobs.size() - made : 0U);
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      std::vector<float> host(static_cast<std::size_t>(jobs[i].n));
      be->download(0, dtype::f32, view::dense(host.data(), {jobs[i].n}),
                   view::dense(jobs[i].out->data(), {jobs[i].n}));
      const float want = -jobs[i].value * jobs[i].value;
      const auto bad =
          std::count_if(host.begin(), host.end(), [want](float x) { return x != want; });
      ASSERT_EQ(bad, 0) << "job " << i << " (n " << jobs[i].n << ", graphs " << graphs << ")";
    }
  }
}

// A launch with the grid and arguments of one of its kernel's executables' last launch (an op
// repeated on the same buffers, or alternating among a few) launches that executable as it is;
// more buffers in turn than the executables kept set new arguments. Each phase starts from
// buffers holding -1: the ones it wrote must hold 9, the others still -1 (a launch that ran with
// another buffer's arguments would leave its own at -1).
TEST(cuda_backend_kernel_graphs, repeated_arguments_launch_without_an_update) {
  if (!the_gpu().be) {
    GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
  }
  const auto be = make_cuda_backend(1, backend_options{});
  const std::int64_t n = 5000;
  const auto in = be->allocate(0, static_cast<std::size_t>(n) * 4);
  const view src = view::dense(in->data(), {n});
  be->fill(0, queue_kind::compute, dtype::f32, src, scalar::of(3.0));
  std::vector<std::shared_ptr<buffer>> outs;
  for (std::uint64_t k = 0; k < executables_per_kernel + 2; ++k) {
    outs.push_back(be->allocate(0, static_cast<std::size_t>(n) * 4));
  }
  struct counts {
    std::uint64_t made = 0;
    std::uint64_t updates = 0;
  };
  // `rounds` of out[r % buffers] = in + in, then out += in (two launches of one kernel).
  const auto phase = [&](std::size_t buffers, int rounds) {
    for (const auto& o : outs) {
      be->fill(0, queue_kind::compute, dtype::f32, view::dense(o->data(), {n}), scalar::of(-1.0));
    }
    be->synchronize();
    const backend_stats before = be->stats();
    for (int r = 0; r < rounds; ++r) {
      const view dst = view::dense(outs[static_cast<std::size_t>(r) % buffers]->data(), {n});
      be->binary(0, queue_kind::compute, dtype::f32, binary_op::add, dst, src, src);
      be->binary(0, queue_kind::compute, dtype::f32, binary_op::add, dst, dst, src);
    }
    be->synchronize();
    const backend_stats after = be->stats();
    for (std::size_t k = 0; k < outs.size(); ++k) {
      std::vector<float> host(static_cast<std::size_t>(n));
      be->download(0, dtype::f32, view::dense(host.data(), {n}), view::dense(outs[k]->data(), {n}));
      const float want = k < buffers ? 9.0F : -1.0F;
      EXPECT_EQ(std::count(host.begin(), host.end(), want), n)
          << "buffer " << k << " after " << rounds << " rounds over " << buffers;
    }
    return counts{after.kernel_graphs_made - before.kernel_graphs_made,
                  after.kernel_graph_updates - before.kernel_graph_updates};
  };
  // One buffer: the add's two argument sets, an executable each; then no update.
  const counts one = phase(1, 50);
  EXPECT_EQ(one.made, 2U);
  EXPECT_EQ(one.updates, 0U);
  // Two in turn: two more executables of the add (now executables_per_kernel), no update.
  const counts two = phase(2, 50);
  EXPECT_EQ(two.made, executables_per_kernel - 2);
  EXPECT_EQ(two.updates, 0U);
  // More in turn than the executables kept: new arguments at (nearly) every launch.
  const counts many = phase(outs.size(), 60);
  EXPECT_EQ(many.made, 0U);
  EXPECT_GE(many.updates, 60U);
}

// Ops launch their kept kernel graphs without making the GPU current (cuda_seam.hpp), and switch
// only for a call that needs it (a graph's first launch, a copy by the copy engines). From either
// GPU current, and with a function profiler timing every op's stream: the caller's device is
// current after each op, the values are the host's, and the profiler keeps GPU timing with GPU
// samples of the add (its events come from each stream's own device).
TEST(cuda_backend_devices, ops_leave_the_callers_device_current) {
  if (!the_gpu().be) {
    GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
  }
  if (the_gpu().be->device_count() < 2) {
    GTEST_SKIP() << "needs 2 GPUs (" << the_gpu().be->device_count() << " here)";
  }
  const auto current = [] {
    int d = -1;
    EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
    return d;
  };
  const std::int64_t n = 4096;
  const shape_t shape{n};
  const auto halves = index_map::split(shape, 0, {{0, 0, n / 2}, {1, n / 2, n}});
  const auto skewed = index_map::split(shape, 0, {{0, 0, n * 7 / 10}, {1, n * 7 / 10, n}});
  for (const int caller : {1, 0}) {
    ASSERT_EQ(cudaSetDevice(caller), cudaSuccess);
    // A backend of its own: its first launches instantiate graphs (with the device current), the
    // later ones launch them as they are.
    const auto be = make_cuda_backend(2, backend_options{});
    profiler::function_profiler prof;
    auto a = DistributedArray<float>::full(be, 1.0F, shape, halves);
    const auto b = DistributedArray<float>::full(be, 2.0F, shape, halves);
    const auto c = DistributedArray<float>::full(be, 3.0F, shape, skewed);
    EXPECT_EQ(current(), caller);
    constexpr int steps = 20;
    for (int i = 0; i < steps; ++i) {
      a = a + b;
      EXPECT_EQ(current(), caller) << "after add " << i;
      a = a + c.reshard(a.index_map());  // a small copy between the GPUs by the copy kernel
      EXPECT_EQ(current(), caller) << "after the fused add " << i;
    }
    const auto r = -a;
    const std::vector<float> got = r.to_host();
    EXPECT_EQ(current(), caller);
    const float want = -(1.0F + 5.0F * steps);
    EXPECT_EQ(std::count(got.begin(), got.end(), want), n) << "caller's device " << caller;
    prof.stop();
    const auto report = prof.report(/*wait_for_gpu=*/true);
    EXPECT_TRUE(report.gpu_timing) << "caller's device " << caller;
    const auto add = std::find_if(report.scopes.begin(), report.scopes.end(),
                                  [](const auto& s) { return s.name == "darray.add"; });
    ASSERT_NE(add, report.scopes.end());
    EXPECT_GT(add->gpu_samples, 0U) << "caller's device " << caller;
  }
}

// Arrays over vmm memory (backend_options::resource): the vmm resource grants every peer GPU
// access to the granules it maps (cuMemSetAccess), so pieces move between the GPUs by the copy
// engines, by NCCL and by the copy kernel (small pieces) as over cudaMalloc memory, with the
// values the host computes.
TEST(cuda_backend_devices, arrays_over_vmm_memory_move_between_gpus) {
  if (!the_gpu().be) {
    GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
  }
  if (the_gpu().be->device_count() < 2) {
    GTEST_SKIP() << "needs 2 GPUs (" << the_gpu().be->device_count() << " here)";
  }
  for (const transport how : {transport::peer, transport::nccl, transport::automatic}) {
    backend_options options;
    options.resource = "vmm";
    options.transfers = how;
    const auto be = make_cuda_backend(2, options);
    // Large pieces (copy engines or NCCL) and small ones (the copy kernel on the receiving GPU).
    for (const std::int64_t n : {std::int64_t{3} << 20, std::int64_t{4099}}) {
      const shape_t shape{n};
      const auto halves = index_map::split(shape, 0, {{0, 0, n / 2}, {1, n / 2, n}});
      const auto skewed = index_map::split(shape, 0, {{1, 0, n * 3 / 10}, {0, n * 3 / 10, n}});
      std::vector<float> a_host(static_cast<std::size_t>(n));
      std::vector<float> c_host(a_host.size());
      for (std::size_t i = 0; i < a_host.size(); ++i) {
        a_host[i] = static_cast<float>(i % 1000);
        c_host[i] = static_cast<float>(i % 7) * 0.5F;
      }
      const auto before = be->stats();
      const auto a = DistributedArray<float>::from_host(be, a_host, shape, halves);
      const auto c = DistributedArray<float>::from_host(be, c_host, shape, skewed);
      const std::vector<float> got = (a + c.reshard(a.index_map())).to_host();
      const auto after = be->stats();
      const std::string what = std::string(to_string(how)) + ", n " + std::to_string(n);
      ASSERT_EQ(got.size(), a_host.size()) << what;
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        wrong += got[i] != a_host[i] + c_host[i] ? 1 : 0;
      }
      EXPECT_EQ(wrong, 0U) << what;
      EXPECT_GT(after.copies_peer, before.copies_peer) << what;
      if (how == transport::nccl) {
        EXPECT_GT(after.bytes_nccl, before.bytes_nccl) << what;
      }
    }
    be->synchronize();
    for (int d = 0; d < 2; ++d) {
      EXPECT_GT(be->allocator(d).stats().peak_reserved, 0U) << "device " << d;
      EXPECT_NE(be->allocator(d).upstream().name().find("vmm"), std::string::npos)
          << "device " << d << ": " << be->allocator(d).upstream().name();
    }
  }
}

// Reductions and matmuls of nothing (docs/darray.md, "Modes") on the GPUs: the identity chunk is
// filled and recorded on a CUDA stream, then completed like any partial array.
TEST(cuda_backend_arrays, reductions_and_matmuls_of_nothing_give_the_identity) {
  if (!the_gpu().be) {
    GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
  }
  const auto& be = the_gpu().be;
  const int devices = be->device_count();
  auto empty = distributed_array<double>::from_host(be, std::vector<double>{}, {0},
                                                    index_map::blocks({0}, 0, devices));
  EXPECT_EQ(sum(empty).change_mode(array_mode::replica).to_host(), std::vector<double>{0.0});
  EXPECT_EQ(prod(empty).to_host(), std::vector<double>{1.0});
  EXPECT_THROW((void)max(empty), invalid_argument);
  auto rows = distributed_array<std::int64_t>::from_host(be, std::vector<std::int64_t>{}, {0, 5},
                                                         index_map::blocks({0, 5}, 1, devices));
  EXPECT_EQ(sum(rows, 0).change_mode(array_mode::replica).to_host(),
            std::vector<std::int64_t>(5, 0));
  auto a = distributed_array<float>::from_host(be, std::vector<float>{}, {3, 0},
                                               index_map::grid({3, 0}, 1, 1, {{0}}));
  auto b = distributed_array<float>::from_host(be, std::vector<float>{}, {0, 2},
                                               index_map::grid({0, 2}, 1, 1, {{devices - 1}}));
  EXPECT_EQ(matmul(a, b).change_mode(array_mode::replica).to_host(), std::vector<float>(6, 0.0f));
  be->synchronize();
}

// Integer pow on the GPUs is exact where a double is not (beyond 2^53), saturates, truncates
// negative powers, and matmul takes strided chunks: the same values as the host backend.
TEST(cuda_backend_arrays, integer_pow_and_strided_matmul_match_the_host) {
  if (!the_gpu().be) {
    GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
  }
  using i64 = std::int64_t;
  const auto& be = the_gpu().be;
  const int last = be->device_count() - 1;
  const std::vector<i64> ha{3, -3, 7, -2, 2, 3, -3, -1, -1, 0, 2, 1, 5, 9};
  const std::vector<i64> hb{35, 39, 22, 63, 63, 40, 41, std::numeric_limits<i64>::max(),
                            6,  -1, -1, -9, 0,  19};
  const auto n = static_cast<i64>(ha.size());
  const auto m = index_map::blocks({n}, 0, last + 1);
  auto a = distributed_array<i64>::from_host(be, ha, {n}, m);
  auto b = distributed_array<i64>::from_host(be, hb, {n}, m);
  std::vector<i64> want(ha.size());
  std::vector<i64> want_scalar(ha.size());
  for (std::size_t i = 0; i < ha.size(); ++i) {
    want[i] = test_support::reference_pow(ha[i], hb[i]);
    want_scalar[i] = test_support::reference_pow(ha[i], i64{37});
  }
  EXPECT_EQ(pow(a, b).to_host(), want);
  EXPECT_EQ(pow(a, i64{37}).to_host(), want_scalar);

  const i64 rows = 5, inner = 6, cols = 7;
  std::vector<double> x(static_cast<std::size_t>(rows * inner));
  std::vector<double> y(static_cast<std::size_t>(inner * cols));
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<double>(i % 7) - 3.0;
  }
  for (std::size_t i = 0; i < y.size(); ++i) {
    y[i] = static_cast<double>(i % 5) + 0.5;
  }
  index_map xm;  // every other column on the first GPU, the others on the last
  xm.add(0, box{{slice{0, rows}, slice{0, inner, 2}}});
  xm.add(last, box{{slice{0, rows}, slice{1, inner, 2}}});
  index_map ym = index_map::replicated({inner, cols}, {last});  // plus every third column
  ym.add(0, box{{slice{0, inner}, slice{1, cols, 3}}});
  auto c = matmul(distributed_array<double>::from_host(be, x, {rows, inner}, xm),
                  distributed_array<double>::from_host(be, y, {inner, cols}, ym));
  const auto got = c.change_mode(array_mode::replica).to_host();
  ASSERT_EQ(got.size(), static_cast<std::size_t>(rows * cols));
  for (i64 i = 0; i < rows; ++i) {
    for (i64 j = 0; j < cols; ++j) {
      double w = 0.0;
      for (i64 p = 0; p < inner; ++p) {
        w += x[static_cast<std::size_t>(i * inner + p)] * y[static_cast<std::size_t>(p * cols + j)];
      }
      EXPECT_NEAR(got[static_cast<std::size_t>(i * cols + j)], w, 1e-12) << i << ", " << j;
    }
  }
  be->synchronize();
}

// The semantics of docs/darray.md ("Semantics") on the GPUs: the checks semantics_test.cpp runs on
// host devices.
TEST(cuda_backend_semantics, integers_wrap_divide_by_zero_to_zero_and_saturate) {
  if (!the_gpu().be) {
    GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
  }
  semantics_checks::check_integer_rules(the_gpu().be);
  the_gpu().be->synchronize();
}

TEST(cuda_backend_semantics, floating_division_and_nan_propagation) {
  if (!the_gpu().be) {
    GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
  }
  semantics_checks::check_float_rules(the_gpu().be);
  the_gpu().be->synchronize();
}

TEST(cuda_backend_semantics, partial_operands_and_chunks) {
  if (!the_gpu().be) {
    GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
  }
  semantics_checks::check_partial_operands(the_gpu().be);
  semantics_checks::check_partial_chunks(the_gpu().be);
  the_gpu().be->synchronize();
}

TEST(cuda_backend_factory, bad_device_counts_are_rejected) {
  if (!the_gpu().be) {
    GTEST_SKIP() << "no GPU: " << the_gpu().why_not;
  }
  EXPECT_THROW((void)make_cuda_backend(0), invalid_argument);
  EXPECT_THROW((void)make_cuda_backend(the_gpu().be->device_count() + 1), invalid_argument);
}

TEST(cuda_backend_factory, without_a_gpu_make_cuda_backend_throws_device_unavailable) {
  if (the_gpu().be) {
    GTEST_SKIP() << "a GPU is present";
  }
  EXPECT_THROW((void)make_cuda_backend(-1), device_unavailable);
}

}  // namespace
}  // namespace poolscope::darray
