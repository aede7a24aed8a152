// A peer copy is transfer time on both of its devices: the receiving device's overlap with its
// compute is what a reshard hides (the darray demo's receiving side). Timeline and trace summary
// agree on it.
#include <gtest/gtest.h>

#include "poolscope/analysis/trace_summary.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "trace_test_util.hpp"

namespace poolscope::profiler {
namespace {

using testing::temp_file;

TEST(overlap_peer, a_peer_copy_counts_on_source_and_destination) {
  temp_file f(".json");
  timeline_options o;
  o.trace_path = f.path();
  o.cupti = false;
  o.allocator_events = false;
  timeline tl(o);
  tl.start();
  const std::uint64_t t0 = tl.origin_ns();
  // Device 0 stream 7 runs a copy 0 -> 1 over [1000, 5000); device 1 computes over [3000, 9000).
  device_activity copy;
  copy.kind = activity_kind::memcpy;
  copy.device = 0;
  copy.stream = 7;
  copy.correlation = 1;
  copy.peer = true;
  copy.src_device = 0;
  copy.dst_device = 1;
  copy.bytes = 1 << 20;
  copy.copy = copy_kind::ptop;
  copy.start_ns = t0 + 1000;
  copy.end_ns = t0 + 5000;
  tl.add_device_activity(copy);
  device_activity kern;
  kern.kind = activity_kind::kernel;
  kern.name = "add";
  kern.device = 1;
  kern.stream = 8;
  kern.correlation = 2;
  kern.start_ns = t0 + 3000;
  kern.end_ns = t0 + 9000;
  tl.add_device_activity(kern);
  tl.stop();

  for (const auto& d : tl.summary().overlap) {
    EXPECT_EQ(d.transfer_ns, 4000U) << "device " << d.device;
    EXPECT_EQ(d.both_ns, d.device == 1 ? 2000U : 0U) << "device " << d.device;
  }
  ASSERT_EQ(tl.summary().overlap.size(), 2U);
  const auto s = analysis::summarize_trace(f.path());
  ASSERT_EQ(s.devices.size(), 2U);
  for (const auto& d : s.devices) {
    EXPECT_EQ(d.transfer_ns, 4000U) << "device " << d.device;
    EXPECT_EQ(d.both_ns, d.device == 1 ? 2000U : 0U) << "device " << d.device;
  }
  // A window counts only what lies inside it: [2000, 4000) holds 2000 ns of the copy, of which
  // 1000 with device 1's kernel running.
  const auto w = analysis::summarize_trace(f.path(), interval{2000, 4000});
  ASSERT_EQ(w.devices.size(), 2U);
  for (const auto& d : w.devices) {
    EXPECT_EQ(d.window_ns, 2000U);
    EXPECT_EQ(d.transfer_ns, 2000U) << "device " << d.device;
    EXPECT_EQ(d.both_ns, d.device == 1 ? 1000U : 0U) << "device " << d.device;
  }
}

}  // namespace
}  // namespace poolscope::profiler
