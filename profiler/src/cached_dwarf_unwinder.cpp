// The cached DWARF unwinder of the stack seam (detail/stack_seam.hpp): walks the stack with the
// call-frame information (.eh_frame) that every x86-64 object carries, like libunwind, and
// remembers the rule found for each return address in a per-thread cache, so a stack seen before
// costs a table lookup and two loads per frame. Needs no library beyond libgcc, whose
// _Unwind_Find_FDE finds the frame description entry of an address.
//
// Only x86-64 is supported (elsewhere the backend reports itself unavailable). Frames whose rule
// cannot be expressed as "CFA = rsp/rbp + offset, rbp saved at CFA + offset or kept, return
// address at CFA - 8" (signal trampolines, DWARF expressions) end the walk: the stack comes out
// short, never wrong. Every memory read is checked against the thread's stack bounds.
#include <pthread.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "detail/stack_seam.hpp"

#if defined(__x86_64__)

extern "C" {
/// libgcc's lookup of the FDE covering `pc` (exported by libgcc_s since GCC 3.0).
struct poolscope_dwarf_eh_bases {
  void* tbase;
  void* dbase;
  void* func;
};
const void* _Unwind_Find_FDE(void* pc, poolscope_dwarf_eh_bases* bases);
}

namespace poolscope::profiler::detail {
namespace {

// DWARF register numbers on x86-64.
constexpr unsigned reg_rbp = 6;
constexpr unsigned reg_rsp = 7;
constexpr unsigned reg_ra = 16;

/// How to step out of a frame at one pc, packed into 64 bits.
///   bit 0 valid, bit 1 CFA from rbp (else rsp), bit 2 rbp saved, bit 3 last frame (RA undefined)
///   bits 8..39 CFA offset (int32), bits 40..55 rbp save offset from CFA (int16)
using packed_rule = std::uint64_t;
constexpr packed_rule rule_valid = 1;
constexpr packed_rule rule_cfa_rbp = 2;
constexpr packed_rule rule_rbp_saved = 4;
constexpr packed_rule rule_last = 8;
constexpr packed_rule rule_invalid = 0;

packed_rule pack(bool cfa_rbp, std::int64_t cfa_off, bool rbp_saved, std::int64_t rbp_off,
                 bool last) {
  if (cfa_off < INT32_MIN || cfa_off > INT32_MAX || rbp_off < INT16_MIN || rbp_off > INT16_MAX) {
    return rule_invalid;
  }
  packed_rule r = rule_valid;
  r |= cfa_rbp ? rule_cfa_rbp : 0;
  r |= rbp_saved ? rule_rbp_saved : 0;
  r |= last ? rule_last : 0;
  r |= static_cast<packed_rule>(static_cast<std::uint32_t>(static_cast<std::int32_t>(cfa_off)))
       << 8;
  r |= static_cast<packed_rule>(static_cast<std::uint16_t>(static_cast<std::int16_t>(rbp_off)))
       << 40;
  return r;
}
std::int64_t cfa_offset(packed_rule r) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(r >> 8));
}
std::int64_t rbp_offset(packed_rule r) {
  return static_cast<std::int16_t>(static_cast<std::uint16_t>(r >> 40));
}

// ---- reading .eh_frame ------------------------------------------------------------------------

class reader {
 public:
  reader(const std::uint8_t* p, const std::uint8_t* end) : p_(p), end_(end) {}
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] bool more() const { return ok_ && p_ < end_; }
  [[nodiscard]] const std::uint8_t* pos() const { return p_; }

  std::uint64_t u(std::size_t n) {
    if (static_cast<std::size_t>(end_ - p_) < n) {
      ok_ = false;
      return 0;
    }
    std::uint64_t v = 0;
    std::memcpy(&v, p_, n);  // little endian
    p_ += n;
    return v;
  }
  std::uint64_t uleb() {
    std::uint64_t v = 0;
    unsigned shift = 0;
    while (true) {
      if (p_ >= end_ || shift > 63) {
        ok_ = false;
        return 0;
      }
      const std::uint8_t b = *p_++;
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if ((b & 0x80) == 0) {
        return v;
      }
    }
  }
  std::int64_t sleb() {
    std::int64_t v = 0;
    unsigned shift = 0;
    std::uint8_t b = 0;
    do {
      if (p_ >= end_ || shift > 63) {
        ok_ = false;
        return 0;
      }
      b = *p_++;
      v |= static_cast<std::int64_t>(static_cast<std::uint64_t>(b & 0x7f) << shift);
      shift += 7;
    } while ((b & 0x80) != 0);
    if (shift < 64 && (b & 0x40) != 0) {
      v |= static_cast<std::int64_t>(~std::uint64_t{0} << shift);
    }
    return v;
  }
  /// Skips a pointer in DW_EH_PE encoding `enc`; returns false for encodings it cannot size.
  bool skip_encoded(std::uint8_t enc) {
    if (enc == 0xff) {  // DW_EH_PE_omit
      return true;
    }
    switch (enc & 0x0f) {
      case 0x00:
        u(8);
        return ok_;
      case 0x01:
        uleb();
        return ok_;
      case 0x02:
      case 0x0a:
        u(2);
        return ok_;
      case 0x03:
      case 0x0b:
        u(4);
        return ok_;
      case 0x04:
      case 0x0c:
        u(8);
        return ok_;
      case 0x09:
        sleb();
        return ok_;
      default:
        ok_ = false;
        return false;
    }
  }
  void skip(std::uint64_t n) {
    if (static_cast<std::uint64_t>(end_ - p_) < n) {
      ok_ = false;
      return;
    }
    p_ += n;
  }
  void fail() { ok_ = false; }

 private:
  const std::uint8_t* p_;
  const std::uint8_t* end_;
  bool ok_ = true;
};

/// The rules the walk needs, as the CFA program leaves them.
struct cfa_state {
  unsigned cfa_reg = reg_rsp;
  std::int64_t cfa_off = 8;
  enum class where : std::uint8_t { same, offset, undefined, unsupported };
  where rbp = where::same;
  std::int64_t rbp_off = 0;
  where ra = where::offset;
  std::int64_t ra_off = -8;
  bool bad = false;
};

struct cie_info {
  std::uint64_t code_align = 1;
  std::int64_t data_align = -8;
  std::uint64_t ra_reg = reg_ra;
  std::uint8_t fde_encoding = 0;
  bool has_z = false;
  const std::uint8_t* insns = nullptr;
  const std::uint8_t* end = nullptr;
};

bool parse_cie(const std::uint8_t* cie, cie_info& out) {
  std::uint32_t length = 0;
  std::memcpy(&length, cie, 4);
  if (length == 0 || length == 0xffffffffu) {
    return false;  // 64-bit DWARF is not used in .eh_frame on x86-64
  }
  reader r(cie + 4, cie + 4 + length);
  if (r.u(4) != 0) {
    return false;  // not a CIE
  }
  const auto version = static_cast<std::uint8_t>(r.u(1));
  if (version != 1 && version != 3) {
    return false;
  }
  const char* aug = reinterpret_cast<const char*>(r.pos());
  const std::size_t aug_len = strnlen(aug, 16);
  r.skip(aug_len + 1);
  out.code_align = r.uleb();
  out.data_align = r.sleb();
  out.ra_reg = version == 1 ? r.u(1) : r.uleb();
  if (aug[0] == 'z') {
    out.has_z = true;
    const std::uint64_t len = r.uleb();
    const std::uint8_t* aug_end = r.pos() + len;
    for (std::size_t i = 1; i < aug_len && r.ok(); ++i) {
      switch (aug[i]) {
        case 'R':
          out.fde_encoding = static_cast<std::uint8_t>(r.u(1));
          break;
        case 'P': {
          const auto enc = static_cast<std::uint8_t>(r.u(1));
          r.skip_encoded(enc);
          break;
        }
        case 'L':
          r.u(1);
          break;
        case 'S':
          return false;  // a signal frame: its registers are not where calls leave them
        default:
          i = aug_len;  // unknown letters: the length says where the data ends
          break;
      }
    }
    if (!r.ok() || aug_end > cie + 4 + length) {
      return false;
    }
    out.insns = aug_end;
  } else if (aug_len != 0) {
    return false;  // an augmentation we cannot skip
  } else {
    out.insns = r.pos();
  }
  out.end = cie + 4 + length;
  return r.ok() && out.ra_reg == reg_ra;
}

/// Runs a CFA program from `loc` until the location passes `pc`. Returns false to stop early.
bool run_cfa(reader r, const cie_info& cie, std::uintptr_t& loc, std::uintptr_t pc, cfa_state& s,
             const cfa_state& initial) {
  constexpr int max_remembered = 8;
  cfa_state remembered[max_remembered];
  int depth = 0;
  auto set_rule = [&](std::uint64_t reg, cfa_state::where w, std::int64_t off) {
    if (reg == reg_rbp) {
      s.rbp = w;
      s.rbp_off = off;
    } else if (reg == cie.ra_reg) {
      s.ra = w;
      s.ra_off = off;
    }
  };
  while (r.more()) {
    const auto op = static_cast<std::uint8_t>(r.u(1));
    const std::uint8_t high = op & 0xc0;
    const std::uint8_t low = op & 0x3f;
    std::uint64_t advance = 0;
    if (high == 0x40) {
      advance = low * cie.code_align;
    } else if (high == 0x80) {
      set_rule(low, cfa_state::where::offset, static_cast<std::int64_t>(r.uleb()) * cie.data_align);
    } else if (high == 0xc0) {
      if (low == reg_rbp) {
        s.rbp = initial.rbp;
        s.rbp_off = initial.rbp_off;
      } else if (low == cie.ra_reg) {
        s.ra = initial.ra;
        s.ra_off = initial.ra_off;
      }
    } else {
      switch (op) {
        case 0x00:  // nop
          break;
        case 0x02:  // advance_loc1
          advance = r.u(1) * cie.code_align;
          break;
        case 0x03:  // advance_loc2
          advance = r.u(2) * cie.code_align;
          break;
        case 0x04:  // advance_loc4
          advance = r.u(4) * cie.code_align;
          break;
        case 0x05: {  // offset_extended
          const std::uint64_t reg = r.uleb();
          set_rule(reg, cfa_state::where::offset,
                   static_cast<std::int64_t>(r.uleb()) * cie.data_align);
          break;
        }
        case 0x06: {  // restore_extended
          const std::uint64_t reg = r.uleb();
          if (reg == reg_rbp) {
            s.rbp = initial.rbp;
            s.rbp_off = initial.rbp_off;
          } else if (reg == cie.ra_reg) {
            s.ra = initial.ra;
            s.ra_off = initial.ra_off;
          }
          break;
        }
        case 0x07:  // undefined
          set_rule(r.uleb(), cfa_state::where::undefined, 0);
          break;
        case 0x08:  // same_value
          set_rule(r.uleb(), cfa_state::where::same, 0);
          break;
        case 0x09: {  // register: a value kept in another register
          const std::uint64_t reg = r.uleb();
          r.uleb();
          set_rule(reg, cfa_state::where::unsupported, 0);
          break;
        }
        case 0x0a:  // remember_state
          if (depth == max_remembered) {
            s.bad = true;
            return false;
          }
          remembered[depth++] = s;
          break;
        case 0x0b:  // restore_state: the whole row, CFA rule included (as libgcc does; GCC's
                    // epilogues rely on it)
          if (depth == 0) {
            s.bad = true;
            return false;
          }
          s = remembered[--depth];
          break;
        case 0x0c:  // def_cfa
          s.cfa_reg = static_cast<unsigned>(r.uleb());
          s.cfa_off = static_cast<std::int64_t>(r.uleb());
          break;
        case 0x0d:  // def_cfa_register
          s.cfa_reg = static_cast<unsigned>(r.uleb());
          break;
        case 0x0e:  // def_cfa_offset
          s.cfa_off = static_cast<std::int64_t>(r.uleb());
          break;
        case 0x0f:  // def_cfa_expression
          s.bad = true;
          return false;
        case 0x10: {  // expression
          const std::uint64_t reg = r.uleb();
          r.skip(r.uleb());
          set_rule(reg, cfa_state::where::unsupported, 0);
          break;
        }
        case 0x11: {  // offset_extended_sf
          const std::uint64_t reg = r.uleb();
          set_rule(reg, cfa_state::where::offset, r.sleb() * cie.data_align);
          break;
        }
        case 0x12:  // def_cfa_sf
          s.cfa_reg = static_cast<unsigned>(r.uleb());
          s.cfa_off = r.sleb() * cie.data_align;
          break;
        case 0x13:  // def_cfa_offset_sf
          s.cfa_off = r.sleb() * cie.data_align;
          break;
        case 0x14:    // val_offset
        case 0x15: {  // val_offset_sf
          const std::uint64_t reg = r.uleb();
          if (op == 0x14) {
            r.uleb();
          } else {
            r.sleb();
          }
          set_rule(reg, cfa_state::where::unsupported, 0);
          break;
        }
        case 0x16: {  // val_expression
          const std::uint64_t reg = r.uleb();
          r.skip(r.uleb());
          set_rule(reg, cfa_state::where::unsupported, 0);
          break;
        }
        case 0x2e:  // GNU_args_size
          r.uleb();
          break;
        case 0x2f: {  // GNU_negative_offset_extended
          const std::uint64_t reg = r.uleb();
          set_rule(reg, cfa_state::where::offset,
                   -static_cast<std::int64_t>(r.uleb()) * cie.data_align);
          break;
        }
        default:  // set_loc and anything unknown: give up on this frame
          s.bad = true;
          return false;
      }
    }
    if (!r.ok()) {
      s.bad = true;
      return false;
    }
    if (advance != 0) {
      if (loc + advance > pc) {
        return true;  // the row for pc is complete
      }
      loc += advance;
    }
  }
  return r.ok();
}

/// The rule for stepping out of the frame executing at `pc` (exact for the innermost frame,
/// return address - 1 for the others).
packed_rule find_rule(std::uintptr_t pc) {
  poolscope_dwarf_eh_bases bases{};
  const auto* fde =
      static_cast<const std::uint8_t*>(_Unwind_Find_FDE(reinterpret_cast<void*>(pc), &bases));
  if (fde == nullptr) {
    return rule_invalid;
  }
  std::uint32_t length = 0;
  std::memcpy(&length, fde, 4);
  if (length == 0 || length == 0xffffffffu) {
    return rule_invalid;
  }
  std::int32_t cie_delta = 0;
  std::memcpy(&cie_delta, fde + 4, 4);
  const std::uint8_t* cie_ptr = fde + 4 - cie_delta;
  cie_info cie;
  if (!parse_cie(cie_ptr, cie)) {
    return rule_invalid;
  }
  reader fr(fde + 8, fde + 4 + length);
  // pc_begin is known from bases.func; skip it and pc_range (same size, no application bits).
  fr.skip_encoded(cie.fde_encoding & 0x0f);
  fr.skip_encoded(cie.fde_encoding & 0x0f);
  if (cie.has_z) {
    fr.skip(fr.uleb());
  }
  if (!fr.ok()) {
    return rule_invalid;
  }
  cfa_state s;
  std::uintptr_t loc = reinterpret_cast<std::uintptr_t>(bases.func);
  if (!run_cfa(reader(cie.insns, cie.end), cie, loc, pc, s, s) && s.bad) {
    return rule_invalid;
  }
  const cfa_state initial = s;
  if (!run_cfa(fr, cie, loc, pc, s, initial) && s.bad) {
    return rule_invalid;
  }
  if (s.bad || (s.cfa_reg != reg_rsp && s.cfa_reg != reg_rbp) ||
      s.rbp == cfa_state::where::unsupported || s.rbp == cfa_state::where::undefined ||
      s.ra == cfa_state::where::unsupported) {
    return rule_invalid;
  }
  if (s.ra == cfa_state::where::offset && s.ra_off != -8) {
    return rule_invalid;  // the return address is where call put it, or the walk stops
  }
  return pack(s.cfa_reg == reg_rbp, s.cfa_off, s.rbp == cfa_state::where::offset, s.rbp_off,
              s.ra == cfa_state::where::undefined);
}

// ---- the per-thread cache ---------------------------------------------------------------------

struct rule_cache {
  static constexpr std::size_t slots = 4096;  // 64 KiB per thread that captures stacks
  struct entry {
    std::uintptr_t pc = 0;
    packed_rule rule = rule_invalid;
  };
  entry table[slots];

  packed_rule lookup(std::uintptr_t pc) {
    entry& e = table[(pc ^ (pc >> 12)) % slots];
    if (e.pc != pc) {
      e.rule = find_rule(pc);
      e.pc = pc;
    }
    return e.rule;
  }
};

struct stack_range {
  std::uintptr_t lo = 0;
  std::uintptr_t hi = 0;
};

stack_range find_stack_range() noexcept {
  stack_range b;
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) {
    return b;
  }
  void* addr = nullptr;
  std::size_t size = 0;
  if (pthread_attr_getstack(&attr, &addr, &size) == 0 && addr != nullptr) {
    b.lo = reinterpret_cast<std::uintptr_t>(addr);
    b.hi = b.lo + size;
  }
  pthread_attr_destroy(&attr);
  return b;
}

struct thread_unwind_state {
  stack_range stack = find_stack_range();
  rule_cache cache;
};

thread_unwind_state* this_thread_state() noexcept {
  thread_local std::unique_ptr<thread_unwind_state> state;
  if (!state) {
    try {
      state = std::make_unique<thread_unwind_state>();
    } catch (...) {
      return nullptr;
    }
  }
  return state.get();
}

}  // namespace

bool cached_dwarf_supported() noexcept {
  return true;
}

// Not instrumented by AddressSanitizer: the walk reads saved registers in other frames.
__attribute__((noinline, no_sanitize_address)) std::size_t walk_cached_dwarf(
    std::uintptr_t* out, std::size_t capacity, const stop_ranges* stop) noexcept {
  thread_unwind_state* ts = this_thread_state();
  if (ts == nullptr || ts->stack.hi == 0) {
    return 0;
  }
  std::uintptr_t rip = 0;
  std::uintptr_t rsp = 0;
  std::uintptr_t rbp = 0;
  asm volatile(
      "lea 0(%%rip), %0\n\t"
      "mov %%rsp, %1\n\t"
      "mov %%rbp, %2"
      : "=r"(rip), "=r"(rsp), "=r"(rbp));
  const std::uintptr_t lo = ts->stack.lo;
  const std::uintptr_t hi = ts->stack.hi;
  // Every read lies in [lo, hi). rsp starts there, 8-aligned (anything else, such as an alternate
  // signal stack, gets no walk), and each step moves it up to a CFA that is 8-aligned, above it
  // and at most hi: one unsigned comparison checks a step, and the return address at CFA - 8 is
  // then at or above the old rsp, inside the stack.
  if (capacity == 0 || rsp < lo || rsp >= hi || rsp % 8 != 0) {
    return 0;
  }
  std::size_t n = 0;
  bool keep = false;  // the first step leaves this function: its return address is dropped
  packed_rule rule = ts->cache.lookup(rip);
  while (true) {
    if ((rule & (rule_valid | rule_last)) != rule_valid) {
      break;  // no rule for this pc, or the outermost frame
    }
    const std::uintptr_t base = (rule & rule_cfa_rbp) != 0 ? rbp : rsp;
    const std::uintptr_t cfa = base + static_cast<std::uintptr_t>(cfa_offset(rule));
    if (cfa - rsp - 1 >= hi - rsp || cfa % 8 != 0) {
      break;  // the CFA must lie in this thread's stack, above the current frame
    }
    const std::uintptr_t ra = *reinterpret_cast<const std::uintptr_t*>(cfa - 8);
    if ((rule & rule_rbp_saved) != 0) {
      const std::uintptr_t at = cfa + static_cast<std::uintptr_t>(rbp_offset(rule));
      if (at - lo > hi - lo - 8) {
        break;  // the saved rbp must lie in the stack too
      }
      rbp = *reinterpret_cast<const std::uintptr_t*>(at);
    }
    if (ra == 0) {
      break;
    }
    if (keep) {
      if (stop != nullptr && stop->contains(ra)) {
        break;
      }
      out[n++] = ra;
      if (n == capacity) {
        break;
      }
    }
    keep = true;
    rsp = cfa;
    rule = ts->cache.lookup(ra - 1);  // the call instruction, not the one after it
  }
  asm volatile("" ::: "memory");
  return n;
}

}  // namespace poolscope::profiler::detail

#else  // not x86-64

namespace poolscope::profiler::detail {
bool cached_dwarf_supported() noexcept {
  return false;
}
std::size_t walk_cached_dwarf(std::uintptr_t*, std::size_t, const stop_ranges*) noexcept {
  return 0;
}
}  // namespace poolscope::profiler::detail

#endif
