#!/usr/bin/env python3
"""Plugs poolscope's allocator into PyTorch through the Python package and checks it.

    python3 scripts/torch_plugin_check.py [build] [--allocator bfc] [--resource cuda]
        [--trace run.json]

poolscope.torch.use() (build/python) loads libpoolscope_alloc.so through
torch.cuda.memory.CUDAPluggableAllocator and change_current_allocator(), which must happen
before the first CUDA allocation. The script then runs a short workload (tensors of varying sizes, a
matmul checked against the CPU, frees), prints poolscope_stats_json(0) read through ctypes, and
exits 1 if the statistics do not match what the workload did, 0 if they do, 77 without a GPU.

POOLSCOPE_ALLOCATOR / POOLSCOPE_RESOURCE (or --allocator / --resource) choose the strategy and the
upstream resource; the plug-in reads them at the device's first allocation.
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

    import torch

    if not torch.cuda.is_available():
        print("torch_plugin_check: SKIP (no CUDA device)")
        return SKIP

    # Before the first CUDA allocation: the package sets the options and installs the plug-in.
    poolscope.torch.use(allocator=args.allocator, resource=args.resource, trace=args.trace)
    lib = poolscope.library()  # the same file PyTorch loaded: one set of pools

    def stats() -> dict:
        return poolscope.stats(0)

    failures = []

    def check(cond: bool, what: str) -> None:
        if not cond:
            failures.append(what)

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)

    # 1. Tensors of varying sizes, all alive at once; their bytes are what PyTorch asks for.
    numels = [1, 100, 1000, 4096, 70_000, 1 << 20, 3 << 20, 16 << 20]
    held = [torch.empty(n, dtype=torch.float32, device=dev) for n in numels]
    held_bytes = sum(4 * n for n in numels)
    for i in range(len(held)):  # (no loop variable may keep a tensor alive after `del held`)
        held[i].fill_(float(i + 1))
    torch.cuda.synchronize()
    s1 = stats()
    check(s1.get("initialized") is True, f"pool initialized (error: {s1.get('error')})")
    check(s1.get("allocator") == args.allocator, f"allocator is {args.allocator}")
    check(s1.get("resource") == args.resource, f"resource is {args.resource}")
    check(s1["allocations"] >= len(numels), f"allocations {s1['allocations']} >= {len(numels)}")
    check(s1["requested_in_use"] >= held_bytes,
          f"requested_in_use {s1['requested_in_use']} >= the {held_bytes} bytes held")
    check(s1["in_use"] >= s1["requested_in_use"], "in_use >= requested_in_use")
    check(s1["reserved"] >= s1["in_use"], "reserved >= in_use")
    check(s1["upstream_allocs"] >= 1, "at least one upstream allocation")
    # The values written are still there (blocks do not overlap).
    check(all(bool((t == float(i + 1)).all().item()) for i, t in enumerate(held)),
          "every tensor kept its contents")

    # 2. A matmul (cuBLAS may take a workspace through the allocator too), checked on the CPU.
    torch.manual_seed(0)
    a = torch.randn(512, 384, device=dev)
    b = torch.randn(384, 256, device=dev)
    c = a @ b
    ref = a.cpu() @ b.cpu()
    check(torch.allclose(c.cpu(), ref, rtol=1e-2, atol=1e-2), "matmul matches the CPU")
    x = torch.arange(1 << 20, device=dev, dtype=torch.float64)
    check(float((x * 2).sum().item()) == float((1 << 20) * ((1 << 20) - 1)), "elementwise result")
    torch.cuda.synchronize()
    s2 = stats()
    check(s2["peak_requested"] >= held_bytes, "peak_requested covers everything held at once")

    # 3. Free: the pool takes the blocks back.
    del held, a, b, c, ref, x
    torch.cuda.synchronize()
    s3 = stats()
    check(s3["deallocations"] >= len(numels) + 3,
          f"deallocations {s3['deallocations']} >= {len(numels) + 3}")
    check(s3["requested_in_use"] <= s2["requested_in_use"] - held_bytes,
          "requested_in_use fell by at least the bytes freed")
    check(s3["oom_count"] == 0, "no out-of-memory")
    check(s3["invalid_frees"] == 0, "no invalid frees")

    # 4. Reuse: the same sizes again come from the cache (for caching strategies).
    again = [torch.empty(n, dtype=torch.float32, device=dev) for n in numels]
    torch.cuda.synchronize()
    s4 = stats()
    if args.allocator != "naive":
        check(s4["upstream_allocs"] <= s3["upstream_allocs"] + len(numels),
              "reallocation is served mostly from the cache")
    del again
    torch.cuda.synchronize()
    released = poolscope.release_cached(0)
    s5 = stats()
    stages = {"after allocating": s1, "after the matmul": s2, "after freeing": s3,
              "after reallocating": s4, "after release": s5}
    check(s5["cached_bytes"] <= s4["cached_bytes"] + s4["in_use"], "release_cached shrinks the cache")

    print(f"held {held_bytes} bytes at once")
    print(f"poolscope {poolscope.version()} in PyTorch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}: released {released} bytes")
    print(json.dumps(s5, indent=2))
    if failures:
        keys = ("allocations", "deallocations", "requested_in_use", "in_use", "reserved")
        for name, st in stages.items():
            print(f"  {name}: " + ", ".join(f"{k} {st[k]}" for k in keys))
        print("torch_plugin_check: FAILED")
        for f in failures:
            print("  - " + f)
        return 1
    print(f"torch_plugin_check: ok ({args.allocator} over {args.resource})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
