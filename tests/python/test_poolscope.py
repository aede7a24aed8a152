"""Tests of the Python package `poolscope` over the plug-in, on the host resource (no GPU): the
ctypes layer against figures computed here, the options' checks, and the PyTorch and CuPy
adapters driven through stand-ins for torch and cupy. Each case runs in a fresh interpreter (the
plug-in reads its options once per process). Run by ctest (python.poolscope) with PYTHONPATH
naming build/python.
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest


def run(code, env=None):
    """Runs `code` in a fresh python3 with the plug-in on the host resource; returns the
    CompletedProcess (stdout and stderr as text)."""
    full_env = dict(os.environ)
    for k in list(full_env):
        if k.startswith("POOLSCOPE_") and k not in ("POOLSCOPE_ALLOC_LIBRARY",):
            del full_env[k]
    full_env["POOLSCOPE_LOG"] = "error"
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=120)


def last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


class CtypesLayer(unittest.TestCase):
    def test_stats_follow_what_was_allocated(self):
        # best_fit rounds every request up to 512 bytes (README): in use is the rounded sum.
        p = run("""
            import json, poolscope
            poolscope.configure(allocator="best_fit", resource="host")
            lib = poolscope.library()
            sizes = [256, 1000, 4096, 70000]
            ptrs = [lib.poolscope_malloc(s, 0, None) for s in sizes]
            live = poolscope.stats(0)
            for p_, s in zip(ptrs, sizes):
                lib.poolscope_free(p_, s, 0, None)
            done = poolscope.stats(0)
            released = poolscope.release_cached()
            after = poolscope.stats(0)
            print(json.dumps([all(ptrs), live, done, released, after]))
        """)
        self.assertEqual(p.returncode, 0, p.stderr)
        ok, live, done, released, after = last_json(p)
        self.assertTrue(ok)
        sizes = [256, 1000, 4096, 70000]
        self.assertEqual(live["requested_in_use"], sum(sizes))
        self.assertEqual(live["in_use"], sum((s + 511) // 512 * 512 for s in sizes))
        self.assertEqual(live["allocations"], 4)
        self.assertTrue(live["initialized"])
        self.assertEqual(live["allocator"], "best_fit")
        self.assertEqual(live["resource"], "host")
        self.assertEqual(done["in_use"], 0)
        self.assertEqual(done["deallocations"], 4)
        self.assertEqual(released, done["cached_bytes"])
        self.assertEqual(after["reserved"], done["reserved"] - released)

    def test_a_device_without_a_pool_reports_so(self):
        p = run("""
            import json, poolscope
            print(json.dumps(poolscope.stats(5)))
        """)
        self.assertEqual(p.returncode, 0, p.stderr)
        s = last_json(p)
        self.assertFalse(s["initialized"])
        self.assertEqual(s["device"], 5)

    def test_version_is_three_numbers(self):
        p = run("import poolscope; print(poolscope.version())")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout.strip(), r"^\d+\.\d+\.\d+$")


class Options(unittest.TestCase):
    def refused(self, call):
        p = run(f"""
            import poolscope
            try:
                {call}
            except poolscope.PoolscopeError as e:
                print("refused:", e)
            else:
                print("accepted")
        """)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout.strip()

    def test_bad_values_are_named(self):
        self.assertIn("'bfcc'", self.refused('poolscope.configure(allocator="bfcc")'))
        self.assertIn("'lots'", self.refused('poolscope.configure(limit="lots")'))
        self.assertIn("negative", self.refused("poolscope.configure(max_pool_size=-1)").replace(
            "not a whole number", "negative"))
        self.assertIn("unknown option 'limits'", self.refused("poolscope.configure(limits=1)"))
        self.assertIn("'--x'", self.refused('poolscope.configure(trace="--x")'))

    def test_values_become_the_environment(self):
        p = run("""
            import json, os, poolscope
            env = poolscope.configure(allocator="best_fit", resource="host", limit="1.5K",
                                      initial_pool_size=4096, trace="t.json")
            print(json.dumps([env, os.environ["POOLSCOPE_LIMIT"]]))
        """)
        self.assertEqual(p.returncode, 0, p.stderr)
        env, limit = last_json(p)
        self.assertEqual(limit, "1536")
        self.assertEqual(env["POOLSCOPE_ALLOCATOR"], "best_fit")
        self.assertEqual(env["POOLSCOPE_INITIAL_POOL_SIZE"], "4096")
        self.assertTrue(os.path.isabs(env["POOLSCOPE_TRACE"]))

    def test_configure_after_an_allocation_names_the_device(self):
        out = self.refused("""poolscope.configure(resource="host")
                lib = poolscope.library()
                lib.poolscope_free(lib.poolscope_malloc(512, 3, None), 512, 3, None)
                poolscope.configure(allocator="naive")""")
        self.assertIn("refused:", out)
        self.assertIn("device(s) 3", out)


# Stand-ins for the parts of torch and cupy the adapters touch.
FAKE_TORCH = """
import types
calls = []
class CUDAPluggableAllocator:
    def __init__(self, path, malloc, free):
        calls.append(("pluggable", path, malloc, free))
def change_current_allocator(a):
    calls.append(("change", type(a).__name__))
torch = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=types.SimpleNamespace(
    CUDAPluggableAllocator=CUDAPluggableAllocator,
    change_current_allocator=change_current_allocator)))
"""

FAKE_CUPY = """
import types
class OutOfMemoryError(Exception):
    pass
class UnownedMemory:
    def __init__(self, ptr, size, owner, device):
        self.ptr, self.size, self.owner, self.device = ptr, size, owner, device
class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset
installed = []
cuda = types.SimpleNamespace(
    runtime=types.SimpleNamespace(getDevice=lambda: 0),
    get_current_stream=lambda: types.SimpleNamespace(ptr=0),
    MemoryPointer=MemoryPointer, UnownedMemory=UnownedMemory,
    memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
    set_allocator=installed.append)
cupy = types.SimpleNamespace(cuda=cuda)
"""


class Adapters(unittest.TestCase):
    def test_torch_use_installs_the_plugin(self):
        p = run(FAKE_TORCH + """
import json, os, poolscope
poolscope.torch.use(allocator="stream_pool", resource="host", torch_module=torch)
print(json.dumps([calls, os.environ["POOLSCOPE_ALLOCATOR"], poolscope.library_path()]))
""")
        self.assertEqual(p.returncode, 0, p.stderr)
        calls, allocator, path = last_json(p)
        self.assertEqual(calls[0], ["pluggable", path, "poolscope_malloc", "poolscope_free"])
        self.assertEqual(calls[1], ["change", "CUDAPluggableAllocator"])
        self.assertEqual(allocator, "stream_pool")
        self.assertTrue(os.path.exists(path))

    def test_cupy_blocks_go_back_when_dropped(self):
        p = run(FAKE_CUPY + """
import gc, json, poolscope
fn = poolscope.cupy.use(allocator="bfc", resource="host", limit="1M", cupy_module=cupy)
a = fn(1000)
b = fn(3000)
held = poolscope.stats(0)["requested_in_use"]
empty = fn(0)
try:
    fn(2 << 20)
    oom = "no error"
except cupy.cuda.memory.OutOfMemoryError:
    oom = "OutOfMemoryError"
del a, b
gc.collect()
print(json.dumps([installed[0] is fn, held, empty.ptr, oom,
                  poolscope.stats(0)["requested_in_use"]]))
""")
        self.assertEqual(p.returncode, 0, p.stderr)
        same, held, empty_ptr, oom, after = last_json(p)
        self.assertTrue(same)
        self.assertEqual(held, 4000)
        self.assertEqual(empty_ptr, 0)
        self.assertEqual(oom, "OutOfMemoryError")
        self.assertEqual(after, 0)


class Outputs(unittest.TestCase):
    def test_record_and_profile_are_written_at_exit(self):
        with tempfile.TemporaryDirectory() as d:
            record = os.path.join(d, "events.jsonl")
            profile = os.path.join(d, "profile.json")
            p = run(f"""
                import poolscope
                poolscope.configure(resource="host", record={record!r}, profile={profile!r})
                lib = poolscope.library()
                for size in (1000, 2000, 3000):
                    lib.poolscope_free(lib.poolscope_malloc(size, 0, None), size, 0, None)
            """)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(record) as f:
                mallocs = [json.loads(line) for line in f if '"malloc"' in line]
            self.assertEqual(sorted(m.get("size", m.get("requested")) for m in mallocs)[-3:],
                             [1000, 2000, 3000])
            with open(profile) as f:
                self.assertEqual(json.load(f)["format"], "poolscope.line_profile")

    def test_trace_holds_the_pool_events_and_counters(self):
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "run.json")
            p = run(f"""
                import poolscope
                poolscope.configure(resource="host", allocator="bfc", trace={trace!r})
                lib = poolscope.library()
                for size in (1000, 2000, 3000):
                    lib.poolscope_free(lib.poolscope_malloc(size, 0, None), size, 0, None)
            """)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(trace) as f:
                events = json.load(f)["traceEvents"]
            allocator = [e for e in events if e.get("cat") == "allocator"]
            counters = [e for e in events if e.get("ph") == "C"]
            mallocs = [e for e in allocator if "malloc" in e.get("name", "")]
            self.assertGreaterEqual(len(mallocs), 3, allocator[:5])
            self.assertTrue(counters, "no memory counters")
            self.assertTrue(any("in_use" in e.get("args", {}) for e in counters), counters[:3])


class OutOfMemory(unittest.TestCase):
    def test_on_oom_frees_and_the_allocation_is_retried(self):
        p = run("""
            import json, poolscope
            poolscope.configure(resource="host", allocator="best_fit", limit="64K")
            lib = poolscope.library()
            held = [lib.poolscope_malloc(32 << 10, 0, None)]
            calls = []
            def free_something(device, size):
                calls.append([device, size])
                if held:
                    lib.poolscope_free(held.pop(), 32 << 10, 0, None)
                    return True
                return False
            poolscope.on_oom(free_something)
            big = lib.poolscope_malloc(48 << 10, 0, None)
            again = lib.poolscope_malloc(48 << 10, 0, None)
            poolscope.on_oom(None)
            print(json.dumps([bool(big), bool(again), calls]))
        """)
        self.assertEqual(p.returncode, 0, p.stderr)
        big, again, calls = last_json(p)
        self.assertTrue(big)
        self.assertFalse(again)
        self.assertEqual(calls, [[0, 48 << 10], [0, 48 << 10]])

    def test_a_free_on_a_device_without_a_pool_is_counted(self):
        p = run("""
            import ctypes, json, poolscope
            lib = poolscope.library()
            local = ctypes.create_string_buffer(64)
            lib.poolscope_free(ctypes.addressof(local), 64, 9, None)
            print(json.dumps([hex(ctypes.addressof(local)), poolscope.stats(9)["bad_frees"]]))
        """)
        self.assertEqual(p.returncode, 0, p.stderr)
        where, count = last_json(p)
        self.assertEqual(count, 1)
        self.assertIn("bad free of " + where, p.stderr)


if __name__ == "__main__":
    unittest.main()
