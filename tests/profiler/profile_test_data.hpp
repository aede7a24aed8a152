// Line profiles built by hand for the tests of the profiler and of `poolscope report` / `replay`.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "poolscope/profiler/line_profile.hpp"

namespace poolscope::profiler::test_data {

/// A frame known by function, file and line (no module or address), with its own figures.
inline profile_node source_frame(std::string function, std::string file, int line,
                                 profile_counts self = {}) {
  profile_node n;
  n.function = std::move(function);
  n.file = std::move(file);
  n.line = line;
  n.self = self;
  return n;
}

/// Figures of `count` allocations of `used` bytes taking `rounded`, having acquired `acquired`
/// in `acquire_count` upstream allocations.
inline profile_counts allocations(std::uint64_t count, std::uint64_t used, std::uint64_t rounded,
                                  std::uint64_t acquired = 0, std::uint64_t acquire_count = 0) {
  profile_counts c;
  c.count = count;
  c.used = used;
  c.rounded = rounded;
  c.acquired = acquired;
  c.acquire_count = acquire_count;
  return c;
}

/// A profile whose root ("<root>") holds `stacks`, totals computed (frame-pointer unwinder, no
/// symbolizer, depth 24).
inline line_profile profile_of(std::vector<profile_node> stacks) {
  line_profile p;
  p.root.function = "<root>";
  p.root.children = std::move(stacks);
  p.unwinder = "frame_pointer";
  p.symbolizer = "none";
  p.max_depth = 24;
  p.recompute_totals();
  return p;
}

/// A line profile document whose nodes are nested `levels` deep (root included), written as
/// text so that nothing recurses over it to build it.
inline std::string nested_profile_json(std::size_t levels) {
  const std::string self =
      R"("self":{"count":1,"used":8,"rounded":8,"freed":0,"live":8,"live_at_peak":8,)"
      R"("acquire_count":0,"acquired":0,"live_acquired":0})";
  std::string json =
      R"({"format":"poolscope.line_profile","version":1,"unwinder":"frame_pointer",)"
      R"("symbolizer":"none","max_depth":256,"complete":true,"events":1,)"
      R"("unmatched_frees":0,"truncated_stacks":0,"peak_live":8,"peak_seq":1,"root":)";
  for (std::size_t i = 0; i < levels; ++i) {
    json += "{\"function\":\"f" + std::to_string(i) + "\"," + self + ",\"children\":[";
  }
  for (std::size_t i = 0; i < levels; ++i) {
    json += "]}";
  }
  json += "}";
  return json;
}

/// A frame of the application /opt/app/bin/app at `address` (loaded at 0x1000), with source.
inline profile_node frame(std::string function, std::string file, int line, std::uint64_t address,
                          profile_counts self = {}) {
  profile_node n;
  n.function = std::move(function);
  n.file = std::move(file);
  n.line = line;
  n.module = "/opt/app/bin/app";
  n.offset = address - 0x1000;
  n.address = address;
  n.self = self;
  return n;
}

inline profile_counts used(std::uint64_t count, std::uint64_t bytes, std::uint64_t acquired = 0,
                           std::uint64_t live = 0, std::uint64_t live_at_peak = 0) {
  profile_counts c;
  c.count = count;
  c.used = bytes;
  c.rounded = (bytes + 511) / 512 * 512;
  c.freed = bytes - live;
  c.live = live;
  c.live_at_peak = live_at_peak;
  c.acquire_count = acquired != 0 ? 1 : 0;
  c.acquired = acquired;
  c.live_acquired = acquired;
  return c;
}

/// A profile with every kind of frame:
/// main -> train -> { forward -> matmul [3 MiB], backward [1 MiB] }, main -> load [512 B],
/// plus a frame known only by module+offset and one known by nothing.
inline line_profile sample() {
  line_profile p;
  p.root.function = "<root>";
  profile_node main_f = frame("main", "/src/app/main.cpp", 40, 0x1100);
  profile_node train = frame("train(model&)", "/src/app/train.cpp", 12, 0x2200);
  profile_node forward = frame("forward(model&)", "/src/app/model.cpp", 88, 0x3300);
  forward.children.push_back(frame("matmul(tensor const&, tensor const&)", "/src/app/ops.cpp", 7,
                                   0x4400, used(3, 3 << 20, 4 << 20, 1 << 20, 2 << 20)));
  train.children.push_back(std::move(forward));
  train.children.push_back(frame("backward(model&)", "/src/app/model.cpp", 120, 0x5500,
                                 used(1, 1 << 20, 0, 0, 1 << 20)));
  main_f.children.push_back(std::move(train));
  main_f.children.push_back(frame("load()", "/src/app/io.cpp", 3, 0x6600, used(2, 512)));
  profile_node stripped;
  stripped.module = "/usr/lib/libvendor.so";
  stripped.offset = 0xabc;
  stripped.address = 0x7f0000000abc;
  stripped.self = used(1, 100);
  profile_node unknown;
  unknown.address = 0xdeadbeef;
  unknown.self = used(1, 7);
  stripped.children.push_back(std::move(unknown));
  p.root.children.push_back(std::move(main_f));
  p.root.children.push_back(std::move(stripped));
  p.peak_live = 3 << 20;
  p.peak_seq = 42;
  p.events = 9;
  p.unmatched_frees = 1;
  p.truncated_stacks = 2;
  p.deferred_events = 5;
  p.unwinder = "libunwind";
  p.symbolizer = "libdw";
  p.max_depth = 24;
  p.recompute_totals();
  return p;
}

/// Expects `a` and `b` to be the same tree: every node's symbols and figures.
inline void expect_same_tree(const profile_node& a, const profile_node& b) {
  EXPECT_EQ(a.function, b.function);
  EXPECT_EQ(a.file, b.file);
  EXPECT_EQ(a.line, b.line);
  EXPECT_EQ(a.module, b.module);
  EXPECT_EQ(a.offset, b.offset);
  EXPECT_EQ(a.address, b.address);
  EXPECT_EQ(a.self, b.self);
  EXPECT_EQ(a.total, b.total);
  ASSERT_EQ(a.children.size(), b.children.size());
  for (std::size_t i = 0; i < a.children.size(); ++i) {
    expect_same_tree(a.children[i], b.children[i]);
  }
}

}  // namespace poolscope::profiler::test_data
