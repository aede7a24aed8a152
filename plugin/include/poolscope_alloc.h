/* poolscope_alloc: poolscope's allocators behind a C ABI, for PyTorch, CuPy or any C caller.
 *
 *   # PyTorch
 *   alloc = torch.cuda.memory.CUDAPluggableAllocator(
 *       "libpoolscope_alloc.so", "poolscope_malloc", "poolscope_free")
 *   torch.cuda.memory.change_current_allocator(alloc)
 *
 *   // C
 *   void* p = poolscope_malloc(1 << 20, 0, NULL);
 *   poolscope_free(p, 1 << 20, 0, NULL);
 *   puts(poolscope_stats_json(0));
 *
 * Configuration, read from the environment once per device, at that device's first use:
 *   POOLSCOPE_ALLOCATOR = naive | best_fit | bfc | stream_pool   (default bfc)
 *   POOLSCOPE_RESOURCE  = cuda | cuda_async | pinned | host | vmm | host_vmm   (default cuda)
 * Read once per process, at the first device's first use:
 *   POOLSCOPE_RECORD    = FILE   write the allocator event log (JSON Lines, docs/event_log.md)
 *   POOLSCOPE_PROFILE   = FILE   write the line profile (JSON, docs/line_profile.md) at exit;
 *                                checked then: a FILE that cannot be written, or that is the
 *                                POOLSCOPE_RECORD file, is refused with one log line
 *   POOLSCOPE_TRACE     = FILE   write a Chrome trace at exit: every pool event, each pool's
 *                                in-use and reserved bytes as counters, and with a GPU resource
 *                                CUPTI's kernels and copies where CUPTI attaches (docs/trace.md)
 *   POOLSCOPE_SNAPSHOT  = FILE   record a PyTorch memory snapshot (docs/snapshot.md) and write
 *                                it at exit and on poolscope_snapshot(); %p (pid) and %r (rank)
 *                                in FILE are expanded at each write; checked at the first use
 *   POOLSCOPE_SNAPSHOT_MAX_ENTRIES = N   trace entries kept per device (default 100000)
 *   POOLSCOPE_SNAPSHOT_STACKS = all|python   as PyTorch's stacks=: "python" keeps only the
 *                                Python frames where the thread runs Python, sparing the native
 *                                walk (default "all": the native frames above the interpreter too)
 * In a Python process the line profile's and the snapshot's stacks hold the Python frames
 * (file, function, line) in place of the interpreter's.
 * Pool sizing, read with the pool (bytes, with binary suffixes K, M, G, T: "512M", "20G"):
 *   POOLSCOPE_LIMIT             the pool hands out and holds at most this much
 *   POOLSCOPE_INITIAL_POOL_SIZE taken from the resource when the pool is made
 *   POOLSCOPE_MAX_POOL_SIZE     the pool takes at most this much from the resource in all
 *   POOLSCOPE_RELEASE_THRESHOLD after a free, cached bytes above this go back to the resource
 * A bad value is logged and every poolscope_malloc on that device returns NULL, as for an
 * unknown allocator name.
 * With POOLSCOPE_RESOURCE=host the device argument is only a key selecting one of up to
 * POOLSCOPE_ALLOC_MAX_DEVICES independent pools. An unknown name is logged once (stderr,
 * "[poolscope error] ...") and every later poolscope_malloc on that device returns NULL.
 *
 * Ownership: each device's allocator and resource are created on first use and never destroyed
 * (on purpose: PyTorch frees tensors after static destruction has begun).
 * Thread safety: every function is thread-safe. Pool creation happens once per device.
 * Errors: no exception crosses this ABI. poolscope_malloc returns NULL on failure (out of memory,
 * negative size, bad device, unknown allocator or resource) and logs why; poolscope_free never
 * fails (a bad call is logged and ignored; a free naming a device that has no pool is logged
 * with the pointer and counted in that device's stats as "bad_frees").
 * Streams: `stream` is a cudaStream_t (or any key with the host resource), passed to the
 * allocator as its stream. bfc (the default) and best_fit reuse a freed block at once on any
 * stream: right for a program that allocates on one stream; with several, choose stream_pool
 * (a block freed on one stream reaches another only after an event recorded at the free).
 */
#ifndef POOLSCOPE_ALLOC_H
#define POOLSCOPE_ALLOC_H

#include <stddef.h>
#include <sys/types.h>

#if defined(__GNUC__)
#define POOLSCOPE_ALLOC_API __attribute__((visibility("default")))
#else
#define POOLSCOPE_ALLOC_API
#endif

/** Device keys accepted: 0 .. POOLSCOPE_ALLOC_MAX_DEVICES - 1. */
#define POOLSCOPE_ALLOC_MAX_DEVICES 64

#ifdef __cplusplus
extern "C" {
#endif

/** `size` bytes (256-byte aligned) on `device`, usable on `stream`; NULL on failure or size 0. */
POOLSCOPE_ALLOC_API void* poolscope_malloc(ssize_t size, int device, void* stream);

/** Returns `ptr` from poolscope_malloc with the size, device and stream it was allocated with.
 *  NULL is a no-op. */
POOLSCOPE_ALLOC_API void poolscope_free(void* ptr, ssize_t size, int device, void* stream);

/** The device's allocator statistics as one JSON object: every allocator_stats field plus
 *  "device", "allocator", "resource", "name" and "initialized" (and "error" if the pool could not
 *  be created). The string stays valid until this thread's next call. Never NULL. Also callable
 *  from exit handlers, static destructors and thread_local destructors. */
POOLSCOPE_ALLOC_API const char* poolscope_stats_json(int device);

/** Returns the device's cached memory to its resource; a negative device means every device.
 *  Returns the bytes released. */
POOLSCOPE_ALLOC_API size_t poolscope_release_cached(int device);

/** Called when an allocation does not fit (the pool's limit, or the device is full), before
 *  poolscope_malloc returns NULL: `device` and `size` are the request's, `user_data` what was
 *  given with the callback. A nonzero return (having freed memory: a garbage collection, a cache
 *  dropped) retries the allocation once. Runs on the allocating thread; it must not allocate
 *  through poolscope itself. */
typedef int (*poolscope_oom_callback)(int device, size_t size, void* user_data);

/** Sets the OOM callback for every device (NULL removes it). Thread-safe; a callback running
 *  when another is set finishes with its own user_data. */
POOLSCOPE_ALLOC_API void poolscope_set_oom_callback(poolscope_oom_callback callback,
                                                    void* user_data);
/** Writes the memory snapshot recorded since the first allocation (POOLSCOPE_SNAPSHOT must be
 *  set then) to `path`, or to POOLSCOPE_SNAPSHOT's FILE when `path` is NULL; %p and %r are
 *  expanded. Returns 0, or -1 (and logs why) when recording is off or the file cannot be
 *  written. Thread-safe; allocations on other threads go on meanwhile. */
POOLSCOPE_ALLOC_API int poolscope_snapshot(const char* path);

/** The library version, "major.minor.patch". */
POOLSCOPE_ALLOC_API const char* poolscope_version(void);

#ifdef __cplusplus
}
#endif

#endif /* POOLSCOPE_ALLOC_H */
