// Reading and writing allocator blocks wherever they live: host memory through memcpy, device
// memory through cudaMemcpy. The demo uses it to check that no block handed out by an allocator
// overlaps another or loses its contents.
//
//   poolscope::bench::write_pattern(res.kind(), p, bytes, /*tag=*/id);
//   ...
//   if (!poolscope::bench::check_pattern(res.kind(), p, bytes, id)) { /* corrupted */ }
//
// Thread safety: thread-safe (each call touches only the block it is given).
// Stream: device copies are synchronous on the legacy default stream, so they are ordered after
// any work queued there; blocks in use on other streams must be synchronized by the caller.
// Cost: blocks up to full_pattern_bytes are written whole; larger ones in three
// sample_pattern_bytes pieces (head, middle, tail), each one host<->device copy.
// Errors: a failing CUDA call throws poolscope::cuda_error.
#pragma once

#include <cstddef>
#include <cstdint>

#include "poolscope/pool/resource.hpp"

namespace poolscope::bench {

/// Blocks up to this size get the pattern over every byte.
inline constexpr std::size_t full_pattern_bytes = 256 * 1024;
/// Larger blocks get it over their head, middle and tail pieces of this size.
inline constexpr std::size_t sample_pattern_bytes = 64 * 1024;

/// CUDA devices visible to this process; 0 without a GPU or driver. Never throws.
[[nodiscard]] int gpu_count() noexcept;

/// Fills `bytes` at `ptr` (memory of `kind`) with a pattern derived from `tag` and each byte's
/// offset (the sampled pieces only, for large blocks).
void write_pattern(pool::memory_kind kind, void* ptr, std::size_t bytes, std::uint64_t tag);

/// True if the pattern written by write_pattern(kind, ptr, bytes, tag) is still intact.
[[nodiscard]] bool check_pattern(pool::memory_kind kind, const void* ptr, std::size_t bytes,
                                 std::uint64_t tag);

}  // namespace poolscope::bench
