// NVTX as a tool sees it: the tests attach tests/profiler/nvtx_injection (an NVTX injection
// library that records every call) and check the domain, categories, registered strings, range
// nesting, marks and the memory API's heap/region registrations.
//
// The library must be named in NVTX_INJECTION64_PATH before NVTX initializes (the first NVTX
// call in the process); a constructor below sets it before main and before any static object of
// this executable is built. It does not overwrite a value set from outside (then another tool,
// e.g. Nsight or CUPTI, is attached and these tests skip, saying so).
//
// What is verified through the injection: DomainCreateA, DomainNameCategoryA,
// DomainRegisterStringA, DomainRangePushEx/Pop (message, category, colour, per-thread depth),
// DomainMarkEx (message, payload), and the NVTX memory module: MemHeapRegister (range, usage
// SUB_ALLOCATOR, type VIRTUAL_ADDRESS), MemRegionsRegister (range, heap handle),
// MemRegionsUnregister, MemHeapUnregister. What is not verified here: how compute-sanitizer
// acts on them (tests/profiler/nvtx_memcheck_gpu_test.cu, run under compute-sanitizer on a GPU).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pool/allocator_types.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"
#include "poolscope/profiler/function_profiler.hpp"
#include "poolscope/profiler/nvtx.hpp"
#include "support/failing_new.hpp"
// The profiler test program's one inclusion of the failing operator new (its users: the memory
// hook's out-of-memory test here, and out_of_host_memory_test.cpp).
#include "support/failing_new_operators.hpp"

#ifndef POOLSCOPE_NVTX_INJECTION_PATH
#error \
    "POOLSCOPE_NVTX_INJECTION_PATH must name the test injection library (tests/profiler/nvtx_injection)"
#endif

namespace {
const char* g_declined = nullptr;  // why the test tool was not attached, if it was not

int is_compute_sanitizer(dl_phdr_info* info, std::size_t /*size*/, void* /*data*/) {
  return info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "compute-sanitizer") != nullptr
             ? 1
             : 0;
}
}  // namespace

// Runs before the executable's static initializers and main: NVTX reads the variable once, on
// its first call. Another tool named from outside, or compute-sanitizer (which preloads its own
// library and must be the NVTX tool for tests/profiler/nvtx_memcheck_gpu_test.cu), wins.
__attribute__((constructor(101))) static void poolscope_test_attach_nvtx_injection() {
  if (std::getenv("NVTX_INJECTION64_PATH") != nullptr) {
    g_declined = "NVTX_INJECTION64_PATH names another tool";
  } else if (dl_iterate_phdr(&is_compute_sanitizer, nullptr) != 0) {
    g_declined = "running under compute-sanitizer";
  } else {
    setenv("NVTX_INJECTION64_PATH", POOLSCOPE_NVTX_INJECTION_PATH, /*overwrite=*/0);
  }
}

namespace {

using json = nlohmann::json;
using poolscope::profiler::category;

// The injection library's C interface, found with dlsym in the copy NVTX loaded.
struct injection {
  int (*initialized)() = nullptr;
  std::size_t (*copy)(char*, std::size_t) = nullptr;
  void (*clear)() = nullptr;
  std::uint64_t (*dropped)() = nullptr;

  // Every recorded call, parsed.
  [[nodiscard]] std::vector<json> lines() const {
    const std::size_t n = copy(nullptr, 0);
    std::string buf(n + 1, '\0');
    copy(buf.data(), buf.size());
    buf.resize(n);
    std::vector<json> out;
    std::size_t pos = 0;
    while (pos < buf.size()) {
      const std::size_t end = buf.find('\n', pos);
      out.push_back(json::parse(buf.substr(pos, end - pos)));
      pos = end + 1;
    }
    return out;
  }
};

// Null if NVTX did not load our library.
const injection* loaded_injection() {
  static const std::optional<injection> inj = []() -> std::optional<injection> {
    (void)poolscope::profiler::nvtx_tool_attached();  // initializes NVTX: loads the tool
    void* h = dlopen(POOLSCOPE_NVTX_INJECTION_PATH, RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) {
      return std::nullopt;
    }
    injection i;
    i.initialized = reinterpret_cast<int (*)()>(dlsym(h, "poolscope_nvtx_injection_initialized"));
    i.copy = reinterpret_cast<std::size_t (*)(char*, std::size_t)>(
        dlsym(h, "poolscope_nvtx_injection_copy"));
    i.clear = reinterpret_cast<void (*)()>(dlsym(h, "poolscope_nvtx_injection_clear"));
    i.dropped = reinterpret_cast<std::uint64_t (*)()>(dlsym(h, "poolscope_nvtx_injection_dropped"));
    if (i.initialized == nullptr || i.copy == nullptr || i.clear == nullptr ||
        i.dropped == nullptr) {
      return std::nullopt;
    }
    return i;
  }();
  return inj ? &*inj : nullptr;
}

std::vector<json> only(const std::vector<json>& lines, std::string_view call) {
  std::vector<json> out;
  for (const auto& l : lines) {
    if (l["call"] == call) {
      out.push_back(l);
    }
  }
  return out;
}

std::uint64_t addr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

constexpr std::uint32_t color_of(category c) {
  switch (c) {
    case category::pool:
      return 0xFFE69F00U;
    case category::darray_transfer:
      return 0xFF0072B2U;
    case category::darray_compute:
      return 0xFF009E73U;
    case category::user:
      break;
  }
  return 0xFFCC79A7U;
}

class nvtx_injection : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const injection* inj = loaded_injection();
    if (inj != nullptr && !history_) {
      history_ = inj->lines();  // everything since NVTX started, before any test clears it
    }
  }

  void SetUp() override {
    inj_ = loaded_injection();
    if (inj_ == nullptr) {
      if (g_declined != nullptr) {
        GTEST_SKIP() << "the test NVTX tool is not attached: " << g_declined;
      }
      FAIL() << "NVTX did not load " POOLSCOPE_NVTX_INJECTION_PATH;
    }
    ASSERT_EQ(inj_->initialized() & 1, 1) << "InitializeInjectionNvtx2 was not called";
    ASSERT_TRUE(poolscope::profiler::nvtx_tool_attached());
    inj_->clear();
  }

  // This test's calls in the poolscope domain.
  [[nodiscard]] std::vector<json> recorded() const {
    std::vector<json> out;
    for (auto& l : inj_->lines()) {
      if (l.value("domain", "") == "poolscope") {
        out.push_back(std::move(l));
      }
    }
    return out;
  }

  const injection* inj_ = nullptr;
  static inline std::optional<std::vector<json>> history_;
};

TEST_F(nvtx_injection, domain_created_once_with_named_categories) {
  ASSERT_TRUE(history_.has_value());
  const auto creates = only(*history_, "DomainCreateA");
  int poolscope_domains = 0;
  for (const auto& c : creates) {
    poolscope_domains += c["domain"] == "poolscope" ? 1 : 0;
  }
  EXPECT_EQ(poolscope_domains, 1);
  std::map<std::uint64_t, std::string> names;
  for (const auto& l : only(*history_, "DomainNameCategoryA")) {
    if (l["domain"] == "poolscope") {
      names[l["category"].get<std::uint64_t>()] = l["name"].get<std::string>();
    }
  }
  const std::map<std::uint64_t, std::string> expected = {
      {1, "pool"}, {2, "darray.transfer"}, {3, "darray.compute"}, {4, "user"}};
  EXPECT_EQ(names, expected);
}

TEST_F(nvtx_injection, scopes_are_nested_ranges_with_registered_names) {
  static int runs = 0;  // names are registered on the first run only (--gtest_repeat)
  const bool first_run = runs++ == 0;
  {
    POOLSCOPE_SCOPE("nvtx.outer");
    { POOLSCOPE_SCOPE_IN(category::darray_compute, "nvtx.inner"); }
    {
      POOLSCOPE_SCOPE_IN(category::darray_transfer, "nvtx.inner2");
      POOLSCOPE_SCOPE_IN(category::pool, "nvtx.innermost");
    }
  }
  struct expect {
    const char* call;
    const char* message;
    category cat;
    std::uint64_t depth;
  };
  const std::vector<expect> want = {
      {"DomainRangePushEx", "nvtx.outer", category::user, 0},
      {"DomainRangePushEx", "nvtx.inner", category::darray_compute, 1},
      {"DomainRangePop", nullptr, category::user, 1},
      {"DomainRangePushEx", "nvtx.inner2", category::darray_transfer, 1},
      {"DomainRangePushEx", "nvtx.innermost", category::pool, 2},
      {"DomainRangePop", nullptr, category::user, 2},
      {"DomainRangePop", nullptr, category::user, 1},
      {"DomainRangePop", nullptr, category::user, 0},
  };
  std::vector<json> ranges;
  std::set<std::string> registered;
  for (const auto& l : recorded()) {
    if (l["call"] == "DomainRangePushEx" || l["call"] == "DomainRangePop") {
      ranges.push_back(l);
    } else if (l["call"] == "DomainRegisterStringA") {
      registered.insert(l["string"].get<std::string>());
    }
  }
  ASSERT_EQ(ranges.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(ranges[i]["call"], want[i].call);
    EXPECT_EQ(ranges[i]["depth"].get<std::uint64_t>(), want[i].depth);
    EXPECT_EQ(ranges[i]["tid"], ranges[0]["tid"]);
    if (want[i].message != nullptr) {
      EXPECT_EQ(ranges[i]["message"], want[i].message);
      EXPECT_EQ(ranges[i]["message_type"].get<int>(), 3);  // NVTX_MESSAGE_TYPE_REGISTERED
      EXPECT_EQ(ranges[i]["category"].get<std::uint32_t>(),
                static_cast<std::uint32_t>(want[i].cat));
      EXPECT_EQ(ranges[i]["color"].get<std::uint32_t>(), color_of(want[i].cat));
      EXPECT_EQ(ranges[i]["color_type"].get<int>(), 1);  // NVTX_COLOR_ARGB
    } else {
      EXPECT_EQ(ranges[i]["underflow"].get<int>(), 0);
    }
  }
  // Each name was registered the first time its site ran, i.e. in this test.
  for (const char* n : {"nvtx.outer", "nvtx.inner", "nvtx.inner2", "nvtx.innermost"}) {
    EXPECT_EQ(registered.count(n), first_run ? 1U : 0U) << n;
  }
}

TEST_F(nvtx_injection, names_are_registered_once) {
  static int runs = 0;  // names are registered on the first run only (--gtest_repeat)
  const bool first_run = runs++ == 0;
  for (int i = 0; i < 5; ++i) {
    POOLSCOPE_SCOPE("nvtx.loop");
    poolscope::profiler::scope dynamic{std::string("nvtx.") + "dynamic"};
  }
  int registrations = 0;
  int pushes = 0;
  for (const auto& l : recorded()) {
    if (l["call"] == "DomainRegisterStringA" &&
        (l["string"] == "nvtx.loop" || l["string"] == "nvtx.dynamic")) {
      ++registrations;
    }
    if (l["call"] == "DomainRangePushEx" &&
        (l["message"] == "nvtx.loop" || l["message"] == "nvtx.dynamic")) {
      ++pushes;
    }
  }
  EXPECT_EQ(registrations, first_run ? 2 : 0);
  EXPECT_EQ(pushes, 10);
}

TEST_F(nvtx_injection, ranges_nest_per_thread_and_also_while_profiling) {
  poolscope::profiler::function_profiler_options o;
  o.gpu_timing = false;
  poolscope::profiler::function_profiler prof{o};
  constexpr int threads = 4;
  std::atomic<int> finished{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&finished] {
      for (int i = 0; i < 10; ++i) {
        POOLSCOPE_SCOPE("nvtx.mt.a");
        POOLSCOPE_SCOPE("nvtx.mt.b");
      }
      // Stay alive until all are done, so no two threads share an OS thread id.
      finished.fetch_add(1);
      while (finished.load() < threads) {
        std::this_thread::yield();
      }
    });
  }
  for (auto& t : ts) {
    t.join();
  }
  prof.stop();
  EXPECT_EQ(prof.report().find("nvtx.mt.b")->calls, 40U);
  // Replay per thread: pushes and pops balance and the depth the tool saw matches the model.
  std::map<std::uint64_t, std::vector<std::string>> stacks;
  int pushes = 0;
  for (const auto& l : recorded()) {
    auto& stack = stacks[l["tid"].get<std::uint64_t>()];
    if (l["call"] == "DomainRangePushEx") {
      EXPECT_EQ(l["depth"].get<std::size_t>(), stack.size());
      if (!stack.empty()) {
        EXPECT_EQ(stack.back(), "nvtx.mt.a");
        EXPECT_EQ(l["message"], "nvtx.mt.b");
      }
      stack.push_back(l["message"].get<std::string>());
      ++pushes;
    } else if (l["call"] == "DomainRangePop") {
      ASSERT_FALSE(stack.empty());
      stack.pop_back();
      EXPECT_EQ(l["depth"].get<std::size_t>(), stack.size());
    }
  }
  EXPECT_EQ(pushes, threads * 20);
  EXPECT_EQ(stacks.size(), static_cast<std::size_t>(threads));
  for (const auto& [tid, stack] : stacks) {
    EXPECT_TRUE(stack.empty()) << tid;
  }
}

// A hook that keeps the post and instant events: the reference the marks are checked against.
struct recording_hook final : poolscope::hooks::hook {
  std::vector<poolscope::hooks::event> events;
  void on_event(const poolscope::hooks::event& e) noexcept override {
    if (e.phase != poolscope::hooks::event_phase::pre) {
      events.push_back(e);
    }
  }
};

TEST_F(nvtx_injection, marker_hook_marks_each_allocator_event) {
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator pool{host};
  recording_hook reference;
  poolscope::profiler::nvtx_marker_hook marks;
  {
    poolscope::hooks::scoped_hook on_ref{reference, poolscope::hooks::scope::thread};
    poolscope::hooks::scoped_hook on{marks, poolscope::hooks::scope::thread};
    void* a = pool.allocate({}, 1000);
    void* b = pool.allocate({}, 3000);
    pool.deallocate({}, a, 1000);
    pool.deallocate({}, b, 3000);
    (void)pool.release_cached();
  }
  const auto got = only(recorded(), "DomainMarkEx");
  ASSERT_EQ(got.size(), reference.events.size());
  EXPECT_EQ(marks.marks(), reference.events.size());
  // It reads neither seq nor time_ns, and says so: alone, it costs no counter and no clock.
  EXPECT_FALSE(marks.wants_sequence());
  EXPECT_FALSE(marks.wants_time());
  for (std::size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i);
    const auto& e = reference.events[i];
    const std::size_t bytes = e.rounded != 0 ? e.rounded : e.requested;
    const std::string prefix = std::string(poolscope::hooks::to_string(e.kind)) + "/" +
                               std::string(poolscope::hooks::to_string(e.phase)) + " " +
                               std::to_string(bytes) + " B best_fit/host";
    EXPECT_EQ(got[i]["message"].get<std::string>().rfind(prefix, 0), 0U) << got[i]["message"];
    EXPECT_EQ(got[i]["payload"].get<std::uint64_t>(), bytes);
    EXPECT_EQ(got[i]["payload_type"].get<int>(), 1);  // NVTX_PAYLOAD_TYPE_UNSIGNED_INT64
    EXPECT_EQ(got[i]["category"].get<int>(), 1);      // pool
  }
}

TEST_F(nvtx_injection, nvtx_mark_and_global_allocator_marks) {
  poolscope::profiler::nvtx_mark("checkpoint", category::darray_transfer, 42);
  poolscope::pool::host_resource host;
  poolscope::pool::naive_allocator pool{host};
  poolscope::profiler::set_nvtx_allocator_marks(true);
  poolscope::profiler::set_nvtx_allocator_marks(true);  // idempotent: one hook
  void* p = pool.allocate({}, 64);
  poolscope::profiler::set_nvtx_allocator_marks(false);
  pool.deallocate({}, p, 64);  // no longer marked
  const auto got = only(recorded(), "DomainMarkEx");
  ASSERT_EQ(got.size(), 3U);  // the checkpoint, device_alloc/post, pool_malloc/post
  EXPECT_EQ(got[0]["message"], "checkpoint");
  EXPECT_EQ(got[0]["payload"].get<int>(), 42);
  EXPECT_EQ(got[0]["category"].get<int>(), 2);
  EXPECT_EQ(got[1]["message"].get<std::string>().rfind("device_alloc/post 64 B", 0), 0U);
  EXPECT_EQ(got[2]["message"].get<std::string>().rfind("pool_malloc/post 64 B", 0), 0U);
}

// A message longer than 255 bytes was cut at byte 255 wherever that fell: inside a UTF-8
// character, leaving a lead byte without its tail (invalid UTF-8 in the tool's trace). It is now
// cut before the whole character.
TEST_F(nvtx_injection, nvtx_mark_cuts_long_messages_between_characters) {
  const std::string a254(254, 'a');
  const std::string a253(253, 'a');
  // 254 + "é" (2 bytes) straddles byte 255; 253 + "€" (3 bytes) too; 255 ASCII bytes fit whole.
  poolscope::profiler::nvtx_mark(a254 + "\xc3\xa9tail");
  poolscope::profiler::nvtx_mark(a253 + "\xe2\x82\xactail");
  poolscope::profiler::nvtx_mark(a253 + "\xc3\xa9tail");  // "é" ends at byte 255: kept
  poolscope::profiler::nvtx_mark(std::string(300, 'b'));
  const auto got = only(recorded(), "DomainMarkEx");
  ASSERT_EQ(got.size(), 4U);
  EXPECT_EQ(got[0]["message"].get<std::string>(), a254);
  EXPECT_EQ(got[1]["message"].get<std::string>(), a253);
  EXPECT_EQ(got[2]["message"].get<std::string>(), a253 + "\xc3\xa9");
  EXPECT_EQ(got[3]["message"].get<std::string>(), std::string(255, 'b'));
}

TEST_F(nvtx_injection, memory_hook_best_fit_heaps_and_regions) {
  poolscope::pool::host_resource host;
  poolscope::profiler::nvtx_memory_hook heaps;
  std::vector<json> got;
  void* a = nullptr;
  {
    poolscope::hooks::scoped_hook on{heaps, poolscope::hooks::scope::thread};
    poolscope::pool::best_fit_allocator pool{host};
    a = pool.allocate({}, 1000);       // heap [a, a+1024), region [a, a+1000)
    pool.deallocate({}, a, 1000);      // region gone, heap kept (cached)
    void* b = pool.allocate({}, 700);  // the cached block again: a region of 700 in the same heap
    EXPECT_EQ(b, a);
    pool.deallocate({}, b, 700);
    EXPECT_EQ(pool.release_cached(), 1024U);  // heap gone
  }
  // NVTX attaches the memory module on its first call (InitializeInjectionNvtxExtension).
  ASSERT_NE(inj_->initialized() & 2, 0) << "the NVTX memory module did not attach";
  got = recorded();
  const auto heap_regs = only(got, "MemHeapRegister");
  const auto heap_unregs = only(got, "MemHeapUnregister");
  const auto regs = only(got, "MemRegionsRegister");
  const auto unregs = only(got, "MemRegionsUnregister");
  ASSERT_EQ(heap_regs.size(), 1U);
  EXPECT_EQ(heap_regs[0]["ptr"].get<std::uint64_t>(), addr(a));
  EXPECT_EQ(heap_regs[0]["size"].get<std::uint64_t>(), 1024U);
  EXPECT_EQ(heap_regs[0]["usage"].get<int>(), 1);  // NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR
  EXPECT_EQ(heap_regs[0]["type"].get<int>(), 1);   // NVTX_MEM_TYPE_VIRTUAL_ADDRESS
  const auto heap_handle = heap_regs[0]["handle"].get<std::uint64_t>();
  ASSERT_EQ(regs.size(), 2U);
  EXPECT_EQ(regs[0]["ptr"].get<std::uint64_t>(), addr(a));
  EXPECT_EQ(regs[0]["size"].get<std::uint64_t>(), 1000U);
  EXPECT_EQ(regs[0]["heap"].get<std::uint64_t>(), heap_handle);
  EXPECT_EQ(regs[1]["size"].get<std::uint64_t>(), 700U);
  EXPECT_EQ(regs[1]["heap"].get<std::uint64_t>(), heap_handle);
  ASSERT_EQ(unregs.size(), 2U);
  EXPECT_EQ(unregs[0]["ptr"].get<std::uint64_t>(), addr(a));
  EXPECT_EQ(unregs[0]["ref_type"].get<int>(), 1);  // NVTX_MEM_REGION_REF_TYPE_POINTER
  ASSERT_EQ(heap_unregs.size(), 1U);
  EXPECT_EQ(heap_unregs[0]["heap"].get<std::uint64_t>(), heap_handle);
  // Order: heap, region, unregister, region, unregister, heap unregister.
  std::vector<std::string> order;
  for (const auto& l : got) {
    const auto c = l["call"].get<std::string>();
    if (c.rfind("Mem", 0) == 0) {
      order.push_back(c);
    }
  }
  const std::vector<std::string> want = {"MemHeapRegister",      "MemRegionsRegister",
                                         "MemRegionsUnregister", "MemRegionsRegister",
                                         "MemRegionsUnregister", "MemHeapUnregister"};
  EXPECT_EQ(order, want);
  const auto c = heaps.snapshot();
  EXPECT_EQ(c.heaps_registered, 1U);
  EXPECT_EQ(c.heaps_unregistered, 1U);
  EXPECT_EQ(c.regions_registered, 2U);
  EXPECT_EQ(c.regions_unregistered, 2U);
  EXPECT_EQ(c.regions_without_heap, 0U);
}

TEST_F(nvtx_injection, memory_hook_naive_region_is_the_heap) {
  poolscope::pool::host_resource host;
  poolscope::profiler::nvtx_memory_hook heaps;
  void* p = nullptr;
  {
    poolscope::hooks::scoped_hook on{heaps, poolscope::hooks::scope::thread};
    poolscope::pool::naive_allocator pool{host};
    p = pool.allocate({}, 777);
    pool.deallocate({}, p, 777);
  }
  const auto got = recorded();
  const auto heap_regs = only(got, "MemHeapRegister");
  const auto regs = only(got, "MemRegionsRegister");
  ASSERT_EQ(heap_regs.size(), 1U);
  ASSERT_EQ(regs.size(), 1U);
  EXPECT_EQ(heap_regs[0]["ptr"], regs[0]["ptr"]);
  EXPECT_EQ(heap_regs[0]["size"].get<std::uint64_t>(), 777U);
  EXPECT_EQ(regs[0]["size"].get<std::uint64_t>(), 777U);
  EXPECT_EQ(only(got, "MemRegionsUnregister").size(), 1U);
  EXPECT_EQ(only(got, "MemHeapUnregister").size(), 1U);
  EXPECT_EQ(heaps.live_heaps(), 0U);
  EXPECT_EQ(heaps.live_regions(), 0U);
}

TEST_F(nvtx_injection, memory_hook_skips_blocks_of_unknown_segments) {
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator pool{host};
  void* early = pool.allocate({}, 512);  // its segment predates the hook
  pool.deallocate({}, early, 512);
  poolscope::profiler::nvtx_memory_hook heaps;
  {
    poolscope::hooks::scoped_hook on{heaps, poolscope::hooks::scope::thread};
    void* again = pool.allocate({}, 512);  // the cached block: no heap known for it
    pool.deallocate({}, again, 512);
  }
  EXPECT_EQ(heaps.snapshot().regions_without_heap, 1U);
  EXPECT_TRUE(only(recorded(), "MemRegionsRegister").empty());
  EXPECT_TRUE(only(recorded(), "MemRegionsUnregister").empty());
}

// Out of host memory for the hook's own map while a segment is described: the segment stays
// undescribed, and nothing is left registered with the tool that the hook no longer knows of (it
// could never unregister it). Then the same segment is described and undescribed normally.
TEST_F(nvtx_injection, memory_hook_out_of_host_memory_leaves_nothing_registered) {
  if (!poolscope::testing::failing_new_available) {
    GTEST_SKIP() << "needs the test's failing operator new, left out under a sanitizer";
  }
  poolscope::profiler::nvtx_memory_hook heaps;
  alignas(512) static char segment[4096];
  poolscope::hooks::event alloc;
  alloc.kind = poolscope::hooks::event_kind::device_alloc;
  alloc.phase = poolscope::hooks::event_phase::post;
  alloc.ptr = segment;
  alloc.requested = alloc.rounded = sizeof segment;
  poolscope::testing::fail_nth_new(1);  // the hook's first allocation fails
  heaps.on_event(alloc);
  const int left = poolscope::testing::cancel_failing_new();
  EXPECT_EQ(left, 0) << "the hook allocated nothing";
  EXPECT_EQ(heaps.live_heaps(), 0U);
  EXPECT_EQ(heaps.snapshot().heaps_registered, 0U);
  EXPECT_TRUE(only(recorded(), "MemHeapRegister").empty());

  heaps.on_event(alloc);
  EXPECT_EQ(heaps.live_heaps(), 1U);
  poolscope::hooks::event release = alloc;
  release.kind = poolscope::hooks::event_kind::device_free;
  release.phase = poolscope::hooks::event_phase::pre;
  heaps.on_event(release);
  EXPECT_EQ(heaps.live_heaps(), 0U);
  const auto got = recorded();
  ASSERT_EQ(only(got, "MemHeapRegister").size(), 1U);
  ASSERT_EQ(only(got, "MemHeapUnregister").size(), 1U);
  EXPECT_EQ(only(got, "MemHeapRegister")[0]["ptr"].get<std::uint64_t>(),
            reinterpret_cast<std::uintptr_t>(segment));
}

// Every host allocator, random traffic: replaying the tool's log in a model of heaps and regions
// must find each region inside a live heap of its handle, each unregistration matching a live
// region, no heap dropped while it holds regions, nothing left at the end, and as many
// registrations as the allocator made allocations and upstream calls.
template <typename Fixture>
class nvtx_memory_model : public nvtx_injection {};
TYPED_TEST_SUITE(nvtx_memory_model, poolscope::pool::testing::host_allocators);

TYPED_TEST(nvtx_memory_model, random_traffic_replays_consistently) {
  const auto seed = static_cast<std::uint32_t>(std::random_device{}());
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::printf("nvtx_memory_model seed %u\n", seed);
  std::mt19937 rng(seed);
  auto res = TypeParam::make_resource();
  poolscope::profiler::nvtx_memory_hook heaps;
  std::uint64_t allocations = 0;
  std::uint64_t upstream = 0;
  {
    poolscope::hooks::scoped_hook on{heaps, poolscope::hooks::scope::thread};
    auto pool = TypeParam::make(*res);
    std::vector<std::pair<void*, std::size_t>> live;
    std::uniform_int_distribution<std::size_t> size(1, 64 * 1024);
    for (int i = 0; i < 400; ++i) {
      if (live.empty() || rng() % 3 != 0) {
        const std::size_t n = size(rng);
        live.emplace_back(pool->allocate({}, n), n);
      } else {
        const std::size_t k = rng() % live.size();
        pool->deallocate({}, live[k].first, live[k].second);
        live[k] = live.back();
        live.pop_back();
      }
      if (i % 97 == 0) {
        (void)pool->release_cached();
      }
    }
    for (auto& [p, n] : live) {
      pool->deallocate({}, p, n);
    }
    allocations = pool->stats().allocations;
    upstream = pool->stats().upstream_allocs;
  }  // the allocator is gone: every segment went back upstream
  struct heap {
    std::uint64_t end;
    std::uint64_t handle;
    int regions = 0;
  };
  std::map<std::uint64_t, heap> live_heaps;             // start -> heap
  std::map<std::uint64_t, std::uint64_t> live_regions;  // region start -> heap start
  std::uint64_t heap_regs = 0;
  std::uint64_t region_regs = 0;
  const std::vector<json> log = this->recorded();
  for (const json& l : log) {
    const auto call = l["call"].get<std::string>();
    if (call == "MemHeapRegister") {
      const auto start = l["ptr"].get<std::uint64_t>();
      const auto end = start + l["size"].get<std::uint64_t>();
      // No overlap with a live heap.
      auto next = live_heaps.lower_bound(start);
      ASSERT_TRUE(next == live_heaps.end() || next->first >= end);
      ASSERT_TRUE(next == live_heaps.begin() || std::prev(next)->second.end <= start);
      live_heaps[start] = heap{end, l["handle"].get<std::uint64_t>()};
      ++heap_regs;
    } else if (call == "MemRegionsRegister") {
      const auto start = l["ptr"].get<std::uint64_t>();
      const auto end = start + l["size"].get<std::uint64_t>();
      auto h = live_heaps.upper_bound(start);
      ASSERT_NE(h, live_heaps.begin()) << "region outside any heap";
      --h;
      ASSERT_LE(end, h->second.end) << "region past its heap";
      ASSERT_EQ(l["heap"].get<std::uint64_t>(), h->second.handle);
      ASSERT_TRUE(live_regions.emplace(start, h->first).second) << "region registered twice";
      ++h->second.regions;
      ++region_regs;
    } else if (call == "MemRegionsUnregister") {
      auto r = live_regions.find(l["ptr"].get<std::uint64_t>());
      ASSERT_NE(r, live_regions.end()) << "unregistering an unknown region";
      --live_heaps.at(r->second).regions;
      live_regions.erase(r);
    } else if (call == "MemHeapUnregister") {
      const auto handle = l["heap"].get<std::uint64_t>();
      auto h = std::find_if(live_heaps.begin(), live_heaps.end(),
                            [&](const auto& kv) { return kv.second.handle == handle; });
      ASSERT_NE(h, live_heaps.end()) << "unregistering an unknown heap";
      ASSERT_EQ(h->second.regions, 0) << "heap dropped while holding regions";
      live_heaps.erase(h);
    }
  }
  EXPECT_TRUE(live_heaps.empty());
  EXPECT_TRUE(live_regions.empty());
  EXPECT_EQ(region_regs, allocations);
  EXPECT_EQ(heap_regs, upstream);
  EXPECT_EQ(heaps.snapshot().regions_without_heap, 0U);
  EXPECT_EQ(this->inj_->dropped(), 0U);
}

}  // namespace
