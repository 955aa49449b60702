"""Does the warp-specialized form pay below 65 tokens?

``linear_wgmma_ws_gluon`` is offered from 65 tokens (``MIN_TOKENS``): at 64 the kernel table has
Llama's qkv at 0.96x bf16 and the four layers at 1.24x (geometric mean; the target is 1.5x), on
the ``wgmma`` and ring forms. The warp-specialized form's 64-token tile (one m64n64 MMA a
warpgroup) is as offered at 65-128; a 32-token one (m64n32) is not offered anywhere.

Same run, each from HBM (``ops._time_us``), each checked against the reference first, weights in
``ring_layout``: the H200's tuned choice (``kernels/choices``), and every warp-specialized config the
form would offer at these counts with 32-, 64- and 128-token tiles, for Llama-3-8B's five layers,
the LM head and the expert-sized layers at 64 and 32 tokens, and bf16 ``F.linear``.

``python3 bench/probe_ws_tokens.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``); the
JSON is rewritten after each row; stops at ``DEADLINE_S``.

Answer, H200 at dc6b171 (``h200-probe-ws-tokens-dc6b171.json``): no. Its best config was 5-31%
slower than the served choice at 64 tokens and 1-63% at 32, on every layer timed.
"""

import functools
import json
import sys
import time

import torch
from flashrt.bench.kernels import PROBE_SHAPES, provenance
from flashrt.bench.probe_ring_depth import fastest, name, timed
from flashrt.bench.probe_warps import tuned
from flashrt.kernels import linear_wgmma_ws_gluon, nvfp4, ops, ring_layout

DEADLINE_S = 230
TOKENS = (64, 32)


def main(path: str) -> None:
    start = time.monotonic()
    result = {**provenance(), "rows": []}
    torch.manual_seed(0)
    for m in TOKENS:
        for shape, n, k in PROBE_SHAPES:
            if time.monotonic() - start > DEADLINE_S:
                print("deadline: stopping", flush=True)
                return
            w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
            ring = ring_layout.pack(w.packed)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)
            args = (x, ring, w.scales, w.global_scale, None, out)
            row = {"shape": shape, "N": n, "K": k, "M": m, "ws": {}}
            choice = tuned(m, n, k)
            if choice:
                form, config = choice
                run = functools.partial(
                    ops.LINEAR_FORMS[form].launch, *args, config | {"LAYOUT": ring_layout.RING}, True
                )
                row["served"] = timed(run, out, ref) | {"form": form, "config": name(config)}
            for c in linear_wgmma_ws_gluon.tile_configs(m, n, k, (32, 64, 128)):
                run = functools.partial(linear_wgmma_ws_gluon.launch, *args, c | {"LAYOUT": ring_layout.RING}, True)
                row["ws"][name(c)] = timed(run, out, ref)
            dense = nvfp4.dequantize(w, torch.bfloat16)
            row["bf16_us"] = ops._time_us(functools.partial(torch.nn.functional.linear, x, dense))
            row["best_ws"] = fastest(row["ws"])
            result["rows"].append(row)
            served = row.get("served", {})
            print(
                f"{shape:20s} M={m:3d} served {served.get('us') and round(served['us'], 2)}"
                f" ({served.get('form')}[{served.get('config')}])  ws {row['best_ws']}  bf16 {row['bf16_us']:.2f}",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
