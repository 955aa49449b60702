"""Do the expert bank's rows cut in chunks pay at 1-4 tokens?

On the H200 at one token the Qwen3-30B-A3B bank took 15.3 us a layer in the decode step's
profile (``h200-e2e-qwen3-8adad4e-b1b4.json``: gate_up 9.7, down 5.6 and its share of the
split-K reduce), about a third of copy bandwidth on the routed experts' 21 MB. Each gate_up
program walks 8 steps of one pair's 32 rows, the MMA computing 8 columns for one. The dense
ring form gained 10-20% at one token by cutting rows in chunks of K, one chunk a column
(``h200-probe-chunks-8adad4e.json``); here the same for the bank:

- the gate_up per pair with its rows in 2, 4 or 8 chunks of the hidden size (``CHUNKS``);
- the down with a token's experts side by side, one expert a column (``DOWN_SLOTS``), where the
  walk takes them one after the other (split 4 at one token, then a reduce launch).

Same run, each from HBM (``ops._time_us``), every config checked against the reference first:
the Qwen3-30B bank (E=128, top-8, 2048 x 768) at 1, 2, 4 and 8 tokens, the best config of the
earlier offer (no chunks, no slots) against the best by chunk count with the slot down (past
``SLOTS_UPTO`` tokens, where they are not offered, the configs they would be); and at one token
each half alone where it can be (the down on a fixed h).
``python3 bench/probe_moe_chunks.py OUT.json [TOKENS ...]`` with flashrt importable
(``bench/gpu_run.sh``). The first run (f714056, ``h200-probe-moe-chunks-f714056.json``) timed no
slots at 8 tokens.
"""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import _routing, provenance
from flashrt.bench.probe_ring_depth import HIDDEN, INTER, TOP_K, E, name, qwen3_bank, timed
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import moe_ring_gluon, nvfp4, ops


def down_reference(decoded: torch.Tensor, global_scale: torch.Tensor, ids: torch.Tensor, h: torch.Tensor):
    """The ring down's output for ``h [pairs, N]`` in float64: each token's experts summed, with
    ``decoded`` the down bank dequantized and its global scales taken out (the ring folds them
    into ``h``)."""
    t, top_k = ids.shape
    out = torch.zeros(t, decoded.shape[1], dtype=torch.float64, device=h.device)
    for j, e in enumerate(ids.reshape(-1).tolist()):
        out[j // top_k] += decoded[e] / global_scale[e].double() @ h[j].double()
    return out


def main(path: str, tokens: tuple[int, ...] = (1, 2, 4, 8)) -> None:
    copy_tbps = copy_bandwidth_tbps()
    shape = {"E": E, "top_k": TOP_K, "hidden": HIDDEN, "inter": INTER}
    result = {**provenance(), "copy_TBps": copy_tbps, "bank": shape}
    result["rows"] = rows = []
    torch.manual_seed(0)
    gu, dn = qwen3_bank()
    per_expert = (gu.nbytes + dn.nbytes) / E
    banks = (gu.packed, gu.scales, gu.global_scale), (dn.packed, dn.scales, dn.global_scale)
    for t in tokens:
        x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        ids, weights = _routing(t, E, TOP_K, 0)
        out = torch.empty_like(x)
        ref = ops.moe_reference(x, gu, dn, ids, weights)
        launch = functools.partial(moe_ring_gluon.launch, x, *banks, ids, weights, out)
        configs = moe_ring_gluon.configs(t, INTER, HIDDEN)
        if t > moe_ring_gluon.SLOTS_UPTO:  # not offered there: what the offered ones would be
            configs += [c for c in moe_ring_gluon.configs(1, INTER, HIDDEN) if "DOWN_SLOTS" in c]
        results = {name(c): timed(functools.partial(launch, c, False), out, ref) | {"config": c} for c in configs}
        ok = [r for r in results.values() if r["us"] is not None]
        earlier = min((r for r in ok if "DOWN_SLOTS" not in r["config"]), key=lambda r: r["us"])
        routed = len(ids.reshape(-1).unique()) * per_expert
        row = {
            "T": t, "routed_bytes": routed, "earlier_us": earlier["us"], "earlier_config": earlier["config"],
            "earlier_bandwidth_frac": routed / (earlier["us"] * 1e-6) / (copy_tbps * 1e12),
        }  # fmt: skip
        line = f"T={t:2d}: earlier offer {earlier['us']:6.2f} us ({row['earlier_bandwidth_frac']:.2f} of copy)"
        for chunks in (1, 2, 4, 8):
            these = [r for r in ok if "DOWN_SLOTS" in r["config"] and r["config"]["CHUNKS"] == chunks]
            if these:
                best = min(these, key=lambda r: r["us"])
                row[f"slots_chunks{chunks}_us"], row[f"slots_chunks{chunks}_config"] = best["us"], best["config"]
                line += f"  slots+chunks {chunks}: {best['us']:6.2f}"
        row["all"] = {k: {"us": r["us"], "rel_err": r["rel_err"]} for k, r in results.items()}
        rows.append(row)
        print(line, flush=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        if t == 1:
            h = torch.randn(t * TOP_K, INTER, device="cuda", dtype=torch.bfloat16) * 0.1
            down_ref = down_reference(nvfp4.dequantize(dn, torch.float64), dn.global_scale, ids, h)
            downs = {}
            for c in ({"DOWN_WARPS": w, "DOWN_SPLIT": s} for w in (1, 2) for s in (1, 4, 8)):
                run = functools.partial(moe_ring_gluon.launch_down, h, banks[1], ids, out, c | {"STAGES": 4})
                downs[name(c)] = timed(run, out, down_ref)
            for c in ({"DOWN_WARPS": w, "DOWN_SLOTS": 1} for w in (1, 2)):
                run = functools.partial(moe_ring_gluon.launch_down, h, banks[1], ids, out, c | {"STAGES": 4})
                downs[name(c)] = timed(run, out, down_ref)
            row["down_alone"] = downs
            print("T= 1 down alone: " + "  ".join(f"{k} {v['us'] or float('nan'):.2f}" for k, v in downs.items()))
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], tuple(int(t) for t in sys.argv[2:]) or (1, 2, 4, 8))
