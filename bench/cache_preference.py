"""The L1 / shared-memory preference Triton's loader gives kernels, and resetting it.

Triton 3.6 (the H200's) sets ``CU_FUNC_CACHE_PREFER_SHARED`` on every kernel it loads with more
than 48 KiB of shared memory (the ring forms, the Triton expert bank); cuBLAS and ATen kernels
keep the driver's default. On the H200 (6de6337, ``h200-e2e-llama-6de6337-b1.json``) every launch
in the graphs that hold such kernels waited about 0.45 us after the kernel before it, ATen's
included, against about 0.1 in the bf16 Llama graph that holds none. Whether the preference is
the cause is what ``bench/probe_graph_gaps.py`` and ``bench/e2e.py --cache-preference none``
measure: both reset it to ``CU_FUNC_CACHE_PREFER_NONE``.
"""

from __future__ import annotations

import ctypes
import functools

PREFER_NONE = 0  # CU_FUNC_CACHE_PREFER_NONE
PREFER_SHARED = 1  # CU_FUNC_CACHE_PREFER_SHARED


@functools.cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def set_cache_config(function: int, config: int) -> None:
    """``cuFuncSetCacheConfig`` on one loaded kernel (a ``CUfunction`` handle)."""
    rc = _driver().cuFuncSetCacheConfig(ctypes.c_void_p(function), ctypes.c_int(config))
    if rc != 0:
        raise RuntimeError(f"cuFuncSetCacheConfig({config}) returned CUresult {rc}")


def reset_loaded(jit_function, config: int) -> int:
    """The preference of every specialization of a Triton or Gluon kernel loaded so far;
    returns how many."""
    done = 0
    for cache in jit_function.device_caches.values():
        for kernel in cache[0].values():
            kernel._init_handles()
            set_cache_config(kernel.function, config)
            done += 1
    return done


def reset_on_load(config: int) -> None:
    """From now on, every Triton or Gluon kernel this process loads gets ``config``."""
    from triton import knobs

    def hook(module, function, name, metadata_group, hash):
        set_cache_config(function, config)

    knobs.runtime.kernel_load_end_hook.add(hook)
