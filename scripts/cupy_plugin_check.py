#!/usr/bin/env python3
"""Uses poolscope's allocator as CuPy's through the Python package and checks it.

    python3 scripts/cupy_plugin_check.py [build] [--allocator bfc] [--resource cuda]
        [--trace run.json]

poolscope.cupy.use() (build/python) installs, through cupy.cuda.set_allocator, a callable
`size -> cupy.cuda.MemoryPointer` that calls poolscope_malloc and wraps the block in a
cupy.cuda.UnownedMemory whose owner calls poolscope_free when CuPy drops the last reference. The script runs a short workload (arrays of varying sizes, a matmul
checked against NumPy, frees), prints poolscope_stats_json(device) and exits 1 if the statistics
do not match the workload, 0 if they do, 77 without a GPU.
"""
import argparse
import json
import os
import sys

SKIP = 77


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", nargs="?", default=os.path.join(root, "build"),
                    help="the build folder (its python/ holds the poolscope package)")
    ap.add_argument("--allocator", default=os.environ.get("POOLSCOPE_ALLOCATOR", "bfc"))
    ap.add_argument("--resource", default=os.environ.get("POOLSCOPE_RESOURCE", "cuda"))
    ap.add_argument("--trace", help="also write the plug-in's Chrome trace here at exit")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    import poolscope

    import numpy as np
    import cupy

    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("no device")
    except Exception:  # noqa: BLE001 - any failure here means no usable GPU
        print("cupy_plugin_check: SKIP (no CUDA device)")
        return SKIP

    poolscope.cupy.use(allocator=args.allocator, resource=args.resource, trace=args.trace)
    device = cupy.cuda.runtime.getDevice()

    def stats() -> dict:
        return poolscope.stats(device)

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

    released = poolscope.release_cached(device)
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
