// The C ABI plug-in (libpoolscope_alloc.so), loaded the way PyTorch and CuPy load it: dlopen +
// dlsym. Each test uses its own device key (the host resource makes the device only a key), and
// sets POOLSCOPE_ALLOCATOR / POOLSCOPE_RESOURCE before that device's first use, so the tests are
// independent whether they run in one process or one process each (ctest).
#include <dlfcn.h>
#include <elf.h>
#include <gtest/gtest.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "poolscope/log.hpp"
#include "poolscope/pool/factory.hpp"

#ifdef POOLSCOPE_ALLOC_PLUGIN_PATH

namespace {

using malloc_fn = void* (*)(ssize_t, int, void*);
using free_fn = void (*)(void*, ssize_t, int, void*);
using stats_fn = const char* (*)(int);
using release_fn = std::size_t (*)(int);
using version_fn = const char* (*)();

/// The loaded plug-in; loaded once per process and never unloaded (like PyTorch does).
struct plugin_api {
  void* handle = nullptr;
  malloc_fn malloc = nullptr;
  free_fn free = nullptr;
  stats_fn stats = nullptr;
  release_fn release = nullptr;
  version_fn version = nullptr;
  std::string error;

  static plugin_api& get() {
    static plugin_api api = load();
    return api;
  }

  static plugin_api load() {
    plugin_api a;
    a.handle = ::dlopen(POOLSCOPE_ALLOC_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (a.handle == nullptr) {
      a.error = ::dlerror();
      return a;
    }
    a.malloc = reinterpret_cast<malloc_fn>(::dlsym(a.handle, "poolscope_malloc"));
    a.free = reinterpret_cast<free_fn>(::dlsym(a.handle, "poolscope_free"));
    a.stats = reinterpret_cast<stats_fn>(::dlsym(a.handle, "poolscope_stats_json"));
    a.release = reinterpret_cast<release_fn>(::dlsym(a.handle, "poolscope_release_cached"));
    a.version = reinterpret_cast<version_fn>(::dlsym(a.handle, "poolscope_version"));
    return a;
  }
};

/// Captures poolscope log lines (the plug-in logs through the same libpoolscope_core when
/// poolscope is built as shared libraries).
class log_capture {
 public:
  log_capture() {
    poolscope::set_log_sink([this](poolscope::log_level, std::string_view m) {
      std::lock_guard lock(mutex_);
      lines_.emplace_back(m);
    });
  }
  log_capture(const log_capture&) = delete;
  log_capture& operator=(const log_capture&) = delete;
  ~log_capture() { poolscope::set_log_sink({}); }
  [[nodiscard]] std::size_t count(const std::string& needle) const {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(std::count_if(lines_.begin(), lines_.end(), [&](const auto& l) {
      return l.find(needle) != std::string::npos;
    }));
  }
  [[nodiscard]] std::string all() const {
    std::lock_guard lock(mutex_);
    std::string s;
    for (const auto& l : lines_) {
      s += l + "\n";
    }
    return s;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
};

bool logs_shared() {
#ifdef POOLSCOPE_ALLOC_SHARES_LOG
  return true;
#else
  return false;
#endif
}

class plugin : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = &plugin_api::get();
    ASSERT_NE(api_->handle, nullptr)
        << "dlopen(" << POOLSCOPE_ALLOC_PLUGIN_PATH << ") failed: " << api_->error;
    ASSERT_NE(api_->malloc, nullptr);
    ASSERT_NE(api_->free, nullptr);
    ASSERT_NE(api_->stats, nullptr);
    ASSERT_NE(api_->release, nullptr);
    ASSERT_NE(api_->version, nullptr);
  }

  /// Chooses the strategy and resource for devices used from now on.
  static void configure(const char* allocator, const char* resource = "host") {
    if (allocator == nullptr) {
      ::unsetenv("POOLSCOPE_ALLOCATOR");
    } else {
      ::setenv("POOLSCOPE_ALLOCATOR", allocator, 1);
    }
    ::setenv("POOLSCOPE_RESOURCE", resource, 1);
  }

  [[nodiscard]] nlohmann::json stats(int device) const {
    return nlohmann::json::parse(api_->stats(device));
  }

  plugin_api* api_ = nullptr;
};

std::size_t round512(std::size_t n) {
  return (n + 511) / 512 * 512;
}

/// The names of the symbols `path` (an ELF64 shared library) defines and exports.
std::vector<std::string> exported_symbols(const char* path) {
  std::ifstream f(path, std::ios::binary);
  const std::vector<char> data((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
  std::vector<std::string> names;
  Elf64_Ehdr eh{};
  if (data.size() < sizeof eh) {
    return names;
  }
  std::memcpy(&eh, data.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) {
    return names;
  }
  auto section = [&](std::size_t i) {
    Elf64_Shdr sh{};
    std::memcpy(&sh, data.data() + eh.e_shoff + i * eh.e_shentsize, sizeof sh);
    return sh;
  };
  for (std::size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = section(i);
    if (sh.sh_type != SHT_DYNSYM) {
      continue;
    }
    const Elf64_Shdr strtab = section(sh.sh_link);
    for (std::size_t k = 0; k < sh.sh_size / sizeof(Elf64_Sym); ++k) {
      Elf64_Sym sym{};
      std::memcpy(&sym, data.data() + sh.sh_offset + k * sizeof(Elf64_Sym), sizeof sym);
      const int bind = ELF64_ST_BIND(sym.st_info);
      if (sym.st_shndx == SHN_UNDEF || sym.st_name == 0 ||
          ELF64_ST_VISIBILITY(sym.st_other) != STV_DEFAULT ||
          (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE)) {
        continue;
      }
      names.emplace_back(data.data() + strtab.sh_offset + sym.st_name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(plugin, exports_only_the_c_abi) {
  const std::vector<std::string> expected{"poolscope_free",           "poolscope_malloc",
                                          "poolscope_release_cached", "poolscope_set_oom_callback",
                                          "poolscope_snapshot",       "poolscope_stats_json",
                                          "poolscope_version"};
  EXPECT_EQ(exported_symbols(POOLSCOPE_ALLOC_PLUGIN_PATH), expected);
  // "major.minor.patch": three non-empty runs of digits separated by two dots.
  const std::string v = api_->version();
  int dots = 0;
  bool digit_before = false;
  bool well_formed = !v.empty();
  for (char c : v) {
    if (c == '.' && digit_before) {
      ++dots;
      digit_before = false;
    } else if (c >= '0' && c <= '9') {
      digit_before = true;
    } else {
      well_formed = false;
    }
  }
  EXPECT_TRUE(well_formed && dots == 2 && digit_before) << v;
}

TEST_F(plugin, malloc_free_round_trip_on_host) {
  configure("best_fit");
  constexpr int dev = 1;
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t n : {1UL, 100UL, 4096UL, 70000UL, 3UL << 20}) {
    void* p = api_->malloc(static_cast<ssize_t>(n), dev, nullptr);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0U);
    std::memset(p, static_cast<int>(n & 0xff), n);  // the memory is real and writable
    blocks.emplace_back(p, n);
  }
  for (auto& [p, n] : blocks) {
    const auto* b = static_cast<const unsigned char*>(p);
    EXPECT_EQ(b[0], static_cast<unsigned char>(n & 0xff));
    EXPECT_EQ(b[n - 1], static_cast<unsigned char>(n & 0xff));
    api_->free(p, static_cast<ssize_t>(n), dev, nullptr);
  }
  const auto j = stats(dev);
  EXPECT_EQ(j["in_use"], 0U);
  EXPECT_EQ(j["allocator"], "best_fit");
  EXPECT_EQ(j["resource"], "host");
  EXPECT_EQ(j["name"], "best_fit/host");
  EXPECT_EQ(j["initialized"], true);
}

TEST_F(plugin, stats_json_matches_the_operations) {
  configure("best_fit");
  constexpr int dev = 2;
  const auto before = stats(dev);  // before the first malloc: not initialized yet, or (on a
                                   // repeated run) whatever earlier repetitions left
  const std::uint64_t allocs0 = before.value("allocations", 0ULL);
  const std::uint64_t frees0 = before.value("deallocations", 0ULL);
  const std::vector<std::size_t> sizes{100, 1000, 5000, 70000, 1 << 20};
  std::vector<void*> ptrs;
  std::size_t rounded = 0;
  std::size_t requested = 0;
  for (std::size_t n : sizes) {
    ptrs.push_back(api_->malloc(static_cast<ssize_t>(n), dev, nullptr));
    ASSERT_NE(ptrs.back(), nullptr);
    rounded += round512(n);
    requested += n;
  }
  auto mid = stats(dev);
  EXPECT_EQ(mid["allocations"], allocs0 + sizes.size());
  EXPECT_EQ(mid["in_use"], rounded);
  EXPECT_EQ(mid["requested_in_use"], requested);
  EXPECT_GE(mid["peak_in_use"].get<std::size_t>(), rounded);
  EXPECT_GE(mid["reserved"].get<std::size_t>(), rounded);
  // Free the first two: best_fit caches them by rounded size.
  api_->free(ptrs[0], 100, dev, nullptr);
  api_->free(ptrs[1], 1000, dev, nullptr);
  auto after = stats(dev);
  EXPECT_EQ(after["deallocations"], frees0 + 2);
  EXPECT_EQ(after["in_use"], rounded - round512(100) - round512(1000));
  EXPECT_EQ(after["requested_in_use"], requested - 1100);
  EXPECT_GE(after["cached_blocks"].get<std::size_t>(), 2U);
  for (std::size_t i = 2; i < sizes.size(); ++i) {
    api_->free(ptrs[i], static_cast<ssize_t>(sizes[i]), dev, nullptr);
  }
  const auto end = stats(dev);
  EXPECT_EQ(end["in_use"], 0U);
  EXPECT_EQ(end["requested_in_use"], 0U);
  EXPECT_EQ(end["deallocations"], frees0 + sizes.size());
  EXPECT_EQ(end["device"], dev);
  // Every field of allocator_stats::to_json is there.
  for (const char* k : {"peak_requested", "peak_reserved", "upstream_allocs", "upstream_frees",
                        "largest_free_block", "fragmentation", "oom_count", "invalid_frees"}) {
    EXPECT_TRUE(end.contains(k)) << k;
  }
}

TEST_F(plugin, release_cached_returns_cached_bytes) {
  configure("best_fit");
  constexpr int dev = 3;
  ASSERT_NE(api_->malloc(1, dev, nullptr), nullptr) << "first use";  // creates the pool
  api_->release(dev);
  const auto base = stats(dev);
  const std::vector<std::size_t> sizes{3000, 9000, 40000};
  std::vector<void*> ptrs;
  for (std::size_t n : sizes) {
    ptrs.push_back(api_->malloc(static_cast<ssize_t>(n), dev, nullptr));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    api_->free(ptrs[i], static_cast<ssize_t>(sizes[i]), dev, nullptr);
  }
  const std::size_t expected = round512(3000) + round512(9000) + round512(40000);
  EXPECT_EQ(stats(dev)["cached_bytes"].get<std::size_t>(),
            base["cached_bytes"].get<std::size_t>() + expected);
  EXPECT_EQ(api_->release(dev), expected);
  const auto after = stats(dev);
  EXPECT_EQ(after["cached_bytes"], 0U);
  EXPECT_EQ(after["upstream_frees"].get<std::uint64_t>(),
            base["upstream_frees"].get<std::uint64_t>() + sizes.size());
  // A negative device releases every device's cache, this one's included.
  void* q = api_->malloc(10000, dev, nullptr);
  api_->free(q, 10000, dev, nullptr);
  EXPECT_GE(api_->release(-1), round512(10000));
  EXPECT_EQ(stats(dev)["cached_bytes"], 0U);
  EXPECT_EQ(api_->release(-1), 0U) << "nothing left cached on any device";
}

TEST_F(plugin, default_allocator_is_bfc) {
  configure(nullptr);
  constexpr int dev = 4;
  const auto names = poolscope::pool::allocator_names();
  const bool have_bfc = std::find(names.begin(), names.end(), "bfc") != names.end();
  void* p = api_->malloc(4096, dev, nullptr);
  const auto j = stats(dev);
  EXPECT_EQ(j["allocator"], "bfc");
  if (have_bfc) {
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(j["name"], "bfc/host");
    api_->free(p, 4096, dev, nullptr);
  } else {
    EXPECT_EQ(p, nullptr) << "bfc is not registered yet: the default must fail, not fall back";
    EXPECT_EQ(j["initialized"], false);
  }
}

TEST_F(plugin, unknown_allocator_fails_with_one_log_line) {
  log_capture logs;
  configure("no_such_allocator");
  constexpr int dev = 5;
  // A device used before (an earlier --gtest_repeat round) logged its failure then: not again.
  const bool first_use = !stats(dev).contains("error");
  EXPECT_EQ(api_->malloc(1024, dev, nullptr), nullptr);
  EXPECT_EQ(api_->malloc(2048, dev, nullptr), nullptr);
  EXPECT_EQ(api_->malloc(4096, dev, nullptr), nullptr);
  const auto j = stats(dev);
  EXPECT_EQ(j["initialized"], false);
  EXPECT_EQ(j["allocator"], "no_such_allocator");
  EXPECT_NE(j["error"].get<std::string>().find("no_such_allocator"), std::string::npos);
  if (logs_shared()) {
    EXPECT_EQ(logs.count("no_such_allocator"), first_use ? 1U : 0U) << logs.all();
  }
  api_->free(nullptr, 0, dev, nullptr);  // still harmless
}

TEST_F(plugin, unknown_resource_fails) {
  configure("best_fit", "no_such_resource");
  constexpr int dev = 6;
  EXPECT_EQ(api_->malloc(1024, dev, nullptr), nullptr);
  const auto j = stats(dev);
  EXPECT_EQ(j["initialized"], false);
  EXPECT_EQ(j["resource"], "no_such_resource");
  EXPECT_NE(j["error"].get<std::string>().find("no_such_resource"), std::string::npos);
}

// An allocator name from the environment that is not valid UTF-8 (a stray Latin-1 byte) used to
// make poolscope_stats_json fail as a whole ({"error":"poolscope_stats_json failed"}), for that
// device and for every device not used yet, hiding which name was wrong. The report stays
// whole; the bad byte becomes U+FFFD.
TEST_F(plugin, stats_json_survives_a_name_that_is_not_utf8) {
  configure("best_fit\xff", "host");
  constexpr int dev = 12;
  constexpr int unused_dev = 13;
  EXPECT_EQ(api_->malloc(1024, dev, nullptr), nullptr);
  const std::string replaced = "best_fit\xef\xbf\xbd";  // U+FFFD in UTF-8
  for (int d : {dev, unused_dev}) {
    const auto j = stats(d);
    ASSERT_TRUE(j.contains("device") && j.contains("allocator")) << "report lost: " << j.dump();
    EXPECT_EQ(j["device"], d);
    EXPECT_EQ(j["initialized"], false);
    EXPECT_EQ(j["allocator"], replaced);
    EXPECT_EQ(j["resource"], "host");
  }
  const auto j = stats(dev);
  ASSERT_TRUE(j.contains("error"));
  EXPECT_NE(j["error"].get<std::string>().find("unknown allocator '" + replaced + "'"),
            std::string::npos)
      << j.dump();
  configure("best_fit");  // a valid name again for devices used later
}

TEST_F(plugin, negative_and_zero_sizes) {
  log_capture logs;
  configure("best_fit");
  constexpr int dev = 7;
  EXPECT_EQ(api_->malloc(0, dev, nullptr), nullptr);
  EXPECT_EQ(api_->malloc(-1, dev, nullptr), nullptr);
  EXPECT_EQ(api_->malloc(-4096, dev, nullptr), nullptr);
  if (logs_shared()) {
    EXPECT_EQ(logs.count("negative size"), 2U) << logs.all();
  }
  void* p = api_->malloc(512, dev, nullptr);
  ASSERT_NE(p, nullptr);
  const auto before = stats(dev);
  api_->free(p, -512, dev, nullptr);  // rejected: the block stays allocated
  EXPECT_EQ(stats(dev)["in_use"], before["in_use"]);
  EXPECT_EQ(stats(dev)["deallocations"], before["deallocations"]);
  api_->free(p, 512, dev, nullptr);
  EXPECT_EQ(stats(dev)["in_use"], 0U);
}

TEST_F(plugin, free_null_is_a_no_op) {
  log_capture logs;
  configure("best_fit");
  constexpr int dev = 8;
  api_->free(nullptr, 0, dev, nullptr);  // before the device's first use
  api_->free(nullptr, 4096, dev, nullptr);
  void* p = api_->malloc(100, dev, nullptr);
  ASSERT_NE(p, nullptr);
  const auto before = stats(dev);
  api_->free(nullptr, 0, dev, nullptr);
  api_->free(nullptr, 123, dev, nullptr);
  const auto after = stats(dev);
  EXPECT_EQ(after["deallocations"], before["deallocations"]);
  EXPECT_EQ(after["invalid_frees"], before["invalid_frees"]);
  api_->free(p, 100, dev, nullptr);
  if (logs_shared()) {
    EXPECT_EQ(logs.all(), "");
  }
}

TEST_F(plugin, bad_device_is_rejected) {
  configure("best_fit");
  EXPECT_EQ(api_->malloc(64, -1, nullptr), nullptr);
  EXPECT_EQ(api_->malloc(64, 64, nullptr), nullptr);
  EXPECT_EQ(api_->malloc(64, 1 << 20, nullptr), nullptr);
  const auto j = stats(-3);
  EXPECT_EQ(j["initialized"], false);
  EXPECT_TRUE(j.contains("error"));
  EXPECT_EQ(api_->release(1000), 0U);
  api_->free(reinterpret_cast<void*>(0x1000), 64, 99, nullptr);  // logged, ignored
}

TEST_F(plugin, out_of_memory_returns_null_and_is_counted) {
  log_capture logs;
  configure("best_fit");
  constexpr int dev = 9;
  ASSERT_NE(api_->malloc(8, dev, nullptr), nullptr) << "first use";
  const auto before = stats(dev);
  // Past the largest supported request (1 PiB): the allocator throws out_of_memory, which must
  // not cross the C ABI.
  EXPECT_EQ(api_->malloc(ssize_t{1} << 52, dev, nullptr), nullptr);
  const auto after = stats(dev);
  EXPECT_EQ(after["oom_count"].get<std::uint64_t>(), before["oom_count"].get<std::uint64_t>() + 1);
  if (logs_shared()) {
    EXPECT_GE(logs.count("out of memory"), 1U) << logs.all();
  }
}

// With no POOLSCOPE_SNAPSHOT when the plug-in started (this process), nothing was recorded: a
// snapshot is refused with one log line, and no file is made.
TEST_F(plugin, snapshot_without_recording_is_refused) {
  using snapshot_fn = int (*)(const char*);
  auto snap = reinterpret_cast<snapshot_fn>(::dlsym(api_->handle, "poolscope_snapshot"));
  ASSERT_NE(snap, nullptr);
  const std::string path = ::testing::TempDir() + "poolscope_never_written.pickle";
  std::remove(path.c_str());
  log_capture log;
  EXPECT_EQ(snap(path.c_str()), -1);
  EXPECT_FALSE(std::ifstream(path).good());
  if (logs_shared()) {
    EXPECT_EQ(log.count("recording is off (set POOLSCOPE_SNAPSHOT"), 1U) << log.all();
  }
}

TEST_F(plugin, foreign_pointer_is_reported_not_fatal) {
  configure("best_fit");
  constexpr int dev = 10;
  void* p = api_->malloc(256, dev, nullptr);
  ASSERT_NE(p, nullptr);
  const auto before = stats(dev);
  int local = 0;
  api_->free(&local, sizeof local, dev, nullptr);  // never allocated here
  const auto after = stats(dev);
  EXPECT_EQ(after["invalid_frees"].get<std::uint64_t>(),
            before["invalid_frees"].get<std::uint64_t>() + 1);
  EXPECT_EQ(after["in_use"], before["in_use"]);
  api_->free(p, 256, dev, nullptr);
}

// ---- sizing, the OOM callback and bad frees (plugin/src/plugin_options.hpp) ----

using oom_callback_fn = int (*)(int, std::size_t, void*);
using set_oom_fn = void (*)(oom_callback_fn, void*);

/// Sets (value) or clears (nullptr) one of the plug-in's variables for the devices made next.
void set_env(const char* name, const char* value) {
  if (value == nullptr) {
    ::unsetenv(name);
  } else {
    ::setenv(name, value, 1);
  }
}

/// One of the sizing variables, cleared again when it goes (devices made meanwhile keep it).
struct sizing_env {
  sizing_env(const char* name, const char* value) : name_(name) { set_env(name, value); }
  ~sizing_env() { set_env(name_, nullptr); }
  sizing_env(const sizing_env&) = delete;
  sizing_env& operator=(const sizing_env&) = delete;

 private:
  const char* name_;
};

TEST_F(plugin, limit_caps_what_a_pool_hands_out) {
  configure("best_fit");
  const sizing_env env("POOLSCOPE_LIMIT", "64K");
  constexpr int dev = 40;
  void* a = api_->malloc(32 << 10, dev, nullptr);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(stats(dev)["limit"].get<std::uint64_t>(), 64U << 10);
  EXPECT_EQ(api_->malloc(48 << 10, dev, nullptr), nullptr) << "32K + 48K is past the 64K limit";
  EXPECT_GE(stats(dev)["oom_count"].get<std::uint64_t>(), 1U);
  api_->free(a, 32 << 10, dev, nullptr);
  void* b = api_->malloc(48 << 10, dev, nullptr);
  EXPECT_NE(b, nullptr) << "fits once the first block is back";
  api_->free(b, 48 << 10, dev, nullptr);
}

// The OOM callback sees the device and size, frees what it can, and asks for one retry.
struct oom_state {
  plugin_api* api = nullptr;
  void* held = nullptr;
  int calls = 0;
  int device = -1;
  std::size_t size = 0;
  bool retry = true;
};

int free_held_block(int device, std::size_t size, void* user) {
  auto* s = static_cast<oom_state*>(user);
  ++s->calls;
  s->device = device;
  s->size = size;
  if (s->held != nullptr) {
    s->api->free(s->held, 32 << 10, device, nullptr);
    s->held = nullptr;
  }
  return s->retry ? 1 : 0;
}

TEST_F(plugin, oom_callback_frees_and_retries_once) {
  const auto set_oom =
      reinterpret_cast<set_oom_fn>(::dlsym(api_->handle, "poolscope_set_oom_callback"));
  ASSERT_NE(set_oom, nullptr);
  configure("best_fit");
  const sizing_env env("POOLSCOPE_LIMIT", "64K");
  constexpr int dev = 41;
  oom_state st;
  st.api = api_;
  st.held = api_->malloc(32 << 10, dev, nullptr);
  ASSERT_NE(st.held, nullptr);
  set_oom(&free_held_block, &st);
  void* big = api_->malloc(48 << 10, dev, nullptr);
  EXPECT_NE(big, nullptr) << "the callback freed 32K, the retry fits";
  EXPECT_EQ(st.calls, 1);
  EXPECT_EQ(st.device, dev);
  EXPECT_EQ(st.size, std::size_t{48} << 10);
  // Nothing left to free: the callback declines, the request fails, once asked.
  st.retry = false;
  EXPECT_EQ(api_->malloc(48 << 10, dev, nullptr), nullptr);
  EXPECT_EQ(st.calls, 2);
  set_oom(nullptr, nullptr);
  EXPECT_EQ(api_->malloc(48 << 10, dev, nullptr), nullptr);
  EXPECT_EQ(st.calls, 2) << "removed: not called";
  api_->free(big, 48 << 10, dev, nullptr);
}

TEST_F(plugin, initial_pool_size_is_reserved_when_the_pool_is_made) {
  configure("bfc");
  const sizing_env env("POOLSCOPE_INITIAL_POOL_SIZE", "1M");
  constexpr int dev = 42;
  void* p = api_->malloc(256, dev, nullptr);
  ASSERT_NE(p, nullptr);
  const auto s = stats(dev);
  EXPECT_GE(s["reserved"].get<std::uint64_t>(), 1U << 20);
  EXPECT_EQ(s["upstream_allocs"].get<std::uint64_t>(), 1U) << "256 B came out of the 1 MiB";
  api_->free(p, 256, dev, nullptr);
}

TEST_F(plugin, max_pool_size_caps_what_a_pool_takes_upstream) {
  configure("best_fit");
  const sizing_env env("POOLSCOPE_MAX_POOL_SIZE", "1M");
  constexpr int dev = 43;
  void* a = api_->malloc(768 << 10, dev, nullptr);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(api_->malloc(512 << 10, dev, nullptr), nullptr) << "768K + 512K is past 1M";
  const auto s = stats(dev);
  EXPECT_GE(s["upstream_failures"].get<std::uint64_t>(), 1U);
  EXPECT_LE(s["peak_reserved"].get<std::uint64_t>(), 1U << 20);
  api_->free(a, 768 << 10, dev, nullptr);
  // The cached 768K goes back upstream before the pool fails: 512K now fits.
  void* b = api_->malloc(512 << 10, dev, nullptr);
  EXPECT_NE(b, nullptr);
  api_->free(b, 512 << 10, dev, nullptr);
}

TEST_F(plugin, release_threshold_returns_the_cache_after_a_free) {
  configure("bfc");
  constexpr int kept = 44;
  constexpr int released = 45;
  {
    void* p = api_->malloc(1 << 20, kept, nullptr);
    api_->free(p, 1 << 20, kept, nullptr);
  }
  const sizing_env env("POOLSCOPE_RELEASE_THRESHOLD", "64K");
  void* p = api_->malloc(1 << 20, released, nullptr);
  ASSERT_NE(p, nullptr);
  api_->free(p, 1 << 20, released, nullptr);
  EXPECT_GE(stats(kept)["reserved"].get<std::uint64_t>(), 1U << 20) << "no threshold: kept";
  EXPECT_EQ(stats(released)["reserved"].get<std::uint64_t>(), 0U) << "1 MiB cached > 64K";
}

TEST_F(plugin, bad_sizing_values_are_named) {
  configure("bfc");
  const sizing_env env("POOLSCOPE_LIMIT", "lots");
  constexpr int dev = 46;
  EXPECT_EQ(api_->malloc(256, dev, nullptr), nullptr);
  const auto s = stats(dev);
  ASSERT_TRUE(s.contains("error")) << s.dump();
  EXPECT_NE(s["error"].get<std::string>().find("POOLSCOPE_LIMIT='lots'"), std::string::npos)
      << s.dump();
}

TEST_F(plugin, a_free_on_a_device_without_a_pool_is_a_counted_bad_free) {
  log_capture logs;
  constexpr int dev = 47;  // never allocated on
  int local = 0;
  EXPECT_EQ(stats(dev)["bad_frees"].get<std::uint64_t>(), 0U);
  api_->free(&local, sizeof local, dev, nullptr);
  api_->free(&local, sizeof local, dev, nullptr);
  EXPECT_EQ(stats(dev)["bad_frees"].get<std::uint64_t>(), 2U);
  if (logs_shared()) {
    char where[32];
    std::snprintf(where, sizeof where, "%p", static_cast<void*>(&local));
    EXPECT_EQ(logs.count(std::string("bad free of ") + where), 2U) << logs.all();
  }
}

// poolscope_stats_json kept its text in a thread_local std::string, destroyed with the calling
// thread's thread_local objects: at a thread's exit, and for the main thread at exit() before
// the atexit handlers and static destructors run. A report asked for after that (a thread_local
// or static destructor logging the pool's state, as frameworks do at shutdown) reused the freed
// buffer: a use after free and a double free. A child process asks for reports at both points.
plugin_api* g_exit_api = nullptr;
constexpr int exit_dev = 14;
constexpr std::size_t exit_bytes = 4096;

/// 0 if `text` is the report of exit_dev with one live block of exit_bytes, else an exit code.
int check_exit_report(const char* text) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return 21;
  }
  if (j.value("device", -1) != exit_dev || j.value("in_use", std::size_t{0}) != exit_bytes ||
      j.value("allocations", std::uint64_t{0}) != 1) {
    return 22;
  }
  return 0;
}

/// A thread_local object constructed before the thread's first report, so destroyed after it.
struct report_at_thread_exit {
  int* result = nullptr;
  ~report_at_thread_exit() {
    for (int i = 0; i < 3 && *result == 0; ++i) {
      *result = check_exit_report(g_exit_api->stats(exit_dev));
    }
  }
};

void report_at_exit() {
  int result = 0;
  for (int i = 0; i < 3 && result == 0; ++i) {
    result = check_exit_report(g_exit_api->stats(exit_dev));
  }
  std::fflush(nullptr);
  std::_Exit(result);
}

TEST_F(plugin, stats_json_works_after_the_threads_thread_locals_are_destroyed) {
  configure("best_fit");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    g_exit_api = api_;
    if (api_->malloc(static_cast<ssize_t>(exit_bytes), exit_dev, nullptr) == nullptr) {
      std::_Exit(10);
    }
    int thread_result = -1;
    std::thread([&thread_result] {
      thread_local report_at_thread_exit late;
      late.result = &thread_result;
      thread_result = check_exit_report(g_exit_api->stats(exit_dev));  // the thread's first
    }).join();
    if (thread_result != 0) {
      std::_Exit(30 + thread_result);
    }
    if (check_exit_report(api_->stats(exit_dev)) != 0) {  // the main thread's report, live
      std::_Exit(11);
    }
    if (std::atexit(report_at_exit) != 0) {
      std::_Exit(12);
    }
    std::exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "2x: a report at exit was not valid (21) or wrong (22); 5x: the same at thread exit";
}

// Many threads racing on a device's first use get one pool, and their operations all land in it.
TEST(plugin_concurrency, first_use_from_many_threads) {
  plugin_api& api = plugin_api::get();
  ASSERT_NE(api.handle, nullptr) << api.error;
  ::setenv("POOLSCOPE_ALLOCATOR", "best_fit", 1);
  ::setenv("POOLSCOPE_RESOURCE", "host", 1);
  constexpr int dev = 11;
  constexpr int threads = 8;
  constexpr int rounds = 500;
  const auto before = nlohmann::json::parse(api.stats(dev));
  const std::uint64_t allocs0 = before.value("allocations", 0ULL);
  std::atomic<int> go{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      go.fetch_add(1);
      while (go.load() < threads) {
        std::this_thread::yield();
      }
      for (int i = 0; i < rounds; ++i) {
        const auto n = static_cast<std::size_t>(64 + ((t * 7919 + i * 104729) % 20000));
        auto* p = static_cast<unsigned char*>(api.malloc(static_cast<ssize_t>(n), dev, nullptr));
        if (p == nullptr) {
          failures.fetch_add(1);
          continue;
        }
        p[0] = static_cast<unsigned char>(t);
        p[n - 1] = static_cast<unsigned char>(t);
        if (p[0] != static_cast<unsigned char>(t) || p[n - 1] != static_cast<unsigned char>(t)) {
          failures.fetch_add(1);
        }
        api.free(p, static_cast<ssize_t>(n), dev, nullptr);
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  EXPECT_EQ(failures.load(), 0);
  const auto j = nlohmann::json::parse(api.stats(dev));
  EXPECT_EQ(j["allocations"].get<std::uint64_t>(), allocs0 + threads * rounds);
  EXPECT_EQ(j["in_use"], 0U);
  EXPECT_EQ(j["invalid_frees"], 0U);
}

// Every function of the C ABI is thread-safe (poolscope_alloc.h): threads allocate and free on
// two devices (blocks often freed by another thread) while others release the caches and read
// the reports. Each report parses, and the counters end where the operations say.
TEST(plugin_concurrency, malloc_free_release_and_stats_from_many_threads) {
  plugin_api& api = plugin_api::get();
  ASSERT_NE(api.handle, nullptr) << api.error;
  ::setenv("POOLSCOPE_ALLOCATOR", "bfc", 1);
  ::setenv("POOLSCOPE_RESOURCE", "host", 1);
  constexpr int devs[] = {15, 16};
  constexpr int workers = 4;
  constexpr int rounds = 2000;
  std::uint64_t allocs0[2] = {};
  std::uint64_t frees0[2] = {};
  for (int d = 0; d < 2; ++d) {
    const auto j = nlohmann::json::parse(api.stats(devs[d]));
    allocs0[d] = j.value("allocations", std::uint64_t{0});
    frees0[d] = j.value("deallocations", std::uint64_t{0});
  }
  struct handed {
    void* p;
    std::size_t n;
    int dev;
    unsigned char v;
  };
  std::mutex mailbox_mutex;
  std::vector<handed> mailbox;
  std::atomic<int> bad{0};
  std::atomic<int> bad_reports{0};
  std::atomic<int> running{workers};
  std::atomic<std::uint64_t> allocs[2] = {};
  auto check_and_free = [&](const handed& h) {
    const auto* b = static_cast<const unsigned char*>(h.p);
    if (b[0] != h.v || b[h.n - 1] != h.v) {
      bad.fetch_add(1);
    }
    api.free(h.p, static_cast<ssize_t>(h.n), h.dev, nullptr);
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < workers; ++t) {
    pool.emplace_back([&, t] {
      std::vector<handed> mine;
      for (int i = 0; i < rounds; ++i) {
        const int d = (t + i) % 2;
        const auto n = static_cast<std::size_t>(64 + ((t * 7919 + i * 104729) % 70000));
        auto* p =
            static_cast<unsigned char*>(api.malloc(static_cast<ssize_t>(n), devs[d], nullptr));
        if (p == nullptr) {
          bad.fetch_add(1);
          continue;
        }
        allocs[d].fetch_add(1);
        const auto v = static_cast<unsigned char>(1 + t);
        p[0] = v;
        p[n - 1] = v;
        mine.push_back({p, n, devs[d], v});
        if (mine.size() > 8) {
          const handed h = mine.front();
          mine.erase(mine.begin());
          if (i % 3 == 0) {
            std::lock_guard lock(mailbox_mutex);
            mailbox.push_back(h);  // freed by another thread
          } else {
            check_and_free(h);
          }
        }
        if (i % 7 == 0) {
          std::vector<handed> in;
          {
            std::lock_guard lock(mailbox_mutex);
            in.swap(mailbox);
          }
          for (const auto& h : in) {
            check_and_free(h);
          }
        }
      }
      for (const auto& h : mine) {
        check_and_free(h);
      }
      running.fetch_sub(1);
    });
  }
  std::thread janitor([&] {
    int i = 0;
    while (running.load() > 0) {
      const int d = devs[i++ % 2];
      const auto j = nlohmann::json::parse(api.stats(d), nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || j.value("device", -1) != d ||
          j.value("in_use", std::size_t{0}) > j.value("reserved", std::size_t{0})) {
        bad_reports.fetch_add(1);
      }
      (void)api.release(i % 3 == 0 ? -1 : d);
      std::this_thread::yield();
    }
  });
  for (auto& th : pool) {
    th.join();
  }
  janitor.join();
  for (const auto& h : mailbox) {
    check_and_free(h);
  }
  EXPECT_EQ(bad.load(), 0) << "a failed malloc or an overwritten block";
  EXPECT_EQ(bad_reports.load(), 0);
  for (int d = 0; d < 2; ++d) {
    (void)api.release(devs[d]);
    const auto j = nlohmann::json::parse(api.stats(devs[d]));
    EXPECT_EQ(j["allocations"].get<std::uint64_t>(), allocs0[d] + allocs[d].load());
    EXPECT_EQ(j["deallocations"].get<std::uint64_t>(), frees0[d] + allocs[d].load());
    EXPECT_EQ(j["in_use"], 0U);
    EXPECT_EQ(j["invalid_frees"], 0U);
    EXPECT_EQ(j["cached_bytes"], 0U);
    EXPECT_EQ(j["reserved"], 0U);
  }
}

}  // namespace

#else

TEST(plugin, skipped) {
  GTEST_SKIP() << "the plug-in target poolscope_alloc is not part of this build";
}

#endif
