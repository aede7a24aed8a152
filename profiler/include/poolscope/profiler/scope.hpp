// Named scopes: what the function profiler times and what Nsight Systems shows as NVTX ranges.
//
//   void step(cudaStream_t s) {
//     POOLSCOPE_SCOPE("step", s);                     // CPU+GPU time, calls, memory; an NVTX range
//     {
//       POOLSCOPE_SCOPE_IN(poolscope::profiler::category::darray_transfer, "reshard");
//       C2 = C.reshard(A.index_map());
//     }
//   }
//
//   // Names known only at run time: the RAII object (interns the name on every construction).
//   poolscope::profiler::scope s{layer.name()};
//
// What a scope does when it opens and closes:
// - NVTX: pushes a range in the domain "poolscope" with a registered string for the name, the
//   category's id and colour (only when an NVTX tool is attached; otherwise nothing);
// - function profiler: while a function_profiler is active, records calls, inclusive and self CPU
//   time, GPU time of the work enqueued on `stream` between open and close (cudaEvents, resolved
//   lazily), and the pool memory used/acquired inside it. See function_profiler.hpp;
// - timeline: while a timeline runs (timeline_options::scopes), reads hooks::now_ns at open and at
//   close, and at close adds a host slice (the name, the category's name, the thread, open and
//   close times) to every running timeline that started before the scope opened, whether or not
//   a function profiler is active. See timeline.hpp.
//
// Cost: with no profiler active, no timeline running and no NVTX tool attached, opening and
// closing a scope is one relaxed atomic load and a predicted branch each (plus, for the macro, a
// function-local static guard check). With a timeline running: two clock reads, a thread-local
// push/pop, and at close a mutex and the timeline's add_host_slice. With POOLSCOPE_ENABLE_SCOPES=0
// the macros expand to nothing.
//
// Thread safety: scopes may be opened on any number of threads; each thread has its own stack.
// A scope must be closed on the thread that opened it, in LIFO order (automatic objects do that;
// do not hold a scope across a coroutine suspension that may resume on another thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "poolscope/stream_view.hpp"

#ifndef POOLSCOPE_ENABLE_SCOPES
#define POOLSCOPE_ENABLE_SCOPES 1
#endif

namespace poolscope::profiler {

/// The component a scope belongs to: its NVTX category id (named in the "poolscope" domain with
/// nvtxDomainNameCategoryA) and colour, and a column of the function profile.
enum class category : std::uint32_t {
  pool = 1,             ///< allocator work ("pool")
  darray_transfer = 2,  ///< data movement between devices ("darray.transfer")
  darray_compute = 3,   ///< kernels and ops on chunks ("darray.compute")
  user = 4,             ///< application scopes; the default ("user")
};

/// The category's NVTX name: "pool", "darray.transfer", "darray.compute", "user".
[[nodiscard]] std::string_view to_string(category c) noexcept;

namespace detail {

/// What the library knows of a scope name. Lives until the process ends (never freed), so a
/// pointer to it is valid everywhere.
struct site_info {
  std::uint32_t id = 0;               ///< dense id of the name (the profiler's table index)
  category cat = category::user;      ///< the category of the first registration of the name
  const void* nvtx_string = nullptr;  ///< nvtxStringHandle_t, null without an NVTX tool
  std::string_view name;              ///< the interned name
};

/// Bit 0: a function_profiler is active. Bit 1: an NVTX tool is attached. Bit 2: a timeline that
/// records scopes is running. Defined once, in the library (STYLE rule 7).
extern std::atomic<std::uint32_t> g_scope_flags;
/// g_scope_flags bit: a function_profiler is active.
inline constexpr std::uint32_t flag_profiler = 1U;
/// g_scope_flags bit: an NVTX tool is attached.
inline constexpr std::uint32_t flag_nvtx = 2U;
/// g_scope_flags bit: at least one timeline is running with timeline_options::scopes.
inline constexpr std::uint32_t flag_timeline = 4U;

/// The id of lost_site.
inline constexpr std::uint32_t lost_site_id = UINT32_MAX;
/// What register_site gives when the host has no memory to intern a name: scopes opened with it
/// are counted as lost by the function profiler (function_profile::scopes_lost) and by the
/// running timelines (dropped events), and push no NVTX range. Its name is empty.
extern const site_info lost_site;

/// Interns `name` (first registration fixes its category) and registers its NVTX string.
/// Thread-safe; the same name always gives the same object. Never throws: without host memory
/// to intern the name it returns lost_site (and logs it once), so instrumentation cannot end the
/// program; a later call may succeed.
[[nodiscard]] const site_info& register_site(std::string_view name, category c) noexcept;
/// Slow path of opening a scope; returns the flags it acted on (what close must undo).
[[nodiscard]] std::uint32_t open_scope(const site_info& site, stream_view stream,
                                       std::uint32_t flags) noexcept;
/// Slow path of closing a scope opened with `flags` (the value open_scope returned).
void close_scope(const site_info& site, std::uint32_t flags) noexcept;

}  // namespace detail

/// A named place in the code, registered once: what POOLSCOPE_SCOPE keeps in a function-local
/// static. Construct it from a string literal (a char array, so a runtime string cannot be
/// captured by mistake); for run-time names use scope's string_view constructor instead.
///
///   static const poolscope::profiler::scope_site site{"decode", category::user};
///   poolscope::profiler::scope s{site, stream};
///
/// Out of host memory: construction never throws. A site whose name could not be interned is
/// not registered(); its scopes are counted as lost (see detail::lost_site). A site made from a
/// string literal registers itself again the next time a scope of it opens while something
/// records (so a static site made during a memory shortage recovers); one made with named()
/// stays unregistered (it does not keep the name): make it again.
///
/// Ownership: refers to process-lifetime data; copying is cheap. Thread-safe: a literal site's
/// late registration is published atomically.
/// Cost: registration once (a lock, a hash lookup and, with an NVTX tool, one registered string).
class scope_site {
 public:
  /// Registers `name` (a string literal) in category `c` (see register_site).
  template <std::size_t N>
  explicit scope_site(const char (&name)[N], category c = category::user) noexcept  // NOLINT
      : info_(&detail::register_site(std::string_view(name), c)), literal_(name), cat_(c) {}

  /// Registers a name made at run time. Registration costs a lock and a lookup, so keep the site
  /// (a table of sites made once) rather than calling this per scope.
  [[nodiscard]] static scope_site named(std::string_view name,
                                        category c = category::user) noexcept {
    return scope_site(&detail::register_site(name, c), c);
  }

  scope_site(const scope_site& other) noexcept
      : info_(other.info_.load(std::memory_order_acquire)),
        literal_(other.literal_),
        cat_(other.cat_) {}
  scope_site& operator=(const scope_site& other) noexcept {
    info_.store(other.info_.load(std::memory_order_acquire), std::memory_order_release);
    literal_ = other.literal_;
    cat_ = other.cat_;
    return *this;
  }
  ~scope_site() = default;

  /// Whether the name is interned (false only after a registration failed for lack of memory).
  [[nodiscard]] bool registered() const noexcept { return info().id != detail::lost_site_id; }
  /// The name as registered (a literal site's literal even when not registered; empty for a
  /// named() site that is not).
  [[nodiscard]] std::string_view name() const noexcept {
    const detail::site_info& i = info();
    return i.id != detail::lost_site_id || literal_ == nullptr ? i.name
                                                               : std::string_view(literal_);
  }
  /// The registered site (internal; detail::lost_site when not registered).
  [[nodiscard]] const detail::site_info& info() const noexcept {
    return *info_.load(std::memory_order_acquire);
  }
  /// Registers a literal site that is not registered yet (internal: the slow path of opening a
  /// scope of it); returns the site it has now.
  const detail::site_info& register_again() const noexcept {
    const detail::site_info* i = &info();
    if (i->id == detail::lost_site_id && literal_ != nullptr) {
      i = &detail::register_site(std::string_view(literal_), cat_);
      info_.store(i, std::memory_order_release);  // the same object whichever thread wins
    }
    return *i;
  }

 private:
  scope_site(const detail::site_info* info, category c) noexcept : info_(info), cat_(c) {}

  mutable std::atomic<const detail::site_info*> info_;
  const char* literal_ = nullptr;  ///< the string literal, for register_again (null: named())
  category cat_ = category::user;
};

/// An open scope: opens in the constructor, closes in the destructor. Times the host code between
/// them and, with a `stream`, the GPU work enqueued on it (events recorded on `stream` at open and
/// close; the default stream when none is given).
///
///   {
///     poolscope::profiler::scope s{"prefill", poolscope::profiler::category::user, stream};
///     launch(stream);
///   }
///
/// Ownership: owns nothing the caller sees. Not copyable or movable; must be destroyed on the
/// thread that created it, in LIFO order with the thread's other scopes.
/// Stream semantics: GPU time is the span between the events recorded on `stream` at open and
/// close, so it covers the work enqueued on that stream in between (and any wait the stream was
/// already in at open).
/// Cost: see the file comment; the string_view constructor also interns the name (a lock and a
/// hash lookup) on every construction, so prefer the macro or a static scope_site on hot paths.
class scope {
 public:
  /// Opens a scope for a registered site.
  explicit scope(const scope_site& site, stream_view stream = {}) noexcept : site_(&site.info()) {
    const std::uint32_t f = detail::g_scope_flags.load(std::memory_order_relaxed);
    if (f != 0) [[unlikely]] {
      if (site_->id == detail::lost_site_id) [[unlikely]] {
        site_ = &site.register_again();
      }
      flags_ = detail::open_scope(*site_, stream, f);
    }
  }
  /// Opens a scope for a name known only at run time (interned here, see Cost; without host
  /// memory to intern it the scope is counted as lost, see scope_site).
  explicit scope(std::string_view name, category c = category::user,
                 stream_view stream = {}) noexcept
      : site_(&detail::register_site(name, c)) {
    const std::uint32_t f = detail::g_scope_flags.load(std::memory_order_relaxed);
    if (f != 0) [[unlikely]] {
      flags_ = detail::open_scope(*site_, stream, f);
    }
  }
  scope(const scope&) = delete;
  scope& operator=(const scope&) = delete;
  /// Closes the scope (pops the NVTX range, records the times and bytes, adds the timelines'
  /// host slice).
  ~scope() {
    if (flags_ != 0) [[unlikely]] {
      detail::close_scope(*site_, flags_);
    }
  }

 private:
  const detail::site_info* site_;
  std::uint32_t flags_ = 0;
};

}  // namespace poolscope::profiler

#define POOLSCOPE_DETAIL_CONCAT2(a, b) a##b
#define POOLSCOPE_DETAIL_CONCAT(a, b) POOLSCOPE_DETAIL_CONCAT2(a, b)

#if POOLSCOPE_ENABLE_SCOPES
/// Opens a scope named `name` (a string literal) in the category `cat` until the end of the
/// enclosing block; an optional second argument is the stream whose GPU work it times.
#define POOLSCOPE_SCOPE_IN(cat, name, ...)                                                     \
  static const ::poolscope::profiler::scope_site POOLSCOPE_DETAIL_CONCAT(poolscope_site_,      \
                                                                         __LINE__){name, cat}; \
  const ::poolscope::profiler::scope POOLSCOPE_DETAIL_CONCAT(poolscope_scope_, __LINE__) {     \
    POOLSCOPE_DETAIL_CONCAT(poolscope_site_, __LINE__) __VA_OPT__(, ) __VA_ARGS__              \
  }
#else
#define POOLSCOPE_SCOPE_IN(cat, name, ...)
#endif

/// Opens a user-category scope named `name` (a string literal) until the end of the enclosing
/// block; an optional second argument is the stream whose GPU work it times.
///
///   POOLSCOPE_SCOPE("forward");
///   POOLSCOPE_SCOPE("backward", stream);
#define POOLSCOPE_SCOPE(name, ...) \
  POOLSCOPE_SCOPE_IN(::poolscope::profiler::category::user, name __VA_OPT__(, ) __VA_ARGS__)
