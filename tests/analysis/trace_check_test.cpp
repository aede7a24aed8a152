// check_trace on a valid trace and on a set of broken ones: each broken trace must be reported,
// with the offending event named (index, name, ts).
#include "poolscope/analysis/trace_check.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "profiler/trace_test_util.hpp"

namespace {

using poolscope::analysis::check_trace;
using poolscope::analysis::check_trace_text;
using poolscope::analysis::trace_check_result;
using poolscope::profiler::testing::temp_file;

// Metadata naming pid 1 (tid 1, 2) and pid 100 (tid 7).
const std::string names = R"(
  {"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"host"}},
  {"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"name":"main"}},
  {"ph":"M","name":"thread_name","pid":1,"tid":2,"args":{"name":"worker"}},
  {"ph":"M","name":"process_name","pid":100,"tid":0,"args":{"name":"GPU 0"}},
  {"ph":"M","name":"thread_name","pid":100,"tid":7,"args":{"name":"stream 7"}})";

std::string trace_of(const std::string& events) {
  return R"({"traceEvents":[)" + names + (events.empty() ? "" : "," + events) +
         R"(],"displayTimeUnit":"ns"})";
}

trace_check_result check(const std::string& events) {
  return check_trace_text(trace_of(events));
}

// The result has exactly one issue, and its text contains every fragment.
void expect_one_issue(const trace_check_result& r, std::initializer_list<std::string> fragments) {
  ASSERT_EQ(r.issue_count, 1U) << r.to_text();
  const std::string text = r.issues.front().to_string();
  for (const std::string& f : fragments) {
    EXPECT_NE(text.find(f), std::string::npos) << "'" << f << "' not in: " << text;
  }
  EXPECT_FALSE(r.ok());
}

const std::string valid_events = R"(
  {"ph":"X","name":"step","cat":"user","pid":1,"tid":1,"ts":0.000,"dur":100.000},
  {"ph":"X","name":"inner","cat":"user","pid":1,"tid":1,"ts":10.000,"dur":20.000},
  {"ph":"X","name":"same start, shorter","pid":1,"tid":1,"ts":10.000,"dur":5.000},
  {"ph":"X","name":"touching","pid":1,"tid":1,"ts":30.000,"dur":70.000},
  {"ph":"X","name":"launch","cat":"cuda_api","pid":1,"tid":1,"ts":40.000,"dur":2.000},
  {"ph":"X","name":"other thread","pid":1,"tid":2,"ts":5.000,"dur":200.000},
  {"ph":"X","name":"kernel","cat":"kernel","pid":100,"tid":7,"ts":45.000,"dur":10.001,
   "args":{"device":0}},
  {"ph":"s","name":"launch","cat":"launch","pid":1,"tid":1,"ts":40.000,"id":1},
  {"ph":"f","name":"launch","cat":"launch","pid":100,"tid":7,"ts":45.000,"id":1,"bp":"e"},
  {"ph":"B","name":"b/e slice","pid":1,"tid":2,"ts":10.000},
  {"ph":"E","pid":1,"tid":2,"ts":20.000},
  {"ph":"i","name":"mark","pid":1,"tid":1,"ts":3.0,"s":"t"},
  {"ph":"i","name":"process mark","pid":1,"tid":99,"ts":3.0,"s":"p"},
  {"ph":"C","name":"memory","pid":100,"tid":0,"ts":1.0,"args":{"in_use":10,"reserved":20.5}},
  {"ph":"b","name":"range","cat":"nvtx","pid":1,"tid":1,"ts":1.0,"id":5},
  {"ph":"b","name":"range2","cat":"nvtx","pid":1,"tid":1,"ts":2.0,"id":6},
  {"ph":"e","name":"range","cat":"nvtx","pid":1,"tid":1,"ts":150.0,"id":5},
  {"ph":"e","name":"range2","cat":"nvtx","pid":1,"tid":1,"ts":3.0,"id":6})";

TEST(trace_check, valid_trace_passes) {
  const trace_check_result r = check(valid_events);
  EXPECT_TRUE(r.ok()) << r.to_text();
  EXPECT_EQ(r.events, 23U);
  EXPECT_EQ(r.flows, 1U);
  EXPECT_EQ(r.slices, 8U);  // 7 X + one B/E pair
  EXPECT_EQ(r.tracks, 3U);
  EXPECT_EQ(r.phases.at("X"), 7U);
  EXPECT_EQ(r.phases.at("M"), 5U);
  EXPECT_NE(r.to_text().find("OK"), std::string::npos);
}

TEST(trace_check, array_form_and_files) {
  temp_file f(".json");
  {
    std::ofstream out(f.path());
    out << "[" << names << "," << valid_events << "]";
  }
  const trace_check_result r = check_trace(f.path());
  EXPECT_TRUE(r.ok()) << r.to_text();
  EXPECT_EQ(r.events, 23U);
}

TEST(trace_check, unclosed_complete_event) {
  const auto r = check(R"({"ph":"X","name":"open","pid":1,"tid":1,"ts":1.5})");
  expect_one_issue(r, {"event #5", "\"open\"", "ts 1.500 us", "no \"dur\"", "unclosed"});
  EXPECT_EQ(r.issues[0].index, 5);
  EXPECT_EQ(r.issues[0].name, "open");
}

TEST(trace_check, overlapping_slices_that_do_not_nest) {
  const auto r = check(R"(
    {"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10},
    {"ph":"X","name":"b","pid":1,"tid":1,"ts":5,"dur":10})");
  expect_one_issue(
      r, {"event #6", "\"b\"", "overlaps event #5", "\"a\"", "without nesting", "pid 1 tid 1"});
  // The same on two tracks is fine, and so is nesting and touching.
  EXPECT_TRUE(check(R"(
    {"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10},
    {"ph":"X","name":"b","pid":1,"tid":2,"ts":5,"dur":10},
    {"ph":"X","name":"c","pid":1,"tid":1,"ts":10,"dur":10},
    {"ph":"X","name":"d","pid":1,"tid":1,"ts":12,"dur":8})")
                  .ok());
  // Overlap by one nanosecond is caught (ts with three decimals are exact ns).
  EXPECT_EQ(check(R"(
    {"ph":"X","name":"a","pid":1,"tid":1,"ts":0.000,"dur":10.001},
    {"ph":"X","name":"b","pid":1,"tid":1,"ts":10.000,"dur":1.000})")
                .issue_count,
            1U);
  // Overlapping B/E pairs are slices too.
  expect_one_issue(check(R"(
    {"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10},
    {"ph":"B","name":"b","pid":1,"tid":1,"ts":5},
    {"ph":"E","pid":1,"tid":1,"ts":15})"),
                   {"without nesting"});
}

TEST(trace_check, unbalanced_begin_end) {
  expect_one_issue(check(R"({"ph":"B","name":"open","pid":1,"tid":1,"ts":1})"),
                   {"\"open\"", "unclosed"});
  expect_one_issue(check(R"({"ph":"E","pid":1,"tid":1,"ts":1})"), {"end (E) without"});
}

TEST(trace_check, missing_fields) {
  expect_one_issue(check(R"({"name":"x","pid":1,"tid":1,"ts":1})"), {"missing field \"ph\""});
  expect_one_issue(check(R"({"ph":"i","pid":1,"tid":1,"ts":1})"), {"missing field \"name\""});
  expect_one_issue(check(R"({"ph":"i","name":"x","tid":1,"ts":1})"), {"missing field \"pid\""});
  expect_one_issue(check(R"({"ph":"X","name":"x","pid":1,"tid":1,"dur":1})"),
                   {"missing field \"ts\""});
  expect_one_issue(check(R"({"ph":"X","name":"x","pid":1,"ts":1,"dur":1})"),
                   {"missing field \"tid\""});
  expect_one_issue(check(R"({"ph":"X","name":"x","pid":1,"tid":1,"ts":"1","dur":1})"),
                   {"\"ts\" is not a number"});
  expect_one_issue(check(R"({"ph":"X","name":"x","pid":"1","tid":1,"ts":1,"dur":1})"),
                   {"\"pid\" is not an integer"});
  expect_one_issue(check(R"({"ph":"X","name":"x","pid":1,"tid":1,"ts":1,"dur":-1})"), {"negative"});
  expect_one_issue(check(R"({"ph":"X","name":"x","pid":1,"tid":1,"ts":1,"dur":1,"args":3})"),
                   {"\"args\" is not an object"});
  expect_one_issue(check(R"({"ph":"i","name":"x","pid":1,"tid":1,"ts":1,"s":"q"})"),
                   {"instant scope"});
  expect_one_issue(check(R"(7)"), {"not a JSON object"});
}

TEST(trace_check, times_out_of_range) {
  // `trace summary` leaves out times beyond 9e15 µs from the origin (their ns do not fit 64
  // bits) and says `trace check` names them: the checker passed them, and summed them wrapped.
  expect_one_issue(check(R"({"ph":"i","name":"far","pid":1,"tid":1,"ts":1e300})"),
                   {"event #5 \"far\" (ts 1e+300 us): \"ts\" 1e+300 is out of range"});
  expect_one_issue(check(R"({"ph":"X","name":"long","pid":1,"tid":1,"ts":1,"dur":1e300})"),
                   {"event #5", "\"long\"", "\"dur\" 1e+300 is out of range"});
  expect_one_issue(check(R"({"ph":"X","name":"late","pid":1,"tid":1,"ts":8e15,"dur":8e15})"),
                   {"event #5", "\"late\"", "ends past the range"});
  expect_one_issue(check(R"({"ph":"s","name":"early","cat":"c","pid":1,"tid":1,"ts":-1e16,
                            "id":1})"),
                   {"event #5", "\"ts\" -1e+16 is out of range"});
  // The ends of the range themselves are times.
  EXPECT_TRUE(check(R"({"ph":"X","name":"a","pid":1,"tid":1,"ts":-9e15,"dur":1},
                       {"ph":"X","name":"b","pid":1,"tid":1,"ts":8e15,"dur":1e15})")
                  .ok());
}

TEST(trace_check, device_ids_of_device_activity) {
  // `trace summary` leaves out device activity whose device is not an int from -1 up (it summed
  // 4294967296 on device 0 once): the checker names such events.
  expect_one_issue(check(R"({"ph":"X","name":"k","cat":"kernel","pid":100,"tid":7,"ts":1,"dur":1,
                "args":{"device":4294967296}})"),
                   {"event #5", "\"k\"", "args \"device\" 4294967296 is not a device"});
  expect_one_issue(check(R"({"ph":"X","name":"c","cat":"memcpy","pid":100,"tid":7,"ts":1,"dur":1,
                "args":{"device":0,"src_device":0,"dst_device":-2}})"),
                   {"event #5", "args \"dst_device\" -2 is not a device"});
  expect_one_issue(check(R"({"ph":"X","name":"k","cat":"kernel","pid":100,"tid":7,"ts":1,"dur":1,
                "args":{"device":"0"}})"),
                   {"event #5", "args \"device\" \"0\" is not a device"});
  // The host (-1), the largest int, and categories the summary does not count are fine.
  EXPECT_TRUE(check(R"({"ph":"X","name":"h","cat":"kernel","pid":1,"tid":1,"ts":1,"dur":1,
                        "args":{"device":-1}},
                       {"ph":"X","name":"k","cat":"kernel","pid":100,"tid":7,"ts":1,"dur":1,
                        "args":{"device":2147483647}},
                       {"ph":"X","name":"s","cat":"user","pid":1,"tid":2,"ts":1,"dur":1,
                        "args":{"device":4294967296}})")
                  .ok());
}

TEST(trace_check, unknown_phase) {
  const auto r = check(R"({"ph":"Q","name":"strange","pid":1,"tid":1,"ts":2})");
  expect_one_issue(r, {"event #5", "\"strange\"", "unknown phase \"Q\""});
  expect_one_issue(check(R"({"ph":"XX","name":"x","pid":1,"tid":1,"ts":2})"), {"unknown phase"});
}

TEST(trace_check, unpaired_flows) {
  expect_one_issue(check(R"(
    {"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10},
    {"ph":"s","name":"launch","cat":"launch","pid":1,"tid":1,"ts":1,"id":4})"),
                   {"event #6", "\"launch\"", "flow start (s) has no flow end"});
  expect_one_issue(check(R"(
    {"ph":"X","name":"k","pid":100,"tid":7,"ts":0,"dur":10},
    {"ph":"f","name":"launch","cat":"launch","pid":100,"tid":7,"ts":1,"id":4,"bp":"e"})"),
                   {"flow end (f) has no flow start"});
  // Same id, another cat: not a pair (two issues).
  EXPECT_EQ(check(R"(
    {"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10},
    {"ph":"X","name":"k","pid":100,"tid":7,"ts":0,"dur":10},
    {"ph":"s","name":"l","cat":"one","pid":1,"tid":1,"ts":1,"id":4},
    {"ph":"f","name":"l","cat":"two","pid":100,"tid":7,"ts":2,"id":4,"bp":"e"})")
                .issue_count,
            2U);
  // An end before its start.
  expect_one_issue(check(R"(
    {"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10},
    {"ph":"X","name":"k","pid":100,"tid":7,"ts":0,"dur":10},
    {"ph":"s","name":"l","cat":"c","pid":1,"tid":1,"ts":5,"id":4},
    {"ph":"f","name":"l","cat":"c","pid":100,"tid":7,"ts":2,"id":4,"bp":"e"})"),
                   {"ends", "before it starts"});
  // A start outside every slice of its track cannot bind.
  expect_one_issue(check(R"(
    {"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10},
    {"ph":"X","name":"k","pid":100,"tid":7,"ts":0,"dur":30},
    {"ph":"s","name":"l","cat":"c","pid":1,"tid":1,"ts":20,"id":4},
    {"ph":"f","name":"l","cat":"c","pid":100,"tid":7,"ts":25,"id":4,"bp":"e"})"),
                   {"flow start is not inside any slice"});
  expect_one_issue(check(R"({"ph":"s","name":"l","pid":1,"tid":1,"ts":1})"), {"no \"id\""});
}

TEST(trace_check, unpaired_async) {
  expect_one_issue(check(R"({"ph":"b","name":"r","cat":"nvtx","pid":1,"tid":1,"ts":1,"id":2})"),
                   {"async begin (b) has no async end"});
  expect_one_issue(check(R"(
    {"ph":"b","name":"r","cat":"nvtx","pid":1,"tid":1,"ts":1,"id":2},
    {"ph":"e","name":"other","cat":"nvtx","pid":1,"tid":1,"ts":2,"id":2},
    {"ph":"e","name":"r","cat":"nvtx","pid":1,"tid":1,"ts":3,"id":2})"),
                   {"async end (e) has no async begin"});
}

TEST(trace_check, unnamed_tracks) {
  expect_one_issue(check(R"({"ph":"X","name":"x","pid":1,"tid":3,"ts":1,"dur":1})"),
                   {"event #5", "pid 1 tid 3 has no thread_name"});
  expect_one_issue(check(R"({"ph":"C","name":"c","pid":5,"ts":1,"args":{"v":1}})"),
                   {"pid 5 has no process_name"});
  // A thread name without a process name.
  const auto r = check_trace_text(R"({"traceEvents":[
    {"ph":"M","name":"thread_name","pid":9,"tid":1,"args":{"name":"t"}},
    {"ph":"X","name":"x","pid":9,"tid":1,"ts":1,"dur":1}]})");
  expect_one_issue(r, {"pid 9 has no process_name"});
  expect_one_issue(check(R"({"ph":"M","name":"thread_name","pid":1,"tid":5,"args":{}})"),
                   {"metadata has no args.name"});
}

TEST(trace_check, counters_need_numbers) {
  expect_one_issue(check(R"({"ph":"C","name":"mem","pid":1,"ts":1,"args":{"v":"x"}})"),
                   {"\"mem\"", "counter arg \"v\" is not a number"});
  expect_one_issue(check(R"({"ph":"C","name":"mem","pid":1,"ts":1})"), {"has no args"});
}

TEST(trace_check, files_that_are_not_traces) {
  auto r = check_trace_text("{\"traceEvents\":[");
  expect_one_issue(r, {"trace:", "not valid JSON"});
  r = check_trace_text("{\"displayTimeUnit\":\"ns\"}");
  expect_one_issue(r, {"no event array"});
  r = check_trace_text("{\"traceEvents\":5}");
  expect_one_issue(r, {"not an array"});
  r = check_trace("/nonexistent-poolscope-dir/t.json");
  expect_one_issue(r, {"cannot open"});
}

TEST(trace_check, issues_are_capped_but_counted) {
  std::string events;
  for (int i = 0; i < 50; ++i) {
    events += (i == 0 ? "" : ",") + std::string(R"({"ph":"Q","name":"q","pid":1,"ts":1})");
  }
  const auto r = check_trace_text(trace_of(events), {.max_issues = 10});
  EXPECT_EQ(r.issue_count, 50U);
  EXPECT_EQ(r.issues.size(), 10U);
  EXPECT_NE(r.to_text().find("and 40 more"), std::string::npos);
}

}  // namespace
