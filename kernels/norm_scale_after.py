"""An RMSNorm's per-token scale on a projection computed apart (Triton).

The fused ops (``ops.linear_normed``) multiply the projection's sums by each token's
``rsqrt(mean(h**2) + eps)`` in its epilogue where its form has one (``linear_mma_gluon.NormScale``).
The others run the projection and then this, one launch: the scale from the sums of squares
``ops.linear_add_norm`` stored (``[M, K / GROUP]`` at the front of ``sumsq``), then the bias, or
the SiLU-and-mul of a gate-and-up projection (gate columns first, as the projection computes them
unfused).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import cdiv

BLOCK = 1024
# Sums of squares a program loads at a time: 4096 features at one token are 1024 groups of 4.
GROUPS_BLOCK = 1024


@triton.jit
def norm_scale_kernel(
    y_ptr,
    sumsq_ptr,
    bias_ptr,
    out_ptr,
    N,
    K,
    eps,
    stride_ym,
    stride_om,
    GROUP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    BLOCK: tl.constexpr,
    GROUPS_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    groups = K // GROUP
    total = tl.zeros((GROUPS_BLOCK,), dtype=tl.float32)
    for start in range(0, groups, GROUPS_BLOCK):
        at = start + tl.arange(0, GROUPS_BLOCK)
        total += tl.load(sumsq_ptr + row * groups + at, mask=at < groups, other=0.0)
    scale = tl.rsqrt(tl.sum(total, axis=0) / K + eps)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if SILU_MUL:
        mask = offs < N // 2
        gate = tl.load(y_ptr + row * stride_ym + offs, mask=mask, other=0.0).to(tl.float32) * scale
        up = tl.load(y_ptr + row * stride_ym + N // 2 + offs, mask=mask, other=0.0).to(tl.float32) * scale
        out = gate * tl.sigmoid(gate) * up
    else:
        mask = offs < N
        out = tl.load(y_ptr + row * stride_ym + offs, mask=mask, other=0.0).to(tl.float32) * scale
        if HAS_BIAS:
            out += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def reference(y: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, silu_mul: bool) -> torch.Tensor:
    """The kernel in plain torch on the scale ``[M, 1]`` (``ops.norm_scale``)."""
    out = y.float() * scale
    if silu_mul:
        d = out.shape[-1] // 2
        return (torch.nn.functional.silu(out[:, :d]) * out[:, d:]).to(y.dtype)
    return (out if bias is None else out + bias.float()).to(y.dtype)


def launch(
    y: torch.Tensor,
    sumsq: torch.Tensor,
    k: int,
    eps: float,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    group: int,
    silu_mul: bool = False,
) -> torch.Tensor:
    """``out`` = the projection ``y [M, N]`` times each token's scale over ``k`` features, then
    the bias, or ``[M, N / 2]`` its SiLU-and-mul."""
    m, n = y.shape
    width = n // 2 if silu_mul else n
    norm_scale_kernel[(m, cdiv(width, BLOCK))](
        y, sumsq, bias if bias is not None else y, out, n, k, eps, y.stride(0), out.stride(0), GROUP=group,
        HAS_BIAS=bias is not None, SILU_MUL=silu_mul, BLOCK=BLOCK, GROUPS_BLOCK=GROUPS_BLOCK, num_warps=4,
    )  # fmt: skip
    return out
