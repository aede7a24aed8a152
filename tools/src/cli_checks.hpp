// Validators for the command-line tools' numeric and on/off options. CLI11's PositiveNumber and
// NonNegativeNumber reject a bad value by printing the range they test, whose upper end is
// DBL_MAX written out in 309 digits; these say what the option wants in words:
//   --seconds: must be a number greater than 0, not '0'
// Header-only (needs CLI11); used by `poolscope` and poolscope_bench_alloc.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <string>

namespace poolscope::tools {

namespace cli_detail {

/// "" if `s` is a finite number that is > 0 (`strict`) or >= 0, else the reason.
inline std::string check_number(const std::string& s, bool strict) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const char* want = strict ? "a number greater than 0" : "a number not below 0";
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) ||
      (strict ? !(v > 0) : v < 0)) {
    return std::string("must be ") + want + ", not '" + s + "'";
  }
  return {};
}

}  // namespace cli_detail

/// A finite number greater than 0.
inline CLI::Validator positive_number() {
  return CLI::Validator([](std::string& s) { return cli_detail::check_number(s, true); },
                        "POSITIVE", "positive_number");
}

/// A finite number that is 0 or more.
inline CLI::Validator non_negative_number() {
  return CLI::Validator([](std::string& s) { return cli_detail::check_number(s, false); },
                        "NONNEGATIVE", "non_negative_number");
}

/// An on/off setting: 1 or 0 (also true/false, on/off, yes/no). CLI11 alone would read any
/// other whole number as on.
inline CLI::Validator on_off() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        for (const char* ok : {"1", "0", "true", "false", "on", "off", "yes", "no"}) {
          if (s == ok) {
            return {};
          }
        }
        return "must be 1 or 0 (or true/false, on/off, yes/no), not '" + s + "'";
      },
      "1|0", "on_off");
}

}  // namespace poolscope::tools
