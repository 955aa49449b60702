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
from flashrt.kernels.decode import cdiv, load_nvfp4_halves


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
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)  # one token a program: its weights come from L2 for the others
    HALF_K: tl.constexpr = BLOCK_K // 2

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_h = tl.arange(0, HALF_K)
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)
    x_row = x_ptr + row * stride_xm

    # Products accumulate elementwise; one cross-thread reduction at the end, not per step.
    acc = tl.zeros((BLOCK_N, HALF_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        lo, hi = load_nvfp4_halves(
            packed_ptr, scales_ptr, rows, n_mask, K, k0, stride_wn, stride_sn, BLOCK_N, BLOCK_K, USE_PRMT, EVEN_K
        )
        # Even and odd activations by 1-D strided loads. A contiguous tile split in registers, or
        # a 2-D activation tile, makes Triton move the decoded weights through shared memory to
        # match the activation layout (STSM/LDSM per step in SASS); this way only x moves.
        x_mask = (k0 + 2 * offs_h < K) | EVEN_K
        x_even = tl.load(x_row + k0 + 2 * offs_h, mask=x_mask, other=0.0).to(tl.float32)
        x_odd = tl.load(x_row + k0 + 2 * offs_h + 1, mask=x_mask, other=0.0).to(tl.float32)
        acc += lo.to(tl.float32) * x_even[None, :] + hi.to(tl.float32) * x_odd[None, :]
    result = tl.sum(acc, axis=1) * tl.load(global_scale_ptr)
    if HAS_BIAS:
        result += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + offs_n, result.to(out_ptr.dtype.element_ty), mask=n_mask)


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
    grid = (cdiv(n, config["BLOCK_N"]), m)
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
        EVEN_K=k % config["BLOCK_K"] == 0,
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    return out


def configs(m: int, n: int, k: int) -> list[dict]:
    """Candidates for one shape; only offered up to 4 tokens, where CUDA cores can keep up.

    BLOCK_N 4-64 rows: several thousand programs on 132 SMs for every benchmark layer; BLOCK_K
    256-1024 (128-512 bytes a row a step). The fp32 accumulator holds BLOCK_N x BLOCK_K/2
    products, at most 64 a thread.
    """
    if m > 4:
        return []
    return [
        {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": 2}
        for bn in (4, 8, 16, 32, 64)
        for bk in (256, 512, 1024)
        for w in (4, 8)
        if bn * bk // 2 <= 64 * 32 * w and bn * bk // 2 >= 256 * w
    ]
