// The ranks' profiles summed and side by side: function profiles scope by scope, line profiles
// call site by call site (frames matched by function, file, line and module, never by address),
// against sums made by hand.
#include "poolscope/analysis/rank_profiles.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "poolscope/error.hpp"

namespace {

using poolscope::analysis::side_by_side;
using poolscope::analysis::sum_profiles;
using poolscope::profiler::function_profile;
using poolscope::profiler::line_profile;
using poolscope::profiler::profile_node;
using poolscope::profiler::scope_record;

scope_record scope(const std::string& name, std::uint64_t calls, std::uint64_t cpu_ns,
                   std::uint64_t used) {
  scope_record s;
  s.name = name;
  s.calls = calls;
  s.cpu_total_ns = cpu_ns;
  s.cpu_self_ns = cpu_ns;
  s.used_bytes = used;
  return s;
}

TEST(rank_profiles, function_profiles_sum_by_scope_name) {
  function_profile a;
  a.scopes = {scope("step", 10, 5'000'000, 100), scope("load", 1, 1'000'000, 50)};
  function_profile b;
  b.scopes = {scope("step", 12, 7'000'000, 120), scope("save", 2, 9'000'000, 0)};
  b.scopes[0].gpu_total_ns = 400;
  const function_profile s = sum_profiles(std::vector<function_profile>{a, b});
  ASSERT_EQ(s.scopes.size(), 3U);
  EXPECT_EQ(s.scopes[0].name, "step");  // 12 ms, then save's 9 ms, then load's 1 ms
  EXPECT_EQ(s.scopes[0].calls, 22U);
  EXPECT_EQ(s.scopes[0].cpu_total_ns, 12'000'000U);
  EXPECT_EQ(s.scopes[0].used_bytes, 220U);
  EXPECT_EQ(s.scopes[0].gpu_total_ns, 400U);
  EXPECT_EQ(s.scopes[1].name, "save");
  EXPECT_EQ(s.scopes[2].name, "load");
  const std::string table = side_by_side({"rank 0", "rank 1"}, {a, b}, 10);
  EXPECT_NE(table.find("10, 5.000 ms"), std::string::npos) << table;
  EXPECT_NE(table.find("22, 12.000 ms"), std::string::npos) << table;
  // load ran on rank 0 only.
  const std::string load_row = table.substr(table.find("load"));
  EXPECT_NE(load_row.substr(0, load_row.find('\n')).find(" - "), std::string::npos) << table;
  EXPECT_THROW((void)side_by_side({"rank 0"}, {a, b}, 10), poolscope::invalid_argument);
}

profile_node frame(const std::string& fn, int line, std::uint64_t address, std::uint64_t used) {
  profile_node n;
  n.function = fn;
  n.file = "app.cpp";
  n.line = line;
  n.module = "app";
  n.address = address;
  n.self.count = 1;
  n.self.used = used;
  return n;
}

TEST(rank_profiles, line_profiles_sum_by_call_site_not_address) {
  // main -> {f, g} on rank 0; main -> {f, h} on rank 1, loaded at another address.
  line_profile a;
  a.root.children.push_back(frame("main", 10, 0x1000, 0));
  a.root.children[0].children = {frame("f", 20, 0x1100, 64), frame("g", 30, 0x1200, 32)};
  a.peak_live = 96;
  a.recompute_totals();
  line_profile b;
  b.root.children.push_back(frame("main", 10, 0x9000, 0));
  b.root.children[0].children = {frame("f", 20, 0x9100, 16), frame("h", 40, 0x9300, 8)};
  b.peak_live = 24;
  b.recompute_totals();
  const line_profile s = sum_profiles(std::vector<line_profile>{a, b});
  ASSERT_EQ(s.root.children.size(), 1U);
  const profile_node& main = s.root.children[0];
  ASSERT_EQ(main.children.size(), 3U);
  EXPECT_EQ(main.children[0].function, "f");
  EXPECT_EQ(main.children[0].total.used, 80U);
  EXPECT_EQ(main.children[0].total.count, 2U);
  EXPECT_EQ(s.root.total.used, 120U);
  EXPECT_EQ(s.peak_live, 120U);
  const std::string table = side_by_side({"rank 0", "rank 1"}, {a, b}, 10);
  // The table starts where the stacks branch: below main.
  EXPECT_NE(table.find("f (app.cpp:20)"), std::string::npos) << table;
  EXPECT_EQ(table.find("main (app.cpp:10)"), std::string::npos) << table;
}

}  // namespace
