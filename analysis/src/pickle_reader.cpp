#include "poolscope/analysis/pickle_reader.hpp"

#include <bit>
#include <cstdio>
#include <cstring>
#include <unordered_map>

namespace poolscope::analysis {

struct pickle_value::container {
  std::vector<pickle_value> items;  // list, tuple
  std::vector<pair> entries;        // dict
  std::size_t levels = 1;           // 1 + the deepest container inside
  bool shared = false;              // fetched from the memo: no longer added to
};

pickle_error::pickle_error(const std::string& source, std::size_t offset, const std::string& what)
    : runtime_error("poolscope: " + source + ": byte " + std::to_string(offset) + ": " + what),
      offset_(offset) {}

pickle_value pickle_value::make_bool(bool v) {
  pickle_value p;
  p.type_ = type::boolean;
  p.b_ = v;
  return p;
}

pickle_value pickle_value::make_int(std::int64_t v) {
  pickle_value p;
  p.type_ = type::integer;
  p.i_ = v;
  return p;
}

pickle_value pickle_value::make_uint(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(INT64_MAX)) {
    return make_int(static_cast<std::int64_t>(v));
  }
  pickle_value p;
  p.type_ = type::integer;
  p.unsigned_ = true;
  p.u_ = v;
  return p;
}

pickle_value pickle_value::make_real(double v) {
  pickle_value p;
  p.type_ = type::real;
  p.d_ = v;
  return p;
}

pickle_value pickle_value::make_string(std::string v) {
  pickle_value p;
  p.type_ = type::string;
  p.s_ = std::make_shared<const std::string>(std::move(v));
  return p;
}

pickle_value pickle_value::make_container(type t) {
  pickle_value p;
  p.type_ = t;
  p.c_ = std::make_shared<container>();
  return p;
}

std::string_view pickle_value::type_name() const noexcept {
  switch (type_) {
    case type::none:
      return "None";
    case type::boolean:
      return "bool";
    case type::integer:
      return "int";
    case type::real:
      return "float";
    case type::string:
      return "str";
    case type::list:
      return "list";
    case type::tuple:
      return "tuple";
    case type::dict:
      return "dict";
  }
  return "unknown";
}

namespace {
[[noreturn]] void wrong_type(const pickle_value& v, const char* wanted) {
  throw logic_error("poolscope: pickle value is a " + std::string(v.type_name()) + ", not " +
                    wanted);
}
}  // namespace

bool pickle_value::as_bool() const {
  if (type_ != type::boolean) {
    wrong_type(*this, "a bool");
  }
  return b_;
}

std::int64_t pickle_value::as_int64() const {
  if (type_ != type::integer || unsigned_) {
    wrong_type(*this, "an int of 64 bits");
  }
  return i_;
}

std::uint64_t pickle_value::as_uint64() const {
  if (type_ != type::integer || (!unsigned_ && i_ < 0)) {
    wrong_type(*this, "a non-negative int");
  }
  return unsigned_ ? u_ : static_cast<std::uint64_t>(i_);
}

double pickle_value::as_real() const {
  if (type_ == type::real) {
    return d_;
  }
  if (type_ == type::integer) {
    return unsigned_ ? static_cast<double>(u_) : static_cast<double>(i_);
  }
  wrong_type(*this, "a float");
}

const std::string& pickle_value::as_string() const {
  if (type_ != type::string) {
    wrong_type(*this, "a str");
  }
  return *s_;
}

const std::vector<pickle_value>& pickle_value::items() const {
  if (!is_sequence()) {
    wrong_type(*this, "a list or a tuple");
  }
  return c_->items;
}

const std::vector<pickle_value::pair>& pickle_value::entries() const {
  if (type_ != type::dict) {
    wrong_type(*this, "a dict");
  }
  return c_->entries;
}

const pickle_value* pickle_value::find(std::string_view key) const noexcept {
  if (type_ != type::dict) {
    return nullptr;
  }
  for (auto it = c_->entries.rbegin(); it != c_->entries.rend(); ++it) {
    if (it->first.type_ == type::string && *it->first.s_ == key) {
      return &it->second;
    }
  }
  return nullptr;
}

std::size_t pickle_value::depth() const noexcept {
  return c_ != nullptr ? c_->levels : 0;
}

// ---- the parser -------------------------------------------------------------------------------

namespace {

bool valid_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) {
      return false;  // cut short
    }
    for (std::size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) {
        return false;
      }
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    static constexpr std::uint32_t min_of[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min_of[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

const char* opcode_name(unsigned char op) noexcept {
  switch (op) {
    case 0x80:
      return "PROTO";
    case 0x95:
      return "FRAME";
    case '.':
      return "STOP";
    case '(':
      return "MARK";
    case '}':
      return "EMPTY_DICT";
    case 'd':
      return "DICT";
    case 's':
      return "SETITEM";
    case 'u':
      return "SETITEMS";
    case ']':
      return "EMPTY_LIST";
    case 'l':
      return "LIST";
    case 'a':
      return "APPEND";
    case 'e':
      return "APPENDS";
    case ')':
      return "EMPTY_TUPLE";
    case 't':
      return "TUPLE";
    case 0x85:
      return "TUPLE1";
    case 0x86:
      return "TUPLE2";
    case 0x87:
      return "TUPLE3";
    case 'J':
      return "BININT";
    case 'K':
      return "BININT1";
    case 'M':
      return "BININT2";
    case 0x8a:
      return "LONG1";
    case 0x8b:
      return "LONG4";
    case 'G':
      return "BINFLOAT";
    case 0x8c:
      return "SHORT_BINUNICODE";
    case 'X':
      return "BINUNICODE";
    case 0x8d:
      return "BINUNICODE8";
    case 'N':
      return "NONE";
    case 0x88:
      return "NEWTRUE";
    case 0x89:
      return "NEWFALSE";
    case 'q':
      return "BINPUT";
    case 'r':
      return "LONG_BINPUT";
    case 0x94:
      return "MEMOIZE";
    case 'h':
      return "BINGET";
    case 'j':
      return "LONG_BINGET";
    // Opcodes of plain pickles that this reader does not take, named for the message.
    case 'c':
      return "GLOBAL";
    case 0x93:
      return "STACK_GLOBAL";
    case 'R':
      return "REDUCE";
    case 'b':
      return "BUILD";
    case 0x81:
      return "NEWOBJ";
    case 'B':
      return "BINBYTES";
    case 'C':
      return "SHORT_BINBYTES";
    case 0x8f:
      return "EMPTY_SET";
    case 0x90:
      return "ADDITEMS";
    case 0x91:
      return "FROZENSET";
    case 'I':
      return "INT";
    case 'L':
      return "LONG";
    case 'S':
      return "STRING";
    case 'V':
      return "UNICODE";
    case 'F':
      return "FLOAT";
    case '0':
      return "POP";
    case '1':
      return "POP_MARK";
    case '2':
      return "DUP";
    case 'p':
      return "PUT";
    case 'g':
      return "GET";
    default:
      return nullptr;
  }
}

}  // namespace

class pickle_parser {
 public:
  pickle_parser(std::string_view bytes, const std::string& source) : in_(bytes), source_(source) {}

  pickle_value run() {
    while (true) {
      at_ = pos_;
      if (pos_ >= in_.size()) {
        fail("the pickle ends without STOP");
      }
      const auto op = static_cast<unsigned char>(in_[pos_++]);
      if (op == '.') {
        if (stack_.size() <= floor()) {
          fail("STOP with nothing on the stack");
        }
        return std::move(stack_.back());
      }
      step(op);
    }
  }

 private:
  using type = pickle_value::type;

  [[noreturn]] void fail(const std::string& what) const { throw pickle_error(source_, at_, what); }

  std::string_view take(std::size_t n, unsigned char op) {
    if (in_.size() - pos_ < n) {
      fail(std::string("truncated: ") + opcode_name(op) + " needs " + std::to_string(n) +
           " bytes, " + std::to_string(in_.size() - pos_) + " remain");
    }
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::uint64_t take_le(std::size_t n, unsigned char op) {
    const std::string_view s = take(n, op);
    std::uint64_t v = 0;
    for (std::size_t i = n; i-- > 0;) {
      v = (v << 8) | static_cast<unsigned char>(s[i]);
    }
    return v;
  }

  [[nodiscard]] std::size_t floor() const noexcept { return marks_.empty() ? 0 : marks_.back(); }
  pickle_value pop(unsigned char op) {
    if (stack_.size() <= floor()) {
      fail(std::string(opcode_name(op)) + " with nothing on the stack above the last MARK");
    }
    pickle_value v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  std::size_t pop_mark(unsigned char op) {
    if (marks_.empty()) {
      fail(std::string(opcode_name(op)) + " without a MARK before it");
    }
    const std::size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  pickle_value::container& open_container(pickle_value& v, type t, unsigned char op) {
    if (v.type_ != t) {
      fail(std::string(opcode_name(op)) + " adds to a " + std::string(v.type_name()));
    }
    if (v.c_->shared) {
      fail(std::string(opcode_name(op)) +
           " adds to a container fetched from the memo (a recursive structure)");
    }
    return *v.c_;
  }
  void adopt(pickle_value::container& parent, const pickle_value& child) {
    const std::size_t levels = child.depth() + 1;
    if (levels > max_pickle_depth) {
      fail("containers nested deeper than " + std::to_string(max_pickle_depth) + " levels");
    }
    parent.levels = std::max(parent.levels, levels);
  }
  void push_container(type t, std::size_t from) {
    pickle_value v = pickle_value::make_container(t);
    pickle_value::container& c = *v.c_;
    if (t == type::dict) {
      if ((stack_.size() - from) % 2 != 0) {
        fail("DICT with an odd number of items");
      }
      for (std::size_t i = from; i < stack_.size(); i += 2) {
        adopt(c, stack_[i]);
        adopt(c, stack_[i + 1]);
        c.entries.emplace_back(std::move(stack_[i]), std::move(stack_[i + 1]));
      }
    } else {
      for (std::size_t i = from; i < stack_.size(); ++i) {
        adopt(c, stack_[i]);
        c.items.push_back(std::move(stack_[i]));
      }
    }
    stack_.resize(from);
    stack_.push_back(std::move(v));
  }
  void push_string(std::size_t n, unsigned char op) {
    const std::string_view s = take(n, op);
    if (!valid_utf8(s)) {
      fail(std::string(opcode_name(op)) + ": the string is not valid UTF-8");
    }
    stack_.push_back(pickle_value::make_string(std::string(s)));
  }
  void push_long(std::size_t n, unsigned char op) {
    const std::string_view s = take(n, op);
    if (n == 0) {
      stack_.push_back(pickle_value::make_int(0));
      return;
    }
    const bool negative = (static_cast<unsigned char>(s[n - 1]) & 0x80U) != 0;
    // Bytes beyond the eighth must only extend the sign (a ninth zero byte: unsigned above 2^63).
    for (std::size_t i = 8; i < n; ++i) {
      const auto b = static_cast<unsigned char>(s[i]);
      if (b != (negative ? 0xFF : 0x00)) {
        fail(std::string(opcode_name(op)) + ": an integer of " + std::to_string(n) +
             " bytes does not fit 64 bits");
      }
    }
    std::uint64_t v = 0;
    for (std::size_t i = std::min<std::size_t>(n, 8); i-- > 0;) {
      v = (v << 8) | static_cast<unsigned char>(s[i]);
    }
    if (n < 8 && negative) {
      v |= ~std::uint64_t{0} << (8 * n);  // sign-extend
    }
    const bool top_bit = (v >> 63) != 0;
    if (negative) {
      if (!top_bit) {
        fail(std::string(opcode_name(op)) + ": a negative integer below -2^63");
      }
      stack_.push_back(pickle_value::make_int(static_cast<std::int64_t>(v)));
    } else {
      stack_.push_back(pickle_value::make_uint(v));
    }
  }
  void memo_put(std::uint64_t index, unsigned char op) {
    if (stack_.size() <= floor()) {
      fail(std::string(opcode_name(op)) + " with nothing on the stack to memoize");
    }
    memo_.insert_or_assign(index, stack_.back());
  }
  void memo_get(std::uint64_t index, unsigned char op) {
    auto it = memo_.find(index);
    if (it == memo_.end()) {
      fail(std::string(opcode_name(op)) + " of memo entry " + std::to_string(index) +
           ", which was never stored");
    }
    if (it->second.c_ != nullptr) {
      it->second.c_->shared = true;
    }
    stack_.push_back(it->second);
  }

  void step(unsigned char op) {
    switch (op) {
      case 0x80: {  // PROTO
        const auto v = static_cast<unsigned char>(take(1, op)[0]);
        if (v < 2 || v > 5) {
          fail("pickle protocol " + std::to_string(v) + " is not read (2 to 5 are)");
        }
        break;
      }
      case 0x95:  // FRAME: a length hint only
        (void)take(8, op);
        break;
      case '(':
        marks_.push_back(stack_.size());
        break;
      case '}':
        stack_.push_back(pickle_value::make_container(type::dict));
        break;
      case ']':
        stack_.push_back(pickle_value::make_container(type::list));
        break;
      case ')':
        stack_.push_back(pickle_value::make_container(type::tuple));
        break;
      case 'd':
        push_container(type::dict, pop_mark(op));
        break;
      case 'l':
        push_container(type::list, pop_mark(op));
        break;
      case 't':
        push_container(type::tuple, pop_mark(op));
        break;
      case 0x85:
      case 0x86:
      case 0x87: {
        const std::size_t n = op - 0x84U;
        if (stack_.size() < floor() + n) {
          fail(std::string(opcode_name(op)) + " needs " + std::to_string(n) +
               " items above the last MARK");
        }
        push_container(type::tuple, stack_.size() - n);
        break;
      }
      case 'a': {
        pickle_value v = pop(op);
        if (stack_.size() <= floor()) {
          fail("APPEND with no list on the stack");
        }
        pickle_value::container& c = open_container(stack_.back(), type::list, op);
        adopt(c, v);
        c.items.push_back(std::move(v));
        break;
      }
      case 'e':
      case 'u': {
        const std::size_t m = pop_mark(op);
        if (m == 0 || m <= floor()) {
          fail(std::string(opcode_name(op)) + " with no container below its MARK");
        }
        const bool dict = op == 'u';
        pickle_value::container& c =
            open_container(stack_[m - 1], dict ? type::dict : type::list, op);
        if (dict && (stack_.size() - m) % 2 != 0) {
          fail("SETITEMS with an odd number of items");
        }
        for (std::size_t i = m; i < stack_.size(); i += dict ? 2 : 1) {
          adopt(c, stack_[i]);
          if (dict) {
            adopt(c, stack_[i + 1]);
            c.entries.emplace_back(std::move(stack_[i]), std::move(stack_[i + 1]));
          } else {
            c.items.push_back(std::move(stack_[i]));
          }
        }
        stack_.resize(m);
        break;
      }
      case 's': {
        pickle_value v = pop(op);
        pickle_value k = pop(op);
        if (stack_.size() <= floor()) {
          fail("SETITEM with no dict on the stack");
        }
        pickle_value::container& c = open_container(stack_.back(), type::dict, op);
        adopt(c, k);
        adopt(c, v);
        c.entries.emplace_back(std::move(k), std::move(v));
        break;
      }
      case 'J':
        stack_.push_back(pickle_value::make_int(
            static_cast<std::int32_t>(static_cast<std::uint32_t>(take_le(4, op)))));
        break;
      case 'K':
        stack_.push_back(pickle_value::make_int(static_cast<std::int64_t>(take_le(1, op))));
        break;
      case 'M':
        stack_.push_back(pickle_value::make_int(static_cast<std::int64_t>(take_le(2, op))));
        break;
      case 0x8a:
        push_long(take_le(1, op), op);
        break;
      case 0x8b: {
        const std::uint64_t n = take_le(4, op);
        if (n > in_.size() - pos_) {
          fail("truncated: LONG4 of " + std::to_string(n) + " bytes, " +
               std::to_string(in_.size() - pos_) + " remain");
        }
        push_long(n, op);
        break;
      }
      case 'G': {  // big-endian IEEE 754
        const std::string_view b = take(8, op);
        std::uint64_t bits = 0;
        for (char c : b) {
          bits = (bits << 8) | static_cast<unsigned char>(c);
        }
        stack_.push_back(pickle_value::make_real(std::bit_cast<double>(bits)));
        break;
      }
      case 0x8c:
        push_string(take_le(1, op), op);
        break;
      case 'X':
        push_string(take_le(4, op), op);
        break;
      case 0x8d: {
        const std::uint64_t n = take_le(8, op);
        if (n > in_.size() - pos_) {
          fail("truncated: BINUNICODE8 of " + std::to_string(n) + " bytes, " +
               std::to_string(in_.size() - pos_) + " remain");
        }
        push_string(n, op);
        break;
      }
      case 'N':
        stack_.emplace_back();
        break;
      case 0x88:
        stack_.push_back(pickle_value::make_bool(true));
        break;
      case 0x89:
        stack_.push_back(pickle_value::make_bool(false));
        break;
      case 'q':
        memo_put(take_le(1, op), op);
        break;
      case 'r':
        memo_put(take_le(4, op), op);
        break;
      case 0x94:
        memo_put(memo_.size(), op);
        break;
      case 'h':
        memo_get(take_le(1, op), op);
        break;
      case 'j':
        memo_get(take_le(4, op), op);
        break;
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        const char* name = opcode_name(op);
        fail(std::string("opcode ") + hex +
             (name != nullptr ? std::string(" (") + name + ")" : "") +
             " is not read (a pickle of plain data does not use it)");
      }
    }
  }

  std::string_view in_;
  const std::string& source_;
  std::size_t pos_ = 0;
  std::size_t at_ = 0;  // offset of the opcode being read
  std::vector<pickle_value> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, pickle_value> memo_;
};

pickle_value read_pickle(std::string_view bytes, const std::string& source) {
  return pickle_parser(bytes, source).run();
}

}  // namespace poolscope::analysis
