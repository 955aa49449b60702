"""Does the warpgroup form gain from decoding chunk c + 1 while chunk c's ``wgmma`` is in flight?

Same run, every ``linear_wgmma_gluon`` config a shape is offered, each with its MMAs one at a
time (``ASYNC_MMA=0``, what the form did) and pipelined one chunk deep (``ASYNC_MMA=1``), at
64, 128 and 256 tokens, against cuBLAS bf16. Both orders add the same products into the same
accumulator in the same order, so their outputs must be bit-identical. Times are
``ops._time_us`` (CUDA graph, weights past L2). ``python3 bench/probe_wgmma_async.py OUT.json``
with flashrt importable (``bench/gpu_run.sh`` makes it so).
"""

import functools
import json
import sys

import torch
import torch.nn.functional as F
from flashrt.bench.kernels import provenance
from flashrt.kernels import linear_wgmma_gluon, nvfp4, ops

SHAPES = {"qkv": (6144, 4096), "gate_up": (28672, 4096), "down": (4096, 14336), "lm_head": (128256, 4096)}


def main(path):
    torch.manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        q = nvfp4.quantize(w)
        for m in (64, 128, 256):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            bf16_us = ops._time_us(functools.partial(F.linear, x, w))
            best = {}
            for cfg in linear_wgmma_gluon.configs(m, n, k):
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                launch = functools.partial(linear_wgmma_gluon.launch, x, q.packed, q.scales, q.global_scale, None)
                us = ops._time_us(functools.partial(launch, out, cfg, False))
                mine = launch(torch.empty_like(out), cfg, False)
                twin = launch(torch.empty_like(out), {**cfg, "ASYNC_MMA": 1 - cfg["ASYNC_MMA"]}, False)
                assert torch.equal(mine, twin), f"{name} M={m} {cfg}: the two MMA orders differ"
                if cfg["ASYNC_MMA"] not in best or us < best[cfg["ASYNC_MMA"]][0]:
                    best[cfg["ASYNC_MMA"]] = (us, cfg)
            (sync_us, sync_cfg), (async_us, async_cfg) = best[0], best[1]
            rows.append({"name": name, "N": n, "K": k, "M": m, "bf16_us": bf16_us, "sync_us": sync_us,
                         "sync_config": sync_cfg, "async_us": async_us, "async_config": async_cfg})  # fmt: skip
            print(f"{name:8s} M={m:3d}: bf16 {bf16_us:7.2f}  one at a time {sync_us:7.2f}  pipelined {async_us:7.2f} us"
                  f"  x{sync_us / async_us:.2f}  vs bf16 x{bf16_us / min(sync_us, async_us):.2f}  {async_cfg}",
                  flush=True)  # fmt: skip
    with open(path, "w") as f:
        json.dump({**provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
