"""How much of the decode forms' fixed cost a call PDL hides when they run back to back?

The kernel table times each form in a graph of calls on rotated weights (``timing.graph_us``),
each launched after the one before has ended. At one token the ring form's times fit
``t0 + bytes / B`` with t0 = 4.06 us (d4bf7ef): the launch, the first bytes' trip from HBM, the
tail. In the decode step the projections are launched with PDL (``linear_mma_gluon.PDL_LAUNCH``
follows torch.compile's), so each copies its first weight steps while the kernel before it ends.
Here the same graphs of calls, the ring forms launched with PDL and without, beside cuBLAS bf16
in the same run; and every PDL output checked bit for bit against the launch without.

``python3 bench/probe_pdl_chain.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).

H200, 6222c9d (``h200-probe-pdl-chain-6222c9d.json``): within 5% either way, every output the
same bits; at one token qkv 7.07 against 7.19 us with PDL, o 5.74 against 5.45, gate_up 21.77
against 21.51. The fixed cost is the kernel's own latency, not the gap between launches.
"""

import json
import sys

import torch
import torch.nn.functional as F
from flashrt.bench.kernels import PROBE_SHAPES, provenance
from flashrt.bench.timing import copies_for, copy_bandwidth_tbps, graph_us
from flashrt.kernels import linear_mma_gluon, nvfp4, ops
from flashrt.kernels.nvfp4 import NVFP4Weight

LAYERS = PROBE_SHAPES[:5]  # Llama-3-8B's and the LM head; the expert-sized layers take no PDL
TOKENS = [1, 16]


def timed(x: torch.Tensor, copies: list[NVFP4Weight], pdl: bool) -> tuple[float, torch.Tensor]:
    linear_mma_gluon.PDL_LAUNCH = pdl
    out = ops.linear(x, copies[0])
    return graph_us([lambda qc=qc, x=x: ops.linear(x, qc) for qc in copies]), out


def main(path: str) -> None:
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "rows": []}
    for layer, n, k in LAYERS:
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        q = ops.for_serving(nvfp4.quantize(w))
        q_copies = [q] + [
            NVFP4Weight(q.packed.clone(), q.scales.clone(), q.global_scale.clone(), q.layout)
            for _ in range(copies_for(q.nbytes) - 1)
        ]
        w_copies = [w] + [w.clone() for _ in range(copies_for(w.numel() * 2) - 1)]
        for m in TOKENS:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            row = {"layer": layer, "N": n, "K": k, "M": m, "bytes": q.nbytes}
            row["form"] = ops.choose_linear(x, q.packed, q.scales, q.global_scale, None, q.layout).name
            row["ours_us"], plain = timed(x, q_copies, False)
            row["ours_pdl_us"], chained = timed(x, q_copies, True)
            row["same_bits"] = bool(torch.equal(plain, chained))
            row["bf16_us"] = graph_us([lambda wc=wc, x=x: F.linear(x, wc) for wc in w_copies])
            for arm in ("ours", "ours_pdl"):
                row[f"{arm}_x"] = row["bf16_us"] / row[f"{arm}_us"]
                row[f"{arm}_bandwidth_frac"] = q.nbytes / (row[f"{arm}_us"] * 1e-6) / (copy_tbps * 1e12)
            result["rows"].append(row)
            print(
                f"{layer:8s} M={m:3d} {row['form']:14s} bf16 {row['bf16_us']:7.2f}  ours {row['ours_us']:7.2f} "
                f"(x{row['ours_x']:.2f}, {row['ours_bandwidth_frac']:.2f} of copy)  with PDL {row['ours_pdl_us']:7.2f} "
                f"(x{row['ours_pdl_x']:.2f}, {row['ours_pdl_bandwidth_frac']:.2f})  same bits {row['same_bits']}",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)
    linear_mma_gluon.PDL_LAUNCH = None


if __name__ == "__main__":
    main(sys.argv[1])
