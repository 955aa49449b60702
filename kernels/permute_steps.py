"""Activations permuted into the decode's K order, for the ``wgmma`` form (``linear_wgmma_gluon``).

The ring forms decode each weight step into pairs in an order of their own (``linear_mma_gluon``):
within a 256-wide step of K, natural ``k = 64 t + 8 v + 4 e + 2 q1 + q0`` sits at
``32 v + 16 q1 + 8 q0 + 2 t + e``. The ``wgmma`` form reads its activations from shared memory as
the tensor cores take them, so its launcher permutes ``x`` once a call. As a torch
``reshape``/``permute``/``reshape`` that copy went through ATen's generic strided copy: in the
Llama-3-8B-shaped prefill on the H200 (85e7a7a, ``h200-e2e-llama-pdl-85e7a7a.json``, 128
tokens) it added 0.52 ms of copies to the 4.96 ms of the form's GEMMs, 4.1 us a call for 1 MB.
A gather of each step's 256 elements from one 512-byte row segment took 0.40 ms there
(d1dd53c, ``h200-e2e-llama-d1dd53c.json``, 3.1 us a call), bound by its 2-byte loads. This
kernel loads a contiguous tile (16-byte loads), permutes it in registers and stores it
contiguously: on the H200 at c58d18d (``bench/probe_permute_steps.py``,
``h200-probe-permute-steps-c58d18d.json``, every arm checked against the reference first) 1.23
to 4.71 us against the gather's 1.73 to 10.13 at 17-256 tokens and K 2048-14336: within 3% of a
plain copy of the same bytes from 0.9 MB (32 x 14336) up, 1.05-1.18x the copy's time below.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels import ring_layout
from flashrt.kernels.decode import cdiv
from flashrt.kernels.linear_mma_gluon import WORDS_PER_THREAD as V  # a step is 32 V elements
from triton.language.extra.cuda import gdc_launch_dependents

# Rows a program: 8 x 256 elements, 16 a thread of 4 warps. At 17 tokens a 4096-wide layer is
# still 48 programs and a 14336-wide one 168, at 128 tokens 256 and 896. 16 rows were within
# 0.16 us of 8 at every shape of the probe, ahead only at 128 x 2048 and 128 x 14336.
ROWS = 8


@triton.jit
def permute_steps_kernel(
    x_ptr,
    out_ptr,
    M,
    stride_xm,
    stride_om,
    ROWS: tl.constexpr,
    V: tl.constexpr,
    LAYOUT: tl.constexpr,
    PDL: tl.constexpr,
):
    """``out[r, 256 s + p] = x[r, 256 s + natural(p)]`` for rows ``ROWS`` of program 0's axis and
    step s: the step's tile ``[t, v, e, q1, q0]`` permuted to ``[v, q1, q0, t, e]`` in registers;
    for a weight in ``ring_layout`` (its pairs K-neighbours), ``[t, v, q1, q0, e]`` to the same.
    ``PDL``: the projection launched after it with PDL may start at once (it waits for this
    kernel before it reads the activations)."""
    if PDL:
        gdc_launch_dependents()
    STEP: tl.constexpr = 32 * V
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    step = tl.program_id(1)
    cols = tl.arange(0, STEP)
    mask = rows[:, None] < M
    tile = tl.load(x_ptr + rows[:, None] * stride_xm + step * STEP + cols[None, :], mask=mask)
    tile = tl.reshape(tile, (ROWS, 4, V, 2, 2, 2))
    if LAYOUT == 1:  # ring_layout.RING
        tile = tl.reshape(tl.permute(tile, (0, 2, 3, 4, 1, 5)), (ROWS, STEP))
    else:
        tile = tl.reshape(tl.permute(tile, (0, 2, 4, 5, 1, 3)), (ROWS, STEP))
    tl.store(out_ptr + rows[:, None] * stride_om + step * STEP + cols[None, :], tile, mask=mask)


def permute_steps(
    x: torch.Tensor, rows: int = ROWS, layout: int = ring_layout.CHECKPOINT, pdl: bool = False
) -> torch.Tensor:
    """``x [M, K]`` (unit stride along K, K in whole 256-wide steps) in the decode's K order for a
    weight in ``layout`` (``ring_layout``), one launch (``bench/probe_permute_steps.py`` times its
    rows a program); ``pdl``: a kernel launched after it with PDL may start before it ends."""
    m, k = x.shape
    out = torch.empty(m, k, dtype=x.dtype, device=x.device)
    grid = (cdiv(m, rows), k // (32 * V))
    permute_steps_kernel[grid](
        x, out, m, x.stride(0), out.stride(0), ROWS=rows, V=V, LAYOUT=layout, PDL=pdl, num_warps=4
    )
    return out


def permute_steps_reference(x: torch.Tensor, layout: int = ring_layout.CHECKPOINT) -> torch.Tensor:
    """``permute_steps`` in plain torch: each step as ``[t, v, e, q1, q0]`` (``[t, v, q1, q0, e]``
    for ``ring_layout``) read as ``[v, q1, q0, t, e]``."""
    m, k = x.shape
    steps = x.reshape(m, k // (32 * V), 4, V, 2, 2, 2)
    order = (0, 1, 3, 4, 5, 2, 6) if layout == ring_layout.RING else (0, 1, 3, 5, 6, 2, 4)
    return steps.permute(*order).reshape(m, k)
