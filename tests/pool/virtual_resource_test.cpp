// The virtual resources (virtual_resource.hpp) on the CPU, through host_vmm_resource, which shares
// all its logic with vmm_resource: reservation, map and unmap, the capacity, bad arguments, and
// the plain-resource face. The memory's state is checked independently of the resource's own
// books: by touching it (a mapped granule is writable) and with mincore(2) (an unmapped one holds
// no pages).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/pool/host_vmm_resource.hpp"
#include "poolscope/pool/vmm_resource.hpp"

namespace poolscope::pool::testing {
namespace {

constexpr std::size_t granule = std::size_t{64} << 10;

host_vmm_resource small_resource(std::size_t capacity = SIZE_MAX) {
  return host_vmm_resource{{.address_range_bytes = std::size_t{64} << 20,
                            .granule_bytes = granule,
                            .capacity = capacity}};
}

/// Pages of [p, p + bytes) resident in memory, by mincore(2).
std::size_t resident_pages(void* p, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((bytes + page - 1) / page);
  EXPECT_EQ(::mincore(p, bytes, v.data()), 0) << std::strerror(errno);
  std::size_t n = 0;
  for (const unsigned char c : v) {
    n += c & 1;
  }
  return n;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(host_vmm_resource, maps_and_unmaps_granules_of_a_reserved_range) {
  auto r = small_resource();
  EXPECT_EQ(r.granularity(), granule);
  EXPECT_EQ(r.name(), "host_vmm");
  EXPECT_EQ(r.device(), -1);
  auto* p = static_cast<char*>(r.reserve(4 * granule));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % granule, 0U);
  EXPECT_FALSE(r.is_mapped(p));
  EXPECT_EQ(r.mapped_bytes(), 0U);

  ASSERT_TRUE(r.map(p + granule, 2 * granule));
  EXPECT_FALSE(r.is_mapped(p));
  EXPECT_TRUE(r.is_mapped(p + granule));
  EXPECT_TRUE(r.is_mapped(p + 3 * granule - 1));
  EXPECT_FALSE(r.is_mapped(p + 3 * granule));
  std::memset(p + granule, 0xab, 2 * granule);  // writable: a fault here fails the test
  EXPECT_EQ(resident_pages(p + granule, 2 * granule) * static_cast<std::size_t>(getpagesize()),
            2 * granule);
  EXPECT_EQ(r.mapped_bytes(), 2 * granule);
  EXPECT_EQ(r.allocated_bytes(), 2 * granule);

  r.unmap(p + granule, granule);
  EXPECT_EQ(resident_pages(p + granule, granule), 0U) << "an unmapped granule kept its pages";
  EXPECT_EQ(static_cast<unsigned char>(p[2 * granule]), 0xab) << "the neighbour lost its data";
  EXPECT_EQ(r.mapped_bytes(), granule);
  const virtual_counts c = r.counts();
  EXPECT_EQ(c.maps, 1U);
  EXPECT_EQ(c.unmaps, 1U);
  EXPECT_EQ(c.peak_mapped, 2 * granule);
  EXPECT_EQ(c.address_bytes, 4 * granule);
  EXPECT_EQ(c.address_range, std::size_t{64} << 20);

  r.unmap(p, 4 * granule);  // covers the rest, and granules never mapped
  EXPECT_EQ(r.mapped_bytes(), 0U);
  EXPECT_EQ(r.allocated_bytes(), 0U);
  r.unreserve(p, 4 * granule);
  EXPECT_EQ(r.counts().address_bytes, 0U);
}

TEST(host_vmm_resource, a_range_grows_in_place_while_the_addresses_after_it_are_free) {
  auto r = small_resource();
  auto* a = static_cast<char*>(r.reserve(2 * granule));
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(r.extend(a + 2 * granule, granule));
  auto* b = static_cast<char*>(r.reserve(granule));
  EXPECT_EQ(b, a + 3 * granule) << "first fit from the lowest address";
  EXPECT_FALSE(r.extend(a + 3 * granule, granule)) << "b holds those addresses";
  r.unreserve(a, 3 * granule);
  auto* c = static_cast<char*>(r.reserve(3 * granule));
  EXPECT_EQ(c, a) << "a freed range coalesces and is reused";
  r.unreserve(b, granule);
  r.unreserve(c, 3 * granule);
  EXPECT_EQ(r.reserve(std::size_t{64} << 20), a) << "everything free again: one range";
}

TEST(host_vmm_resource, a_capacity_bounds_the_bytes_mapped) {
  auto r = small_resource(3 * granule);
  auto* p = static_cast<char*>(r.reserve(8 * granule));
  ASSERT_TRUE(r.map(p, 2 * granule));
  EXPECT_FALSE(r.map(p + 2 * granule, 2 * granule)) << "past the capacity";
  EXPECT_FALSE(r.is_mapped(p + 2 * granule)) << "a refused map left something mapped";
  EXPECT_EQ(r.mapped_bytes(), 2 * granule);
  EXPECT_EQ(r.counts().map_failures, 1U);
  EXPECT_TRUE(r.map(p + 2 * granule, granule)) << "up to the capacity";
  EXPECT_EQ(r.try_allocate({}, 1), nullptr) << "try_allocate maps a whole granule: none is left";
  r.unmap(p, 3 * granule);
  r.unreserve(p, 8 * granule);
}

TEST(host_vmm_resource, as_a_plain_resource_allocates_whole_mapped_granules) {
  auto r = small_resource();
  constexpr std::size_t bytes = granule + 1000;
  void* p = r.try_allocate({}, bytes);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, bytes);
  EXPECT_EQ(r.allocated_bytes(), bytes) << "counts what was asked for, as host_resource does";
  EXPECT_EQ(r.mapped_bytes(), 2 * granule) << "maps what it takes";
  EXPECT_EQ(r.try_allocate({}, std::size_t{65} << 20), nullptr) << "larger than the reservation";
  r.deallocate({}, p, bytes);
  EXPECT_EQ(r.allocated_bytes(), 0U);
  EXPECT_EQ(r.mapped_bytes(), 0U);
  EXPECT_EQ(r.counts().address_bytes, 0U);
}

TEST(host_vmm_resource, bad_arguments_are_typed_errors_naming_the_value) {
  try {
    host_vmm_resource bad{{.granule_bytes = 1000}};
    ADD_FAILURE() << "a granule of 1000 bytes was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "granule_bytes = 1000")) << e.what();
  }
  EXPECT_THROW(host_vmm_resource({.address_range_bytes = 0}), invalid_argument);
  auto r = small_resource();
  try {
    (void)r.reserve(granule + 512);
    ADD_FAILURE() << "a reservation of a granule and a half was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), std::to_string(granule + 512))) << e.what();
  }
  auto* p = static_cast<char*>(r.reserve(2 * granule));
  EXPECT_THROW((void)r.map(p + 512, granule), invalid_argument) << "misaligned";
  int outside = 0;
  EXPECT_THROW((void)r.map(&outside, granule), invalid_argument) << "outside the reservation";
  ASSERT_TRUE(r.map(p, granule));
  try {
    (void)r.map(p, granule);
    ADD_FAILURE() << "a granule was mapped twice";
  } catch (const invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "mapped already")) << e.what();
  }
  EXPECT_EQ(r.mapped_bytes(), granule);
  r.unmap(p, granule);
  r.unreserve(p, 2 * granule);
}

TEST(host_vmm_resource, destruction_gives_back_what_is_still_mapped) {
  std::size_t before = 0;
  {
    auto r = small_resource();
    auto* p = static_cast<char*>(r.reserve(4 * granule));
    ASSERT_TRUE(r.map(p, 4 * granule));
    std::memset(p, 7, 4 * granule);
    before = r.mapped_bytes();
  }
  EXPECT_EQ(before, 4 * granule);  // and the destructor neither crashed nor leaked (ASan)
}

TEST(vmm_resource, a_bad_device_is_named_and_no_gpu_is_device_unavailable) {
  try {
    vmm_resource r{-2};
    ADD_FAILURE() << "device -2 was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "device -2")) << e.what();
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    EXPECT_THROW(vmm_resource{0}, device_unavailable);
    return;
  }
  // With a GPU: the resource reports what the driver says.
  vmm_resource r{0};
  EXPECT_EQ(r.device(), 0);
  EXPECT_EQ(r.name(), "vmm:0");
  EXPECT_GT(r.granularity(), 0U);
  EXPECT_GE(r.address_range(), r.granularity());
}

}  // namespace
}  // namespace poolscope::pool::testing
