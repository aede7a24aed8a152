// Resource contracts checked on any machine. A negative device ordinal is wrong everywhere, so
// cuda_resource and cuda_async_resource report invalid_argument naming it even without a GPU
// (they used to say device_unavailable, hiding the caller's mistake behind the machine's).
// host_resource: its capacity counts the bytes asked for (what allocators report as reserved),
// and destroying it leaves live blocks alone (resource.hpp used to say it freed them).
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/pool/cuda_async_resource.hpp"
#include "poolscope/pool/cuda_resource.hpp"
#include "poolscope/pool/host_resource.hpp"

namespace poolscope::pool::testing {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

template <typename Make>
void refuses_negative_device(Make make, const char* who, int device) {
  try {
    make(device);
    ADD_FAILURE() << who << " accepted device " << device;
  } catch (const invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), who)) << e.what();
    EXPECT_TRUE(contains(e.what(), "device " + std::to_string(device))) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << who << "(" << device
                  << ") threw something other than invalid_argument: " << e.what();
  }
}

TEST(resource_arguments, a_negative_device_is_an_invalid_argument_with_or_without_a_gpu) {
  for (const int device : {-1, -7}) {
    refuses_negative_device([](int d) { cuda_resource r{d}; }, "cuda_resource", device);
    refuses_negative_device([](int d) { cuda_async_resource r{d}; }, "cuda_async_resource", device);
  }
}

TEST(host_resource_capacity, counts_and_bounds_the_bytes_asked_for) {
  // Reference: the running sum of the sizes asked for, kept here.
  const std::vector<std::size_t> sizes{1, 255, 256, 257, 1000, 4096, 65535, 65537, 100000};
  host_resource host;
  std::vector<void*> blocks;
  std::size_t expected = 0;
  for (const std::size_t bytes : sizes) {
    void* p = host.try_allocate({}, bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0U) << bytes;
    blocks.push_back(p);
    expected += bytes;
    EXPECT_EQ(host.allocated_bytes(), expected) << "after a block of " << bytes;
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    host.deallocate({}, blocks[i], sizes[i]);
  }
  EXPECT_EQ(host.allocated_bytes(), 0U);

  // 1024 bytes of capacity: three blocks of 257 (771 asked for) fit, then 253 more, not 254.
  host_resource capped{1024};
  std::vector<void*> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(capped.try_allocate({}, 257));
    ASSERT_NE(held.back(), nullptr) << i;
  }
  EXPECT_EQ(capped.try_allocate({}, 254), nullptr) << "771 + 254 = 1025 > 1024";
  EXPECT_EQ(capped.allocated_bytes(), 771U) << "a refused request must leave no trace";
  void* last = capped.try_allocate({}, 253);
  EXPECT_NE(last, nullptr) << "771 + 253 = 1024 fits";
  EXPECT_EQ(capped.try_allocate({}, 1), nullptr);
  for (void* p : held) {
    capped.deallocate({}, p, 257);
  }
  if (last != nullptr) {
    capped.deallocate({}, last, 253);
  }
  EXPECT_EQ(capped.allocated_bytes(), 0U);
}

TEST(host_resource_name, is_host_or_host_colon_key) {
  EXPECT_EQ(host_resource{}.name(), "host");
  EXPECT_EQ((host_resource{1 << 20, 3}.name()), "host:3");
  EXPECT_EQ((host_resource{1 << 20, 3}.device()), -1);
}

TEST(host_resource_ownership, destroying_it_leaves_live_blocks_usable) {
  constexpr std::size_t bytes = std::size_t{1} << 20;  // page-backed (>= 64 KiB)
  void* p = nullptr;
  {
    host_resource host{4 * bytes};
    p = host.try_allocate({}, bytes);
    ASSERT_NE(p, nullptr);
  }
  // Freed by the resource, these writes would fault (the pages would be unmapped).
  auto* bytes_p = static_cast<unsigned char*>(p);
  std::memset(bytes_p, 0x5a, bytes);
  EXPECT_EQ(bytes_p[0], 0x5a);
  EXPECT_EQ(bytes_p[bytes - 1], 0x5a);
  ::munmap(p, bytes);  // the caller still owned it: give it back as host_resource would have
}

}  // namespace
}  // namespace poolscope::pool::testing
