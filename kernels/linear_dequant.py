"""Weight-only NVFP4 linear for many tokens: decode the weight to bf16 once, then cuBLAS.

At prefill sizes the GEMM is compute-bound, and cuBLAS's GEMMs beat the Triton forms that decode
the weight in registers again for every tile of tokens: on the H200 a seated Llama-3-8B-shaped
model prefilled 128-4096 rows at 1.7-2.0x the bf16 time through those forms (f55fc09,
``git show a51a0c1:bench/results/h200-e2e.json``). Decoding once is a pass over the weight (0.56
bytes read and 2 written a parameter) that a GEMM over ``MIN_ROWS`` rows or more mostly hides;
the adjudicator measures whether it pays for each shape. The decoded copy is transient: it lives
for one call.

The kernel writes each weight element as ``e2m1 * e4m3`` (exact in bf16) times the global scale,
rounded once to the activations' dtype: the same numbers ``nvfp4.dequantize`` gives.

Decoded whole, the copy costs HBM 2 bytes written and 2 read again a parameter on top of the 0.56
of the codes: on the H200 the form ran the three Llama-3-8B projections at 512 tokens at 0.71x
the bf16 speed and at 2048 at 0.91x (geometric means, cffd015).
In slabs (``SLAB_ROWS``), a slab of rows is decoded into one reused buffer and multiplied into
its columns of the output before the next, so a layer too large to decode whole (an LM head)
still gets this form. Slabs are not a way to keep the copy in L2: on the H200, where both were
offered, slabs of 4096 rows ran 1-13% slower than the whole copy and of 2048 rows 2-40% slower
(qkv and gate_up at 512 and 2048 tokens, 7554cb7, ``bench/results/h200-kernels-slabs.json``):
the narrower GEMMs lose more than the L2 saves. So they are offered only where the whole copy is not.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels import ring_layout
from flashrt.kernels.decode import cdiv, decode_codes, load_nvfp4_codes
from flashrt.kernels.linear_mma import SMS

# Below this many rows the decode pass costs more than the GEMM it feeds: the register-decoding
# forms win there, so the form is not offered (and not timed) for fewer rows.
MIN_ROWS = 64
# The decoded copy is transient but real memory: a Llama-3-8B MLP projection is 117 MiB in bf16,
# an LM-head slab 512 MiB. Layers above this are decoded in slabs or left to the forms that need
# no copy, so a serving engine that sized its KV cache to the card never meets a spike of that order.
MAX_DECODED_BYTES = 256 << 20
# Slabs of weight rows, for layers past MAX_DECODED_BYTES: a GEMM over a slab makes tokens/128 x
# rows/128 of cuBLAS's 128 x 128 output tiles, a wave of the H200's 132 SMs at 512 tokens and
# 4096 rows, so slabs are not narrower than 2048 rows; the buffer is at most 32 MiB.
SLAB_ROWS = (2048, 4096)
MAX_SLAB_BYTES = 32 << 20
# The decode pass is a copy, and a copy needs bytes in flight on every SM. The two tiles below
# make 64-192 programs of an expert-sized weight (2048 x 512 to 1536 x 2048), one program an SM
# or fewer, where the GEMM they feed takes 5-20 us; a tile of 16 rows makes four times as many.
# Offered where the widest tile would make fewer than ``FEW_PROGRAMS``. H200, the kernel
# benchmark's four expert-sized layers at 2048 tokens (``h200-kernels-experts-large-23ada83.json``
# against ``h200-kernels-small-59aeccb.json`` and, for 2048 x 512, ``h200-kernels-experts-856a2cf.json``):
# the adjudicator took it for all four and for three of them at 512 tokens, and at 2048 they ran
# 0.79-0.85x bf16's speed in the same run against 0.67-0.80x with the wider tiles. An 8-row tile
# (2 warps) beside it timed within 2% of it at those eight shapes and token counts (c51a8ec,
# ``h200-kernels-experts-narrow-c51a8ec.json``'s adjudication: 24.43 us against 24.61 on the
# 1536 x 2048 weight at 2048 tokens, 12.24 against 12.11 at 512): not offered.
TILES = ({"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4}, {"BLOCK_N": 32, "BLOCK_K": 1024, "num_warps": 8})
NARROW_TILE = {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4}
FEW_PROGRAMS = 4 * SMS


@triton.jit
def nvfp4_dequant_kernel(
    packed_ptr,
    scales_ptr,
    global_scale_ptr,
    out_ptr,
    N,
    K,
    stride_wn,
    stride_sn,
    stride_on,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PRMT: tl.constexpr,
    EVEN_K: tl.constexpr,
    LAYOUT: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    n_mask = rows < N
    wide = rows.to(tl.int64)
    codes, scales = load_nvfp4_codes(packed_ptr, scales_ptr, wide, n_mask, K, k0, stride_wn, stride_sn, BLOCK_K, EVEN_K)
    if LAYOUT == 1:  # ring_layout.RING (K in whole words: the layout is offered for nothing else)
        codes = ring_layout.checkpoint_bytes(codes)
    lo, hi = decode_codes(codes, scales, USE_PRMT)
    weight = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))  # byte b holds k = 2b (low nibble), 2b + 1
    weight = weight.to(tl.float32) * tl.load(global_scale_ptr)
    cols = k0 + tl.arange(0, BLOCK_K)
    mask = n_mask[:, None] if EVEN_K else n_mask[:, None] & (cols[None, :] < K)
    weight = weight.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")  # as torch rounds
    tl.store(out_ptr + wide[:, None] * stride_on + cols[None, :], weight, mask=mask)


def dequantize_into(packed, scales, global_scale, out: torch.Tensor, config: dict, use_prmt: bool) -> torch.Tensor:
    """Rows ``[0, out.shape[0])`` of the weight decoded into ``out`` (in its dtype); ``LAYOUT``
    in the config: the weight's (``ring_layout``)."""
    n, k = out.shape
    grid = (cdiv(n, config["BLOCK_N"]), cdiv(k, config["BLOCK_K"]))
    nvfp4_dequant_kernel[grid](
        packed,
        scales.view(torch.uint8),
        global_scale,
        out,
        n,
        k,
        packed.stride(0),
        scales.stride(0),
        out.stride(0),
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"],
        USE_PRMT=use_prmt,
        EVEN_K=k % config["BLOCK_K"] == 0,
        LAYOUT=config.get("LAYOUT", ring_layout.CHECKPOINT),
        num_warps=config["num_warps"],
    )
    return out


def dequantize_triton(packed, scales, global_scale, dtype: torch.dtype, config: dict, use_prmt: bool) -> torch.Tensor:
    """The weight ``[N, K]`` in ``dtype``, decoded on the device."""
    out = torch.empty(packed.shape[0], packed.shape[1] * 2, dtype=dtype, device=packed.device)
    return dequantize_into(packed, scales, global_scale, out, config, use_prmt)


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
    """Decode a slab, multiply it into its columns of ``out`` (cuBLAS writes a column block in
    place, its leading dimension the row of ``out``), then the next slab into the same buffer."""
    n, k = packed.shape[0], packed.shape[1] * 2
    rows = min(n, config.get("SLAB_ROWS", n))
    buffer = torch.empty(rows, k, dtype=x.dtype, device=x.device)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        weight = dequantize_into(packed[r0:r1], scales[r0:r1], global_scale, buffer[: r1 - r0], config, use_prmt)
        if bias is None:
            torch.mm(x, weight.t(), out=out[:, r0:r1])
        else:
            torch.addmm(bias[r0:r1].to(x.dtype), x, weight.t(), out=out[:, r0:r1])
    return out


# The weight's bits as the checkpoint has them, or in ``ring_layout`` (undone in registers).
LAYOUTS = (ring_layout.CHECKPOINT, ring_layout.RING)


def configs(m: int, n: int, k: int) -> list[dict]:
    """Two tile shapes of the decode pass (it is a copy: 8-16 KB of codes in, 32-64 KB out a
    program), and a narrow one for weights that make few programs (``NARROW_TILE``), each
    decoding the whole weight where that copy stays under ``MAX_DECODED_BYTES``, else in each
    ``SLAB_ROWS`` narrower than the weight whose buffer stays under ``MAX_SLAB_BYTES``; only
    from ``MIN_ROWS`` rows, where the GEMM can hide the pass."""
    if m < MIN_ROWS or k % 16:
        return []
    if n * k * 2 <= MAX_DECODED_BYTES:
        copies = [{}]
    else:
        copies = [{"SLAB_ROWS": rows} for rows in SLAB_ROWS if rows < n and rows * k * 2 <= MAX_SLAB_BYTES]
    tiles = list(TILES)
    if cdiv(n, TILES[0]["BLOCK_N"]) * cdiv(k, TILES[0]["BLOCK_K"]) < FEW_PROGRAMS:
        tiles.append(NARROW_TILE)
    return [tile | copy for tile in tiles for copy in copies]
