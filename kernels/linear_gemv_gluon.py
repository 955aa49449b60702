"""Weight-only NVFP4 GEMV with explicit layouts (Gluon) and a bit-placement decoder, small M.

Same contract as ``linear_gemv``: ``y [M, N] = x [M, K] @ dequant(W)[N, K]^T + bias``. Two things
make it cheaper per weight element on the GPU, which is what bounds a decode GEMV on an H200
(33 T thread-instructions/s against 7.5 T NVFP4 elements/s of copy bandwidth: about 4.4
instructions an element is the whole budget):

* Layouts are written, not inferred. Triton's layout inference gave ``linear_gemv`` different
  layouts for the weight bytes, their scales and the activations, and moved them through shared
  memory with six barriers per step (SASS of sm_90: 7.7 instructions an element). Here the
  weight words, the scales (``SliceLayout`` of the words) and the activations (the other slice)
  are placed so that every operand already sits in the thread that uses it: no shared memory.
* The decoder moves bits instead of looking them up. An E2M1 code ``s e1 e0 m`` put at fp16 bits
  15, 11, 10 and 9 *is* the fp16 ``e2m1 * 2**-14`` exactly (the subnormal 0.5 lands on the fp16
  subnormal ``2**-15``); two elements 16 bits apart in the packed word fill one fp16 pair with one
  shift-and-mask for the magnitudes and one for the signs. ``2**14`` goes into the global scale.
  4.8 instructions an element in SASS against ``decode_prmt``'s 7.6 in the same layout.

Gluon kernels do not run under ``TRITON_INTERPRET``: CI builds them for every target
(``flashrt.kernels.build``) and checks the bit placement against the E2M1 table in plain torch
(``fp16_bits``); the GPU test suite checks the kernel against the reference.
"""

from __future__ import annotations

import torch
from flashrt.kernels.decode import cdiv, placed_pairs, shift_ptx
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# Pair i of a 32-bit word is (element i, element i + 4): 16 bits apart, so one shift serves both.
MAGNITUDE_SHIFT = tuple(9 - 4 * i for i in range(4))  # code bits 0-2 of element i -> fp16 bits 9-11
SIGN_SHIFT = tuple(12 - 4 * i for i in range(4))  # code bit 3 of element i -> fp16 bit 15
MAGNITUDE_MASK = 0x0E000E00
SIGN_MASK = 0x80008000
DECODE_FACTOR = 2.0**14  # fp16 bits are e2m1 * 2**-14
_DECODE_FACTOR = gl.constexpr(DECODE_FACTOR)


def _word_dot_ptx() -> str:
    """PTX: ``$0 = sum_j e2m1_j * 2**-14 * x_j`` over the eight elements of word ``$1``; x in ``$2..$9``."""
    lines = ["{", ".reg .b32 m, s;", ".reg .b16 h0, h1;", ".reg .f32 f0, f1, acc;"]
    for i in range(4):
        first = f"mul.f32 acc, f0, ${2 + i};" if i == 0 else f"fma.rn.f32 acc, f0, ${2 + i}, acc;"
        lines += [
            shift_ptx("m", "$1", MAGNITUDE_SHIFT[i]),
            f"and.b32 m, m, {MAGNITUDE_MASK:#010x};",
            shift_ptx("s", "$1", SIGN_SHIFT[i]),
            f"and.b32 s, s, {SIGN_MASK:#010x};",
            "or.b32 m, m, s;",
            "mov.b32 {h0, h1}, m;",
            "cvt.f32.f16 f0, h0;",
            "cvt.f32.f16 f1, h1;",
            first,
            f"fma.rn.f32 acc, f1, ${6 + i}, acc;",
        ]
    return "\n".join([*lines, "mov.f32 $0, acc;", "}"])


_WORD_DOT = gl.constexpr(_word_dot_ptx())


def fp16_bits(words: torch.Tensor) -> torch.Tensor:
    """This decoder's bit placement in plain torch: int32 words -> float16 ``[..., 8]``, each ``e2m1 * 2**-14``."""
    return placed_pairs(words, MAGNITUDE_SHIFT, SIGN_SHIFT, MAGNITUDE_MASK, SIGN_MASK, torch.float16)


@gluon.jit
def _word_dot(w, x0, x1, x2, x3, x4, x5, x6, x7):
    return gl.inline_asm_elementwise(
        asm=_WORD_DOT,
        constraints="=f,r,f,f,f,f,f,f,f,f",
        args=[w, x0, x1, x2, x3, x4, x5, x6, x7],
        dtype=gl.float32,
        is_pure=True,
        pack=1,
    )


@gluon.jit
def _pair_to_f32(pair, X_FP16: gl.constexpr):
    """Two 16-bit activations in one int32 (element order: low half first) as two fp32."""
    if X_FP16:
        lo = pair.to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
        hi = (pair >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    else:
        lo = (pair << 16).to(gl.float32, bitcast=True)
        hi = (pair & -65536).to(gl.float32, bitcast=True)
    return gl.expand_dims(lo, 0), gl.expand_dims(hi, 0)


@gluon.jit
def step_offsets(
    rows,
    n_rows,
    stride_wn,
    stride_sn,
    ROWS: gl.constexpr,
    GROUPS: gl.constexpr,
    WARPS_N: gl.constexpr,
    WARPS_K: gl.constexpr,
):
    """Per-step offsets in ``words_layout``: (row mask, group index, word offsets, scale offsets,
    activation group index, activation pair offsets)."""
    WORDS: gl.constexpr = words_layout(ROWS, GROUPS, WARPS_N, WARPS_K)
    TILE: gl.constexpr = gl.SliceLayout(2, WORDS)
    ACTS: gl.constexpr = gl.SliceLayout(0, WORDS)
    STEP_GROUPS: gl.constexpr = 32 * GROUPS * WARPS_K
    row_mask = gl.expand_dims(rows < n_rows, 1)
    rows = rows.to(gl.int64)
    group = gl.arange(0, STEP_GROUPS, layout=gl.SliceLayout(0, TILE))
    half = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, WORDS)))
    word_off = gl.expand_dims(gl.expand_dims(rows * stride_wn, 1) + gl.expand_dims(group * 2, 0), 2)
    word_off = word_off + gl.expand_dims(gl.expand_dims(half, 0), 1)
    scale_off = gl.expand_dims(rows * stride_sn, 1) + gl.expand_dims(group, 0)
    x_group = gl.arange(0, STEP_GROUPS, layout=gl.SliceLayout(1, ACTS))
    x_half = gl.arange(0, 2, layout=gl.SliceLayout(0, ACTS))
    pair_off = gl.expand_dims(x_group * 8, 1) + gl.expand_dims(x_half * 4, 0)  # int32 pairs of activations
    return row_mask, group, word_off, scale_off, x_group, pair_off


@gluon.jit
def accumulate(acc, w, scale, factor, x_pairs, g0, groups_k, x_group, pair_off, X_FP16: gl.constexpr):
    """``acc += factor * scale * (words . activations)`` for one step: each word's 8 products
    summed in the PTX, the block scale (times ``factor``) applied once a word."""
    x_mask = gl.expand_dims(g0 + x_group < groups_k, 1)
    p = x_pairs + g0 * 8 + pair_off
    x0, x1 = _pair_to_f32(gl.load(p, mask=x_mask, other=0), X_FP16)
    x2, x3 = _pair_to_f32(gl.load(p + 1, mask=x_mask, other=0), X_FP16)
    x4, x5 = _pair_to_f32(gl.load(p + 2, mask=x_mask, other=0), X_FP16)
    x6, x7 = _pair_to_f32(gl.load(p + 3, mask=x_mask, other=0), X_FP16)
    block_scale = gl.expand_dims(scale.to(gl.float8e4nv, bitcast=True).to(gl.float32) * factor, 2)
    return gl.fma(_word_dot(w, x0, x1, x2, x3, x4, x5, x6, x7), block_scale, acc)


@gluon.jit
def load_step(words_ptr, scales_ptr, g0, groups_k, word_off, scale_off, row_mask, group, EVEN_K: gl.constexpr):
    """The weight words and scale bytes of one step; all-masked past the end of K."""
    # A mask that varies along K would split the 16-byte weight loads: only when K is ragged.
    mask = row_mask & (g0 < groups_k) if EVEN_K else row_mask & gl.expand_dims(g0 + group < groups_k, 0)
    w = gl.load(words_ptr + g0 * 2 + word_off, mask=gl.expand_dims(mask, 2), other=0)
    scale = gl.load(scales_ptr + g0 + scale_off, mask=mask, other=0)
    return w, scale


@gluon.constexpr_function
def words_layout(rows, groups, warps_n, warps_k):
    """A thread owns ``rows`` rows x ``groups`` scale groups (16 elements, two words) per step; a
    warp spans 32 x ``groups`` groups of K; warps stack along N (``warps_n``) and split K
    (``warps_k``, for layers too narrow to give every SM programs). Scales and activations are
    slices of it, so every operand is loaded into the thread that uses it."""
    return gl.BlockedLayout([rows, groups, 2], [1, 32, 1], [warps_n, warps_k, 1], [2, 1, 0])


@gluon.constexpr_function
def rows_layout(rows, groups, warps_n, warps_k):
    """The layout of a block of row indices, and of ``rows_dot``'s result."""
    return gl.SliceLayout(1, gl.SliceLayout(2, words_layout(rows, groups, warps_n, warps_k)))


@gluon.jit
def rows_dot(
    x_row,
    words_ptr,
    scales_ptr,
    rows,
    n_rows,
    K,
    stride_wn,
    stride_sn,
    X_FP16: gl.constexpr,
    EVEN_K: gl.constexpr,
    ROWS: gl.constexpr,
    GROUPS: gl.constexpr,
    WARPS_N: gl.constexpr,
    WARPS_K: gl.constexpr,
):
    """``sum_k x[k] * w[row, k] * 2**-14`` for each of ``rows`` (``rows_layout``; rows at or past
    ``n_rows`` give 0): the GEMV of one activation row against NVFP4 rows, shared by the linear
    and the expert-bank kernels. ``2**-14`` is the decoder's; callers fold it into their scale."""
    WORDS: gl.constexpr = words_layout(ROWS, GROUPS, WARPS_N, WARPS_K)
    STEP_GROUPS: gl.constexpr = 32 * GROUPS * WARPS_K
    row_mask, group, word_off, scale_off, x_group, pair_off = step_offsets(
        rows, n_rows, stride_wn, stride_sn, ROWS, GROUPS, WARPS_N, WARPS_K
    )
    x_pairs = x_row.to(gl.pointer_type(gl.int32), bitcast=True)
    groups_k = K // 16
    acc = gl.zeros([ROWS * WARPS_N, STEP_GROUPS, 2], gl.float32, layout=WORDS)
    w, scale = load_step(words_ptr, scales_ptr, 0, groups_k, word_off, scale_off, row_mask, group, EVEN_K)
    w1, scale1 = load_step(words_ptr, scales_ptr, STEP_GROUPS, groups_k, word_off, scale_off, row_mask, group, EVEN_K)
    for g0 in range(0, groups_k, STEP_GROUPS):
        # The next two steps' bytes are in flight while this one computes (H200: loading at the
        # top of the step never won a shape; two ahead against one, qkv at M=1 9.1 to 8.9 us).
        w2, scale2 = load_step(
            words_ptr, scales_ptr, g0 + 2 * STEP_GROUPS, groups_k, word_off, scale_off, row_mask, group, EVEN_K
        )
        acc = accumulate(acc, w, scale, 1.0, x_pairs, g0, groups_k, x_group, pair_off, X_FP16)
        w, scale, w1, scale1 = w1, scale1, w2, scale2
    return gl.sum(gl.sum(acc, axis=2), axis=1)


@gluon.jit
def nvfp4_linear_gemv_gluon_kernel(
    # pointers
    x_ptr,
    words_ptr,
    scales_ptr,
    global_scale_ptr,
    bias_ptr,
    out_ptr,
    # dimensions
    M,
    N,
    K,
    # strides (x and out in elements, weight rows in int32 words, scale rows in scales)
    stride_xm,
    stride_om,
    stride_wn,
    stride_sn,
    # meta-parameters
    HAS_BIAS: gl.constexpr,
    X_FP16: gl.constexpr,
    EVEN_K: gl.constexpr,
    ROWS: gl.constexpr,
    GROUPS: gl.constexpr,
    WARPS_N: gl.constexpr,
    WARPS_K: gl.constexpr,
):
    BLOCK_N: gl.constexpr = ROWS * WARPS_N
    pid_n = gl.program_id(0)
    row = gl.program_id(1).to(gl.int64)  # one token a program: its weights come from L2 for the others
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_layout(ROWS, GROUPS, WARPS_N, WARPS_K))
    result = rows_dot(
        x_ptr + row * stride_xm,
        words_ptr,
        scales_ptr,
        offs_n,
        N,
        K,
        stride_wn,
        stride_sn,
        X_FP16,
        EVEN_K,
        ROWS,
        GROUPS,
        WARPS_N,
        WARPS_K,
    )
    result = result * (gl.load(global_scale_ptr) * _DECODE_FACTOR)
    n_mask = offs_n < N
    if HAS_BIAS:
        result += gl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(gl.float32)
    gl.store(out_ptr + row * stride_om + offs_n, result.to(out_ptr.dtype.element_ty), mask=n_mask)


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
    """Run the kernel. The weight is read as int32 words (rows of ``K/2`` bytes, ``K % 16 == 0``,
    so whole words) and the activations as int32 pairs; ``use_prmt`` is unused (no lookup)."""
    m, k = x.shape
    n = packed.shape[0]
    block_n = config["ROWS"] * config["WARPS_N"]
    grid = (cdiv(n, block_n), m)
    nvfp4_linear_gemv_gluon_kernel[grid](
        x,
        packed.view(torch.int32),
        scales.view(torch.uint8),
        global_scale,
        bias if bias is not None else out,
        out,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        packed.stride(0) // 4,
        scales.stride(0),
        HAS_BIAS=bias is not None,
        X_FP16=x.dtype == torch.float16,
        EVEN_K=(k // 16) % (32 * config["GROUPS"] * config["WARPS_K"]) == 0,
        ROWS=config["ROWS"],
        GROUPS=config["GROUPS"],
        WARPS_N=config["WARPS_N"],
        WARPS_K=config["WARPS_K"],
        num_warps=config["WARPS_N"] * config["WARPS_K"],
    )
    return out


def configs(m: int, n: int, k: int) -> list[dict]:
    """Candidates for one shape: up to 4 tokens, on a compiled GPU (Gluon has no interpreter).

    ROWS 2-8 a thread: the activations a thread converts are shared by its rows (12 instructions
    a word column), so fewer than 2 rows spend more on activations than on weights. Four warps,
    along N or splitting K: a 4096-row layer in blocks of 32 rows is 128 programs, fewer than the
    H200's 132 SMs. 8-byte loads (one scale group a thread a step): 16-byte loads never won a
    shape on the H200.
    """
    from flashrt.kernels.decode import interpreted

    if m > 4 or interpreted() or k % 16:
        return []
    return [
        {"ROWS": rows, "GROUPS": 1, "WARPS_N": 4 // warps_k, "WARPS_K": warps_k}
        for rows in (2, 4, 8)
        for warps_k in (1, 2, 4)
    ]
