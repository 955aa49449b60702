"""NVFP4 quantization on the GPU, bit-identical to ``nvfp4.quantize_reference``.

Weights: two launches per tensor: ``amax`` (one float atomic max per program) and ``quantize`` (block
amax, E4M3 scale, E2M1 codes, packing). The global scale must be known before the first code
is written, so every byte is read twice; the floor is therefore (2 + 2 + 0.5625) bytes a
parameter, not 2.5625. An expert bank has one global scale per expert, so it is quantized in
chunks of experts small enough to stay in the 50 MB L2 between the two launches: its second
read then comes from L2 and the bank runs at close to a single pass.

Activations (the W4A4 forms): ``quantize_rows``, one launch, one program per token row, which
reads its row twice from L1/L2 (amax, then codes); per-token global scales.

Divisions use ``div_rn`` (IEEE) because Triton's default fp32 division is approximate and
would round some elements differently from the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import cdiv
from flashrt.kernels.nvfp4 import BLOCK_SIZE, E2M1_MAX, E4M3_MAX, NVFP4Weight, _check_amax, _check_dense

AMAX_BLOCK = 8192
# Experts per chunk: at most this many bf16 bytes, well under the H200's 50 MB of L2.
L2_CHUNK_BYTES = 24 << 20


@triton.jit
def round_to_e4m3(x):
    """Round non-negative fp32 ``x`` (at most 448) to the nearest E4M3 value, ties to even.

    Done in fp32 (scale by a power of two, round with the 1.5 * 2**23 trick, scale back), the
    same on the GPU and under the interpreter, whose fp8 cast rounds wrongly when the mantissa
    carries into the exponent (127.39 became 64)."""
    exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exponent = tl.maximum(exponent, -6)  # below 2**-6 E4M3 is subnormal: steps of 2**-9
    up = ((130 - exponent) << 23).to(tl.float32, bitcast=True)  # 2**(3 - exponent)
    down = ((124 + exponent) << 23).to(tl.float32, bitcast=True)  # 2**(exponent - 3)
    magic = 12582912.0  # 1.5 * 2**23: adding and subtracting it rounds to an integer, ties to even
    return ((x * up + magic) - magic) * down


@triton.jit
def global_scale(amax):
    """The FP32 scale that maps ``amax`` onto the largest E2M1 code times the largest E4M3 scale."""
    return tl.where(amax > 0, tl.math.div_rn(amax, 2688.0), 1.0)  # E2M1_MAX * E4M3_MAX


@triton.jit
def quantize_groups(w, g):
    """fp32 ``w [R, G, 16]`` under global scale ``g`` -> (packed codes ``uint8 [R, G, 8]``, E4M3
    scales ``[R, G]``): the standard recipe, element for element what the reference computes."""
    R: tl.constexpr = w.shape[0]
    G: tl.constexpr = w.shape[1]
    block_amax = tl.max(tl.abs(w), axis=2)
    scale = round_to_e4m3(tl.minimum(tl.math.div_rn(tl.math.div_rn(block_amax, 6.0), g), 448.0)).to(tl.float8e4nv)
    denom = scale.to(tl.float32) * g
    safe = tl.where(denom > 0, denom, 1.0)
    q = tl.where(denom[:, :, None] > 0, tl.math.div_rn(w, safe[:, :, None]), 0.0)
    mag = tl.abs(q)
    code = (
        (mag > 0.25).to(tl.uint8)
        + (mag >= 0.75).to(tl.uint8)
        + (mag > 1.25).to(tl.uint8)
        + (mag >= 1.75).to(tl.uint8)
        + (mag > 2.5).to(tl.uint8)
        + (mag >= 3.5).to(tl.uint8)
        + (mag > 5.0).to(tl.uint8)
    )
    code = code | (((q < 0) & (code > 0)).to(tl.uint8) << 3)
    lo, hi = tl.split(tl.reshape(code, (R, G, 8, 2)))
    return lo | (hi << 4), scale


@triton.jit
def amax_kernel(w_ptr, amax_ptr, numel, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    batch = tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    w = tl.load(w_ptr + batch.to(tl.int64) * numel + offs, mask=offs < numel, other=0.0).to(tl.float32)
    tl.atomic_max(amax_ptr + batch, tl.max(tl.abs(w), axis=0))


@triton.jit
def quantize_kernel(
    # pointers
    w_ptr,
    amax_ptr,
    packed_ptr,
    scales_ptr,
    global_scale_ptr,
    # dimensions (N rows of K per batch entry)
    N,
    K,
    # meta-parameters
    BLOCK_ROWS: tl.constexpr,
    BLOCK_GROUPS: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_g = tl.program_id(1)
    batch = tl.program_id(2)
    rows = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    groups = pid_g * BLOCK_GROUPS + tl.arange(0, BLOCK_GROUPS)
    lanes = tl.arange(0, 16)
    mask2 = (rows < N)[:, None] & (groups < K // 16)[None, :]
    mask = mask2[:, :, None]
    base = batch.to(tl.int64) * N * K + rows.to(tl.int64)[:, None, None] * K
    w = tl.load(w_ptr + base + groups[None, :, None] * 16 + lanes[None, None, :], mask=mask, other=0.0).to(tl.float32)

    amax = tl.load(amax_ptr + batch)
    packed, scale = quantize_groups(w, global_scale(amax))

    pbase = batch.to(tl.int64) * N * (K // 2) + rows.to(tl.int64)[:, None, None] * (K // 2)
    bytes_ = groups[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    tl.store(packed_ptr + pbase + bytes_, packed, mask=mask)
    sbase = batch.to(tl.int64) * N * (K // 16) + rows.to(tl.int64)[:, None] * (K // 16)
    tl.store(scales_ptr + sbase + groups[None, :], scale.to(tl.uint8, bitcast=True), mask=mask2)
    if (pid_r == 0) & (pid_g == 0):
        tl.store(global_scale_ptr + batch, global_scale(amax))


@triton.jit
def quantize_rows_kernel(
    # pointers
    x_ptr,
    packed_ptr,
    scales_ptr,
    global_scale_ptr,
    # dimensions
    K,
    # strides (x in elements; packed rows in bytes, scale rows in scales)
    stride_xm,
    stride_pm,
    stride_sm,
    # meta-parameters
    BLOCK_GROUPS: tl.constexpr,
):
    """One program a row: its amax, then its codes and scales. A row is at most a few KB, so its
    second read comes from L1/L2 and one launch does what ``amax`` + ``quantize`` do for a bank."""
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, 16)
    groups = tl.arange(0, BLOCK_GROUPS)
    x_row = x_ptr + row * stride_xm
    amax = tl.zeros((BLOCK_GROUPS, 16), dtype=tl.float32)
    for g0 in range(0, K // 16, BLOCK_GROUPS):
        offs = (g0 + groups)[:, None] * 16 + lanes[None, :]
        w = tl.load(x_row + offs, mask=(g0 + groups < K // 16)[:, None], other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(w))
    g = global_scale(tl.max(tl.max(amax, axis=1), axis=0))
    for g0 in range(0, K // 16, BLOCK_GROUPS):
        mask = (g0 + groups < K // 16)[:, None]
        w = tl.load(x_row + (g0 + groups)[:, None] * 16 + lanes[None, :], mask=mask, other=0.0).to(tl.float32)
        packed, scale = quantize_groups(tl.reshape(w, (1, BLOCK_GROUPS, 16)), g)
        bytes_ = (g0 + groups)[:, None] * 8 + tl.arange(0, 8)[None, :]
        tl.store(packed_ptr + row * stride_pm + bytes_, tl.reshape(packed, (BLOCK_GROUPS, 8)), mask=mask)
        tl.store(
            scales_ptr + row * stride_sm + g0 + groups,
            tl.reshape(scale, (BLOCK_GROUPS,)).to(tl.uint8, bitcast=True),
            mask=g0 + groups < K // 16,
        )
    tl.store(global_scale_ptr + row, g)


ROW_GROUPS = 64  # 1024 elements a step: a 2048-wide hidden row in two, 8 fp32 a thread at 4 warps


def quantize_rows(x: torch.Tensor) -> NVFP4Weight:
    """Per-row NVFP4 of ``x [M, K]`` (activations: one global scale per token) in one launch:
    packed ``[M, K/2]``, scales ``[M, K/16]`` (E4M3), global ``[M]``; row for row bit-identical to
    ``nvfp4.quantize_reference`` of that row."""
    m, k = x.shape
    if k % BLOCK_SIZE:
        raise ValueError(f"x: K = {k} is not a multiple of {BLOCK_SIZE}")
    packed = torch.empty(m, k // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(m, k // BLOCK_SIZE, dtype=torch.uint8, device=x.device)
    global_scale = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        quantize_rows_kernel[(m,)](
            x, packed, scales, global_scale, k, x.stride(0), packed.stride(0), scales.stride(0),
            BLOCK_GROUPS=ROW_GROUPS, num_warps=4,
        )  # fmt: skip
    return NVFP4Weight(packed, scales.view(torch.float8_e4m3fn), global_scale)


def quantize_triton(weight: torch.Tensor, amax: torch.Tensor | None = None) -> NVFP4Weight:
    """``[N, K]`` or ``[E, N, K]`` (one global scale per expert) on a CUDA device; a given
    ``amax`` (``nvfp4.quantize``) skips the amax launches."""
    _check_dense("weight", weight)
    if amax is not None:
        _check_amax(amax, weight)
    assert E2M1_MAX * E4M3_MAX == 2688.0
    w = weight.contiguous()
    batched = w.dim() == 3
    w3 = w if batched else w.unsqueeze(0)
    e, n, k = w3.shape
    packed = torch.empty(e, n, k // 2, dtype=torch.uint8, device=w.device)
    scales = torch.empty(e, n, k // BLOCK_SIZE, dtype=torch.uint8, device=w.device)
    global_scale = torch.empty(e, dtype=torch.float32, device=w.device)
    given = amax is not None
    amax = (
        amax.reshape(e).to(w.device, torch.float32) if given else torch.zeros(e, dtype=torch.float32, device=w.device)
    )
    per_expert = n * k * w.element_size()
    chunk = max(1, L2_CHUNK_BYTES // per_expert)
    block_rows, block_groups = 16, 16
    for start in range(0, e, chunk):
        stop = min(e, start + chunk)
        if not given:
            amax_kernel[(cdiv(n * k, AMAX_BLOCK), stop - start)](
                w3[start:stop], amax[start:stop], n * k, BLOCK=AMAX_BLOCK, num_warps=8
            )
        quantize_kernel[(cdiv(n, block_rows), cdiv(k // 16, block_groups), stop - start)](
            w3[start:stop],
            amax[start:stop],
            packed[start:stop],
            scales[start:stop],
            global_scale[start:stop],
            n,
            k,
            BLOCK_ROWS=block_rows,
            BLOCK_GROUPS=block_groups,
            num_warps=4,
        )
    scales = scales.view(torch.float8_e4m3fn)
    if not batched:
        return NVFP4Weight(packed[0], scales[0], global_scale[0])
    return NVFP4Weight(packed, scales, global_scale)
