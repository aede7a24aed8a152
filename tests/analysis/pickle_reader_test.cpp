// pickle_reader: pickles that Python's own pickler wrote (protocols 2 to 5, bytes below) read
// back to the values Python pickled, and every malformed input refused with the byte offset.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "poolscope/analysis/pickle_reader.hpp"

namespace poolscope::analysis {
namespace {

std::string unhex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

std::string repeat(std::string_view s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    out += s;
  }
  return out;
}

// pickle.dumps(v, protocol=P) of
//   v = {'ints': [0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31-1, 2**31, -2**31-1, 2**40,
//                 -2**63, 2**63-1, 2**63, 2**64-1],
//        'misc': (1.5, -0.25, None, True, False),
//        'text': 'caf\u00e9 \u2603 \U0001F600',
//        'empty': [[], {}, ()],
//        'tuples': [('x',), ('x', 'y'), ('x', 'y', 'z'), ('a', 'b', 'c', 'd')],
//        'long': 'x' * 300}
// as Python 3.11 writes it (protocol 3 differs from 2 in its PROTO byte alone).
const std::string ints_hex =
    "4b004b014affffffff4bff4d00014dffff4a000001004a000000804affffff7f8a0500000080008a05ffffff7fff"
    "8a060000000000018a0800000000000000808a08ffffffffffffff7f8a090000000000000080008a09fffffffff"
    "fffffff00";
std::string protocol2(char version) {
  return unhex(
      std::string("80") + (version == 2 ? "02" : "03") + "7d7100285804000000696e747371015d710228" +
      ints_hex +
      "6558040000006d697363710328473ff800000000000047bfd00000000000004e88897471045804000000"
      "746578747105580e000000636166c3a920e2988320f09f988071065805000000656d70747971075d71"
      "08285d71097d710a296558060000007475706c6573710b5d710c28580100000078710d85710e680d58"
      "0100000079710f867110680d680f58010000007a71118771122858010000006171135801000000627114"
      "580100000063711558010000006471167471176558040000006c6f6e677118582c010000" +
      repeat("78", 300) + "7119752e");
}
std::string protocol4(char version) {
  return unhex(
      std::string("80") + (version == 4 ? "04" : "05") +
      "9529020000000000007d94288c04696e7473945d9428" + ints_hex +
      "658c046d6973639428473ff800000000000047bfd00000000000004e888974948c0474657874948c0e63"
      "6166c3a920e2988320f09f9880948c05656d707479945d94285d947d9429658c067475706c6573945d94"
      "288c0178948594680d8c0179948694680d680f8c017a948794288c0161948c0162948c0163948c016494"
      "7494658c046c6f6e6794582c010000" +
      repeat("78", 300) + "94752e");
}

void expect_reference_value(const pickle_value& v) {
  ASSERT_EQ(v.kind(), pickle_value::type::dict);
  const pickle_value* ints = v.find("ints");
  ASSERT_NE(ints, nullptr);
  ASSERT_EQ(ints->kind(), pickle_value::type::list);
  const std::int64_t want[] = {0,           1,         -1,          255,        256,
                               65535,       65536,     -2147483648, 2147483647, 2147483648,
                               -2147483649, 1LL << 40, INT64_MIN,   INT64_MAX};
  ASSERT_EQ(ints->items().size(), 16U);
  for (std::size_t i = 0; i < std::size(want); ++i) {
    EXPECT_EQ(ints->items()[i].as_int64(), want[i]) << "ints[" << i << "]";
  }
  EXPECT_FALSE(ints->items()[14].is_int64());
  EXPECT_EQ(ints->items()[14].as_uint64(), std::uint64_t{1} << 63);
  EXPECT_EQ(ints->items()[15].as_uint64(), UINT64_MAX);
  EXPECT_THROW((void)ints->items()[2].as_uint64(), logic_error);

  const pickle_value* misc = v.find("misc");
  ASSERT_NE(misc, nullptr);
  ASSERT_EQ(misc->kind(), pickle_value::type::tuple);
  ASSERT_EQ(misc->items().size(), 5U);
  EXPECT_EQ(misc->items()[0].as_real(), 1.5);
  EXPECT_EQ(misc->items()[1].as_real(), -0.25);
  EXPECT_EQ(misc->items()[2].kind(), pickle_value::type::none);
  EXPECT_TRUE(misc->items()[3].as_bool());
  EXPECT_FALSE(misc->items()[4].as_bool());

  EXPECT_EQ(v.find("text")->as_string(), "caf\xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80");
  const auto& empty = v.find("empty")->items();
  ASSERT_EQ(empty.size(), 3U);
  EXPECT_EQ(empty[0].kind(), pickle_value::type::list);
  EXPECT_TRUE(empty[0].items().empty());
  EXPECT_EQ(empty[1].kind(), pickle_value::type::dict);
  EXPECT_TRUE(empty[1].entries().empty());
  EXPECT_EQ(empty[2].kind(), pickle_value::type::tuple);
  const auto& tuples = v.find("tuples")->items();
  ASSERT_EQ(tuples.size(), 4U);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(tuples[i].kind(), pickle_value::type::tuple);
    EXPECT_EQ(tuples[i].items().size(), i + 1);
  }
  EXPECT_EQ(tuples[2].items()[2].as_string(), "z");
  EXPECT_EQ(tuples[3].items()[0].as_string(), "a");
  EXPECT_EQ(v.find("long")->as_string(), std::string(300, 'x'));
  EXPECT_EQ(v.find("absent"), nullptr);
  EXPECT_EQ(v.depth(), 3U);  // dict > list > tuple
}

TEST(pickle_reader, reads_what_python_wrote_in_protocols_2_to_5) {
  for (char p : {2, 3}) {
    SCOPED_TRACE("protocol " + std::to_string(p));
    expect_reference_value(read_pickle(protocol2(p)));
  }
  for (char p : {4, 5}) {
    SCOPED_TRACE("protocol " + std::to_string(p));
    expect_reference_value(read_pickle(protocol4(p)));
  }
}

TEST(pickle_reader, memo_fetches_share_the_object) {
  // {'a': shared, 'b': shared} with shared = ['s']
  const pickle_value v =
      read_pickle(unhex("80049516000000000000007d94288c0161945d948c017394618c0162946802752e"));
  const pickle_value* a = v.find("a");
  const pickle_value* b = v.find("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->identity(), b->identity());
  EXPECT_EQ(b->items().at(0).as_string(), "s");
}

TEST(pickle_reader, a_repeated_key_answers_the_last_value) {
  // EMPTY_DICT MARK 'k' 1 'k' 2 SETITEMS STOP
  const pickle_value v = read_pickle(unhex("80047d288c016b4b018c016b4b02752e"));
  EXPECT_EQ(v.find("k")->as_int64(), 2);
  EXPECT_EQ(v.entries().size(), 2U);
}

/// The offset and message of the error reading `bytes`.
std::pair<std::size_t, std::string> error_of(const std::string& bytes) {
  try {
    (void)read_pickle(bytes, "t.pickle");
  } catch (const pickle_error& e) {
    return {e.offset(), e.what()};
  }
  ADD_FAILURE() << "no error";
  return {0, ""};
}

TEST(pickle_reader, every_truncation_is_an_error_at_an_offset_inside_the_input) {
  const std::string whole = protocol4(4);
  for (std::size_t n = 0; n < whole.size(); ++n) {
    const auto [offset, what] = error_of(whole.substr(0, n));
    EXPECT_LE(offset, n) << what;
    EXPECT_NE(what.find("t.pickle: byte "), std::string::npos) << what;
  }
}

TEST(pickle_reader, errors_name_the_opcode_and_the_byte) {
  struct bad {
    const char* hex;
    std::size_t offset;
    const char* says;
  };
  const bad cases[] = {
      // {'s': {1}}: EMPTY_SET is not plain data.
      {"8004950e000000000000007d948c0173948f94284b0190732e", 17, "0x8f (EMPTY_SET) is not read"},
      // l = []; l.append(l)
      {"80049506000000000000005d946800612e", 15, "fetched from the memo"},
      // 2**64 and -2**63 - 1
      {"8004950c000000000000008a090000000000000000012e", 11, "does not fit 64 bits"},
      {"8004950c000000000000008a09ffffffffffffff7fff2e", 11, "below -2^63"},
      {"800a4e2e", 0, "protocol 10 is not read"},
      {"80044e", 3, "ends without STOP"},
      {"80042e", 2, "STOP with nothing on the stack"},
      {"80045d4b0165", 5, "without a MARK"},
      {"80045d4b0161612e", 6, "APPEND with no list on the stack"},
      {"8004612e", 2, "APPEND with nothing on the stack above the last MARK"},
      {"8004684b2e", 2, "memo entry 75, which was never stored"},
      {"80048c02c3282e", 2, "not valid UTF-8"},
      {"80047d4b01612e", 5, "APPEND adds to a dict"},
      {"8004284b01642e", 5, "DICT with an odd number of items"},
      {"8004582c0100006162", 2, "BINUNICODE needs 300 bytes, 2 remain"},
      {"80048b10000000", 2, "LONG4 of 16 bytes, 0 remain"},
  };
  for (const bad& b : cases) {
    const auto [offset, what] = error_of(unhex(b.hex));
    EXPECT_EQ(offset, b.offset) << b.hex << ": " << what;
    EXPECT_NE(what.find(b.says), std::string::npos) << b.hex << ": " << what;
  }
}

TEST(pickle_reader, nesting_past_the_limit_is_refused) {
  // [[[...]]] nested max_pickle_depth + 1 deep: EMPTY_LIST x (n), then APPEND x (n - 1).
  const std::size_t n = max_pickle_depth + 1;
  std::string bytes = unhex("8004");
  bytes += std::string(n, ']');
  bytes += std::string(n - 1, 'a');
  bytes += '.';
  const auto [offset, what] = error_of(bytes);
  EXPECT_NE(what.find("nested deeper than 64"), std::string::npos) << what;
  EXPECT_EQ(offset, 2 + n + (max_pickle_depth - 1));

  std::string ok = unhex("8004");
  ok += std::string(max_pickle_depth, ']');
  ok += std::string(max_pickle_depth - 1, 'a');
  ok += '.';
  EXPECT_EQ(read_pickle(ok).depth(), max_pickle_depth);
}

}  // namespace
}  // namespace poolscope::analysis
