"""Weight-only NVFP4 GEMV for decode: ``y [M, N] = x [M, K] @ dequant(W)[N, K]^T + bias``, small M.

At one to a few tokens a linear is a stream over the weight bytes; the tensor cores would work
on a tile padded to 16 tokens. This form multiplies on the CUDA cores in fp32: each program
owns BLOCK_N weight rows for all K (no split-K: with 8-32 rows a program, every shape in the
benchmark already gives thousands of programs), loads 8-byte runs of each row (one scale
group), decodes them to bf16 and accumulates ``w * x`` for every token of the block.

Whether this or ``linear_mma`` is faster for a shape is measured, not assumed
(``flashrt.kernels.tuning``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import load_nvfp4_halves


@triton.jit
def nvfp4_linear_gemv_kernel(
    # pointers
    x_ptr,
    packed_ptr,
    scales_ptr,
    global_scale_ptr,
    bias_ptr,
    out_ptr,
    # dimensions
    M,
    N,
    K,
    # strides (elements; packed rows in bytes, scale rows in scales)
    stride_xm,
    stride_om,
    stride_wn,
    stride_sn,
    # meta-parameters
    HAS_BIAS: tl.constexpr,
    USE_PRMT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    HALF_K: tl.constexpr = BLOCK_K // 2

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    rows = offs_n.to(tl.int64)
    x_row = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm

    # Products accumulate elementwise; one cross-thread reduction at the end, not per step.
    acc3 = tl.zeros((BLOCK_M, BLOCK_N, HALF_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        lo, hi = load_nvfp4_halves(
            packed_ptr, scales_ptr, rows, n_mask, K, k0, stride_wn, stride_sn, BLOCK_N, BLOCK_K, USE_PRMT
        )
        x_mask = m_mask[:, None] & (k0 + offs_k[None, :] < K)
        x = tl.load(x_row + k0 + offs_k[None, :], mask=x_mask, other=0.0).to(tl.float32)
        x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_M, HALF_K, 2)))
        lo = lo.to(tl.float32)
        hi = hi.to(tl.float32)
        acc3 += lo[None, :, :] * x_even[:, None, :] + hi[None, :, :] * x_odd[:, None, :]
    acc = tl.sum(acc3, axis=2)

    acc = acc * tl.load(global_scale_ptr)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def launch(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    config: dict,
    use_prmt: bool,
) -> torch.Tensor:
    m, k = x.shape
    n = packed.shape[0]
    grid = (triton.cdiv(n, config["BLOCK_N"]), triton.cdiv(m, config["BLOCK_M"]))
    nvfp4_linear_gemv_kernel[grid](
        x,
        packed,
        scales.view(torch.uint8),
        global_scale,
        bias if bias is not None else out,
        out,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        packed.stride(0),
        scales.stride(0),
        HAS_BIAS=bias is not None,
        USE_PRMT=use_prmt,
        BLOCK_M=config["BLOCK_M"],
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    return out


def configs(m: int, n: int, k: int) -> list[dict]:
    """Candidates for one shape; only offered up to 4 tokens, where CUDA cores can keep up.

    BLOCK_N 8-32 rows keeps several thousand programs in flight on 132 SMs; BLOCK_K 256-512
    reads 128-256 contiguous bytes a row a step, enough outstanding loads to cover HBM latency
    with 4 warps.
    """
    if m > 4:
        return []
    bm = 1 if m == 1 else (2 if m == 2 else 4)
    # The fp32 accumulator holds BLOCK_M x BLOCK_N x BLOCK_K/2 products: at most 64 a thread.
    return [
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": 2}
        for bn in (4, 8, 16, 32, 64)
        for bk in (256, 512, 1024)
        for w in (4, 8)
        if bm * bn * bk // 2 <= 64 * 32 * w and bn * bk // 2 >= 256 * w
    ]
