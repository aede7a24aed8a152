// The tools' numeric option validators (tools/src/cli_checks.hpp): what they
// accept and the words they reject with, on a CLI::App parsed here.
#include "cli_checks.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

/// Parses `--x value` on an app whose --x has `check`; returns "" or the error's text.
std::string parse_x(const CLI::Validator& check, const std::string& value) {
  CLI::App app{"t"};
  double x = -1;
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
  for (const char* bad : {"0", "-1", "-0.0", "abc", "1x", "nan", "inf", ""}) {
    EXPECT_EQ(parse_x(check, bad),
              std::string("--x: must be a number greater than 0, not '") + bad + "'")
        << bad;
  }
}

TEST(cli_checks, non_negative_number_takes_zero_and_above) {
  const auto check = poolscope::tools::non_negative_number();
  for (const char* ok : {"0", "0.0", "2", "80"}) {
    EXPECT_EQ(parse_x(check, ok), "") << ok;
  }
  for (const char* bad : {"-1", "-0.5", "abc", "nan", "-inf"}) {
    EXPECT_EQ(parse_x(check, bad),
              std::string("--x: must be a number not below 0, not '") + bad + "'")
        << bad;
  }
}

}  // namespace
