"""Would the ``wgmma`` form beat the served forms from 64 to 2048 tokens?

Issue 2 asks for no linear slower than 1.2x bf16 at up to 2048 tokens. The kernel table
(``h200-kernels.json``) misses it at 512 tokens on every shape (0.53-0.67x: the dequant form,
a decode pass and then cuBLAS), and at 32-128 on the Qwen3 expert-sized layers (1-3 M
parameters: 0.55-0.81x, ``mma_gluon`` unsplit), where bf16 takes 4-8 us and two launches cost
as much as the work. ``linear_wgmma_gluon`` is offered only to 256 tokens (in a scratch run before
it was committed, dequant beat it on Llama's shapes at 512: gate_up 246 against 268 us); the
small layers at 512 and 2048 were never timed with it.

Same run, each from HBM (``ops._time_us``), each checked against the reference first, weights in
``ring_layout``: the H200's tuned choice (``kernels/choices``), every ``wgmma`` config that
``configs`` would offer at that token count were the form offered there, and bf16 ``F.linear``.
Llama's four shapes at 512 tokens, the four expert-sized ones at 64, 128, 512 and 2048. From
90d2867 to a0a45b4 also every 8-warp config of one row tile with 16 warps, not offered: at
a1cc4fb (``h200-probe-large-m-a1cc4fb.json``) they gained 3% on the LM head and 2% on down at
512 tokens and lost everywhere else. From 7466cc0 instead the warp-specialized form
(``linear_wgmma_ws_gluon``) at every config of its ``configs`` at any token count: Nsight Compute
had the served ``wgmma`` form's tensor pipe busy half the time at 512 tokens, its warps waiting on
the ring's barrier and copies (``h200-ncu-gate_up512-a0a45b4.txt``). At 8ec4768 it won at 512
tokens on Llama's four shapes by 3-21% (``h200-probe-large-m-ws-8ec4768.json``); at 7fbdb27, with
256-token tiles, by 11-26% (``h200-probe-large-m-ws-7fbdb27.json``), and it was offered from 65
to 2048 tokens. From 7fbdb27 also the ring form's configs (``linear_mma_gluon``) where it is
offered: with ``split_ks`` offering the largest split that fits where none reaches the programs
it wants, the expert-sized gate_ups at 64 tokens ran 6.78-6.90 us against 10.98-11.09 unsplit.

``python3 bench/probe_large_m.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``); the
JSON is rewritten after each row; stops at ``DEADLINE_S``.
"""

import functools
import json
import sys
import time

import torch
from flashrt.bench.kernels import LINEAR_SHAPES, provenance
from flashrt.bench.probe_ring_depth import fastest, name, timed
from flashrt.bench.probe_warps import tuned
from flashrt.kernels import linear_mma_gluon, linear_wgmma_gluon, linear_wgmma_ws_gluon, nvfp4, ops, ring_layout

DEADLINE_S = 420
LARGE = {"qkv", "gate_up", "down", "lm_head"}


def configs_at(form, m: int, n: int, k: int) -> list[dict]:
    """``form.configs`` as if the form were offered at ``m`` tokens."""
    saved = form.MIN_TOKENS, form.MAX_TOKENS
    form.MIN_TOKENS, form.MAX_TOKENS = min(saved[0], m), max(saved[1], m)
    try:
        return form.configs(m, n, k)
    finally:
        form.MIN_TOKENS, form.MAX_TOKENS = saved


def main(path: str) -> None:
    start = time.monotonic()
    result = {**provenance(), "rows": []}
    torch.manual_seed(0)
    for shape, n, k in LINEAR_SHAPES:
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        ring = ring_layout.pack(w.packed)
        dense = nvfp4.dequantize(w, torch.bfloat16)
        for m in (512,) if shape in LARGE else (64, 128, 512, 2048):
            if time.monotonic() - start > DEADLINE_S:
                print("deadline: stopping", flush=True)
                return
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)

            def run(form, c, x=x, out=out, ring=ring, w=w):  # form: a module with a launch()
                cfg = {**c, "LAYOUT": ring_layout.RING}
                return form.launch(x, ring, w.scales, w.global_scale, None, out, cfg, True)

            row = {"shape": shape, "N": n, "K": k, "M": m}
            served = tuned(m, n, k)
            if served:
                row["served_config"] = f"{served[0]}[{name(served[1])}]"
                served_run = functools.partial(run, ops.LINEAR_FORMS[served[0]], served[1])
                row["served_us"] = timed(served_run, out, ref)["us"]
            row["bf16_us"] = ops._time_us(functools.partial(torch.nn.functional.linear, x, dense))

            def every(form, configs, out=out, ref=ref):
                return {name(c): timed(functools.partial(run, form, c), out, ref) for c in configs}

            wgmma = every(linear_wgmma_gluon, configs_at(linear_wgmma_gluon, m, n, k))
            row["wgmma_us"], row["wgmma_config"] = fastest(wgmma)
            row["wgmma"] = wgmma
            if m <= linear_mma_gluon.MAX_TOKENS:
                mma = every(linear_mma_gluon, linear_mma_gluon.configs(m, n, k))
                row["mma_us"], row["mma_config"] = fastest(mma)
                row["mma"] = mma
            ws = every(linear_wgmma_ws_gluon, configs_at(linear_wgmma_ws_gluon, m, n, k))
            row["ws_us"], row["ws_config"] = fastest(ws)
            row["ws"] = ws
            result["rows"].append(row)
            bf16 = row["bf16_us"]
            print(
                f"{shape:20s} M={m:4d}: bf16 {bf16:8.2f} us  served {row.get('served_us') or 0:8.2f} "
                f"({row.get('served_config')})  wgmma {row['wgmma_us'] or 0:8.2f} ({row['wgmma_config']})  "
                f"warp-specialized {row['ws_us'] or 0:8.2f} ({row['ws_config']})  mma {row.get('mma_us') or 0:8.2f} "
                f"({row.get('mma_config')})",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
