"""``python -m flashrt.bench prefill``: the linear forms at prefill sizes against cuBLAS bf16.

Llama-3-8B's projection shapes at 128-4096 rows (one to 32 prompts of 128 tokens), each form
timed the way the adjudicator times it (``ops._time_us``: CUDA graph, L2 flushed before each
call), with its error against the plain-torch reference. Writes one JSON with provenance.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch
from flashrt.bench.kernels import provenance
from flashrt.kernels import linear_dequant, linear_mma, nvfp4, ops

SHAPES = {"q/o 4096x4096": (4096, 4096), "gate/up 14336x4096": (14336, 4096), "down 4096x14336": (4096, 14336)}
ROWS = (128, 1024, 4096)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt.bench prefill")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("flashrt bench prefill needs a CUDA GPU: this machine has none.")
        return 2
    result = provenance() | {"rows": []}
    gpu = result["device"].lower().replace("nvidia ", "").replace(" ", "-")
    out_path = Path(args.out or Path(__file__).resolve().parent / "results" / f"{gpu}-prefill.json")
    prmt = ops._use_prmt(torch.device("cuda"))
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        q = nvfp4.quantize(w)
        for m in ROWS:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            ref = ops.linear_reference(x, q)
            row = {"name": name, "N": n, "K": k, "M": m, "bf16_us": ops._time_us(lambda x=x, w=w: x @ w.t())}
            arms = {f"dequant{i}": (linear_dequant, c) for i, c in enumerate(linear_dequant.configs(m, n, k))}
            arms |= {f"mma{i}": (linear_mma, c) for i, c in enumerate(linear_mma.configs(m, n, k)[-2:])}
            for arm, (mod, config) in arms.items():
                run = functools.partial(mod.launch, x, q.packed, q.scales, q.global_scale, None, out, config, prmt)
                try:
                    run()
                    row[f"{arm}_err"] = _rel_err(out, ref)
                    row[f"{arm}_us"] = ops._time_us(run)
                except Exception as exc:  # a config that does not fit this device, as the adjudicator refuses it
                    row[f"{arm}_err"], row[f"{arm}_us"] = ops._reason(exc), float("inf")
            best = min((row[f"{a}_us"], a) for a in arms)
            row["best"], row["best_vs_bf16"] = best[1], best[0] / row["bf16_us"]
            result["rows"].append(row)
            out_path.write_text(json.dumps(result, indent=1))
            print(
                f"{name:20s} M={m:5d} bf16 {row['bf16_us']:8.1f} us  "
                + "  ".join(f"{a} {row[f'{a}_us']:8.1f}" for a in arms),
                flush=True,
            )
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
