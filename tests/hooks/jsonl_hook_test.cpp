// jsonl_hook: the lines it writes are parsed back with nlohmann::json and compared field by field.
#include "poolscope/hooks/jsonl_hook.hpp"

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <streambuf>
#include <string>
#include <thread>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/hooks/counting_hook.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"

namespace {

namespace ph = poolscope::hooks;
using nlohmann::json;

std::vector<json> parse_lines(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    out.push_back(json::parse(line));  // throws (and fails the test) on invalid JSON
  }
  return out;
}

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

/// Collects log messages while alive; restores stderr logging after.
class log_capture {
 public:
  log_capture() {
    poolscope::set_log_sink([this](poolscope::log_level level, std::string_view message) {
      std::lock_guard lock(mutex_);
      messages_.emplace_back(level, std::string(message));
    });
  }
  log_capture(const log_capture&) = delete;
  log_capture& operator=(const log_capture&) = delete;
  ~log_capture() { poolscope::set_log_sink({}); }
  std::vector<std::pair<poolscope::log_level, std::string>> messages() const {
    std::lock_guard lock(mutex_);
    return messages_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<poolscope::log_level, std::string>> messages_;
};

const char* const weird_name =
    "we\"ird\\name\nline2\r\t\b\f\x01\x1f caf\xc3\xa9 \xe2\x82\xac \xff end";
// What a JSON reader must get back: the same bytes, with the invalid 0xff as U+FFFD.
const std::string weird_name_decoded =
    "we\"ird\\name\nline2\r\t\b\f\x01\x1f caf\xc3\xa9 \xe2\x82\xac \xef\xbf\xbd end";

TEST(jsonl_hook, writes_every_field) {
  std::ostringstream out;
  ph::jsonl_hook h{out};
  ph::event e;
  e.seq = 123456789012ULL;
  e.time_ns = 987654321098765ULL;
  e.thread = 4242;
  e.kind = ph::event_kind::invalid_free;
  e.phase = ph::event_phase::instant;
  e.error = ph::free_error::size_mismatch;
  e.device = -1;
  e.stream = reinterpret_cast<void*>(std::uintptr_t{0xabc0});
  e.allocator_id = 77;
  e.allocator_name = weird_name;
  e.ptr = reinterpret_cast<void*>(std::uintptr_t{0x7f00deadbe00});
  e.requested = 1000;
  e.rounded = 1024;
  e.aux_ptr = nullptr;
  e.aux_bytes = 512;
  e.in_use = 1ULL << 40;
  e.reserved = SIZE_MAX;
  h.on_event(e);
  e.kind = ph::event_kind::split;
  e.phase = ph::event_phase::post;
  e.error = ph::free_error::none;
  e.device = 3;
  e.allocator_name = "";
  e.aux_ptr = reinterpret_cast<void*>(std::uintptr_t{0x10});
  h.on_event(e);
  h.flush();
  EXPECT_EQ(h.lines(), 2U);

  const std::string text = out.str();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const auto lines = parse_lines(text);
  ASSERT_EQ(lines.size(), 2U);
  const json& j = lines[0];
  EXPECT_EQ(j.size(), 17U) << j.dump();
  EXPECT_EQ(j.at("seq").get<std::uint64_t>(), 123456789012ULL);
  EXPECT_EQ(j.at("time_ns").get<std::uint64_t>(), 987654321098765ULL);
  EXPECT_EQ(j.at("thread").get<std::uint64_t>(), 4242U);
  EXPECT_EQ(j.at("kind"), "invalid_free");
  EXPECT_EQ(j.at("phase"), "instant");
  EXPECT_EQ(j.at("error"), "size_mismatch");
  EXPECT_EQ(j.at("device").get<int>(), -1);
  EXPECT_EQ(j.at("stream"), "0xabc0");
  EXPECT_EQ(j.at("allocator_id").get<std::uint32_t>(), 77U);
  EXPECT_EQ(j.at("allocator_name").get<std::string>(), weird_name_decoded);
  EXPECT_EQ(j.at("ptr"), "0x7f00deadbe00");
  EXPECT_EQ(j.at("requested").get<std::size_t>(), 1000U);
  EXPECT_EQ(j.at("rounded").get<std::size_t>(), 1024U);
  EXPECT_EQ(j.at("aux_ptr"), "0x0");
  EXPECT_EQ(j.at("aux_bytes").get<std::size_t>(), 512U);
  EXPECT_EQ(j.at("in_use").get<std::size_t>(), 1ULL << 40);
  EXPECT_EQ(j.at("reserved").get<std::size_t>(), SIZE_MAX);

  const json& k = lines[1];
  EXPECT_EQ(k.at("kind"), "split");
  EXPECT_EQ(k.at("phase"), "post");
  EXPECT_EQ(k.at("error"), "none");
  EXPECT_EQ(k.at("device").get<int>(), 3);
  EXPECT_EQ(k.at("allocator_name"), "");
  EXPECT_EQ(k.at("aux_ptr"), "0x10");
}

TEST(jsonl_hook, escapes_every_control_character) {
  std::string name;
  for (int c = 1; c < 0x80; ++c) {
    name += static_cast<char>(c);
  }
  std::ostringstream out;
  {
    ph::jsonl_hook h{out};
    ph::event e;
    e.allocator_name = name.c_str();
    h.on_event(e);
  }
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << "a raw newline split the line";
  const auto lines = parse_lines(text);
  ASSERT_EQ(lines.size(), 1U);
  EXPECT_EQ(lines[0].at("allocator_name").get<std::string>(), name);
}

TEST(jsonl_hook, repairs_invalid_utf8) {
  // Truncated sequences, overlong forms, a surrogate, a code point past U+10FFFF, stray
  // continuation bytes: each invalid byte becomes U+FFFD; valid 2/3/4-byte sequences pass.
  const std::string name =
      "a\xc3"               // truncated 2-byte
      "b\xc0\xaf"           // overlong '/'
      "c\xed\xa0\x80"       // UTF-16 surrogate
      "d\xf4\x90\x80\x80"   // > U+10FFFF
      "e\x80"               // stray continuation
      "f\xf0\x9f\x98\x80";  // U+1F600, valid
  std::ostringstream out;
  ph::jsonl_hook h{out};
  ph::event e;
  e.allocator_name = name.c_str();
  h.on_event(e);
  const auto lines = parse_lines(out.str());
  ASSERT_EQ(lines.size(), 1U);
  const std::string r = "\xef\xbf\xbd";
  EXPECT_EQ(lines[0].at("allocator_name").get<std::string>(), "a" + r + "b" + r + r + "c" + r + r +
                                                                  r + "d" + r + r + r + r + "e" +
                                                                  r + "f\xf0\x9f\x98\x80");
}

/// A resource that forwards to host memory under a name full of characters JSON must escape.
class weird_resource final : public poolscope::pool::resource {
 private:
  void* do_try_allocate(poolscope::stream_view s, std::size_t bytes) override {
    return host_.try_allocate(s, bytes);
  }
  void do_deallocate(poolscope::stream_view s, void* p, std::size_t bytes) noexcept override {
    host_.deallocate(s, p, bytes);
  }
  int do_device() const noexcept override { return -1; }
  poolscope::pool::memory_kind do_kind() const noexcept override {
    return poolscope::pool::memory_kind::host;
  }
  std::string do_name() const override { return weird_name; }
  poolscope::pool::host_resource host_;
};

TEST(jsonl_hook, every_line_of_a_real_workload_parses) {
  weird_resource res;
  poolscope::pool::naive_allocator a{res};
  std::ostringstream out;
  ph::counting_hook counts;
  std::vector<void*> blocks;
  {
    ph::jsonl_hook h{out};
    ph::scoped_hook on_json{h, ph::scope::thread};
    ph::scoped_hook on_count{counts, ph::scope::thread};
    for (std::size_t i = 1; i <= 20; ++i) {
      blocks.push_back(a.allocate({}, i * 100));
    }
    for (std::size_t i = 1; i <= 20; ++i) {
      a.deallocate({}, blocks[i - 1], i * 100);
    }
    a.deallocate({}, blocks[0], 100);  // an invalid free, for variety
  }                                    // the hook flushes here
  const auto lines = parse_lines(out.str());
  ASSERT_EQ(lines.size(), counts.snapshot().total_calls());
  std::uint64_t prev_seq = 0;
  std::size_t mallocs = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const json& j = lines[i];
    EXPECT_EQ(j.at("allocator_name").get<std::string>(), "naive/" + weird_name_decoded);
    EXPECT_EQ(j.at("allocator_id").get<std::uint32_t>(), a.id());
    EXPECT_EQ(j.at("thread").get<std::uint64_t>(), ph::current_thread_id());
    if (i > 0) {
      EXPECT_GT(j.at("seq").get<std::uint64_t>(), prev_seq);
    }
    prev_seq = j.at("seq").get<std::uint64_t>();
    if (j.at("kind") == "pool_malloc" && j.at("phase") == "post") {
      EXPECT_EQ(j.at("ptr").get<std::string>(), hex(blocks[mallocs]));
      EXPECT_EQ(j.at("requested").get<std::size_t>(), (mallocs + 1) * 100);
      ++mallocs;
    }
  }
  EXPECT_EQ(mallocs, 20U);
  EXPECT_EQ(lines.back().at("kind"), "invalid_free");
  EXPECT_EQ(lines.back().at("error"), "unknown_pointer");
}

TEST(jsonl_hook, filters_by_kind) {
  poolscope::pool::host_resource host;
  poolscope::pool::naive_allocator a{host};
  std::ostringstream out;
  {
    ph::jsonl_hook h{out, {ph::event_kind::oom, ph::event_kind::invalid_free}};
    ph::scoped_hook on{h, ph::scope::thread};
    a.deallocate({}, a.allocate({}, 100), 100);
    EXPECT_THROW((void)a.allocate({}, SIZE_MAX), poolscope::out_of_memory);
    a.deallocate({}, nullptr, 10);
  }
  const auto lines = parse_lines(out.str());
  ASSERT_EQ(lines.size(), 2U);
  EXPECT_EQ(lines[0].at("kind"), "oom");
  EXPECT_EQ(lines[0].at("requested").get<std::size_t>(), SIZE_MAX);
  EXPECT_EQ(lines[1].at("kind"), "invalid_free");
  EXPECT_EQ(lines[1].at("error"), "null_with_size");

  EXPECT_TRUE(ph::kind_set{}.contains(ph::event_kind::merge));
  EXPECT_FALSE(ph::kind_set::none().contains(ph::event_kind::merge));
  std::ostringstream none_out;
  {
    ph::jsonl_hook h{none_out, ph::kind_set::none()};
    ph::event e;
    h.on_event(e);
  }
  EXPECT_TRUE(none_out.str().empty());
}

TEST(jsonl_hook, writes_a_file_and_flushes_on_destruction) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("poolscope_jsonl_test_" + std::to_string(::getpid()) + ".jsonl");
  {
    ph::jsonl_hook h{path.string()};
    ph::event e;
    e.requested = 5;
    for (int i = 0; i < 3; ++i) {
      e.seq = static_cast<std::uint64_t>(i);
      h.on_event(e);
    }
    // Still in the hook's batch: not written yet, so not counted.
    EXPECT_EQ(h.lines(), 0U);
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  const auto lines = parse_lines(text.str());
  ASSERT_EQ(lines.size(), 3U);
  EXPECT_EQ(lines[2].at("seq").get<int>(), 2);
  EXPECT_EQ(lines[2].at("requested").get<int>(), 5);
}

// lines() counts only lines written, not lines that only reached a buffer (a hook writing to
// /dev/full writes none), and the failure is logged once, naming the file and the lines lost.
TEST(jsonl_hook, lines_counts_only_what_was_written_on_a_full_disk) {
  if (!std::filesystem::exists("/dev/full")) {
    GTEST_SKIP() << "no /dev/full on this system";
  }
  log_capture logs;
  ph::jsonl_hook h{"/dev/full"};
  ph::event e;
  for (int i = 0; i < 100; ++i) {  // ~30 KiB: more than a stdio buffer, less than a batch
    e.seq = static_cast<std::uint64_t>(i);
    h.on_event(e);
  }
  EXPECT_EQ(h.lines(), 0U);
  h.flush();  // must not throw
  EXPECT_FALSE(h.enabled());
  EXPECT_EQ(h.lines(), 0U);
  for (int i = 0; i < 1000; ++i) {  // ignored once disabled
    h.on_event(e);
  }
  h.flush();
  EXPECT_EQ(h.lines(), 0U);
  const auto messages = logs.messages();
  ASSERT_EQ(messages.size(), 1U);
  EXPECT_EQ(messages[0].first, poolscope::log_level::error);
  EXPECT_NE(messages[0].second.find("/dev/full"), std::string::npos) << messages[0].second;
  EXPECT_NE(messages[0].second.find("100 buffered line(s) were not written"), std::string::npos)
      << messages[0].second;
}

TEST(jsonl_hook, a_full_disk_is_noticed_without_flush_once_a_batch_is_due) {
  if (!std::filesystem::exists("/dev/full")) {
    GTEST_SKIP() << "no /dev/full on this system";
  }
  log_capture logs;
  ph::jsonl_hook h{"/dev/full"};
  ph::event e;
  for (int i = 0; i < 2000 && h.enabled(); ++i) {  // ~600 KiB: several batches' worth
    h.on_event(e);
  }
  EXPECT_FALSE(h.enabled());
  EXPECT_EQ(h.lines(), 0U);
  EXPECT_EQ(logs.messages().size(), 1U);
}

TEST(jsonl_hook, lines_agrees_with_the_file_across_batches) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("poolscope_jsonl_batches_" + std::to_string(::getpid()) + ".jsonl");
  constexpr int events = 1500;  // several 64 KiB batches and a partial one
  std::uint64_t counted_before_flush = 0;
  std::uint64_t counted = 0;
  {
    ph::jsonl_hook h{path.string()};
    ph::event e;
    for (int i = 0; i < events; ++i) {
      e.seq = static_cast<std::uint64_t>(i);
      h.on_event(e);
    }
    counted_before_flush = h.lines();
    h.flush();
    counted = h.lines();
    EXPECT_TRUE(h.enabled());
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  const auto lines = parse_lines(text.str());
  EXPECT_EQ(counted, lines.size());
  EXPECT_EQ(counted, static_cast<std::uint64_t>(events));
  EXPECT_GT(counted_before_flush, 0U) << "full batches are written without waiting for flush()";
  EXPECT_LT(counted_before_flush, counted);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    ASSERT_EQ(lines[i].at("seq").get<std::size_t>(), i);
  }
}

TEST(jsonl_hook, unopenable_path_throws_naming_it) {
  const std::string path = "/nonexistent-poolscope-dir/x.jsonl";
  try {
    ph::jsonl_hook h{path};
    FAIL() << "expected poolscope::runtime_error";
  } catch (const poolscope::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

/// A stream buffer that accepts `budget` bytes, then fails every write.
class failing_buf final : public std::streambuf {
 public:
  explicit failing_buf(std::size_t budget) : budget_(budget) {}
  std::string text;

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) {
      return traits_type::not_eof(c);
    }
    if (budget_ == 0) {
      return traits_type::eof();
    }
    --budget_;
    text += traits_type::to_char_type(c);
    return c;
  }

 private:
  std::size_t budget_;
};

TEST(jsonl_hook, a_write_failure_disables_it_with_one_log_line) {
  log_capture logs;
  failing_buf buf{700};  // room for about two lines
  std::ostream out{&buf};
  ph::jsonl_hook h{out};
  ph::event e;
  for (int i = 0; i < 10; ++i) {
    h.on_event(e);  // must not throw
  }
  EXPECT_FALSE(h.enabled());
  EXPECT_GE(h.lines(), 1U);
  EXPECT_LT(h.lines(), 10U);
  const auto lines_before = h.lines();
  h.on_event(e);
  h.flush();
  EXPECT_EQ(h.lines(), lines_before);
  const auto messages = logs.messages();
  ASSERT_EQ(messages.size(), 1U);
  EXPECT_EQ(messages[0].first, poolscope::log_level::error);
  EXPECT_NE(messages[0].second.find("jsonl_hook"), std::string::npos) << messages[0].second;
  EXPECT_NE(messages[0].second.find("disabled"), std::string::npos) << messages[0].second;
  // What was written before the failure is whole lines.
  const auto complete = buf.text.substr(0, buf.text.rfind('\n') + 1);
  EXPECT_EQ(parse_lines(complete).size(), lines_before);
}

TEST(jsonl_hook, a_throwing_stream_disables_it_without_throwing) {
  log_capture logs;
  failing_buf buf{0};
  std::ostream out{&buf};
  out.exceptions(std::ios::badbit);
  ph::jsonl_hook h{out};
  ph::event e;
  h.on_event(e);
  h.on_event(e);
  EXPECT_FALSE(h.enabled());
  EXPECT_EQ(h.lines(), 0U);
  EXPECT_EQ(logs.messages().size(), 1U);
}

TEST(jsonl_hook_concurrency, lines_from_many_threads_never_interleave) {
  std::ostringstream out;
  constexpr int threads = 4;
  constexpr int per_thread = 2000;
  {
    ph::jsonl_hook h{out};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&h, t] {
        const std::string name = "thread \"" + std::to_string(t) + "\"\n";
        ph::event e;
        e.allocator_name = name.c_str();
        e.allocator_id = static_cast<std::uint32_t>(t);
        for (int i = 0; i < per_thread; ++i) {
          e.seq = static_cast<std::uint64_t>(i);
          h.on_event(e);
        }
      });
    }
    for (auto& th : pool) {
      th.join();
    }
    EXPECT_EQ(h.lines(), static_cast<std::uint64_t>(threads * per_thread));
  }
  const auto lines = parse_lines(out.str());
  ASSERT_EQ(lines.size(), static_cast<std::size_t>(threads * per_thread));
  std::vector<std::uint64_t> next(threads, 0);
  for (const auto& j : lines) {
    const auto t = j.at("allocator_id").get<int>();
    ASSERT_GE(t, 0);
    ASSERT_LT(t, threads);
    EXPECT_EQ(j.at("allocator_name").get<std::string>(), "thread \"" + std::to_string(t) + "\"\n");
    EXPECT_EQ(j.at("seq").get<std::uint64_t>(), next[t]++) << "a thread's lines out of order";
  }
}

}  // namespace
