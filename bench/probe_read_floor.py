"""How much of a small layer's time is the timing harness's, and how much the kernel's?

The ring form's figures at one token (d1bcaa3, ``h200-probe-ring-barrier-d1bcaa3.json``) fit
``t = t0 + bytes / B`` closely: from qkv (14.16 MB, 7.75 us) and the LM head (175.0 MB, 49.65
us), B = 3.84 TB/s (91% of copy bandwidth) and t0 = 4.06 us, which then gives gate_up 21.3 us
(22.2 measured) and down 12.7 (12.8). cuBLAS bf16 carries about 4.6 us the same way. At t0 = 4.06
the four layers' geometric mean is 2.48x bf16; 3.0x needs t0 near 1.6 us.

``ops._time_us`` times a call after an L2 flush in one CUDA graph, so t0 holds the graph's launch
of the call after the flush, the first bytes' trip from HBM and the last wave's tail, besides
whatever the kernel itself spends outside its stream. Here, timed the same way: an empty kernel
(the launch alone), and a plain streaming read of each layer's NVFP4 bytes (one program an SM,
16-byte loads, ``READ_BLOCK`` words a program a step, summed so the loads stay), which is the
floor of any kernel that reads those bytes once.

``python3 bench/probe_read_floor.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).

H200, 6222c9d (``h200-probe-read-floor-6222c9d.json``): the empty kernel 0.84 us; the read
32-53% of copy bandwidth on the linear layers (qkv 9.26 us, where the ring form takes 7.07), too
few bytes in flight to be a floor. Only the launch's share of t0 (0.84 us) is settled by it.
"""

import functools
import json
import sys

import torch
import triton
import triton.language as tl
from flashrt.bench.kernels import PROBE_SHAPES, provenance
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import ops

READ_BLOCK = 4096  # int32 words a program reads a step: 16 KB, four 16-byte loads a thread at 256 threads


@triton.jit
def empty_kernel(out_ptr):
    pass


@triton.jit
def read_kernel(words_ptr, sums_ptr, n_words, BLOCK: tl.constexpr):
    """Program p reads steps p, p + programs, ... of ``BLOCK`` words and stores their sum."""
    pid, programs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(pid * BLOCK, n_words, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(words_ptr + offs, mask=offs < n_words, other=0)
    tl.store(sums_ptr + pid, tl.sum(acc, axis=0))


def wrapped_sum(t: torch.Tensor) -> int:
    return int(t.to(torch.int64).sum()) % 2**32


def read(words: torch.Tensor, sums: torch.Tensor) -> None:
    read_kernel[(sums.numel(),)](words, sums, words.numel(), BLOCK=READ_BLOCK, num_warps=8)


def main(path: str) -> None:
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "rows": []}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sums = torch.empty(sms, dtype=torch.int32, device="cuda")
    result["empty_us"] = ops._time_us(functools.partial(empty_kernel[(1,)], sums))
    print(f"empty kernel {result['empty_us']:.2f} us", flush=True)
    for layer, n, k in PROBE_SHAPES:
        nbytes = n * k // 2 + n * k // 16
        words = torch.randint(-(2**30), 2**30, (nbytes // 4,), dtype=torch.int32, device="cuda")
        read(words, sums)
        if wrapped_sum(sums) != wrapped_sum(words):  # every word read once: int32 sums agree modulo 2**32
            raise RuntimeError(f"{layer}: the read kernel's sums do not add up to the words'")
        us = ops._time_us(functools.partial(read, words, sums))
        row = {"layer": layer, "N": n, "K": k, "bytes": nbytes, "read_us": us}
        row["bandwidth_frac"] = nbytes / (us * 1e-6) / (copy_tbps * 1e12)
        result["rows"].append(row)
        print(
            f"{layer:20s} {nbytes / 1e6:7.2f} MB read in {us:7.2f} us ({row['bandwidth_frac']:.2f} of copy)", flush=True
        )
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
