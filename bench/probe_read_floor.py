"""How long does merely reading a layer's bytes take, timed as the kernel table times a linear?

``ops._time_us`` times a call from HBM: an L2 flush, then the call, in one CUDA graph, less the
flushes alone. A small layer's call carries what any kernel there carries: its launch after the
flush, the first bytes' trip from HBM, the last wave's tail. Llama-3-8B's qkv at one token is
14.2 MB of NVFP4 words and scales and took 7.75 us (the ring form, 46% of copy bandwidth; d1bcaa3,
``h200-probe-ring-barrier-d1bcaa3.json``). Here the same bytes, and those of the other layers,
are only read: ``torch.sum`` over int32 words (cuBLAS-free, one launch), timed the same way.
The gap between that and the linear is what the form itself costs.

``python3 bench/probe_read_floor.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import provenance
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import ops

# (layer, N, K): NVFP4 bytes are N K / 2 of words and N K / 16 of scales.
LAYERS = [
    ("qkv", 6144, 4096),
    ("o", 4096, 4096),
    ("down", 4096, 14336),
    ("gate_up", 28672, 4096),
    ("lm_head", 151936, 2048),
    ("expert_gate_up_30b", 1536, 2048),
]


def main(path: str) -> None:
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "rows": []}
    for layer, n, k in LAYERS:
        nbytes = n * k // 2 + n * k // 16
        words = torch.ones(nbytes // 4, dtype=torch.int32, device="cuda")
        total = torch.empty((), dtype=torch.int64, device="cuda")
        us = ops._time_us(functools.partial(torch.sum, words, 0, out=total))
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
