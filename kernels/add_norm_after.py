"""A residual add and an RMSNorm's first half after a projection computed apart (Triton).

The fused ops (``ops.linear_add_norm``) take the add into the projection's epilogue where its form
has one (``linear_mma_gluon.AddNorm``: the decode forms). The others (the ``wgmma`` forms from 17
tokens, a split choice) run the projection and then this: one launch that does what that
epilogue does, in place of the float32 torch arithmetic of ``ops.add_norm``, which was about ten
launches a norm, so a compiled prefill keeps one launch a norm, as inductor's fused add-norm had.

``y [M, N]`` (the projection) becomes the residual stream ``y + residual`` in place; ``weighted``
gets it times the norm's weight; ``sumsq`` each token's sums of its squares over each ``GROUP``
features, ``[M, N / GROUP]`` at its front, as the epilogue stores them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import cdiv

# Features a program: whole groups of every ``linear_mma_gluon.norm_group`` (4, 8 or 16), and one
# program a token's 4096 features.
BLOCK = 4096


@triton.jit
def add_norm_kernel(
    y_ptr,
    residual_ptr,
    weight_ptr,
    weighted_ptr,
    sumsq_ptr,
    N,
    stride_ym,
    stride_rm,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    y = tl.load(y_ptr + row * stride_ym + offs, mask=mask, other=0.0).to(tl.float32)
    h = (y + tl.load(residual_ptr + row * stride_rm + offs, mask=mask, other=0.0).to(tl.float32)).to(
        y_ptr.dtype.element_ty
    )
    tl.store(y_ptr + row * stride_ym + offs, h, mask=mask)
    h = h.to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(weighted_ptr + row * stride_ym + offs, (h * weight).to(weighted_ptr.dtype.element_ty), mask=mask)
    parts = tl.sum(tl.reshape(tl.where(mask, h * h, 0.0), (BLOCK // GROUP, GROUP)), axis=1)
    groups = N // GROUP
    group = tl.program_id(1) * (BLOCK // GROUP) + tl.arange(0, BLOCK // GROUP)
    tl.store(sumsq_ptr + row * groups + group, parts, mask=group < groups)


def reference(
    y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, group: int, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel in plain torch: the stream and the weighted stream in ``dtype`` (``y``'s by
    default; the epilogue's from its float32 sums), the sums ``[M, N / group]``."""
    m, n = y.shape
    dtype = dtype or y.dtype
    h = (y.float() + residual.float()).to(dtype)
    hf = h.float()
    return h, (hf * weight.float()).to(dtype), hf.square().view(m, n // group, group).sum(-1)


def launch(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, weighted: torch.Tensor, sumsq, group: int):
    """``y`` the residual stream in place, ``weighted`` and the front of ``sumsq`` filled: the
    ``AddNorm`` epilogue's outputs for a projection ``y [M, N]`` computed apart. Rows of unit
    stride along N; ``weighted`` laid out as ``y``; N a multiple of ``group``."""
    m, n = y.shape
    block = min(BLOCK, triton.next_power_of_2(n))
    add_norm_kernel[(m, cdiv(n, block))](
        y, residual, weight, weighted, sumsq, n, y.stride(0), residual.stride(0), GROUP=group, BLOCK=block,
        num_warps=4,
    )  # fmt: skip
