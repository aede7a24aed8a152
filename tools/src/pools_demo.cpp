#include "pools_demo.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "poolscope/bench/alloc_bench.hpp"
#include "poolscope/bench/memory_access.hpp"
#include "poolscope/bench/text_table.hpp"
#include "poolscope/bench/timing.hpp"
#include "poolscope/bench/workloads.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/factory.hpp"

namespace poolscope::tools {
namespace {

constexpr std::size_t max_failures_kept = 8;

/// The live blocks of one replay, by address, to catch overlapping blocks.
class live_ranges {
 public:
  /// Adds [p, p+n); returns the slot of a live block it overlaps, or -1.
  long long insert(std::uintptr_t p, std::size_t n, std::uint32_t slot) {
    auto next = ranges_.lower_bound(p);
    if (next != ranges_.end() && next->first < p + n) {
      return next->second.slot;
    }
    if (next != ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.bytes > p) {
        return prev->second.slot;
      }
    }
    ranges_.emplace_hint(next, p, range{n, slot});
    return -1;
  }
  void erase(std::uintptr_t p) { ranges_.erase(p); }

 private:
  struct range {
    std::size_t bytes;
    std::uint32_t slot;
  };
  std::map<std::uintptr_t, range> ranges_;
};

struct replay_state {
  std::vector<void*> ptr;
  std::vector<std::uint64_t> tag;
};

std::string hex(const void* p) {
  std::ostringstream s;
  s << p;
  return s.str();
}

demo_result replay(const std::string& strategy, pool::resource& res, const bench::trace& tr,
                   double overhead) {
  demo_result out;
  out.allocator = strategy;
  std::unique_ptr<pool::allocator> alloc;
  try {
    alloc = pool::make_allocator(strategy, res);
  } catch (const std::exception& e) {
    out.error = e.what();  // e.g. a strategy whose parts are not all registered
    return out;
  }
  out.name = alloc->name();
  const pool::memory_kind kind = res.kind();
  replay_state st{std::vector<void*>(tr.slots, nullptr), std::vector<std::uint64_t>(tr.slots, 0)};
  std::vector<std::size_t> slot_bytes(tr.slots, 0);
  live_ranges ranges;
  auto fail = [&out](std::string what) {
    ++out.integrity_failures;
    if (out.failures.size() < max_failures_kept) {
      out.failures.push_back(std::move(what));
    }
  };
  double total_ns = 0.0;
  std::uint64_t next_tag = 1;
  try {
    for (const bench::trace_op& op : tr.ops) {
      if (op.is_free) {
        void* p = st.ptr[op.slot];
        if (p == nullptr) {
          continue;  // its allocation already failed (and was reported)
        }
        if (!bench::check_pattern(kind, p, op.bytes, st.tag[op.slot])) {
          fail("block " + hex(p) + " (" + format_bytes(op.bytes) + ", slot " +
               std::to_string(op.slot) + ") lost its contents before it was freed");
        }
        ranges.erase(reinterpret_cast<std::uintptr_t>(p));
        const std::uint64_t t0 = bench::clock_ns();
        alloc->deallocate(stream_view{}, p, op.bytes);
        total_ns += static_cast<double>(bench::clock_ns() - t0) - overhead;
        st.ptr[op.slot] = nullptr;
        ++out.frees;
        continue;
      }
      const std::uint64_t t0 = bench::clock_ns();
      void* p = alloc->allocate(stream_view{}, op.bytes);
      total_ns += static_cast<double>(bench::clock_ns() - t0) - overhead;
      ++out.allocations;
      st.ptr[op.slot] = p;
      slot_bytes[op.slot] = op.bytes;
      st.tag[op.slot] = next_tag++;
      if (p == nullptr) {
        fail("allocate(" + format_bytes(op.bytes) + ") returned null without throwing");
        continue;
      }
      if (reinterpret_cast<std::uintptr_t>(p) % pool::max_alignment != 0) {
        fail("block " + hex(p) + " is not " + std::to_string(pool::max_alignment) +
             "-byte aligned");
      }
      const long long other = ranges.insert(reinterpret_cast<std::uintptr_t>(p), op.bytes, op.slot);
      if (other >= 0) {
        fail("block " + hex(p) + " (" + format_bytes(op.bytes) +
             ") overlaps the live block of slot " + std::to_string(other));
      }
      bench::write_pattern(kind, p, op.bytes, st.tag[op.slot]);
    }
  } catch (const std::exception& e) {
    out.error = e.what();
    for (std::size_t s = 0; s < st.ptr.size(); ++s) {
      if (st.ptr[s] != nullptr) {
        alloc->deallocate(stream_view{}, st.ptr[s], slot_bytes[s]);
      }
    }
  }
  const std::size_t ops = out.allocations + out.frees;
  out.ns_per_op = ops == 0 ? 0.0 : std::max(0.0, total_ns) / static_cast<double>(ops);
  out.stats = alloc->stats();
  return out;
}

double ratio_of(const pool::allocator_stats& s) {
  return s.peak_requested == 0
             ? 0.0
             : static_cast<double>(s.peak_reserved) / static_cast<double>(s.peak_requested);
}

}  // namespace

demo_report run_demo(const demo_options& o, std::ostream* progress) {
  if (o.steps == 0) {
    throw invalid_argument("poolscope pools: steps must be at least 1");
  }
  const auto known = pool::allocator_names();
  for (const auto& a : o.allocators) {
    if (std::find(known.begin(), known.end(), a) == known.end()) {
      throw invalid_argument("poolscope pools: unknown allocator '" + a + "'");
    }
  }
  demo_report rep;
  rep.resource = o.resource.empty() ? bench::default_resource_name() : o.resource;
  rep.device = o.device;
  rep.steps = o.steps;
  rep.seed = o.seed;
  auto res = pool::make_resource(rep.resource, o.device);
  const bool on_device = res->kind() == pool::memory_kind::device;
  const bench::demo_plan plan = bench::make_demo_plan(on_device, o.steps);
  const bench::trace tr = bench::demo_trace(plan, o.steps, o.seed);
  rep.trace_description = tr.description;
  rep.trace_ops = tr.ops.size();
  rep.trace_allocations = static_cast<std::size_t>(std::count_if(
      tr.ops.begin(), tr.ops.end(), [](const bench::trace_op& op) { return !op.is_free; }));
  rep.peak_live_bytes = bench::peak_live_bytes(tr);
  const double overhead = bench::timer_overhead_ns();
  for (const auto& strategy : o.allocators.empty() ? known : o.allocators) {
    if (progress != nullptr) {
      *progress << "[pools] " << strategy << " on " << res->name() << ": " << tr.ops.size()
                << " operations" << std::endl;
    }
    rep.results.push_back(replay(strategy, *res, tr, overhead));
  }

  std::ostringstream s;
  s << "pools [" << res->name() << "]: " << rep.results.size() << " strategies x " << rep.trace_ops
    << " ops (" << o.steps << " sequence steps + " << plan.mix_pairs << "-pair mix), integrity "
    << (rep.integrity_ok() ? "ok" : "FAILED");
  const demo_result* leanest = nullptr;
  const demo_result* fastest = nullptr;
  for (const auto& r : rep.results) {
    if (!r.error.empty()) {
      s << "; " << r.allocator << " FAILED";
      continue;
    }
    if (r.stats.upstream_allocs < r.allocations &&  // a pool that reuses (naive never does)
        (leanest == nullptr || ratio_of(r.stats) < ratio_of(leanest->stats))) {
      leanest = &r;
    }
    if (fastest == nullptr || r.ns_per_op < fastest->ns_per_op) {
      fastest = &r;
    }
  }
  if (leanest != nullptr) {
    s << "; leanest caching pool: " << leanest->allocator << " (peak reserved/requested "
      << bench::format_ratio(ratio_of(leanest->stats)) << ")";
  }
  if (fastest != nullptr) {
    s << "; fastest: " << fastest->allocator << " (" << bench::format_ns(fastest->ns_per_op)
      << "/op)";
  }
  rep.summary = s.str();
  return rep;
}

bool demo_report::integrity_ok() const {
  return std::all_of(results.begin(), results.end(),
                     [](const demo_result& r) { return r.integrity_failures == 0; });
}

bool demo_report::any_error() const {
  return std::any_of(results.begin(), results.end(),
                     [](const demo_result& r) { return !r.error.empty(); });
}

void demo_report::print(std::ostream& out) const {
  out << "poolscope pools: " << trace_description << "\n"
      << "resource " << resource << ", seed " << seed << ", " << trace_ops
      << " operations per strategy, peak live " << bench::format_size(peak_live_bytes) << "\n\n";
  bench::text_table t({"strategy", "peak requested", "peak reserved", "res/req", "upstream",
                       "cached blocks", "largest free", "frag", "ns/op", "integrity"});
  for (const auto& r : results) {
    const auto& st = r.stats;
    std::string integrity =
        r.integrity_failures == 0 ? "ok" : std::to_string(r.integrity_failures) + " FAILURES";
    if (!r.error.empty()) {
      integrity += ", ERROR";
    }
    t.add_row({r.allocator, bench::format_size(st.peak_requested),
               bench::format_size(st.peak_reserved), bench::format_ratio(ratio_of(st)),
               std::to_string(st.upstream_allocs + st.upstream_frees + st.maps + st.unmaps),
               std::to_string(st.cached_blocks), bench::format_size(st.largest_free_block),
               bench::format_ratio(st.fragmentation), bench::format_ns(r.ns_per_op), integrity});
  }
  t.print(out);
  out << "upstream = resource allocations + frees (over vmm / host_vmm, bfc's map + unmap calls, "
         "and peak reserved is the memory mapped); cached blocks, largest free and "
         "frag(mentation) after the trace, before release\n";
  for (const auto& r : results) {
    for (const auto& f : r.failures) {
      out << "  " << r.allocator << ": " << f << "\n";
    }
    if (!r.error.empty()) {
      out << "  " << r.allocator << ": error: " << r.error << "\n";
    }
  }
  out << summary << '\n';
}

std::string demo_report::to_json() const {
  using nlohmann::json;
  json strategies = json::array();
  for (const auto& r : results) {
    const auto& st = r.stats;
    strategies.push_back({{"allocator", r.allocator},
                          {"name", r.name},
                          {"allocations", r.allocations},
                          {"frees", r.frees},
                          {"peak_requested", st.peak_requested},
                          {"peak_reserved", st.peak_reserved},
                          {"ratio", ratio_of(st)},
                          {"upstream_allocs", st.upstream_allocs},
                          {"upstream_frees", st.upstream_frees},
                          {"upstream_calls", st.upstream_allocs + st.upstream_frees},
                          {"cached_blocks", st.cached_blocks},
                          {"cached_bytes", st.cached_bytes},
                          {"largest_free_block", st.largest_free_block},
                          {"fragmentation", st.fragmentation},
                          {"ns_per_op", r.ns_per_op},
                          {"integrity_failures", r.integrity_failures},
                          {"failures", r.failures},
                          {"error", r.error.empty() ? json(nullptr) : json(r.error)},
                          {"stats", json::parse(st.to_json())}});
  }
  json doc = {{"command", "pools"},
              {"resource", resource},
              {"device", device},
              {"steps", steps},
              {"seed", seed},
              {"trace",
               {{"description", trace_description},
                {"ops", trace_ops},
                {"allocations", trace_allocations},
                {"peak_live_bytes", peak_live_bytes}}},
              {"strategies", std::move(strategies)},
              {"integrity_ok", integrity_ok()},
              {"summary", summary}};
  return doc.dump(2);
}

}  // namespace poolscope::tools
