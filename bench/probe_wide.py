"""Would wider programs pay for the ring forms that cut rows in chunks, at 1-8 tokens?

The offered configs of the chunked forms stop at 4 warps for the dense layers and at 2 warps for
the expert bank's slot down (``moe_ring_gluon.configs``: 16-row slot programs ran 1-6% behind
32-row ones on the H200, ``h200-probe-moe-chunks-f714056.json``; 64-row ones were never timed).
At 8 tokens the Qwen3-30B bank's slot down moves its routed bytes at about half of copy
bandwidth (``h200-e2e-qwen3-2b124ad-b8.json``: 23.2 us a layer for 45.6 MB of routed experts),
its gate_up at 62%; and Llama-3-8B's qkv and o projections reach 48% and under at one token,
where gate_up reaches 73% (``h200-kernels.json``, 856a2cf). Each of those programs is a few
ring steps long, so a wider one keeps more bytes in flight for each program's ramp. This times,
same run, each from HBM (``ops._time_us``), each checked against the reference first, in the
layout a seat serves (``ring_layout`` on Hopper):

- the Qwen3-30B bank (E=128, top-8, 2048 x 768) at 1, 2, 4 and 8 tokens: every offered config
  with the slot down, then each of those with a 4-warp slot down, a 4-warp gate_up, or both;
- Llama-3-8B's qkv and o at one token: every offered config with chunks, then each of those
  with twice its warps (to 8) and with 5 or 6 stages.

``python3 bench/probe_wide.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``); the
JSON is rewritten after each shape.
"""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import _routing, provenance
from flashrt.bench.probe_ring_depth import HIDDEN, INTER, SHAPES, TOP_K, E, fastest, name, qwen3_bank, timed
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import linear_mma_gluon, moe_ring_gluon, nvfp4, ops, ring_layout

BANK_TOKENS = (1, 2, 4, 8)
DENSE = ("llama_qkv", "llama_o")


def bank_variants(config: dict) -> list[dict]:
    return [
        {**config, "DOWN_WARPS": 4},
        {**config, "WARPS": 4},
        {**config, "DOWN_WARPS": 4, "WARPS": 4},
    ]


def dense_variants(config: dict) -> list[dict]:
    out = [{**config, "WARPS": 2 * config["WARPS"]}] if config["WARPS"] < 8 else []
    return out + [{**config, "STAGES": s} for s in (5, 6)]


def compare(offered: list[dict], variants, run, out, ref, routed_bytes: float, copy_tbps: float) -> dict:
    """Every offered config and its variants timed; the best of each set with its bandwidth."""
    base = {name(c): timed(functools.partial(run, c), out, ref) | {"config": c} for c in offered}
    extra = {}
    for c in offered:
        for v in variants(c):
            if name(v) not in base and name(v) not in extra:
                extra[name(v)] = timed(functools.partial(run, v), out, ref) | {"config": v}
    row = {"all": base | extra}
    for label, results in (("offered", base), ("wider", extra)):
        us, key = fastest(results)
        row[f"{label}_us"], row[f"{label}_config"] = us, key
        row[f"{label}_bandwidth_frac"] = None if us is None else routed_bytes / (us * 1e-6) / (copy_tbps * 1e12)
    return row


def report(label: str, row: dict) -> None:
    offered, wider = (f"{row[f'{s}_us']} us ({row[f'{s}_config']})" for s in ("offered", "wider"))
    print(f"{label}: offered {offered}, wider {wider}")


def bank(copy_tbps: float, rows: list, write) -> None:
    torch.manual_seed(0)
    gu, dn = qwen3_bank()
    gu_served, dn_served = ops.bank_for_serving(gu, dn, moe_ring_gluon.MAX_TOKENS)
    layout = gu_served.layout
    per_expert = (gu.nbytes + dn.nbytes) / E
    banks = tuple((b.packed, b.scales, b.global_scale) for b in (gu_served, dn_served))
    for t in BANK_TOKENS:
        x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        ids, weights = _routing(t, E, TOP_K, 0)
        out = torch.empty_like(x)
        ref = ops.moe_reference(x, gu, dn, ids, weights)

        def run(config, x=x, ids=ids, weights=weights, out=out):
            params = config | {"LAYOUT": layout} if layout == ring_layout.RING else config
            moe_ring_gluon.launch(x, *banks, ids, weights, out, params, False)

        offered = [c for c in moe_ring_gluon.configs(t, INTER, HIDDEN) if "DOWN_SLOTS" in c]
        routed = len(ids.reshape(-1).unique()) * per_expert
        row = compare(offered, bank_variants, run, out, ref, routed, copy_tbps)
        rows.append({"shape": "qwen3_bank", "T": t, "routed_bytes": routed, "layout": layout, **row})
        report(f"bank T={t}", row)
        write()


def dense(copy_tbps: float, rows: list, write) -> None:
    torch.manual_seed(0)
    for shape in DENSE:
        n, k = SHAPES[shape]
        w = ops.for_serving(nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16)))
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        ref = ops.linear_reference(x, w)

        def run(config, x=x, w=w, out=out):
            params = config | {"LAYOUT": w.layout} if w.layout == ring_layout.RING else config
            linear_mma_gluon.launch(x, w.packed, w.scales, w.global_scale, None, out, params, False)

        offered = [c for c in linear_mma_gluon.configs(1, n, k) if "CHUNKS" in c]
        row = compare(offered, dense_variants, run, out, ref, w.nbytes, copy_tbps)
        rows.append({"shape": shape, "N": n, "K": k, "M": 1, "layout": w.layout, **row})
        report(f"{shape} M=1", row)
        write()


def main(path: str) -> None:
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "rows": []}

    def write() -> None:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    bank(copy_tbps, result["rows"], write)
    dense(copy_tbps, result["rows"], write)


if __name__ == "__main__":
    main(sys.argv[1])
