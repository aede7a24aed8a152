#include <gtest/gtest.h>

#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"

TEST(smoke, best_fit_reuses) {
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator a{host};
  void* p = a.allocate({}, 1000);
  a.deallocate({}, p, 1000);
  void* q = a.allocate({}, 700);
  EXPECT_EQ(p, q);
  a.deallocate({}, q, 700);
}
