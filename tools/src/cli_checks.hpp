// Validators for the command-line tools' numeric and on/off options. CLI11's PositiveNumber and
// NonNegativeNumber reject a bad value by printing the range they test, whose upper end is
// DBL_MAX written out in 309 digits; these say what the option wants in words:
//   --seconds: must be a number greater than 0, not '0'
// Also: whole numbers in a range ("not a number" where that is the problem, not CLI11's "not in
// range"), and path values that refuse another option (`--trace --report` is a missing path, not
// a file named "--report").
// Header-only (needs CLI11); used by `poolscope` and poolscope_bench_alloc.
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "poolscope/byte_size.hpp"

namespace poolscope::tools {

namespace cli_detail {

/// "" if `s` is a finite number that is > 0 (`strict`) or >= 0, else the reason.
inline std::string check_number(const std::string& s, bool strict) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const char* want = strict ? "a number greater than 0" : "a number not below 0";
  if (s.empty() || end != s.c_str() + s.size()) {
    return "'" + s + "' is not a number (" + want + ")";
  }
  if (!std::isfinite(v) || (strict ? !(v > 0) : v < 0)) {
    return std::string("must be ") + want + ", not '" + s + "'";
  }
  return {};
}

/// "" if `s` is a whole number in [lo, hi], else the reason.
inline std::string check_whole(const std::string& s, std::int64_t lo, std::int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  const std::string range = "from " + std::to_string(lo) + " to " + std::to_string(hi);
  if (s.empty() || end != s.c_str() + s.size()) {
    char* fend = nullptr;
    (void)std::strtod(s.c_str(), &fend);
    const bool is_number = !s.empty() && fend == s.c_str() + s.size();
    return is_number ? "must be a whole number " + range + ", not '" + s + "'"
                     : "'" + s + "' is not a number (a whole number " + range + ")";
  }
  if (errno == ERANGE || v < lo || v > hi) {
    return "must be " + range + ", not " + s;
  }
  return {};
}

}  // namespace cli_detail

/// A whole number from `lo` to `hi`: "'abc' is not a number (...)", "must be from 1 to 1000, not
/// 0".
inline CLI::Validator whole_number(std::int64_t lo, std::int64_t hi) {
  return CLI::Validator([lo, hi](std::string& s) { return cli_detail::check_whole(s, lo, hi); },
                        "INT in [" + std::to_string(lo) + " - " + std::to_string(hi) + "]",
                        "whole_number");
}

/// A path: refuses a value that starts with '-' (another option, taken as the value because the
/// path was left out); `stdout_dash` admits "-" (stdout). A file whose name starts with '-' is
/// named ./-name.
inline CLI::Validator path_value(bool stdout_dash = false) {
  return CLI::Validator(
      [stdout_dash](std::string& s) -> std::string {
        if (s.empty()) {
          return "needs a path, not an empty string";
        }
        if (s == "-" && stdout_dash) {
          return {};
        }
        if (s.front() == '-') {
          return "needs a path, not '" + s +
                 "' (the path is missing; for a file of that name write ./" + s + ")";
        }
        return {};
      },
      stdout_dash ? "PATH|-" : "PATH", "path_value");
}

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

/// A byte count as parse_byte_size takes it ("4096", "512K", "4M", "80G").
inline CLI::Validator byte_count() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          (void)parse_byte_size(s);
          return {};
        } catch (const std::exception& e) {
          return e.what();
        }
      },
      "BYTES", "byte_count");
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
