#include "detail/pickle_writer.hpp"

#include <bit>
#include <cstring>

#include "poolscope/error.hpp"

namespace poolscope::profiler::detail {

namespace {
// Opcodes (Python's Lib/pickle.py names).
constexpr char op_proto = '\x80';
constexpr char op_stop = '.';
constexpr char op_mark = '(';
constexpr char op_empty_dict = '}';
constexpr char op_setitems = 'u';
constexpr char op_empty_list = ']';
constexpr char op_appends = 'e';
constexpr char op_tuple = 't';
constexpr char op_none = 'N';
constexpr char op_newtrue = '\x88';
constexpr char op_newfalse = '\x89';
constexpr char op_binint1 = 'K';
constexpr char op_binint = 'J';
constexpr char op_long1 = '\x8a';
constexpr char op_binfloat = 'G';
constexpr char op_short_binunicode = '\x8c';
constexpr char op_binunicode = 'X';
constexpr char op_memoize = '\x94';
constexpr char op_binget = 'h';
constexpr char op_long_binget = 'j';
}  // namespace

pickle_writer::pickle_writer() {
  put(op_proto);
  put('\x04');
}

void pickle_writer::put_le(std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    put(static_cast<char>((v >> (8 * i)) & 0xFFU));
  }
}

void pickle_writer::none() {
  put(op_none);
}

void pickle_writer::boolean(bool v) {
  put(v ? op_newtrue : op_newfalse);
}

void pickle_writer::integer(std::int64_t v) {
  if (v >= 0 && v <= 0xFF) {
    put(op_binint1);
    put(static_cast<char>(v));
    return;
  }
  if (v >= INT32_MIN && v <= INT32_MAX) {
    put(op_binint);
    put_le(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)), 4);
    return;
  }
  // LONG1: the fewest little-endian two's complement bytes that keep the sign.
  int n = 8;
  while (n > 1) {
    const std::int64_t lo = -(std::int64_t{1} << (8 * (n - 1) - 1));
    const std::int64_t hi = (std::int64_t{1} << (8 * (n - 1) - 1)) - 1;
    if (v < lo || v > hi) {
      break;
    }
    --n;
  }
  put(op_long1);
  put(static_cast<char>(n));
  put_le(static_cast<std::uint64_t>(v), n);
}

void pickle_writer::unsigned_integer(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(INT64_MAX)) {
    integer(static_cast<std::int64_t>(v));
    return;
  }
  put(op_long1);
  put('\x09');  // a ninth, zero byte keeps it positive
  put_le(v, 8);
  put('\0');
}

void pickle_writer::real(double v) {
  put(op_binfloat);
  const auto bits = std::bit_cast<std::uint64_t>(v);
  for (int i = 7; i >= 0; --i) {  // big-endian
    put(static_cast<char>((bits >> (8 * i)) & 0xFFU));
  }
}

void pickle_writer::string(std::string_view s) {
  if (auto it = strings_.find(s); it != strings_.end()) {
    fetch(it->second);
    return;
  }
  if (s.size() <= 0xFF) {
    put(op_short_binunicode);
    put(static_cast<char>(s.size()));
  } else {
    if (s.size() > UINT32_MAX) {
      throw invalid_argument("poolscope: pickle_writer: a string of " + std::to_string(s.size()) +
                             " bytes is longer than BINUNICODE holds");
    }
    put(op_binunicode);
    put_le(s.size(), 4);
  }
  out_.append(s);
  strings_.emplace(std::string(s), memoize());
}

void pickle_writer::begin(char empty_opcode, open kind) {
  if (empty_opcode != 0) {
    put(empty_opcode);
  }
  put(op_mark);
  open_.push_back(kind);
}

void pickle_writer::end(open kind, char opcode) {
  if (open_.empty() || open_.back() != kind) {
    throw logic_error("poolscope: pickle_writer: end of a container that is not the open one");
  }
  open_.pop_back();
  put(opcode);
}

void pickle_writer::begin_dict() {
  begin(op_empty_dict, open::dict);
}
void pickle_writer::end_dict() {
  end(open::dict, op_setitems);
}
void pickle_writer::begin_list() {
  begin(op_empty_list, open::list);
}
void pickle_writer::end_list() {
  end(open::list, op_appends);
}
void pickle_writer::begin_tuple() {
  begin(0, open::tuple);
}
void pickle_writer::end_tuple() {
  end(open::tuple, op_tuple);
}

std::uint32_t pickle_writer::memoize() {
  put(op_memoize);
  return memo_size_++;
}

void pickle_writer::fetch(std::uint32_t index) {
  if (index >= memo_size_) {
    throw logic_error("poolscope: pickle_writer: memo index " + std::to_string(index) +
                      " was never memoized");
  }
  if (index <= 0xFF) {
    put(op_binget);
    put(static_cast<char>(index));
  } else {
    put(op_long_binget);
    put_le(index, 4);
  }
}

std::string pickle_writer::finish() {
  if (!open_.empty()) {
    throw logic_error("poolscope: pickle_writer: finish() with " + std::to_string(open_.size()) +
                      " container(s) still open");
  }
  put(op_stop);
  std::string done = std::move(out_);
  out_.clear();
  strings_.clear();
  memo_size_ = 0;
  put(op_proto);
  put('\x04');
  return done;
}

}  // namespace poolscope::profiler::detail
