#include "poolscope/bench/text_table.hpp"

#include <algorithm>
#include <cstdio>

namespace poolscope::bench {

text_table::text_table(std::vector<std::string> headers, std::size_t left_columns)
    : headers_(std::move(headers)), left_columns_(left_columns) {}

void text_table::add_row(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  if (std::all_of(cells.begin(), cells.end(), [](const std::string& c) { return c.empty(); })) {
    cells.front().push_back(' ');  // keep a blank row distinct from a rule
  }
  rows_.push_back(std::move(cells));
}

void text_table::add_rule() {
  rows_.emplace_back();
}

void text_table::print(std::ostream& out) const {
  std::vector<std::size_t> width(headers_.size());
  for (std::size_t c = 0; c < headers_.size(); ++c) {
    width[c] = headers_[c].size();
    for (const auto& r : rows_) {
      if (!r.empty()) {
        width[c] = std::max(width[c], r[c].size());
      }
    }
  }
  std::size_t total = 0;
  for (std::size_t w : width) {
    total += w + 2;
  }
  const std::string rule(total > 2 ? total - 2 : 0, '-');
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      const std::size_t pad = width[c] - cells[c].size();
      if (c >= left_columns_) {
        s.append(pad, ' ');
      }
      s.append(cells[c]);
      if (c < left_columns_) {
        s.append(pad, ' ');
      }
      if (c + 1 < cells.size()) {
        s += "  ";
      }
    }
    while (!s.empty() && s.back() == ' ') {
      s.pop_back();
    }
    out << s << '\n';
  };
  line(headers_);
  out << rule << '\n';
  for (const auto& r : rows_) {
    if (r.empty()) {
      out << rule << '\n';
    } else {
      line(r);
    }
  }
}

std::string format_ns(double ns) {
  char buf[32];
  if (ns < 1e3) {
    std::snprintf(buf, sizeof buf, ns < 10 ? "%.2f ns" : "%.1f ns", ns);
  } else if (ns < 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f us", ns / 1e3);
  } else if (ns < 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f s", ns / 1e9);
  }
  return buf;
}

std::string format_size(std::size_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : (v < 100 ? "%.1f %s" : "%.0f %s"), v,
                  units[u]);
  }
  return buf;
}

std::string format_ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", r);
  return buf;
}

}  // namespace poolscope::bench
