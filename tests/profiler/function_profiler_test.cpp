// function_profiler: nesting, recursion, memory attribution, sessions, JSON/table output, and
// (suite function_profiler_concurrency, also run under TSan) aggregation across threads.
// CPU times are checked exactly against a synthetic clock, or as structural identities on the
// real clock; never against time thresholds.
#include "poolscope/profiler/function_profiler.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../profiler/src/detail/cuda_timing_seam.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"

namespace {

using poolscope::profiler::category;
using poolscope::profiler::function_profile;
using poolscope::profiler::function_profiler;
using poolscope::profiler::function_profiler_options;
using poolscope::profiler::scope;
using poolscope::profiler::scope_record;

std::atomic<std::uint64_t> g_fake_ns{0};
std::uint64_t fake_clock() noexcept {
  return g_fake_ns.load(std::memory_order_relaxed);
}

function_profiler_options synthetic() {
  function_profiler_options o;
  o.clock = &fake_clock;
  o.gpu_timing = false;
  return o;
}

const scope_record& get(const function_profile& p, std::string_view name) {
  const scope_record* r = p.find(name);
  if (r == nullptr) {
    throw std::runtime_error("no record for " + std::string(name));
  }
  return *r;
}

std::uint64_t calls_of(const function_profile& p, std::string_view name) {
  const scope_record* r = p.find(name);
  return r != nullptr ? r->calls : 0;
}

TEST(function_profiler, nesting_inclusive_and_self_are_exact) {
  g_fake_ns = 0;
  function_profiler prof{synthetic()};
  {
    POOLSCOPE_SCOPE("fp.nest.a");  // opens at 0
    g_fake_ns = 10;
    {
      POOLSCOPE_SCOPE("fp.nest.b");  // 10..30
      g_fake_ns = 30;
    }
    g_fake_ns = 35;
    {
      POOLSCOPE_SCOPE("fp.nest.c");  // 35..60
      g_fake_ns = 45;
      {
        POOLSCOPE_SCOPE("fp.nest.b");  // a second site with the same name: 45..50
        g_fake_ns = 50;
      }
      g_fake_ns = 60;
    }
    g_fake_ns = 100;
  }
  prof.stop();
  const auto p = prof.report();
  ASSERT_EQ(p.scopes.size(), 3U);
  const auto& a = get(p, "fp.nest.a");
  const auto& b = get(p, "fp.nest.b");
  const auto& c = get(p, "fp.nest.c");
  EXPECT_EQ(a.calls, 1U);
  EXPECT_EQ(a.cpu_total_ns, 100U);
  EXPECT_EQ(a.cpu_self_ns, 100U - 20U - 25U);
  EXPECT_EQ(b.calls, 2U);
  EXPECT_EQ(b.cpu_total_ns, 25U);
  EXPECT_EQ(b.cpu_self_ns, 25U);
  EXPECT_EQ(c.calls, 1U);
  EXPECT_EQ(c.cpu_total_ns, 25U);
  EXPECT_EQ(c.cpu_self_ns, 20U);
  EXPECT_EQ(c.cat, category::user);
  // Sorted by inclusive time, ties by name.
  EXPECT_EQ(p.scopes[0].name, "fp.nest.a");
  EXPECT_EQ(p.scopes[1].name, "fp.nest.b");
  EXPECT_EQ(p.scopes[2].name, "fp.nest.c");
  EXPECT_FALSE(p.gpu_timing);
  EXPECT_FALSE(a.gpu_total_ns.has_value());
}

void recurse(int n) {
  POOLSCOPE_SCOPE("fp.rec");
  g_fake_ns += 10;
  if (n > 0) {
    recurse(n - 1);
  }
  g_fake_ns += 10;
}

TEST(function_profiler, recursion_counts_inclusive_once) {
  g_fake_ns = 1000;
  function_profiler prof{synthetic()};
  recurse(3);  // four levels of 20 ns each
  recurse(0);  // one more level
  prof.stop();
  const auto p = prof.report();
  const auto& r = get(p, "fp.rec");
  EXPECT_EQ(r.calls, 5U);
  EXPECT_EQ(r.cpu_total_ns, 80U + 20U);  // the outermost spans only
  EXPECT_EQ(r.cpu_self_ns, 100U);        // every level's own 20 ns
}

TEST(function_profiler, mutual_recursion_and_self_sum) {
  g_fake_ns = 0;
  function_profiler prof{synthetic()};
  {
    POOLSCOPE_SCOPE("fp.mut.x");  // 0..70
    g_fake_ns = 5;
    {
      POOLSCOPE_SCOPE("fp.mut.y");  // 5..60
      g_fake_ns = 15;
      {
        POOLSCOPE_SCOPE("fp.mut.x");  // 15..40, nested in itself through y
        g_fake_ns = 40;
      }
      g_fake_ns = 60;
    }
    g_fake_ns = 70;
  }
  prof.stop();
  const auto p = prof.report();
  const auto& x = get(p, "fp.mut.x");
  const auto& y = get(p, "fp.mut.y");
  EXPECT_EQ(x.calls, 2U);
  EXPECT_EQ(x.cpu_total_ns, 70U);
  EXPECT_EQ(x.cpu_self_ns, (70U - 55U) + 25U);
  EXPECT_EQ(y.cpu_total_ns, 55U);
  EXPECT_EQ(y.cpu_self_ns, 55U - 25U);
  // Self times partition the time spent in outermost scopes.
  std::uint64_t self = 0;
  for (const auto& s : p.scopes) {
    self += s.cpu_self_ns;
  }
  EXPECT_EQ(self, 70U);
}

TEST(function_profiler, runtime_names_and_categories) {
  g_fake_ns = 0;
  function_profiler prof{synthetic()};
  for (int i = 0; i < 3; ++i) {
    scope s{std::string("fp.dyn.") + std::to_string(i % 2), category::darray_compute};
    g_fake_ns += 7;
  }
  { POOLSCOPE_SCOPE_IN(category::pool, "fp.dyn.pool"); }
  prof.stop();
  const auto p = prof.report();
  EXPECT_EQ(get(p, "fp.dyn.0").calls, 2U);
  EXPECT_EQ(get(p, "fp.dyn.0").cpu_total_ns, 14U);
  EXPECT_EQ(get(p, "fp.dyn.1").calls, 1U);
  EXPECT_EQ(get(p, "fp.dyn.0").cat, category::darray_compute);
  EXPECT_EQ(get(p, "fp.dyn.pool").cat, category::pool);
}

TEST(function_profiler, inactive_scopes_and_sessions) {
  g_fake_ns = 0;
  {
    POOLSCOPE_SCOPE("fp.sess.before");  // no profiler: not recorded anywhere
  }
  function_profiler prof{synthetic()};
  EXPECT_TRUE(prof.active());
  EXPECT_THROW(function_profiler{synthetic()}, poolscope::logic_error);
  EXPECT_THROW(prof.start(), poolscope::logic_error);
  {
    POOLSCOPE_SCOPE("fp.sess.during");
    g_fake_ns += 3;
  }
  prof.stop();
  EXPECT_FALSE(prof.active());
  { POOLSCOPE_SCOPE("fp.sess.after"); }
  auto p = prof.report();
  EXPECT_EQ(p.find("fp.sess.before"), nullptr);
  EXPECT_EQ(p.find("fp.sess.after"), nullptr);
  EXPECT_EQ(get(p, "fp.sess.during").calls, 1U);
  EXPECT_EQ(prof.report(), p);  // stable after stop

  // A scope open across stop() is dropped, not half-counted.
  prof.start();
  {
    POOLSCOPE_SCOPE("fp.sess.straddle");
    prof.stop();
  }
  EXPECT_EQ(prof.report().find("fp.sess.straddle"), nullptr);
  EXPECT_EQ(prof.report().find("fp.sess.during"), nullptr);  // start() cleared the old results

  // Another profiler may start once this one stopped; it sees only its own session.
  function_profiler other{synthetic()};
  { POOLSCOPE_SCOPE("fp.sess.other"); }
  other.stop();
  EXPECT_NE(other.report().find("fp.sess.other"), nullptr);
  EXPECT_EQ(prof.report().find("fp.sess.other"), nullptr);
}

// Scopes open across reset(), stop() or start() are not counted, but what is nested in them and
// ran inside a session is, whole: the outermost *counted* scope of a name carries its inclusive
// time and bytes (a scope of the same name around it from before does not hide them).
TEST(function_profiler, scopes_nested_in_uncounted_ones_of_their_name) {
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator pool{host};
  g_fake_ns = 0;
  function_profiler prof{synthetic()};
  {
    POOLSCOPE_SCOPE("fp.across.f");  // open across reset(): not counted
    g_fake_ns = 10;
    prof.reset();
    {
      POOLSCOPE_SCOPE("fp.across.f");  // 10..30
      void* p = pool.allocate({}, 1000);
      pool.deallocate({}, p, 1000);
      g_fake_ns = 30;
    }
    g_fake_ns = 40;
  }
  {
    POOLSCOPE_SCOPE("fp.across.g");  // closes after stop(): not counted
    {
      POOLSCOPE_SCOPE("fp.across.g");  // 40..45
      g_fake_ns = 45;
    }
    prof.stop();
  }
  auto p = prof.report();
  const auto& f = get(p, "fp.across.f");
  EXPECT_EQ(f.calls, 1U);
  EXPECT_EQ(f.cpu_total_ns, 20U);
  EXPECT_EQ(f.cpu_self_ns, 20U);
  EXPECT_EQ(f.used_bytes, 1024U);
  EXPECT_EQ(f.self_used_bytes, 1024U);
  const auto& g = get(p, "fp.across.g");
  EXPECT_EQ(g.calls, 1U);
  EXPECT_EQ(g.cpu_total_ns, 5U);
  EXPECT_EQ(g.cpu_self_ns, 5U);

  // Open in one session, closed in the next.
  prof.start();
  {
    POOLSCOPE_SCOPE("fp.across.h");
    prof.stop();
    prof.start();
    {
      POOLSCOPE_SCOPE("fp.across.h");  // 45..52
      g_fake_ns = 52;
    }
  }
  prof.stop();
  p = prof.report();
  ASSERT_EQ(p.scopes.size(), 1U);
  EXPECT_EQ(p.scopes[0].name, "fp.across.h");
  EXPECT_EQ(p.scopes[0].calls, 1U);
  EXPECT_EQ(p.scopes[0].cpu_total_ns, 7U);
  EXPECT_EQ(p.scopes[0].cpu_self_ns, 7U);
}

TEST(function_profiler, reset_clears_results) {
  function_profiler prof{synthetic()};
  { POOLSCOPE_SCOPE("fp.reset.a"); }
  EXPECT_NE(prof.report().find("fp.reset.a"), nullptr);
  prof.reset();
  EXPECT_TRUE(prof.report().scopes.empty());
  { POOLSCOPE_SCOPE("fp.reset.b"); }
  prof.stop();
  const auto p = prof.report();
  ASSERT_EQ(p.scopes.size(), 1U);
  EXPECT_EQ(p.scopes[0].name, "fp.reset.b");
}

TEST(function_profiler, memory_attributed_to_innermost_scope_inclusive_to_ancestors) {
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator pool{host};  // rounds to 512 B, reuses exact sizes
  function_profiler prof{synthetic()};
  void* outside = pool.allocate({}, 100);  // no scope open: attributed to nothing
  {
    POOLSCOPE_SCOPE("fp.mem.outer");
    void* a = pool.allocate({}, 1000);  // used 1024, acquired 1024
    {
      POOLSCOPE_SCOPE("fp.mem.inner");
      void* b = pool.allocate({}, 1000);  // a is live: a new block, used 1024 acquired 1024
      pool.deallocate({}, b, 1000);       // cached
      void* c = pool.allocate({}, 2000);  // used 2048, acquired 2048
      pool.deallocate({}, c, 2000);
    }
    void* d = pool.allocate({}, 900);  // rounds to 1024: the block b was, cached: acquired 0
    pool.deallocate({}, d, 900);
    pool.deallocate({}, a, 1000);
  }
  pool.deallocate({}, outside, 100);
  prof.stop();
  const auto p = prof.report();
  const auto& outer = get(p, "fp.mem.outer");
  const auto& inner = get(p, "fp.mem.inner");
  EXPECT_EQ(inner.used_bytes, 1024U + 2048U);
  EXPECT_EQ(inner.self_used_bytes, 1024U + 2048U);
  EXPECT_EQ(inner.acquired_bytes, 1024U + 2048U);
  EXPECT_EQ(outer.used_bytes, 1024U + 3072U + 1024U);
  EXPECT_EQ(outer.self_used_bytes, 2048U);
  EXPECT_EQ(outer.acquired_bytes, 1024U + 3072U);
  EXPECT_EQ(outer.self_acquired_bytes, 1024U);
}

TEST(function_profiler, memory_off_attributes_nothing) {
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator pool{host};
  auto o = synthetic();
  o.memory = false;
  function_profiler prof{o};
  {
    POOLSCOPE_SCOPE("fp.nomem");
    void* a = pool.allocate({}, 1000);
    pool.deallocate({}, a, 1000);
  }
  prof.stop();
  EXPECT_EQ(get(prof.report(), "fp.nomem").used_bytes, 0U);
}

function_profile sample_profile() {
  function_profile p;
  p.gpu_timing = true;
  p.gpu_pending = 2;
  p.gpu_dropped = 1;
  scope_record a;
  a.name = "step \"quoted\"";
  a.cat = category::darray_transfer;
  a.calls = 3;
  a.cpu_total_ns = 3'000'000'000ULL;
  a.cpu_self_ns = 12345;
  a.gpu_total_ns = 2'999'999'999ULL;
  a.gpu_samples = 3;
  a.used_bytes = std::uint64_t{5} << 40;
  a.self_used_bytes = 7;
  a.acquired_bytes = 1 << 20;
  a.self_acquired_bytes = 0;
  scope_record b;
  b.name = "inner";
  b.cat = category::pool;
  b.calls = 1;
  p.scopes = {a, b};
  return p;
}

TEST(function_profiler, json_round_trip) {
  const function_profile p = sample_profile();
  const std::string text = p.to_json();
  EXPECT_EQ(function_profile::from_json(text), p);
  // The writer's output read independently.
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j.at("scopes").size(), 2U);
  EXPECT_EQ(j["scopes"][0]["name"], "step \"quoted\"");
  EXPECT_EQ(j["scopes"][0]["category"], "darray.transfer");
  EXPECT_EQ(j["scopes"][0]["gpu_total_ns"].get<std::uint64_t>(), 2'999'999'999ULL);
  EXPECT_TRUE(j["scopes"][1]["gpu_total_ns"].is_null());
  EXPECT_DOUBLE_EQ(j["scopes"][0]["cpu_avg_ns"].get<double>(), 1e9);

  // A measured profile round-trips too.
  g_fake_ns = 0;
  function_profiler prof{synthetic()};
  {
    POOLSCOPE_SCOPE("fp.json.a");
    g_fake_ns = 9;
  }
  prof.stop();
  const auto measured = prof.report();
  EXPECT_EQ(function_profile::from_json(measured.to_json()), measured);

  EXPECT_THROW((void)function_profile::from_json("{"), poolscope::invalid_argument);
  EXPECT_THROW((void)function_profile::from_json(R"({"gpu_timing":true})"),
               poolscope::invalid_argument);
  EXPECT_THROW(
      (void)function_profile::from_json(
          R"({"gpu_timing":false,"gpu_pending":0,"gpu_dropped":0,"scopes":[{"name":"x",)"
          R"("category":"nope","calls":1,"cpu_total_ns":0,"cpu_self_ns":0,"gpu_total_ns":null,)"
          R"("gpu_samples":0,"used_bytes":0,"self_used_bytes":0,"acquired_bytes":0,)"
          R"("self_acquired_bytes":0}]})"),
      poolscope::invalid_argument);
}

TEST(function_profiler, table_has_a_row_per_scope_and_a_summary) {
  const std::string table = sample_profile().to_table();
  std::istringstream in(table);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) {
    rows.push_back(line);
  }
  ASSERT_EQ(rows.size(), 4U);  // header, two scopes, summary
  for (const char* col :
       {"name", "calls", "cpu total", "cpu self", "gpu total", "cpu avg", "used", "acquired"}) {
    EXPECT_NE(rows[0].find(col), std::string::npos) << col;
  }
  EXPECT_EQ(rows[1].rfind("step \"quoted\"", 0), 0U);
  EXPECT_NE(rows[1].find("3.00 s"), std::string::npos);    // cpu total
  EXPECT_NE(rows[1].find("1.00 s"), std::string::npos);    // average
  EXPECT_NE(rows[1].find("5.00 TiB"), std::string::npos);  // used
  EXPECT_NE(rows[1].find("1.00 MiB"), std::string::npos);  // acquired
  EXPECT_EQ(rows[2].rfind("inner", 0), 0U);
  EXPECT_NE(rows[2].find(" - "), std::string::npos);  // no GPU time
  EXPECT_EQ(rows[3].rfind("total: 2 scopes, 4 calls", 0), 0U);
  EXPECT_NE(rows[3].find("incomplete"), std::string::npos);
}

TEST(function_profiler, table_rows_stay_whole_with_long_names) {
  // A demangled template's __PRETTY_FUNCTION__ runs to hundreds of characters; such a name once
  // cut every row at 511 bytes, end of line included, so the rows ran into each other.
  function_profile p = sample_profile();
  const std::string long_name = "void run<" + std::string(600, 'T') + ">(stream)";
  p.scopes[0].name = long_name;
  std::istringstream in(p.to_table());
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) {
    rows.push_back(line);
  }
  ASSERT_EQ(rows.size(), 4U) << p.to_table();  // header, two scopes, summary
  // Every column after the name starts at the same offset: the name column is as wide as the
  // longest name plus one space, in the header and in each row.
  const std::size_t width = long_name.size();
  EXPECT_EQ(rows[0].rfind("name" + std::string(width - 4, ' ') + " ", 0), 0U);
  EXPECT_EQ(rows[1].rfind(long_name + " ", 0), 0U);
  EXPECT_EQ(rows[2].rfind("inner" + std::string(width - 5, ' ') + " ", 0), 0U);
  // The long row is whole: calls, then the six columns, the last one (acquired) at its end.
  std::istringstream cells(rows[1].substr(width));
  std::string calls;
  cells >> calls;
  EXPECT_EQ(calls, "3");
  EXPECT_EQ(rows[1].substr(rows[1].size() - 8), "1.00 MiB");  // acquired: 1 << 20
  EXPECT_NE(rows[1].find(" 5.00 TiB "), std::string::npos);   // used
  EXPECT_EQ(rows[0].substr(rows[0].size() - 8), "acquired");
  EXPECT_EQ(rows[2].substr(rows[2].size() - 4), " 0 B");
  EXPECT_EQ(rows[3].rfind("total: 2 scopes, 4 calls", 0), 0U);
}

TEST(function_profiler, table_rows_stay_whole_with_control_characters_in_names) {
  // A name with a newline (a scope named from data, or a loaded profile) split its row in two:
  // the columns went to a line of their own and the table had one row too many.
  function_profile p = sample_profile();
  p.scopes[0].name = "load\nfile\t\x01\\x";
  const std::string shown = R"(load\nfile\t\x01\\x)";  // written by hand: the reference
  std::istringstream in(p.to_table());
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) {
    rows.push_back(line);
  }
  ASSERT_EQ(rows.size(), 4U) << p.to_table();  // header, two scopes, summary
  EXPECT_EQ(rows[1].rfind(shown + " ", 0), 0U) << rows[1];
  std::istringstream cells(rows[1].substr(shown.size()));
  std::string calls;
  cells >> calls;
  EXPECT_EQ(calls, "3");
  // The column is as wide as the name as shown.
  EXPECT_EQ(rows[0].rfind("name" + std::string(shown.size() - 4, ' ') + " ", 0), 0U) << rows[0];
  EXPECT_EQ(rows[2].rfind("inner" + std::string(shown.size() - 5, ' ') + " ", 0), 0U) << rows[2];
}

TEST(function_profiler, from_json_refuses_negative_and_fractional_figures) {
  // nlohmann's get<std::uint64_t>() turns -1 into 2^64-1 and 2.5 into 2 without a word: a
  // hand-edited or foreign profile must be refused instead, naming the field and its value.
  const auto with = [](const std::string& field, const std::string& value) {
    auto j = nlohmann::json::parse(sample_profile().to_json());
    j["scopes"][0][field] = nlohmann::json::parse(value);
    return j.dump();
  };
  const auto message = [](const std::string& text) {
    try {
      (void)function_profile::from_json(text);
    } catch (const poolscope::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  std::string m = message(with("calls", "-1"));
  EXPECT_NE(m.find("scopes[0]"), std::string::npos) << m;
  EXPECT_NE(m.find("'calls'"), std::string::npos) << m;
  EXPECT_NE(m.find("-1"), std::string::npos) << m;
  m = message(with("cpu_total_ns", "2.5"));
  EXPECT_NE(m.find("'cpu_total_ns'"), std::string::npos) << m;
  EXPECT_NE(m.find("2.5"), std::string::npos) << m;
  m = message(with("gpu_total_ns", "-7"));
  EXPECT_NE(m.find("'gpu_total_ns'"), std::string::npos) << m;
  m = message(with("used_bytes", "\"12\""));
  EXPECT_NE(m.find("'used_bytes'"), std::string::npos) << m;
  m = message(with("name", "12"));
  EXPECT_NE(m.find("'name'"), std::string::npos) << m;
  auto top = nlohmann::json::parse(sample_profile().to_json());
  top["gpu_dropped"] = -3;
  m = message(top.dump());
  EXPECT_NE(m.find("'gpu_dropped'"), std::string::npos) << m;
  top = nlohmann::json::parse(sample_profile().to_json());
  top["scopes"] = nlohmann::json::object();
  m = message(top.dump());
  EXPECT_NE(m.find("'scopes'"), std::string::npos) << m;
  EXPECT_EQ(message("[1, 2]").rfind("poolscope: not a function profile JSON", 0), 0U);
  // The largest figures still load: 2^64-1 is an unsigned integer, not a negative one.
  auto big = nlohmann::json::parse(sample_profile().to_json());
  big["scopes"][0]["used_bytes"] = ~std::uint64_t{0};
  EXPECT_EQ(function_profile::from_json(big.dump()).scopes[0].used_bytes, ~std::uint64_t{0});
}

// ---- GPU timing (skipped without a GPU) ------------------------------------------------------

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(function_profiler_gpu, event_pairs_resolve_lazily) {
  if (!have_gpu()) {
    GTEST_SKIP() << "no CUDA device: GPU timing is absent by design (checked elsewhere)";
  }
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  void* buf = nullptr;
  const std::size_t bytes = std::size_t{64} << 20;
  ASSERT_EQ(cudaMalloc(&buf, bytes), cudaSuccess);
  function_profiler_options o;
  // Resolution by cudaEventQuery runs while the loop does (at 8, 16, 32, 64 pending pairs);
  // the 100 pairs stay under the drop limit (16 * 8) however far the GPU lags.
  o.gpu_pending_limit = 8;
  function_profiler prof{o};
  constexpr int steps = 50;
  for (int i = 0; i < steps; ++i) {
    POOLSCOPE_SCOPE("fp.gpu.outer", s);
    ASSERT_EQ(cudaMemsetAsync(buf, i, bytes, s), cudaSuccess);
    {
      POOLSCOPE_SCOPE("fp.gpu.inner", s);
      ASSERT_EQ(cudaMemsetAsync(buf, i + 1, bytes, s), cudaSuccess);
    }
  }
  prof.stop();
  const auto p = prof.report(/*wait_for_gpu=*/true);
  EXPECT_TRUE(p.gpu_timing);
  EXPECT_EQ(p.gpu_pending, 0U);
  EXPECT_EQ(p.gpu_dropped, 0U);
  const auto& outer = get(p, "fp.gpu.outer");
  const auto& inner = get(p, "fp.gpu.inner");
  EXPECT_EQ(outer.gpu_samples, static_cast<std::uint64_t>(steps));
  EXPECT_EQ(inner.gpu_samples, static_cast<std::uint64_t>(steps));
  ASSERT_TRUE(outer.gpu_total_ns && inner.gpu_total_ns);
  // The inner span lies inside the outer one on the same stream (0.5 us event resolution).
  EXPECT_GE(*outer.gpu_total_ns + steps * 1000U, *inner.gpu_total_ns);
  EXPECT_GT(*inner.gpu_total_ns, 0U);  // 64 MiB memsets take time on any GPU
  EXPECT_EQ(cudaFree(buf), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// A short run reuses its events: pairs are first resolved at 64 pending (not only at the limit),
// so scopes whose GPU work completed give their events back to the pool for the next scopes. The
// model: each scope takes two events; with every pair complete by the next scope's close, at
// most the first scan's 65 pairs are ever out of the pool at once, so at most 130 events are
// created however many scopes run (the pool may hold events of earlier tests: fewer, never more).
// Without the early scan, 5000 scopes below the default limit would take 10000 events.
TEST(function_profiler_gpu, a_short_run_reuses_its_events) {
  if (!have_gpu()) {
    GTEST_SKIP() << "no CUDA device: GPU timing is absent by design (checked elsewhere)";
  }
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 4096), cudaSuccess);
  namespace timing = poolscope::profiler::detail::cuda_timing;
  const std::uint64_t created_before = timing::events_created();
  function_profiler prof;  // default options: the limit (1024) is above the run's length
  constexpr int steps = 5000;
  for (int i = 0; i < steps; ++i) {
    {
      POOLSCOPE_SCOPE("fp.gpu.short", s);
      ASSERT_EQ(cudaMemsetAsync(buf, i & 0xff, 4096, s), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // the pair just closed is complete
  }
  prof.stop();
  const std::uint64_t created = timing::events_created() - created_before;
  EXPECT_LE(created, 2U * 65U) << "events created for " << steps << " scopes";
  const auto p = prof.report(/*wait_for_gpu=*/true);
  EXPECT_EQ(get(p, "fp.gpu.short").gpu_samples, static_cast<std::uint64_t>(steps));
  EXPECT_EQ(p.gpu_dropped, 0U);
  EXPECT_EQ(cudaFree(buf), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// A scope timing a stream of a device that is not current (as darray enqueues on each GPU's
// streams without switching to it) takes its events from the stream's device: before, the events
// came from the current device, their record on the other device's stream failed and GPU timing
// was switched off for the session. The scope leaves the caller's device current.
TEST(function_profiler_gpu, a_stream_of_another_device_is_timed) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices (" << devices << " here)";
  }
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void* buf = nullptr;
  const std::size_t bytes = std::size_t{16} << 20;
  ASSERT_EQ(cudaMalloc(&buf, bytes), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  function_profiler prof;
  constexpr int steps = 20;
  for (int i = 0; i < steps; ++i) {
    {
      POOLSCOPE_SCOPE("fp.gpu.other_device", s);
      ASSERT_EQ(cudaMemsetAsync(buf, i, bytes, s), cudaSuccess);
    }
    {
      POOLSCOPE_SCOPE("fp.gpu.default_stream");  // the current device's default stream
    }
  }
  prof.stop();
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
  const auto p = prof.report(/*wait_for_gpu=*/true);
  EXPECT_TRUE(p.gpu_timing);
  EXPECT_EQ(p.gpu_dropped, 0U);
  const auto& other = get(p, "fp.gpu.other_device");
  EXPECT_EQ(other.gpu_samples, static_cast<std::uint64_t>(steps));
  ASSERT_TRUE(other.gpu_total_ns);
  EXPECT_GT(*other.gpu_total_ns, 0U);  // 16 MiB memsets take time on any GPU
  EXPECT_EQ(get(p, "fp.gpu.default_stream").gpu_samples, static_cast<std::uint64_t>(steps));
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(cudaFree(buf), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST(function_profiler, gpu_time_absent_without_gpu) {
  if (have_gpu()) {
    GTEST_SKIP() << "a CUDA device is present: covered by function_profiler_gpu";
  }
  function_profiler prof;  // gpu_timing asked for, no device
  { POOLSCOPE_SCOPE("fp.nogpu"); }
  prof.stop();
  const auto p = prof.report();
  EXPECT_FALSE(p.gpu_timing);
  EXPECT_FALSE(get(p, "fp.nogpu").gpu_total_ns.has_value());
}

// ---- many threads (also run under ThreadSanitizer) -------------------------------------------

TEST(function_profiler_concurrency, per_thread_stacks_merge_exactly) {
  constexpr int threads = 8;
  constexpr int iterations = 500;
  poolscope::pool::host_resource host;
  poolscope::pool::best_fit_allocator pool{host};
  function_profiler_options o;
  o.gpu_timing = false;
  function_profiler prof{o};
  std::atomic<bool> go{false};
  std::atomic<int> done{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      while (!go.load()) {
        std::this_thread::yield();
      }
      for (int i = 0; i < iterations; ++i) {
        POOLSCOPE_SCOPE("fp.mt.outer");
        {
          POOLSCOPE_SCOPE("fp.mt.inner");
          void* p = pool.allocate({}, 1000);  // 1024 used per call
          pool.deallocate({}, p, 1000);
        }
      }
      done.fetch_add(1);
    });
  }
  go = true;
  // Reports while the workers run: snapshots, never more calls than were made.
  while (done.load() < threads) {
    const auto snap = prof.report(false);
    if (const auto* r = snap.find("fp.mt.inner")) {
      EXPECT_LE(r->calls, static_cast<std::uint64_t>(threads * iterations));
    }
    std::this_thread::yield();
  }
  for (auto& w : workers) {
    w.join();  // the threads' shards are retired (merged) as they exit
  }
  prof.stop();
  const auto p = prof.report();
  const auto& outer = get(p, "fp.mt.outer");
  const auto& inner = get(p, "fp.mt.inner");
  const auto n = static_cast<std::uint64_t>(threads * iterations);
  EXPECT_EQ(outer.calls, n);
  EXPECT_EQ(inner.calls, n);
  // Structural identities on the real clock: every inner scope lies directly in an outer one.
  EXPECT_EQ(outer.cpu_self_ns, outer.cpu_total_ns - inner.cpu_total_ns);
  EXPECT_EQ(inner.cpu_self_ns, inner.cpu_total_ns);
  EXPECT_EQ(inner.used_bytes, n * 1024);
  EXPECT_EQ(inner.self_used_bytes, n * 1024);
  EXPECT_EQ(outer.used_bytes, n * 1024);
  EXPECT_EQ(outer.self_used_bytes, 0U);
  // Upstream blocks: at most one per thread at a time, all attributed to inner scopes.
  EXPECT_EQ(outer.acquired_bytes, inner.acquired_bytes);
  EXPECT_EQ(inner.acquired_bytes, pool.stats().upstream_allocs * 1024);
}

TEST(function_profiler_concurrency, start_stop_while_threads_run_scopes) {
  constexpr int threads = 4;
  constexpr int iterations = 3000;
  std::atomic<int> done{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < iterations; ++i) {
        POOLSCOPE_SCOPE("fp.mt.churn");
        POOLSCOPE_SCOPE("fp.mt.churn.inner");
      }
      done.fetch_add(1);
    });
  }
  function_profiler_options o;
  o.gpu_timing = false;
  std::uint64_t seen = 0;
  do {
    function_profiler prof{o};
    std::this_thread::yield();
    prof.stop();
    const auto p = prof.report();
    // Sessions start and stop under running scopes: whatever is counted is whole, and a counted
    // outer scope has its inner one counted too (churn_keeps_nested_scopes_whole checks more).
    if (const auto* outer = p.find("fp.mt.churn")) {
      seen += outer->calls;
      EXPECT_GE(calls_of(p, "fp.mt.churn.inner"), outer->calls);
      EXPECT_GE(outer->cpu_total_ns, outer->cpu_self_ns);
    }
    if (const auto* inner = p.find("fp.mt.churn.inner")) {
      EXPECT_EQ(inner->cpu_self_ns, inner->cpu_total_ns);
      EXPECT_LE(inner->calls, static_cast<std::uint64_t>(threads * iterations));
    }
  } while (done.load() < threads);
  for (auto& w : workers) {
    w.join();
  }
  EXPECT_LE(seen, static_cast<std::uint64_t>(threads * iterations));
}

// Start/stop churn under nested scopes on other threads. Each worker runs, in a loop,
// an outer scope holding an inner one and a scope nested in itself, on a per-thread tick clock
// (every read is the previous one plus 1), so every counted scope's times are known exactly:
// an outer scope counted with its inner one spans 3 ticks, 2 of them its own; one counted
// without its inner one (the bug) would span 1. Every report, taken while active and after
// stop, must hold the contract's invariants; after the run, each session's calls must lie
// between the scopes that certainly ran inside it and those that overlapped it.
thread_local std::uint64_t t_ticks = 0;
std::uint64_t tick_clock() noexcept {
  return ++t_ticks;
}

// The contract's invariants on one report of the churn below; returns the broken ones (empty
// when all hold).
std::string churn_violations(const function_profile& p) {
  std::string out;
  if (const auto* o = p.find("fp.churn.outer")) {
    if (o->cpu_total_ns != 3 * o->calls || o->cpu_self_ns != 2 * o->calls) {
      out += "[an outer scope was counted without its inner one]";
    }
  }
  if (const auto* i = p.find("fp.churn.inner")) {
    if (i->cpu_total_ns != i->calls || i->cpu_self_ns != i->calls) {
      out += "[inner scope times are not one tick each]";
    }
  }
  if (calls_of(p, "fp.churn.inner") < calls_of(p, "fp.churn.outer")) {
    out += "[fewer inner scopes than outer ones]";
  }
  if (const auto* r = p.find("fp.churn.rec")) {
    // A pair counted whole: 2 calls, 3 ticks inclusive, 3 self; an inner one alone (its outer
    // one open across start, stop or reset): 1 call, 1 tick, 1 self.
    if (r->cpu_total_ns != r->cpu_self_ns || r->cpu_total_ns < r->calls) {
      out += "[a scope nested in itself lost its inclusive time]";
    }
  }
  for (const auto& s : p.scopes) {
    if (s.cpu_total_ns < s.cpu_self_ns) {
      out += "[" + s.name + ": inclusive time below self time]";
    }
    if (s.used_bytes < s.self_used_bytes || s.acquired_bytes < s.self_acquired_bytes) {
      out += "[" + s.name + ": inclusive bytes below self bytes]";
    }
  }
  return out;
}

// Per session: scopes certainly inside it (opened after start() returned, closed before stop()
// was called) and scopes that overlapped it.
struct session_bounds {
  std::vector<std::uint64_t> lower;
  std::vector<std::uint64_t> upper;
  explicit session_bounds(std::size_t sessions) : lower(sessions, 0), upper(sessions, 0) {}
  // `before` and `after`: the churn generation read before the scope opened and after it
  // closed (session k runs from generation 2k, when start() is called, to 2k+2, when stop()
  // returns; 2k+1 while it is certainly active).
  void add(std::uint64_t before, std::uint64_t after) {
    if (before == after && before % 2 == 1 && before / 2 < lower.size()) {
      ++lower[before / 2];
    }
    for (std::uint64_t k = before >= 2 ? (before - 2) / 2 : 0; k <= after / 2 && k < upper.size();
         ++k) {
      if (before <= 2 * k + 2 && after >= 2 * k) {
        ++upper[k];
      }
    }
  }
  void add(const session_bounds& o) {
    for (std::size_t k = 0; k < lower.size(); ++k) {
      lower[k] += o.lower[k];
      upper[k] += o.upper[k];
    }
  }
};

TEST(function_profiler_concurrency, churn_keeps_nested_scopes_whole) {
  constexpr int threads = 4;
  constexpr std::size_t sessions = 1200;
  std::atomic<std::uint64_t> generation{0};
  std::atomic<bool> finished{false};
  std::vector<std::atomic<std::uint64_t>> progress(threads);  // loops done, per worker
  std::vector<session_bounds> outer_bounds(threads, session_bounds{sessions});
  std::vector<session_bounds> inner_bounds(threads, session_bounds{sessions});
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto& ob = outer_bounds[static_cast<std::size_t>(t)];
      auto& ib = inner_bounds[static_cast<std::size_t>(t)];
      while (!finished.load()) {
        // Nothing but the generation reads between the scopes: the races are narrow.
        const std::uint64_t g0 = generation.load();
        std::uint64_t g1 = 0;
        std::uint64_t g2 = 0;
        {
          POOLSCOPE_SCOPE("fp.churn.outer");
          g1 = generation.load();
          { POOLSCOPE_SCOPE("fp.churn.inner"); }
          g2 = generation.load();
        }
        ob.add(g0, generation.load());
        ib.add(g1, g2);
        {
          POOLSCOPE_SCOPE("fp.churn.rec");
          { POOLSCOPE_SCOPE("fp.churn.rec"); }
        }
        progress[static_cast<std::size_t>(t)].fetch_add(1);
      }
    });
  }
  // Until every worker has made `loops` more loops than when called.
  const auto wait_for_workers = [&](std::uint64_t loops) {
    std::vector<std::uint64_t> from(threads);
    for (std::size_t t = 0; t < from.size(); ++t) {
      from[t] = progress[t].load();
    }
    for (std::size_t t = 0; t < from.size(); ++t) {
      while (progress[t].load() < from[t] + loops) {
        std::this_thread::yield();
      }
    }
  };
  wait_for_workers(1);
  function_profiler_options o;
  o.gpu_timing = false;
  o.clock = &tick_clock;
  function_profiler prof{o};
  prof.stop();
  std::vector<std::uint64_t> outer_calls(sessions, 0);
  std::vector<std::uint64_t> inner_calls(sessions, 0);
  std::vector<bool> was_reset(sessions, false);
  int broken = 0;
  const auto check = [&](const function_profile& p, std::size_t k, const char* when) {
    const std::string v = churn_violations(p);
    if (!v.empty() && ++broken <= 3) {
      ADD_FAILURE() << "session " << k << ", " << when << ": " << v << "\n" << p.to_table();
    }
  };
  for (std::size_t k = 0; k < sessions; ++k) {
    prof.start();
    generation.store(2 * k + 1);
    if (k % 16 == 0) {
      wait_for_workers(2);  // every worker runs whole loops inside the session
    } else if (k % 2 == 0) {
      std::this_thread::yield();
    }  // else back to back: the scopes straddle the start and the stop
    if (k % 8 == 3) {
      check(prof.report(false), k, "while active");
    }
    if (k % 16 == 5) {
      prof.reset();  // a new session id under running scopes, without stopping
      was_reset[k] = true;
      std::this_thread::yield();
    }
    generation.store(2 * k + 2);
    prof.stop();
    const function_profile p = prof.report();
    check(p, k, "after stop");
    outer_calls[k] = calls_of(p, "fp.churn.outer");
    inner_calls[k] = calls_of(p, "fp.churn.inner");
  }
  finished = true;
  for (auto& w : workers) {
    w.join();
  }
  session_bounds outer{sessions};
  session_bounds inner{sessions};
  for (int t = 0; t < threads; ++t) {
    outer.add(outer_bounds[static_cast<std::size_t>(t)]);
    inner.add(inner_bounds[static_cast<std::size_t>(t)]);
  }
  std::uint64_t certain = 0;
  for (std::size_t k = 0; k < sessions; ++k) {
    certain += outer.lower[k];
    // Every scope that opened after start() returned and closed before stop() was called is
    // counted (reset() drops what came before it); nothing outside the session is.
    if (!was_reset[k]) {
      EXPECT_GE(outer_calls[k], outer.lower[k]) << "session " << k;
      EXPECT_GE(inner_calls[k], inner.lower[k]) << "session " << k;
    }
    EXPECT_LE(outer_calls[k], outer.upper[k]) << "session " << k;
    EXPECT_LE(inner_calls[k], inner.upper[k]) << "session " << k;
  }
  EXPECT_EQ(broken, 0);
  EXPECT_GE(certain, sessions / 16 * threads);  // the sessions that waited for the workers
  std::printf("churn: %zu sessions, %llu outer scopes certainly inside one\n", sessions,
              static_cast<unsigned long long>(certain));
}

}  // namespace
