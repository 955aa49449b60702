"""Would a split of K in two serve Llama's 128-token prefill projections better?

``bench/probe_prefill_gaps.py`` (H200, 97588c9): the seated prefill's projections take 5.25 ms of
kernels against cuBLAS's 4.25 in 32 layers. o_proj (4096 x 4096) is the worst of them for its
size: the tuner put it on the ring form unsplit, 19.8 us a call where cuBLAS's GEMMs of that
size take 13-17. Unsplit, its 64-row, 64-token tiles are 128 programs for 132 SMs, each 16 steps
of K. ``linear_mma.split_ks`` offers only the two powers of two that bring a launch to 264
programs (4 and 8 here), never 2, which would give 256 programs of 8 steps.

For each Llama projection at 128 tokens, weights in ``ring_layout``, each checked against the
reference first and timed as the adjudicator times (``ops._time_us``): every config both forms
offer (``offered``), and every unsplit one of them split in two (``split2``); the best of each
and the H200's tuned choice (``kernels/choices``).

``python3 bench/probe_prefill_splits.py OUT.json [SHAPE ...]`` with flashrt importable
(``bench/gpu_run.sh``). H200 at 2463e7c (``h200-probe-prefill-splits-2463e7c.json``): o_proj
split in two on the ``wgmma`` form 17.97 us against 20.08 offered, so that form now offers splits
from one program an SM (``split_ks(..., least=SMS)``), and this probe's second arm finds nothing
new for it there.
"""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import provenance
from flashrt.bench.probe_ring_depth import fastest, name, timed
from flashrt.bench.probe_warps import SHAPES, tuned
from flashrt.kernels import linear_mma_gluon, linear_wgmma_gluon, nvfp4, ops, ring_layout

FORMS = {"mma_gluon": linear_mma_gluon, "wgmma_gluon": linear_wgmma_gluon}
TOKENS = 128


def split_in_two(mod, m: int, n: int, k: int) -> list[dict]:
    """The form's unsplit configs split in two, where K holds two steps a split and the form
    does not offer it already."""
    offered = mod.configs(m, n, k)
    two = [{**c, "SPLIT_K": 2} for c in offered if "SPLIT_K" not in c and k >= 4 * mod.BLOCK_K]
    return [c for c in two if c not in offered]


def main(path: str, shapes: list[str]) -> None:
    result = {**provenance(), "tokens": TOKENS, "rows": []}
    torch.manual_seed(0)
    m = TOKENS
    for shape in shapes:
        n, k = SHAPES[shape]
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        ring = ring_layout.pack(w.packed)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = ops.linear_reference(x, w)

        def run(form, c, x=x, out=out, ring=ring, w=w):
            return FORMS[form].launch(x, ring, w.scales, w.global_scale, None, out, {**c, "LAYOUT": 1}, True)

        arms = {
            arm: {
                f"{form}[{name(c)}]": timed(functools.partial(run, form, c), out, ref)
                for form, mod in FORMS.items()
                for c in (mod.configs(m, n, k) if arm == "offered" else split_in_two(mod, m, n, k))
            }
            for arm in ("offered", "split2")
        }
        row = {"shape": shape, "N": n, "K": k, "M": m, "tuned": tuned(m, n, k)}
        for arm, results in arms.items():
            row[f"{arm}_us"], row[f"{arm}_config"] = fastest(results)
            row[arm] = results
        result["rows"].append(row)
        print(
            f"{shape:14s} M={m}: offered {row['offered_us']} us {row['offered_config']}; "
            f"split in two {row['split2_us']} us {row['split2_config']}; tuned {row['tuned']}",
            flush=True,
        )
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["llama_o", "llama_qkv", "llama_down", "llama_gate_up"])
