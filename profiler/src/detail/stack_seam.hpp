// The profiler's one seam to the platform's stack machinery: unwinding (frame pointers,
// libunwind, glibc backtrace) and symbolization (libdw, dladdr). Everything above it is plain
// C++ and is tested on any machine.
//
// Preconditions and error conventions:
// - Nothing here throws except symbolizer's constructor and resolve(), which may throw
//   std::bad_alloc only; every platform failure is reported by a degraded result (a shorter
//   stack, a symbol with empty fields), never by an exception, a crash or a hang.
// - capture_stack is async-signal-unsafe (libunwind and glibc may take locks on first use) but
//   thread-safe and allocation-free after warm_up(method) ran once in the process.
// - Which backends exist is decided at build time: POOLSCOPE_HAVE_LIBUNWIND and
//   POOLSCOPE_HAVE_LIBDW are set by profiler/CMakeLists.txt when pkg-config found them. The frame
//   pointer walk and glibc backtrace() are always compiled in.
// - Return addresses are what the unwinders give: the instruction after each call. Callers that
//   want the call site's line subtract one before symbolizing (symbolizer does it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace poolscope::profiler::detail {

/// How to walk the stack. The public enum (line_profiler.hpp) maps onto this one.
enum class unwind_backend : std::uint8_t {
  frame_pointer,
  libunwind,
  glibc_backtrace,
  cached_dwarf
};

/// True if `b` was compiled in.
[[nodiscard]] bool unwind_backend_available(unwind_backend b) noexcept;
/// The best backend compiled in: the cached DWARF walker (x86-64), else libunwind when present,
/// else glibc backtrace.
[[nodiscard]] unwind_backend default_unwind_backend() noexcept;
/// "frame_pointer", "libunwind", "glibc_backtrace", "cached_dwarf".
[[nodiscard]] const char* unwind_backend_name(unwind_backend b) noexcept;

/// Runs `b` once so that lazy initialisation (loading libgcc_s, libunwind's caches, the thread's
/// stack bounds) happens here and not inside the first hook call. Never throws.
void warm_up(unwind_backend b) noexcept;

/// Code address ranges where a walk ends: the frame whose return address lies in one, and those
/// below it, are not written (where a native stack enters an interpreter whose own frames stand
/// in for the rest). The cached DWARF and frame-pointer walks stop there; the others walk on
/// and the stack is cut there.
struct stop_ranges {
  static constexpr std::size_t max = 4;
  std::uintptr_t lo[max] = {};
  std::uintptr_t hi[max] = {};
  std::size_t count = 0;
  [[nodiscard]] bool contains(std::uintptr_t address) const noexcept {
    for (std::size_t i = 0; i < count; ++i) {
      if (address >= lo[i] && address < hi[i]) {
        return true;
      }
    }
    return false;
  }
};

/// Writes up to `capacity` return addresses into `out`, innermost first; the first one is in the
/// caller of capture_stack. Returns how many were written (0 if the backend is unavailable).
/// With `stop`, the stack ends before the first return address in it.
/// The frame-pointer walk stays inside the calling thread's stack bounds, so it cannot fault
/// even on code built without frame pointers (it then returns a short or partial stack).
std::size_t capture_stack(unwind_backend b, std::uintptr_t* out, std::size_t capacity,
                          const stop_ranges* stop = nullptr) noexcept;

/// True if [address, address + bytes) lies in the calling thread's stack (its bounds found once
/// per thread); false if they cannot be found.
[[nodiscard]] bool on_this_thread_stack(std::uintptr_t address, std::size_t bytes) noexcept;

/// True on x86-64, where walk_cached_dwarf works (cached_dwarf_unwinder.cpp).
[[nodiscard]] bool cached_dwarf_supported() noexcept;
/// The cached DWARF walker: follows .eh_frame call-frame rules (found through libgcc's
/// _Unwind_Find_FDE, parsed once per return address and kept in a per-thread cache). Writes the
/// return addresses above its caller's frame, innermost first; stops early at frames it cannot
/// describe (signal trampolines, DWARF expressions). Reads only inside the thread's stack.
/// With `stop`, ends before the first return address in it.
std::size_t walk_cached_dwarf(std::uintptr_t* out, std::size_t capacity,
                              const stop_ranges* stop = nullptr) noexcept;

/// Address ranges (executable segments) of the shared objects holding poolscope's hooks, pool
/// and profiler code, and of those holding the `extra` code addresses (a library wrapping
/// poolscope's allocators, such as the C ABI plug-in). Used to drop poolscope's own frames from
/// the top of a stack.
class own_code_ranges {
 public:
  /// Most extra addresses accepted; more are ignored (the line profiler refuses them first).
  static constexpr std::size_t max_extra = 8;

  /// Finds the ranges. Objects linked into the main executable (static builds) are not
  /// included: there, address ranges cannot tell poolscope from the application.
  explicit own_code_ranges(std::span<const void* const> extra = {}) noexcept;
  /// True if `address` lies in one of poolscope's shared objects.
  [[nodiscard]] bool contains(std::uintptr_t address) const noexcept {
    for (std::size_t i = 0; i < count_; ++i) {
      if (address >= lo_[i] && address < hi_[i]) {
        return true;
      }
    }
    return false;
  }
  /// Number of ranges found (0 in static builds).
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  /// The index of the first extra address found in no shared object (the main executable's
  /// code, or no code at all), or max_extra if every one was found.
  [[nodiscard]] std::size_t first_extra_not_found() const noexcept { return extra_missing_; }

 private:
  static constexpr std::size_t max_ranges = 24;
  std::uintptr_t lo_[max_ranges] = {};
  std::uintptr_t hi_[max_ranges] = {};
  std::size_t count_ = 0;
  std::size_t extra_missing_ = max_extra;
};

/// What is known about one return address. Empty strings / zero line mean "unknown".
struct symbol {
  std::string function;      ///< demangled function name
  std::string file;          ///< source file of the call site
  int line = 0;              ///< source line of the call site
  std::string module;        ///< path of the shared object or executable
  std::uint64_t offset = 0;  ///< address - module load base
};

/// Turns return addresses of this process into symbols. Uses libdw (DWARF line tables and ELF
/// symbol tables) when compiled in and usable, else dladdr (exported symbols, module+offset).
/// Separate debuginfo is looked up only on local disk: debuginfod is never contacted, so
/// symbolization cannot wait on a network.
/// Thread safety: not thread-safe; use one per thread. Cost: opens the process's modules once
/// (libdw), then a few microseconds per address.
class symbolizer {
 public:
  symbolizer();
  ~symbolizer();
  symbolizer(const symbolizer&) = delete;
  symbolizer& operator=(const symbolizer&) = delete;

  /// Symbol of the call that returns to `return_address`.
  [[nodiscard]] symbol resolve(std::uintptr_t return_address);
  /// "libdw" or "dladdr".
  [[nodiscard]] const char* backend() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Demangles a C++ symbol name; returns it unchanged if it is not a mangled name.
[[nodiscard]] std::string demangle(const char* name);

}  // namespace poolscope::profiler::detail
