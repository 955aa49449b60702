"""Do the ring forms gain from more than one chain of MMAs a step?

A ring step multiplies a 256-wide slice of K: 16 ``mma.sync.m16n8k16`` a warp a row tile, each
accumulating into the one before it. A warp issues in order, so each MMA waits for the last to
finish; the SASS of Llama's qkv at one token (sm_90, tuned config) has about 18 decode
instructions between two MMAs, fewer cycles than an MMA takes. Nsight Compute on these forms
found warps mostly stalled, 0.63 instructions issued a cycle a scheduler (``h200-ncu-13a1279.txt``).
``linear_mma_gluon.MMA_CHAINS`` cuts each step's K into 2 or 4 parts whose MMAs start from zero
and are summed after (same instructions, 4 or 12 more adds a step, more registers: 67, 84, 101
a thread for that qkv config), so the MMAs of one part no longer wait for the other's.

Each arm compiles in a process of its own with a fresh Triton cache (the chain count is a module
constant the kernel reads when it compiles). In each: the H200's tuned ring config
(``bench/tuning``) of every probe layer at 1, 4 and 16 tokens, weights in ``ring_layout`` as
seats hold them on Hopper, checked against the reference first, then timed as the adjudicator
times (``ops._time_us``); and the Qwen3-30B-A3B expert bank as served (``ops.moe``) at 1, 8 and
16 tokens, timed as the kernel table times it. cuBLAS bf16 in the first arm.

``python3 bench/probe_mma_chains.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import json
import os
import subprocess
import sys
import tempfile

ARMS = (1, 2, 4)
TOKENS = (1, 4, 16)
BANK_TOKENS = (1, 8, 16)


def patch(chains: int) -> None:
    from flashrt.kernels import linear_mma_gluon
    from triton.experimental.gluon import language as gl

    linear_mma_gluon.MMA_CHAINS = chains
    linear_mma_gluon._MMA_CHAINS = gl.constexpr(chains)


def linear_rows(chains: int) -> list[dict]:
    import functools

    import torch
    import torch.nn.functional as F
    from flashrt.bench.kernels import PROBE_SHAPES
    from flashrt.bench.probe_ring_depth import rel_err
    from flashrt.bench.probe_warps import tuned
    from flashrt.kernels import linear_mma_gluon, nvfp4, ops, ring_layout

    rows = []
    torch.manual_seed(0)
    for shape, n, k in PROBE_SHAPES:
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        ring = ring_layout.pack(w.packed)
        for m in TOKENS:
            form, config = tuned(m, n, k) or (None, None)
            if form != "mma_gluon":
                continue
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            cfg = {**config, "LAYOUT": ring_layout.RING}
            run = functools.partial(linear_mma_gluon.launch, x, ring, w.scales, w.global_scale, None, out, cfg, True)
            run()
            row = {
                "shape": shape,
                "N": n,
                "K": k,
                "M": m,
                "config": config,
                "rel_err": rel_err(out, ops.linear_reference(x, w)),
            }
            row["us"] = ops._time_us(run) if row["rel_err"] < 1e-2 else None
            if chains == 1:
                bf16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                row["bf16_us"] = ops._time_us(functools.partial(F.linear, x, bf16))
            rows.append(row)
            print(
                f"chains={chains} {shape:20s} M={m:2d} {row['us'] or float('nan'):8.2f} us  err {row['rel_err']:.1e}",
                flush=True,
            )
    return rows


def bank_rows(chains: int) -> list[dict]:
    import torch
    from flashrt.bench.kernels import MOE_SHAPES, _rel_err, _routing
    from flashrt.bench.timing import graph_us
    from flashrt.kernels import moe_ring_gluon, nvfp4, ops

    name, e, top_k, hidden, inter = MOE_SHAPES[0]
    torch.manual_seed(0)
    w13 = torch.randn(e, 2 * inter, hidden, dtype=torch.bfloat16, device="cuda") * 0.02
    w2 = torch.randn(e, hidden, inter, dtype=torch.bfloat16, device="cuda") * 0.02
    gu, dn = ops.bank_for_serving(nvfp4.quantize(w13), nvfp4.quantize(w2), moe_ring_gluon.MAX_TOKENS)
    rows = []
    for t in BANK_TOKENS:
        x = torch.randn(t, hidden, dtype=torch.bfloat16, device="cuda")
        routings = [_routing(t, e, top_k, seed) for seed in range(8)]
        ids, weights = routings[0]
        err = _rel_err(ops.moe(x, gu, dn, ids, weights), ops.moe_reference(x, gu, dn, ids, weights))
        us = graph_us([lambda r=r, x=x: ops.moe(x, gu, dn, r[0], r[1]) for r in routings]) if err < 1e-2 else None
        rows.append({"bank": name, "M": t, "rel_err": err, "us": us})
        print(f"chains={chains} bank {name} T={t:2d} {us or float('nan'):8.2f} us  err {err:.1e}", flush=True)
    return rows


def run_arm(chains: int, path: str) -> None:
    patch(chains)
    rows = linear_rows(chains) + bank_rows(chains)
    with open(path, "w") as f:
        json.dump({"rows": rows}, f)


def main(path: str) -> None:
    from flashrt.bench.kernels import provenance

    result = {**provenance(), "arms": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for chains in ARMS:
            part = os.path.join(tmp, f"{chains}.json")
            env = {**os.environ, "TRITON_CACHE_DIR": os.path.join(tmp, f"cache-{chains}")}
            done = subprocess.run([sys.executable, __file__, "--arm", str(chains), part], env=env, check=False)
            if done.returncode or not os.path.exists(part):
                result["arms"][str(chains)] = {"error": f"exit {done.returncode}"}
                continue
            with open(part) as f:
                result["arms"][str(chains)] = json.load(f)
            with open(path, "w") as f:
                json.dump(result, f, indent=1)
    base = {(r.get("shape", r.get("bank")), r["M"]): r for r in result["arms"].get("1", {}).get("rows", [])}
    for chains in ARMS[1:]:
        for r in result["arms"].get(str(chains), {}).get("rows", []):
            b = base.get((r.get("shape", r.get("bank")), r["M"]))
            if b and b["us"] and r["us"]:
                layer = r.get("shape", r.get("bank"))
                ratio = b["us"] / r["us"]
                print(f"{layer:20s} M={r['M']:2d}: 1 chain {b['us']:7.2f}  {chains} {r['us']:7.2f} us  x{ratio:.3f}")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "--arm":
        run_arm(int(sys.argv[2]), sys.argv[3])
    else:
        main(sys.argv[1])
