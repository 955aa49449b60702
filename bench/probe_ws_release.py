"""Does releasing ring slots later take a CTA barrier out of the warp-specialized form's loop?

Nsight Compute on Llama's gate_up at 512 tokens as served (the warp-specialized form, 256-token
tiles, one MMA warpgroup; 064291d, ``h200-ncu-gate_up512_ws256-064291d.txt``): 3.9 of its 9.5
cycles between a warp's issues stalled at a CTA barrier. Triton 3.6 puts three in each half-step
of the MMA warps' loop: the arrive that releases a slot brings its own, and its analysis of
shared memory adds one before each mbarrier wait and one after each arrive. Releasing the last
half's slot after this half's second MMA is issued (``linear_wgmma_ws_gluon.LATE_RELEASE``)
instead of between the two leaves two: the one after the arrive becomes the next wait's. Same
run, each from HBM (``ops._time_us``), each checked against the reference first, weights in
``ring_layout``, the H200's tuned configuration (``bench/tuning``) where it is the
warp-specialized form: both release points, twice each in turn, and bf16 ``F.linear``.

``python3 bench/probe_ws_release.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``); the
JSON is rewritten after each row; stops at ``DEADLINE_S``.
"""

import functools
import json
import sys
import time

import torch
from flashrt.bench.kernels import LINEAR_SHAPES, provenance
from flashrt.bench.probe_ring_depth import name, timed
from flashrt.bench.probe_warps import tuned
from flashrt.kernels import linear_wgmma_ws_gluon, nvfp4, ops, ring_layout

DEADLINE_S = 150
SHAPES = [*LINEAR_SHAPES[:4], ("o", 4096, 4096), *LINEAR_SHAPES[4:]]
TOKENS = (512, 1024, 128)


def main(path: str) -> None:
    start = time.monotonic()
    result = {**provenance(), "rows": []}
    served = linear_wgmma_ws_gluon.LATE_RELEASE
    torch.manual_seed(0)
    for m in TOKENS:
        for shape, n, k in SHAPES:
            choice = tuned(m, n, k)
            if choice is None or choice[0] != "wgmma_ws_gluon":
                continue
            if time.monotonic() - start > DEADLINE_S:
                print("deadline: stopping", flush=True)
                return
            w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
            ring = ring_layout.pack(w.packed)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)
            config = {**choice[1], "LAYOUT": ring_layout.RING}
            run = functools.partial(
                linear_wgmma_ws_gluon.launch, x, ring, w.scales, w.global_scale, None, out, config, True
            )
            row = {"shape": shape, "N": n, "K": k, "M": m, "config": name(choice[1]), "early": [], "late": []}
            try:
                for _ in range(2):
                    for arm in ("early", "late"):
                        linear_wgmma_ws_gluon.LATE_RELEASE = arm == "late"
                        row[arm].append(timed(run, out, ref))
            finally:
                linear_wgmma_ws_gluon.LATE_RELEASE = served
            dense = nvfp4.dequantize(w, torch.bfloat16)
            row["bf16_us"] = ops._time_us(functools.partial(torch.nn.functional.linear, x, dense))
            us = {arm: [r["us"] for r in row[arm]] for arm in ("early", "late")}
            result["rows"].append(row)
            print(
                f"{shape:8s} M={m:4d} {row['config']}: early {us['early']} late {us['late']} bf16 {row['bf16_us']:.2f}",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
