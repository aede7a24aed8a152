// POOLSCOPE_ENABLE_SCOPES=0: this translation unit is compiled as a build with the scopes
// switched off (-DPOOLSCOPE_ENABLE_SCOPES=OFF defines it for every user of the profiler). The
// macros must expand to nothing: the static_assert below only compiles if they do (a scope
// object or a static site is not allowed in a constant expression).
#undef POOLSCOPE_ENABLE_SCOPES
#define POOLSCOPE_ENABLE_SCOPES 0

#include <gtest/gtest.h>

#include "poolscope/profiler/function_profiler.hpp"

namespace {

constexpr int compiled_out() {
  POOLSCOPE_SCOPE("disabled.constexpr");
  POOLSCOPE_SCOPE("disabled.constexpr.stream", nullptr);
  POOLSCOPE_SCOPE_IN(poolscope::profiler::category::pool, "disabled.constexpr.pool");
  return 7;
}
static_assert(compiled_out() == 7, "POOLSCOPE_SCOPE must expand to nothing when disabled");

TEST(function_profiler, scopes_compiled_out_record_nothing) {
  poolscope::profiler::function_profiler_options o;
  o.gpu_timing = false;
  poolscope::profiler::function_profiler prof{o};
  for (int i = 0; i < 3; ++i) {
    POOLSCOPE_SCOPE("disabled.macro");
  }
  {
    // The RAII class is a real object and still works: only the macros are compiled out.
    poolscope::profiler::scope explicit_scope{"disabled.object"};
  }
  prof.stop();
  const auto p = prof.report();
  EXPECT_EQ(p.find("disabled.macro"), nullptr);
  ASSERT_NE(p.find("disabled.object"), nullptr);
  EXPECT_EQ(p.find("disabled.object")->calls, 1U);
}

}  // namespace
