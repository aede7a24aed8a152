// The function profiler and the scope machinery behind POOLSCOPE_SCOPE.
//
// Layout: a process-wide name registry (ids dense, entries never freed); per thread, a stack of
// open frames, a stack of open times for the running timelines (detail/scope_timelines.hpp),
// and a shard of per-name results with its own mutex; a collector (leaked, so scopes
// may close during static destruction) listing the live shards and holding the results of
// threads that exited. A session id tags every frame and shard, so results of an earlier session
// are never mixed into a later one: a shard is reset lazily the first time its thread records in
// a new session.
//
// Which scopes a session counts (the contract in function_profiler.hpp) rests on three orders:
// - start() sets flag_profiler before it publishes the session in g_session, and stop() clears
//   g_session before it clears the flag, so the flag is set whenever a session is published. A
//   scope's constructor reads the flag relaxed; close_scope reads it with acquire before it reads
//   g_session (every write of g_scope_flags is a read-modify-write, so any value it reads is in
//   the release sequence of stop()'s), so a scope nested in a counted one never misses the flag
//   (it would have opened no frame, and its enclosing scope would have been counted without it);
// - close_scope checks the session again under its shard's mutex, which stop() takes to collect
//   the shard after clearing g_session: a close is counted iff it is in what stop() collects;
// - a frame's inclusive time and bytes go to cpu_total/used/acquired minus what counted scopes of
//   the same name nested in it already put there ("covered"): the outermost *counted* scope of a
//   name carries them, even when a scope of that name around it is not counted.
#include "poolscope/profiler/function_profiler.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <unordered_map>

#include "detail/cuda_timing_seam.hpp"
#include "detail/nvtx_seam.hpp"
#include "detail/scope_timelines.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/log.hpp"
#include "poolscope/profiler/detail/json_text.hpp"

namespace poolscope::profiler {

namespace detail {
std::atomic<std::uint32_t> g_scope_flags{0};
}  // namespace detail

namespace {

namespace gpu = detail::cuda_timing;

// ---- names -----------------------------------------------------------------------------------

struct name_entry {
  std::string name;
  detail::site_info info;
};

struct name_registry {
  std::shared_mutex mutex;
  std::deque<name_entry> entries;  // a deque: entries never move, so views and pointers hold
  std::unordered_map<std::string_view, detail::site_info*> by_name;
};

name_registry& names() {
  static auto* r = new name_registry;  // leaked: sites are static objects of any lifetime
  return *r;
}

// ---- session-wide settings -------------------------------------------------------------------

std::atomic<std::uint64_t> g_session{0};  // the active session; 0: none
std::atomic<std::uint64_t> g_next_session{0};
std::atomic<clock_function> g_clock{&hooks::now_ns};
std::atomic<bool> g_gpu{false};
std::atomic<std::size_t> g_gpu_limit{1024};
// A thread's pending GPU-time pairs are first resolved when this many (or the limit, if lower)
// wait, so even a short run gives its completed events back to the pool for later scopes to
// reuse instead of creating new ones; each later scan waits until twice what the last one left.
constexpr std::size_t first_gpu_scan = 64;
std::atomic<void*> g_owner{nullptr};  // the active profiler's state

std::uint64_t now() noexcept {
  return g_clock.load(std::memory_order_relaxed)();
}

void disable_gpu(const char* call, const char* error) noexcept {
  if (g_gpu.exchange(false, std::memory_order_relaxed)) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "function profiler: %s failed (%s); GPU timing is off for the rest of the "
                  "session",
                  call, error != nullptr ? error : "unknown error");
    log(log_level::warn, buf);
  }
}

// ---- scopes lost for lack of memory ----------------------------------------------------------

// Scopes of the active session that could not be counted (no memory for their frame or their
// results). Rare, so one lock; checked against g_session under it, as stop() reads it after
// clearing g_session, so a loss is in exactly the session's count or in none. A plain global
// (std::mutex is constant-initialised and trivially destroyed): noting a loss allocates nothing.
struct lost_scopes {
  std::mutex mutex;
  std::uint64_t session = 0;
  std::uint64_t count = 0;
};
lost_scopes g_lost;

void note_lost_scope(std::uint64_t session) noexcept {
  bool first = false;
  {
    std::lock_guard lock(g_lost.mutex);
    if (session != g_session.load(std::memory_order_acquire)) {
      return;  // the session is over: the scope would not have been counted anyway
    }
    if (g_lost.session != session) {
      g_lost.session = session;
      g_lost.count = 0;
    }
    first = g_lost.count++ == 0;
  }
  if (first) {
    log(log_level::error,
        "function profiler: out of host memory, scopes are not being counted; the profile is "
        "incomplete (function_profile::scopes_lost says how many)");
  }
}

// A name that could not be interned (no host memory): said once per process, from a literal
// (log() allocates nothing), and the caller gets lost_site.
const detail::site_info& note_unregistered() noexcept {
  static std::atomic<bool> said{false};
  if (!said.exchange(true, std::memory_order_relaxed)) {
    log(log_level::error,
        "profiler: out of host memory, a scope name could not be registered; its scopes are "
        "counted as lost until it is");
  }
  return detail::lost_site;
}

std::uint64_t lost_in(std::uint64_t session) noexcept {
  std::lock_guard lock(g_lost.mutex);
  return g_lost.session == session ? g_lost.count : 0;
}

// ---- results ---------------------------------------------------------------------------------

struct name_stats {
  std::uint64_t calls = 0;
  std::uint64_t cpu_total = 0;
  std::uint64_t cpu_self = 0;
  std::uint64_t gpu_total = 0;
  std::uint64_t gpu_samples = 0;
  std::uint64_t used = 0;
  std::uint64_t self_used = 0;
  std::uint64_t acquired = 0;
  std::uint64_t self_acquired = 0;

  void add(const name_stats& o) noexcept {
    calls += o.calls;
    cpu_total += o.cpu_total;
    cpu_self += o.cpu_self;
    gpu_total += o.gpu_total;
    gpu_samples += o.gpu_samples;
    used += o.used;
    self_used += o.self_used;
    acquired += o.acquired;
    self_acquired += o.self_acquired;
  }
};

struct gpu_pair {
  std::uint32_t id;
  gpu::event_handle start;
  gpu::event_handle end;
};

struct shard_data {
  std::vector<name_stats> stats;  // by name id
  std::vector<gpu_pair> pending;
  std::uint64_t gpu_dropped = 0;

  name_stats& at(std::uint32_t id) {
    if (id >= stats.size()) {
      stats.resize(static_cast<std::size_t>(id) + 1);
    }
    return stats[id];
  }
  void merge(shard_data&& o) {
    if (o.stats.size() > stats.size()) {
      stats.resize(o.stats.size());
    }
    for (std::size_t i = 0; i < o.stats.size(); ++i) {
      stats[i].add(o.stats[i]);
    }
    pending.insert(pending.end(), o.pending.begin(), o.pending.end());
    gpu_dropped += o.gpu_dropped;
    o.stats.clear();
    o.pending.clear();
    o.gpu_dropped = 0;
  }
  // Drops everything, giving the events back to the pool.
  void clear() noexcept {
    for (const auto& p : pending) {
      gpu::release_event(p.start);
      gpu::release_event(p.end);
    }
    pending.clear();
    stats.clear();
    gpu_dropped = 0;
  }
  // Turns completed pairs into GPU time. With `wait`, waits for each pair first.
  void resolve(bool wait) noexcept {
    std::size_t kept = 0;
    for (const auto& p : pending) {
      const char* error = nullptr;
      bool ready = false;
      bool failed = false;
      if (wait) {
        ready = gpu::synchronize(p.end, &error);
        failed = !ready;
        if (failed) {
          disable_gpu("cudaEventSynchronize", error);
        }
      } else {
        const auto q = gpu::query(p.end, &error);
        ready = q == gpu::query_status::ready;
        failed = q == gpu::query_status::error;
        if (failed) {
          disable_gpu("cudaEventQuery", error);
        }
      }
      if (ready) {
        std::uint64_t ns = 0;
        if (gpu::elapsed_ns(p.start, p.end, ns, &error)) {
          // `stats` already has the id: the pair was queued after its stats entry was made.
          stats[p.id].gpu_total += ns;
          ++stats[p.id].gpu_samples;
        } else {
          disable_gpu("cudaEventElapsedTime", error);
          ++gpu_dropped;
        }
      } else if (failed) {
        ++gpu_dropped;
      } else {
        pending[kept++] = p;
        continue;
      }
      gpu::release_event(p.start);
      gpu::release_event(p.end);
    }
    pending.resize(kept);
  }
};

struct shard {
  std::mutex mutex;
  std::uint64_t session = 0;
  shard_data data;
  std::size_t next_scan = 0;  // resolve completed pairs when pending reaches this
};

struct collector {
  std::mutex mutex;
  std::vector<std::shared_ptr<shard>> live;
  std::uint64_t retired_session = 0;
  shard_data retired;  // results of exited threads, for retired_session
};

collector& coll() {
  static auto* c = new collector;  // leaked: threads may exit during static destruction
  return *c;
}

// ---- per-thread state ------------------------------------------------------------------------

struct frame {
  std::uint32_t id;
  std::uint32_t prev_same;  // 1 + index of the next open frame of the same name below; 0: none
  std::uint64_t session;
  std::uint64_t start;
  std::uint64_t child = 0;  // inclusive time of directly nested frames
  std::uint64_t used = 0;
  std::uint64_t self_used = 0;
  std::uint64_t acquired = 0;
  std::uint64_t self_acquired = 0;
  // Inclusive time and bytes that scopes of the same name nested in this one already added to
  // cpu_total, used and acquired (those counted, and what uncounted ones passed up).
  std::uint64_t covered_ns = 0;
  std::uint64_t covered_used = 0;
  std::uint64_t covered_acquired = 0;
  gpu::event_handle gpu_start = nullptr;
  void* stream = nullptr;
};

thread_local bool t_gone = false;  // set once the thread's state is destroyed

struct thread_state {
  std::vector<frame> frames;
  std::vector<std::uint32_t> innermost;     // per name id: 1 + index of its innermost open frame
  std::vector<std::uint64_t> slice_begins;  // hooks::now_ns at the open of timeline scopes
  std::shared_ptr<shard> own;

  thread_state() = default;
  thread_state(const thread_state&) = delete;
  thread_state& operator=(const thread_state&) = delete;

  shard& get_shard() {
    if (!own) {
      auto s = std::make_shared<shard>();
      auto& c = coll();
      std::lock_guard lock(c.mutex);
      c.live.push_back(s);
      own = std::move(s);
    }
    return *own;
  }

  ~thread_state() {
    t_gone = true;
    for (const auto& f : frames) {
      gpu::release_event(f.gpu_start);
    }
    if (!own) {
      return;
    }
    try {
      auto& c = coll();
      std::lock_guard lock(c.mutex);
      {
        // Kept for the latest session whether or not it is still active: a stop() that has
        // cleared g_session but not yet collected (it waits for the collector's mutex) finds
        // them in `retired`. A collected shard is empty; results of an older session than the
        // retired one were collected or dropped already (sessions only grow).
        std::lock_guard slock(own->mutex);
        if (own->session != 0 && own->session >= c.retired_session) {
          if (c.retired_session != own->session) {
            c.retired.clear();
            c.retired_session = own->session;
          }
          c.retired.merge(std::move(own->data));
        } else {
          own->data.clear();
        }
      }
      std::erase(c.live, own);
    } catch (...) {
      // Out of memory while merging: this thread's results are lost; nothing else is affected.
    }
  }
};

thread_local thread_state t_state;

// ---- the memory attribution hook -------------------------------------------------------------

class memory_attribution_hook final : public hooks::hook {
 public:
  [[nodiscard]] hooks::event_filter interests() const noexcept override {
    return hooks::event_filter{}
        .add(hooks::event_kind::pool_malloc, hooks::event_phase::post)
        .add(hooks::event_kind::device_alloc, hooks::event_phase::post);
  }
  [[nodiscard]] bool wants_sequence() const noexcept override { return false; }
  [[nodiscard]] bool wants_time() const noexcept override { return false; }
  void on_event(const hooks::event& e) noexcept override {
    if (e.phase != hooks::event_phase::post ||
        (e.kind != hooks::event_kind::pool_malloc && e.kind != hooks::event_kind::device_alloc)) {
      return;
    }
    if (t_gone) {
      return;
    }
    auto& ts = t_state;
    if (ts.frames.empty()) {
      return;
    }
    frame& f = ts.frames.back();
    if (f.session != g_session.load(std::memory_order_relaxed)) {
      return;
    }
    const std::uint64_t bytes = e.rounded != 0 ? e.rounded : e.requested;
    if (e.kind == hooks::event_kind::pool_malloc) {
      f.used += bytes;
      f.self_used += bytes;
    } else {
      f.acquired += bytes;
      f.self_acquired += bytes;
    }
  }
};

// ---- collection ------------------------------------------------------------------------------

// Calls fn(data) for every shard (and the retired results) of `session`, each under its lock.
template <typename Fn>
void for_each_shard(std::uint64_t session, Fn&& fn) {
  auto& c = coll();
  std::lock_guard lock(c.mutex);
  for (const auto& s : c.live) {
    std::lock_guard slock(s->mutex);
    if (s->session == session) {
      fn(s->data);
    }
  }
  if (c.retired_session == session) {
    fn(c.retired);
  }
}

function_profile make_profile(const shard_data& d, std::uint64_t pending, bool gpu_timing,
                              std::uint64_t scopes_lost) {
  function_profile p;
  p.gpu_timing = gpu_timing;
  p.gpu_pending = pending;
  p.gpu_dropped = d.gpu_dropped;
  p.scopes_lost = scopes_lost;
  auto& r = names();
  std::shared_lock lock(r.mutex);
  for (std::size_t id = 0; id < d.stats.size(); ++id) {
    const name_stats& s = d.stats[id];
    if (s.calls == 0) {
      continue;
    }
    const name_entry& n = r.entries[id];
    scope_record rec;
    rec.name = n.name;
    rec.cat = n.info.cat;
    rec.calls = s.calls;
    rec.cpu_total_ns = s.cpu_total;
    rec.cpu_self_ns = s.cpu_self;
    if (gpu_timing) {
      rec.gpu_total_ns = s.gpu_total;
    }
    rec.gpu_samples = s.gpu_samples;
    rec.used_bytes = s.used;
    rec.self_used_bytes = s.self_used;
    rec.acquired_bytes = s.acquired;
    rec.self_acquired_bytes = s.self_acquired;
    p.scopes.push_back(std::move(rec));
  }
  std::sort(p.scopes.begin(), p.scopes.end(), [](const scope_record& a, const scope_record& b) {
    return a.cpu_total_ns != b.cpu_total_ns ? a.cpu_total_ns > b.cpu_total_ns : a.name < b.name;
  });
  return p;
}

// ---- formatting ------------------------------------------------------------------------------

std::string format_ns(std::uint64_t ns) {
  char buf[32];
  const double v = static_cast<double>(ns);
  if (ns < 1000) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " ns", ns);
  } else if (ns < 1000000) {
    std::snprintf(buf, sizeof buf, "%.2f us", v / 1e3);
  } else if (ns < 1000000000) {
    std::snprintf(buf, sizeof buf, "%.2f ms", v / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f s", v / 1e9);
  }
  return buf;
}

std::string format_size(std::uint64_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  }
  return buf;
}

category category_from_string(std::string_view s) {
  for (category c :
       {category::pool, category::darray_transfer, category::darray_compute, category::user}) {
    if (to_string(c) == s) {
      return c;
    }
  }
  throw invalid_argument("poolscope: unknown scope category '" + std::string(s) + "'");
}

}  // namespace

// ---- scope slow paths ------------------------------------------------------------------------

namespace detail {

constinit const site_info lost_site{.id = lost_site_id, .cat = category::user, .name = {}};

const site_info& register_site(std::string_view name, category c) noexcept {
  // Every allocation (the registry, its entry, the name, the index node, and the NVTX tool's
  // string) may fail: the caller then gets lost_site, and the registry stays as it was.
  name_registry* reg = nullptr;
  try {
    reg = &names();
  } catch (...) {
    return note_unregistered();
  }
  name_registry& r = *reg;
  {
    std::shared_lock lock(r.mutex);
    auto it = r.by_name.find(name);
    if (it != r.by_name.end()) {
      return *it->second;
    }
  }
  // Created outside the registry lock: the first NVTX call may load a tool.
  nvtxDomainHandle_t domain = nvtx_domain();
  std::unique_lock lock(r.mutex);
  auto it = r.by_name.find(name);
  if (it != r.by_name.end()) {
    return *it->second;
  }
  bool added = false;
  try {
    name_entry& e = r.entries.emplace_back();
    added = true;
    e.name.assign(name);
    e.info.id = static_cast<std::uint32_t>(r.entries.size() - 1);
    e.info.cat = c;
    e.info.name = e.name;
    e.info.nvtx_string =
        domain != nullptr ? nvtx_seam::register_string(domain, e.name.c_str()) : nullptr;
    r.by_name.emplace(e.info.name, &e.info);
    return e.info;
  } catch (...) {
    if (added) {
      r.entries.pop_back();  // ids stay dense: the next name takes this one's
    }
  }
  lock.unlock();
  return note_unregistered();
}

std::uint32_t open_scope(const site_info& site, stream_view stream, std::uint32_t flags) noexcept {
  if (site.id == lost_site_id) [[unlikely]] {
    // No name to record it under: what would have recorded it counts it as lost.
    if ((flags & flag_timeline) != 0) {
      lost_on_running_timelines();
    }
    const std::uint64_t session = g_session.load(std::memory_order_acquire);
    if ((flags & flag_profiler) != 0 && session != 0) {
      note_lost_scope(session);
    }
    return 0;
  }
  std::uint32_t done = 0;
  if ((flags & flag_nvtx) != 0) {
    nvtxDomainHandle_t d = nvtx_domain();
    if (site.nvtx_string != nullptr) {
      nvtx_seam::push_range(d, site.nvtx_string, site.cat);
    } else {
      nvtx_seam::push_range_ascii(d, site.name.data(), site.cat);  // NUL-terminated: interned
    }
    done |= flag_nvtx;
  }
  if (t_gone) {
    return done;
  }
  if ((flags & flag_timeline) != 0) {
    try {
      t_state.slice_begins.push_back(hooks::now_ns());
      done |= flag_timeline;
    } catch (...) {
      // No memory for the open time: this scope is not on the timelines, which count it lost.
      lost_on_running_timelines();
    }
  }
  if ((flags & flag_profiler) == 0) {
    return done;
  }
  const std::uint64_t session = g_session.load(std::memory_order_acquire);
  if (session == 0) {
    return done;
  }
  auto& ts = t_state;
  try {
    if (site.id >= ts.innermost.size()) {
      ts.innermost.resize(static_cast<std::size_t>(site.id) + 1, 0);
    }
    frame fr{};
    fr.id = site.id;
    fr.prev_same = ts.innermost[site.id];
    fr.session = session;
    ts.frames.push_back(fr);
  } catch (...) {
    note_lost_scope(session);  // no memory for the frame: this scope is not profiled
    return done;
  }
  ts.innermost[site.id] = static_cast<std::uint32_t>(ts.frames.size());
  frame& f = ts.frames.back();
  // GPU time is taken for the outermost scope of the name in the session (a scope of the name
  // around it from an earlier session does not count).
  const bool outermost = f.prev_same == 0 || ts.frames[f.prev_same - 1].session != session;
  if (outermost && g_gpu.load(std::memory_order_relaxed)) {
    const char* error = nullptr;
    f.gpu_start = gpu::acquire_event(stream.value(), &error);
    if (f.gpu_start == nullptr) {
      disable_gpu("cudaEventCreate", error);
    } else if (!gpu::record(f.gpu_start, stream.value(), &error)) {
      disable_gpu("cudaEventRecord", error);
      gpu::release_event(f.gpu_start);
      f.gpu_start = nullptr;
    } else {
      f.stream = stream.value();
    }
  }
  f.start = now();
  return done | flag_profiler;
}

void close_scope(const site_info& site, std::uint32_t flags) noexcept {
  if ((flags & flag_profiler) != 0 && !t_gone) {
    const std::uint64_t end = now();
    auto& ts = t_state;
    const frame f = ts.frames.back();
    ts.frames.pop_back();
    ts.innermost[f.id] = f.prev_same;
    const std::uint64_t elapsed = end > f.start ? end - f.start : 0;
    const std::uint64_t self = elapsed > f.child ? elapsed - f.child : 0;
    if (!ts.frames.empty()) {
      frame& parent = ts.frames.back();
      parent.child += elapsed;
      parent.used += f.used;
      parent.acquired += f.acquired;
    }
    gpu::event_handle gpu_end = nullptr;
    if (f.gpu_start != nullptr) {
      const char* error = nullptr;
      gpu_end = gpu::acquire_event(f.stream, &error);
      if (gpu_end == nullptr) {
        disable_gpu("cudaEventCreate", error);
      } else if (!gpu::record(gpu_end, f.stream, &error)) {
        disable_gpu("cudaEventRecord", error);
        gpu::release_event(gpu_end);
        gpu_end = nullptr;
      }
      if (gpu_end == nullptr) {
        gpu::release_event(f.gpu_start);
      }
    }
    // What counted scopes of this name (this one included) have put into the inclusive
    // columns, for the next open frame of the name below.
    const std::uint64_t total_ns = std::max(elapsed, f.covered_ns);
    const std::uint64_t total_used = std::max(f.used, f.covered_used);
    const std::uint64_t total_acquired = std::max(f.acquired, f.covered_acquired);
    // Pairs with stop()'s release of flag_profiler: a scope nested in this one that read the
    // flag cleared (relaxed, in scope's constructor) and opened no frame makes this load read
    // that value or a later one, all written by read-modify-writes (a release sequence), so the
    // g_session load below sees the session over too and this scope is not counted without it.
    // (A load, not an acquire fence: ThreadSanitizer does not model fences.)
    (void)g_scope_flags.load(std::memory_order_acquire);
    bool counted = false;
    bool kept = false;
    if (f.session == g_session.load(std::memory_order_acquire)) {
      try {
        shard& sh = ts.get_shard();
        std::lock_guard lock(sh.mutex);
        // Again under the lock that stop() takes to collect this shard after clearing
        // g_session: either this close is collected or it sees the session over.
        if (f.session == g_session.load(std::memory_order_acquire)) {
          if (sh.session != f.session) {
            sh.data.clear();
            sh.session = f.session;
            sh.next_scan = 0;
          }
          name_stats& s = sh.data.at(f.id);
          ++s.calls;
          s.cpu_self += self;
          s.self_used += f.self_used;
          s.self_acquired += f.self_acquired;
          s.cpu_total += total_ns - f.covered_ns;
          s.used += total_used - f.covered_used;
          s.acquired += total_acquired - f.covered_acquired;
          counted = true;
        }
        if (counted && gpu_end != nullptr) {
          const std::size_t limit = g_gpu_limit.load(std::memory_order_relaxed);
          auto& pending = sh.data.pending;
          const std::size_t first = std::min(limit, first_gpu_scan);
          if (pending.size() >= std::max(first, sh.next_scan)) {
            sh.data.resolve(false);
            sh.next_scan = std::max(first, pending.size() * 2);
          }
          if (pending.size() >= 16 * limit) {
            ++sh.data.gpu_dropped;
          } else {
            pending.push_back(gpu_pair{f.id, f.gpu_start, gpu_end});
            kept = true;
          }
        }
      } catch (...) {
        // No memory for the results: this scope is not counted (or, if only the pending pair
        // could not be queued, counted without its GPU time).
        if (!counted) {
          note_lost_scope(f.session);
        }
      }
    }
    if (f.prev_same != 0) {
      frame& below = ts.frames[f.prev_same - 1];
      below.covered_ns += counted ? total_ns : f.covered_ns;
      below.covered_used += counted ? total_used : f.covered_used;
      below.covered_acquired += counted ? total_acquired : f.covered_acquired;
    }
    if (gpu_end != nullptr && !kept) {
      gpu::release_event(f.gpu_start);
      gpu::release_event(gpu_end);
    }
  }
  if ((flags & flag_timeline) != 0 && !t_gone) {
    // Read after the profiler's work, as the open time was read before it: the slice encloses
    // what the profiler measured, and the scopes nested in it.
    const std::uint64_t end = hooks::now_ns();
    auto& begins = t_state.slice_begins;
    const std::uint64_t begin = begins.back();
    begins.pop_back();
    feed_running_timelines({.name = site.name,
                            .category = to_string(site.cat),
                            .thread = hooks::current_thread_id(),
                            .begin_ns = begin,
                            .end_ns = end});
  }
  if ((flags & flag_nvtx) != 0) {
    nvtx_seam::pop_range(nvtx_domain());
  }
}

}  // namespace detail

// ---- function_profile ------------------------------------------------------------------------

const scope_record* function_profile::find(std::string_view name) const noexcept {
  for (const auto& s : scopes) {
    if (s.name == name) {
      return &s;
    }
  }
  return nullptr;
}

namespace {

/// A scope name as one table cell: control characters (a newline would split the row in two)
/// written as \n, \t, \r or \xHH, and a backslash as \\ so that the cell reads back unambiguously.
std::string table_cell_text(std::string_view name) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(name.size());
  for (const char ch : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += digits[c >> 4];
      out += digits[c & 0xf];
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace

std::string function_profile::to_table() const {
  std::vector<std::string> names;
  names.reserve(scopes.size());
  std::size_t width = 4;
  for (const auto& s : scopes) {
    names.push_back(table_cell_text(s.name));
    width = std::max(width, names.back().size());
  }
  // The name column is padded here, not by snprintf: a name may be longer than any fixed
  // buffer (a __PRETTY_FUNCTION__ of a template), and a cut row would lose its end of line.
  const auto name_cell = [width](std::string& out, std::string_view name) {
    out += name;
    out.append(width - name.size(), ' ');
  };
  std::string out;
  char buf[512];  // the columns after the name and the summary: bounded, far below this
  name_cell(out, "name");
  std::snprintf(buf, sizeof buf, " %8s %12s %12s %12s %12s %12s %12s\n", "calls", "cpu total",
                "cpu self", "gpu total", "cpu avg", "used", "acquired");
  out += buf;
  std::uint64_t calls = 0;
  std::uint64_t self = 0;
  std::uint64_t gpu_ns = 0;
  std::uint64_t used = 0;
  std::uint64_t acquired = 0;
  for (std::size_t i = 0; i < scopes.size(); ++i) {
    const scope_record& s = scopes[i];
    const std::string gpu_text = s.gpu_total_ns ? format_ns(*s.gpu_total_ns) : "-";
    name_cell(out, names[i]);
    std::snprintf(buf, sizeof buf, " %8" PRIu64 " %12s %12s %12s %12s %12s %12s\n", s.calls,
                  format_ns(s.cpu_total_ns).c_str(), format_ns(s.cpu_self_ns).c_str(),
                  gpu_text.c_str(), format_ns(static_cast<std::uint64_t>(s.cpu_avg_ns())).c_str(),
                  format_size(s.used_bytes).c_str(), format_size(s.acquired_bytes).c_str());
    out += buf;
    calls += s.calls;
    self += s.cpu_self_ns;
    used += s.self_used_bytes;
    acquired += s.self_acquired_bytes;
    gpu_ns = std::max(gpu_ns, s.gpu_total_ns.value_or(0));
  }
  // Self times and self bytes add up without double counting; GPU spans of different scopes
  // overlap, so the largest one is the honest summary.
  std::snprintf(buf, sizeof buf,
                "total: %zu scopes, %" PRIu64
                " calls, %s in scopes (sum of self), %s largest gpu total, %s used, %s acquired"
                "%s%s\n",
                scopes.size(), calls, format_ns(self).c_str(),
                gpu_timing ? format_ns(gpu_ns).c_str() : "no", format_size(used).c_str(),
                format_size(acquired).c_str(),
                gpu_pending != 0 || gpu_dropped != 0 ? " (gpu times incomplete)" : "",
                scopes_lost != 0 ? " (incomplete: scopes lost for lack of memory)" : "");
  out += buf;
  return out;
}

std::string function_profile::to_json() const {
  nlohmann::json j;
  j["gpu_timing"] = gpu_timing;
  j["gpu_pending"] = gpu_pending;
  j["gpu_dropped"] = gpu_dropped;
  j["scopes_lost"] = scopes_lost;
  auto& arr = j["scopes"] = nlohmann::json::array();
  for (const auto& s : scopes) {
    arr.push_back({
        {"name", s.name},
        {"category", std::string(to_string(s.cat))},
        {"calls", s.calls},
        {"cpu_total_ns", s.cpu_total_ns},
        {"cpu_self_ns", s.cpu_self_ns},
        {"cpu_avg_ns", s.cpu_avg_ns()},
        {"gpu_total_ns", s.gpu_total_ns ? nlohmann::json(*s.gpu_total_ns) : nlohmann::json()},
        {"gpu_samples", s.gpu_samples},
        {"used_bytes", s.used_bytes},
        {"self_used_bytes", s.self_used_bytes},
        {"acquired_bytes", s.acquired_bytes},
        {"self_acquired_bytes", s.self_acquired_bytes},
    });
  }
  return j.dump();
}

namespace {

[[noreturn]] void bad_profile_field(std::string_view where, const char* field,
                                    const nlohmann::json& value, const char* expected) {
  throw invalid_argument("poolscope: function profile " + std::string(where) + "field '" + field +
                         "' is " + detail::json_shown(value) + ", not " + expected);
}

const nlohmann::json& profile_field(const nlohmann::json& j, std::string_view where,
                                    const char* field) {
  const auto it = j.find(field);
  if (it == j.end()) {
    throw invalid_argument("poolscope: function profile " + std::string(where) + "has no field '" +
                           field + "'");
  }
  return *it;
}

// nlohmann's get<std::uint64_t>() converts -1 and 2.5 without a word (to 2^64-1 and 2): a count
// or a time is taken only as a non-negative integer.
std::uint64_t profile_u64_value(const nlohmann::json& v, std::string_view where,
                                const char* field) {
  if (v.is_number_unsigned()) {
    return v.get<std::uint64_t>();
  }
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) {
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  }
  bad_profile_field(where, field, v, "a non-negative integer");
}

std::uint64_t profile_u64(const nlohmann::json& j, std::string_view where, const char* field) {
  return profile_u64_value(profile_field(j, where, field), where, field);
}

}  // namespace

function_profile function_profile::from_json(std::string_view json) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument(std::string("poolscope: not a function profile JSON: ") + e.what());
  }
  return from_json_document(j);
}

function_profile function_profile::from_json_document(const nlohmann::json& j) {
  if (!j.is_object()) {
    throw invalid_argument("poolscope: not a function profile JSON: not an object");
  }
  function_profile p;
  const auto& timing = profile_field(j, "", "gpu_timing");
  if (!timing.is_boolean()) {
    bad_profile_field("", "gpu_timing", timing, "true or false");
  }
  p.gpu_timing = timing.get<bool>();
  p.gpu_pending = profile_u64(j, "", "gpu_pending");
  p.gpu_dropped = profile_u64(j, "", "gpu_dropped");
  if (j.contains("scopes_lost")) {
    p.scopes_lost = profile_u64(j, "", "scopes_lost");
  }
  const auto& scopes = profile_field(j, "", "scopes");
  if (!scopes.is_array()) {
    bad_profile_field("", "scopes", scopes, "an array");
  }
  p.scopes.reserve(scopes.size());
  for (std::size_t i = 0; i < scopes.size(); ++i) {
    const nlohmann::json& s = scopes[i];
    const std::string where = "scopes[" + std::to_string(i) + "] ";
    if (!s.is_object()) {
      throw invalid_argument("poolscope: function profile " + where + "is not an object");
    }
    scope_record r;
    const auto& name = profile_field(s, where, "name");
    if (!name.is_string()) {
      bad_profile_field(where, "name", name, "a string");
    }
    r.name = name.get<std::string>();
    const auto& cat = profile_field(s, where, "category");
    if (!cat.is_string()) {
      bad_profile_field(where, "category", cat, "a string");
    }
    r.cat = category_from_string(cat.get<std::string>());
    r.calls = profile_u64(s, where, "calls");
    r.cpu_total_ns = profile_u64(s, where, "cpu_total_ns");
    r.cpu_self_ns = profile_u64(s, where, "cpu_self_ns");
    const auto& g = profile_field(s, where, "gpu_total_ns");
    if (!g.is_null()) {
      r.gpu_total_ns = profile_u64_value(g, where, "gpu_total_ns");
    }
    r.gpu_samples = profile_u64(s, where, "gpu_samples");
    r.used_bytes = profile_u64(s, where, "used_bytes");
    r.self_used_bytes = profile_u64(s, where, "self_used_bytes");
    r.acquired_bytes = profile_u64(s, where, "acquired_bytes");
    r.self_acquired_bytes = profile_u64(s, where, "self_acquired_bytes");
    p.scopes.push_back(std::move(r));
  }
  return p;
}

// ---- function_profiler -----------------------------------------------------------------------

struct function_profiler::state {
  std::mutex mutex;  // guards the members below
  bool active = false;
  bool gpu = false;
  std::uint64_t session = 0;
  shard_data final;              // results moved out of the shards at stop()
  std::uint64_t final_lost = 0;  // scopes of the stopped session lost for lack of memory
  memory_attribution_hook hook;
  bool hook_installed = false;

  state() = default;
  state(const state&) = delete;
  state& operator=(const state&) = delete;
  ~state() { final.clear(); }
};

function_profiler::function_profiler(function_profiler_options options)
    : options_(options), state_(std::make_unique<state>()) {
  start();
}

function_profiler::~function_profiler() {
  stop();
}

void function_profiler::start() {
  std::lock_guard lock(state_->mutex);
  if (state_->active) {
    throw logic_error("poolscope: function_profiler::start: this profiler is already active");
  }
  void* expected = nullptr;
  if (!g_owner.compare_exchange_strong(expected, state_.get(), std::memory_order_acq_rel)) {
    throw logic_error(
        "poolscope: function_profiler::start: another function_profiler is active (only one may "
        "be active at a time)");
  }
  try {
    if (options_.memory) {
      hooks::install(state_->hook);
      state_->hook_installed = true;
    }
  } catch (...) {
    g_owner.store(nullptr, std::memory_order_release);
    throw;
  }
  state_->final.clear();
  state_->final_lost = 0;
  state_->gpu = options_.gpu_timing && gpu::gpu_available();
  state_->session = g_next_session.fetch_add(1, std::memory_order_relaxed) + 1;
  g_clock.store(options_.clock != nullptr ? options_.clock : &hooks::now_ns,
                std::memory_order_relaxed);
  g_gpu.store(state_->gpu, std::memory_order_relaxed);
  g_gpu_limit.store(std::max<std::size_t>(options_.gpu_pending_limit, 1),
                    std::memory_order_relaxed);
  // The flag first: it is set whenever a session is published (see the top of this file).
  detail::g_scope_flags.fetch_or(detail::flag_profiler, std::memory_order_release);
  g_session.store(state_->session, std::memory_order_release);
  state_->active = true;
}

void function_profiler::stop() noexcept {
  std::lock_guard lock(state_->mutex);
  if (!state_->active) {
    return;
  }
  // The session first: a scope that sees the flag cleared sees the session over (the release
  // here pairs with close_scope's acquire load of the flags).
  g_session.store(0, std::memory_order_release);
  detail::g_scope_flags.fetch_and(~detail::flag_profiler, std::memory_order_release);
  if (state_->hook_installed) {
    hooks::uninstall(state_->hook);
    state_->hook_installed = false;
  }
  state_->final_lost = lost_in(state_->session);  // g_session is 0 now: the count is final
  try {
    for_each_shard(state_->session, [this](shard_data& d) { state_->final.merge(std::move(d)); });
  } catch (...) {
    log(log_level::warn, "function profiler: out of memory while collecting results at stop");
  }
  g_gpu.store(false, std::memory_order_relaxed);
  state_->active = false;
  g_owner.store(nullptr, std::memory_order_release);
}

bool function_profiler::active() const noexcept {
  std::lock_guard lock(state_->mutex);
  return state_->active;
}

function_profile function_profiler::report(bool wait_for_gpu) {
  std::lock_guard lock(state_->mutex);
  if (!state_->active) {
    state_->final.resolve(wait_for_gpu);
    return make_profile(state_->final, state_->final.pending.size(), state_->gpu,
                        state_->final_lost);
  }
  shard_data total;  // stats and counts only: the pending pairs stay with their shards
  std::uint64_t pending = 0;
  for_each_shard(state_->session, [&](shard_data& d) {
    d.resolve(wait_for_gpu);
    if (d.stats.size() > total.stats.size()) {
      total.stats.resize(d.stats.size());
    }
    for (std::size_t i = 0; i < d.stats.size(); ++i) {
      total.stats[i].add(d.stats[i]);
    }
    total.gpu_dropped += d.gpu_dropped;
    pending += d.pending.size();
  });
  return make_profile(total, pending, state_->gpu, lost_in(state_->session));
}

void function_profiler::reset() {
  std::lock_guard lock(state_->mutex);
  state_->final.clear();
  state_->final_lost = 0;
  if (state_->active) {
    // A new session id: every shard resets the next time its thread records; frames open now
    // belong to the old session and are dropped when they close.
    state_->session = g_next_session.fetch_add(1, std::memory_order_relaxed) + 1;
    g_session.store(state_->session, std::memory_order_release);
  }
}

}  // namespace poolscope::profiler
