// The seed example of poolscope::darray, built against an installed poolscope: A + C resharded to
// A's map, on every GPU present (or on 2 host devices without one), then an all-reduced sum.
// Checks every value against the host and exits 1 on a mismatch.
//
//   distributed_add [DEVICES]     (default "auto": every GPU, else host:2)
#include <poolscope/darray/backend.hpp>
#include <poolscope/darray/distributed_array.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <tuple>
#include <vector>

int main(int argc, char** argv) {
  using namespace poolscope::darray;
  try {
    const std::string spec = argc > 1 ? argv[1] : "auto";
    auto be = make_backend(spec);
    const auto devices = static_cast<std::int64_t>(be->device_count());
    const std::int64_t n = std::int64_t{1} << 20;
    std::vector<float> a_host(static_cast<std::size_t>(n));
    std::vector<float> c_host(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      a_host[static_cast<std::size_t>(i)] = static_cast<float>(i % 7);
      c_host[static_cast<std::size_t>(i)] = static_cast<float>(i % 5);
    }
    // A in equal blocks; C's inner boundaries at (k + 0.4) blocks: 0.7 N on two devices.
    std::vector<std::tuple<int, std::int64_t, std::int64_t>> cuts;
    const auto boundary = [&](std::int64_t k) {
      return k == 0 ? 0 : k == devices ? n : (10 * k + 4) * n / (10 * devices);
    };
    for (std::int64_t k = 0; k < devices; ++k) {
      cuts.emplace_back(static_cast<int>(k), boundary(k), boundary(k + 1));
    }
    auto a = distributed_array<float>::from_host(be, a_host, {n},
                                                 index_map::blocks({n}, 0, be->device_count()));
    auto c = distributed_array<float>::from_host(be, c_host, {n}, index_map::split({n}, 0, cuts));
    const auto d = a + c.reshard(a.index_map());
    const std::vector<float> out = d.to_host();
    double expected_total = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const float want = a_host[k] + c_host[k];
      expected_total += want;
      if (out[k] != want) {
        std::fprintf(stderr, "distributed_add: element %lld is %g, expected %g\n",
                     static_cast<long long>(i), static_cast<double>(out[k]),
                     static_cast<double>(want));
        return 1;
      }
    }
    const double total = sum(d).change_mode(array_mode::replica).to_host()[0];
    // Every partial sum is an integer below 2^24 (about 5.2 M in all): exact in float, in any
    // order of the reduction.
    if (total != expected_total) {
      std::fprintf(stderr, "distributed_add: sum %.1f, expected %.1f\n", total, expected_total);
      return 1;
    }
    std::printf(
        "distributed_add on %s: %lld elements, A + C.reshard(A.index_map()) checked, sum %.0f\n",
        be->name().c_str(), static_cast<long long>(n), total);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_add: %s\n", e.what());
    return 1;
  }
}
