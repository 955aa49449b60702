"""Does the warpgroup form gain from decoding chunk c + 1 while chunk c's ``wgmma`` is in flight?

Same run, every ``linear_wgmma_gluon`` config a shape is offered, each with its MMAs one at a
time (``ASYNC_MMA=0``, what the form did) and pipelined one chunk deep (``ASYNC_MMA=1``), at
64, 128 and 256 tokens, against cuBLAS bf16; ``offered_us`` is the best in the order
``configs()`` gives each tile. Both orders add the same products into the same
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
            pairs = []
            launch = functools.partial(linear_wgmma_gluon.launch, x, q.packed, q.scales, q.global_scale, None)
            for cfg in linear_wgmma_gluon.configs(m, n, k):
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                us, results = {}, {}
                for order in (0, 1):
                    c = {**cfg, "ASYNC_MMA": order}
                    us[order] = ops._time_us(functools.partial(launch, out, c, False))
                    results[order] = launch(torch.empty_like(out), c, False)
                assert torch.equal(results[0], results[1]), f"{name} M={m} {cfg}: the two MMA orders differ"
                pairs.append({"config": {key: v for key, v in cfg.items() if key != "ASYNC_MMA"},
                              "offered": cfg["ASYNC_MMA"], "sync_us": us[0], "async_us": us[1]})  # fmt: skip
            sync = min(pairs, key=lambda p: p["sync_us"])
            pipelined = min(pairs, key=lambda p: p["async_us"])
            offered = min(p["async_us"] if p["offered"] else p["sync_us"] for p in pairs)
            rows.append({"name": name, "N": n, "K": k, "M": m, "bf16_us": bf16_us, "sync_us": sync["sync_us"],
                         "async_us": pipelined["async_us"], "offered_us": offered, "pairs": pairs})  # fmt: skip
            print(f"{name:8s} M={m:3d}: bf16 {bf16_us:7.2f}  one at a time {sync['sync_us']:7.2f}"
                  f"  pipelined {pipelined['async_us']:7.2f}  as offered {offered:7.2f} us"
                  f"  vs bf16 x{bf16_us / offered:.2f}", flush=True)  # fmt: skip
    with open(path, "w") as f:
        json.dump({**provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
