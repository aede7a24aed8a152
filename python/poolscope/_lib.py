"""The ctypes layer over libpoolscope_alloc.so (poolscope_alloc.h): loading, options, stats."""

import ctypes
import json
import os
import re
import threading

from . import _paths


class PoolscopeError(ValueError):
    """A bad option or a call made too late (a pool exists already); the message names the value."""


_lock = threading.Lock()
_lib = None
# Kept alive while the library holds the function pointer.
_oom_handler = None

OOM_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p)

# Option name -> (environment variable, kind): kind "name" (one of a set), "bytes", "path".
_OPTIONS = {
    "allocator": ("POOLSCOPE_ALLOCATOR", ("naive", "best_fit", "bfc", "stream_pool")),
    "resource": ("POOLSCOPE_RESOURCE", ("cuda", "cuda_async", "pinned", "host", "vmm", "host_vmm")),
    "limit": ("POOLSCOPE_LIMIT", "bytes"),
    "initial_pool_size": ("POOLSCOPE_INITIAL_POOL_SIZE", "bytes"),
    "max_pool_size": ("POOLSCOPE_MAX_POOL_SIZE", "bytes"),
    "release_threshold": ("POOLSCOPE_RELEASE_THRESHOLD", "bytes"),
    "record": ("POOLSCOPE_RECORD", "path"),
    "profile": ("POOLSCOPE_PROFILE", "path"),
    "snapshot": ("POOLSCOPE_SNAPSHOT", "path"),
    "trace": ("POOLSCOPE_TRACE", "path"),
}

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def library_path():
    """The plug-in's path: $POOLSCOPE_ALLOC_LIBRARY, else the one built or installed with this
    package."""
    return os.environ.get("POOLSCOPE_ALLOC_LIBRARY") or _paths.LIBRARY


def library():
    """The loaded plug-in (ctypes.CDLL), loaded once. The same file PyTorch or CuPy loads, so
    dlopen hands back one library: one set of pools."""
    global _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not os.path.exists(path):
                raise PoolscopeError(
                    f"poolscope: the plug-in '{path}' does not exist (build the poolscope_alloc "
                    "target, or set POOLSCOPE_ALLOC_LIBRARY)")
            lib = ctypes.CDLL(path)
            lib.poolscope_malloc.restype = ctypes.c_void_p
            lib.poolscope_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            lib.poolscope_free.restype = None
            lib.poolscope_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                           ctypes.c_void_p]
            lib.poolscope_stats_json.restype = ctypes.c_char_p
            lib.poolscope_stats_json.argtypes = [ctypes.c_int]
            lib.poolscope_release_cached.restype = ctypes.c_size_t
            lib.poolscope_release_cached.argtypes = [ctypes.c_int]
            lib.poolscope_version.restype = ctypes.c_char_p
            lib.poolscope_version.argtypes = []
            if hasattr(lib, "poolscope_snapshot"):
                lib.poolscope_snapshot.restype = ctypes.c_int
                lib.poolscope_snapshot.argtypes = [ctypes.c_char_p]
            if hasattr(lib, "poolscope_set_oom_callback"):
                lib.poolscope_set_oom_callback.restype = None
                lib.poolscope_set_oom_callback.argtypes = [OOM_CALLBACK, ctypes.c_void_p]
            _lib = lib
        return _lib


def version():
    """The plug-in's version, "major.minor.patch"."""
    return library().poolscope_version().decode()


def stats(device=0):
    """The device's pool statistics as a dict (allocator_stats' fields, plus "device",
    "allocator", "resource", "initialized", and "error" if the pool could not be made)."""
    return json.loads(library().poolscope_stats_json(int(device)).decode())


def release_cached(device=-1):
    """Returns cached blocks to the resource (every device when device < 0); the bytes released."""
    return int(library().poolscope_release_cached(int(device)))


def parse_bytes(option, value):
    """An int of bytes from 2**30, "1G", "512M", "1.5GiB" (binary units); PoolscopeError naming
    the option otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PoolscopeError(f"poolscope: {option}={value!r} is not a byte count")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*", value.upper())
        if m is None:
            raise PoolscopeError(
                f"poolscope: {option}={value!r} is not a byte count (e.g. 4096, '512M', '20G')")
        number, unit = float(m.group(1)), m.group(2)
    scaled = number * _UNITS[unit]
    if scaled < 0 or scaled != int(scaled):
        raise PoolscopeError(f"poolscope: {option}={value!r} is not a whole number of bytes")
    return int(scaled)


def _existing_pools():
    # Devices whose pool exists already: the plug-in has read its environment for them.
    lib = library()
    found = []
    for device in range(64):
        report = json.loads(lib.poolscope_stats_json(device).decode())
        if report.get("initialized") or "error" in report:
            found.append(device)
    return found


def configure(**options):
    """Sets the plug-in's options (see the package's documentation) as its environment variables.
    Must come before the first allocation through the plug-in: a device whose pool exists already
    has read them, and is named in the PoolscopeError. Unknown options and bad values are refused
    before anything is set."""
    env = {}
    for name, value in options.items():
        if value is None:
            continue
        if name not in _OPTIONS:
            raise PoolscopeError(
                f"poolscope: unknown option '{name}' (the options are {', '.join(_OPTIONS)})")
        variable, kind = _OPTIONS[name]
        if isinstance(kind, tuple):
            if value not in kind:
                raise PoolscopeError(
                    f"poolscope: {name}={value!r} is not one of {', '.join(kind)}")
            env[variable] = str(value)
        elif kind == "bytes":
            env[variable] = str(parse_bytes(name, value))
        else:
            path = os.fspath(value)
            if not path or path.startswith("-"):
                raise PoolscopeError(f"poolscope: {name}={value!r} is not a file path")
            env[variable] = os.path.abspath(path)
    if env:
        used = _existing_pools()
        if used:
            raise PoolscopeError(
                "poolscope: configure() after the first allocation: device(s) "
                f"{', '.join(map(str, used))} already have a pool built from the old options")
    os.environ.update(env)
    return env


def snapshot(path=None):
    """Writes the PyTorch memory snapshot recorded so far (the option `snapshot` must have been
    set before the first allocation) to `path`, or to that option's file; PoolscopeError when
    recording is off or the file cannot be written (the plug-in logs why)."""
    lib = library()
    arg = None if path is None else os.fsencode(os.path.abspath(os.fspath(path)))
    if lib.poolscope_snapshot(arg) != 0:
        raise PoolscopeError(f"poolscope: snapshot({path!r}) failed (see the log line above)")


def on_oom(callback):
    """Calls callback(device, size) when an allocation does not fit; a true return retries it
    once. None removes it. The callback runs on the allocating thread and must not allocate
    through poolscope itself."""
    global _oom_handler
    lib = library()
    if not hasattr(lib, "poolscope_set_oom_callback"):
        raise PoolscopeError("poolscope: this plug-in has no poolscope_set_oom_callback")
    if callback is None:
        handler = OOM_CALLBACK()
    else:
        def handler_body(device, size, _user):
            try:
                return 1 if callback(int(device), int(size)) else 0
            except Exception:  # an exception must not cross into C: no retry
                return 0
        handler = OOM_CALLBACK(handler_body)
    lib.poolscope_set_oom_callback(handler, None)
    _oom_handler = handler
