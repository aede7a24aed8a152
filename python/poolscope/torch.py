"""poolscope as PyTorch's CUDA allocator.

    import poolscope
    poolscope.torch.use(allocator="bfc", limit="20G")   # before the first CUDA allocation

PyTorch loads the plug-in through torch.cuda.memory.CUDAPluggableAllocator(path,
"poolscope_malloc", "poolscope_free") and change_current_allocator(), which PyTorch accepts only
before it has allocated on the GPU.
"""

import importlib

from . import _lib


def use(allocator="bfc", resource=None, torch_module=None, **options):
    """Configures the plug-in (poolscope.configure's options) and makes it PyTorch's CUDA
    allocator. Returns the CUDAPluggableAllocator. `torch_module` replaces `import torch`
    (tests pass a stand-in)."""
    torch = torch_module if torch_module is not None else importlib.import_module("torch")
    _lib.configure(allocator=allocator, resource=resource, **options)
    path = _lib.library_path()
    _lib.library()  # load it first: a missing file is named here, not inside PyTorch
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(path, "poolscope_malloc",
                                                         "poolscope_free")
    torch.cuda.memory.change_current_allocator(pluggable)
    return pluggable
