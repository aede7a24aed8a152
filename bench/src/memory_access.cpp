#include "poolscope/bench/memory_access.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda_seam.hpp"

namespace poolscope::bench {
namespace {

struct piece {
  std::size_t offset;
  std::size_t bytes;
};

std::vector<piece> pieces_of(std::size_t bytes) {
  if (bytes <= full_pattern_bytes) {
    return {{0, bytes}};
  }
  // Piece offsets are multiples of 8 so that fill() works word by word.
  const std::size_t s = sample_pattern_bytes;
  const std::size_t tail = (bytes - s) & ~std::size_t{7};
  return {{0, s}, {(bytes / 2) & ~std::size_t{7}, s}, {tail, bytes - tail}};
}

/// The pattern word at word index `word` of a block tagged `tag`: a 64-bit mix of both, so
/// blocks with different tags, and different words of one block, differ.
std::uint64_t pattern_word(std::uint64_t tag, std::uint64_t word) noexcept {
  std::uint64_t x = (tag + 1) * 0x9e3779b97f4a7c15ULL ^ (word * 0xd6e8feb86659fd93ULL);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 29;
  return x;
}

/// Fills `buf` with the pattern of the bytes at `offset` (a multiple of 8) of a block.
void fill(std::vector<unsigned char>& buf, std::uint64_t tag, std::size_t offset) {
  const std::uint64_t first = offset / 8;
  for (std::size_t i = 0; i < buf.size(); i += 8) {
    const std::uint64_t w = pattern_word(tag, first + i / 8);
    std::memcpy(buf.data() + i, &w, std::min<std::size_t>(8, buf.size() - i));
  }
}

bool on_device(pool::memory_kind kind) noexcept {
  return kind == pool::memory_kind::device;
}

}  // namespace

int gpu_count() noexcept {
  return detail::device_count();
}

void write_pattern(pool::memory_kind kind, void* ptr, std::size_t bytes, std::uint64_t tag) {
  std::vector<unsigned char> buf;
  for (const piece& pc : pieces_of(bytes)) {
    buf.resize(pc.bytes);
    fill(buf, tag, pc.offset);
    auto* dst = static_cast<unsigned char*>(ptr) + pc.offset;
    if (on_device(kind)) {
      detail::copy_to_device(dst, buf.data(), pc.bytes);
    } else {
      std::memcpy(dst, buf.data(), pc.bytes);
    }
  }
}

bool check_pattern(pool::memory_kind kind, const void* ptr, std::size_t bytes, std::uint64_t tag) {
  std::vector<unsigned char> expected;
  std::vector<unsigned char> got;
  for (const piece& pc : pieces_of(bytes)) {
    expected.resize(pc.bytes);
    fill(expected, tag, pc.offset);
    const auto* src = static_cast<const unsigned char*>(ptr) + pc.offset;
    if (on_device(kind)) {
      got.resize(pc.bytes);
      detail::copy_to_host(got.data(), src, pc.bytes);
      if (!std::equal(expected.begin(), expected.end(), got.begin())) {
        return false;
      }
    } else if (std::memcmp(expected.data(), src, pc.bytes) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace poolscope::bench
