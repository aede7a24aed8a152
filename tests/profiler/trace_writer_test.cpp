// trace_writer: what it writes is parsed back (nlohmann and the library's streaming reader) and
// compared with what was written; every file goes through the checker.
#include "poolscope/profiler/trace_writer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "poolscope/error.hpp"
#include "trace_test_util.hpp"

namespace {

using nlohmann::json;
using poolscope::profiler::append_trace_string;
using poolscope::profiler::append_trace_us;
using poolscope::profiler::trace_arg;
using poolscope::profiler::trace_compression;
using poolscope::profiler::trace_event;
using poolscope::profiler::trace_phase;
using poolscope::profiler::trace_writer;
using poolscope::profiler::trace_writer_options;
using poolscope::profiler::testing::expect_valid_trace;
using poolscope::profiler::testing::read_bytes;
using poolscope::profiler::testing::read_events;
using poolscope::profiler::testing::temp_file;
using poolscope::profiler::testing::to_ns;

std::string us(std::int64_t ns) {
  std::string s;
  append_trace_us(s, ns);
  return s;
}

TEST(trace_writer, microseconds_have_exactly_three_decimals) {
  EXPECT_EQ(us(0), "0.000");
  EXPECT_EQ(us(1), "0.001");
  EXPECT_EQ(us(999), "0.999");
  EXPECT_EQ(us(1000), "1.000");
  EXPECT_EQ(us(1234567), "1234.567");
  EXPECT_EQ(us(-5), "-0.005");
  EXPECT_EQ(us(-1234567), "-1234.567");
  EXPECT_EQ(us(std::numeric_limits<std::int64_t>::min()), "-9223372036854775.808");
  // Large values stay exact (no floating point on the way).
  EXPECT_EQ(us(86'400'000'000'123), "86400000000.123");
}

TEST(trace_writer, strings_are_escaped_and_valid_utf8) {
  const std::string raw = std::string("a\"b\\c\n\t\x01") + "\xC3\xA9" + "\xFF" + "z";
  std::string s;
  append_trace_string(s, raw);
  const json parsed = json::parse(s);
  // Valid UTF-8 (é) is kept, the invalid byte 0xFF becomes U+FFFD.
  EXPECT_EQ(parsed.get<std::string>(),
            std::string("a\"b\\c\n\t\x01") + "\xC3\xA9" + "\xEF\xBF\xBD" + "z");
}

// Writes one of each phase and returns what was written, for the round trip.
void write_sample(trace_writer& w, std::uint64_t origin) {
  w.process_name(1, "host");
  w.process_sort_index(1, 0);
  w.thread_name(1, 42, "main \"thread\"");
  w.thread_sort_index(1, 42, 3);
  w.process_name(100, "GPU 0");
  w.thread_name(100, 7, "stream 7");
  const trace_arg args[] = {{"bytes", std::uint64_t{4096}},
                            {"delta", -3},
                            {"gbps", 12.5},
                            {"nan", std::numeric_limits<double>::quiet_NaN()},
                            {"kind", "HtoD"},
                            {"ok", true}};
  w.write({.phase = trace_phase::complete,
           .name = "step",
           .cat = "user",
           .pid = 1,
           .tid = 42,
           .ts_ns = origin + 1'000,
           .dur_ns = 10'500,
           .args = args});
  w.write({.phase = trace_phase::complete,
           .name = "cudaLaunchKernel",
           .cat = "cuda_api",
           .pid = 1,
           .tid = 42,
           .ts_ns = origin + 2'000,
           .dur_ns = 1'001});
  w.write({.phase = trace_phase::instant,
           .name = "pool_malloc",
           .cat = "allocator",
           .pid = 1,
           .tid = 42,
           .ts_ns = origin + 2'500});
  const trace_arg counter[] = {{"in_use", 1024}, {"reserved", 2048}};
  w.write({.phase = trace_phase::counter,
           .name = "memory",
           .pid = 1,
           .tid = 0,
           .ts_ns = origin + 2'500,
           .args = counter});
  w.write({.phase = trace_phase::complete,
           .name = "kernel",
           .cat = "kernel",
           .pid = 100,
           .tid = 7,
           .ts_ns = origin + 5'000,
           .dur_ns = 3'000});
  w.write({.phase = trace_phase::flow_start,
           .name = "launch",
           .cat = "launch",
           .pid = 1,
           .tid = 42,
           .ts_ns = origin + 2'000,
           .id = 9});
  w.write({.phase = trace_phase::flow_end,
           .name = "launch",
           .cat = "launch",
           .pid = 100,
           .tid = 7,
           .ts_ns = origin + 5'000,
           .id = 9,
           .bind_enclosing = true});
  w.write({.phase = trace_phase::async_begin,
           .name = "range",
           .cat = "nvtx",
           .pid = 1,
           .tid = 42,
           .ts_ns = origin + 100,
           .id = 3});
  w.write({.phase = trace_phase::async_end,
           .name = "range",
           .cat = "nvtx",
           .pid = 1,
           .tid = 42,
           .ts_ns = origin + 20'000,
           .id = 3});
}

void expect_sample(const std::vector<json>& events) {
  ASSERT_EQ(events.size(), 15U);
  // Metadata.
  EXPECT_EQ(events[0], json::parse(R"({"ph":"M","name":"process_name","pid":1,"tid":0,
                                        "args":{"name":"host"}})"));
  EXPECT_EQ(events[1]["args"]["sort_index"], 0);
  EXPECT_EQ(events[2]["args"]["name"], "main \"thread\"");
  EXPECT_EQ(events[2]["tid"], 42);
  EXPECT_EQ(events[3]["name"], "thread_sort_index");
  EXPECT_EQ(events[3]["args"]["sort_index"], 3);
  // The complete event with its args.
  const json& x = events[6];
  EXPECT_EQ(x["ph"], "X");
  EXPECT_EQ(x["name"], "step");
  EXPECT_EQ(x["cat"], "user");
  EXPECT_EQ(to_ns(x["ts"]), 1'000);
  EXPECT_EQ(to_ns(x["dur"]), 10'500);
  EXPECT_EQ(x["args"]["bytes"], 4096);
  EXPECT_EQ(x["args"]["delta"], -3);
  EXPECT_DOUBLE_EQ(x["args"]["gbps"].get<double>(), 12.5);
  EXPECT_TRUE(x["args"]["nan"].is_null());
  EXPECT_EQ(x["args"]["kind"], "HtoD");
  EXPECT_EQ(x["args"]["ok"], true);
  EXPECT_EQ(events[7]["dur"].get<double>(), 1.001);
  EXPECT_EQ(events[8]["ph"], "i");
  EXPECT_EQ(events[8]["s"], "t");
  EXPECT_EQ(events[9]["ph"], "C");
  EXPECT_EQ(events[9]["args"]["reserved"], 2048);
  EXPECT_FALSE(events[9].contains("cat"));
  EXPECT_EQ(events[11]["ph"], "s");
  EXPECT_EQ(events[11]["id"], 9);
  EXPECT_FALSE(events[11].contains("bp"));
  EXPECT_EQ(events[12]["ph"], "f");
  EXPECT_EQ(events[12]["bp"], "e");
  EXPECT_EQ(events[13]["ph"], "b");
  EXPECT_EQ(events[13]["id"], 3);
  EXPECT_EQ(events[14]["ph"], "e");
}

TEST(trace_writer, round_trip_plain) {
  temp_file f(".json");
  const std::uint64_t origin = 5'000'000'000ULL;
  {
    trace_writer w(f.path(), origin);
    EXPECT_FALSE(w.compressed());
    write_sample(w, origin);
    w.close({{"note", "sample"}});
    EXPECT_TRUE(w.closed());
    EXPECT_EQ(w.events(), 15U);
  }
  // The whole document parses with nlohmann too, with its top-level members.
  const json doc = json::parse(read_bytes(f.path()));
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc["displayTimeUnit"], "ns");
  EXPECT_EQ(doc["otherData"]["note"], "sample");
  ASSERT_TRUE(doc["traceEvents"].is_array());
  expect_sample(doc["traceEvents"].get<std::vector<json>>());
  // The streaming reader sees the same events and the other members.
  poolscope::analysis::trace_read_info info;
  const auto events = read_events(f.path(), &info);
  EXPECT_FALSE(info.array_form);
  EXPECT_EQ(info.events, 15U);
  EXPECT_EQ(info.other["otherData"]["note"], "sample");
  expect_sample(events);
  expect_valid_trace(f.path());
}

TEST(trace_writer, round_trip_gzip_by_extension) {
  if (!poolscope::profiler::trace_gzip_supported()) {
    GTEST_SKIP() << "built without zlib";
  }
  temp_file plain(".json");
  temp_file gz(".json.gz");
  const std::uint64_t origin = 77;
  {
    trace_writer a(plain.path(), origin);
    trace_writer b(gz.path(), origin);
    EXPECT_TRUE(b.compressed());
    write_sample(a, origin);
    write_sample(b, origin);
  }  // the destructors close both
  const std::string bytes = read_bytes(gz.path());
  ASSERT_GE(bytes.size(), 2U);
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]), 0x1f);
  EXPECT_EQ(static_cast<unsigned char>(bytes[1]), 0x8b);
  const auto from_gz = read_events(gz.path());
  expect_sample(from_gz);
  EXPECT_EQ(from_gz, read_events(plain.path()));
  expect_valid_trace(gz.path());
}

TEST(trace_writer, forced_gzip_and_forced_plain) {
  if (!poolscope::profiler::trace_gzip_supported()) {
    GTEST_SKIP() << "built without zlib";
  }
  temp_file a(".trace");
  temp_file b(".json.gz");
  {
    trace_writer w(a.path(), 0, {.compression = trace_compression::gzip});
    w.process_name(1, "p");
  }
  {
    trace_writer w(b.path(), 0, {.compression = trace_compression::none});
    w.process_name(1, "p");
  }
  EXPECT_EQ(static_cast<unsigned char>(read_bytes(a.path())[0]), 0x1f);
  EXPECT_EQ(read_bytes(b.path())[0], '{');
  EXPECT_EQ(read_events(a.path()).size(), 1U);
  EXPECT_EQ(read_events(b.path()).size(), 1U);
  expect_valid_trace(a.path());
  expect_valid_trace(b.path());
}

TEST(trace_writer, small_chunks_stream_many_events) {
  temp_file f(".json");
  constexpr int n = 20000;
  {
    trace_writer w(f.path(), 0, {.chunk_bytes = 4096});
    w.process_name(1, "host");
    w.thread_name(1, 1, "t");
    for (int i = 0; i < n; ++i) {
      const trace_arg args[] = {{"i", i}};
      w.write({.phase = trace_phase::complete,
               .name = "e",
               .pid = 1,
               .tid = 1,
               .ts_ns = static_cast<std::uint64_t>(i) * 10,
               .dur_ns = 5,
               .args = args});
    }
    // Everything but the last chunk is already in the file.
    w.flush();
    EXPECT_GT(read_bytes(f.path()).size(), 100000U);
  }
  const auto events = read_events(f.path());
  ASSERT_EQ(events.size(), static_cast<std::size_t>(n) + 2);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(events[static_cast<std::size_t>(i) + 2]["args"]["i"], i);
    ASSERT_EQ(to_ns(events[static_cast<std::size_t>(i) + 2]["ts"]), i * 10LL);
  }
  expect_valid_trace(f.path());
}

TEST(trace_writer, preformatted_chunks_concatenate) {
  temp_file f(".json");
  {
    trace_writer w(f.path(), 1000);
    std::string chunk;
    poolscope::profiler::append_process_name(chunk, 1, "host");
    poolscope::profiler::append_thread_name(chunk, 1, 2, "t");
    poolscope::profiler::append_trace_event(chunk,
                                            {.phase = trace_phase::complete,
                                             .name = "a",
                                             .pid = 1,
                                             .tid = 2,
                                             .ts_ns = 1000,
                                             .dur_ns = 10},
                                            1000);
    w.write_formatted(chunk, 3);  // the first event of the file: its separator is dropped
    chunk.clear();
    poolscope::profiler::append_trace_event(chunk,
                                            {.phase = trace_phase::complete,
                                             .name = "b",
                                             .pid = 1,
                                             .tid = 2,
                                             .ts_ns = 500,
                                             .dur_ns = 10},
                                            1000);
    w.write_formatted(chunk, 1);
    EXPECT_EQ(w.events(), 4U);
  }
  const auto events = read_events(f.path());
  ASSERT_EQ(events.size(), 4U);
  EXPECT_EQ(events[2]["name"], "a");
  EXPECT_EQ(to_ns(events[2]["ts"]), 0);
  EXPECT_EQ(to_ns(events[3]["ts"]), -500);  // before the origin: negative
  expect_valid_trace(f.path());
}

TEST(trace_writer, empty_trace_is_valid) {
  temp_file f(".json");
  { trace_writer w(f.path(), 0); }
  const json doc = json::parse(read_bytes(f.path()));
  EXPECT_TRUE(doc["traceEvents"].empty());
  expect_valid_trace(f.path());
}

TEST(trace_writer, unwritable_path_throws_naming_it) {
  const std::string path = "/nonexistent-poolscope-dir/trace.json";
  try {
    trace_writer w(path, 0);
    FAIL() << "no exception";
  } catch (const poolscope::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(trace_writer, closed_writer_refuses_events) {
  temp_file f(".json");
  trace_writer w(f.path(), 0);
  w.close();
  EXPECT_THROW(w.process_name(1, "x"), poolscope::logic_error);
  w.close();  // idempotent
  expect_valid_trace(f.path());
}

}  // namespace
