// line_profile: text tree, folded stacks and JSON, parsed back; loading a saved report.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/profiler/line_profile.hpp"
#include "profiler/profile_test_data.hpp"

namespace poolscope::profiler {
namespace {

using test_data::nested_profile_json;

profile_node frame(std::string function, std::string file, int line, std::uint64_t address,
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

profile_counts used(std::uint64_t count, std::uint64_t bytes, std::uint64_t acquired = 0,
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

/// main -> train -> { forward -> matmul [3 MiB], backward [1 MiB] }, main -> load [512 B],
/// plus a frame known only by module+offset and one known by nothing.
line_profile sample() {
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

void expect_same_tree(const profile_node& a, const profile_node& b) {
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

TEST(line_profile, totals_add_up_the_subtree) {
  const line_profile p = sample();
  EXPECT_EQ(p.root.total.used, (3u << 20) + (1u << 20) + 512 + 100 + 7);
  EXPECT_EQ(p.root.total.count, 3u + 1 + 2 + 1 + 1);
  EXPECT_EQ(p.root.total.acquired, 4u << 20);
  EXPECT_EQ(p.root.total.live, 1u << 20);
  EXPECT_EQ(p.root.children[0].children[0].total.used, 4u << 20);  // train
}

TEST(line_profile, labels_say_what_is_known) {
  const line_profile p = sample();
  EXPECT_EQ(p.root.children[0].label(), "main (main.cpp:40)");
  EXPECT_EQ(p.root.children[1].label(), "libvendor.so+0xabc");
  EXPECT_EQ(p.root.children[1].children[0].label(), "0xdeadbeef");
  profile_node n;
  n.function = "f;g\nh";
  n.module = "/lib/x.so";
  n.offset = 0x10;
  EXPECT_EQ(n.label(), "f,g h (x.so+0x10)");  // never a ';' or a newline (folded format)
}

TEST(line_profile, text_is_cupys_tree) {
  const line_profile p = sample();
  const std::string text = p.to_text();
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) {
    lines.push_back(l);
  }
  ASSERT_EQ(lines.size(), 9u) << text;
  EXPECT_EQ(lines[0], "<root> (4.00MiB, 4.00MiB)");
  EXPECT_EQ(lines[1], "  main (main.cpp:40) (4.00MiB, 4.00MiB)");
  EXPECT_EQ(lines[2], "    train(model&) (train.cpp:12) (4.00MiB, 4.00MiB)");
  EXPECT_EQ(lines[3], "      forward(model&) (model.cpp:88) (3.00MiB, 4.00MiB)");
  EXPECT_EQ(lines[4],
            "        matmul(tensor const&, tensor const&) (ops.cpp:7) (3.00MiB, 4.00MiB)");
  EXPECT_EQ(lines[5], "      backward(model&) (model.cpp:120) (1.00MiB, 0B)");
  EXPECT_EQ(lines[6], "    load() (io.cpp:3) (512B, 0B)");
  EXPECT_EQ(lines[7], "  libvendor.so+0xabc (107B, 0B)");
  EXPECT_EQ(lines[8], "    0xdeadbeef (7B, 0B)");
}

TEST(line_profile, text_threshold_prunes_small_subtrees) {
  const line_profile p = sample();
  const std::string text = p.to_text({.threshold_bytes = 1 << 20});
  EXPECT_NE(text.find("backward"), std::string::npos);  // exactly the threshold: kept
  EXPECT_EQ(text.find("load()"), std::string::npos);
  EXPECT_EQ(text.find("libvendor"), std::string::npos);
  EXPECT_EQ(text.find("0xdeadbeef"), std::string::npos);
  EXPECT_EQ(text.rfind("<root>", 0), 0u);
}

TEST(line_profile, text_can_show_live_figures) {
  const std::string text = sample().to_text({.show_live = true});
  EXPECT_NE(text.find("matmul(tensor const&, tensor const&) (ops.cpp:7) (3.00MiB, 4.00MiB) live "
                      "1.00MiB, at peak 2.00MiB, calls 3"),
            std::string::npos)
      << text;
}

/// Parses folded stacks: "a;b;c 123" lines.
std::map<std::vector<std::string>, std::uint64_t> parse_folded(const std::string& folded) {
  std::map<std::vector<std::string>, std::uint64_t> out;
  std::istringstream in(folded);
  for (std::string line; std::getline(in, line);) {
    const auto space = line.rfind(' ');
    EXPECT_NE(space, std::string::npos) << line;
    const std::string value = line.substr(space + 1);
    EXPECT_FALSE(value.empty());
    EXPECT_EQ(value.find_first_not_of("0123456789"), std::string::npos) << line;
    std::vector<std::string> frames;
    std::string path = line.substr(0, space);
    for (std::size_t start = 0;;) {
      const auto semi = path.find(';', start);
      frames.push_back(path.substr(start, semi - start));
      if (semi == std::string::npos) {
        break;
      }
      start = semi + 1;
    }
    out[frames] += std::stoull(value);
  }
  return out;
}

TEST(line_profile, folded_stacks_parse_back_to_the_tree) {
  const line_profile p = sample();
  const auto stacks = parse_folded(p.to_folded());
  ASSERT_EQ(stacks.size(), 5u);
  using v = std::vector<std::string>;
  EXPECT_EQ(stacks.at(v{"main (main.cpp:40)", "train(model&) (train.cpp:12)",
                        "forward(model&) (model.cpp:88)",
                        "matmul(tensor const&, tensor const&) (ops.cpp:7)"}),
            3u << 20);
  EXPECT_EQ(stacks.at(v{"main (main.cpp:40)", "train(model&) (train.cpp:12)",
                        "backward(model&) (model.cpp:120)"}),
            1u << 20);
  EXPECT_EQ(stacks.at(v{"main (main.cpp:40)", "load() (io.cpp:3)"}), 512u);
  EXPECT_EQ(stacks.at(v{"libvendor.so+0xabc"}), 100u);
  EXPECT_EQ(stacks.at(v{"libvendor.so+0xabc", "0xdeadbeef"}), 7u);
  std::uint64_t sum = 0;
  for (const auto& [k, n] : stacks) {
    sum += n;
  }
  EXPECT_EQ(sum, p.root.total.used);

  // Another metric: only stacks with acquired bytes.
  const auto acquired = parse_folded(p.to_folded(profile_metric::acquired));
  ASSERT_EQ(acquired.size(), 1u);
  EXPECT_EQ(acquired.begin()->second, 4u << 20);
  EXPECT_EQ(parse_profile_metric("live_at_peak"), profile_metric::live_at_peak);
  EXPECT_THROW((void)parse_profile_metric("bogus"), invalid_argument);
}

TEST(line_profile, json_round_trip_keeps_everything) {
  const line_profile p = sample();
  const std::string json = p.to_json();
  const line_profile q = line_profile::from_json(json);
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

TEST(line_profile, from_json_rejects_other_documents) {
  EXPECT_THROW((void)line_profile::from_json("not json"), invalid_argument);
  EXPECT_THROW((void)line_profile::from_json("{\"format\": \"other\"}"), invalid_argument);
  EXPECT_THROW(
      (void)line_profile::from_json("{\"format\": \"poolscope.line_profile\", \"version\": 99}"),
      invalid_argument);
  std::string json = sample().to_json();
  // Every occurrence (totals are recomputed on load, so a self figure must be hit).
  for (auto at = json.find("\"used\": 3145728"); at != std::string::npos;
       at = json.find("\"used\": 3145728")) {
    json.replace(at, 15, "\"used\": \"lots\"");
  }
  try {
    (void)line_profile::from_json(json);
    FAIL() << "accepted a string byte count";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("used"), std::string::npos) << e.what();
  }
}

/// The invalid_argument message of loading `json`; fails the test if it loads.
std::string load_error(const std::string& json) {
  try {
    (void)line_profile::from_json(json);
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
TEST(line_profile, from_json_refuses_out_of_range_and_negative_values) {
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
  EXPECT_EQ(line_profile::from_json(with_field("offset", offset_value, "\"0xffffffffffffffff\""))
                .root.offset,
            UINT64_MAX);
  EXPECT_EQ(line_profile::from_json(with_field("line", line_value, "2147483647")).root.line,
            2147483647);
  // deferred_events is optional (files written before it), but must be a count when present.
  what = load_error(with_field("deferred_events", "5", "-5"));
  EXPECT_NE(what.find("'deferred_events'"), std::string::npos) << what;
  EXPECT_EQ(line_profile::from_json(with_field("deferred_events", "5", "7")).deferred_events, 7u);
}

TEST(line_profile, from_json_refuses_figures_whose_totals_pass_64_bits) {
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
  const line_profile edge = line_profile::from_json(
      test_data::profile_of(
          {test_data::source_frame("a()", "/src/a.cpp", 1, test_data::allocations(1, half, 0)),
           test_data::source_frame("b()", "/src/b.cpp", 2, test_data::allocations(1, half - 1, 0))})
          .to_json());
  EXPECT_EQ(edge.root.total.used, UINT64_MAX);
}

TEST(line_profile, from_json_refuses_absurd_nesting_instead_of_overflowing_the_stack) {
  // What the profiler can write (the root and 256 frames) loads, with totals recomputed.
  const line_profile deepest = line_profile::from_json(nested_profile_json(257));
  EXPECT_EQ(deepest.root.total.used, 257U * 8);
  std::size_t levels = 1;
  for (const profile_node* n = &deepest.root; !n->children.empty(); n = &n->children[0]) {
    ++levels;
  }
  EXPECT_EQ(levels, 257U);
  // A crafted file 200000 levels deep once recursed once per level and crashed the reader
  // (`poolscope report`); it is refused with a typed error saying why.
  try {
    (void)line_profile::from_json(nested_profile_json(200000));
    FAIL() << "accepted 200000 levels";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nested more than 1024"), std::string::npos) << e.what();
  }
}

TEST(line_profile, a_saved_report_loads_and_renders) {
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
}  // namespace poolscope::profiler
