#!/usr/bin/env python3
"""What recording costs a PyTorch program, per tensor (issue 44): ns per allocate + free.

    python3 scripts/torch_recording_bench.py [build/lib/libpoolscope_alloc.so] [--tensors N]
                                             [--repeat R] [--cpus LIST]

One call measures, on GPU 0, a variable-length workload (each step makes tensors whose sizes
follow a random sequence length, then frees them: one allocation and one free per tensor) under:
  torch                      PyTorch's own caching allocator
  torch history python       the same with _record_memory_history(stacks="python")
  plug-in                    libpoolscope_alloc.so (bfc over cudaMalloc) through
                             CUDAPluggableAllocator, nothing recorded
  plug-in RECORD             with POOLSCOPE_RECORD (the event log)
  plug-in PROFILE            with POOLSCOPE_PROFILE (the line profile, native and Python stacks)
  plug-in SNAPSHOT           with POOLSCOPE_SNAPSHOT (the memory snapshot, the same stacks)
  plug-in SNAPSHOT python    the same with POOLSCOPE_SNAPSHOT_STACKS=python (Python frames
                             alone, as PyTorch's stacks="python": no native walk)
Each configuration runs in a child process of its own (an allocator is chosen before PyTorch's
first CUDA allocation); a child times the workload five times after a warm-up and keeps the best
(wall clock of the whole step loop over the tensors made, and the calling thread's CPU time).
The configurations take turns, R rounds of one process each (so a slow spell of the machine falls
on every configuration alike); each row gives the median over its R processes with their spread
(max - min wall), and the fastest process's wall ("best": on a host where a process may run slow
throughout, the steadiest figure of what a configuration adds). Every child runs on the same few CPUs of one NUMA node (--cpus; the
default takes four of node 0's, past its first two), so neither a move between sockets nor a
core's neighbours make one configuration look cheaper than another. Prints a table, "added" being the ns per tensor over the plain plug-in
(over PyTorch's allocator for its history), and a summary line; exits 77 without a GPU or torch,
1 if a configuration failed.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

SKIP = 77

CHILD = r"""
import os, random, sys, time
mode, lib, tensors, cpus = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if cpus:
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
import torch
if mode.startswith("plug-in"):
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "poolscope_malloc", "poolscope_free")
    torch.cuda.memory.change_current_allocator(alloc)
elif mode == "torch history python":
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")

def step(rng, per_step):
    n = rng.randint(16, 512)  # the step's sequence length
    made = []
    for k in range(per_step):
        made.append(torch.empty((n, 64 * (1 + k % 4)), device="cuda"))
    del made

def run(count):
    rng = random.Random(11)
    per_step = 8
    for _ in range(count // per_step):
        step(rng, per_step)
    return (count // per_step) * per_step

run(2000)  # warm: the pools' segments, the caches, the unwinders
torch.cuda.synchronize()
best = None
for _ in range(5):
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    made = run(tensors)
    torch.cuda.synchronize()
    wall = (time.perf_counter_ns() - t0) / made
    cpu = (time.thread_time_ns() - c0) / made
    best = (wall, cpu) if best is None or wall < best[0] else best
print(best[0], best[1])
"""

CONFIGS = [
    ("torch", {}),
    ("torch history python", {}),
    ("plug-in", {}),
    ("plug-in RECORD", {"POOLSCOPE_RECORD": "{tmp}/events.jsonl"}),
    ("plug-in PROFILE", {"POOLSCOPE_PROFILE": "{tmp}/profile.json"}),
    ("plug-in SNAPSHOT", {"POOLSCOPE_SNAPSHOT": "{tmp}/snap.pickle"}),
    ("plug-in SNAPSHOT python", {"POOLSCOPE_SNAPSHOT": "{tmp}/snap.pickle",
                                 "POOLSCOPE_SNAPSHOT_STACKS": "python"}),
]


def default_cpus():
    """Four CPUs of NUMA node 0 this process may use, past the node's first two (which take most
    interrupts); all allowed CPUs' first four where the node list is unreadable; '' when fewer
    than four are allowed."""
    allowed = os.sched_getaffinity(0)
    node = []
    try:
        with open("/sys/devices/system/node/node0/cpulist") as f:
            for part in f.read().strip().split(","):
                lo, _, hi = part.partition("-")
                node.extend(range(int(lo), int(hi or lo) + 1))
    except (OSError, ValueError):
        node = sorted(allowed)
    pick = [c for c in node if c in allowed]
    pick = pick[2:6] if len(pick) >= 6 else pick[:4]
    return ",".join(map(str, pick)) if len(pick) == 4 else ""


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lib", nargs="?", default=os.path.join(root, "build", "lib",
                                                           "libpoolscope_alloc.so"))
    ap.add_argument("--tensors", type=int, default=40000)
    ap.add_argument("--repeat", type=int, default=5, help="processes per configuration")
    ap.add_argument("--cpus", default=None,
                    help="comma-separated CPUs every child runs on ('' for no pinning)")
    args = ap.parse_args()
    if args.tensors < 8 or args.repeat < 1:
        ap.error(f"--tensors {args.tensors} and --repeat {args.repeat}: need >= 8 and >= 1")
    try:
        import torch
        if not torch.cuda.is_available():
            print("torch_recording_bench: no GPU")
            return SKIP
    except ImportError:
        print("torch_recording_bench: no torch")
        return SKIP
    cpus = default_cpus() if args.cpus is None else args.cpus
    if cpus:
        allowed = os.sched_getaffinity(0)
        bad = [c for c in cpus.split(",") if not c.isdigit() or int(c) not in allowed]
        if bad:
            ap.error(f"--cpus {cpus}: {', '.join(bad)} not a CPU this process may run on")
    print(f"children run on CPUs {cpus or 'any'}")
    runs = {name: [] for name, _ in CONFIGS}
    failed = set()
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for name, extra in CONFIGS:
                if name in failed:
                    continue
                env = dict(os.environ)
                for k in ("POOLSCOPE_RECORD", "POOLSCOPE_PROFILE", "POOLSCOPE_SNAPSHOT",
                          "POOLSCOPE_SNAPSHOT_STACKS"):
                    env.pop(k, None)
                env.update({"POOLSCOPE_ALLOCATOR": "bfc", "POOLSCOPE_RESOURCE": "cuda"})
                env.update({k: v.format(tmp=tmp) for k, v in extra.items()})
                r = subprocess.run([sys.executable, "-c", CHILD, name, os.path.abspath(args.lib),
                                    str(args.tensors), cpus], env=env, capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"{name:<24} FAILED\n{(r.stdout + r.stderr)[-2000:]}")
                    failed.add(name)
                    continue
                runs[name].append(tuple(float(x) for x in r.stdout.strip().splitlines()[-1].split()))
    print(f"{'configuration':<24} {'wall ns/tensor':>15} {'spread':>7} {'added':>8} "
          f"{'thread CPU ns':>14} {'added':>8} {'best':>7} {'added':>8}   (median of "
          f"{args.repeat} processes; best: the fastest process's wall)")
    results = {}
    for name, _ in CONFIGS:
        if name in failed or not runs[name]:
            continue
        wall = statistics.median(w for w, _ in runs[name])
        cpu = statistics.median(c for _, c in runs[name])
        spread = max(w for w, _ in runs[name]) - min(w for w, _ in runs[name])
        best = min(w for w, _ in runs[name])
        results[name] = (wall, cpu, best)
        base = results.get("torch" if name.startswith("torch") else "plug-in", (wall, cpu, best))
        print(f"{name:<24} {wall:>15.0f} {spread:>7.0f} {wall - base[0]:>+8.0f} {cpu:>14.0f} "
              f"{cpu - base[1]:>+8.0f} {best:>7.0f} {best - base[2]:>+8.0f}")
    plain = results.get("plug-in")
    added = {k: (v[0] - plain[0], v[1] - plain[1]) for k, v in results.items()
             if plain is not None and k.startswith("plug-in ")}
    print("summary: median wall ns per tensor: " +
          ", ".join(f"{k} {v[0]:.0f}" for k, v in results.items()) +
          "; added over the plug-in (wall / thread CPU): " +
          ", ".join(f"{k[8:]} {v[0]:+.0f} / {v[1]:+.0f}" for k, v in added.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
