"""The MoE router's logits GEMM: ``router_topk.router_logits`` against cuBLAS (``F.linear``).

Qwen3-30B-A3B's router (128 experts x 2048) and Qwen3.5-35B-A3B's (256 x 2048) at 1, 4, 8 and 16
tokens, each checked against float64 first, both timed as the adjudicator times a layer
(``ops._time_us``: from HBM, in a CUDA graph).

``python3 bench/probe_router_logits.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import functools
import json
import sys

import torch
import torch.nn.functional as F
from flashrt.bench import router_topk
from flashrt.bench.kernels import provenance
from flashrt.kernels import ops

ROUTERS = {"qwen3-30b-a3b": (128, 2048), "qwen3.5-35b-a3b": (256, 2048)}
TOKENS = (1, 4, 8, 16)


def main(path: str) -> None:
    result = {**provenance(), "rows": []}
    torch.manual_seed(0)
    for name, (experts, k) in ROUTERS.items():
        weight = torch.randn(experts, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in TOKENS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            exact = x.double() @ weight.double().T
            err = float((router_topk.router_logits(x, weight).double() - exact).norm() / exact.norm())
            row = {"router": name, "E": experts, "K": k, "M": m, "rel_err": err}
            row["ours_us"] = ops._time_us(functools.partial(router_topk.router_logits, x, weight))
            row["cublas_us"] = ops._time_us(functools.partial(F.linear, x, weight))
            result["rows"].append(row)
            print(
                f"{name:16s} M={m:2d} ours {row['ours_us']:6.2f} us  cuBLAS {row['cublas_us']:6.2f} us  "
                f"x{row['cublas_us'] / row['ours_us']:.2f}  err {err:.1e}",
                flush=True,
            )
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
