"""Would the ``wgmma`` form, with a token tile of 8-32, beat the ring form at 8-32 tokens?

At 16 tokens the ring form (``linear_mma_gluon``) runs 1.3x slower than at one on the same
weights (H200, Llama's gate_up: 28.95 against 22.20 us, ``h200-probe-warps-2e218dc.json``) on
10% more instructions a step (380 against 346 SASS for sm_90). What grows is shared-memory
traffic: ``mma.sync`` needs every warp to load the whole activation step into registers for
its 16 weight rows, at 16 tokens 8 KB a warp against 2.3 KB of the warp's weight bytes, where
``wgmma`` reads its B operand, the activations, once per warpgroup of 64 rows and straight from
shared memory. ``linear_wgmma_gluon`` is offered from 17 tokens with a 64-token tile; ``wgmma``'s
N may be any multiple of 8, so here its token tile is 8, 16 or 32 (the fewest that hold the
batch), 1 or 2 row tiles, 4 or 8 warps, 2-4 stages, and the split-K variants; its activations
permuted once per call (``permute_steps``, a launch of its own, timed with it).

Same run, each from HBM after a read-only L2 flush (``ops._time_us``), each checked against the
reference first, weights in ``ring_layout``: the H200's tuned choice for the shape
(``kernels/choices``), else the best offered ``mma_gluon`` 4-stage config, against those.

``python3 bench/probe_wgmma_tokens.py OUT.json [SHAPE ...]`` with flashrt importable
(``bench/gpu_run.sh``).

Answer, H200 at ad512bb (``h200-probe-wgmma-tokens-ad512bb.json``, cut by its deadline after
qkv): no at 8 and 16 tokens (0.81-0.91x the ring form), yes at 32 for gate_up (36.40 against
40.18 us) and even for qkv (13.75 against 13.88): the form offers a 32-token tile at 17-32.
"""

import functools
import json
import sys
import time

import torch
from flashrt.bench.kernels import provenance
from flashrt.bench.probe_ring_depth import fastest, name, timed
from flashrt.bench.probe_warps import DEADLINE_S, SHAPES, tuned
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import linear_mma_gluon, linear_wgmma_gluon, nvfp4, ops, ring_layout
from flashrt.kernels.decode import cdiv
from flashrt.kernels.linear_mma import split_ks

FORMS = {"mma_gluon": linear_mma_gluon, "wgmma_gluon": linear_wgmma_gluon}


def variants(m: int, n: int, k: int) -> list[dict]:
    block_m = next(bm for bm in (8, 16, 32) if bm >= m)
    out = []
    for tiles in (1, 2):
        for warps in (4, 8):
            for stages in (2, 3, 4):
                base = {"BLOCK_M": block_m, "ROW_TILES": tiles, "WARPS": warps, "STAGES": stages}
                if linear_wgmma_gluon.ring_bytes(base) > linear_wgmma_gluon.RING_BYTES:
                    continue
                base["ASYNC_MMA"] = int(block_m * tiles < linear_wgmma_gluon.ASYNC_MMA_SPILLS)
                out.append(base)
                programs = cdiv(n, 16 * tiles * warps) * cdiv(m, block_m)
                out += [{**base, "SPLIT_K": s} for s in split_ks(programs, k, linear_wgmma_gluon.BLOCK_K)]
    return out


def main(path: str, shapes: list[str]) -> None:
    start = time.monotonic()
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "rows": []}
    torch.manual_seed(0)
    for shape in shapes:
        n, k = SHAPES[shape]
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        ring = ring_layout.pack(w.packed)
        nbytes = w.packed.numel() + w.scales.numel()
        for m in (8, 16, 32):
            if time.monotonic() - start > DEADLINE_S:
                print("deadline: stopping", flush=True)
                return
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)

            def run(form, c, x=x, out=out, ring=ring, w=w):
                cfg = {**c, "LAYOUT": ring_layout.RING}
                return FORMS[form].launch(x, ring, w.scales, w.global_scale, None, out, cfg, True)

            choice = tuned(m, n, k)
            is_tuned = bool(choice) and choice[0] in FORMS
            if is_tuned:
                baseline = [choice]
            else:
                offered = [c for c in linear_mma_gluon.configs(m, n, k) if c["STAGES"] == 4]
                baseline = [("mma_gluon", c) for c in offered]
                baseline += [("wgmma_gluon", c) for c in linear_wgmma_gluon.configs(m, n, k)]
            arms = {
                "offered": {f"{f}[{name(c)}]": timed(functools.partial(run, f, c), out, ref) for f, c in baseline},
                "wgmma_small": {
                    f"wgmma_gluon[{name(c)}]": timed(functools.partial(run, "wgmma_gluon", c), out, ref)
                    for c in variants(m, n, k)
                },
            }
            row = {"shape": shape, "N": n, "K": k, "M": m, "baseline_is_tuned": is_tuned}
            for arm, results in arms.items():
                us, key = fastest(results)
                row[f"{arm}_us"], row[f"{arm}_config"] = us, key
                row[f"{arm}_bandwidth_frac"] = us and nbytes / (us * 1e-6) / (copy_tbps * 1e12)
                row[arm] = results
            result["rows"].append(row)
            o, s = row["offered_us"] or float("nan"), row["wgmma_small_us"] or float("nan")
            print(
                f"{shape:14s} M={m:2d}: offered {o:7.2f} us  wgmma small tile {s:7.2f} us  x{o / s:.3f}"
                f"  ({row['wgmma_small_bandwidth_frac'] or 0:.2f} of copy)  {row['wgmma_small_config']}"
                f"  vs {row['offered_config']}",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(SHAPES))
