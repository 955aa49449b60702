"""Does summing split-K partials in the projection (``FOLD_SPLITS``) beat the reduce launch after it?

Every split-K launch of the ring forms is followed by ``linear_mma.reduce_splits``: a second
kernel in the graph. In the seated graphs on the H200 every launch waited about 0.45 us after the
one before it (6de6337, ``h200-e2e-llama-6de6337-b1.json``), and a reduce runs a few more; at 8
tokens Llama-3-8B's tuned qkv, o_proj, gate_up and down all split (``kernels/choices``), 128
reduces a step, and at 128 tokens (prefill) three of the four. ``_fold_splits`` has the last
split of each tile to arrive sum the tile's partials instead, in the same order: no launch.

For every committed H200 choice in the ring layout that splits K (``mma_gluon`` at 2-16 tokens,
``wgmma_gluon`` at 17-256): the output of both ways compared bit for bit, then each timed as the
adjudicator times (``ops._time_us``: a call from HBM after an L2 flush) and in a CUDA graph of
layers (``timing.graph_us``: a call on rotated weight copies, each followed by a small ATen add
as a residual would be), so the launch the fold removes is paid as a step pays it. And, for the
shapes in ``SWEEP``, every split config the form offers both ways: whether the fold would choose
another split.

``python3 bench/probe_fold.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import functools
import glob
import json
import os
import sys
import time

import torch
from flashrt.bench.kernels import provenance
from flashrt.bench.probe_ring_depth import name
from flashrt.bench.timing import copies_for, graph_us
from flashrt.kernels import linear_mma_gluon, linear_wgmma_gluon, nvfp4, ops, ring_layout, tuning

FORMS = {"mma_gluon": linear_mma_gluon, "wgmma_gluon": linear_wgmma_gluon}
# Llama-3-8B's four projections at 8 tokens (decode) and 128 (prefill): every split config offered.
SWEEP = {(m, n, k) for m in (8, 128) for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))}
DEADLINE_S = float(os.environ.get("PROBE_DEADLINE_S", "1e9"))


def split_choices() -> list[tuple[int, int, int, str, dict]]:
    """``(M, N, K, form, config)`` of every committed H200 ring-layout choice that splits K."""
    out = []
    for path in sorted(glob.glob(os.path.join(tuning.SHIPPED, "tuning-*H200*.json"))):
        with open(path) as f:
            table = json.load(f)
        for key, entry in sorted(table.items()):
            parts = key.split(":")
            config = dict(entry["config"])
            if parts[0] == "linear" and parts[-1] == "ring" and entry["form"] in FORMS and config.get("SPLIT_K", 1) > 1:
                m, n, k = (int(p[1:]) for p in parts[2:5])
                out.append((m, n, k, entry["form"], config))
    return out


def both_ways(run) -> dict:
    """The reduce's output and the fold's, compared bit for bit over repeated calls."""
    outs = {}
    for fold in (False, True):
        linear_mma_gluon.FOLD_SPLITS = fold
        outs[fold] = [run().clone() for _ in range(3)]
    linear_mma_gluon.FOLD_SPLITS = False
    return {"bit_exact": all(torch.equal(o, outs[False][0]) for o in outs[True] + outs[False])}


def timed_both(run, layers) -> dict:
    """Each way timed alone (the adjudicator's clock) and in a graph of layers."""
    row = {}
    for fold in (False, True):
        linear_mma_gluon.FOLD_SPLITS = fold
        arm = "fold" if fold else "reduce"
        row[f"{arm}_us"] = round(ops._time_us(run), 2)
        row[f"{arm}_graph_us"] = round(graph_us(layers), 2)
    linear_mma_gluon.FOLD_SPLITS = False
    row["ratio"] = round(row["reduce_us"] / row["fold_us"], 3)
    row["graph_ratio"] = round(row["reduce_graph_us"] / row["fold_graph_us"], 3)
    return row


def main(path: str) -> None:
    started = time.monotonic()
    result = {**provenance(), "rows": [], "sweeps": []}
    torch.manual_seed(0)
    for m, n, k, form, config in split_choices():
        mod = FORMS[form]
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        ring = ring_layout.pack(w.packed)
        packed = [ring] + [ring.clone() for _ in range(copies_for(n * k // 2) - 1)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        residual = torch.zeros(m, 4096, device="cuda", dtype=torch.bfloat16)

        def run(c, p=ring, mod=mod, x=x, out=out, w=w):
            return mod.launch(x, p, w.scales, w.global_scale, None, out, {**c, "LAYOUT": 1}, True)

        def layer(c, p, run=run, residual=residual):
            run(c, p)
            residual.add_(1)

        cfg = {**config, "LAYOUT": 1}
        row = {"M": m, "N": n, "K": k, "form": form, "config": name(cfg)}
        row |= both_ways(functools.partial(run, config))
        row |= timed_both(functools.partial(run, config), [functools.partial(layer, config, p) for p in packed])
        result["rows"].append(row)
        print(
            f"{form:12s} M={m:4d} N={n:6d} K={k:6d} {row['config']}: exact {row['bit_exact']}; alone reduce "
            f"{row['reduce_us']} fold {row['fold_us']} ({row['ratio']}x); layers {row['reduce_graph_us']} "
            f"{row['fold_graph_us']} ({row['graph_ratio']}x)",
            flush=True,
        )
        if (m, n, k) in SWEEP and time.monotonic() - started < DEADLINE_S:
            sweep = {"M": m, "N": n, "K": k, "form": form, "configs": {}}
            for c in mod.configs(m, n, k):
                if c.get("SPLIT_K", 1) > 1:
                    timings = {}
                    for fold in (False, True):
                        linear_mma_gluon.FOLD_SPLITS = fold
                        timings["fold" if fold else "reduce"] = round(ops._time_us(functools.partial(run, c)), 2)
                    linear_mma_gluon.FOLD_SPLITS = False
                    sweep["configs"][name(c)] = timings
            for arm in ("reduce", "fold"):
                best = min(sweep["configs"].items(), key=lambda kv: kv[1][arm])
                sweep[f"best_{arm}"] = {"config": best[0], "us": best[1][arm]}
            result["sweeps"].append(sweep)
            print(f"  sweep: best reduce {sweep['best_reduce']}, best fold {sweep['best_fold']}", flush=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
