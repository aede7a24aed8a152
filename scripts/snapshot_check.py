#!/usr/bin/env python3
"""Checks that memory snapshots load as PyTorch's tools load them and hold what they read.

    scripts/snapshot_check.py SNAP.pickle [SNAP2.pickle ...] [--reference TORCH.pickle]

Each file is loaded with Python's pickle (as `python -m torch.cuda._memory_viz` does) and
checked: the keys and value types of the dict, of each segment, block, trace entry and frame
(against those of the reference, a snapshot PyTorch wrote, when one is given: every key the
reference has for an object is there with the same type, and no key the reference lacks, but
for those PyTorch writes only in some versions); blocks that tile each segment exactly (the
viewer recomputes block addresses as a running sum); the size sums of each segment; and the
trace replayed backwards from the segments as pytorch.org/memory_viz replays it: every block the
trace frees lies in a segment at that moment, and every segment it allocates is there to take
back. Prints one line per file; exits 1 if any check failed. Used by the snapshot tests (on every
file poolscope writes) and by scripts/snapshot_gpu_check.py (against a snapshot PyTorch wrote
in the same run).
"""
import argparse
import bisect
import pickle
import sys

# Keys PyTorch writes in some versions only: allowed, not required.
OPTIONAL = {
    "top": {"external_annotations", "allocator_settings"},
    "entry": {"compile_context", "user_metadata", "frames", "time_us", "stream", "device_free",
              "addr"},
}
REQUIRED = {
    "top": {"segments", "device_traces"},
    "segment": {"device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
                "frames", "blocks"},
    "block": {"address", "size", "requested_size", "state", "frames"},
    "entry": {"action", "size"},
    "frame": {"name", "filename", "line"},
}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}
STATES = {"active_allocated", "active_pending_free", "inactive"}


class Problems:
    def __init__(self, name):
        self.name = name
        self.items = []

    def add(self, where, what):
        if len(self.items) < 20:
            self.items.append(f"{where}: {what}")
        elif len(self.items) == 20:
            self.items.append("... (more)")


def type_name(v):
    return type(v).__name__


def shape(obj, kind):
    """{key: type name} of a dict."""
    return {k: type_name(v) for k, v in obj.items()}


def check_keys(p, where, obj, kind, ref):
    if not isinstance(obj, dict):
        p.add(where, f"a {type_name(obj)}, not a dict")
        return False
    missing = REQUIRED.get(kind, set()) - obj.keys()
    if kind == "entry":
        missing |= ({"device_free"} if obj.get("action") == "oom" else
                    {"addr"} if obj.get("action") != "snapshot" else set()) - obj.keys()
    if missing:
        p.add(where, f"missing {sorted(missing)}")
    if ref is not None and kind in ref:
        for k, t in shape(obj, kind).items():
            want = ref[kind].get(k)
            if want is None and k not in OPTIONAL.get(kind, set()):
                p.add(where, f"key {k!r} is not in PyTorch's {kind}s")
            elif want is not None and want != t:
                p.add(where, f"{k!r} is a {t}, PyTorch's is a {want}")
    return True


def check_frames(p, where, frames, ref):
    if not isinstance(frames, list):
        p.add(where, f"frames is a {type_name(frames)}, not a list")
        return
    for i, f in enumerate(frames):
        if check_keys(p, f"{where}.frames[{i}]", f, "frame", ref):
            for k, t in (("name", str), ("filename", str), ("line", int)):
                if k in f and not isinstance(f[k], t):
                    p.add(f"{where}.frames[{i}].{k}", f"a {type_name(f[k])}")


def check_segments(p, snap, ref):
    segments = snap["segments"]
    for i, seg in enumerate(segments):
        w = f"segments[{i}]"
        if not check_keys(p, w, seg, "segment", ref):
            continue
        check_frames(p, w, seg.get("frames", []), ref)
        addr = seg["address"]
        allocated = active = requested = 0
        for j, b in enumerate(seg.get("blocks", [])):
            bw = f"{w}.blocks[{j}]"
            if not check_keys(p, bw, b, "block", ref):
                continue
            check_frames(p, bw, b.get("frames", []), ref)
            if b.get("address", addr) != addr:
                p.add(bw, f"address {b['address']:#x}, the running sum is {addr:#x}")
            if b.get("state") not in STATES:
                p.add(bw, f"state {b.get('state')!r}")
            if b.get("size", 0) <= 0:
                p.add(bw, f"size {b.get('size')}")
            addr += b.get("size", 0)
            if b.get("state") == "active_allocated":
                allocated += b["size"]
                requested += b.get("requested_size", b["size"])
                if b.get("requested_size", 0) > b["size"]:
                    p.add(bw, f"requested_size {b['requested_size']} > size {b['size']}")
            if b.get("state") != "inactive":
                active += b["size"]
        if addr != seg["address"] + seg["total_size"]:
            p.add(w, f"blocks end at {addr:#x}, the segment at "
                     f"{seg['address'] + seg['total_size']:#x}: they do not tile it")
        for k, v in (("allocated_size", allocated), ("active_size", active),
                     ("requested_size", requested)):
            if k in seg and seg[k] != v:
                p.add(w, f"{k} {seg[k]}, its blocks sum to {v}")
        if seg.get("segment_type") not in ("small", "large"):
            p.add(w, f"segment_type {seg.get('segment_type')!r}")


def replay_backwards(p, snap, device):
    """The viewer's replay (MemoryViz.js, simulate_memory): from the end, undo each entry.

    Segments are [address, size, stream] in address order. Undoing a segment_alloc or a
    segment_free takes out or puts back the segment at that address; undoing a segment_map takes
    its range out of the segment holding it (the viewer fails if none holds it whole), undoing a
    segment_unmap puts the range back, joined with adjacent segments of the same stream.
    """
    segs = []
    blocks = {}  # address -> size
    for seg in snap["segments"]:
        if seg["device"] != device:
            continue
        segs.append([seg["address"], seg["total_size"], seg["stream"]])
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[addr] = b["size"]
            addr += b["size"]
    segs.sort()
    trace = snap["device_traces"][device]
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        a = e["action"]
        w = f"device_traces[{device}][{i}] ({a})"
        if a in ("free_completed", "free"):
            blocks[e["addr"]] = e["size"]
            if not in_segment(segs, e["addr"], e["size"]):
                p.add(w, f"block {e['addr']:#x} lies in no segment at this point of the trace")
        elif a == "free_requested":
            if e["addr"] not in blocks:
                p.add(w, f"no block at {e['addr']:#x} to mark (the viewer fails here)")
        elif a == "alloc":
            blocks.pop(e["addr"], None)
        elif a == "segment_free":
            bisect.insort(segs, [e["addr"], e["size"], e.get("stream", 0)])
        elif a == "segment_unmap":
            map_segment(segs, [e["addr"], e["size"], e.get("stream", 0)])
        elif a == "segment_alloc":
            at = [k for k, s in enumerate(segs) if s[0] == e["addr"]]
            if not at:
                p.add(w, f"no segment at {e['addr']:#x} to take back (the viewer fails here)")
                continue
            del segs[at[0]]
            check_empty(p, w, blocks, e)
        elif a == "segment_map":
            if not unmap_segment(segs, e["addr"], e["size"]):
                p.add(w, f"no segment holds [{e['addr']:#x}, +{e['size']}) to take back (the "
                         "viewer fails here)")
                continue
            check_empty(p, w, blocks, e)


def map_segment(segs, seg):
    k = bisect.bisect_left(segs, seg)
    segs.insert(k, seg)
    if k + 1 < len(segs) and seg[0] + seg[1] == segs[k + 1][0] and seg[2] == segs[k + 1][2]:
        seg[1] += segs[k + 1][1]
        del segs[k + 1]
    if k > 0 and segs[k - 1][0] + segs[k - 1][1] == seg[0] and segs[k - 1][2] == seg[2]:
        segs[k - 1][1] += seg[1]
        del segs[k]


def unmap_segment(segs, addr, size):
    end = addr + size
    for k, (lo, n, stream) in enumerate(segs):
        if lo <= addr and end <= lo + n:
            if lo == addr:
                segs[k][0] += size
                segs[k][1] -= size
                if segs[k][1] == 0:
                    del segs[k]
            elif lo + n == end:
                segs[k][1] -= size
            else:
                segs[k][1] = addr - lo
                segs.insert(k + 1, [end, lo + n - end, stream])
            return True
    return False


def check_empty(p, w, blocks, e):
    inside = [b for b in blocks if e["addr"] <= b < e["addr"] + e["size"]]
    if inside:
        p.add(w, f"blocks {[hex(b) for b in inside[:3]]} are in the segment before it is "
                 "allocated")


def in_segment(segs, addr, size):
    k = bisect.bisect_right(segs, [addr, float("inf"), float("inf")]) - 1
    return k >= 0 and addr + size <= segs[k][0] + segs[k][1]


def reference_shapes(path):
    with open(path, "rb") as f:
        ref = pickle.load(f)
    out = {"top": shape(ref, "top")}
    for seg in ref["segments"]:
        out.setdefault("segment", shape(seg, "segment"))
        for b in seg["blocks"]:
            out.setdefault("block", shape(b, "block"))
        for fr in seg.get("frames", []):
            out.setdefault("frame", shape(fr, "frame"))
    entry = {}
    for trace in ref["device_traces"]:
        for e in trace:
            for k, t in shape(e, "entry").items():
                entry.setdefault(k, t)
            for fr in e.get("frames", []):
                out.setdefault("frame", shape(fr, "frame"))
    out["entry"] = entry
    return out


def check_file(path, ref):
    p = Problems(path)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    if check_keys(p, "snapshot", snap, "top", ref):
        if not isinstance(snap.get("segments"), list):
            p.add("segments", "not a list")
        else:
            check_segments(p, snap, ref)
        traces = snap.get("device_traces", [])
        entries = 0
        for d, trace in enumerate(traces):
            for i, e in enumerate(trace):
                entries += 1
                w = f"device_traces[{d}][{i}]"
                if check_keys(p, w, e, "entry", ref):
                    if e.get("action") not in ACTIONS:
                        p.add(w, f"action {e.get('action')!r}")
                    check_frames(p, w, e.get("frames", []), ref)
        if not p.items:
            for d in range(len(traces)):
                replay_backwards(p, snap, d)
    status = "ok  " if not p.items else "FAIL"
    print(f"{status} {path}: {len(snap.get('segments', []))} segments, "
          f"{sum(len(t) for t in snap.get('device_traces', []))} trace entries")
    for item in p.items:
        print(f"       {item}")
    return not p.items


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--reference", help="a snapshot PyTorch wrote: keys and types to match")
    args = ap.parse_args()
    ref = reference_shapes(args.reference) if args.reference else None
    ok = all([check_file(f, ref) for f in args.files])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
