"""One launch of each decode form on the gate_up shape, for Nsight Compute (not committed)."""
import sys
import torch
from flashrt.kernels import quantize
from flashrt.kernels import linear_gemv_gluon, linear_mma_gluon, linear_mma

N, K = 28672, 4096
torch.manual_seed(0)
w = quantize((torch.randn(N, K, device="cuda") * 0.02).to(torch.bfloat16))
cases = [
    ("gemv_gluon", linear_gemv_gluon, 1, {"ROWS": 8, "GROUPS": 1, "WARPS_N": 1, "WARPS_K": 4}),
    ("mma_gluon", linear_mma_gluon, 8, {"BLOCK_M": 8, "ROW_TILES": 1, "WARPS": 8, "WORDS_PER_THREAD": 4}),
    ("mma", linear_mma, 16, {"BLOCK_K": 256, "BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 2, "num_stages": 3, "num_warps": 4}),
]
for name, mod, m, cfg in cases:
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
    try:
        for _ in range(3):
            mod.launch(x, w.packed, w.scales, w.global_scale, None, out, cfg, True)
        torch.cuda.synchronize()
        print(name, "ok", out.float().abs().mean().item(), flush=True)
    except Exception as exc:
        print(name, "FAILED", repr(exc)[:500], file=sys.stderr, flush=True)
