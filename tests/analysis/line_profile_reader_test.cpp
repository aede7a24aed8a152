// Line profiles read back (line_profile_reader.hpp): the JSON round trip keeps everything, and
// documents that are not line profiles, values out of range, totals past 64 bits and absurd
// nesting are refused naming what is wrong.
#include "poolscope/analysis/line_profile_reader.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "poolscope/error.hpp"
#include "profiler/profile_test_data.hpp"

namespace poolscope::analysis {
namespace {

using profiler::line_profile;
using profiler::profile_node;
namespace test_data = profiler::test_data;
using test_data::expect_same_tree;
using test_data::nested_profile_json;
using test_data::sample;

TEST(line_profile_reader, json_round_trip_keeps_everything) {
  const line_profile p = sample();
  const std::string json = p.to_json();
  const line_profile q = line_profile_from_json(json);
  expect_same_tree(p.root, q.root);
  EXPECT_EQ(q.peak_live, p.peak_live);
  EXPECT_EQ(q.peak_seq, p.peak_seq);
  EXPECT_EQ(q.events, p.events);
  EXPECT_EQ(q.unmatched_frees, p.unmatched_frees);
  EXPECT_EQ(q.truncated_stacks, p.truncated_stacks);
  EXPECT_EQ(q.deferred_events, p.deferred_events);
  EXPECT_EQ(q.unwinder, p.unwinder);
  EXPECT_EQ(q.symbolizer, p.symbolizer);
  EXPECT_EQ(q.max_depth, p.max_depth);
  EXPECT_EQ(q.complete, p.complete);
  EXPECT_EQ(q.to_text(), p.to_text());
  EXPECT_EQ(q.to_folded(), p.to_folded());
  EXPECT_EQ(q.to_json(), json);
}

TEST(line_profile_reader, from_json_rejects_other_documents) {
  EXPECT_THROW((void)line_profile_from_json("not json"), invalid_argument);
  EXPECT_THROW((void)line_profile_from_json("{\"format\": \"other\"}"), invalid_argument);
  EXPECT_THROW(
      (void)line_profile_from_json("{\"format\": \"poolscope.line_profile\", \"version\": 99}"),
      invalid_argument);
  std::string json = sample().to_json();
  // Every occurrence (totals are recomputed on load, so a self figure must be hit).
  for (auto at = json.find("\"used\": 3145728"); at != std::string::npos;
       at = json.find("\"used\": 3145728")) {
    json.replace(at, 15, "\"used\": \"lots\"");
  }
  try {
    (void)line_profile_from_json(json);
    FAIL() << "accepted a string byte count";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("used"), std::string::npos) << e.what();
  }
}

/// The invalid_argument message of loading `json`; fails the test if it loads.
std::string load_error(const std::string& json) {
  try {
    (void)line_profile_from_json(json);
  } catch (const invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "loaded:\n" << json;
  return {};
}

/// sample().to_json() with the first `"key": old` replaced by `"key": replacement`.
std::string with_field(const std::string& key, const std::string& old,
                       const std::string& replacement) {
  std::string json = sample().to_json();
  const std::string from = "\"" + key + "\": " + old;
  const auto at = json.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) {
    json.replace(at, from.size(), "\"" + key + "\": " + replacement);
  }
  return json;
}

// "version" and "line" went through get<int>() (4294967297 read as version 1, a line 2^32 + 7 as
// line 7), and hex fields through std::stoull, which negates a leading '-' ("-0x10" loaded as
// 2^64 - 16). Each is refused, naming the field and the value.
TEST(line_profile_reader, from_json_refuses_out_of_range_and_negative_values) {
  const std::string json = sample().to_json();
  ASSERT_NE(json.find("\"version\": 1"), std::string::npos);
  std::string what = load_error(with_field("version", "1", "4294967297"));
  EXPECT_NE(what.find("version 4294967297"), std::string::npos) << what;
  what = load_error(with_field("version", "1", "-4294967295"));
  EXPECT_NE(what.find("version -4294967295"), std::string::npos) << what;

  const auto line_at = json.find("\"line\": ");
  ASSERT_NE(line_at, std::string::npos);
  const std::string line_value =
      json.substr(line_at + 8, json.find_first_of(",\n", line_at) - line_at - 8);
  for (const char* bad : {"4294967303", "2147483648", "-1"}) {
    what = load_error(with_field("line", line_value, bad));
    EXPECT_NE(what.find("'line' value " + std::string(bad)), std::string::npos) << what;
  }
  what = load_error(with_field("line", line_value, "[1]"));
  EXPECT_NE(what.find("'line' value an array"), std::string::npos) << what;

  const auto offset_at = json.find("\"offset\": ");
  ASSERT_NE(offset_at, std::string::npos);
  const std::string offset_value =
      json.substr(offset_at + 10, json.find_first_of(",\n", offset_at) - offset_at - 10);
  for (const char* bad :
       {"\"-0x10\"", "\"-1\"", "\" 10\"", "\"+10\"", "\"0x\"", "\"0x10000000000000000\""}) {
    what = load_error(with_field("offset", offset_value, bad));
    const std::string unquoted = std::string(bad).substr(1, std::string(bad).size() - 2);
    EXPECT_NE(what.find("'offset' value '" + unquoted + "'"), std::string::npos) << what;
  }
  // The largest values that fit still load (the first node written is the root).
  EXPECT_EQ(line_profile_from_json(with_field("offset", offset_value, "\"0xffffffffffffffff\""))
                .root.offset,
            UINT64_MAX);
  EXPECT_EQ(line_profile_from_json(with_field("line", line_value, "2147483647")).root.line,
            2147483647);
  // deferred_events is optional (files written before it), but must be a count when present.
  what = load_error(with_field("deferred_events", "5", "-5"));
  EXPECT_NE(what.find("'deferred_events'"), std::string::npos) << what;
  EXPECT_EQ(line_profile_from_json(with_field("deferred_events", "5", "7")).deferred_events, 7u);
}

TEST(line_profile_reader, from_json_refuses_figures_whose_totals_pass_64_bits) {
  // Each figure fits, but the totals (recomputed on load) wrapped: two call sites of 2^63 bytes
  // each showed the root with 0 bytes used, and `poolscope report` printed that.
  const std::uint64_t half = std::uint64_t{1} << 63;
  line_profile p = test_data::profile_of(
      {test_data::source_frame("a()", "/src/a.cpp", 1, test_data::allocations(1, half, half)),
       test_data::source_frame("b()", "/src/b.cpp", 2, test_data::allocations(1, half, 0))});
  const std::string what = load_error(p.to_json());
  EXPECT_NE(what.find("'used'"), std::string::npos) << what;
  EXPECT_NE(what.find("<root>"), std::string::npos) << what;
  EXPECT_EQ(what.find("'rounded'"), std::string::npos) << what;  // half + 0 fits
  // A node's own figures count in its total too.
  profile_node parent =
      test_data::source_frame("c()", "/src/c.cpp", 3, test_data::allocations(UINT64_MAX, 0, 0));
  parent.children.push_back(
      test_data::source_frame("d()", "/src/d.cpp", 4, test_data::allocations(1, 0, 0)));
  const std::string nested = load_error(test_data::profile_of({std::move(parent)}).to_json());
  EXPECT_NE(nested.find("'count'"), std::string::npos) << nested;
  EXPECT_NE(nested.find("c() (c.cpp:3)"), std::string::npos) << nested;
  // Totals of exactly 2^64 - 1 load.
  const line_profile edge = line_profile_from_json(
      test_data::profile_of(
          {test_data::source_frame("a()", "/src/a.cpp", 1, test_data::allocations(1, half, 0)),
           test_data::source_frame("b()", "/src/b.cpp", 2, test_data::allocations(1, half - 1, 0))})
          .to_json());
  EXPECT_EQ(edge.root.total.used, UINT64_MAX);
}

TEST(line_profile_reader, from_json_refuses_absurd_nesting_instead_of_overflowing_the_stack) {
  // What the profiler can write (the root and 256 frames) loads, with totals recomputed.
  const line_profile deepest = line_profile_from_json(nested_profile_json(257));
  EXPECT_EQ(deepest.root.total.used, 257U * 8);
  std::size_t levels = 1;
  for (const profile_node* n = &deepest.root; !n->children.empty(); n = &n->children[0]) {
    ++levels;
  }
  EXPECT_EQ(levels, 257U);
  // A crafted file 200000 levels deep once recursed once per level and crashed the reader
  // (`poolscope report`); it is refused with a typed error saying why.
  try {
    (void)line_profile_from_json(nested_profile_json(200000));
    FAIL() << "accepted 200000 levels";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nested more than 1024"), std::string::npos) << e.what();
  }
}

TEST(line_profile_reader, a_saved_report_loads_and_renders) {
  const line_profile p = sample();
  const std::string path = ::testing::TempDir() + "poolscope_line_profile_test.json";
  {
    std::ofstream out(path);
    out << p.to_json();
  }
  EXPECT_EQ(render_line_profile_file(path), p.to_text());
  EXPECT_EQ(render_line_profile_file(path, {.threshold_bytes = 1 << 20}),
            p.to_text({.threshold_bytes = 1 << 20}));
  std::remove(path.c_str());
  EXPECT_THROW((void)load_line_profile(path), runtime_error);
}

}  // namespace
}  // namespace poolscope::analysis
