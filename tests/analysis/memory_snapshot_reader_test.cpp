// memory_snapshot_reader and snapshot_trace: the PyTorch 2.11 snapshot in tests/data read back to
// the figures PyTorch gave for the same run (tests/data/torch_snapshot_varlen.json), what
// poolscope writes read back to the same value, bad fields named, and a fuzz over real files:
// truncated and flipped bytes end in a typed error or a snapshot, never a crash or a hang.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "../../profiler/src/detail/pickle_writer.hpp"
#include "poolscope/analysis/memory_snapshot_reader.hpp"
#include "poolscope/analysis/pickle_reader.hpp"
#include "poolscope/analysis/replay.hpp"
#include "poolscope/analysis/snapshot_trace.hpp"

namespace poolscope::analysis {
namespace {

using profiler::block_state;
using profiler::memory_snapshot;
using profiler::trace_action;

const std::string data_dir = POOLSCOPE_TEST_DATA_DIR;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const std::string& sample_bytes() {
  static const std::string bytes = slurp(data_dir + "/torch_snapshot_varlen.pickle");
  return bytes;
}

const nlohmann::json& sample_figures() {
  static const nlohmann::json j =
      nlohmann::json::parse(slurp(data_dir + "/torch_snapshot_varlen.json"));
  return j;
}

void expect_tiled(const memory_snapshot& s) {
  for (const auto& seg : s.segments) {
    std::uint64_t at = seg.address;
    for (const auto& b : seg.blocks) {
      EXPECT_EQ(b.address, at);
      at += b.size;
    }
    EXPECT_EQ(at, seg.address + seg.total_size);
  }
}

TEST(memory_snapshot_reader, reads_the_pytorch_sample) {
  const memory_snapshot s = parse_memory_snapshot(sample_bytes(), "sample");
  const nlohmann::json& want = sample_figures();
  EXPECT_EQ(s.segments.size(), want["segments_at_end"].get<std::size_t>());
  ASSERT_EQ(s.device_traces.size(), 1U);
  std::map<std::string, std::uint64_t> actions;
  for (const auto& e : s.device_traces[0]) {
    ++actions[std::string(profiler::to_string(e.action))];
  }
  for (const auto& [name, count] : want["actions"].items()) {
    EXPECT_EQ(actions[name], count.get<std::uint64_t>()) << name;
  }
  expect_tiled(s);
  // The sample's entries carry two distinct Python stacks (varlen at lines 29 and 30, as
  // Python's pickle module counts them), each stored once, beside the empty stack.
  ASSERT_EQ(s.stacks.size(), 2U + 1U);
  const auto& first = s.stacks[s.device_traces[0][0].stack];
  ASSERT_EQ(first.size(), 3U);
  EXPECT_EQ(first[0].name, "varlen");
  EXPECT_EQ(first[2].name, "<module>");
  EXPECT_NE(first[0].filename.find("torch_snapshot.py"), std::string::npos);
  bool has_conf = false;
  for (const auto& [key, value] : s.allocator_settings) {
    has_conf = has_conf || key == "PYTORCH_CUDA_ALLOC_CONF";
  }
  EXPECT_TRUE(has_conf);
}

TEST(snapshot_trace, the_sample_gives_pytorchs_own_peaks) {
  const memory_snapshot s = parse_memory_snapshot(sample_bytes(), "sample");
  ASSERT_EQ(snapshot_devices(s), std::vector<int>{0});
  const snapshot_trace t = snapshot_trace_of(s, 0);
  const nlohmann::json& want = sample_figures();
  EXPECT_EQ(t.figures.source_peak_reserved, want["max_reserved"].get<std::uint64_t>());
  EXPECT_EQ(t.figures.source_peak_live, want["peak_requested"].get<std::uint64_t>());
  EXPECT_EQ(t.figures.reserved_at_start, 0U);
  EXPECT_EQ(t.figures.blocks_before_trace, 0U);
  EXPECT_EQ(t.figures.allocs, 1200U);
  EXPECT_EQ(t.figures.frees, 1200U);
  EXPECT_EQ(t.log.records.size(), 2400U);
  // Replayed on an allocator that takes exactly what is asked, the peak of requested bytes is
  // the snapshot's peak of live bytes.
  const replay_result r = replay_on_host(t.log, "naive");
  EXPECT_EQ(r.peak_requested, t.figures.source_peak_live);
  EXPECT_EQ(r.failed_allocations, 0U);
  EXPECT_EQ(r.unknown_frees, 0U);
}

TEST(snapshot_trace, a_trace_that_lost_its_start_counts_what_was_live_before_it) {
  memory_snapshot s = parse_memory_snapshot(sample_bytes(), "sample");
  const snapshot_trace whole = snapshot_trace_of(s, 0);
  // Drop the first 1000 entries, as a ring of 2613 entries would have.
  auto& trace = s.device_traces[0];
  const std::vector<profiler::trace_entry> lost(trace.begin(), trace.begin() + 1000);
  trace.erase(trace.begin(), trace.begin() + 1000);
  const snapshot_trace cut = snapshot_trace_of(s, 0);

  // Reference: walk the lost entries for what was live and reserved when the ring begins.
  std::map<std::uint64_t, std::uint64_t> live;
  std::uint64_t reserved = 0;
  for (const auto& e : lost) {
    if (e.action == trace_action::alloc) {
      live[e.addr] = e.size;
    } else if (e.action == trace_action::free_requested) {
      live.erase(e.addr);
    } else if (e.action == trace_action::segment_alloc) {
      reserved += e.size;
    }
  }
  std::uint64_t live_bytes = 0;
  for (const auto& [addr, size] : live) {
    live_bytes += size;
  }
  EXPECT_EQ(cut.figures.blocks_before_trace, live.size());
  EXPECT_EQ(cut.figures.bytes_before_trace, live_bytes);
  EXPECT_EQ(cut.figures.reserved_at_start, reserved);
  EXPECT_EQ(cut.figures.reserved_at_end, whole.figures.reserved_at_end);
  // The peaks came after the cut in this run, so the cut trace finds the same ones.
  EXPECT_EQ(cut.figures.source_peak_reserved, whole.figures.source_peak_reserved);
  EXPECT_EQ(cut.figures.source_peak_live, whole.figures.source_peak_live);
  // The early blocks open the log, in address order, and every free finds its block.
  ASSERT_GE(cut.log.records.size(), live.size());
  auto it = live.begin();
  for (std::size_t i = 0; i < live.size(); ++i, ++it) {
    EXPECT_EQ(cut.log.records[i].ptr, it->first);
    EXPECT_EQ(cut.log.records[i].size, it->second);
  }
  const replay_result r = replay_on_host(cut.log, "naive");
  EXPECT_EQ(r.unknown_frees, 0U);
  EXPECT_EQ(r.peak_requested, cut.figures.source_peak_live);
}

// A file as PyTorch writes it with stacks="all" (C++ frames before the Python ones), an oom, two
// streams and a segment from before the first entry: read back through the pickle, each figure
// against the one counted here by hand.
TEST(snapshot_trace, native_frames_an_oom_and_two_streams_replay_to_the_hand_figures) {
  constexpr std::uint64_t mib = 1U << 20;
  constexpr std::uint64_t s1 = 0x11;
  constexpr std::uint64_t s2 = 0x22;
  memory_snapshot s;
  s.stacks.push_back({{"c10::cuda::CUDACachingAllocator::Native::malloc", "??", 0},
                      {"at::native::empty_cuda", "/opt/torch/lib/libtorch_cuda.so", 0},
                      {"train_step", "train.py", 42}});
  // At the end: segment A (stream 1, present before the trace: no segment_alloc) holds the block
  // the trace allocates; segment C (stream 2) a block the trace never allocated.
  profiler::snapshot_segment a;
  a.address = 0x10000000;
  a.total_size = 2 * mib;
  a.stream = s1;
  a.blocks = {{0x10000000, mib, 1000000, block_state::active_allocated, 1},
              {0x10000000 + mib, mib, 0, block_state::inactive, 0}};
  profiler::snapshot_segment c;
  c.address = 0x30000000;
  c.total_size = mib;
  c.stream = s2;
  c.blocks = {{0x30000000, mib / 2, 500000, block_state::active_allocated, 1},
              {0x30000000 + mib / 2, mib / 2, 0, block_state::inactive, 0}};
  s.segments = {a, c};
  s.device_traces = {{
      {trace_action::segment_alloc, 0x20000000, 4 * mib, s2, 100, 1},
      {trace_action::alloc, 0x20000000, 3000000, s2, 101, 1},
      {trace_action::alloc, 0x10000000, 1000000, s1, 102, 1},
      {trace_action::oom, 123456, 8 * mib, s1, 103, 1},  // addr: the device's free bytes
      {trace_action::free_requested, 0x20000000, 3000000, s2, 104, 1},
      {trace_action::free_completed, 0x20000000, 3000000, s2, 105, 1},
      {trace_action::segment_free, 0x20000000, 4 * mib, s2, 106, 0},
  }};
  const memory_snapshot back = parse_memory_snapshot(s.to_pickle(), "hand");
  ASSERT_EQ(back, s);
  EXPECT_EQ(back.stacks[1][0].filename, "??");

  const snapshot_trace t = snapshot_trace_of(back, 0);
  EXPECT_EQ(t.figures.allocs, 2U);
  EXPECT_EQ(t.figures.frees, 1U);
  EXPECT_EQ(t.figures.ooms, 1U);
  EXPECT_EQ(t.figures.reserved_at_end, 3 * mib);    // A + C
  EXPECT_EQ(t.figures.reserved_at_start, 3 * mib);  // B came and went in the trace
  EXPECT_EQ(t.figures.source_peak_reserved, 7 * mib);
  EXPECT_EQ(t.figures.blocks_before_trace, 1U);  // C's block
  EXPECT_EQ(t.figures.bytes_before_trace, 500000U);
  EXPECT_EQ(t.figures.source_peak_live, 500000U + 3000000U + 1000000U);
  EXPECT_FALSE(t.figures.segments_inconsistent);
  // The early block opens the log on its segment's stream; each entry keeps its own stream.
  ASSERT_EQ(t.log.records.size(), 1U + 4U);
  EXPECT_EQ(t.log.records[0].ptr, 0x30000000U);
  EXPECT_EQ(t.log.records[0].stream, s2);
  EXPECT_EQ(t.log.records[1].stream, s2);
  EXPECT_EQ(t.log.records[2].stream, s1);
  EXPECT_EQ(t.log.records[3].kind, hooks::event_kind::oom);

  const replay_result r = replay_on_host(t.log, "naive");
  EXPECT_EQ(r.recorded_failures, 1U);
  EXPECT_EQ(r.failed_allocations, 0U);
  EXPECT_EQ(r.unknown_frees, 0U);
  EXPECT_EQ(r.peak_requested, t.figures.source_peak_live);
}

TEST(memory_snapshot_reader, what_poolscope_writes_reads_back_the_same) {
  const memory_snapshot s = parse_memory_snapshot(sample_bytes(), "sample");
  const std::string written = s.to_pickle();
  const memory_snapshot back = parse_memory_snapshot(written, "written");
  EXPECT_EQ(back.segments, s.segments);
  EXPECT_EQ(back.device_traces, s.device_traces);
  EXPECT_EQ(back.stacks, s.stacks);
  // Strings and stacks are written once each: smaller than PyTorch's own file.
  EXPECT_LT(written.size(), sample_bytes().size());
}

/// The field and message of the error reading `bytes`.
std::pair<std::string, std::string> field_error(const std::string& bytes) {
  try {
    (void)parse_memory_snapshot(bytes, "bad.pickle");
  } catch (const snapshot_error& e) {
    return {e.field(), e.what()};
  }
  ADD_FAILURE() << "no error";
  return {};
}

/// A one-segment snapshot pickle whose block and entry are written by the callers.
std::string one_segment(const std::function<void(profiler::detail::pickle_writer&)>& block,
                        const std::function<void(profiler::detail::pickle_writer&)>& entry) {
  profiler::detail::pickle_writer w;
  w.begin_dict();
  w.string("segments");
  w.begin_list();
  w.begin_dict();
  w.string("address");
  w.integer(4096);
  w.string("total_size");
  w.integer(1024);
  w.string("blocks");
  w.begin_list();
  block(w);
  w.end_list();
  w.end_dict();
  w.end_list();
  w.string("device_traces");
  w.begin_list();
  w.begin_list();
  entry(w);
  w.end_list();
  w.end_list();
  w.end_dict();
  return w.finish();
}

void good_block(profiler::detail::pickle_writer& w) {
  w.begin_dict();
  w.string("size");
  w.integer(1024);
  w.string("state");
  w.string("inactive");
  w.end_dict();
}
void good_entry(profiler::detail::pickle_writer& w) {
  w.begin_dict();
  w.string("action");
  w.string("alloc");
  w.string("addr");
  w.integer(4096);
  w.string("size");
  w.integer(100);
  w.end_dict();
}

TEST(memory_snapshot_reader, bad_fields_are_named) {
  const memory_snapshot ok = parse_memory_snapshot(one_segment(good_block, good_entry));
  ASSERT_EQ(ok.segments.size(), 1U);
  EXPECT_EQ(ok.segments[0].blocks[0].requested_size, 1024U);  // absent: the block's size

  auto block_with = [](const char* key, auto value, int size = 1024) {
    return [=](profiler::detail::pickle_writer& w) {
      w.begin_dict();
      w.string("size");
      w.integer(size);
      w.string("state");
      w.string("inactive");
      w.string(key);
      if constexpr (std::is_same_v<decltype(value), const char*>) {
        w.string(value);
      } else {
        w.integer(value);
      }
      w.end_dict();
    };
  };
  auto entry_with = [](const char* action, const char* key, auto value) {
    return [=](profiler::detail::pickle_writer& w) {
      w.begin_dict();
      w.string("action");
      w.string(action);
      w.string("addr");
      w.integer(4096);
      w.string("size");
      w.integer(8);
      w.string(key);
      if constexpr (std::is_same_v<decltype(value), const char*>) {
        w.string(value);
      } else {
        w.integer(value);
      }
      w.end_dict();
    };
  };
  struct bad {
    std::string bytes;
    const char* field;
    const char* says;
  };
  const bad cases[] = {
      {one_segment(block_with("size", "big"), good_entry), "segments[0].blocks[0].size",
       "expected an int >= 0, got str 'big'"},
      {one_segment(block_with("state", "lost"), good_entry), "segments[0].blocks[0].state",
       "unknown block state 'lost'"},
      {one_segment(block_with("address", 4000), good_entry), "segments[0].blocks[0].address",
       "do not tile"},
      {one_segment(block_with("x", 0, 1000), good_entry), "segments[0].blocks",
       "sum to 1000, the segment's total_size is 1024"},
      {one_segment(block_with("x", 0, 2000), good_entry), "segments[0].blocks[0].size",
       "past the segment's total_size"},
      {one_segment(good_block, entry_with("free", "y", 0)), "device_traces[0][0].action",
       "unknown action 'free'"},
      {one_segment(good_block, entry_with("alloc", "size", -5)), "device_traces[0][0].size",
       "expected an int >= 0, got int -5"},
      {one_segment(good_block, entry_with("alloc", "frames", 3)), "device_traces[0][0].frames",
       "expected a list, got int 3"},
  };
  for (const bad& b : cases) {
    const auto [field, what] = field_error(b.bytes);
    EXPECT_EQ(field, b.field) << what;
    EXPECT_NE(what.find(b.says), std::string::npos) << what;
    EXPECT_NE(what.find("bad.pickle: "), std::string::npos) << what;
  }
  profiler::detail::pickle_writer w;
  w.begin_dict();
  w.string("device_traces");
  w.begin_list();
  w.end_list();
  w.end_dict();
  EXPECT_EQ(field_error(w.finish()).first, "segments");
}

/// Reads `bytes` as a snapshot and replays every device's trace; returns false if it was refused
/// with a typed error (what a damaged file must end in, if not in a snapshot).
bool read_and_replay(const std::string& bytes) {
  try {
    const memory_snapshot s = parse_memory_snapshot(bytes, "fuzzed");
    for (int d : snapshot_devices(s)) {
      const snapshot_trace t = snapshot_trace_of(s, d);
      (void)replay_on_host(t.log, "bfc");
    }
    return true;
  } catch (const pickle_error&) {
  } catch (const snapshot_error&) {
  }
  return false;
}

TEST(memory_snapshot_reader, fuzzed_real_snapshots_end_in_a_typed_error_or_a_snapshot) {
  const std::uint32_t seed = std::random_device{}();
  std::printf("fuzz seed %u\n", seed);
  std::mt19937 rng(seed);
  const memory_snapshot sample = parse_memory_snapshot(sample_bytes(), "sample");
  // Ours and PyTorch's: different opcodes (ours memoizes every stack), both real.
  for (const std::string& original : {sample_bytes(), sample.to_pickle()}) {
    std::uniform_int_distribution<std::size_t> at(0, original.size() - 1);
    std::size_t read = 0;
    for (int i = 0; i < 60; ++i) {
      read += read_and_replay(original.substr(0, at(rng))) ? 1 : 0;
    }
    EXPECT_EQ(read, 0U) << "a truncated snapshot was read whole";
    for (int i = 0; i < 250; ++i) {
      std::string bytes = original;
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int k = 0; k < flips; ++k) {
        bytes[at(rng)] = static_cast<char>(rng() & 0xFF);
      }
      (void)read_and_replay(bytes);
    }
  }
}

}  // namespace
}  // namespace poolscope::analysis
