"""Would one-warp or eight-warp programs run the dense ring faster than the offered 2 and 4 warps?

``linear_mma_gluon``'s loop is mostly issue: 359 SASS instructions a step a warp, 240 of them
the decode, where the copy bandwidth leaves about 512 cycles a 64-row step on an SM (H200);
Nsight Compute saw 0.63 instructions issued a cycle a scheduler (``h200-ncu-13a1279.txt``).
Every step all the program's warps meet at a barrier (their copies landed, the slot is free):
the slowest warp sets the pace of all. A one-warp program's barrier is its own warp's, so
warps drift apart and fill each other's stalls; the price is each warp copying its own
activations (at one token 512 bytes a step against 2.3 KB of weight).

At 16 tokens the other way: a step's activations (8 KB) are as many bytes as 64 rows' weights,
so a 4-warp 4-stage ring is 70 KB and three programs (12 warps) fill an SM, where one token's
hold five (20 warps); the 16-token ring ran 1.35x slower than the one-token one on the same
weights (``h200-kernels-quick-bcb02a5.json``: 6144 x 4096, 10.62 against 7.88 us). Eight warps
share one activation slot among 128 or 256 rows.

Same run, each from HBM after a read-only L2 flush (``ops._time_us``), every config checked
against the reference first: the H200's tuned choice for the shape (``kernels/choices``), or the
best offered 4-stage config where none is cached, against the variants (``variants``).
Weights in ``ring_layout`` as seats hold them on Hopper.

``python3 bench/probe_warps.py OUT.json [SHAPE ...]`` with flashrt importable
(``bench/gpu_run.sh``).

Answer, H200 at 2e218dc (``h200-probe-warps-2e218dc.json``): no. One warp came within 1% on
Llama's down projection and was 1-19% slower elsewhere; eight warps were slower everywhere
(docs/benchmarks.md, "Kernels").
"""

import functools
import glob
import json
import os
import sys
import time

import torch
from flashrt.bench.kernels import provenance
from flashrt.bench.probe_ring_depth import name, timed
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import linear_mma_gluon, nvfp4, ops, ring_layout, tuning
from flashrt.kernels.decode import cdiv
from flashrt.kernels.linear_mma import split_ks

SHAPES = {
    "llama_gate_up": (28672, 4096),
    "llama_qkv": (6144, 4096),
    "llama_down": (4096, 14336),
    "lm_head": (151936, 2048),
    "llama_o": (4096, 4096),
}
DEADLINE_S = float(os.environ.get("PROBE_DEADLINE_S", "1e9"))


def committed(key: str) -> tuple[str, dict] | None:
    """The committed H200 choice under a tuning key (``kernels/choices``): its form and config."""
    for path in glob.glob(os.path.join(tuning.SHIPPED, "tuning-*H200*.json")):
        with open(path) as f:
            entry = json.load(f).get(key)
        if entry:
            return entry["form"], dict(entry["config"])
    return None


def tuned(m: int, n: int, k: int) -> tuple[str, dict] | None:
    """The committed H200 choice for this shape in the ring layout: its form and config."""
    return committed(f"linear:torch.bfloat16:M{m}:N{n}:K{k}:ring")


def variants(m: int, n: int, k: int) -> list[dict]:
    """One-warp programs (1, 2 or 4 row tiles, 4 or 6 stages) and eight-warp ones (1 or 2 row
    tiles, 3 or 4 stages: one activation slot shared by 128-256 rows), with their split-K and,
    at few tokens, chunked variants: those whose ring fits."""
    block_m = next(bm for bm in (1, 2, 4, 8, 16, 32, 64) if bm >= min(m, 64))
    out = []
    for warps, tile_counts, stage_counts in ((1, (1, 2, 4), (4, 6)), (8, (1, 2), (3, 4))):
        for tiles in tile_counts:
            for stages in stage_counts:
                base = {"BLOCK_M": block_m, "ROW_TILES": tiles, "WARPS": warps, "STAGES": stages}
                out.append(base)
                programs = cdiv(n, 16 * tiles * warps) * cdiv(m, block_m)
                out += [{**base, "SPLIT_K": s} for s in split_ks(programs, k, linear_mma_gluon.BLOCK_K)]
                for chunks in linear_mma_gluon.CHUNKS:
                    if m * chunks <= 8 and k % (chunks * linear_mma_gluon.BLOCK_K) == 0:
                        lanes = next(bm for bm in (2, 4, 8) if bm >= m * chunks)
                        out.append({**base, "BLOCK_M": lanes, "CHUNKS": chunks})
    return [c for c in out if linear_mma_gluon.ring_bytes(c) <= linear_mma_gluon.RING_BYTES]


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
        for m in (1, 8, 16):
            if time.monotonic() - start > DEADLINE_S:
                print("deadline: stopping", flush=True)
                return
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)

            def run(c, x=x, out=out, ring=ring, w=w):
                cfg = {**c, "LAYOUT": ring_layout.RING}
                return linear_mma_gluon.launch(x, ring, w.scales, w.global_scale, None, out, cfg, True)

            form, choice = tuned(m, n, k) or (None, None)
            choice = choice if form == "mma_gluon" else None
            baseline = [choice] if choice else [c for c in linear_mma_gluon.configs(m, n, k) if c["STAGES"] == 4]
            base = {name(c): timed(functools.partial(run, c), out, ref) | {"config": c} for c in baseline}
            warp = {name(c): timed(functools.partial(run, c), out, ref) | {"config": c} for c in variants(m, n, k)}
            best = {
                arm: min((r for r in rs.values() if r["us"] is not None), key=lambda r: r["us"], default=None)
                for arm, rs in (("offered", base), ("variant", warp))
            }
            row = {"shape": shape, "N": n, "K": k, "M": m, "baseline_is_tuned": bool(choice)}
            for arm, b in best.items():
                row[f"{arm}_us"] = b and b["us"]
                row[f"{arm}_config"] = b and b["config"]
                row[f"{arm}_bandwidth_frac"] = b and nbytes / (b["us"] * 1e-6) / (copy_tbps * 1e12)
            row["all"] = {k: {"us": r["us"], "rel_err": r["rel_err"], **({"error": r["error"]} if "error" in r else {})}
                          for k, r in {**base, **warp}.items()}  # fmt: skip
            result["rows"].append(row)
            o, q = row["offered_us"] or float("nan"), row["variant_us"] or float("nan")
            print(
                f"{shape:14s} M={m:2d}: offered {o:7.2f} us  variant {q:7.2f} us  x{o / q:.3f}"
                f"  ({row['variant_bandwidth_frac'] or 0:.2f} of copy)  {name(row['variant_config'] or {})}",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(SHAPES))
