// A host-only consumer of an installed poolscope: a BFC pool over plain host memory, and
// distributed arrays on host devices (no GPU, no CUDA headers, no CUDA toolkit to build it; the
// install test configures it with the CUDA toolkit and NCCL hidden from CMake). Checks every value
// against the host and exits 1 on a mismatch.
//
//   host_only
#include <poolscope/darray/backend.hpp>
#include <poolscope/darray/distributed_array.hpp>
#include <poolscope/pool/bfc_allocator.hpp>
#include <poolscope/pool/host_resource.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

namespace {

// A BFC pool over host memory: blocks are reused after their free, and the stats say so.
bool pool_on_host_memory() {
  poolscope::pool::host_resource host{std::size_t{64} << 20};
  poolscope::pool::bfc_allocator pool{host};
  const poolscope::stream_view stream{};
  for (int i = 0; i < 100; ++i) {
    void* p = pool.allocate(stream, std::size_t{1} << 20);
    static_cast<unsigned char*>(p)[0] = 1;
    pool.deallocate(stream, p, std::size_t{1} << 20);
  }
  const auto s = pool.stats();
  if (s.upstream_allocs != 1 || s.in_use != 0) {
    std::fprintf(stderr,
                 "host_only: 100 alloc/free pairs of 1 MiB took %llu upstream allocations\n",
                 static_cast<unsigned long long>(s.upstream_allocs));
    return false;
  }
  return true;
}

// int64 arrays on three host devices: a reshard that moves part of the data, an op, a reduction.
bool arrays_on_host_devices() {
  using namespace poolscope::darray;
  auto be = make_host_backend(3);
  const std::int64_t n = 3000;
  std::vector<std::int64_t> a_host(static_cast<std::size_t>(n));
  std::vector<std::int64_t> b_host(static_cast<std::size_t>(n));
  std::int64_t want_total = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    a_host[static_cast<std::size_t>(i)] = i;
    b_host[static_cast<std::size_t>(i)] = 3 * i - 7;
    want_total += 4 * i - 7;
  }
  const auto a =
      distributed_array<std::int64_t>::from_host(be, a_host, {n}, index_map::blocks({n}, 0, 3));
  const auto b = distributed_array<std::int64_t>::from_host(
      be, b_host, {n}, index_map::split({n}, 0, {{2, 0, 1000}, {0, 1000, 2500}, {1, 2500, n}}));
  const auto c = a + b.reshard(a.index_map());
  const std::vector<std::int64_t> out = c.to_host();
  for (std::int64_t i = 0; i < n; ++i) {
    if (out[static_cast<std::size_t>(i)] != 4 * i - 7) {
      std::fprintf(stderr, "host_only: element %lld is %lld, expected %lld\n",
                   static_cast<long long>(i),
                   static_cast<long long>(out[static_cast<std::size_t>(i)]),
                   static_cast<long long>(4 * i - 7));
      return false;
    }
  }
  const std::int64_t total = sum(c).change_mode(array_mode::replica).to_host()[0];
  if (total != want_total) {
    std::fprintf(stderr, "host_only: sum %lld, expected %lld\n", static_cast<long long>(total),
                 static_cast<long long>(want_total));
    return false;
  }
  std::printf("host_only on %s: a + b.reshard(a.index_map()) and its sum checked\n",
              be->name().c_str());
  return true;
}

}  // namespace

int main() {
  try {
    if (!pool_on_host_memory() || !arrays_on_host_devices()) {
      return 1;
    }
    std::printf("host_only: bfc over host memory checked\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "host_only: %s\n", e.what());
    return 1;
  }
}
