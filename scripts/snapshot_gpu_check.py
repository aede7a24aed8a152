#!/usr/bin/env python3
"""Memory snapshots against PyTorch's own code, on a GPU machine with torch installed.

    python3 scripts/snapshot_gpu_check.py [build/lib/libpoolscope_alloc.so] [--out DIR]

In one run:
1. PyTorch's own allocator runs a variable-length workload (tensors sized by a random length per
   step, a second stream, an out-of-memory caught, a second GPU when there is one) under
   torch.cuda.memory._record_memory_history, three times: with stacks="python" and a ring that
   holds the whole run, with stacks="all" and a ring of 300 entries that loses the run's start,
   and with stacks="python" and expandable_segments:True. Each writes its snapshot
   (torch-full.pickle, torch-ring.pickle, torch-expandable.pickle) and what
   torch.cuda.max_memory_reserved() said per device.
2. The same workload runs through the plug-in (CUDAPluggableAllocator) on every strategy over
   cudaMalloc and on bfc over the vmm resource (POOLSCOPE_RESOURCE=vmm: granules mapped and
   unmapped), with POOLSCOPE_SNAPSHOT=poolscope-<strategy>[-vmm].pickle (written at exit) and a
   poolscope_snapshot() call mid-run (poolscope-<strategy>[-vmm]-mid.pickle).
3. Every file, PyTorch's and poolscope's, goes through `python -m torch.cuda._memory_viz`
   stats, trace_plot and segment_plot (each must succeed), and poolscope's are checked against
   torch-full.pickle's structure by scripts/snapshot_check.py (keys, value types, tiling, the
   viewer's backwards replay); bfc over vmm also against torch-expandable.pickle, and it must
   hold segment_map entries and expandable segments as that file does.
4. `poolscope replay` reads PyTorch's files: each device's source_peak_reserved must equal
   torch.cuda.max_memory_reserved() of that run.
Prints a line per check and a summary; exits 1 if any failed, 77 without a GPU or torch.
"""
import argparse
import json
import os
import subprocess
import sys

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKLOAD = r"""
import ctypes, json, os, random, sys
import torch

mode, out = sys.argv[1], sys.argv[2]
lib = None
if mode == "poolscope":
    alloc = torch.cuda.memory.CUDAPluggableAllocator(sys.argv[3], "poolscope_malloc",
                                                     "poolscope_free")
    torch.cuda.memory.change_current_allocator(alloc)
    lib = ctypes.CDLL(sys.argv[3])
elif mode in ("torch-full", "torch-expandable"):
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
else:
    torch.cuda.memory._record_memory_history(max_entries=300, stacks="all")

def step(device, rng, stream):
    with torch.cuda.device(device), torch.cuda.stream(stream):
        n = rng.randint(64, 2048)
        a = torch.empty((n, 1000), device=device)          # ~n * 4 KB
        b = torch.empty((n, 256), device=device)
        c = a[:, :256] + b
        return c.sum().item()

def run():
    rng = random.Random(7)
    devices = list(range(min(torch.cuda.device_count(), 2)))
    streams = {d: [torch.cuda.Stream(device=d), torch.cuda.current_stream(d)] for d in devices}
    keep = []
    for i in range(200):
        d = devices[i % len(devices)]
        step(d, rng, streams[d][i % 2])
        if i % 50 == 0:
            keep.append(torch.empty(1 << 20, device=d))
        if i == 100 and lib is not None:
            lib.poolscope_snapshot.argtypes = [ctypes.c_char_p]
            assert lib.poolscope_snapshot((out + "-mid.pickle").encode()) == 0
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device=devices[0])
    except RuntimeError:  # OutOfMemoryError, or what a pluggable allocator's null becomes
        pass
    torch.cuda.synchronize()
    return devices

devices = run()
if mode != "poolscope":
    torch.cuda.memory._dump_snapshot(out + ".pickle")
    peaks = {d: torch.cuda.max_memory_reserved(d) for d in devices}
    json.dump({"max_memory_reserved": peaks}, open(out + ".json", "w"))
"""


# Each file must hold segment_map entries and expandable segments, as PyTorch's does with
# expandable_segments:True (and the replay check above has followed its maps and unmaps).
MAPPED_CHECK = r"""
import pickle, sys
bad = 0
for path in sys.argv[1:]:
    snap = pickle.load(open(path, "rb"))
    actions = {e["action"] for t in snap["device_traces"] for e in t}
    expandable = sum(1 for s in snap["segments"] if s["is_expandable"])
    ok = "segment_map" in actions and expandable > 0
    print(f"{'ok  ' if ok else 'FAIL'} {path}: {sorted(actions)}, {expandable} of "
          f"{len(snap['segments'])} segments expandable")
    bad += 0 if ok else 1
sys.exit(1 if bad else 0)
"""


def run(cmd, env=None, quiet=False):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0 and not quiet:
        print(f"       $ {' '.join(cmd)}\n" + (r.stdout + r.stderr)[-2000:])
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lib", nargs="?", default=os.path.join(ROOT, "build", "lib",
                                                           "libpoolscope_alloc.so"))
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "gpu-out")))
    ap.add_argument("--poolscope", default=os.path.join(ROOT, "build", "bin", "poolscope"))
    args = ap.parse_args()
    try:
        import torch
        if not torch.cuda.is_available():
            print("snapshot_gpu_check: no GPU")
            return SKIP
    except ImportError:
        print("snapshot_gpu_check: no torch")
        return SKIP
    out = os.path.join(args.out, "snapshots")
    os.makedirs(out, exist_ok=True)
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")

    files = []
    for mode in ("torch-full", "torch-ring", "torch-expandable"):
        env = dict(os.environ)
        if mode == "torch-expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        r = run([sys.executable, "-c", WORKLOAD, mode, os.path.join(out, mode)], env=env)
        check(f"{mode}: PyTorch's allocator runs the workload", r.returncode == 0)
        files.append(os.path.join(out, mode + ".pickle"))
    # Every strategy over cudaMalloc, and bfc over the vmm resource: it maps and unmaps granules,
    # written as PyTorch writes its expandable segments (segment_map / segment_unmap).
    pools = [(s, "cuda") for s in ("naive", "best_fit", "bfc", "stream_pool")] + [("bfc", "vmm")]
    for s, resource in pools:
        base = os.path.join(out, "poolscope-" + s + ("" if resource == "cuda" else "-" + resource))
        env = dict(os.environ, POOLSCOPE_ALLOCATOR=s, POOLSCOPE_RESOURCE=resource,
                   POOLSCOPE_SNAPSHOT=base + ".pickle")
        r = run([sys.executable, "-c", WORKLOAD, "poolscope", base, os.path.abspath(args.lib)],
                env=env)
        check(f"poolscope {s} over {resource}: the plug-in runs the workload and snapshots",
              r.returncode == 0)
        files += [base + ".pickle", base + "-mid.pickle"]

    for f in files:
        if not os.path.exists(f):
            check(f"{os.path.basename(f)} exists", False)
            continue
        for action in ("stats", "trace_plot", "segment_plot"):
            cmd = [sys.executable, "-m", "torch.cuda._memory_viz", action, f]
            if action != "stats":
                cmd += ["-o", f + "." + action + ".html"]
            r = run(cmd)
            check(f"_memory_viz {action} {os.path.basename(f)}", r.returncode == 0)
    ours = [f for f in files if "poolscope-" in f and os.path.exists(f)]
    r = run([sys.executable, os.path.join(ROOT, "scripts", "snapshot_check.py"), *ours,
             "--reference", files[0]])
    print(r.stdout, end="")
    check("poolscope's files have the structure of PyTorch's", r.returncode == 0)
    mapped = [f for f in ours if "-vmm" in f]
    expandable = os.path.join(out, "torch-expandable.pickle")
    if mapped and os.path.exists(expandable):
        r = run([sys.executable, os.path.join(ROOT, "scripts", "snapshot_check.py"), *mapped,
                 "--reference", expandable])
        print(r.stdout, end="")
        check("bfc over vmm has the structure of PyTorch's expandable segments",
              r.returncode == 0)
        r = run([sys.executable, "-c", MAPPED_CHECK, *mapped, expandable])
        print(r.stdout, end="")
        check("bfc over vmm and PyTorch's expandable segments: segment_map/unmap entries and "
              "is_expandable segments", r.returncode == 0)

    for mode in ("torch-full", "torch-ring", "torch-expandable"):
        path = os.path.join(out, mode)
        if not os.path.exists(path + ".json"):
            continue
        want = json.load(open(path + ".json"))["max_memory_reserved"]
        r = run([args.poolscope, "replay", path + ".pickle", "--json", "-", "--no-progress"])
        if r.returncode != 0:
            check(f"poolscope replay {mode}", False)
            continue
        got = {str(d["device"]): d["source_peak_reserved"] for d in json.loads(r.stdout)["devices"]}
        for dev, peak in want.items():
            check(f"replay {mode} device {dev}: source_peak_reserved == max_memory_reserved()",
                  got.get(str(dev)) == peak, f"{got.get(str(dev))} vs {peak}")
    failed = results.count(False)
    print(f"summary: {len(results)} checks, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
