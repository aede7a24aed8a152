"""poolscope's memory pools for Python programs, over the C ABI of libpoolscope_alloc.so.

    import poolscope
    poolscope.torch.use(allocator="bfc", limit="20G", trace="run.json")  # before CUDA allocates
    ...                                                                    # the program
    print(poolscope.stats())              # device 0's pool: in use, reserved, peaks, ...
    poolscope.release_cached()            # every device's cached blocks back to the GPU

    poolscope.cupy.use(allocator="stream_pool")                         # the same for CuPy

Options (``configure``, ``torch.use`` and ``cupy.use`` take them all) become the plug-in's
environment variables, which it reads at each device's first allocation, so they must be given
before anything allocates through it (a pool that exists already is refused, naming the device):

    allocator          POOLSCOPE_ALLOCATOR          naive | best_fit | bfc | stream_pool
    resource           POOLSCOPE_RESOURCE           cuda | cuda_async | pinned | host
    limit              POOLSCOPE_LIMIT              bytes a pool may hand out ("20G", 2**30)
    initial_pool_size  POOLSCOPE_INITIAL_POOL_SIZE  bytes each pool reserves at creation
    max_pool_size      POOLSCOPE_MAX_POOL_SIZE      bytes each pool may reserve from the GPU
    release_threshold  POOLSCOPE_RELEASE_THRESHOLD  cached bytes kept when memory is released
    record             POOLSCOPE_RECORD             allocator event log (poolscope replay)
    profile            POOLSCOPE_PROFILE            line profile at exit (poolscope report)
    trace              POOLSCOPE_TRACE              Chrome trace of pool events at exit
    snapshot           POOLSCOPE_SNAPSHOT           PyTorch memory snapshot at exit (and snapshot())

``on_oom(callback)`` calls ``callback(device, size)`` when an allocation does not fit; a true
return retries it once (after the callback freed memory). The library is found beside the package
(the build tree's build/lib, or the install's lib), or at $POOLSCOPE_ALLOC_LIBRARY.

Thread safety: every function may be called from any thread; ``configure`` before the first
allocation. Errors: ``PoolscopeError`` (a ValueError) for bad options, naming the value.
"""

from . import cupy, torch  # noqa: F401  (poolscope.torch.use, poolscope.cupy.use)
from ._lib import (  # noqa: F401
    PoolscopeError,
    configure,
    library,
    library_path,
    on_oom,
    release_cached,
    snapshot,
    stats,
    version,
)

__all__ = [
    "PoolscopeError",
    "configure",
    "cupy",
    "library",
    "library_path",
    "on_oom",
    "release_cached",
    "snapshot",
    "stats",
    "torch",
    "version",
]
