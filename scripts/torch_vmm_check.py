#!/usr/bin/env python3
"""Peak reserved / peak requested through PyTorch on variable-length workloads (issue 43).

    python3 scripts/torch_vmm_check.py [build/lib/libpoolscope_alloc.so] [--json out.json]

One call measures, on GPU 0, each of:
  torch                PyTorch's own caching allocator
  torch-expandable     the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  poolscope bfc/cuda   the plug-in (libpoolscope_alloc.so), bfc over cudaMalloc
  poolscope bfc/vmm    the plug-in, bfc over the CUDA driver's virtual memory (POOLSCOPE_RESOURCE=vmm)
on three workloads: batches of changing sequence length, long-lived tensors born between
short-lived ones, sequences growing a block per step (the shapes of
tests/pool/vmm_workload_test.cpp, which checks bfc over host_vmm on the CPU). Each configuration
runs in a child process of its own (an allocator is chosen before PyTorch's first CUDA
allocation and cannot be changed after), one after another, so the figures come from the same
machine in the same call.

Peak requested is computed here from the workload (the most bytes live at once); peak reserved
is what the allocator held: torch.cuda.max_memory_reserved() for PyTorch, peak_reserved of
poolscope_stats_json(0) for the plug-in (over vmm: the bytes physically mapped, with the map and
unmap calls the workload cost). Prints a table and a summary line; exits 1 if bfc over vmm passes 1.05 on any workload or a configuration
fails, 77 without a GPU, 0 otherwise.
"""
import argparse
import json
import os
import random
import subprocess
import sys

SKIP = 77
KiB = 1024
MiB = 1024 * KiB
TARGET = 1.05

CONFIGS = {
    "torch": {},
    "torch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "poolscope bfc/cuda": {"POOLSCOPE_ALLOCATOR": "bfc", "POOLSCOPE_RESOURCE": "cuda"},
    "poolscope bfc/vmm": {"POOLSCOPE_ALLOCATOR": "bfc", "POOLSCOPE_RESOURCE": "vmm"},
}


# ---- the workloads: lists of ("alloc", slot, bytes) / ("free", slot, bytes) -------------------

class Workload:
    def __init__(self):
        self.ops = []
        self.sizes = []

    def alloc(self, nbytes):
        self.ops.append(("alloc", len(self.sizes), nbytes))
        self.sizes.append(nbytes)
        return len(self.sizes) - 1

    def free(self, slot):
        self.ops.append(("free", slot, self.sizes[slot]))

    def peak_requested(self):
        live = peak = 0
        for kind, _, nbytes in self.ops:
            live += -nbytes if kind == "free" else nbytes
            peak = max(peak, live)
        return peak


def changing_sequence_lengths(seed):
    rng = random.Random(seed)
    batch, hidden, heads, layers, f32 = 8, 1024, 16, 8, 4
    w = Workload()
    weights = [w.alloc(12 * hidden * hidden * f32) for _ in range(layers)]
    for _ in range(40):
        L = rng.randint(64, 2048)
        act = batch * L * hidden * f32
        kept = []
        for _ in range(layers):
            kept.append(w.alloc(act))
            kept.append(w.alloc(3 * act))
            scores = w.alloc(batch * heads * L * L * 2)
            kept.append(w.alloc(batch * heads * L * L * 2))
            w.free(scores)
            kept.append(w.alloc(4 * act))
            kept.append(w.alloc(act))
        for s in reversed(kept):
            w.free(s)
    for s in weights:
        w.free(s)
    return w


def long_lived_between_short_lived(seed):
    rng = random.Random(seed)
    w = Workload()
    long_lived = []  # (slot, step it dies)
    for step in range(200):
        temps = []
        for i in range(12):
            temps.append(w.alloc(rng.randint(1, 96) * MiB + rng.randint(1, 900) * KiB))
            temps.append(w.alloc(rng.randint(1, 900) * KiB))
            if i % 4 == 1:
                long_lived.append((w.alloc(rng.randint(1, 96) * MiB // 2 + rng.randint(1, 900) * KiB),
                                   step + rng.randint(2, 12)))
        for t in temps:
            w.free(t)
        for slot, dies in [x for x in long_lived if x[1] <= step]:
            w.free(slot)
        long_lived = [x for x in long_lived if x[1] > step]
    for slot, _ in long_lived:
        w.free(slot)
    return w


def sequences_growing_a_block_per_step(seed):
    rng = random.Random(seed)
    block = 320 * KiB
    w = Workload()
    active = [[w.alloc(block), 1, rng.randint(8, 400)] for _ in range(32)]
    for _ in range(500):
        for s in active:
            if s[1] >= s[2]:
                w.free(s[0])
                s[:] = [w.alloc(block), 1, rng.randint(8, 400)]
                continue
            grown = w.alloc((s[1] + 1) * block)
            w.free(s[0])
            s[0] = grown
            s[1] += 1
    for s in active:
        w.free(s[0])
    return w


WORKLOADS = {
    "changing sequence lengths": changing_sequence_lengths,
    "long-lived between short-lived": long_lived_between_short_lived,
    "sequences growing a block per step": sequences_growing_a_block_per_step,
}


# ---- a child: one configuration, every workload -------------------------------------------------

def run_child(config, lib_path):
    import ctypes

    import torch

    if not torch.cuda.is_available():
        return {"skip": "no CUDA device"}
    lib = None
    if config.startswith("poolscope"):
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "poolscope_malloc", "poolscope_free")
        torch.cuda.memory.change_current_allocator(pluggable)
        lib = ctypes.CDLL(lib_path)  # the same file: the library PyTorch loaded
        lib.poolscope_stats_json.restype = ctypes.c_char_p
        lib.poolscope_stats_json.argtypes = [ctypes.c_int]
        lib.poolscope_release_cached.restype = ctypes.c_size_t
        lib.poolscope_release_cached.argtypes = [ctypes.c_int]
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    results = {}
    for name, make in WORKLOADS.items():
        w = make(43)
        torch.cuda.synchronize()
        if lib is None:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_reserved(dev)
        else:
            lib.poolscope_release_cached(0)
            stats0 = json.loads(lib.poolscope_stats_json(0).decode())
            # Before the first allocation the device's pool does not exist yet ("initialized"
            # false); only an error in making it is a failure.
            if stats0.get("error"):
                return {"error": f"plug-in failed: {stats0['error']}"}
        tensors = {}
        for kind, slot, nbytes in w.ops:
            if kind == "alloc":
                tensors[slot] = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            else:
                del tensors[slot]
        torch.cuda.synchronize()
        if lib is None:
            peak_reserved = torch.cuda.max_memory_reserved(dev) - base
            allocator_peak_requested = torch.cuda.memory_stats(dev).get("requested_bytes.all.peak", 0)
        else:
            s = json.loads(lib.poolscope_stats_json(0).decode())
            peak_reserved = s["peak_reserved"]
            allocator_peak_requested = s["peak_requested"]  # lifetime peaks: one workload per child
        results[name] = {
            "peak_requested": w.peak_requested(),
            "allocator_peak_requested": allocator_peak_requested,
            "peak_reserved": peak_reserved,
            # Over vmm: the driver map and unmap calls the workload cost (None elsewhere).
            "maps": s.get("maps") if lib is not None else None,
            "unmaps": s.get("unmaps") if lib is not None else None,
        }
    return results


def child_main(config, workload, lib_path):
    global WORKLOADS
    WORKLOADS = {workload: WORKLOADS[workload]}
    try:
        out = run_child(config, lib_path)
    except Exception as e:  # reported by the parent with the configuration's name
        out = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out))
    return 0


# ---- the parent ---------------------------------------------------------------------------------

def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", nargs="?", default=os.path.join(root, "build", "lib", "libpoolscope_alloc.so"))
    ap.add_argument("--json", help="also write the results as JSON to this file")
    ap.add_argument("--child", nargs=2, metavar=("CONFIG", "WORKLOAD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    lib_path = os.path.abspath(args.lib)
    if args.child:
        return child_main(args.child[0], args.child[1], lib_path)
    if not os.path.exists(lib_path):
        print(f"torch_vmm_check: {lib_path} does not exist (build the poolscope_alloc target)")
        return 1

    table = {}
    failures = []
    for config, env in CONFIGS.items():
        for workload in WORKLOADS:
            # One child per configuration and workload: every peak is the workload's own.
            child_env = {k: v for k, v in os.environ.items()
                         if k not in ("PYTORCH_CUDA_ALLOC_CONF", "POOLSCOPE_ALLOCATOR", "POOLSCOPE_RESOURCE")}
            child_env.update(env)
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), lib_path,
                                   "--child", config, workload],
                                  env=child_env, capture_output=True, text=True)
            lines = proc.stdout.strip().splitlines()
            try:
                out = json.loads(lines[-1]) if lines else {"error": proc.stderr.strip()[-400:]}
            except json.JSONDecodeError:
                out = {"error": proc.stdout.strip()[-400:] + proc.stderr.strip()[-400:]}
            if proc.returncode != 0 and "error" not in out:
                out = {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
            if "skip" in out:
                print(f"torch_vmm_check: SKIP ({out['skip']})")
                return SKIP
            if "error" in out:
                failures.append(f"{config} / {workload}: {out['error']}")
                continue
            table.setdefault(config, {}).update(out)

    print(f"{'configuration':<22} {'workload':<36} {'peak req MiB':>13} {'peak rsv MiB':>13} {'ratio':>7}"
          f" {'maps/unmaps':>12}")
    ratios = {}
    for config, per in table.items():
        for workload, r in per.items():
            ratio = r["peak_reserved"] / r["peak_requested"]
            r["ratio"] = ratio
            ratios.setdefault(config, []).append(ratio)
            calls = f"{r['maps']}/{r['unmaps']}" if r.get("maps") else "-"
            print(f"{config:<22} {workload:<36} {r['peak_requested'] / MiB:>13.1f} "
                  f"{r['peak_reserved'] / MiB:>13.1f} {ratio:>7.3f} {calls:>12}")
            if config == "poolscope bfc/vmm" and ratio > TARGET:
                failures.append(f"{config} / {workload}: ratio {ratio:.3f} > {TARGET}")
    for f in failures:
        print(f"FAILED: {f}")
    summary = "; ".join(f"{c} {min(v):.2f}-{max(v):.2f}" for c, v in ratios.items())
    print(f"summary: peak reserved / peak requested: {summary}; target for bfc/vmm <= {TARGET}: "
          f"{'met' if not failures else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": table, "failures": failures}, f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
