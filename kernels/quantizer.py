"""NVFP4 quantization on the GPU, bit-identical to ``nvfp4.quantize_reference``.

Two launches per tensor: ``amax`` (one float atomic max per program) and ``quantize`` (block
amax, E4M3 scale, E2M1 codes, packing). The global scale must be known before the first code
is written, so every byte is read twice; the floor is therefore (2 + 2 + 0.5625) bytes a
parameter, not 2.5625. An expert bank has one global scale per expert, so it is quantized in
chunks of experts small enough to stay in the 50 MB L2 between the two launches: its second
read then comes from L2 and the bank runs at close to a single pass.

Divisions use ``div_rn`` (IEEE) because Triton's default fp32 division is approximate and
would round some elements differently from the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels.nvfp4 import BLOCK_SIZE, E2M1_MAX, E4M3_MAX, NVFP4Weight, _check_dense

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
    g = tl.where(amax > 0, tl.math.div_rn(amax, 2688.0), 1.0)  # E2M1_MAX * E4M3_MAX
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
    lo, hi = tl.split(tl.reshape(code, (BLOCK_ROWS, BLOCK_GROUPS, 8, 2)))
    packed = lo | (hi << 4)

    pbase = batch.to(tl.int64) * N * (K // 2) + rows.to(tl.int64)[:, None, None] * (K // 2)
    bytes_ = groups[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    tl.store(packed_ptr + pbase + bytes_, packed, mask=mask)
    sbase = batch.to(tl.int64) * N * (K // 16) + rows.to(tl.int64)[:, None] * (K // 16)
    tl.store(scales_ptr + sbase + groups[None, :], scale.to(tl.uint8, bitcast=True), mask=mask2)
    if (pid_r == 0) & (pid_g == 0):
        tl.store(global_scale_ptr + batch, g)


def quantize_triton(weight: torch.Tensor) -> NVFP4Weight:
    """``[N, K]`` or ``[E, N, K]`` (one global scale per expert) on a CUDA device."""
    _check_dense("weight", weight)
    assert E2M1_MAX * E4M3_MAX == 2688.0
    w = weight.contiguous()
    batched = w.dim() == 3
    w3 = w if batched else w.unsqueeze(0)
    e, n, k = w3.shape
    packed = torch.empty(e, n, k // 2, dtype=torch.uint8, device=w.device)
    scales = torch.empty(e, n, k // BLOCK_SIZE, dtype=torch.uint8, device=w.device)
    global_scale = torch.empty(e, dtype=torch.float32, device=w.device)
    amax = torch.zeros(e, dtype=torch.float32, device=w.device)
    per_expert = n * k * w.element_size()
    chunk = max(1, L2_CHUNK_BYTES // per_expert)
    block_rows, block_groups = 16, 16
    for start in range(0, e, chunk):
        stop = min(e, start + chunk)
        amax_kernel[(triton.cdiv(n * k, AMAX_BLOCK), stop - start)](
            w3[start:stop], amax[start:stop], n * k, BLOCK=AMAX_BLOCK, num_warps=8
        )
        quantize_kernel[(triton.cdiv(n, block_rows), triton.cdiv(k // 16, block_groups), stop - start)](
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
