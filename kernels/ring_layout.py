"""A bit layout of the packed weight chosen for the ring forms' decode, and its inverse.

The ring forms (``linear_mma_gluon``) turn each 32-bit word of eight E2M1 codes into four
bf16 pairs by moving bits: code bits ``m e0 e1`` to bf16 bits 6-8 (22-24 in the high half) and
the sign to bit 15 (31). In the checkpoint's layout (element ``i`` in nibble ``i``) a pair takes
two shifts and two ``LOP3``s before its ``HMUL2`` by the block scale, and the activations are
gathered with ``PRMT``s into the order those pairs give (elements ``q`` and ``q + 4``). A word
is 32 bits and the decode does not care where they sit, so a layout can be chosen at bind:

* pair ``q`` holds elements ``2q`` and ``2q + 1``, K-neighbours, so the activations are read as
  they lie;
* each pair's bits sit where shifting the word left by ``MAGNITUDE_SHIFT[q]`` (right where
  negative) puts its magnitudes and by ``SIGN_SHIFT[q]`` its signs, then one mask each. Left
  shifts, not rotations: ptxas makes a left shift by a constant an ``IMAD.SHL`` on the FMA pipe,
  where ``SHF`` and ``LOP3`` share the integer pipe, which on sm_90 takes half as many warp
  instructions a cycle as the FMA pipe (H100, ``bench/probe_pipes.py``). An exhaustive search
  over single shifts (``bench/probe_pipes.layouts``) finds no layout of four one-shift pairs;
  the fewest integer-pipe instructions are 7 a word: two pairs of one shift (one of them none),
  two of two, one shift right. The rotations this layout had until session 56 took 11 (5
  ``SHF``), 205 of the one-token step's 337 instructions on that pipe; now 133 of 338. On an
  H100 that bought 0.5-0.9%, from HBM and from L2 alike within the runs' spread
  (``bench/probe_shift_layout.py``, ``bench/probe_streams.py``): the ring does not wait on
  that pipe there. The H200, whose HBM is faster for the same SMs, has not timed it.

``pack`` is a permutation of each word's 32 bits and ``unpack`` its inverse: bit-exact both
ways, so a seat can give back the checkpoint's bytes.

The ring's main loop for sm_90 (8 tokens, 32 rows, 4 stages): 359 SASS instructions a step a
thread against 453 on the checkpoint's layout. H200 (``bench/probe_ring_layout.py``,
``h200-probe-ring-layout-fd70e4d.json``, the same configs each way): 1.03-1.12x faster at 1 and
8 tokens on Llama-3-8B's and Qwen3-30B's projections, the LM head at one token 89.2 to 82.1 us.
The prefill forms read it too: ``wgmma_gluon`` (its activations permuted in the other order) and
the dequant (``checkpoint_bytes`` in registers, then its usual decode).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import placed_pairs, shift_ptx

# What ``NVFP4Weight.layout`` holds: the checkpoint's nibbles, or this layout's bits.
CHECKPOINT = 0
RING = 1
MAGNITUDE_SHIFT = (0, 3, -3, 6)
SIGN_SHIFT = (0, 3, 1, 2)
MAGNITUDE_MASK = 0x01C001C0
SIGN_MASK = 0x80008000


def _source_bits() -> list[list[int]]:
    """``[element][code bit]`` -> the bit of the word that holds it (code bits m, e0, e1, sign):
    the bit that a pair's shift moves onto the bf16 bit the decode wants there."""
    out = []
    for element in range(8):
        q, high = divmod(element, 2)
        base = 16 * high
        bits = [base + 6 + j - MAGNITUDE_SHIFT[q] for j in range(3)]
        out.append([*bits, base + 15 - SIGN_SHIFT[q]])
    return out


SOURCE_BITS = _source_bits()
assert sorted(b for bits in SOURCE_BITS for b in bits) == list(range(32)), "the shifts must tile the word"


def _words(packed: torch.Tensor) -> torch.Tensor:
    if packed.dtype != torch.uint8 or packed.shape[-1] % 4:
        raise ValueError(f"packed: got {packed.dtype} {tuple(packed.shape)}, need uint8 rows of whole 4-byte words")
    return packed.contiguous().view(torch.int32)


def _moved(words: torch.Tensor, moves) -> torch.Tensor:
    """Bit ``src`` of each word to bit ``dst``, for every ``(src, dst)`` in ``moves``: int32 ops
    only (a sign-extending shift is masked to its bit), so a bind holds one word-sized copy."""
    out = torch.zeros_like(words)
    for src, dst in moves:
        out |= ((words >> src) & 1) << dst
    return out


# (checkpoint bit, this layout's bit) for each of a word's 32 bits: code bit j of element i is
# checkpoint bit 4i + j.
_MOVES = [(4 * element + j, bit) for element, bits in enumerate(SOURCE_BITS) for j, bit in enumerate(bits)]


def pack(packed: torch.Tensor) -> torch.Tensor:
    """The checkpoint's packed bytes (element ``i`` of a word in nibble ``i``) in this layout."""
    return _moved(_words(packed), _MOVES).view(torch.uint8).view(packed.shape)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """``pack``'s inverse: this layout's bytes back to the checkpoint's."""
    return _moved(_words(packed), [(dst, src) for src, dst in _MOVES]).view(torch.uint8).view(packed.shape)


def decode_ptx() -> str:
    """PTX: the four bf16 pairs ``$0..$3`` of word ``$4`` (pair q: elements 2q, 2q + 1), each
    times the bf16 scale ``$5`` in both halves."""
    lines = ["{", ".reg .b32 m, s, scale2;", "mov.b32 scale2, {$5, $5};"]
    for q in range(4):
        a, b = MAGNITUDE_SHIFT[q], SIGN_SHIFT[q]
        lines.append(shift_ptx("m", "$4", a))
        if a == b:
            lines.append(f"and.b32 m, m, {MAGNITUDE_MASK | SIGN_MASK:#010x};")
        else:
            lines += [f"and.b32 m, m, {MAGNITUDE_MASK:#010x};", shift_ptx("s", "$4", b)]
            lines += [f"and.b32 s, s, {SIGN_MASK:#010x};", "or.b32 m, m, s;"]
        lines.append(f"mul.rn.bf16x2 ${q}, m, scale2;")
    return "\n".join([*lines, "}"])


def bf16_bits(words: torch.Tensor) -> torch.Tensor:
    """``decode_ptx``'s bit placement in plain torch: int32 words -> bfloat16 ``[..., 8]`` in
    element order, each ``e2m1 * 2**-126``; what CI checks the PTX's constants with.
    ``decode.placed_pairs`` places pair q's halves as elements q and q + 4; here they are 2q and 2q + 1."""
    pairs = placed_pairs(words, MAGNITUDE_SHIFT, SIGN_SHIFT, MAGNITUDE_MASK, SIGN_MASK, torch.bfloat16)
    return pairs[..., [0, 4, 1, 5, 2, 6, 3, 7]]


_MAGNITUDE_SHIFT = tl.constexpr(MAGNITUDE_SHIFT)
_SIGN_SHIFT = tl.constexpr(SIGN_SHIFT)


@triton.jit
def _shifted(w, n: tl.constexpr):
    if n >= 0:
        return w << n
    else:
        return w >> -n


@triton.jit
def _checkpoint_byte(w, A: tl.constexpr, B: tl.constexpr):
    """Checkpoint byte q (elements 2q, 2q + 1) of ring words ``w`` (uint32), pair q's shifts A and B."""
    m = _shifted(w, A)
    s = _shifted(w, B)
    return (((m >> 6) & 0x7) | ((s >> 12) & 0x8) | ((m >> 18) & 0x70) | ((s >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def checkpoint_bytes(codes):
    """Packed bytes ``uint8 [R, B]`` (B a multiple of 4) in this layout -> the checkpoint's, in
    registers: what a Triton form that decodes the checkpoint's nibbles reads first."""
    R: tl.constexpr = codes.shape[0]
    B: tl.constexpr = codes.shape[1]
    shifts = tl.arange(0, 4) * 8
    w = tl.sum(tl.reshape(codes, (R, B // 4, 4)).to(tl.uint32) << shifts[None, None, :], axis=2)
    b0 = _checkpoint_byte(w, _MAGNITUDE_SHIFT[0], _SIGN_SHIFT[0])
    b1 = _checkpoint_byte(w, _MAGNITUDE_SHIFT[1], _SIGN_SHIFT[1])
    b2 = _checkpoint_byte(w, _MAGNITUDE_SHIFT[2], _SIGN_SHIFT[2])
    b3 = _checkpoint_byte(w, _MAGNITUDE_SHIFT[3], _SIGN_SHIFT[3])
    return tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), (R, B))  # [.., a, b]: byte 2a + b
