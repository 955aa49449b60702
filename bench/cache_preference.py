"""The L1 / shared-memory preference Triton's loader gives kernels, and resetting it.

Triton 3.6 (the H200's) sets ``CU_FUNC_CACHE_PREFER_SHARED`` on every kernel it loads with more
than 48 KiB of shared memory (the ring forms, the Triton expert bank), and its dynamic shared
memory limit to the device's maximum; cuBLAS and ATen kernels keep the driver's defaults. On the
H200 (6de6337, ``h200-e2e-llama-6de6337-b1.json``) every launch in the graphs that hold such
kernels waited about 0.45 us after the kernel before it, ATen's included, against about 0.1 in
the bf16 Llama graph that holds none. It is not the cause: in ``bench/probe_graph_gaps.py``
(f1e1d2e, ``h200-probe-graph-gaps-f1e1d2e.json``) a graph of ATen adds waited 0.28 us before an
add with the Gluon ring in it as Triton loads it, with its preference reset, with its limit cut
and with both, as with ATen alone; torch.compile's PDL removed the wait (0d80628).
``bench/e2e.py --cache-preference none`` resets every Triton kernel's preference (not run).
"""

from __future__ import annotations

import ctypes
import functools

PREFER_NONE = 0  # CU_FUNC_CACHE_PREFER_NONE
PREFER_SHARED = 1  # CU_FUNC_CACHE_PREFER_SHARED
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


@functools.cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def set_cache_config(function: int, config: int) -> None:
    """``cuFuncSetCacheConfig`` on one loaded kernel (a ``CUfunction`` handle)."""
    rc = _driver().cuFuncSetCacheConfig(ctypes.c_void_p(function), ctypes.c_int(config))
    if rc != 0:
        raise RuntimeError(f"cuFuncSetCacheConfig({config}) returned CUresult {rc}")


def _loaded(jit_function) -> list:
    """Every specialization of a Triton or Gluon kernel compiled so far, loaded."""
    kernels = [k for cache in jit_function.device_caches.values() for k in cache[0].values()]
    for kernel in kernels:
        kernel._init_handles()
    return kernels


def reset_loaded(jit_function, config: int) -> int:
    """The preference of every loaded specialization of a kernel; returns how many."""
    kernels = _loaded(jit_function)
    for kernel in kernels:
        set_cache_config(kernel.function, config)
    return len(kernels)


def limit_loaded(jit_function) -> int:
    """Each loaded specialization's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` down to
    what it launches with (Triton's loader sets every kernel past 48 KiB to the device's
    opt-in maximum, 227 KiB on the H200, whatever it needs); returns how many."""
    kernels = _loaded(jit_function)
    for kernel in kernels:
        attribute, limit = ctypes.c_int(MAX_DYNAMIC_SHARED_SIZE_BYTES), ctypes.c_int(kernel.metadata.shared)
        rc = _driver().cuFuncSetAttribute(ctypes.c_void_p(kernel.function), attribute, limit)
        if rc != 0:
            raise RuntimeError(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) returned CUresult {rc}")
    return len(kernels)


def reset_on_load(config: int) -> None:
    """From now on, every Triton or Gluon kernel this process loads gets ``config``."""
    from triton import knobs

    def hook(module, function, name, metadata_group, hash):
        set_cache_config(function, config)

    knobs.runtime.kernel_load_end_hook.add(hook)
