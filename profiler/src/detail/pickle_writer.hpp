// pickle_writer: Python pickles of plain data (dicts, lists, tuples, ints, floats, strings, None,
// booleans), in the opcodes PyTorch's memory viewer reads (torch/utils/viz/MemoryViz.js, whose
// unpickler knows a subset of protocol 4). Internal to the profiler: the memory snapshot writer
// (memory_snapshot.hpp) is its one user.
//
//   pickle_writer w;                   // PROTO 4
//   w.begin_dict();
//   w.string("segments"); w.begin_list(); ... w.end_list();
//   w.end_dict();
//   std::string bytes = w.finish();    // STOP
//
// Opcodes written: PROTO, EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS, APPENDS, TUPLE, BININT1,
// BININT, LONG1, BINFLOAT, SHORT_BINUNICODE, BINUNICODE, NONE, NEWTRUE, NEWFALSE, MEMOIZE,
// BINGET, LONG_BINGET, STOP. Strings are memoized: each distinct string is written once and
// fetched from the memo after that (a snapshot repeats its keys thousands of times). No FRAME
// opcodes: framing is optional in protocol 4 and every reader accepts its absence.
//
// Ownership: owns its output buffer. Thread safety: none (one writer per thread). Errors: the
// caller nests begin/end correctly (checked: a mismatch throws logic_error); std::bad_alloc.
// Cost: linear in the output; one hash lookup per string.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace poolscope::profiler::detail {

class pickle_writer {
 public:
  pickle_writer();

  void none();
  void boolean(bool v);
  /// Any signed 64-bit value (BININT1, BININT or LONG1 by magnitude).
  void integer(std::int64_t v);
  /// Any unsigned 64-bit value (addresses above 2^63 take LONG1 with 9 bytes).
  void unsigned_integer(std::uint64_t v);
  void real(double v);
  /// A str; memoized (a repeat is a memo fetch).
  void string(std::string_view s);

  /// A dict: then key, value, key, value, ... then end_dict().
  void begin_dict();
  void end_dict();
  /// A list: then its items, then end_list().
  void begin_list();
  void end_list();
  /// A tuple: then its items, then end_tuple().
  void begin_tuple();
  void end_tuple();

  /// Puts the object just completed into the memo and returns its index, for fetch().
  std::uint32_t memoize();
  /// Pushes the memoized object `index` again (the same object, not a copy).
  void fetch(std::uint32_t index);

  /// Ends the pickle (STOP) and returns it; the writer is then empty. Throws logic_error if a
  /// container is still open.
  [[nodiscard]] std::string finish();

 private:
  enum class open : std::uint8_t { dict, list, tuple };
  void begin(char empty_opcode, open kind);
  void end(open kind, char opcode);
  void put(char c) { out_.push_back(c); }
  void put_le(std::uint64_t v, int bytes);

  std::string out_;
  std::vector<open> open_;
  struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::unordered_map<std::string, std::uint32_t, string_hash, std::equal_to<>> strings_;
  std::uint32_t memo_size_ = 0;
};

}  // namespace poolscope::profiler::detail
