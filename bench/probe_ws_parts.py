"""Do the warp-specialized form's two MMA warpgroups run faster as two partitions?

With ``WARPS = 8`` the form's MMA warps are one partition of two warpgroups: every CTA barrier
Triton puts in their loop (three a half-step under Triton 3.6, Nsight Compute's 41% of the issue
gaps on the served 256-token tile, 064291d) holds all eight, and one program fills an SM (a
256-token tile's ring is 212-222 KB), so no other warps fill the wait. ``PARTS = 2`` makes each
warpgroup a partition of its own over half the rows, with its own barriers, releasing each ring
slot to the producer with its own arrival (the slot's mbarrier counts two); the second stores
its own rows. The same MMAs in the same order: the same bits.

Same run, each from HBM (``ops._time_us``), each checked against the reference first, weights in
``ring_layout``: the H200's tuned choice (``bench/tuning``), every offered 8-warp config as one
partition and as two, and bf16 ``F.linear``, for Llama-3-8B's projections and LM head and the
expert-sized layers at ``TOKENS``.

``python3 bench/probe_ws_parts.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``); the
JSON is rewritten after each row; stops at ``DEADLINE_S``.
"""

import functools
import json
import sys
import time

import torch
from flashrt.bench.kernels import LINEAR_SHAPES, provenance
from flashrt.bench.probe_ring_depth import fastest, name, timed
from flashrt.bench.probe_warps import tuned
from flashrt.kernels import linear_wgmma_ws_gluon, nvfp4, ops, ring_layout

DEADLINE_S = 240
SHAPES = [*LINEAR_SHAPES[:4], ("o", 4096, 4096), *LINEAR_SHAPES[4:]]
TOKENS = (512, 128, 1024, 2048)


def main(path: str) -> None:
    start = time.monotonic()
    result = {**provenance(), "rows": []}
    torch.manual_seed(0)
    for m in TOKENS:
        for shape, n, k in SHAPES:
            if time.monotonic() - start > DEADLINE_S:
                print("deadline: stopping", flush=True)
                return
            eight = [c for c in linear_wgmma_ws_gluon.configs(m, n, k) if c["WARPS"] == 8]
            if not eight:
                continue
            w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
            ring = ring_layout.pack(w.packed)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)

            def run(config, x=x, ring=ring, w=w, out=out):
                config = {**config, "LAYOUT": ring_layout.RING}
                args = (x, ring, w.scales, w.global_scale, None, out, config, True)
                return functools.partial(linear_wgmma_ws_gluon.launch, *args)

            row = {"shape": shape, "N": n, "K": k, "M": m, "one": {}, "two": {}}
            choice = tuned(m, n, k)
            row["served_form"] = choice and choice[0]
            if choice and choice[0] == "wgmma_ws_gluon":
                row["served_config"] = name(choice[1])
                row["served"] = timed(run(choice[1]), out, ref)
            for c in eight:
                row["one"][name(c)] = timed(run(c), out, ref)
                two = row["two"][name(c)] = timed(run({**c, "PARTS": 2}), out, ref)
                if two["us"] is not None:
                    parted = out.clone()
                    run(c)()
                    two["same_bits"] = torch.equal(out, parted)
            dense = nvfp4.dequantize(w, torch.bfloat16)
            row["bf16_us"] = ops._time_us(functools.partial(torch.nn.functional.linear, x, dense))
            best_one, best_two = fastest(row["one"]), fastest(row["two"])
            row["best_one"], row["best_two"] = best_one, best_two
            result["rows"].append(row)
            served = row.get("served", {}).get("us")
            print(
                f"{shape:20s} M={m:4d} served {served and round(served, 2)} ({row.get('served_config')})"
                f"  one {best_one}  two {best_two}  bf16 {row['bf16_us']:.2f}"
                f"  same bits {all(r.get('same_bits') for r in row['two'].values() if r['us'] is not None)}",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
