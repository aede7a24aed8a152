// The stack seam: see detail/stack_seam.hpp for the contract.
#include "detail/stack_seam.hpp"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/factory.hpp"

#if defined(POOLSCOPE_HAVE_LIBUNWIND)
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#endif

#if defined(POOLSCOPE_HAVE_LIBDW)
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#endif

namespace poolscope::profiler::detail {

// ---------------------------------------------------------------------------------------------
// Unwinding

namespace {

/// The calling thread's stack, found once per thread.
struct stack_bounds {
  std::uintptr_t lo = 0;
  std::uintptr_t hi = 0;
  bool known = false;
};

stack_bounds find_stack_bounds() noexcept {
  stack_bounds b;
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) {
    return b;
  }
  void* addr = nullptr;
  std::size_t size = 0;
  if (pthread_attr_getstack(&attr, &addr, &size) == 0 && addr != nullptr && size != 0) {
    b.lo = reinterpret_cast<std::uintptr_t>(addr);
    b.hi = b.lo + size;
    b.known = true;
  }
  pthread_attr_destroy(&attr);
  return b;
}

const stack_bounds& this_thread_stack() noexcept {
  thread_local const stack_bounds bounds = find_stack_bounds();
  return bounds;
}

// Walks the chain of saved frame pointers: [fp] = caller's fp, [fp + 1 word] = return address.
// Every read is checked against this thread's stack bounds and the chain must grow towards the
// stack's base, so code built without frame pointers yields a short stack, never a fault.
// Not instrumented by AddressSanitizer: a broken chain may point anywhere in the stack.
__attribute__((noinline, no_sanitize_address)) std::size_t walk_frame_pointers(
    std::uintptr_t* out, std::size_t capacity, const stop_ranges* stop) noexcept {
  const stack_bounds& b = this_thread_stack();
  if (!b.known) {
    return 0;
  }
  auto fp = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  std::size_t n = 0;
  // Skip walk_frame_pointers' own frame: its return address is inside capture_stack.
  bool skip_own = true;
  while (n < capacity) {
    if (fp < b.lo || fp + 2 * sizeof(std::uintptr_t) > b.hi || fp % sizeof(std::uintptr_t) != 0) {
      break;
    }
    const auto* frame = reinterpret_cast<const std::uintptr_t*>(fp);
    const std::uintptr_t next = frame[0];
    const std::uintptr_t ret = frame[1];
    if (ret == 0) {
      break;
    }
    if (!skip_own) {
      if (stop != nullptr && stop->contains(ret)) {
        break;
      }
      out[n++] = ret;
    }
    skip_own = false;
    if (next <= fp) {
      break;  // the chain must move towards the stack's base
    }
    fp = next;
  }
  return n;
}

}  // namespace

bool on_this_thread_stack(std::uintptr_t address, std::size_t bytes) noexcept {
  const stack_bounds& b = this_thread_stack();
  return b.known && address >= b.lo && address <= b.hi && bytes <= b.hi - address;
}

bool unwind_backend_available(unwind_backend b) noexcept {
  switch (b) {
    case unwind_backend::frame_pointer:
    case unwind_backend::glibc_backtrace:
      return true;
    case unwind_backend::libunwind:
#if defined(POOLSCOPE_HAVE_LIBUNWIND)
      return true;
#else
      return false;
#endif
    case unwind_backend::cached_dwarf:
      return cached_dwarf_supported();
  }
  return false;
}

unwind_backend default_unwind_backend() noexcept {
  // The cached DWARF walker first: it is the fastest exact walker (docs/perf.md, "Stack
  // walkers"; bench/line_profiler_bench.cpp), needs no library (so builds with and without
  // libunwind behave the same), and keeps no thread-exit destructor in another library
  // (libunwind's per-thread cache destructor crashes under ThreadSanitizer).
  if (cached_dwarf_supported()) {
    return unwind_backend::cached_dwarf;
  }
  return unwind_backend_available(unwind_backend::libunwind) ? unwind_backend::libunwind
                                                             : unwind_backend::glibc_backtrace;
}

const char* unwind_backend_name(unwind_backend b) noexcept {
  switch (b) {
    case unwind_backend::frame_pointer:
      return "frame_pointer";
    case unwind_backend::libunwind:
      return "libunwind";
    case unwind_backend::glibc_backtrace:
      return "glibc_backtrace";
    case unwind_backend::cached_dwarf:
      return "cached_dwarf";
  }
  return "unknown";
}

void warm_up(unwind_backend b) noexcept {
  std::uintptr_t frames[8];
  (void)capture_stack(b, frames, 8);
}

__attribute__((noinline)) std::size_t capture_stack(unwind_backend b, std::uintptr_t* out,
                                                    std::size_t capacity,
                                                    const stop_ranges* stop) noexcept {
  if (capacity == 0) {
    return 0;
  }
  // The stack unwinders report their caller's frame (this function) first; ask for one more and
  // drop it so every backend starts at capture_stack's caller.
  constexpr std::size_t max_frames = 256;
  void* raw[max_frames + 1];
  const std::size_t want = (capacity < max_frames ? capacity : max_frames) + 1;
  int got = 0;
  switch (b) {
    case unwind_backend::frame_pointer: {
      const std::size_t n = walk_frame_pointers(out, capacity, stop);
      // Keep the call from being a tail call, so walk_frame_pointers' return address is here.
      asm volatile("" ::: "memory");
      return n;
    }
    case unwind_backend::cached_dwarf: {
      const std::size_t n = walk_cached_dwarf(out, capacity, stop);
      asm volatile("" ::: "memory");  // as above: the walker drops its return address into here
      return n;
    }
    case unwind_backend::libunwind:
#if defined(POOLSCOPE_HAVE_LIBUNWIND)
      got = unw_backtrace(raw, static_cast<int>(want));
      break;
#else
      return 0;
#endif
    case unwind_backend::glibc_backtrace:
      got = ::backtrace(raw, static_cast<int>(want));
      break;
  }
  if (got <= 1) {
    return 0;
  }
  const auto n = static_cast<std::size_t>(got) - 1;
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = reinterpret_cast<std::uintptr_t>(raw[i + 1]);
    if (stop != nullptr && stop->contains(out[i])) {
      return i;
    }
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// poolscope's own code

namespace {

constexpr std::size_t builtin_probes = 3;

struct range_search {
  std::uintptr_t probes[builtin_probes + own_code_ranges::max_extra];
  std::size_t probe_count;
  bool found[builtin_probes + own_code_ranges::max_extra];
  std::uintptr_t* lo;
  std::uintptr_t* hi;
  std::size_t* count;
  std::size_t capacity;
};

int collect_ranges(dl_phdr_info* info, std::size_t /*size*/, void* data) noexcept {
  auto* s = static_cast<range_search*>(data);
  // The main executable (empty name) is skipped: in a static build it holds the application too.
  if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') {
    return 0;
  }
  bool ours = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) {
      continue;
    }
    const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    const std::uintptr_t hi = lo + ph.p_memsz;
    for (std::size_t p = 0; p < s->probe_count; ++p) {
      if (s->probes[p] >= lo && s->probes[p] < hi) {
        s->found[p] = true;
        ours = true;
      }
    }
  }
  if (!ours) {
    return 0;
  }
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0 || *s->count == s->capacity) {
      continue;
    }
    // Each object is visited once, so its ranges are added once however many probes it holds.
    s->lo[*s->count] = info->dlpi_addr + ph.p_vaddr;
    s->hi[*s->count] = info->dlpi_addr + ph.p_vaddr + ph.p_memsz;
    ++*s->count;
  }
  return 0;
}

}  // namespace

own_code_ranges::own_code_ranges(std::span<const void* const> extra) noexcept {
  range_search s{};
  s.probes[0] = reinterpret_cast<std::uintptr_t>(&capture_stack);
  s.probes[1] = reinterpret_cast<std::uintptr_t>(&hooks::detail::deliver);
  using make_allocator_fn = std::unique_ptr<pool::allocator> (*)(std::string_view, pool::resource&);
  s.probes[2] =
      reinterpret_cast<std::uintptr_t>(static_cast<make_allocator_fn>(&pool::make_allocator));
  const std::size_t extras = std::min(extra.size(), max_extra);
  for (std::size_t i = 0; i < extras; ++i) {
    s.probes[builtin_probes + i] = reinterpret_cast<std::uintptr_t>(extra[i]);
  }
  s.probe_count = builtin_probes + extras;
  s.lo = lo_;
  s.hi = hi_;
  s.count = &count_;
  s.capacity = max_ranges;
  dl_iterate_phdr(&collect_ranges, &s);
  for (std::size_t i = 0; i < extras && extra_missing_ == max_extra; ++i) {
    if (!s.found[builtin_probes + i]) {
      extra_missing_ = i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Symbolization

std::string demangle(const char* name) {
  if (name == nullptr) {
    return {};
  }
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status == 0 && d != nullptr) {
    std::string out(d);
    std::free(d);
    return out;
  }
  std::free(d);
  return name;
}

namespace {

symbol resolve_with_dladdr(std::uintptr_t return_address) {
  symbol s;
  Dl_info info{};
  const std::uintptr_t pc = return_address - 1;
  if (dladdr(reinterpret_cast<void*>(pc), &info) == 0) {
    return s;
  }
  if (info.dli_fname != nullptr) {
    s.module = info.dli_fname;
  }
  s.offset = return_address - reinterpret_cast<std::uintptr_t>(info.dli_fbase);
  if (info.dli_sname != nullptr) {
    s.function = demangle(info.dli_sname);
  }
  return s;
}

#if defined(POOLSCOPE_HAVE_LIBDW)
char* g_debuginfo_path = nullptr;

// Separate debuginfo from local disk only: with DEBUGINFOD_URLS set, the standard lookup would
// ask a debuginfod server and could block on the network, so only the local build-id tree is
// searched then.
int find_debuginfo_locally(Dwfl_Module* mod, void** userdata, const char* modname, Dwarf_Addr base,
                           const char* file_name, const char* debuglink_file,
                           GElf_Word debuglink_crc, char** debuginfo_file_name) {
  const char* urls = std::getenv("DEBUGINFOD_URLS");
  if (urls != nullptr && urls[0] != '\0') {
    return dwfl_build_id_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file,
                                        debuglink_crc, debuginfo_file_name);
  }
  return dwfl_standard_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file,
                                      debuglink_crc, debuginfo_file_name);
}

const Dwfl_Callbacks g_callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = find_debuginfo_locally,
    .section_address = nullptr,
    .debuginfo_path = &g_debuginfo_path,
};
#endif

}  // namespace

struct symbolizer::impl {
#if defined(POOLSCOPE_HAVE_LIBDW)
  Dwfl* dwfl = nullptr;
#endif
  std::unordered_map<std::uintptr_t, symbol> cache;
};

symbolizer::symbolizer() : impl_(std::make_unique<impl>()) {
#if defined(POOLSCOPE_HAVE_LIBDW)
  Dwfl* d = dwfl_begin(&g_callbacks);
  if (d != nullptr) {
    dwfl_report_begin(d);
    const int rc = dwfl_linux_proc_report(d, getpid());
    if (dwfl_report_end(d, nullptr, nullptr) != 0 || rc != 0) {
      dwfl_end(d);
      d = nullptr;
    }
  }
  impl_->dwfl = d;
#endif
}

symbolizer::~symbolizer() {
#if defined(POOLSCOPE_HAVE_LIBDW)
  if (impl_->dwfl != nullptr) {
    dwfl_end(impl_->dwfl);
  }
#endif
}

const char* symbolizer::backend() const noexcept {
#if defined(POOLSCOPE_HAVE_LIBDW)
  if (impl_->dwfl != nullptr) {
    return "libdw";
  }
#endif
  return "dladdr";
}

symbol symbolizer::resolve(std::uintptr_t return_address) {
  auto cached = impl_->cache.find(return_address);
  if (cached != impl_->cache.end()) {
    return cached->second;
  }
  symbol s;
#if defined(POOLSCOPE_HAVE_LIBDW)
  if (impl_->dwfl != nullptr && return_address != 0) {
    const Dwarf_Addr pc = return_address - 1;  // the call instruction, not the one after it
    Dwfl_Module* mod = dwfl_addrmodule(impl_->dwfl, pc);
    if (mod != nullptr) {
      Dwarf_Addr start = 0;
      const char* name =
          dwfl_module_info(mod, nullptr, &start, nullptr, nullptr, nullptr, nullptr, nullptr);
      if (name != nullptr) {
        s.module = name;
      }
      Dwarf_Addr bias = 0;
      if (dwfl_module_getelf(mod, &bias) != nullptr) {
        s.offset = return_address - bias;
      } else {
        s.offset = return_address - start;
      }
      GElf_Off sym_offset = 0;
      GElf_Sym sym{};
      const char* fn = dwfl_module_addrinfo(mod, pc, &sym_offset, &sym, nullptr, nullptr, nullptr);
      if (fn != nullptr) {
        // ELF symbol versions ("__libc_start_main@@GLIBC_2.34") are not part of the name.
        std::string plain(fn);
        if (const auto at = plain.find('@'); at != std::string::npos && at > 0) {
          plain.resize(at);
        }
        s.function = demangle(plain.c_str());
      }
      // Only trust a line table whose compile unit really covers pc: for code without DWARF
      // (crt1's _start, stripped objects) libdw may otherwise answer with a neighbour's line.
      Dwarf_Addr cu_bias = 0;
      Dwarf_Die* cu = dwfl_module_addrdie(mod, pc, &cu_bias);
      Dwfl_Line* line = nullptr;
      if (cu != nullptr && dwarf_haspc(cu, pc - cu_bias) == 1) {
        line = dwfl_module_getsrc(mod, pc);
      }
      if (line != nullptr) {
        int lineno = 0;
        const char* src = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
        if (src != nullptr) {
          s.file = src;
          s.line = lineno;
        }
      }
    }
  }
#endif
  if (s.module.empty() && s.function.empty()) {
    s = resolve_with_dladdr(return_address);
  } else if (s.function.empty()) {
    // libdw knew the module but not the function (a stripped object): dladdr may know it.
    symbol d = resolve_with_dladdr(return_address);
    s.function = std::move(d.function);
  }
  impl_->cache.emplace(return_address, s);
  return s;
}

}  // namespace poolscope::profiler::detail
