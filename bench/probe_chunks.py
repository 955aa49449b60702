"""Do rows cut in chunks (``linear_mma_gluon``'s ``CHUNKS``) pay at 1-16 tokens?

At one token the ring form's MMA computes 8 columns and uses one. With its rows cut in C
chunks, chunk c of every row is an MMA row of its own and meets chunk c of the activations in
column c: the same weight bytes and MMAs, C times the programs (each C times fewer steps), and
no split-K partials or reduce launch, the program summing its chunks itself. On the H200 the
small projections ran at 17-37% of copy bandwidth (``h200-probe-ring-depth-8d01d40.json``:
Qwen3-30B's 2048 x 4096 o projection 6.5 us at one token, split 8 and reduced).

Same run, each from HBM (``ops._time_us``), every config checked against the reference first:
the best offered ``mma_gluon`` config without chunks, the best with, and the best
``gemv_gluon``, for Llama-3-8B's and Qwen3-30B's projections at 1, 2, 4, 8 and 16 tokens; and,
not offered, chunks filling 16 or 32 columns (``wide_chunks``: 2-8 chunks at 2-16 tokens).
The first run (8adad4e, ``h200-probe-chunks-8adad4e.json``) had 1, 2 and 4 tokens and no
16-column chunks.
``python3 bench/probe_chunks.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import provenance
from flashrt.bench.probe_ring_depth import SHAPES, name, timed
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import linear_gemv_gluon, linear_mma_gluon, nvfp4, ops


def wide_chunks(m: int, k: int) -> list[dict]:
    """Not offered (yet): chunks filling 16 or 32 MMA columns (two or four MMAs a step) at 2-16
    tokens, where the offered ones fill 8."""
    out = []
    for lanes in (16, 32):
        chunks = lanes // m
        if m * chunks == lanes and chunks in linear_mma_gluon.CHUNKS and k % (chunks * linear_mma_gluon.BLOCK_K) == 0:
            out += [
                {"BLOCK_M": lanes, "ROW_TILES": tiles, "WARPS": warps, "STAGES": 4, "CHUNKS": chunks}
                for tiles in (1, 2)
                for warps in (2, 4)
            ]
    return out


def main(path: str) -> None:
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "rows": []}
    torch.manual_seed(0)
    for shape, (n, k) in SHAPES.items():
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        nbytes = w.packed.numel() + w.scales.numel()
        for m in (1, 2, 4, 8, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)
            args = (x, w.packed, w.scales, w.global_scale, None, out)
            results = {}
            for form, mod in (("mma_gluon", linear_mma_gluon), ("gemv_gluon", linear_gemv_gluon)):
                for c in mod.configs(m, n, k):
                    run = functools.partial(mod.launch, *args, c, False)
                    results[f"{form}[{name(c)}]"] = timed(run, out, ref) | {"config": c, "form": form}
            for c in wide_chunks(m, k):
                run = functools.partial(linear_mma_gluon.launch, *args, c, False)
                results[f"mma_gluon[{name(c)}]"] = timed(run, out, ref) | {"config": c, "form": "mma_gluon"}
            row = {"shape": shape, "N": n, "K": k, "M": m}
            for way, keep in (
                ("rows", lambda r: r["form"] == "mma_gluon" and "CHUNKS" not in r["config"]),
                ("chunks", lambda r: "CHUNKS" in r["config"] and r["config"]["BLOCK_M"] <= 8),
                ("chunks_wide", lambda r: "CHUNKS" in r["config"] and r["config"]["BLOCK_M"] > 8),
                ("gemv", lambda r: r["form"] == "gemv_gluon"),
            ):
                these = [r for r in results.values() if keep(r) and r["us"] is not None]
                best = min(these, key=lambda r: r["us"], default=None)
                row[f"{way}_us"] = best and best["us"]
                row[f"{way}_config"] = best and best["config"]
                row[f"{way}_bandwidth_frac"] = best and nbytes / (best["us"] * 1e-6) / (copy_tbps * 1e12)
            row["all"] = {key: {f: r[f] for f in ("us", "rel_err", "error") if f in r} for key, r in results.items()}
            result["rows"].append(row)
            us = {way: row[f"{way}_us"] or float("nan") for way in ("rows", "chunks", "chunks_wide", "gemv")}
            print(
                f"{shape:14s} M={m}: rows {us['rows']:7.2f}  chunks {us['chunks']:7.2f}"
                f"  16-32 lanes {us['chunks_wide']:7.2f}  gemv {us['gemv']:7.2f} us"
                f"  chunks at {row['chunks_bandwidth_frac'] or 0:.2f} of copy  {row['chunks_config']}",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
