// The --devices option of `poolscope demo` and `poolscope bench darray`: a darray backend spec
// (darray::make_backend), checked while the command line is parsed so that a bad one is named
// with what is wrong before anything runs:
//   --devices: 'cuda:0': N in cuda:N is how many GPUs to use (the first N), from 1 to 64, not '0'
//
// Header-only (needs CLI11). Thread safety: reentrant.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <string>
#include <string_view>
#include <system_error>

namespace poolscope::tools {

namespace detail {

/// "" if `spec` is auto, cuda, cuda:N or host:N with N in 1..64, else what is wrong with it.
inline std::string check_devices_spec(const std::string& spec) {
  if (spec == "auto" || spec == "cuda") {
    return {};
  }
  const auto count = [&spec](std::string_view prefix, const char* meaning) -> std::string {
    const std::string_view digits = std::string_view(spec).substr(prefix.size());
    int n = 0;
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    const bool whole =
        !digits.empty() && r.ec == std::errc{} && r.ptr == digits.data() + digits.size();
    if (whole && n >= 1 && n <= 64) {
      return {};
    }
    return "'" + spec + "': N in " + std::string(prefix) + "N is " + meaning +
           ", a whole number from 1 to 64, not '" + std::string(digits) + "'";
  };
  if (spec.starts_with("cuda:")) {
    return count("cuda:", "how many GPUs to use (the first N; 'cuda' uses every GPU)");
  }
  if (spec.starts_with("host:")) {
    return count("host:", "how many host devices to make");
  }
  return "'" + spec +
         "': expected auto, cuda, cuda:N (the first N GPUs) or host:N (N host devices)";
}

}  // namespace detail

/// A CLI11 validator for a darray backend spec.
inline CLI::Validator devices_spec() {
  return CLI::Validator([](std::string& s) { return detail::check_devices_spec(s); }, "SPEC",
                        "devices_spec");
}

}  // namespace poolscope::tools
