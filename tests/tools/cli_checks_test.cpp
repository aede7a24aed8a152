// The tools' numeric option validators (tools/src/cli_checks.hpp): what they
// accept and the words they reject with, on a CLI::App parsed here.
#include "cli_checks.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

/// Parses `--x value` on an app whose --x (a number, or with `T` = std::string a text) has
/// `check`; returns "" or the error's text.
template <typename T = double>
std::string parse_x(const CLI::Validator& check, const std::string& value) {
  CLI::App app{"t"};
  T x{};
  app.add_option("--x", x)->check(check);
  std::vector<std::string> args{value, "--x"};  // CLI11 parses a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(cli_checks, positive_number_takes_finite_numbers_above_zero) {
  const auto check = poolscope::tools::positive_number();
  for (const char* ok : {"1", "0.05", "1e-9", "3600"}) {
    EXPECT_EQ(parse_x(check, ok), "") << ok;
  }
  for (const char* bad : {"0", "-1", "-0.0", "nan", "inf"}) {
    EXPECT_EQ(parse_x(check, bad),
              std::string("--x: must be a number greater than 0, not '") + bad + "'")
        << bad;
  }
  for (const char* text : {"abc", "1x", ""}) {
    EXPECT_EQ(parse_x(check, text),
              std::string("--x: '") + text + "' is not a number (a number greater than 0)")
        << text;
  }
}

TEST(cli_checks, non_negative_number_takes_zero_and_above) {
  const auto check = poolscope::tools::non_negative_number();
  for (const char* ok : {"0", "0.0", "2", "80"}) {
    EXPECT_EQ(parse_x(check, ok), "") << ok;
  }
  for (const char* bad : {"-1", "-0.5", "nan", "-inf"}) {
    EXPECT_EQ(parse_x(check, bad),
              std::string("--x: must be a number not below 0, not '") + bad + "'")
        << bad;
  }
  EXPECT_EQ(parse_x(check, "abc"), "--x: 'abc' is not a number (a number not below 0)");
}

TEST(cli_checks, whole_number_says_not_a_number_where_that_is_the_problem) {
  const auto check = poolscope::tools::whole_number(1, 1000);
  for (const char* ok : {"1", "17", "1000"}) {
    EXPECT_EQ(parse_x(check, ok), "") << ok;
  }
  EXPECT_EQ(parse_x(check, "abc"), "--x: 'abc' is not a number (a whole number from 1 to 1000)");
  EXPECT_EQ(parse_x(check, "2.5"), "--x: must be a whole number from 1 to 1000, not '2.5'");
  EXPECT_EQ(parse_x(check, "0"), "--x: must be from 1 to 1000, not 0");
  EXPECT_EQ(parse_x(check, "99999999999999999999"),
            "--x: must be from 1 to 1000, not 99999999999999999999");
}

TEST(cli_checks, a_path_never_takes_an_option) {
  using poolscope::tools::path_value;
  EXPECT_EQ(parse_x<std::string>(path_value(), "out.json"), "");
  EXPECT_EQ(parse_x<std::string>(path_value(), "--report"),
            "--x: needs a path, not '--report' (the path is missing; for a file of that name "
            "write ./--report)");
  EXPECT_NE(parse_x<std::string>(path_value(), "-"), "");
  EXPECT_EQ(parse_x<std::string>(path_value(true), "-"), "");
}

}  // namespace
