// line_profile: the totals, the labels, the text tree and the folded stacks. (The JSON read back:
// line_profile_reader_test.cpp.)
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/profiler/line_profile.hpp"
#include "profiler/profile_test_data.hpp"

namespace poolscope::profiler {
namespace {

using test_data::sample;

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

}  // namespace
}  // namespace poolscope::profiler
