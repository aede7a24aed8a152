#include "poolscope/hooks/jsonl_hook.hpp"

#include "poolscope/hooks/json_string.hpp"

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

/// A file opened unbuffered: the hook batches lines itself, so it knows which reached the OS.
std::unique_ptr<std::ostream> open_unbuffered(const std::string& path) {
  auto file = std::make_unique<std::ofstream>();
  file->rdbuf()->pubsetbuf(nullptr, 0);  // before open(), as libstdc++ requires
  file->open(path, std::ios::out | std::ios::trunc);
  return file;
}

constexpr std::size_t k_batch_bytes = 64 * 1024;

}  // namespace

jsonl_hook::jsonl_hook(const std::string& path, kind_set kinds)
    : owned_(open_unbuffered(path)), out_(owned_.get()), target_(path), kinds_(kinds) {
  if (!*out_) {
    const int err = errno;
    throw runtime_error("poolscope: jsonl_hook cannot open '" + path + "' for writing" +
                        (err != 0 ? std::string(": ") + std::strerror(err) : std::string()));
  }
  line_.reserve(512);
  batch_.reserve(k_batch_bytes + 1024);
}

jsonl_hook::jsonl_hook(std::ostream& out, kind_set kinds)
    : out_(&out), target_("a std::ostream"), kinds_(kinds) {
  line_.reserve(512);
}

jsonl_hook::~jsonl_hook() {
  flush();
}

event_filter jsonl_hook::interests() const noexcept {
  event_filter f;
  for (int k = 0; k < event_kind_count; ++k) {
    if (kinds_.contains(static_cast<event_kind>(k))) {
      f.add(static_cast<event_kind>(k));
    }
  }
  return f;
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
    if (owned_) {
      batch_ += line_;
    }
  } catch (...) {
    fail("formatting an event failed");  // no memory for the line
    return;
  }
  if (!owned_) {
    (void)write_out(line_, 1);  // a borrowed stream: each line at once
    return;
  }
  ++batch_lines_;
  if (batch_.size() >= k_batch_bytes) {
    write_batch();
  }
}

bool jsonl_hook::write_out(std::string_view data, std::uint64_t lines) noexcept {
  try {
    out_->write(data.data(), static_cast<std::streamsize>(data.size()));
    out_->flush();
  } catch (...) {
    // A stream with exceptions() enabled.
  }
  if (!*out_) {
    fail("a write failed");
    return false;
  }
  lines_.fetch_add(lines, std::memory_order_relaxed);
  return true;
}

void jsonl_hook::write_batch() noexcept {
  if (!batch_.empty() && write_out(batch_, batch_lines_)) {
    batch_.clear();
    batch_lines_ = 0;
  }
}

void jsonl_hook::flush() noexcept {
  std::lock_guard lock(mutex_);
  if (failed_.load(std::memory_order_relaxed)) {
    return;
  }
  if (owned_) {
    write_batch();
  } else {
    (void)write_out({}, 0);  // flushes the borrowed stream
  }
}

void jsonl_hook::fail(const char* what) noexcept {
  failed_.store(true, std::memory_order_relaxed);
  const std::uint64_t lost = batch_lines_;
  batch_lines_ = 0;
  batch_.clear();
  batch_.shrink_to_fit();  // the hook writes nothing more: give the batch's memory back
  try {
    std::string message = "jsonl_hook writing to " + target_ + ": " + what + " after " +
                          std::to_string(lines_.load(std::memory_order_relaxed)) +
                          " line(s) written";
    if (lost != 0) {
      message += "; " + std::to_string(lost) + " buffered line(s) were not written";
    }
    message += "; the hook is disabled and ignores later events";
    log(log_level::error, message);
  } catch (...) {
    log(log_level::error, "jsonl_hook: a write failed; the hook is disabled");
  }
}

}  // namespace poolscope::hooks
