#!/usr/bin/env python3
"""Uses poolscope's C ABI allocator (libpoolscope_alloc.so) as CuPy's allocator and checks it.

    python3 scripts/cupy_plugin_check.py [build/lib/libpoolscope_alloc.so]
        [--allocator bfc] [--resource cuda]

CuPy takes any callable `size -> cupy.cuda.MemoryPointer` through cupy.cuda.set_allocator. Here
the callable calls poolscope_malloc through ctypes and wraps the block in a
cupy.cuda.UnownedMemory whose owner object calls poolscope_free when CuPy drops the last
reference (a finalizer). The script runs a short workload (arrays of varying sizes, a matmul
checked against NumPy, frees), prints poolscope_stats_json(device) and exits 1 if the statistics
do not match the workload, 0 if they do, 77 without a GPU.
"""
import argparse
import ctypes
import json
import os
import sys

SKIP = 77


class _PoolscopeBlock:
    """Owns one poolscope block; frees it when CuPy's last reference to the memory goes."""

    __slots__ = ("_free", "ptr", "size", "device", "stream")

    def __init__(self, free_fn, ptr: int, size: int, device: int, stream: int) -> None:
        self._free = free_fn
        self.ptr, self.size, self.device, self.stream = ptr, size, device, stream

    def __del__(self) -> None:
        if self.ptr:
            self._free(ctypes.c_void_p(self.ptr), self.size, self.device, ctypes.c_void_p(self.stream))
            self.ptr = 0


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", nargs="?", default=os.path.join(root, "build", "lib", "libpoolscope_alloc.so"))
    ap.add_argument("--allocator", default=os.environ.get("POOLSCOPE_ALLOCATOR", "bfc"))
    ap.add_argument("--resource", default=os.environ.get("POOLSCOPE_RESOURCE", "cuda"))
    args = ap.parse_args()
    lib_path = os.path.abspath(args.lib)
    if not os.path.exists(lib_path):
        print(f"cupy_plugin_check: {lib_path} does not exist (build the poolscope_alloc target)")
        return 1
    os.environ["POOLSCOPE_ALLOCATOR"] = args.allocator
    os.environ["POOLSCOPE_RESOURCE"] = args.resource

    import numpy as np
    import cupy

    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("no device")
    except Exception:  # noqa: BLE001 - any failure here means no usable GPU
        print("cupy_plugin_check: SKIP (no CUDA device)")
        return SKIP

    lib = ctypes.CDLL(lib_path)
    lib.poolscope_malloc.restype = ctypes.c_void_p
    lib.poolscope_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.poolscope_free.restype = None
    lib.poolscope_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.poolscope_stats_json.restype = ctypes.c_char_p
    lib.poolscope_stats_json.argtypes = [ctypes.c_int]
    lib.poolscope_release_cached.restype = ctypes.c_size_t
    lib.poolscope_release_cached.argtypes = [ctypes.c_int]

    def poolscope_allocator(size: int) -> "cupy.cuda.MemoryPointer":
        device = cupy.cuda.runtime.getDevice()
        if size == 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device), 0)
        stream = cupy.cuda.get_current_stream().ptr
        ptr = lib.poolscope_malloc(size, device, ctypes.c_void_p(stream))
        if not ptr:
            raise cupy.cuda.memory.OutOfMemoryError(size, -1)
        owner = _PoolscopeBlock(lib.poolscope_free, ptr, size, device, stream)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, size, owner, device), 0)

    cupy.cuda.set_allocator(poolscope_allocator)
    device = cupy.cuda.runtime.getDevice()

    def stats() -> dict:
        return json.loads(lib.poolscope_stats_json(device).decode())

    failures = []

    def check(cond: bool, what: str) -> None:
        if not cond:
            failures.append(what)

    # 1. Arrays of varying sizes, alive at once.
    numels = [1, 100, 1000, 4096, 70_000, 1 << 20, 3 << 20, 16 << 20]
    held = [cupy.full(n, i + 1, dtype=cupy.float32) for i, n in enumerate(numels)]
    held_bytes = sum(4 * n for n in numels)
    cupy.cuda.runtime.deviceSynchronize()
    s1 = stats()
    check(s1.get("initialized") is True, f"pool initialized (error: {s1.get('error')})")
    check(s1.get("allocator") == args.allocator, f"allocator is {args.allocator}")
    check(s1["allocations"] >= len(numels), f"allocations {s1['allocations']} >= {len(numels)}")
    check(s1["requested_in_use"] >= held_bytes, f"requested_in_use >= the {held_bytes} bytes held")
    check(s1["reserved"] >= s1["in_use"] >= s1["requested_in_use"], "reserved >= in_use >= requested")
    # (A generator: no loop variable may keep an array alive after `del held`.)
    check(all(bool((a == i + 1).all()) for i, a in enumerate(held)), "every array kept its contents")

    # 2. A matmul through cuBLAS, checked with NumPy.
    rng = np.random.default_rng(0)
    a_h = rng.standard_normal((512, 384), dtype=np.float32)
    b_h = rng.standard_normal((384, 256), dtype=np.float32)
    c = cupy.asarray(a_h) @ cupy.asarray(b_h)
    check(np.allclose(cupy.asnumpy(c), a_h @ b_h, rtol=1e-2, atol=1e-2), "matmul matches NumPy")
    x = cupy.arange(1 << 20, dtype=cupy.float64)
    check(float((x * 2).sum()) == float((1 << 20) * ((1 << 20) - 1)), "elementwise result")
    cupy.cuda.runtime.deviceSynchronize()
    s2 = stats()
    check(s2["peak_requested"] >= held_bytes, "peak_requested covers everything held at once")

    # 3. Frees: dropping the arrays runs the finalizers, which call poolscope_free.
    del held, c, x
    cupy.cuda.runtime.deviceSynchronize()
    s3 = stats()
    check(s3["deallocations"] >= len(numels) + 2, f"deallocations {s3['deallocations']}")
    check(s3["requested_in_use"] <= s2["requested_in_use"] - held_bytes,
          "requested_in_use fell by at least the bytes freed")
    check(s3["oom_count"] == 0, "no out-of-memory")
    check(s3["invalid_frees"] == 0, "no invalid frees")

    released = lib.poolscope_release_cached(device)
    s4 = stats()
    stages = {"after allocating": s1, "after the matmul": s2, "after freeing": s3,
              "after release": s4}
    cupy.cuda.set_allocator(None)  # back to CuPy's own before exit

    print(f"poolscope in CuPy {cupy.__version__}: released {released} bytes")
    print(json.dumps(s4, indent=2))
    if failures:
        keys = ("allocations", "deallocations", "requested_in_use", "in_use", "reserved")
        for name, st in stages.items():
            print(f"  {name}: " + ", ".join(f"{k} {st[k]}" for k in keys))
        print("cupy_plugin_check: FAILED")
        for f in failures:
            print("  - " + f)
        return 1
    print(f"cupy_plugin_check: ok ({args.allocator} over {args.resource})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
