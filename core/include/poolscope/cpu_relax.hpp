// cpu_relax(): the pause a spin-wait loop makes between two looks at what it waits for, so a
// hyper-thread sibling keeps running and the loop's exit is not a memory-order mis-speculation.
//
//   while (!ready.load(std::memory_order_acquire)) poolscope::cpu_relax();
//
// Thread safety: a plain function. Cost: one pause instruction (nothing on other CPUs).
#pragma once

namespace poolscope {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace poolscope
