#include "poolscope/hooks/jsonl_hook.hpp"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <ostream>
#include <string_view>

#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

namespace poolscope::hooks {
namespace {

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_int(std::string& out, std::int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_hex(std::string& out, const void* p) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, reinterpret_cast<std::uintptr_t>(p), 16);
  out += "\"0x";
  out.append(buf, r.ptr);
  out += '"';
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 if the bytes there are not one
// (overlong forms, surrogates and code points past U+10FFFF are invalid, as RFC 3629 says).
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  std::size_t n = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    lo = c == 0xE0 ? 0xA0 : 0x80;
    hi = c == 0xED ? 0x9F : 0xBF;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    lo = c == 0xF0 ? 0x90 : 0x80;
    hi = c == 0xF4 ? 0x8F : 0xBF;
  } else {
    return 0;
  }
  if (i + n > s.size() || byte(i + 1) < lo || byte(i + 1) > hi) {
    return 0;
  }
  for (std::size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) {
      return 0;
    }
  }
  return n;
}

// Appends `s` as a JSON string literal: RFC 8259 escapes, and valid UTF-8 whatever `s` holds.
void append_json_string(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const std::size_t n = utf8_sequence_length(s, i);
      if (n == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 0xF];
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
}

void append_key(std::string& out, const char* key) {
  out += '"';
  out += key;
  out += "\":";
}

void format_event(std::string& out, const event& e) {
  out.clear();
  out += '{';
  append_key(out, "seq");
  append_uint(out, e.seq);
  out += ',';
  append_key(out, "time_ns");
  append_uint(out, e.time_ns);
  out += ',';
  append_key(out, "thread");
  append_uint(out, e.thread);
  out += ',';
  append_key(out, "kind");
  append_json_string(out, to_string(e.kind));
  out += ',';
  append_key(out, "phase");
  append_json_string(out, to_string(e.phase));
  out += ',';
  append_key(out, "error");
  append_json_string(out, to_string(e.error));
  out += ',';
  append_key(out, "device");
  append_int(out, e.device);
  out += ',';
  append_key(out, "stream");
  append_hex(out, e.stream);
  out += ',';
  append_key(out, "allocator_id");
  append_uint(out, e.allocator_id);
  out += ',';
  append_key(out, "allocator_name");
  append_json_string(out, e.allocator_name != nullptr ? e.allocator_name : "");
  out += ',';
  append_key(out, "ptr");
  append_hex(out, e.ptr);
  out += ',';
  append_key(out, "requested");
  append_uint(out, e.requested);
  out += ',';
  append_key(out, "rounded");
  append_uint(out, e.rounded);
  out += ',';
  append_key(out, "aux_ptr");
  append_hex(out, e.aux_ptr);
  out += ',';
  append_key(out, "aux_bytes");
  append_uint(out, e.aux_bytes);
  out += ',';
  append_key(out, "in_use");
  append_uint(out, e.in_use);
  out += ',';
  append_key(out, "reserved");
  append_uint(out, e.reserved);
  out += "}\n";
}

}  // namespace

jsonl_hook::jsonl_hook(const std::string& path, kind_set kinds)
    : owned_(std::make_unique<std::ofstream>(path, std::ios::out | std::ios::trunc)),
      out_(owned_.get()),
      target_(path),
      kinds_(kinds) {
  if (!*out_) {
    const int err = errno;
    throw runtime_error("poolscope: jsonl_hook cannot open '" + path + "' for writing" +
                        (err != 0 ? std::string(": ") + std::strerror(err) : std::string()));
  }
  line_.reserve(512);
}

jsonl_hook::jsonl_hook(std::ostream& out, kind_set kinds)
    : out_(&out), target_("a std::ostream"), kinds_(kinds) {
  line_.reserve(512);
}

jsonl_hook::~jsonl_hook() {
  flush();
}

void jsonl_hook::on_event(const event& e) noexcept {
  if (!kinds_.contains(e.kind) || failed_.load(std::memory_order_relaxed)) {
    return;
  }
  std::lock_guard lock(mutex_);
  if (failed_.load(std::memory_order_relaxed)) {
    return;  // another thread failed while this one waited
  }
  try {
    format_event(line_, e);
    out_->write(line_.data(), static_cast<std::streamsize>(line_.size()));
  } catch (...) {
    // No memory for the line, or a stream with exceptions() enabled.
    fail("formatting or writing an event failed");
    return;
  }
  if (!*out_) {
    fail("a write failed");
    return;
  }
  lines_.fetch_add(1, std::memory_order_relaxed);
}

void jsonl_hook::flush() noexcept {
  std::lock_guard lock(mutex_);
  if (failed_.load(std::memory_order_relaxed)) {
    return;
  }
  try {
    out_->flush();
  } catch (...) {
    fail("flushing failed");
    return;
  }
  if (!*out_) {
    fail("flushing failed");
  }
}

void jsonl_hook::fail(const char* what) noexcept {
  failed_.store(true, std::memory_order_relaxed);
  try {
    log(log_level::error, "jsonl_hook writing to " + target_ + ": " + what +
                              "; the hook is disabled and ignores later events");
  } catch (...) {
    log(log_level::error, "jsonl_hook: a write failed; the hook is disabled");
  }
}

}  // namespace poolscope::hooks
