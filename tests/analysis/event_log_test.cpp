// event_log: reading poolscope JSON Lines, the jsonl_hook format and RMM's CSV; typed errors
// naming the line for corrupt and truncated logs.
#include <gtest/gtest.h>

#include <string>

#include "poolscope/analysis/event_log.hpp"
#include "poolscope/error.hpp"

namespace poolscope::analysis {
namespace {

using hooks::event_kind;
using hooks::event_phase;

const char* const k_header = "{\"format\":\"poolscope.events\",\"version\":1,\"pid\":7}\n";

std::string line(std::uint64_t seq, const char* action, const char* ptr, std::size_t size,
                 const char* phase = nullptr) {
  std::string s = "{\"seq\":" + std::to_string(seq) + ",\"time_ns\":" + std::to_string(1000 + seq) +
                  ",\"thread\":11,\"device\":-1,\"stream\":\"0x0\",\"allocator\":\"best_fit/"
                  "host\",\"allocator_id\":3,\"action\":\"" +
                  action + "\",";
  if (phase != nullptr) {
    s += std::string("\"phase\":\"") + phase + "\",";
  }
  s += std::string("\"ptr\":\"") + ptr + "\",\"size\":" + std::to_string(size) +
       ",\"rounded\":" + std::to_string((size + 511) / 512 * 512) + "}\n";
  return s;
}

/// The parse_error thrown by parsing `text`; fails the test if none is thrown.
parse_error error_of(const std::string& text) {
  try {
    (void)parse_event_log_text(text, "log.jsonl");
  } catch (const parse_error& e) {
    return e;
  }
  ADD_FAILURE() << "no parse_error for:\n" << text;
  return parse_error("", 0, "");
}

TEST(event_log, reads_poolscope_lines_in_seq_order) {
  // Lines 2 and 3 are out of seq order, as two threads can write them.
  const std::string text = std::string(k_header) + line(0, "malloc", "0x1000", 100) +
                           line(2, "free", "0x1000", 100) + line(1, "device_alloc", "0x1000", 512) +
                           "\n" + line(3, "oom", "0x0", 1 << 30, "instant");
  const event_log log = parse_event_log_text(text);
  EXPECT_EQ(log.format, log_format::poolscope);
  ASSERT_EQ(log.records.size(), 4u);
  ASSERT_EQ(log.allocators.size(), 1u);
  EXPECT_EQ(log.allocators[0], "best_fit/host");
  const log_record& m = log.records[0];
  EXPECT_EQ(m.seq, 0u);
  EXPECT_EQ(m.time_ns, 1000u);
  EXPECT_EQ(m.thread, 11u);
  EXPECT_EQ(m.device, -1);
  EXPECT_EQ(m.allocator_id, 3u);
  EXPECT_EQ(m.kind, event_kind::pool_malloc);
  EXPECT_EQ(m.phase, event_phase::post);  // implied for malloc
  EXPECT_EQ(m.ptr, 0x1000u);
  EXPECT_EQ(m.size, 100u);
  EXPECT_EQ(m.rounded, 512u);
  EXPECT_EQ(m.line, 2u);
  EXPECT_EQ(log.records[1].kind, event_kind::device_alloc);
  EXPECT_EQ(log.records[1].line, 4u);
  EXPECT_EQ(log.records[2].kind, event_kind::pool_free);
  EXPECT_EQ(log.records[2].phase, event_phase::pre);
  EXPECT_EQ(log.records[3].kind, event_kind::oom);
  EXPECT_EQ(log.records[3].line, 6u);  // the blank line counts
}

TEST(event_log, reads_the_jsonl_hook_format) {
  const std::string text =
      "{\"seq\":12,\"time_ns\":8812739,\"thread\":4711,\"kind\":\"pool_malloc\",\"phase\":\"post\","
      "\"error\":\"none\",\"device\":0,\"stream\":\"0x5\",\"allocator_id\":1,"
      "\"allocator_name\":\"bfc/cuda:0\",\"ptr\":\"0x7f3a2c000000\",\"requested\":1000,"
      "\"rounded\":1024,\"aux_ptr\":\"0x0\",\"aux_bytes\":0,\"in_use\":1024,\"reserved\":2097152}"
      "\n";
  const event_log log = parse_event_log_text(text);
  EXPECT_EQ(log.format, log_format::jsonl_hook);
  ASSERT_EQ(log.records.size(), 1u);
  EXPECT_EQ(log.allocators[log.records[0].allocator], "bfc/cuda:0");
  EXPECT_EQ(log.records[0].kind, event_kind::pool_malloc);
  EXPECT_EQ(log.records[0].ptr, 0x7f3a2c000000u);
  EXPECT_EQ(log.records[0].size, 1000u);
  EXPECT_EQ(log.records[0].stream, 5u);
  EXPECT_EQ(log.records[0].device, 0);
}

TEST(event_log, corrupt_line_is_named) {
  const std::string text = std::string(k_header) + line(0, "malloc", "0x1000", 100) +
                           "{\"seq\":1,\"action\":\"malloc\",\"ptr\": oops}\n" +
                           line(2, "free", "0x1000", 100);
  const parse_error e = error_of(text);
  EXPECT_EQ(e.line(), 3u);
  EXPECT_EQ(e.source(), "log.jsonl");
  EXPECT_NE(std::string(e.what()).find("log.jsonl:3:"), std::string::npos) << e.what();
  EXPECT_EQ(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
}

TEST(event_log, truncated_last_line_is_named) {
  std::string text =
      std::string(k_header) + line(0, "malloc", "0x1000", 100) + line(1, "free", "0x1000", 100);
  text.resize(text.size() - 20);  // a crash mid-write
  const parse_error e = error_of(text);
  EXPECT_EQ(e.line(), 3u);
  EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  // A complete last line without a newline is fine.
  std::string whole = std::string(k_header) + line(0, "malloc", "0x1000", 100);
  whole.pop_back();
  EXPECT_EQ(parse_event_log_text(whole).records.size(), 1u);
}

TEST(event_log, bad_fields_are_named) {
  auto what_of = [](const std::string& bad) {
    return std::string(error_of(std::string(k_header) + bad + "\n").what());
  };
  EXPECT_NE(what_of("{\"action\":\"malloc\",\"ptr\":\"0x10\"}").find("'size'"), std::string::npos);
  EXPECT_NE(what_of("{\"action\":\"malloc\",\"size\":1}").find("'ptr'"), std::string::npos);
  EXPECT_NE(what_of("{\"action\":\"mallocate\",\"ptr\":\"0x10\",\"size\":1}").find("mallocate"),
            std::string::npos);
  EXPECT_NE(what_of("{\"action\":\"malloc\",\"ptr\":\"zz\",\"size\":1}").find("'ptr'"),
            std::string::npos);
  EXPECT_NE(what_of("{\"action\":\"malloc\",\"ptr\":\"0x1\",\"size\":-4}").find("'size'"),
            std::string::npos);
  EXPECT_NE(what_of("[1,2]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(what_of("{\"seq\":1}").find("neither"), std::string::npos);
  EXPECT_EQ(error_of("garbage\n").line(), 1u);
  EXPECT_EQ(error_of("\n\n{\"format\":\"other\"}\n").line(), 3u);
}

// "device" was read with get<int>() and "allocator_id" cut to 32 bits: 4294967296 loaded as
// device 0 and allocator 0 without a word. Out-of-range values are refused, naming the field
// and the value; the extremes that fit still load.
TEST(event_log, out_of_range_device_and_allocator_id_are_refused) {
  const auto line = [](const std::string& device, const std::string& id) {
    return std::string(k_header) + "{\"seq\":1,\"device\":" + device + ",\"allocator_id\":" + id +
           ",\"action\":\"malloc\",\"ptr\":\"0x10\",\"size\":1}\n";
  };
  const auto what_of = [&line](const std::string& device, const std::string& id) {
    return std::string(error_of(line(device, id)).what());
  };
  for (const char* device : {"4294967296", "2147483648", "-2", "-4294967295"}) {
    const std::string what = what_of(device, "1");
    EXPECT_NE(what.find("'device' value " + std::string(device)), std::string::npos) << what;
  }
  for (const char* id : {"4294967296", "18446744073709551615"}) {
    const std::string what = what_of("0", id);
    EXPECT_NE(what.find("'allocator_id' value " + std::string(id)), std::string::npos) << what;
  }
  const event_log ok = parse_event_log_text(line("2147483647", "4294967295"));
  ASSERT_EQ(ok.records.size(), 1u);
  EXPECT_EQ(ok.records[0].device, 2147483647);
  EXPECT_EQ(ok.records[0].allocator_id, 4294967295u);
  EXPECT_EQ(parse_event_log_text(line("-1", "0")).records.at(0).device, -1);
}

const char* const k_rmm_sample =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "140213,14:02:31.123456,allocate,0x7f1a00000000,1024,0x0\n"
    "140213,14:02:31.123460,allocate,0x7f1a00000400,4096,0x55d0c0ffee00\n"
    "140214,14:02:31.123461,allocate failure,(nil),68719476736,0x0\n"
    "140213,14:02:31.124000,free,0x7f1a00000000,1024,0x0\n"
    "140213,14:02:32.000001,free,0x7f1a00000400,4096,0x55d0c0ffee00\n";

TEST(event_log, reads_rmm_csv) {
  const event_log log = parse_event_log_text(k_rmm_sample, "rmm.csv");
  EXPECT_EQ(log.format, log_format::rmm_csv);
  ASSERT_EQ(log.records.size(), 5u);
  ASSERT_EQ(log.allocators.size(), 1u);
  const log_record& a = log.records[0];
  EXPECT_EQ(a.kind, event_kind::pool_malloc);
  EXPECT_EQ(a.thread, 140213u);
  EXPECT_EQ(a.ptr, 0x7f1a00000000u);
  EXPECT_EQ(a.size, 1024u);
  EXPECT_EQ(a.stream, 0u);
  EXPECT_EQ(a.time_ns, ((14u * 60 + 2) * 60 + 31) * 1'000'000'000ULL + 123'456'000ULL);
  EXPECT_EQ(a.line, 2u);
  EXPECT_EQ(log.records[1].stream, 0x55d0c0ffee00u);
  EXPECT_EQ(log.records[2].kind, event_kind::oom);
  EXPECT_EQ(log.records[2].ptr, 0u);
  EXPECT_EQ(log.records[2].size, 68719476736u);
  EXPECT_EQ(log.records[3].kind, event_kind::pool_free);
  EXPECT_EQ(log.records[3].phase, event_phase::pre);
  EXPECT_EQ(log.records[4].time_ns - log.records[3].time_ns, 876'001'000u);
  for (std::size_t i = 0; i < log.records.size(); ++i) {
    EXPECT_EQ(log.records[i].seq, i);
  }
}

TEST(event_log, rmm_csv_errors_name_the_line) {
  std::string text = k_rmm_sample;
  const parse_error bad_action = error_of(text + "140213,14:02:33.000000,reallocate,0x1,1,0x0\n");
  EXPECT_EQ(bad_action.line(), 7u);
  EXPECT_NE(std::string(bad_action.what()).find("reallocate"), std::string::npos);
  EXPECT_EQ(error_of(text + "140213,25:02:33.000000,free,0x1,1,0x0\n").line(), 7u);
  EXPECT_EQ(error_of(text + "140213,14:02:33.000000,free,0x1,many,0x0\n").line(), 7u);
  EXPECT_EQ(error_of(text + "140213,14:02:33.000000,free,0x1,1,0x0,extra\n").line(), 7u);
  const parse_error cut = error_of(text + "140213,14:02:33.000000,fr");
  EXPECT_EQ(cut.line(), 7u);
  EXPECT_NE(std::string(cut.what()).find("truncated"), std::string::npos) << cut.what();
}

TEST(event_log, dropped_lines_are_counted_and_a_repeated_record_read_once) {
  // A crash flush can write a record the writer thread also wrote (seq 2 twice); the recorder's
  // ring dropped 5 events, then 3.
  const std::string text = std::string(k_header) + line(1, "malloc", "0x1000", 100) +
                           "{\"dropped\":5}\n" + line(2, "free", "0x1000", 100) +
                           line(2, "free", "0x1000", 100) + "{\"dropped\":3}\n" +
                           line(3, "malloc", "0x2000", 100);
  const event_log log = parse_event_log_text(text);
  EXPECT_EQ(log.dropped_events, 8u);
  EXPECT_EQ(log.repeated_records, 1u);
  ASSERT_EQ(log.records.size(), 3u);
  EXPECT_EQ(log.records[1].seq, 2u);
  EXPECT_EQ(log.records[2].seq, 3u);
  EXPECT_EQ(error_of(std::string(k_header) + "{\"dropped\":-1}\n").line(), 2u);
}

TEST(event_log, actions_have_names) {
  for (auto k : {event_kind::pool_malloc, event_kind::pool_free, event_kind::device_alloc,
                 event_kind::device_free, event_kind::split, event_kind::merge, event_kind::release,
                 event_kind::oom, event_kind::limit_hit, event_kind::invalid_free}) {
    EXPECT_EQ(parse_action(profiler::action_name(k)), k);
  }
  EXPECT_THROW((void)parse_action("alloc"), invalid_argument);
  EXPECT_THROW((void)read_event_log("/nonexistent/log.jsonl"), runtime_error);
  EXPECT_TRUE(parse_event_log_text("").records.empty());
}

}  // namespace
}  // namespace poolscope::analysis
