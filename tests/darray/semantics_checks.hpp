// The semantics that docs/darray.md ("Semantics") states, as checks that run on any backend: the
// host backend (semantics_test.cpp) and the CUDA backend (cuda_backend_gpu_test.cpp) each run them,
// so both are held to one statement. Expected values are written out here or computed by the
// reference arithmetic below (unsigned wrap-around, written independently of the backends).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "poolscope/darray/distributed_array.hpp"

namespace poolscope::darray::semantics_checks {

// --- reference arithmetic ---

template <typename T>
T wrapped(std::uint64_t v) {
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(v));
}
template <typename T>
T ref_add(T a, T b) {
  return wrapped<T>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}
template <typename T>
T ref_sub(T a, T b) {
  return wrapped<T>(static_cast<std::uint64_t>(a) - static_cast<std::uint64_t>(b));
}
template <typename T>
T ref_mul(T a, T b) {
  return wrapped<T>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
}
template <typename T>
T ref_div(T a, T b) {
  if (b == 0) {
    return 0;
  }
  if (b == -1) {
    return ref_sub<T>(0, a);
  }
  return static_cast<T>(a / b);  // C++ truncates toward zero
}

// A 1-D map of `n` elements in blocks over up to two of the backend's devices.
inline index_map two_blocks(std::int64_t n, const backend& be) {
  return index_map::blocks({n}, 0, be.device_count() > 1 ? 2 : 1);
}

// The second device of a two-device map (the first when there is one).
inline int second_device(const backend& be) {
  return be.device_count() > 1 ? 1 : 0;
}

template <typename T>
void check_wrapping_elementwise(const std::shared_ptr<backend>& be) {
  SCOPED_TRACE(sizeof(T) == 4 ? "int32" : "int64");
  constexpr T max = std::numeric_limits<T>::max();
  constexpr T min = std::numeric_limits<T>::min();
  const std::vector<T> ha{max, min, -7, 7, min, 5, 0, -1, max, 3};
  const std::vector<T> hb{1, -1, 2, -2, -1, 0, 0, min, max, -4};
  const auto n = static_cast<std::int64_t>(ha.size());
  const auto m = two_blocks(n, *be);
  const auto a = distributed_array<T>::from_host(be, ha, {n}, m);
  const auto b = distributed_array<T>::from_host(be, hb, {n}, m);
  std::vector<T> add(ha.size()), sub(ha.size()), mul(ha.size()), div(ha.size()), neg(ha.size()),
      abs(ha.size());
  for (std::size_t i = 0; i < ha.size(); ++i) {
    add[i] = ref_add(ha[i], hb[i]);
    sub[i] = ref_sub(ha[i], hb[i]);
    mul[i] = ref_mul(ha[i], hb[i]);
    div[i] = ref_div(ha[i], hb[i]);
    neg[i] = ref_sub<T>(0, ha[i]);
    abs[i] = ha[i] < 0 ? ref_sub<T>(0, ha[i]) : ha[i];
  }
  EXPECT_EQ((a + b).to_host(), add);
  EXPECT_EQ((a - b).to_host(), sub);
  EXPECT_EQ((a * b).to_host(), mul);
  EXPECT_EQ((a / b).to_host(), div);
  EXPECT_EQ((-a).to_host(), neg);
  EXPECT_EQ(darray::abs(a).to_host(), abs);
  // The cases the rules name, written out.
  EXPECT_EQ(add[0], min);    // MAX + 1
  EXPECT_EQ(div[1], min);    // MIN / -1
  EXPECT_EQ(div[2], T{-3});  // -7 / 2 truncates toward zero
  EXPECT_EQ(div[5], T{0});   // 5 / 0
  EXPECT_EQ(div[6], T{0});   // 0 / 0
  EXPECT_EQ(abs[1], min);    // abs(MIN)
  EXPECT_EQ(mul[8], T{1});   // MAX * MAX = 1 modulo 2^bits
  // Scalars on either side follow the same rules.
  EXPECT_EQ((a + T{1}).to_host()[0], min);
  EXPECT_EQ((T{0} - a).to_host()[1], min);
  EXPECT_EQ((a / T{0}).to_host(), std::vector<T>(ha.size(), T{0}));
}

template <typename T>
void check_wrapping_reductions(const std::shared_ptr<backend>& be) {
  SCOPED_TRACE(sizeof(T) == 4 ? "int32" : "int64");
  constexpr T max = std::numeric_limits<T>::max();
  constexpr T min = std::numeric_limits<T>::min();
  // One element per device at least: partial sums of different devices combine.
  const std::vector<T> h{max, max, 2, max, min, T{-5}};
  const auto n = static_cast<std::int64_t>(h.size());
  const auto a = distributed_array<T>::from_host(be, h, {n}, two_blocks(n, *be));
  T sum = 0;
  T prod = 1;
  for (const T v : h) {
    sum = ref_add(sum, v);
    prod = ref_mul(prod, v);
  }
  EXPECT_EQ(darray::sum(a).change_mode(array_mode::replica).to_host(), std::vector<T>{sum});
  EXPECT_EQ(darray::prod(a).change_mode(array_mode::replica).to_host(), std::vector<T>{prod});
  EXPECT_EQ(darray::max(a).change_mode(array_mode::replica).to_host(), std::vector<T>{max});
  EXPECT_EQ(darray::min(a).change_mode(array_mode::replica).to_host(), std::vector<T>{min});
  // 2^(bits/2) squared is 0 modulo 2^bits.
  const T half = static_cast<T>(T{1} << (sizeof(T) * 4));
  const auto sq =
      distributed_array<T>::from_host(be, std::vector<T>{half, half}, {2}, two_blocks(2, *be));
  EXPECT_EQ(darray::prod(sq).change_mode(array_mode::replica).to_host(), std::vector<T>{0});
  // matmul wraps: [MAX 1] @ [1 1]^T = MAX + 1 = MIN.
  const auto row = distributed_array<T>::from_host(be, std::vector<T>{max, 1}, {1, 2},
                                                   index_map::blocks({1, 2}, 1, 1));
  const auto col = distributed_array<T>::from_host(be, std::vector<T>{1, 1}, {2, 1},
                                                   index_map::blocks({2, 1}, 0, 1));
  EXPECT_EQ(matmul(row, col).change_mode(array_mode::replica).to_host(), std::vector<T>{min});
}

template <typename T>
void check_saturating_math(const std::shared_ptr<backend>& be) {
  SCOPED_TRACE(sizeof(T) == 4 ? "int32" : "int64");
  constexpr T max = std::numeric_limits<T>::max();
  constexpr T min = std::numeric_limits<T>::min();
  const std::vector<T> h{100, -100, 0, 1, -1, 16, 17, 3};
  const auto n = static_cast<std::int64_t>(h.size());
  const auto a = distributed_array<T>::from_host(be, h, {n}, two_blocks(n, *be));
  EXPECT_EQ(darray::exp(a).to_host(), (std::vector<T>{max, 0, 1, 2, 0, 8886110, 24154952, 20}));
  EXPECT_EQ(darray::log(a).to_host(), (std::vector<T>{4, 0, min, 0, 0, 2, 2, 1}));
  EXPECT_EQ(darray::sqrt(a).to_host(), (std::vector<T>{10, 0, 0, 1, 0, 4, 4, 1}));
  EXPECT_EQ(darray::sin(a).to_host(), (std::vector<T>{0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(darray::cos(a).to_host(), (std::vector<T>{0, 0, 1, 0, 0, 0, 0, 0}));
}

inline void check_integer_rules(const std::shared_ptr<backend>& be) {
  check_wrapping_elementwise<std::int32_t>(be);
  check_wrapping_elementwise<std::int64_t>(be);
  check_wrapping_reductions<std::int32_t>(be);
  check_wrapping_reductions<std::int64_t>(be);
  check_saturating_math<std::int32_t>(be);
  check_saturating_math<std::int64_t>(be);
}

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <typename T>
void check_float_rules_of(const std::shared_ptr<backend>& be) {
  SCOPED_TRACE(sizeof(T) == 4 ? "float" : "double");
  const T inf = std::numeric_limits<T>::infinity();
  // Two NaNs told apart by their sign: which one comes out is part of the rule.
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const T other_nan = -nan;
  const std::vector<T> ha{1, -1, 0, nan, 1, other_nan, 2, -0.0F};
  const std::vector<T> hb{0, 0, 0, 1, nan, nan, 3, 0};
  const auto n = static_cast<std::int64_t>(ha.size());
  const auto m = two_blocks(n, *be);
  const auto a = distributed_array<T>::from_host(be, ha, {n}, m);
  const auto b = distributed_array<T>::from_host(be, hb, {n}, m);
  const auto q = (a / b).to_host();
  EXPECT_EQ(q[0], inf);
  EXPECT_EQ(q[1], -inf);
  EXPECT_TRUE(std::isnan(q[2]));
  for (const auto& r : {maximum(a, b).to_host(), minimum(a, b).to_host()}) {
    EXPECT_TRUE(same_bits(r[3], nan));
    EXPECT_TRUE(same_bits(r[4], nan));
    EXPECT_TRUE(same_bits(r[5], other_nan)) << "the first NaN of the two";
  }
  EXPECT_EQ(maximum(a, b).to_host()[6], T{3});
  EXPECT_EQ(minimum(a, b).to_host()[6], T{2});
  // The reductions propagate NaN too.
  EXPECT_TRUE(std::isnan(darray::max(a).change_mode(array_mode::replica).to_host()[0]));
  EXPECT_TRUE(std::isnan(darray::min(b).change_mode(array_mode::replica).to_host()[0]));
}

inline void check_float_rules(const std::shared_ptr<backend>& be) {
  check_float_rules_of<float>(be);
  check_float_rules_of<double>(be);
}

// x: 6 x 4 int64, x[r][c] = 10 r + c + 1, rows [0, 4) on the first device and rows [2, 6) on the
// second (rows 2 and 3 replicated).
struct overlapping_rows {
  std::vector<std::int64_t> host;
  distributed_array<std::int64_t> x;
};

inline overlapping_rows make_overlapping_rows(const std::shared_ptr<backend>& be) {
  overlapping_rows o;
  for (std::int64_t r = 0; r < 6; ++r) {
    for (std::int64_t c = 0; c < 4; ++c) {
      o.host.push_back(10 * r + c + 1);
    }
  }
  index_map m;
  m.add(0, box{{slice{0, 4}, slice{0, 4}}});
  m.add(second_device(*be), box{{slice{2, 6}, slice{0, 4}}});
  o.x = distributed_array<std::int64_t>::from_host(be, o.host, {6, 4}, m);
  return o;
}

// Column sums of rows [from, to) of the overlapping_rows values.
inline std::vector<std::int64_t> column_sums(std::int64_t from, std::int64_t to) {
  std::vector<std::int64_t> out(4, 0);
  for (std::int64_t r = from; r < to; ++r) {
    for (std::int64_t c = 0; c < 4; ++c) {
      out[static_cast<std::size_t>(c)] += 10 * r + c + 1;
    }
  }
  return out;
}

// Every op completes a partial operand first; the partial array stays as it was.
inline void check_partial_operands(const std::shared_ptr<backend>& be) {
  const auto o = make_overlapping_rows(be);
  const auto p = darray::sum(o.x, 0);  // partial sum of shape (4,)
  ASSERT_EQ(p.mode(), array_mode::sum);
  const std::vector<std::int64_t> total = column_sums(0, 6);
  const auto plus = [&](std::int64_t k) {
    std::vector<std::int64_t> v = total;
    for (auto& e : v) {
      e += k;
    }
    return v;
  };
  const auto expect_replica = [](const distributed_array<std::int64_t>& r,
                                 const std::vector<std::int64_t>& want, const char* what) {
    EXPECT_EQ(r.mode(), array_mode::replica) << what;
    EXPECT_EQ(r.to_host(), want) << what;
  };
  expect_replica(p + std::int64_t{1}, plus(1), "p + 1");
  expect_replica(std::int64_t{1} + p, plus(1), "1 + p");
  expect_replica(
      p + p,
      [&] {
        std::vector<std::int64_t> v = total;
        for (auto& e : v) {
          e *= 2;
        }
        return v;
      }(),
      "p + p");
  const auto r = distributed_array<std::int64_t>::full(be, 5, {4}, two_blocks(4, *be));
  expect_replica(p + r, plus(5), "p + replica");
  expect_replica(r + p, plus(5), "replica + p");
  expect_replica(-(-p), total, "-(-p)");
  expect_replica(p.reshard(two_blocks(4, *be)), total, "p.reshard(blocks)");
  EXPECT_EQ(p.to_host(), total) << "to_host completes";
  // A reduction of a partial array reduces the completed values: a partial array of its own.
  std::int64_t all = 0;
  for (const std::int64_t v : total) {
    all += v;
  }
  const auto s = darray::sum(p);
  EXPECT_EQ(s.mode(), array_mode::sum);
  EXPECT_EQ(s.change_mode(array_mode::replica).to_host(), std::vector<std::int64_t>{all});
  const auto mx = darray::max(p);
  EXPECT_EQ(mx.change_mode(array_mode::replica).to_host(),
            std::vector<std::int64_t>{*std::max_element(total.begin(), total.end())});
  // matmul of a partial operand (a matmul's own partial sum): q @ I equals q completed.
  const std::vector<std::int64_t> ha{1, 2, 3, 4};
  const std::vector<std::int64_t> hb{5, 6, 7, 8};
  const std::vector<std::int64_t> eye{1, 0, 0, 1};
  const auto grid = index_map::grid({2, 2}, 1, 2, {{0, second_device(*be)}});
  const auto q = matmul(distributed_array<std::int64_t>::from_host(be, ha, {2, 2}, grid),
                        distributed_array<std::int64_t>::from_host(be, hb, {2, 2}, grid));
  ASSERT_EQ(q.mode(), array_mode::sum);
  const std::vector<std::int64_t> ab{19, 22, 43, 50};
  const auto qi = matmul(q, distributed_array<std::int64_t>::from_host(be, eye, {2, 2}, grid));
  EXPECT_EQ(qi.change_mode(array_mode::replica).to_host(), ab);
  // The partial array itself is unchanged by the ops above.
  EXPECT_EQ(p.mode(), array_mode::sum);
  EXPECT_EQ(p.chunk_to_host(0), column_sums(0, 4));
}

// chunk_to_host copies a partial array's chunk as it is: that chunk's own contribution, the
// identity where it owns nothing.
inline void check_partial_chunks(const std::shared_ptr<backend>& be) {
  const auto o = make_overlapping_rows(be);
  const auto p = darray::sum(o.x, 0);
  ASSERT_EQ(p.chunks().size(), 2U);
  // The first chunk owns rows 0-3, the second only rows 4 and 5 (2 and 3 are the first's).
  EXPECT_EQ(p.chunk_to_host(0), column_sums(0, 4));
  EXPECT_EQ(p.chunk_to_host(1), column_sums(4, 6));
  // Columns: chunk 0 holds columns [0, 2), chunk 1 columns [0, 4) (0 and 1 replicated): a max
  // over axis 0 leaves chunk 1 the identity (the lowest value) in the columns it does not own.
  std::vector<std::int64_t> h(24);
  for (std::size_t i = 0; i < h.size(); ++i) {
    h[i] = static_cast<std::int64_t>(i) - 12;
  }
  index_map cols;
  cols.add(0, box{{slice{0, 6}, slice{0, 2}}});
  cols.add(second_device(*be), box{{slice{0, 6}, slice{0, 4}}});
  const auto y = distributed_array<std::int64_t>::from_host(be, h, {6, 4}, cols);
  const auto mx = darray::max(y, 0);
  const std::int64_t lowest = std::numeric_limits<std::int64_t>::lowest();
  EXPECT_EQ(mx.chunk_to_host(0), (std::vector<std::int64_t>{8, 9}));
  EXPECT_EQ(mx.chunk_to_host(1), (std::vector<std::int64_t>{lowest, lowest, 10, 11}));
  EXPECT_EQ(mx.to_host(), (std::vector<std::int64_t>{8, 9, 10, 11}));
}

}  // namespace poolscope::darray::semantics_checks
