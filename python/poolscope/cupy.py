"""poolscope as CuPy's allocator.

    import poolscope
    poolscope.cupy.use(allocator="stream_pool")   # CuPy streams: stream_pool keeps them safe

cupy.cuda.set_allocator takes a function size -> MemoryPointer; the block goes back to poolscope
when CuPy drops its last reference to the memory.
"""

import importlib

from . import _lib


class _Block:
    """Owns one poolscope block; frees it when CuPy drops the last reference."""

    __slots__ = ("ptr", "size", "device", "stream", "_free")

    def __init__(self, ptr, size, device, stream, free):
        self.ptr, self.size, self.device, self.stream, self._free = ptr, size, device, stream, free

    def __del__(self):
        self._free(self.ptr, self.size, self.device, self.stream)


def allocator_function(cupy):
    """The function cupy.cuda.set_allocator takes: size -> cupy.cuda.MemoryPointer, on the
    current device and stream; raises cupy.cuda.memory.OutOfMemoryError when the pool cannot
    serve it. Size 0 gives an empty pointer (poolscope returns NULL for 0 bytes)."""
    lib = _lib.library()

    def allocate(size):
        device = cupy.cuda.runtime.getDevice()
        stream = cupy.cuda.get_current_stream().ptr
        if size == 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device), 0)
        ptr = lib.poolscope_malloc(size, device, stream)
        if not ptr:
            raise cupy.cuda.memory.OutOfMemoryError(size, -1, -1)
        owner = _Block(ptr, size, device, stream, lib.poolscope_free)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, size, owner, device), 0)

    return allocate


def use(allocator="bfc", resource=None, cupy_module=None, **options):
    """Configures the plug-in (poolscope.configure's options) and makes it CuPy's allocator.
    Returns the allocator function. `cupy_module` replaces `import cupy` (tests pass a
    stand-in)."""
    cupy = cupy_module if cupy_module is not None else importlib.import_module("cupy")
    _lib.configure(allocator=allocator, resource=resource, **options)
    fn = allocator_function(cupy)
    cupy.cuda.set_allocator(fn)
    return fn
