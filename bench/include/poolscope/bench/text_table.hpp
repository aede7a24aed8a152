// A plain-text table for benchmark and report output, plus the number formats they share.
//
//   poolscope::bench::text_table t{{"allocator", "median", "p99"}};
//   t.add_row({"bfc", poolscope::bench::format_ns(31.5), poolscope::bench::format_ns(88)});
//   t.print(std::cout);
//
// Thread safety: a plain value; not synchronized. Cost: negligible.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

namespace poolscope::bench {

/// Columns sized to their widest cell; the first `left_columns` left-aligned, the rest
/// right-aligned; a rule under the header.
class text_table {
 public:
  explicit text_table(std::vector<std::string> headers, std::size_t left_columns = 1);
  /// Adds a row; missing cells are blank, extra cells are dropped.
  void add_row(std::vector<std::string> cells);
  /// Adds a horizontal rule before the next row.
  void add_rule();
  void print(std::ostream& out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;  // an empty row is a rule
  std::size_t left_columns_;
};

/// "38.2 ns", "1.23 us", "4.56 ms", "1.20 s".
[[nodiscard]] std::string format_ns(double ns);
/// "512 B", "1.00 KiB", "64.0 MiB", "1.50 GiB".
[[nodiscard]] std::string format_size(std::size_t bytes);
/// "1.05" (two decimals).
[[nodiscard]] std::string format_ratio(double r);

}  // namespace poolscope::bench
