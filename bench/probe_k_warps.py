"""Does the ring form's split-K sum pay inside the program, its warps along K, at 8 and 16 tokens?

``linear_k_warps_gluon`` (its docstring says why: at 8 tokens the split forms' partials and
reduce launches are where the one-token forms' efficiency goes) against the config each card's
committed tuning table serves (``served_choices``; the split ones with their reduce launch in
the time), same run, each from HBM (``ops._time_us``), each checked against the reference
first, the weight in ``ring_layout`` as a Hopper seat serves it: Llama-3-8B's qkv, o, gate_up
and down at 8 and 16 tokens (or the token counts given after the path), every K-warps config
offered there; under ``MIN_TOKENS``, where only the chunked ring forms are offered, its 8-token
tile. At 1 and 4 tokens (``h100-probe-k-warps-1-4-a9ec47d.json``, ``MIN_TOKENS`` 5 then) the
tile won at 4 on three of the four layers and lost at one on all four.

At 98c9f4f (``h100-probe-k-warps-98c9f4f.json``) the probe had its own copy of the kernel,
which also took two row tiles a warp: within 1% of the best everywhere, so the form offers one.

``python3 bench/probe_k_warps.py OUT.json [TOKENS ...]`` with flashrt importable (``bench/gpu_run.sh OUTDIR
probe probe_k_warps``); the JSON is rewritten after each shape.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import sys

import torch
from flashrt.kernels import linear_k_warps_gluon, tuning
from flashrt.kernels import linear_mma_gluon as ring

SHAPES = {
    "llama_qkv": (6144, 4096),
    "llama_o": (4096, 4096),
    "llama_gate_up": (28672, 4096),
    "llama_down": (4096, 14336),
}
TOKENS = (8, 16)


def served_choices(m: int, n: int, k: int) -> dict[str, dict]:
    """The ring-layout config each card's committed tuning table serves ``m x n x k`` with, by
    card (``kernels/choices/``), where it is the ring form's."""
    out = {}
    for path in sorted(glob.glob(os.path.join(tuning.SHIPPED, "tuning-*.json"))):
        with open(path) as f:
            entry = json.load(f).get(f"linear:torch.bfloat16:M{m}:N{n}:K{k}:ring")
        if entry and entry["form"] == "mma_gluon":
            out[os.path.basename(path).split("-sm")[0].removeprefix("tuning-")] = dict(entry["config"])
    return out


def probed_configs(m: int, n: int, k: int) -> list[dict]:
    """The form's configs at ``m`` tokens; under ``MIN_TOKENS``, where it is not offered, its
    8-token tile (the tokens past ``m`` masked): whether it should be."""
    return linear_k_warps_gluon.configs(max(m, linear_k_warps_gluon.MIN_TOKENS), n, k)


def main(path: str, tokens: tuple[int, ...] = TOKENS) -> None:
    from flashrt.bench.kernels import provenance
    from flashrt.bench.probe_ring_depth import fastest, name, timed
    from flashrt.bench.timing import copy_bandwidth_tbps
    from flashrt.kernels import nvfp4, ops, ring_layout

    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "rows": []}
    torch.manual_seed(0)
    for shape, (n, k) in SHAPES.items():
        w = ops.for_serving(nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16)))
        layout = w.layout
        for m in tokens:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)
            params = {"LAYOUT": layout} if layout == ring_layout.RING else {}

            def run(form, config, x=x, w=w, out=out, params=params):
                form.launch(x, w.packed, w.scales, w.global_scale, None, out, config | params, False)

            served = {}
            for card, c in served_choices(m, n, k).items():
                arm = served.setdefault(name(c), timed(functools.partial(run, ring, c), out, ref) | {"config": c})
                arm.setdefault("cards", []).append(card)
            ours = {
                name(c): timed(functools.partial(run, linear_k_warps_gluon, c), out, ref) | {"config": c}
                for c in probed_configs(m, n, k)
            }
            row = {"shape": shape, "N": n, "K": k, "M": m, "layout": layout, "served": served, "k_warps": ours}
            for label, results in (("served", served), ("k_warps", ours)):
                us, key = fastest(results)
                row[f"{label}_us"], row[f"{label}_config"] = us, key
                row[f"{label}_bandwidth_frac"] = None if us is None else w.nbytes / (us * 1e-6) / (copy_tbps * 1e12)
            result["rows"].append(row)
            print(
                f"{shape} M={m}: served {row['served_us']} us ({row['served_config']}), "
                f"k_warps {row['k_warps_us']} us ({row['k_warps_config']})",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], tuple(int(t) for t in sys.argv[2:]) or TOKENS)
