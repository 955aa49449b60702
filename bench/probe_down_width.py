"""Does the expert bank's down gain from wider programs or a shallower ring at 4-16 tokens?

The Qwen3-30B bank's down moves its routed bytes at 51-53% of copy bandwidth at 4-16 tokens,
its gate_up at 59-64% (``h200-probe-bank-halves-d668d20.json``); at the gate_up's rate the
8-token bank would take 52.8 us against issue 2's 55. Every down program reads its token's (slot
down) or its tile's (grouped down) rows of ``h`` for each of its ring steps, as many bytes as a
program of 32 weight rows reads of weights: the slot down's 32-row programs at 8 tokens read
about 50 MB of ``h`` from L2 beside 57 MB of weights. 64-row programs halved that and gained
1.5-2.8% (``h200-probe-wide-b14cfbb.json``); 128-row ones (8 warps) quarter it but hold 88 KiB
of ring at 4 stages, two programs an SM, where a 768-wide down is 3 ring steps and a fourth stage
holds nothing: so also 3 stages (``DOWN_STAGES``).

Same run, each from HBM (``ops._time_us``), each output checked against the reference first, in
the layout a seat serves: at each token count the served config (the committed tuning cache's
choice, or the adjudicator's), then its gate_up with every down of: the slot down at 2, 4 and 8
warps, the grouped down at 1, 2, 4 and 8, each with 3 and 4 stages; each down alone on a fixed
``h`` and in the whole bank.

With ``--row-tiles``, the slot down at 1, 2 and 4 warps of 1, 2 and 4 row tiles a warp instead:
Nsight Compute on the 8-token bank (``h200-ncu-ring8-db199b9.txt``) has the slot down issuing
at about 60% of the schedulers' rate, where each warp loads the step's 8 columns of ``h`` from
shared memory for its 16 rows (4 KiB against 2 KiB of its weights); a second row tile a warp
uses each load twice.

A slot down walking 2-16 row blocks a program, its ring flowing from one block into the next
(d685263 to a1cc4fb, ``--row-walk``), lost at every count: the down alone 27.0-44.1 us at 8
tokens against the served 21.2 (``h200-probe-down-walk-a1cc4fb.json``); it was taken out.

``python3 bench/probe_down_width.py OUT.json [TOKENS ...] [--row-tiles]`` with flashrt
importable (``bench/gpu_run.sh``); the JSON is rewritten after each token count.
"""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import _routing
from flashrt.bench.probe_bank_halves import served_bank
from flashrt.bench.probe_moe_chunks import down_reference
from flashrt.bench.probe_ring_depth import HIDDEN, INTER, TOP_K, E, fastest, name, timed
from flashrt.kernels import moe_fused, moe_ring_gluon, ops

DOWN_KEYS = ("DOWN_WARPS", "DOWN_STAGES", "DOWN_SLOTS", "DOWN_GROUPED", "DOWN_SPLIT", "DOWN_ROW_TILES")


def downs(row_tiles: bool) -> list[dict]:
    if row_tiles:
        return [{"DOWN_SLOTS": 1, "DOWN_WARPS": w, "DOWN_ROW_TILES": r} for w in (1, 2, 4) for r in (1, 2, 4)]
    slots = [{"DOWN_SLOTS": 1, "DOWN_WARPS": w} for w in (2, 4, 8)]
    grouped = [{"DOWN_GROUPED": 1, "DOWN_WARPS": w} for w in (1, 2, 4, 8)]
    return [{**d, "DOWN_STAGES": s} for d in slots + grouped for s in (3, 4)]


def main(path: str, tokens: tuple[int, ...] = (4, 8, 16), row_tiles: bool = False) -> None:
    result, ((gu, dn), banks), layout, decoded_down = served_bank()
    copy_tbps = result["copy_TBps"]
    result["rows"] = rows = []
    dn_bytes = dn.nbytes / E
    for t in tokens:
        x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        ids, weights = _routing(t, E, TOP_K, 0)
        out = torch.empty_like(x)
        ref = ops.moe_reference(x, gu, dn, ids, weights)
        h = torch.randn(t * TOP_K, INTER, device="cuda", dtype=torch.bfloat16) * 0.1
        down_ref = down_reference(decoded_down, dn.global_scale, ids, h)
        grouping = moe_fused.group_pairs(ids, E, moe_ring_gluon.GROUP_TILE)
        routed_down_bytes = len(ids.reshape(-1).unique()) * dn_bytes
        chosen = ops.launch_params(ops.choose_moe(x, *banks, ids, weights, layout), layout)
        gate_up = {k: v for k, v in chosen.items() if k not in DOWN_KEYS}
        configs = [chosen] + [gate_up | d for d in downs(row_tiles)]
        timings = {}
        for config in configs:
            key = name(config)
            if key in timings:
                continue
            whole = functools.partial(moe_ring_gluon.launch, x, *banks, ids, weights, out, config, False)
            down = functools.partial(moe_ring_gluon.launch_down, h, banks[1], ids, out, config, grouping)
            entry = {"config": config, "bank": timed(whole, out, ref), "down": timed(down, out, down_ref)}
            if entry["down"]["us"] is not None:
                seconds = entry["down"]["us"] * 1e-6
                entry["down_bandwidth_frac"] = routed_down_bytes / seconds / (copy_tbps * 1e12)
            timings[key] = entry
            print(f"T={t:2d} {key}: bank {entry['bank']['us']} us, down {entry['down']['us']}", flush=True)
        served_key = name(chosen)
        best_us, best_key = fastest({k: v["bank"] for k, v in timings.items()})
        rows.append(
            {
                "T": t,
                "served": served_key,
                "served_bank_us": timings[served_key]["bank"]["us"],
                "best": best_key,
                "best_bank_us": best_us,
                "all": timings,
            }
        )
        print(f"T={t:2d} served {served_key} {rows[-1]['served_bank_us']} us; best {best_key} {best_us}", flush=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    row_tiles = "--row-tiles" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--row-tiles"]
    main(args[0], tuple(int(t) for t in args[1:]) or (4, 8, 16), row_tiles)
