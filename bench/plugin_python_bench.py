#!/usr/bin/env python3
"""The plug-in's recording costs seen from Python: ns per allocate+free pair through ctypes.

    python3 bench/plugin_python_bench.py build/lib/libpoolscope_alloc.so [--pairs N] [--repeat R]

Each row runs in a fresh python3 process that loads the plug-in (POOLSCOPE_RESOURCE=host,
POOLSCOPE_ALLOCATOR=bfc) and times N pairs of 1 KiB from a Python function D frames deep, in CPU
time: of the allocating thread (what recording costs the program's own thread) and of the whole
process (its writer threads too; best of five runs by the thread's time):
with nothing recorded (the baseline), with POOLSCOPE_RECORD (the event log), with
POOLSCOPE_PROFILE (the line profile: native and Python stacks) and with POOLSCOPE_SNAPSHOT (the
memory snapshot: the same stacks, a ring and a writer thread). "per event" is (pair - baseline)
/ 2: a pair's malloc and free are the two events each of them takes; with stacks, the malloc
carries the stack walk, Python frames included. With --repeat R each row is the best of R such
processes (on a shared, loaded machine one process may be slowed throughout). Prints a table and
a summary line; the figures go to docs/perf.md ("Recording and snapshots").
"""
import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.poolscope_malloc.restype = ctypes.c_void_p
lib.poolscope_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.poolscope_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
pairs, depth = int(sys.argv[2]), int(sys.argv[3])
m, f = lib.poolscope_malloc, lib.poolscope_free

def loop(n):
    for _ in range(n):
        f(m(1024, 0, None), 1024, 0, None)

def at_depth(d, n):
    return loop(n) if d <= 1 else at_depth(d - 1, n)

at_depth(depth, 1000)  # warm: the pool's segment, the caches, the unwinder
best = None
for _ in range(5):
    t0, c0 = time.thread_time_ns(), time.process_time_ns()
    at_depth(depth, pairs)
    t = (time.thread_time_ns() - t0) / pairs
    c = (time.process_time_ns() - c0) / pairs
    best = (t, c) if best is None or t < best[0] else best
print(best[0], best[1])
"""


def run(lib, pairs, depth, env_extra):
    env = dict(os.environ)
    for k in ("POOLSCOPE_RECORD", "POOLSCOPE_PROFILE", "POOLSCOPE_SNAPSHOT"):
        env.pop(k, None)
    env.update({"POOLSCOPE_RESOURCE": "host", "POOLSCOPE_ALLOCATOR": "bfc"})
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", CHILD, lib, str(pairs), str(depth)], env=env,
                         check=True, capture_output=True, text=True)
    thread_ns, process_ns = out.stdout.strip().splitlines()[-1].split()
    return float(thread_ns), float(process_ns)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("plugin")
    ap.add_argument("--pairs", type=int, default=200000)
    ap.add_argument("--depths", default="5,20,50")
    ap.add_argument("--repeat", type=int, default=1, help="best of this many processes per row")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        modes = [("none", {}),
                 ("POOLSCOPE_RECORD", {"POOLSCOPE_RECORD": os.path.join(tmp, "ev.jsonl")}),
                 ("POOLSCOPE_PROFILE", {"POOLSCOPE_PROFILE": os.path.join(tmp, "p.json")}),
                 ("POOLSCOPE_SNAPSHOT", {"POOLSCOPE_SNAPSHOT": os.path.join(tmp, "s.pickle")})]
        print(f"{'python depth':>12} {'recording':<20} {'thread ns/pair':>15} {'ns/event':>9} "
              f"{'process ns/pair':>16} {'ns/event':>9}")
        worst = {}
        for depth in [int(d) for d in args.depths.split(",")]:
            base = None
            for name, env in modes:
                t, p = min(run(args.plugin, args.pairs, depth, env)
                           for _ in range(max(1, args.repeat)))
                base = (t, p) if base is None else base
                et, ep = (t - base[0]) / 2, (p - base[1]) / 2
                print(f"{depth:>12} {name:<20} {t:>15.0f} {et:>9.0f} {p:>16.0f} {ep:>9.0f}")
                worst[name] = max(worst.get(name, 0.0), et)
        print("summary: per event on the allocating thread at the deepest stack: " +
              ", ".join(f"{k} +{v:.0f} ns" for k, v in worst.items() if k != "none"))


if __name__ == "__main__":
    main()
