"""Triton's own ``tl.dot`` on register-decoded NVFP4 weights at 64-2048 tokens, same run
against cuBLAS bf16 and the adjudicated form: the study that led to ``linear_wgmma_gluon``.
``python3 bench/probe_prefill.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).

Three ways to feed the dot, each over the same eight tiles: the weight interleaved back into K
order and one dot (variant 0), the activations split into even and odd K and two dots
(variant 1, as ``linear_mma``), swap-AB with the weight as the register operand (variant 2).
All three compile to ``wgmma`` with the decoded weight stored to shared memory each step (or,
swapped, held in registers); H200, ``bench/results/h200-probe-prefill.json``: at 128 tokens
the 28672 x 4096 gate_up took 100 us (variant 0) against cuBLAS bf16's 72, and at 2048 tokens
1245 against 612."""

import functools
import json
import sys

import torch
import triton
import triton.language as tl
from flashrt.bench.kernels import provenance
from flashrt.kernels import nvfp4, ops
from flashrt.kernels.decode import cdiv, dot, interpreted, load_nvfp4_halves


@triton.jit
def tile_kernel(
    x_ptr, packed_ptr, scales_ptr, global_scale_ptr, out_ptr, M, N, K,
    stride_xm, stride_om, stride_wn, stride_sn,
    USE_PRMT: tl.constexpr, VARIANT: tl.constexpr, INTERPRETED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)
    x_row = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    if VARIANT == 2:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_row + k0 + offs_k[None, :], mask=m_mask[:, None], other=0.0)
        lo, hi = load_nvfp4_halves(
            packed_ptr, scales_ptr, rows, n_mask, K, k0, stride_wn, stride_sn, BLOCK_N, BLOCK_K, USE_PRMT, True
        )
        if VARIANT == 0:  # weight interleaved back, one dot
            w = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
            acc = dot(x, tl.trans(w), acc, INTERPRETED)
        elif VARIANT == 1:  # activations split, two dots
            x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_M, BLOCK_K // 2, 2)))
            acc = dot(x_even, tl.trans(lo), acc, INTERPRETED)
            acc = dot(x_odd, tl.trans(hi), acc, INTERPRETED)
        else:  # swap-AB, weight interleaved
            w = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
            acc = dot(w, tl.trans(x), acc, INTERPRETED)
    acc = acc * tl.load(global_scale_ptr)
    if VARIANT == 2:
        out = out_ptr + offs_m.to(tl.int64)[None, :] * stride_om + offs_n[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])
    else:
        out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def launch(x, w, out, cfg):
    m, k = x.shape
    n = w.packed.shape[0]
    grid = (cdiv(m, cfg["BLOCK_M"]), cdiv(n, cfg["BLOCK_N"]))
    tile_kernel[grid](
        x, w.packed, w.scales.view(torch.uint8), w.global_scale, out, m, n, k,
        x.stride(0), out.stride(0), w.packed.stride(0), w.scales.stride(0),
        USE_PRMT=not interpreted(), INTERPRETED=interpreted(), VARIANT=cfg["VARIANT"],
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    return out


CONFIGS = [
    {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw, "num_stages": ns}
    for bm, bn, bk, nw, ns in [
        (128, 128, 64, 8, 3),
        (128, 128, 128, 8, 3),
        (128, 256, 64, 8, 3),
        (64, 128, 64, 4, 3),
        (64, 128, 128, 4, 3),
        (128, 64, 64, 4, 4),
        (128, 128, 64, 4, 3),
        (64, 256, 64, 8, 3),
    ]
]
SHAPES = {"qkv": (6144, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def main(path):
    rows = []
    torch.manual_seed(0)
    for name, (n, k) in SHAPES.items():
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        dense = nvfp4.dequantize(w, torch.bfloat16)
        for m in (64, 128, 256, 512, 2048):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ dense.float().t()
            bf16 = ops._time_us(functools.partial(torch.mm, x, dense.t(), out=out))
            adjudicated = ops._time_us(functools.partial(ops.linear, x, w))
            best = {}
            for variant in (0, 1, 2):
                for cfg in CONFIGS:
                    c = {**cfg, "VARIANT": variant}
                    try:
                        out.fill_(float("nan"))
                        launch(x, w, out, c)
                        err = ((out.float() - ref).norm() / ref.norm()).item()
                        if not err < 1e-2:
                            print(f"  {name} M={m} {c}: error {err}", flush=True)
                            continue
                        us = ops._time_us(functools.partial(launch, x, w, out, c))
                    except Exception as e:  # a probe reports and goes on
                        print(f"  {name} M={m} {c}: {type(e).__name__} {str(e)[:200]}", flush=True)
                        continue
                    if variant not in best or us < best[variant][0]:
                        best[variant] = (us, c)
            row = {"name": name, "N": n, "K": k, "M": m, "bf16_us": bf16, "adjudicated_us": adjudicated,
                   "best": {v: {"us": b[0], "config": b[1]} for v, b in best.items()}}  # fmt: skip
            rows.append(row)
            line = " ".join(f"v{v} {b[0]:7.1f}" for v, b in sorted(best.items()))
            print(f"{name:8s} M={m:5d} bf16 {bf16:7.1f} adjudicated {adjudicated:7.1f} | {line} | "
                  f"{ {v: b[1] for v, b in best.items()} }", flush=True)  # fmt: skip
    with open(path, "w") as f:
        json.dump({**provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
