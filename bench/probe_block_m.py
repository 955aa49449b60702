"""The ring form's token tile under 8 tokens, same run: every ``linear_mma_gluon`` config a shape
is offered (its ring sized to the tokens), against the same configs with the 8-token ring they
had before. ``python3 bench/probe_block_m.py OUT.json`` with flashrt importable
(``bench/gpu_run.sh`` makes it so); times are ``ops._time_us`` (HBM, CUDA graph)."""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import provenance
from flashrt.kernels import linear_mma_gluon, nvfp4, ops

SHAPES = {"qkv": (6144, 4096), "gate_up": (28672, 4096), "down": (4096, 14336), "lm_head": (151936, 2048)}
rows = []
torch.manual_seed(0)
for name, (n, k) in SHAPES.items():
    w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
    for m in (1, 2, 4):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        launch = functools.partial(linear_mma_gluon.launch, x, w.packed, w.scales, w.global_scale, None, out)
        best = {}
        for cfg in linear_mma_gluon.configs(m, n, k):
            for tile in (cfg["BLOCK_M"], 8):
                c = {**cfg, "BLOCK_M": tile}
                us = ops._time_us(functools.partial(launch, c, True))
                if tile not in best or us < best[tile][0]:
                    best[tile] = (us, c)
        small, eight = best[min(best)], best[8]
        rows.append({"name": name, "N": n, "K": k, "M": m, "small_us": small[0], "small_config": small[1],
                     "eight_us": eight[0], "eight_config": eight[1]})  # fmt: skip
        print(f"{name:8s} M={m}: ring of {small[1]['BLOCK_M']} {small[0]:7.2f} us  ring of 8 {eight[0]:7.2f} us  "
              f"x{eight[0] / small[0]:.2f}  {small[1]}", flush=True)  # fmt: skip
with open(sys.argv[1], "w") as f:
    json.dump({**provenance(), "rows": rows}, f, indent=1)
