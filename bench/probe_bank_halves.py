"""Where does the expert bank's time go at 4-16 tokens: its gate_up or its down?

The Qwen3-30B bank at 8 tokens misses issue 2's 55 us, 60% of copy bandwidth and 2.5x over its
bf16 design by 2-6% (``h200-kernels.json``: 56.4-57.5 us in two calls). In the e2e step's
profile (``h200-e2e-qwen3-2b124ad-b8.json``) its gate_up took 35.3 us a layer and its slot down
23.2, at 62% and 47% of copy bandwidth on their routed bytes, but there the down is launched
with PDL and its time includes waiting for the gate_up. This times each alone, same run, from
HBM (``ops._time_us``), in the layout and config a seat serves at each token count (the
committed tuning cache's choice, or the adjudicator's): the whole bank, the down alone on a
fixed ``h`` (so the gate_up is the difference), both launched as this benchmark launches them
(the down without PDL: no torch.compile here), and the whole bank with the down launched with
PDL, as in the e2e step. Each output checked against the reference first.

``python3 bench/probe_bank_halves.py OUT.json [TOKENS ...]`` with flashrt importable
(``bench/gpu_run.sh``); the JSON is rewritten after each token count.
"""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import _routing, provenance
from flashrt.bench.probe_moe_chunks import down_reference
from flashrt.bench.probe_ring_depth import HIDDEN, INTER, TOP_K, E, qwen3_bank, timed
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import moe_fused, moe_ring_gluon, nvfp4, ops


def served_bank() -> tuple[dict, tuple, int, torch.Tensor]:
    """A bank probe's start: its result's head (provenance, copy bandwidth, the bank's shape); the
    Qwen3-30B bank, seeded, as a seat serves it on this GPU (``(gate_up, down)`` NVFP4 weights and
    their launch tuples, and the layout); and the down dequantized in float64 for
    ``down_reference``."""
    result = {
        **provenance(),
        "copy_TBps": copy_bandwidth_tbps(),
        "bank": {"E": E, "top_k": TOP_K, "hidden": HIDDEN, "inter": INTER},
    }
    torch.manual_seed(0)
    gu, dn = qwen3_bank()
    served = ops.bank_for_serving(gu, dn, moe_ring_gluon.MAX_TOKENS)
    banks = tuple((b.packed, b.scales, b.global_scale) for b in served)
    return result, ((gu, dn), banks), served[0].layout, nvfp4.dequantize(dn, torch.float64)


def served_case(t: int, bank: tuple, banks: tuple, layout: int) -> tuple:
    """``t`` tokens through ``served_bank``'s bank, routed with seed 0: ``(x, ids, weights, out,
    ref, chosen)``, the output buffer, the reference output and the choice a seat serves."""
    gu, dn = bank
    x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
    ids, weights = _routing(t, E, TOP_K, 0)
    ref = ops.moe_reference(x, gu, dn, ids, weights)
    chosen = ops.choose_moe(x, *banks, ids, weights, layout)
    return x, ids, weights, torch.empty_like(x), ref, chosen


def main(path: str, tokens: tuple[int, ...] = (4, 8, 16)) -> None:
    result, ((gu, dn), banks), layout, decoded_down = served_bank()
    copy_tbps = result["copy_TBps"]
    result["rows"] = rows = []
    gu_bytes, dn_bytes = gu.nbytes / E, dn.nbytes / E
    for t in tokens:
        x, ids, weights, out, ref, chosen = served_case(t, (gu, dn), banks, layout)
        config = ops.launch_params(chosen, layout)
        whole = functools.partial(moe_ring_gluon.launch, x, *banks, ids, weights, out, config, False)
        h = torch.randn(t * TOP_K, INTER, device="cuda", dtype=torch.bfloat16) * 0.1
        down_ref = down_reference(decoded_down, dn.global_scale, ids, h)
        grouping = moe_fused.group_pairs(ids, E, moe_ring_gluon.GROUP_TILE) if "DOWN_GROUPED" in config else None
        down = functools.partial(moe_ring_gluon.launch_down, h, banks[1], ids, out, config, grouping)
        row = {"T": t, "config": chosen.name, "bank": timed(whole, out, ref), "down": timed(down, out, down_ref)}
        saved = moe_ring_gluon.PDL_DOWN
        moe_ring_gluon.PDL_DOWN = True
        try:
            row["bank_with_pdl"] = timed(whole, out, ref)
        finally:
            moe_ring_gluon.PDL_DOWN = saved
        routed = len(ids.reshape(-1).unique())
        bank_us, down_us = row["bank"]["us"], row["down"]["us"]
        if bank_us is not None and down_us is not None:
            gate_up_us = bank_us - down_us
            row["gate_up_us"] = gate_up_us
            row["gate_up_bandwidth_frac"] = routed * gu_bytes / (gate_up_us * 1e-6) / (copy_tbps * 1e12)
            row["down_bandwidth_frac"] = routed * dn_bytes / (down_us * 1e-6) / (copy_tbps * 1e12)
        rows.append(row)
        print(
            f"T={t:2d} {chosen.name}: bank {bank_us} us, down alone {down_us}, "
            f"gate_up {row.get('gate_up_us')}, with PDL {row['bank_with_pdl']['us']}",
            flush=True,
        )
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], tuple(int(t) for t in sys.argv[2:]) or (4, 8, 16))
