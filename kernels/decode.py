"""Triton helpers that turn NVFP4 bytes into bf16 operands, shared by every kernel.

A kernel loads a packed tile ``uint8 [..]`` and its E4M3 scales, and needs the scaled weights
as bf16: ``lo`` (the element at even k, low nibble) and ``hi`` (odd k, high nibble) of each
byte. Keeping even and odd elements apart, and splitting the activations the same way, avoids
interleaving the two nibbles in registers.

``e2m1 * scale`` is exact in bf16 (at most 2 + 4 significant bits, exponents inside bf16's
range), so the only rounding in a kernel is its fp32 accumulation.

Two decoders compute the same bits:

* ``decode_arith``: portable Triton integer ops; runs under ``TRITON_INTERPRET=1``, which is
  how CI checks every kernel on the CPU.
* ``decode_prmt``: PTX for sm_90 and newer. Four bytes per call: a ``prmt`` byte lookup builds
  the high and low bytes of eight bf16 values (the E2M1 table fits the 8-byte ``prmt`` pool),
  sign bits are moved with one more ``prmt``, and ``mul.rn.bf16x2`` applies the block scale.
  About 3.5 instructions an element against about 9 for ``decode_arith``: at 32 E2M1 elements
  per SM cycle (H200 bandwidth / SMs / clock) the arithmetic form would be ALU-bound.
"""

from __future__ import annotations

import sys

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, globaltimer

# Byte tables for prmt: bf16 bits of E2M1 magnitudes 0..7 (0, .5, 1, 1.5, 2, 3, 4, 6) are
# 0x0000 0x3F00 0x3F80 0x3FC0 0x4000 0x4040 0x4080 0x40C0.
_PRMT_DECODE = tl.constexpr(
    """
{
.reg .b32 lo, hi, sl, sh, t, ll, lh, hl, hh, s, g0, g1, la, lb, ha, hb, z;
mov.b32 la, 0xC0800000;
mov.b32 lb, 0xC0804000;
mov.b32 ha, 0x3F3F3F00;
mov.b32 hb, 0x40404040;
mov.b32 z, 0;
and.b32 lo, $4, 0x07070707;
shr.u32 hi, $4, 4;
and.b32 hi, hi, 0x07070707;
shr.u32 t, lo, 12;
or.b32 sl, lo, t;
shr.u32 t, hi, 12;
or.b32 sh, hi, t;
prmt.b32 ll, la, lb, sl;
prmt.b32 lh, ha, hb, sl;
prmt.b32 hl, la, lb, sh;
prmt.b32 hh, ha, hb, sh;
and.b32 s, $4, 0x88888888;
prmt.b32 g0, s, z, 0x1404;
prmt.b32 g1, s, z, 0x3424;
prmt.b32 $0, ll, lh, 0x6240;
prmt.b32 $1, ll, lh, 0x7351;
shl.b32 t, g0, 4;
and.b32 t, t, 0x80008000;
or.b32 $0, $0, t;
shl.b32 t, g1, 4;
and.b32 t, t, 0x80008000;
or.b32 $1, $1, t;
prmt.b32 $2, hl, hh, 0x6240;
prmt.b32 $3, hl, hh, 0x7351;
and.b32 t, g0, 0x80008000;
or.b32 $2, $2, t;
and.b32 t, g1, 0x80008000;
or.b32 $3, $3, t;
mul.rn.bf16x2 $0, $0, $5;
mul.rn.bf16x2 $1, $1, $6;
mul.rn.bf16x2 $2, $2, $5;
mul.rn.bf16x2 $3, $3, $6;
}
"""
)


@triton.jit
def e4m3_to_bf16(scale_bytes):
    """E4M3 scale bytes (uint8) as bf16; exact, E4M3 lies inside bf16."""
    return scale_bytes.to(tl.float8e4nv, bitcast=True).to(tl.float32).to(tl.bfloat16)


@triton.jit
def _e2m1_to_bf16(codes):
    m = (codes & 7).to(tl.int16)
    normal = (m << 6) + (126 << 7)
    mag = tl.where(m >= 2, normal, tl.where(m == 1, 0x3F00, 0).to(tl.int16))
    bits = mag | ((codes & 8).to(tl.int16) << 12)
    return bits.to(tl.bfloat16, bitcast=True)


@triton.jit
def decode_arith(packed, scale):
    """(lo, hi) bf16 = E2M1 codes of each byte times ``scale`` (bf16, broadcast to packed)."""
    scale = scale.to(tl.float32)
    lo = _e2m1_to_bf16(packed & 15).to(tl.float32) * scale
    hi = _e2m1_to_bf16(packed >> 4).to(tl.float32) * scale
    return lo.to(tl.bfloat16), hi.to(tl.bfloat16)


@triton.jit
def decode_prmt(packed, scale):
    """Same bits as ``decode_arith``, by a prmt byte lookup (sm_90+)."""
    scale = tl.broadcast_to(scale, packed.shape)
    return tl.inline_asm_elementwise(
        asm=_PRMT_DECODE,
        constraints="=r,=r,=r,=r,r,r,r",
        args=[packed, scale],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def decode(packed, scale, USE_PRMT: tl.constexpr):
    if USE_PRMT:
        return decode_prmt(packed, scale)
    else:
        return decode_arith(packed, scale)


@triton.jit
def load_nvfp4_halves(
    packed_ptr,
    scales_ptr,
    rows,
    n_mask,
    K,
    k0,
    stride_wn,
    stride_sn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PRMT: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """(even-k, odd-k) bf16 tiles ``[BLOCK_N, BLOCK_K/2]`` of NVFP4 weight ``rows`` (int64) at ``k0``.

    The strides are kernel arguments, not ``K // 2``: Triton specializes arguments divisible by
    16, and only then does it know each row starts 16-byte aligned and issue 16-byte loads
    (measured on H200: ``K // 2`` inside the kernel gave byte loads and 0.2 of copy bandwidth).
    With ``EVEN_K`` (K a multiple of BLOCK_K, every real model) the loads are masked by row
    only: a mask that varies along K also stops Triton from vectorizing (seen in SASS as
    ``LDG.E.U8``). Each scale covers 8 consecutive bytes; it is broadcast in registers."""
    packed, scale = load_nvfp4_codes(packed_ptr, scales_ptr, rows, n_mask, K, k0, stride_wn, stride_sn, BLOCK_K, EVEN_K)
    return decode_codes(packed, scale, USE_PRMT)


@triton.jit
def decode_codes(codes, scales, USE_PRMT: tl.constexpr):
    """(even-k, odd-k) bf16 of codes ``uint8 [R, B]`` and their scale bytes ``uint8 [R, B/8]``
    (``load_nvfp4_codes``'): each scale broadcast over its 8 bytes in registers."""
    R: tl.constexpr = codes.shape[0]
    HALF_K: tl.constexpr = codes.shape[1]
    GROUPS: tl.constexpr = scales.shape[1]
    scale = tl.reshape(tl.broadcast_to(e4m3_to_bf16(scales)[:, :, None], (R, GROUPS, 8)), (R, HALF_K))
    return decode(codes, scale, USE_PRMT)


@triton.jit
def load_nvfp4_codes(
    packed_ptr,
    scales_ptr,
    rows,
    row_mask,
    K,
    k0,
    stride_row,
    stride_srow,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """(codes ``uint8 [R, BLOCK_K/2]``, scale bytes ``uint8 [R, BLOCK_K/16]``) of NVFP4 ``rows``
    (int64) at ``k0``, undecoded: the operands of ``dot_nvfp4``. Masked rows read zero scales, so
    they add nothing to a product."""
    HALF_K: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // 16
    # k0 is a multiple of BLOCK_K, but Triton's alignment analysis loses that through ``// 2``.
    byte = tl.multiple_of(k0 // 2, HALF_K) + tl.arange(0, HALF_K)
    group = tl.multiple_of(k0 // 16, GROUPS) + tl.arange(0, GROUPS)
    if EVEN_K:
        byte_mask = row_mask[:, None]
        group_mask = row_mask[:, None]
    else:
        byte_mask = row_mask[:, None] & (byte[None, :] < K // 2)
        group_mask = row_mask[:, None] & (group[None, :] < K // 16)
    codes = tl.load(packed_ptr + rows[:, None] * stride_row + byte[None, :], mask=byte_mask, other=0)
    scales = tl.load(scales_ptr + rows[:, None] * stride_srow + group[None, :], mask=group_mask, other=0)
    return codes, scales


@triton.jit
def _decoded_halves(codes, scales):
    lo, hi = decode_codes(codes, scales, False)
    return lo.to(tl.float32), hi.to(tl.float32)


@triton.jit
def dot_nvfp4(a_codes, a_scales, b_codes, b_scales, acc, INTERPRETED: tl.constexpr):
    """``acc + A @ B^T`` for two NVFP4 tiles as ``load_nvfp4_codes`` gives them (``A [M, K]``,
    ``B [N, K]``; codes packed along K, one E4M3 scale per 16): ``tl.dot_scaled`` with both
    operands E2M1, which is the block-scaled FP4 tensor-core instruction on compute 10 and up.

    Triton's interpreter reads ``dot_scaled`` scales as e8m0, so interpreted runs decode both
    tiles exactly (``e2m1 * scale`` fits bf16) and multiply in fp32: the same products and the
    same fp32 accumulation, which is how CI checks the W4A4 kernels' indexing on the CPU."""
    if INTERPRETED:
        a_lo, a_hi = _decoded_halves(a_codes, a_scales)
        b_lo, b_hi = _decoded_halves(b_codes, b_scales)
        acc = tl.dot(a_lo, tl.trans(b_lo), acc)
        return tl.dot(a_hi, tl.trans(b_hi), acc)
    else:
        a_s = a_scales.to(tl.float8e4nv, bitcast=True)
        b_s = b_scales.to(tl.float8e4nv, bitcast=True)
        return tl.dot_scaled(a_codes, a_s, "e2m1", tl.trans(b_codes), b_s, "e2m1", acc)


@triton.jit
def load_bf16_halves(
    w_ptr, rows, n_mask, K, k0, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr
):
    """The same tiles from a bf16 weight: the baseline arm of the benchmark, same kernel design."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = n_mask[:, None] if EVEN_K else n_mask[:, None] & (offs_k[None, :] < K)
    w = tl.load(w_ptr + rows[:, None] * stride_wn + offs_k[None, :], mask=mask, other=0.0)
    return tl.split(tl.reshape(w.to(tl.bfloat16), (BLOCK_N, BLOCK_K // 2, 2)))


@triton.jit
def load_weight_halves(
    w_ptr,
    scales_ptr,
    rows,
    n_mask,
    K,
    k0,
    stride_wn,
    stride_sn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PRMT: tl.constexpr,
    EVEN_K: tl.constexpr,
    WEIGHT_BF16: tl.constexpr,
):
    """NVFP4 tiles, or bf16 ones for the benchmark's same-design bf16 arm (``WEIGHT_BF16``)."""
    if WEIGHT_BF16:
        return load_bf16_halves(w_ptr, rows, n_mask, K, k0, stride_wn, BLOCK_N, BLOCK_K, EVEN_K)
    else:
        return load_nvfp4_halves(
            w_ptr, scales_ptr, rows, n_mask, K, k0, stride_wn, stride_sn, BLOCK_N, BLOCK_K, USE_PRMT, EVEN_K
        )


@triton.jit
def k_mask(rows_mask, offs_k, K, EVEN_K: tl.constexpr):
    """The mask of an activation tile ``[rows, BLOCK_K]``: by row only when K divides evenly."""
    if EVEN_K:
        return rows_mask[:, None]
    else:
        return rows_mask[:, None] & (offs_k[None, :] < K)


@triton.jit
def dot(a, b, acc, INTERPRETED: tl.constexpr):
    """``tl.dot`` on bf16 operands. Triton 3.9's interpreter multiplies bf16 dot operands
    wrongly (it sees their raw bits), so interpreted runs widen both to fp32 first."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


def shift_ptx(dst: str, src: str, amount: int) -> str:
    """PTX moving ``src`` left by ``amount`` bits into ``dst`` (right when negative)."""
    if amount > 0:
        return f"shl.b32 {dst}, {src}, {amount};"
    if amount < 0:
        return f"shr.b32 {dst}, {src}, {-amount};"
    return f"mov.b32 {dst}, {src};"


def placed_pairs(words, magnitude_shift, sign_shift, magnitude_mask: int, sign_mask: int, dtype):
    """A bit-placement decoder's arithmetic in plain torch: int32 ``words [...]`` -> ``dtype
    [..., 8]`` in element order. Pair q of a word holds elements q (low half) and q + 4 (high
    half), each moved by ``magnitude_shift[q]``/``sign_shift[q]`` and masked; what CI checks
    the Gluon decoders' PTX constants with."""
    import torch

    w = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.empty(*words.shape, 8, dtype=dtype)
    for q in range(4):
        mag = (w << magnitude_shift[q] if magnitude_shift[q] >= 0 else w >> -magnitude_shift[q]) & magnitude_mask
        pair = (mag | ((w << sign_shift[q]) & sign_mask)).to(torch.int32)
        out[..., q] = (pair & 0xFFFF).to(torch.int16).view(dtype)
        out[..., q + 4] = ((pair >> 16) & 0xFFFF).to(torch.int16).view(dtype)
    return out


@triton.jit
def wait_then_let_next_start(PDL: tl.constexpr):
    """A kernel launched with PDL (``PDL``): wait for the kernel before it (its writes visible),
    then let the kernel after it launch, which waits in turn before it reads anything."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def lead(ns):
    """A kernel before a timed one, as a compiled kernel whose trigger comes right after its wait
    is (``bench/inductor_trigger.py``): launched with PDL, it waits for the kernel before it, lets
    the next one launch at once, then runs ``ns`` nanoseconds. One program, as a norm's or an
    activation's at a few tokens."""
    wait_then_let_next_start(True)
    start = globaltimer()
    while globaltimer() - start < ns:
        pass


def interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def inductor_pdl() -> bool:
    """Whether torch.compile launches its Triton kernels with PDL (inductor's ``triton.enable_pdl``,
    ``TORCHINDUCTOR_ENABLE_PDL=1``): each waits for the kernel before it and lets the next start
    early. A ring form launched with PDL gains only after a kernel that lets it start; with
    inductor's PDL Llama-3-8B's seated step ran 2.07 ms against 2.25 (H200, 0d80628,
    ``h200-e2e-llama-0d80628-pdl-b1b8.json``). Inductor not imported: nothing compiled to follow."""
    config = sys.modules.get("torch._inductor.config")
    return bool(config is not None and getattr(config.triton, "enable_pdl", False))


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` for the launchers. On the host Triton's is a ``ConstexprFunction`` call:
    2.0 us with Triton 3.6 and 3.7 with 3.9 on the 2-core development machine, against 0.1 for the
    arithmetic, and an eager call pays it for every grid and split it works out (a seated bank
    call several times); captured steps do not replay it."""
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for the launchers (0 for 0, as Triton's), for ``cdiv``'s reason."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def launch_pdl(switch: bool | None) -> bool:
    """A PDL switch (``linear_mma_gluon.PDL_LAUNCH``, ``moe_ring_gluon.PDL_DOWN``) as a launch takes
    it: ``None`` follows torch.compile's own (``inductor_pdl``); never under the interpreter."""
    return (inductor_pdl() if switch is None else switch) and not interpreted()


def use_prmt(device_capability: tuple[int, int] | None) -> bool:
    """The PTX decoder needs a real sm_90+ device (not the interpreter): ``mul.bf16x2`` is sm_90."""
    if interpreted() or device_capability is None:
        return False
    return device_capability[0] >= 9


__all__ = [
    "decode",
    "decode_arith",
    "decode_codes",
    "decode_prmt",
    "dot",
    "dot_nvfp4",
    "e4m3_to_bf16",
    "interpreted",
    "load_nvfp4_codes",
    "placed_pairs",
    "shift_ptx",
    "use_prmt",
]
