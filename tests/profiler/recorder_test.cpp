// recorder: the log parses back line by line to the events; crash flushing; buffering.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../profiler/src/detail/recorder_crash.hpp"
#include "poolscope/analysis/event_log.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"
#include "poolscope/profiler/recorder.hpp"

namespace poolscope::profiler {
namespace {

using analysis::event_log;
using analysis::log_format;
using analysis::log_record;
using analysis::parse_event_log_text;
using analysis::read_event_log;

/// Keeps a copy of every event (and the allocator name) for comparison.
class capture_hook final : public hooks::hook {
 public:
  struct captured {
    hooks::event e;
    std::string name;
  };
  void on_event(const hooks::event& e) noexcept override {
    std::lock_guard lock(mutex_);
    events_.push_back({e, e.allocator_name});
  }
  std::vector<captured> events() {
    std::lock_guard lock(mutex_);
    return events_;
  }

 private:
  std::mutex mutex_;
  std::vector<captured> events_;
};

bool one_line_per_operation(const hooks::event& e) {
  using hooks::event_kind;
  using hooks::event_phase;
  switch (e.kind) {
    case event_kind::pool_malloc:
    case event_kind::device_alloc:
    case event_kind::release:
      return e.phase == event_phase::post;
    case event_kind::pool_free:
    case event_kind::device_free:
      return e.phase == event_phase::pre;
    default:
      return true;
  }
}

std::string temp_path(const char* name) {
  return ::testing::TempDir() + "poolscope_recorder_test_" + name + "_" +
         std::to_string(::getpid()) + ".jsonl";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// A workload touching every event kind best_fit emits, plus an invalid free and an OOM.
void workload(pool::allocator& a) {
  std::vector<void*> blocks;
  for (std::size_t n : {100u, 1000u, 5000u, 100u, 70000u}) {
    blocks.push_back(a.allocate({}, n));
  }
  a.deallocate({}, blocks[1], 1000);
  blocks[1] = a.allocate({}, 900);  // reuses the cached 1024-byte block
  int not_ours = 0;
  a.deallocate({}, &not_ours, 4);  // invalid free: unknown pointer
  a.set_limit(1 << 20);
  EXPECT_THROW((void)a.allocate({}, 2 << 20), out_of_memory);
  a.set_limit(SIZE_MAX);
  const std::size_t sizes[] = {100, 900, 5000, 100, 70000};
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    a.deallocate({}, blocks[i], sizes[i]);
  }
  (void)a.release_cached();
}

void expect_record_matches(const log_record& r, const event_log& log,
                           const capture_hook::captured& c) {
  const hooks::event& e = c.e;
  EXPECT_EQ(r.seq, e.seq);
  EXPECT_EQ(r.time_ns, e.time_ns);
  EXPECT_EQ(r.thread, e.thread);
  EXPECT_EQ(r.device, e.device);
  EXPECT_EQ(r.stream, reinterpret_cast<std::uintptr_t>(e.stream));
  EXPECT_EQ(log.allocators.at(r.allocator), c.name);
  EXPECT_EQ(r.allocator_id, e.allocator_id);
  EXPECT_EQ(r.kind, e.kind);
  EXPECT_EQ(r.phase, e.phase);
  EXPECT_EQ(r.ptr, reinterpret_cast<std::uintptr_t>(e.ptr));
  EXPECT_EQ(r.size, e.requested);
  EXPECT_EQ(r.rounded, e.rounded);
}

TEST(recorder, log_parses_back_to_the_events_line_by_line) {
  const std::string path = temp_path("roundtrip");
  capture_hook capture;
  {
    recorder rec{path};
    pool::host_resource host;
    pool::best_fit_allocator alloc{host};
    {
      hooks::scoped_hook a{capture};
      hooks::scoped_hook b{rec};
      workload(alloc);
    }
    EXPECT_TRUE(rec.enabled());
  }
  std::vector<capture_hook::captured> expected;
  for (const auto& c : capture.events()) {
    if (one_line_per_operation(c.e)) {
      expected.push_back(c);
    }
  }
  const event_log log = read_event_log(path);
  EXPECT_EQ(log.format, log_format::poolscope);
  ASSERT_EQ(log.records.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i));
    expect_record_matches(log.records[i], log, expected[i]);
    EXPECT_EQ(log.records[i].line, i + 2);  // line 1 is the header
  }
  // Every action of the workload is there.
  std::vector<std::string> actions;
  for (const auto& r : log.records) {
    actions.emplace_back(action_name(r.kind));
  }
  for (const char* a : {"malloc", "free", "device_alloc", "device_free", "release", "oom",
                        "limit_hit", "invalid_free"}) {
    EXPECT_NE(std::find(actions.begin(), actions.end(), a), actions.end()) << a;
  }
  std::remove(path.c_str());
}

TEST(recorder, all_phases_writes_every_event_through_a_small_buffer) {
  const std::string path = temp_path("phases");
  capture_hook capture;
  std::uint64_t lines = 0;
  {
    recorder rec{path, {.buffer_bytes = 1, .all_phases = true}};  // raised to 4 KiB
    pool::host_resource host;
    pool::naive_allocator alloc{host};
    hooks::scoped_hook a{capture};
    hooks::scoped_hook b{rec};
    for (int i = 0; i < 200; ++i) {  // ~800 events: many buffer flushes
      void* p = alloc.allocate({}, 64 + static_cast<std::size_t>(i));
      alloc.deallocate({}, p, 64 + static_cast<std::size_t>(i));
    }
    EXPECT_TRUE(rec.flush());  // the ring's last records formatted
    lines = rec.lines();
  }
  const auto expected = capture.events();
  EXPECT_EQ(lines, expected.size());
  const event_log log = read_event_log(path);
  ASSERT_EQ(log.records.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i));
    expect_record_matches(log.records[i], log, expected[i]);
  }
  std::remove(path.c_str());
}

TEST(recorder, flush_writes_complete_lines) {
  const std::string path = temp_path("flush");
  recorder rec{path};
  pool::host_resource host;
  pool::naive_allocator alloc{host};
  {
    hooks::scoped_hook on{rec};
    void* p = alloc.allocate({}, 10);
    alloc.deallocate({}, p, 10);
  }
  EXPECT_EQ(slurp(path), "");  // still buffered
  EXPECT_TRUE(rec.flush());
  const std::string text = slurp(path);
  EXPECT_EQ(text.back(), '\n');
  const event_log log = parse_event_log_text(text);
  EXPECT_EQ(log.records.size(), 4u);  // malloc, device_alloc, free, device_free
  std::remove(path.c_str());
}

TEST(recorder, cannot_create_names_the_path) {
  try {
    recorder rec{"/nonexistent-dir/x/y.jsonl"};
    FAIL() << "opened a file in a missing directory";
  } catch (const runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x/y.jsonl"), std::string::npos);
  }
}

/// In a child: record a few events (less than a buffer), then die by `sig`.
[[noreturn]] void record_then_die(const std::string& path, int sig) {
  static recorder* rec = new recorder{path};  // never destroyed: only the handler can flush
  static pool::host_resource host;
  static pool::best_fit_allocator alloc{host};
  hooks::install(*rec);
  for (int i = 0; i < 5; ++i) {
    (void)alloc.allocate({}, 1000);
  }
  if (sig == SIGABRT) {
    std::abort();
  }
  std::raise(sig);
  std::_Exit(3);  // not reached
}

void expect_five_mallocs_in(const std::string& path) {
  const event_log log = read_event_log(path);
  std::size_t mallocs = 0;
  for (const auto& r : log.records) {
    mallocs += r.kind == hooks::event_kind::pool_malloc ? 1 : 0;
  }
  EXPECT_EQ(mallocs, 5u);
  std::remove(path.c_str());
}

TEST(recorder, abort_flushes_the_buffer) {
  const std::string path = temp_path("abort");
  EXPECT_DEATH(record_then_die(path, SIGABRT), "");
  expect_five_mallocs_in(path);
}

TEST(recorder, segfault_flushes_the_buffer) {
  const std::string path = temp_path("segv");
  EXPECT_DEATH(record_then_die(path, SIGSEGV), "");
  expect_five_mallocs_in(path);
}

// The event lines of an event-log file, by seq, in file order.
std::vector<std::uint64_t> seqs_in(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::vector<std::uint64_t> seqs;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    const std::string key = "{\"seq\":";
    if (line.rfind(key, 0) != 0) {
      ADD_FAILURE() << "not an event line: " << line;
      continue;
    }
    seqs.push_back(std::stoull(line.substr(key.size())));
  }
  return seqs;
}

// A fatal signal arriving while the recorder is partway through writing its buffer (write(2)
// returned short, more to write) used to make the handler write the whole buffer again: the
// "written" mark moved only after the loop, so the file held the first part twice. Here writes
// are cut to 100 bytes and the crash "happens" before the third one: the file must then hold
// every line exactly once. After the crash nothing more reaches the file (as in a dead process).
std::atomic<int> g_write_calls{0};
std::atomic<bool> g_crashed{false};
std::string g_crash_path;
std::string g_at_crash;  // the file's content right after the crash flush

ssize_t short_write_then_crash(int fd, const void* data, std::size_t bytes) {
  if (g_crashed.load()) {
    return static_cast<ssize_t>(bytes);  // the process is gone: nothing more is written
  }
  if (g_write_calls.fetch_add(1) == 2) {
    detail::flush_recorders_for_fatal_signal();
    g_at_crash = slurp(g_crash_path);
    g_crashed.store(true);
    return static_cast<ssize_t>(bytes);
  }
  return ::write(fd, data, std::min<std::size_t>(bytes, 100));
}

TEST(recorder, crash_during_a_partial_write_writes_each_line_once) {
  const std::string path = temp_path("partial");
  g_crash_path = path;
  capture_hook cap;
  {
    recorder rec{path, {.buffer_bytes = 1 << 16}};
    {
      pool::host_resource host;
      pool::best_fit_allocator alloc{host};
      hooks::scoped_hook on_rec{rec};
      hooks::scoped_hook on_cap{cap};
      std::vector<void*> blocks;
      for (std::size_t n = 1; n <= 20; ++n) {
        blocks.push_back(alloc.allocate({}, n * 100));
      }
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        alloc.deallocate({}, blocks[i], (i + 1) * 100);
      }
    }
    detail::set_recorder_write_for_testing(&short_write_then_crash);
    const bool flushed = rec.flush();
    detail::set_recorder_write_for_testing(nullptr);
    EXPECT_TRUE(flushed);
  }
  ASSERT_TRUE(g_crashed.load()) << "the buffer took fewer than three writes";

  // Independent reference: the events the capture hook saw, one line each, once.
  std::vector<std::uint64_t> expected;
  for (const auto& c : cap.events()) {
    if (one_line_per_operation(c.e)) {
      expected.push_back(c.e.seq);
    }
  }
  ASSERT_GT(expected.size(), 20u);
  EXPECT_EQ(g_at_crash.rfind("{\"format\":\"poolscope.events\"", 0), 0u) << g_at_crash;
  EXPECT_EQ(seqs_in(g_at_crash), expected);
  EXPECT_EQ(parse_event_log_text(g_at_crash).records.size(), expected.size());
  std::remove(path.c_str());
  detail::forget_fatal_signal_for_testing();
}

// A fatal signal on another thread while this one is in the recorder's write(2): the handler
// leaves the range in flight to this thread (which finishes it) and writes only what no write has
// taken. It used to write the range in flight as well, so the file held those lines twice. From
// the crash on the recorder keeps its buffer (the handler may be reading it); later lines go
// after the others while they fit.
std::atomic<int> g_flushes_from_another_thread{0};

ssize_t write_while_another_thread_crashes(int fd, const void* data, std::size_t bytes) {
  if (g_flushes_from_another_thread.fetch_add(1) == 0) {
    std::thread([] { detail::flush_recorders_for_fatal_signal(); }).join();
  }
  return ::write(fd, data, bytes);
}

TEST(recorder, crash_on_another_thread_during_a_write_writes_each_line_once) {
  const std::string path = temp_path("other_thread");
  capture_hook cap;
  {
    recorder rec{path, {.buffer_bytes = 1 << 16}};
    pool::host_resource host;
    pool::best_fit_allocator alloc{host};
    hooks::scoped_hook on_rec{rec};
    hooks::scoped_hook on_cap{cap};
    const auto traffic = [&alloc](std::size_t blocks) {
      for (std::size_t n = 1; n <= blocks; ++n) {
        alloc.deallocate({}, alloc.allocate({}, n * 100), n * 100);
      }
    };
    traffic(20);
    detail::set_recorder_write_for_testing(&write_while_another_thread_crashes);
    EXPECT_TRUE(rec.flush());
    detail::set_recorder_write_for_testing(nullptr);
    EXPECT_EQ(g_flushes_from_another_thread.load(), 1);
    traffic(10);  // after the crash flush: kept in the buffer, written at the end
  }
  detail::forget_fatal_signal_for_testing();
  std::vector<std::uint64_t> expected;
  for (const auto& c : cap.events()) {
    if (one_line_per_operation(c.e)) {
      expected.push_back(c.e.seq);
    }
  }
  ASSERT_GE(expected.size(), 60u);  // 30 pairs, and the upstream allocations
  EXPECT_EQ(seqs_in(slurp(path)), expected);
  std::remove(path.c_str());
}

// The ring's record holds a 32-bit thread id and a 16-bit device; an event with a value past
// those goes around the ring, still in its place among the others and with its values whole.
TEST(recorder, values_too_wide_for_the_ring_are_written_whole_and_in_order) {
  const std::string path = temp_path("wide");
  std::vector<hooks::event> sent;
  {
    recorder rec{path, {.writer_thread = false}};
    hooks::event e;
    e.kind = hooks::event_kind::pool_malloc;
    e.phase = hooks::event_phase::post;
    e.allocator_id = 7;
    e.allocator_name = "wide/test";
    e.requested = 100;
    e.rounded = 128;
    // Devices as the reader takes them: -1 (the host) or an ordinal.
    const std::pair<std::uint64_t, int> values[] = {
        {4711, 0},           {std::uint64_t{1} << 40, 0},
        {4711, 40000},       {4711, INT_MAX},
        {UINT32_MAX, 32767}, {4712, 32768},
        {UINT64_MAX, -1},    {4713, 3}};
    std::uint64_t seq = 10;
    for (const auto& [thread, device] : values) {
      e.seq = seq++;
      e.time_ns = 1000 * seq;
      e.thread = thread;
      e.device = device;
      e.ptr = reinterpret_cast<void*>(0x10000 * seq);
      rec.on_event(e);
      sent.push_back(e);
    }
    EXPECT_TRUE(rec.flush());
    EXPECT_EQ(rec.lines(), sent.size());
  }
  const event_log log = read_event_log(path);
  ASSERT_EQ(log.records.size(), sent.size());
  std::vector<std::size_t> lines;
  for (std::size_t i = 0; i < sent.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i));
    const log_record& r = log.records[i];
    EXPECT_EQ(r.seq, sent[i].seq);
    EXPECT_EQ(r.thread, sent[i].thread);
    EXPECT_EQ(r.device, sent[i].device);
    EXPECT_EQ(r.ptr, reinterpret_cast<std::uintptr_t>(sent[i].ptr));
    EXPECT_EQ(r.time_ns, sent[i].time_ns);
    lines.push_back(r.line);
  }
  EXPECT_TRUE(std::is_sorted(lines.begin(), lines.end())) << "the file keeps the events' order";
  std::remove(path.c_str());
}

// A writer that falls behind: with no writer thread and a ring of 64, the 100 pairs' 200 events
// between two flushes keep 64; the file says how many were dropped, exactly, and the reader and
// replay count them.
TEST(recorder, a_full_ring_drops_events_and_the_log_says_how_many) {
  const std::string path = temp_path("dropped");
  pool::host_resource host;
  pool::best_fit_allocator alloc{host};
  void* warm = alloc.allocate({}, 256);  // best_fit's one upstream block, before recording
  alloc.deallocate({}, warm, 256);
  {
    recorder rec{path, {.ring_slots = 64, .writer_thread = false}};
    {
      hooks::scoped_hook on{rec};
      for (int i = 0; i < 100; ++i) {
        alloc.deallocate({}, alloc.allocate({}, 256), 256);
      }
    }
    EXPECT_TRUE(rec.flush());
    EXPECT_EQ(rec.lines(), 64u);
    EXPECT_EQ(rec.dropped(), 200u - 64u);
  }
  const event_log log = read_event_log(path);
  EXPECT_EQ(log.records.size(), 64u);
  EXPECT_EQ(log.dropped_events, 136u);
  EXPECT_EQ(slurp(path).find("{\"dropped\":136}\n") != std::string::npos, true);
  std::remove(path.c_str());
}

// flush_and_write_through (the plug-in's exit handler): lines recorded after it are in the file
// at once, without another flush and without destroying the recorder.
TEST(recorder, after_flush_and_write_through_each_line_is_written_at_once) {
  const std::string path = temp_path("through");
  pool::host_resource host;
  pool::best_fit_allocator alloc{host};
  recorder rec{path};
  capture_hook cap;
  const auto lines_in_file = [&path] {
    const std::string text = slurp(path);
    return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
  };
  // The reference: the header and one line per operation the capture hook saw.
  const auto lines_expected = [&cap] {
    std::size_t n = 1;
    for (const auto& c : cap.events()) {
      n += one_line_per_operation(c.e) ? 1 : 0;
    }
    return n;
  };
  {
    hooks::scoped_hook on_rec{rec};
    hooks::scoped_hook on_cap{cap};
    void* early = alloc.allocate({}, 1000);
    ASSERT_GT(lines_expected(), 1u);
    EXPECT_EQ(lines_in_file(), 0u) << "buffered until a flush";
    ASSERT_TRUE(rec.flush_and_write_through());
    EXPECT_EQ(lines_in_file(), lines_expected());
    alloc.deallocate({}, early, 1000);
    EXPECT_EQ(lines_in_file(), lines_expected());
    void* late = alloc.allocate({}, 3000);
    alloc.deallocate({}, late, 3000);
    EXPECT_EQ(lines_in_file(), lines_expected());
    // Read while the recorder is alive: nothing has flushed it since.
    const event_log log = read_event_log(path);
    ASSERT_FALSE(log.records.empty());
    EXPECT_EQ(log.records.back().kind, hooks::event_kind::pool_free);
    EXPECT_EQ(log.records.back().ptr, reinterpret_cast<std::uintptr_t>(late));
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace poolscope::profiler
