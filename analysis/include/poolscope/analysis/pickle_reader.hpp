// pickle_reader: Python pickles of plain data read into a value tree — what a PyTorch memory
// snapshot is (memory_snapshot_reader.hpp turns the tree into a profiler::memory_snapshot).
//
//   poolscope::analysis::pickle_value v = poolscope::analysis::read_pickle(bytes, "snap.pickle");
//   const pickle_value* segments = v.find("segments");        // dict lookup by str key
//   for (const pickle_value& s : segments->items()) { ... s.find("address")->as_uint64() ... }
//
// Read: protocols 2 to 5, the opcodes Python's pickler and PyTorch's own pickler write for
// dicts, lists, tuples, ints, floats, strings, None and booleans: PROTO, FRAME, STOP, MARK,
// EMPTY_DICT, DICT, SETITEM, SETITEMS, EMPTY_LIST, LIST, APPEND, APPENDS, EMPTY_TUPLE, TUPLE,
// TUPLE1-3, BININT, BININT1, BININT2, LONG1, LONG4, BINFLOAT, SHORT_BINUNICODE, BINUNICODE,
// BINUNICODE8, NONE, NEWTRUE, NEWFALSE, BINPUT, LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET.
// Anything else (classes, bytes, sets, the text opcodes of protocol 0) is refused.
//
// Memo fetches share the object, as Python does (a snapshot's frame lists are shared by many
// entries, so nothing is copied); a container that was fetched cannot be added to afterwards,
// which no pickle of acyclic data does and which makes a cycle impossible. Nesting is limited to
// max_pickle_depth levels and integers to 64 bits (signed, or unsigned above 2^63).
//
// Errors: pickle_error naming the source and the byte offset of the opcode at fault (truncated
// input, an unknown opcode, a stack or memo misuse, invalid UTF-8, an integer too large); never
// a crash or a hang: the work is linear in the input's length.
// Thread safety: reentrant; values are immutable once read and may be shared across threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "poolscope/error.hpp"

namespace poolscope::analysis {

/// A pickle could not be read: names the source and the byte offset.
class pickle_error : public runtime_error {
 public:
  pickle_error(const std::string& source, std::size_t offset, const std::string& what);
  /// Byte offset of the opcode (or field) at fault.
  [[nodiscard]] std::size_t offset() const noexcept { return offset_; }

 private:
  std::size_t offset_;
};

/// Deepest nesting of containers accepted.
inline constexpr std::size_t max_pickle_depth = 64;

/// One value of a pickle.
class pickle_value {
 public:
  enum class type : std::uint8_t { none, boolean, integer, real, string, list, tuple, dict };
  using pair = std::pair<pickle_value, pickle_value>;

  pickle_value() = default;  ///< None
  static pickle_value make_bool(bool v);
  static pickle_value make_int(std::int64_t v);
  static pickle_value make_uint(std::uint64_t v);
  static pickle_value make_real(double v);
  static pickle_value make_string(std::string v);
  /// An empty list, tuple or dict.
  static pickle_value make_container(type t);

  [[nodiscard]] type kind() const noexcept { return type_; }
  /// "None", "bool", "int", "float", "str", "list", "tuple", "dict" (Python's names).
  [[nodiscard]] std::string_view type_name() const noexcept;
  [[nodiscard]] bool is_int() const noexcept { return type_ == type::integer; }
  /// An int that fits int64 (as_int64 answers it).
  [[nodiscard]] bool is_int64() const noexcept { return type_ == type::integer && !unsigned_; }
  /// An int >= 0 (as_uint64 answers it).
  [[nodiscard]] bool is_uint64() const noexcept {
    return type_ == type::integer && (unsigned_ || i_ >= 0);
  }
  [[nodiscard]] bool is_string() const noexcept { return type_ == type::string; }
  [[nodiscard]] bool is_sequence() const noexcept {
    return type_ == type::list || type_ == type::tuple;
  }

  /// The value of a bool. Throws logic_error for another type.
  [[nodiscard]] bool as_bool() const;
  /// An int that fits int64. Throws logic_error otherwise.
  [[nodiscard]] std::int64_t as_int64() const;
  /// A non-negative int. Throws logic_error otherwise.
  [[nodiscard]] std::uint64_t as_uint64() const;
  /// A float, or an int as a double. Throws logic_error otherwise.
  [[nodiscard]] double as_real() const;
  /// A str (UTF-8). Throws logic_error for another type.
  [[nodiscard]] const std::string& as_string() const;
  /// The items of a list or tuple. Throws logic_error for another type.
  [[nodiscard]] const std::vector<pickle_value>& items() const;
  /// The (key, value) pairs of a dict in insertion order (a repeated key: every pair is kept,
  /// find() answers the last). Throws logic_error for another type.
  [[nodiscard]] const std::vector<pair>& entries() const;
  /// The value of the str key `key` in a dict; nullptr if absent or if this is not a dict.
  [[nodiscard]] const pickle_value* find(std::string_view key) const noexcept;

  /// Containers: levels of nesting, this one included (1: no container inside); 0 otherwise.
  [[nodiscard]] std::size_t depth() const noexcept;
  /// Containers: the same address for every reference to one object (memo fetches share it);
  /// nullptr otherwise.
  [[nodiscard]] const void* identity() const noexcept { return c_.get(); }

 private:
  friend class pickle_parser;
  struct container;
  type type_ = type::none;
  bool unsigned_ = false;  // an int above INT64_MAX, held in u_
  union {
    bool b_;
    std::int64_t i_;
    std::uint64_t u_;
    double d_ = 0;
  };
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<container> c_;
};

/// Reads the pickle in `bytes`; `source` names it in errors.
[[nodiscard]] pickle_value read_pickle(std::string_view bytes,
                                       const std::string& source = "<bytes>");

}  // namespace poolscope::analysis
