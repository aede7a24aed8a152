// Byte counts as the command line and the environment take them: "4096", "512K", "80G", "1.5GiB"
// (binary units: K = 1024). Used by the poolscope command and the plug-in.
//
// Thread safety: reentrant. Cost: linear in the text.
#pragma once

#include <cctype>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

#include "poolscope/error.hpp"

namespace poolscope {

/// Parses a byte count with an optional binary suffix: K, M, G, T (also KB/KiB, ... and a bare
/// B), case-insensitive. Throws poolscope::invalid_argument naming `text` if it is not one or
/// does not fit in size_t.
[[nodiscard]] inline std::size_t parse_byte_size(std::string_view text) {
  const auto fail = [&](const char* why) {
    throw invalid_argument("invalid byte count '" + std::string(text) + "': " + why);
  };
  std::size_t i = 0;
  while (i < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[i])) != 0 || text[i] == '.')) {
    ++i;
  }
  if (i == 0) {
    fail("expected a number, e.g. 4096, 512M or 80G");
  }
  double value = 0;
  try {
    std::size_t used = 0;
    value = std::stod(std::string(text.substr(0, i)), &used);
    if (used != i) {
      fail("expected a number, e.g. 4096, 512M or 80G");
    }
  } catch (const std::logic_error&) {
    fail("expected a number, e.g. 4096, 512M or 80G");
  }
  std::string suffix;
  for (const char c : text.substr(i)) {
    suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  double scale = 1;
  if (!suffix.empty() && suffix != "B") {
    const std::string_view units = "KMGT";
    const std::size_t u = units.find(suffix[0]);
    const std::string_view rest = std::string_view(suffix).substr(1);
    if (u == std::string_view::npos || !(rest.empty() || rest == "B" || rest == "IB")) {
      fail("unknown unit (use K, M, G or T)");
    }
    scale = std::ldexp(1.0, 10 * static_cast<int>(u + 1));
  }
  const double bytes = value * scale;
  if (!(bytes < std::ldexp(1.0, std::numeric_limits<std::size_t>::digits))) {
    fail("too large");
  }
  if (bytes != std::floor(bytes)) {
    fail("not a whole number of bytes");
  }
  return static_cast<std::size_t>(bytes);
}

}  // namespace poolscope
