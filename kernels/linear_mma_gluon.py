"""Weight-only NVFP4 linear on tensor cores, fed by a ring of asynchronous copies (Gluon).

``y [M, N] = x [M, K] @ dequant(W)[N, K]^T + bias``, computed as ``y^T = W @ x^T`` (swap-AB):
weight rows fill the 16-row side of ``mma.sync.m16n8k16`` and the tokens its 8-wide side, so one
decoded weight fragment serves up to 8 tokens per instruction and the tensor cores do every
multiply-add. What is left per weight element is the decode, about 3 instructions:

* A ``mma.sync`` A-fragment holds, per thread, pairs of K-neighbours of two rows. The dot product
  does not care in which order K is summed, so the kernel *chooses* the order: the four bf16
  pairs a thread decodes from one 32-bit word (elements ``q`` and ``q + 4``, ``q = 0..3``) are
  declared to be the K-neighbours the fragment wants, and the activations are gathered in the
  same permuted order. A thread's words go from shared memory to its registers as they lie and
  become its fragment with no shuffle (``convert_layout(..., assert_trivial=True)`` proves it at
  compile time).
* Each pair is made by moving bits: an E2M1 code ``s e1 e0 m`` at bf16 bits 15, 8, 7 and 6 is
  the bf16 ``e2m1 * 2**-126`` exactly (code 0.5 lands on the subnormal ``2**-127``); one
  ``mul.bf16x2`` by ``scale * 2**119`` makes it ``e2m1 * scale * 2**-7`` (exact: at most six
  significant bits, and normal), and ``2**7`` goes into the fp32 epilogue with the global scale.

Bytes reach the SM through a ring of ``STAGES`` shared-memory slots filled by ``cp.async``
(16-byte copies) ``STAGES - 1`` steps ahead: weight words, their scale bytes and the activation
step. Loading into registers one step ahead instead, this form waited on memory (Nsight
Compute on the H200, 28672 x 4096 at 8 tokens: 0.45 instructions issued a cycle, a warp waiting
on a load 5.2 of every 7.9 cycles, 22% occupancy for want of registers): registers bounded the
bytes in flight, the ring does not. Same shape and GPU: 28 us at 1-8 tokens against 29-38 us
before and cuBLAS bf16's 56-61. Layers with few rows split K (``SPLIT_K``) as ``linear_mma``
does, and share its ordered reduce, or sum the partials in the last split of each tile to arrive
(``FOLD_SPLITS``, ``_fold_splits``): the same sum, one launch fewer, and slower end to end on
the H200 (off).

At 1-4 tokens most of the MMA's 8 columns are empty, and a program walks its rows' whole K one
step at a time. ``CHUNKS`` cuts every row in 2, 4 or 8 chunks of K: chunk ``c`` of row ``n`` is
MMA row ``CHUNKS n + c`` and meets chunk ``c`` of each token in column ``CHUNKS m + c``; the
program keeps the entries where the chunks agree and sums them (``_store_chunks``). The same
weight bytes and MMAs, ``CHUNKS`` times the programs each ``CHUNKS`` times shorter, and no fp32
partials or reduce launch as split-K has. H200, one token (``bench/probe_chunks.py``,
``h200-probe-chunks-8adad4e.json``): Llama-3-8B's qkv 8.2 us against 9.3 for the best of every
other form, o 6.6 against 7.4, down 14.6 against 16.2, gate_up 24.7 against 25.5, Qwen3-30B's o
4.9 against 5.4; Llama's LM head 1% slower (90.6 against 89.9).

On Hopper a seat holds its weight in ``ring_layout`` (``LAYOUT``): each word's bits permuted so
pair q is the K-neighbours 2q and 2q + 1 (the activations read as they lie, no ``PRMT``s) and
each pair a shift or two from its bits, 15 instructions a word against 19. With the scale
bytes moved into bf16 bits (``_scales_ptx``), the main loop is 359 SASS instructions a step
against 469 (sm_90, 8 tokens); H200, the same configs (``bench/probe_ring_layout.py``,
``h200-probe-ring-layout-fd70e4d.json``): 1.03-1.12x faster at 1 and 8 tokens, Llama-3-8B's
gate_up at one token 24.7 to 22.5 us.

A step's MMAs accumulate one into the next, so each waits for the last; cutting a step in 2 or 4
chains summed after changed nothing measurable (H200, 068d78e, ``h200-probe-mma-chains-068d78e.json``:
-4% to +4% on Llama's layers at 1-16 tokens). Nsight Compute has the one-token forms issuing
0.47-0.60 instructions a cycle a scheduler with 1.8-4.4 warps each, where keeping up with the
copy bandwidth takes 0.7 (``h200-ncu-one-token-efde653.txt``).

Gluon does not run under ``TRITON_INTERPRET``: CI builds it for every target and checks the bit
placement in plain torch (``bf16_bits``) and both decoders' PTX by emulating it; the GPU suite
checks the kernel against the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from flashrt.kernels import ring_layout
from flashrt.kernels.decode import cdiv, launch_pdl, placed_pairs, shift_ptx
from flashrt.kernels.linear_mma import reduce_splits, split_ks, split_target
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# Triton 3.6 and 3.9 name these two differently.
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

# Pair q of a 32-bit word is (element q, element q + 4): 16 bits apart, one shift serves both.
MAGNITUDE_SHIFT = tuple(6 - 4 * q for q in range(4))  # code bits 0-2 of element q -> bf16 bits 6-8
SIGN_SHIFT = tuple(12 - 4 * q for q in range(4))  # code bit 3 of element q -> bf16 bit 15
MAGNITUDE_MASK = 0x01C001C0
SIGN_MASK = 0x80008000
SCALE_FACTOR = 2.0**119  # folded into the block scale: bf16 keeps 448 * 2**119
EPILOGUE_FACTOR = 2.0**7  # e2m1 * 2**-126 * scale * 2**119 = e2m1 * scale * 2**-7
_SCALE_FACTOR = gl.constexpr(SCALE_FACTOR)
_EPILOGUE_FACTOR = gl.constexpr(EPILOGUE_FACTOR)
# Words a thread decodes a row a step: 32 bytes, whose 4 scale bytes are one int32. With 2 or 4
# words (and registers as the only buffer) 8 had won every shape at 2-8 tokens.
WORDS_PER_THREAD = 8
V = gl.constexpr(WORDS_PER_THREAD)
BLOCK_K = 32 * WORDS_PER_THREAD  # 4 threads x 8 words x 8 elements along one row


def _decode_ptx() -> str:
    """PTX: four bf16 pairs ``$0..$3`` of word ``$4``, each times the bf16 scale ``$5``."""
    lines = ["{", ".reg .b32 m, s, scale2;", "mov.b32 scale2, {$5, $5};"]
    for q in range(4):
        lines += [
            shift_ptx("m", "$4", MAGNITUDE_SHIFT[q]),
            f"and.b32 m, m, {MAGNITUDE_MASK:#010x};",
            shift_ptx("s", "$4", SIGN_SHIFT[q]),
            f"and.b32 s, s, {SIGN_MASK:#010x};",
            "or.b32 m, m, s;",
            f"mul.rn.bf16x2 ${q}, m, scale2;",
        ]
    return "\n".join([*lines, "}"])


_DECODE = gl.constexpr(_decode_ptx())
_DECODE_RING = gl.constexpr(ring_layout.decode_ptx())


def _scales_ptx() -> str:
    """PTX: a thread's scale word ``$4`` (four E4M3 bytes, group g in byte g) as the bf16
    ``scale * 2**119`` of each group, ``$0..$3``. Byte ``b`` moved to bf16 bits 4-11 is the bf16
    ``e4m3(b) * 2**-120`` exactly, subnormals too (both formats' subnormals are the exponent
    field 0); two ``mul.bf16x2`` by ``2**120`` and ``2**119`` make it ``scale * 2**119``, exact.
    Two groups a ``mul``: 8 instructions for 4 scales, where converting through fp32 took 18.
    The sign bit is dropped: block scales are magnitudes."""
    return "\n".join(
        [
            "{",
            ".reg .b32 lo, hi, c;",
            "shl.b32 lo, $4, 4;",
            "and.b32 lo, lo, 0x07F007F0;",
            "shr.b32 hi, $4, 4;",
            "and.b32 hi, hi, 0x07F007F0;",
            "mov.b32 c, 0x7B807B80;",
            "mul.rn.bf16x2 lo, lo, c;",
            "mul.rn.bf16x2 hi, hi, c;",
            "mov.b32 c, 0x7B007B00;",
            "mul.rn.bf16x2 lo, lo, c;",
            "mul.rn.bf16x2 hi, hi, c;",
            "mov.b32 {$0, $2}, lo;",
            "mov.b32 {$1, $3}, hi;",
            "}",
        ]
    )


_SCALES = gl.constexpr(_scales_ptx())


def bf16_bits(words: torch.Tensor) -> torch.Tensor:
    """This decoder's bit placement in plain torch: int32 words -> bfloat16 ``[..., 8]``, each ``e2m1 * 2**-126``."""
    return placed_pairs(words, MAGNITUDE_SHIFT, SIGN_SHIFT, MAGNITUDE_MASK, SIGN_MASK, torch.bfloat16)


@gluon.jit
def _decode(words, scale, LAYOUT: gl.constexpr = 0):
    return gl.inline_asm_elementwise(
        asm=_DECODE_RING if LAYOUT else _DECODE,
        constraints="=r,=r,=r,=r,r,h",
        args=[words, scale],
        dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
        is_pure=True,
        pack=1,
    )


@gluon.jit
def _scale_words(scale_words, groups_layout: gl.constexpr):
    """A thread's scale words ``[rows, 4]`` as bf16 ``scale * 2**119`` ``[rows, 4, G]`` in
    ``groups_layout`` (group g from byte g)."""
    s0, s1, s2, s3 = gl.inline_asm_elementwise(
        asm=_SCALES,
        constraints="=h,=h,=h,=h,r",
        args=[scale_words],
        dtype=(gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16),
        is_pure=True,
        pack=1,
    )
    both = gl.join(gl.join(s0, s2), gl.join(s1, s3))  # [rows, 4, 2, 2]: group 2a + b at [a, b]
    return gl.convert_layout(gl.reshape(both, (scale_words.shape[0], 4, 4)), groups_layout)


@gluon.jit
def _scale_byte(raw):
    """Scale bytes (int32, one a group) as bf16 ``scale * 2**119``, through fp32: the ``wgmma``
    form's, which decodes one group a ``wgmma`` (``_scale_words`` converts a word's four)."""
    return (raw.to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32) * _SCALE_FACTOR).to(gl.bfloat16)


@gluon.jit
def _pairs_to_bf16(pairs):
    lo = pairs.to(gl.int16).to(gl.bfloat16, bitcast=True)
    hi = (pairs >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True)
    return gl.join(lo, hi)


@gluon.constexpr_function
def words_layout(row_tiles, warps, words=WORDS_PER_THREAD):
    """Layout of a step's weight words ``[BLOCK_N, 4, words/2, 2]`` (row, lane-in-quad, group,
    word): the rows and lanes of a ``mma.sync`` A-fragment (row = lane/4 + 8 * reg + 16 * warp,
    then row tiles), each thread's words contiguous in one row. ``words`` under V: a slice of
    the step's groups, as ``linear_wgmma_gluon`` decodes them."""
    v_bases = [[0, 0, 1 << i, 0] for i in range((words // 2).bit_length() - 1)]
    reg = [[0, 0, 0, 1], *v_bases, [8, 0, 0, 0]]
    reg += [[16 * warps << i, 0, 0, 0] for i in range(row_tiles.bit_length() - 1)]
    lanes = [[0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]]
    warp = [[16 << i, 0, 0, 0] for i in range(warps.bit_length() - 1)]
    shape = [16 * row_tiles * warps, 4, words // 2, 2]
    return gl.DistributedLinearLayout(reg, lanes, warp, [], shape)


@gluon.constexpr_function
def activations_layout(block_m, warps):
    """The activation step ``[BLOCK_M * 4, 8V]`` (row ``4 * token + t``: quarter ``t`` of the
    step's K) as every warp reads it: a thread's 8V elements of one row, lanes as in the MMA's
    B-fragment (lane-in-quad the quarter, lane/4 the token)."""
    run = 8 * WORDS_PER_THREAD
    reg = [[0, 1 << i] for i in range(run.bit_length() - 1)]
    reg += [[32 << i, 0] for i in range((block_m // 8).bit_length() - 1)]
    lanes = [[1, 0], [2, 0], [4, 0], [8, 0], [16, 0]]
    return gl.DistributedLinearLayout(reg, lanes, [[0, 0]] * (warps.bit_length() - 1), [], [4 * block_m, run])


@gluon.constexpr_function
def mma_tokens(block_m):
    """The MMA's token side: ``mma.sync.m16n8k16`` is 8 wide, fewer tokens still fill 8 columns."""
    return max(block_m, 8)


@gluon.constexpr_function
def few_tokens_layout(block_m, warps):
    """``[8 / BLOCK_M, 4 * BLOCK_M, 8V]``: ``activations_layout(8, warps)`` with the token's high
    bits (``lane / (4 BLOCK_M)``) as a dimension of their own. Its slice along that dimension is
    how a ring of fewer than 8 tokens is read: the lanes of the missing tokens read the present
    ones again (a shared-memory broadcast), and broadcasting the slice back gives the 8 columns
    the MMA takes, with no data moved."""
    return gl.BlockedLayout([1, 1, 8 * WORDS_PER_THREAD], [8 // block_m, 4 * block_m, 1], [warps, 1, 1], [2, 1, 0])


@gluon.jit
def paired_row(row, N, SILU_MUL: gl.constexpr):
    """The weight row that output row ``row`` reads: itself, or for ``SILU_MUL`` (a gate-and-up
    projection ``[2I, K]``, gate rows first as vLLM merges them) rows in pairs: ``2p`` is gate row
    ``p`` and ``2p + 1`` up row ``p`` (``I + p``), so the epilogue finds each output feature's
    gate and up in one program, in registers."""
    if SILU_MUL:
        row = (row % 2) * (N // 2) + row // 2
    return row


@gluon.jit
def _row_offsets(rows, N, stride, CHUNKS: gl.constexpr, chunk, SILU_MUL: gl.constexpr = False):
    """Where rows start: weight rows ``rows`` (``paired_row``) or, with ``CHUNKS > 1``,
    ``CHUNKS * N`` rows of which row ``CHUNKS * n + c`` is chunk ``c`` of weight row ``n``,
    ``chunk`` past the last. Rows past the end read the last one instead of being masked (their
    outputs are never stored)."""
    if CHUNKS == 1:
        start = paired_row(gl.minimum(rows, N - 1), N, SILU_MUL).to(gl.int64) * stride
    else:
        rows = gl.minimum(rows, CHUNKS * N - 1)
        start = paired_row(rows // CHUNKS, N, SILU_MUL).to(gl.int64) * stride + (rows % CHUNKS) * chunk
    return start


@gluon.jit
def _weight_offsets(
    pid_n, N, stride_wn, stride_sn, BLOCK_N: gl.constexpr, WORDS_COPY: gl.constexpr, SCALES: gl.constexpr,
    CHUNKS: gl.constexpr = 1, chunk_words=0, chunk_scales=0, SILU_MUL: gl.constexpr = False,
):  # fmt: skip
    """Offsets of a program's weight words ``[BLOCK_N, 4V]`` (as copied) and scale words
    ``[BLOCK_N, 4]`` at step 0 (``_row_offsets``: rows cut in ``CHUNKS`` chunks of
    ``chunk_words`` words and ``chunk_scales`` scale words, paired for ``SILU_MUL``)."""
    wr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WORDS_COPY))
    wc = gl.arange(0, 4 * V, layout=gl.SliceLayout(0, WORDS_COPY))
    word_off = gl.expand_dims(_row_offsets(pid_n * BLOCK_N + wr, N, stride_wn, CHUNKS, chunk_words, SILU_MUL), 1)
    sr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, SCALES))
    st = gl.arange(0, 4, layout=gl.SliceLayout(0, SCALES))
    scale_off = gl.expand_dims(_row_offsets(pid_n * BLOCK_N + sr, N, stride_sn, CHUNKS, chunk_scales, SILU_MUL), 1)
    return word_off + gl.expand_dims(wc, 0), scale_off + gl.expand_dims(st, 0)


@gluon.jit
def _step_offsets(at, walk_words, walk_scales, EXPERT_STEPS: gl.constexpr):
    """Where ring step ``at`` starts, in weight words and scale words past ``word_off`` and
    ``scale_off``: ``at`` steps along the rows; on an expert walk (``EXPERT_STEPS`` steps an
    expert), step ``at % EXPERT_STEPS`` of walk slot ``at // EXPERT_STEPS``, whose expert's bank
    offsets ``walk_words``/``walk_scales`` hold in every thread's registers (picked by a
    reduction, not loaded: no load waits ahead of the copies)."""
    if EXPERT_STEPS == 0:
        words_at = at * (4 * V)
        scales_at = at * (V // 2)
    else:
        slots = gl.arange(0, walk_words.shape[0], layout=walk_words.type.layout)
        here = slots == at // EXPERT_STEPS
        along = at % EXPERT_STEPS
        words_at = gl.sum(gl.where(here, walk_words, 0), axis=0) + along * (4 * V)
        scales_at = gl.sum(gl.where(here, walk_scales, 0), axis=0) + along * (V // 2)
    return words_at, scales_at


@gluon.jit
def _start(
    step, slot, steps, words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, first, word_off, scale_off,
    x_off, x_mask, walk_words, walk_scales, EXPERT_STEPS: gl.constexpr,
):  # fmt: skip
    """Start the copies of step ``step`` into ring slot ``slot`` as one copy group, an empty one
    past the last step (the waits count groups)."""
    _start_weights(
        step, slot, steps, words_ring, scales_ring, words_ptr, scales_ptr, first, word_off, scale_off, walk_words,
        walk_scales, EXPERT_STEPS,
    )  # fmt: skip
    _start_activations(step, slot, steps, x_ring, x_ptr, first, x_off, x_mask)
    async_copy.commit_group()


@gluon.jit
def _start_weights(
    step, slot, steps, words_ring, scales_ring, words_ptr, scales_ptr, first, word_off, scale_off, walk_words,
    walk_scales, EXPERT_STEPS: gl.constexpr,
):  # fmt: skip
    if step < steps:
        words_at, scales_at = _step_offsets(first + step, walk_words, walk_scales, EXPERT_STEPS)
        _async_load(words_ring.index(slot), words_ptr + words_at + word_off)
        _async_load(scales_ring.index(slot), scales_ptr + scales_at + scale_off)


@gluon.jit
def _start_activations(step, slot, steps, x_ring, x_ptr, first, x_off, x_mask):
    if step < steps:
        _async_load(x_ring.index(slot), x_ptr + (first + step) * (32 * V) + x_off, mask=x_mask)


@gluon.jit
def _prime(
    words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, first, steps, word_off, scale_off, x_off, x_mask,
    STAGES: gl.constexpr, walk_words=0, walk_scales=0, EXPERT_STEPS: gl.constexpr = 0, PDL: gl.constexpr = False,
):  # fmt: skip
    """Start the ring's first ``STAGES - 1`` steps.

    ``PDL`` (a kernel launched with ``launch_pdl`` after one that lets it start early): every
    primed step's weights first, which no kernel writes, then ``gdc_wait`` for the kernel before
    to finish, then the activations it wrote, step s's in copy group s (the first group also
    holds the later steps' weights, which only lands them sooner than their own group would).
    On the H200 the decode forms did not gain from it (85e7a7a: their projections follow
    compiled kernels that never let them start early, and the split prologue cost ``mma_gluon``
    50 us a Llama step), so the ``wgmma`` form, after its own permute, is launched so, and the
    others only where asked (``PDL_LAUNCH``, ``moe_ring_gluon.PDL_DOWN``).

    Whatever a kernel reads before its ``gdc_wait`` must be complete before the kernel before it
    let it start: weights; and the routing the expert downs read to find their experts, written
    before the gate_up that precedes them, which reads nothing before the routing is done
    (launched plainly, or with PDL and waiting first: ``moe_ring_gluon.PDL_GATE_UP``) and lets
    the down start only after that. Nothing is written before the wait."""
    if PDL:
        for s in gl.static_range(STAGES - 1):
            _start_weights(
                s, s, steps, words_ring, scales_ring, words_ptr, scales_ptr, first, word_off, scale_off, walk_words,
                walk_scales, EXPERT_STEPS,
            )  # fmt: skip
        gdc_wait()
        for s in gl.static_range(STAGES - 1):
            _start_activations(s, s, steps, x_ring, x_ptr, first, x_off, x_mask)
            async_copy.commit_group()
    else:
        for s in gl.static_range(STAGES - 1):
            _start(
                s, s, steps, words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, first, word_off,
                scale_off, x_off, x_mask, walk_words, walk_scales, EXPERT_STEPS,
            )  # fmt: skip


@gluon.jit
def _refill(
    i, words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, first, steps, word_off, scale_off, x_off,
    x_mask, STAGES: gl.constexpr, walk_words=0, walk_scales=0, EXPERT_STEPS: gl.constexpr = 0,
):  # fmt: skip
    """At step ``i``, after the barrier: start step ``i + STAGES - 1`` in the slot step ``i - 1``
    used (everyone is done with it)."""
    ahead = i + STAGES - 1
    _start(
        ahead, ahead % STAGES, steps, words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, first, word_off,
        scale_off, x_off, x_mask, walk_words, walk_scales, EXPERT_STEPS,
    )  # fmt: skip


@gluon.jit
def _fragment(words, scale, A_OP: gl.constexpr, LAYOUT: gl.constexpr = 0):
    """The A fragment ``[rows, 64 G]`` of weight words ``[rows, 4, G, 2]`` (row, lane-in-quad,
    group, word) and their scales ``[rows, 4, G]`` (bf16 ``scale * 2**119``): decoded, scaled,
    and its pairs in the order the activations are gathered, ``[rows, t, g, h, q0, q1] -> [rows,
    g, h, q1, q0, t]`` (pair = t + 4 q0 + 8 q1 + 16 (2g + h)); the layout change moves no data.
    Pair q of a word is elements q and q + 4 of the checkpoint's layout, 2q and 2q + 1 of
    ``ring_layout``'s (``LAYOUT``)."""
    ROWS: gl.constexpr = words.shape[0]
    K: gl.constexpr = words.shape[2] * 64
    p0, p1, p2, p3 = _decode(words, gl.broadcast(gl.expand_dims(scale, 3), words)[0], LAYOUT)
    pairs = gl.join(gl.join(p0, p1), gl.join(p2, p3))
    pairs = gl.reshape(gl.permute(pairs, (0, 2, 3, 5, 4, 1)), (ROWS, K // 2))
    a = gl.reshape(_pairs_to_bf16(pairs), (ROWS, K))
    return gl.convert_layout(a, A_OP, assert_trivial=True)


@gluon.jit
def _store_tile(
    acc, offs_n, offs_m, mask, out_ptr, bias_ptr, global_scale_ptr, pid_k, M, N, stride_om,
    HAS_BIAS: gl.constexpr, SPLIT_K: gl.constexpr, HAS_SCALE: gl.constexpr = True,
):  # fmt: skip
    """The output tile ``[rows, tokens]`` into ``out [M, N]``; split, fp32 partials
    ``[SPLIT_K, M, N]`` instead (2**7 is exact), which the reduce finishes. No global scale
    where the operands carry it (the ring expert downs fold theirs into h)."""
    if SPLIT_K > 1:
        part = out_ptr + gl.expand_dims((pid_k * M + offs_m.to(gl.int64)) * N, 0) + gl.expand_dims(offs_n, 1)
        gl.store(part, acc * _EPILOGUE_FACTOR, mask=mask)
    else:
        if HAS_SCALE:  # noqa: SIM108 (a constexpr branch: the kernel has only one of them)
            acc = acc * (gl.load(global_scale_ptr) * _EPILOGUE_FACTOR)
        else:
            acc = acc * _EPILOGUE_FACTOR
        if HAS_BIAS:
            acc += gl.expand_dims(gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32), 1)
        out = out_ptr + gl.expand_dims(offs_m.to(gl.int64) * stride_om, 0) + gl.expand_dims(offs_n, 1)
        gl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _fold_splits(
    offs_n, offs_m, mask, part_ptr, out_ptr, bias_ptr, global_scale_ptr, arrivals_ptr, tile, M, N, stride_om,
    HAS_BIAS: gl.constexpr, SPLIT_K: gl.constexpr,
):  # fmt: skip
    """After a split's partial is stored: the last of a tile's ``SPLIT_K`` programs to arrive
    sums the tile's partials and stores the output, so no reduce launch follows (``FOLD_SPLITS``).
    The same sum as ``reduce_splits``, in split order whoever arrives last: bit-identical.

    Arrival is a counter a tile, ``acq_rel`` at GPU scope after a barrier (every warp's partial
    stored before it is counted, every other split's visible to the last one), read through L2
    (``.cg``), and put back to zero by the last program for the next launch."""
    _barrier()
    arrived = gl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT_K - 1:
        ACC: gl.constexpr = mask.type.layout  # Triton 3.6 takes a layout only as a constexpr
        total = gl.zeros(mask.shape, gl.float32, layout=ACC)
        for s in gl.static_range(SPLIT_K):  # M may be the constant 1 (Triton specializes it): no .to on it
            part = part_ptr + gl.expand_dims((s * M + offs_m.to(gl.int64)) * N, 0) + gl.expand_dims(offs_n, 1)
            total += gl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
        total = total * gl.load(global_scale_ptr)
        if HAS_BIAS:
            total += gl.expand_dims(gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32), 1)
        out = out_ptr + gl.expand_dims(offs_m.to(gl.int64) * stride_om, 0) + gl.expand_dims(offs_n, 1)
        gl.store(out, total.to(out_ptr.dtype.element_ty), mask=mask)
        gl.atomic_xchg(arrivals_ptr + tile, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _ring_product(
    x_ptr, words_ptr, scales_ptr, word_off, scale_off, x_off, x_mask, first, steps,
    BLOCK_M: gl.constexpr, ROW_TILES: gl.constexpr, WARPS: gl.constexpr, STAGES: gl.constexpr,
    walk_words=0, walk_scales=0, EXPERT_STEPS: gl.constexpr = 0, LAYOUT: gl.constexpr = 0, PDL: gl.constexpr = False,
    TRIGGER: gl.constexpr = False,
):  # fmt: skip
    """``acc [BLOCK_N, max(BLOCK_M, 8)]``: the program's weight rows (``word_off``/``scale_off``
    at step 0) times its tokens (``x_off``, ``x_mask``) over ``steps`` steps from ``first``,
    through the ring, along the rows or on an expert walk (``_step_offsets``). fp32, before the
    global scale and ``EPILOGUE_FACTOR``. ``PDL``: launched to start while the kernel before it
    ends (``_prime``). ``TRIGGER``: then letting the one after it start once every read of the
    ring is done (``_lets_dependents_start`` says when that is safe)."""
    BLOCK_N: gl.constexpr = 16 * ROW_TILES * WARPS
    MMA_M: gl.constexpr = mma_tokens(BLOCK_M)
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    WORDS: gl.constexpr = words_layout(ROW_TILES, WARPS)
    SCALES: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, WORDS))  # [BLOCK_N, 4] int32: a thread's 4 bytes
    PLAIN: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    # 16-byte chunks of a 128-byte activation row XOR-ed with the row: the 8 lanes of a shared
    # memory phase (4 quarters x 2 tokens) read 8 different banks.
    SWIZZLED: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, order=[1, 0])

    words_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 4 * V], words_shared_layout())
    scales_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 4], PLAIN)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 4 * BLOCK_M, 8 * V], SWIZZLED)
    _prime(
        words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, first, steps, word_off, scale_off, x_off,
        x_mask, STAGES, walk_words, walk_scales, EXPERT_STEPS, PDL,
    )  # fmt: skip

    acc = gl.zeros([BLOCK_N, MMA_M], gl.float32, layout=ACC)
    for i in range(steps):
        async_copy.wait_group(STAGES - 2)  # this thread's copies of step i have landed
        _barrier()  # everyone's have, and everyone is done with the slot refilled next
        _refill(
            i, words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, first, steps, word_off, scale_off,
            x_off, x_mask, STAGES, walk_words, walk_scales, EXPERT_STEPS,
        )  # fmt: skip
        slot = i % STAGES
        words = words_ring.index(slot).reshape([BLOCK_N, 4, V // 2, 2]).load(WORDS)
        a = _weights_fragment(words, scales_ring.index(slot).load(SCALES), WARPS, LAYOUT)
        acc = _times_activations(
            acc, a, x_ring.index(slot).load(acts_load_layout(BLOCK_M, WARPS)), BLOCK_M, WARPS, LAYOUT
        )
    async_copy.wait_group(0)
    if TRIGGER:
        gdc_launch_dependents()
    return acc


@gluon.constexpr_function
def _lets_dependents_start(pdl, split_k, fold, norm=False):
    """Whether a ring-form linear launched with PDL lets the kernel after it start once its ring
    is read (``gdc_launch_dependents``), before its epilogue. Safe only where the epilogue reads
    nothing that kernel may write: it reads the bias and global scale, which no kernel writes,
    but a folded split also reads the partials, scratch freed when the launcher returns, which
    the allocator hands the next kernel, so that one starts only when this one ends; so does a
    launch with a norm in its epilogue (``norm``: the residual, the sums of squares). Called
    after ``gdc_wait``: a kernel it lets start has waited for every kernel before."""
    return pdl and not (fold and split_k > 1) and not norm


@gluon.constexpr_function
def acts_load_layout(block_m, warps):
    """How a step's activations ``[4 BLOCK_M, 8V]`` are loaded: under 8 tokens the few-token
    slice every warp broadcasts (``_times_activations``), else the MMA's B-fragment rows."""
    if block_m < 8:
        return gl.SliceLayout(0, few_tokens_layout(block_m, warps))
    return activations_layout(block_m, warps)


@gluon.jit
def _weights_fragment(words, scale_words, WARPS: gl.constexpr, LAYOUT: gl.constexpr):
    """A ring step's weight words ``[BLOCK_N, 4, V/2, 2]`` (``words_layout``) and scale words
    ``[BLOCK_N, 4]``, decoded into the MMA's A fragment."""
    ROW_TILES: gl.constexpr = words.shape[0] // (16 * WARPS)
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    scale = _scale_words(scale_words, gl.SliceLayout(3, words_layout(ROW_TILES, WARPS)))
    return _fragment(words, scale, A_OP, LAYOUT)


@gluon.jit
def _times_activations(acc, a, x, BLOCK_M: gl.constexpr, WARPS: gl.constexpr, LAYOUT: gl.constexpr):
    """``acc`` plus the A fragment ``a`` times a step's activations as loaded
    (``acts_load_layout``), put in the order the decode made its pairs."""
    BLOCK_K: gl.constexpr = 32 * V
    MMA_M: gl.constexpr = mma_tokens(BLOCK_M)
    B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=acc.type.layout, k_width=2)
    ACTS: gl.constexpr = activations_layout(MMA_M, WARPS)
    if BLOCK_M < 8:
        FEW: gl.constexpr = few_tokens_layout(BLOCK_M, WARPS)
        x = gl.expand_dims(x, 0)
        x = gl.broadcast(x, gl.full([8 // BLOCK_M, 4 * BLOCK_M, 8 * V], 0, gl.bfloat16, layout=FEW))[0]
        x = gl.convert_layout(gl.reshape(x, (32, 8 * V)), ACTS, assert_trivial=True)
    if LAYOUT == 1:  # ring_layout.RING: [token, t, v, q1, q0, e] -> [v, q1, q0, t, e, token]: pairs as they lie
        x = gl.permute(gl.reshape(x, (MMA_M, 4, V, 2, 2, 2)), (2, 3, 4, 1, 5, 0))
    else:  # [token, t, v, e, q1, q0] -> [v, q1, q0, t, e, token]: the order the pairs above took
        x = gl.permute(gl.reshape(x, (MMA_M, 4, V, 2, 2, 2)), (2, 4, 5, 1, 3, 0))
    b = gl.convert_layout(gl.reshape(x, (BLOCK_K, MMA_M)), B_OP, assert_trivial=True)
    return mma_v2(a, b, acc)


@gluon.constexpr_function
def words_shared_layout():
    """The ring's weight words in shared memory, each row's 16-byte chunks XOR-ed with the row.
    A thread reads 32 bytes of a row, its quad the row's 128, lanes 4 apart the next row: stored
    as copied, the two rows of a 16-byte load's 8-lane phase sit in the same 16 banks and every
    load takes two wavefronts; swizzled they cover all 32 (the copies in are a row a phase
    either way). H200, the same tuned configs (``bench/probe_swizzle_words.py`` on branch
    ``swizzle-probe``, ``h200-probe-swizzle-words-ad512bb.json``): 1.03-1.04x faster at 8 and 16
    tokens on Llama's gate_up, down and a 151936 x 2048 LM head, 0.99-1.05x at one token; the
    ``wgmma`` form, timed the same way at 128 tokens, gained nothing (0.99-1.01x) and keeps its
    rows as copied."""
    return gl.SwizzledSharedLayout(4, 1, 8, order=[1, 0])


@gluon.constexpr_function
def words_copy_layout(warps):
    """How the ring's weight copies are spread: a row's step is 4V words, 8 threads a row at 16 bytes."""
    return gl.BlockedLayout([1, 4], [4, 8], [warps, 1], [1, 0])


@gluon.constexpr_function
def acts_copy_layout(warps):
    """How its activation copies are: a thread's 8 elements of a quarter-row of 8V."""
    return gl.BlockedLayout([1, 8], [4, 8], [warps, 1], [1, 0])


@gluon.jit
def _activation_offsets(tokens, xr, xc, stride_xm):
    """Offsets of an activation step at step 0: row ``xr`` of the ring is quarter ``xr % 4`` of
    token ``tokens[xr]``'s step."""
    return gl.expand_dims(tokens.to(gl.int64) * stride_xm + (xr % 4) * (8 * V), 1) + gl.expand_dims(xc, 0)


@gluon.jit
def _sum_chunks(acc, lanes, CHUNKS: gl.constexpr, WARPS: gl.constexpr):
    """``acc [CHUNKS x rows, CHUNKS x columns]`` of rows cut in chunks: entry ``(CHUNKS n + c,
    CHUNKS m + c')`` is chunk ``c`` of row ``n`` times chunk ``c'`` of column ``m``; row ``n``
    times column ``m`` is the sum of the ``c == c'`` entries, of the first ``lanes`` MMA columns
    (the rest read nothing). Summed inside the program, in the same order every call: the
    output is deterministic, as the ordered reduce's is. ``[rows, columns]``, a row a thread."""
    BLOCK_N: gl.constexpr = acc.shape[0]
    MMA_M: gl.constexpr = acc.shape[1]
    ACC: gl.constexpr = acc.type.layout
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
    t = gl.arange(0, MMA_M, layout=gl.SliceLayout(0, ACC))
    same = gl.expand_dims(r % CHUNKS, 1) == gl.expand_dims(t % CHUNKS, 0)
    acc = gl.where(same & gl.expand_dims(t < lanes, 0), acc, 0.0)
    acc = gl.sum(gl.reshape(acc, [BLOCK_N // CHUNKS, CHUNKS, MMA_M // CHUNKS, CHUNKS]), axis=3)
    acc = gl.sum(acc, axis=1)
    return gl.convert_layout(acc, gl.BlockedLayout([1, 1], [32, 1], [WARPS, 1], [0, 1]))


@gluon.jit
def _store_silu_mul(acc, first_row, first_token, columns, M, N, out_ptr, stride_om, WARPS: gl.constexpr):
    """``out [M, N / 2]`` from an output tile ``acc [rows, tokens]`` (scaled, fp32) whose rows are
    ``paired_row``'s from ``first_row`` (even) and whose first ``columns`` columns are tokens from
    ``first_token``: feature ``p`` is ``silu(gate) * up`` of rows ``2p`` and ``2p + 1``, each
    pair moved into one thread first. vLLM's ``SiluAndMul`` on the fp32 sums, not on their bf16
    roundings."""
    ROWS: gl.constexpr = acc.shape[0]
    TOKENS: gl.constexpr = acc.shape[1]
    PAIRS: gl.constexpr = gl.BlockedLayout([1, 1, 2], [32, 1, 1], [WARPS, 1, 1], [2, 1, 0])
    OUT: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [WARPS, 1], [1, 0])
    pairs = gl.convert_layout(gl.permute(gl.reshape(acc, [ROWS // 2, 2, TOKENS]), (0, 2, 1)), PAIRS)
    gate, up = gl.split(pairs)
    product = gl.convert_layout(gate / (1.0 + gl.exp(-gate)) * up, OUT)
    features = first_row // 2 + gl.arange(0, ROWS // 2, layout=gl.SliceLayout(1, OUT))
    column = gl.arange(0, TOKENS, layout=gl.SliceLayout(0, OUT))
    tokens = first_token + column
    mask = gl.expand_dims(features < N // 2, 1) & gl.expand_dims((tokens < M) & (column < columns), 0)
    out = out_ptr + gl.expand_dims(tokens.to(gl.int64) * stride_om, 0) + gl.expand_dims(features, 1)
    gl.store(out, product.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _norm_scale(sumsq_ptr, tokens, M, K, eps, NORM_GROUP: gl.constexpr, WARPS: gl.constexpr):
    """Each token of ``tokens``'s RMSNorm scale ``rsqrt(mean(h**2) + eps)`` over the ``K``
    features of its activation, from the sums of squares its producer stored in groups of
    ``NORM_GROUP`` features (``sumsq [M, K / NORM_GROUP]``, ``_store_add_norm``), summed in group
    order by every program alike: deterministic, as the ordered reduce is."""
    TOKENS: gl.constexpr = tokens.type.layout  # Triton 3.6 takes a layout only as a constexpr
    T: gl.constexpr = tokens.shape[0]
    BLOCK: gl.constexpr = 32 * WARPS
    PARTS: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [WARPS, 1], [0, 1])
    groups = K // NORM_GROUP
    token = gl.convert_layout(tokens, gl.SliceLayout(0, PARTS))
    group = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, PARTS))
    base = sumsq_ptr + gl.expand_dims(token.to(gl.int64) * groups, 0)
    live = gl.expand_dims(token < M, 0)
    total = gl.zeros([BLOCK, T], gl.float32, layout=PARTS)
    for start in range(0, groups, BLOCK):
        at = start + group
        total += gl.load(base + gl.expand_dims(at, 1), mask=gl.expand_dims(at < groups, 1) & live, other=0.0)
    scale = gl.rsqrt(gl.sum(total, axis=0) / K + eps)
    return gl.convert_layout(scale, TOKENS)


@gluon.jit
def _store_add_norm(
    acc, first_row, first_token, columns, M, N, out_ptr, stride_om, residual_ptr, norm_weight_ptr, weighted_ptr,
    sumsq_ptr, NORM_GROUP: gl.constexpr, WARPS: gl.constexpr,
):  # fmt: skip
    """A residual add and the RMSNorm after it, where the projection's tile ``acc [rows, tokens]``
    (scaled, fp32, layout ``_store_fused``'s) ends: ``out = residual + acc`` (the residual stream
    the next layer adds to), ``weighted = out * weight`` (the norm's input times its weight,
    which the projections it feeds read as their activations) and each token's sum of
    ``out**2`` over each ``NORM_GROUP`` rows into ``sumsq [M, N / NORM_GROUP]``: what the
    projections it feeds finish the norm with (``_norm_scale``), a per-token factor that passes
    through their sums. ``out`` is rounded before it is squared and weighted, as vLLM's
    residual is before the next layer reads it."""
    ROWS: gl.constexpr = acc.shape[0]
    T: gl.constexpr = acc.shape[1]
    OUT: gl.constexpr = acc.type.layout
    rows = first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, OUT))
    column = gl.arange(0, T, layout=gl.SliceLayout(0, OUT))
    tokens = first_token + column
    mask = gl.expand_dims(rows < N, 1) & gl.expand_dims((tokens < M) & (column < columns), 0)
    at = gl.expand_dims(tokens.to(gl.int64) * stride_om, 0) + gl.expand_dims(rows, 1)
    h = (acc + gl.load(residual_ptr + at, mask=mask, other=0.0).to(gl.float32)).to(out_ptr.dtype.element_ty)
    gl.store(out_ptr + at, h, mask=mask)
    h = h.to(gl.float32)
    weight = gl.load(norm_weight_ptr + rows, mask=rows < N, other=0.0).to(gl.float32)
    gl.store(weighted_ptr + at, (h * gl.expand_dims(weight, 1)).to(weighted_ptr.dtype.element_ty), mask=mask)
    squares = gl.where(mask, h * h, 0.0)
    PARTS: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [WARPS, 1], [1, 0])
    parts = gl.sum(gl.reshape(squares, [ROWS // NORM_GROUP, NORM_GROUP, T]), axis=1)
    parts = gl.convert_layout(parts, PARTS)
    groups = N // NORM_GROUP
    group = first_row // NORM_GROUP + gl.arange(0, ROWS // NORM_GROUP, layout=gl.SliceLayout(1, PARTS))
    part_column = gl.arange(0, T, layout=gl.SliceLayout(0, PARTS))
    part_tokens = first_token + part_column
    keep = gl.expand_dims(group < groups, 1) & gl.expand_dims((part_tokens < M) & (part_column < columns), 0)
    where = sumsq_ptr + gl.expand_dims(part_tokens.to(gl.int64) * groups, 0) + gl.expand_dims(group, 1)
    gl.store(where, parts, mask=keep)


@gluon.jit
def _store_fused(
    acc, first_row, first_token, columns, M, N, K, out_ptr, stride_om, bias_ptr, HAS_BIAS: gl.constexpr,
    SILU_MUL: gl.constexpr, ADD_NORM: gl.constexpr, NORM_SCALE: gl.constexpr, NORM_GROUP: gl.constexpr,
    residual_ptr, norm_weight_ptr, weighted_ptr, sumsq_ptr, eps, WARPS: gl.constexpr,
):  # fmt: skip
    """An unsplit tile ``acc [rows, tokens]`` (scaled, fp32; rows from ``first_row``, its first
    ``columns`` columns tokens from ``first_token``) with what ``runtime.fusion`` moved into the
    projection: the norm's per-token scale first (``NORM_SCALE``, before the bias and the
    activation, which are not linear in it), then the SiLU-and-mul (``_store_silu_mul``) or the
    bias and the residual add and norm after it (``ADD_NORM``, ``_store_add_norm``)."""
    ROWS: gl.constexpr = acc.shape[0]
    T: gl.constexpr = acc.shape[1]
    OUT: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [WARPS, 1], [1, 0])
    acc = gl.convert_layout(acc, OUT)
    column = gl.arange(0, T, layout=gl.SliceLayout(0, OUT))
    tokens = first_token + column
    if NORM_SCALE:
        acc = acc * gl.expand_dims(_norm_scale(sumsq_ptr, tokens, M, K, eps, NORM_GROUP, WARPS), 0)
    if SILU_MUL:
        _store_silu_mul(acc, first_row, first_token, columns, M, N, out_ptr, stride_om, WARPS)
    else:
        rows = first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, OUT))
        if HAS_BIAS:
            acc += gl.expand_dims(gl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(gl.float32), 1)
        if ADD_NORM:
            _store_add_norm(
                acc, first_row, first_token, columns, M, N, out_ptr, stride_om, residual_ptr, norm_weight_ptr,
                weighted_ptr, sumsq_ptr, NORM_GROUP, WARPS,
            )  # fmt: skip
        else:
            mask = gl.expand_dims(rows < N, 1) & gl.expand_dims((tokens < M) & (column < columns), 0)
            out = out_ptr + gl.expand_dims(tokens.to(gl.int64) * stride_om, 0) + gl.expand_dims(rows, 1)
            gl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _store_chunks(
    acc, pid_n, pid_m, out_ptr, bias_ptr, global_scale_ptr, M, N, K, stride_om, HAS_BIAS: gl.constexpr,
    BLOCK_M: gl.constexpr, CHUNKS: gl.constexpr, WARPS: gl.constexpr, SILU_MUL: gl.constexpr = False,
    ADD_NORM: gl.constexpr = False, NORM_SCALE: gl.constexpr = False, NORM_GROUP: gl.constexpr = 16,
    residual_ptr=0, norm_weight_ptr=0, weighted_ptr=0, sumsq_ptr=0, eps=0.0,
):  # fmt: skip
    """The chunked tile ``acc [CHUNKS x rows, CHUNKS x tokens]`` into ``out`` (``_sum_chunks``),
    through ``_store_fused`` where the launch fuses anything."""
    BLOCK_N: gl.constexpr = acc.shape[0]
    MMA_M: gl.constexpr = acc.shape[1]
    acc = _sum_chunks(acc, BLOCK_M, CHUNKS, WARPS)
    acc = acc * (gl.load(global_scale_ptr) * _EPILOGUE_FACTOR)
    if SILU_MUL or ADD_NORM or NORM_SCALE:
        _store_fused(
            acc, pid_n * (BLOCK_N // CHUNKS), pid_m * (BLOCK_M // CHUNKS), BLOCK_M // CHUNKS, M, N, K, out_ptr,
            stride_om, bias_ptr, HAS_BIAS, SILU_MUL, ADD_NORM, NORM_SCALE, NORM_GROUP, residual_ptr, norm_weight_ptr,
            weighted_ptr, sumsq_ptr, eps, WARPS,
        )  # fmt: skip
    else:
        OUT: gl.constexpr = acc.type.layout
        rows = pid_n * (BLOCK_N // CHUNKS) + gl.arange(0, BLOCK_N // CHUNKS, layout=gl.SliceLayout(1, OUT))
        column = gl.arange(0, MMA_M // CHUNKS, layout=gl.SliceLayout(0, OUT))
        tokens = pid_m * (BLOCK_M // CHUNKS) + column
        if HAS_BIAS:
            acc += gl.expand_dims(gl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(gl.float32), 1)
        mask = gl.expand_dims(rows < N, 1) & gl.expand_dims((tokens < M) & (column < BLOCK_M // CHUNKS), 0)
        out = out_ptr + gl.expand_dims(tokens.to(gl.int64) * stride_om, 0) + gl.expand_dims(rows, 1)
        gl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def nvfp4_linear_mma_gluon_kernel(
    # pointers
    x_ptr,
    words_ptr,
    scales_ptr,
    global_scale_ptr,
    bias_ptr,
    out_ptr,
    # split and folded (FOLD): where the last split of a tile stores the sum, and the tiles' arrival counters
    folded_ptr,
    arrivals_ptr,
    # dimensions (K a multiple of BLOCK_K)
    M,
    N,
    K,
    # strides (x and out in elements, weight rows in int32 words, scale rows in int32 words)
    stride_xm,
    stride_om,
    stride_wn,
    stride_sn,
    # a chunk of a row (CHUNKS > 1), in int32 weight words and int32 scale words
    chunk_words,
    chunk_scales,
    # a residual add and RMSNorm in the epilogue (``NormEpilogue``)
    residual_ptr,
    norm_weight_ptr,
    weighted_ptr,
    sumsq_ptr,
    eps,
    # meta-parameters
    HAS_BIAS: gl.constexpr,
    BLOCK_M: gl.constexpr,
    ROW_TILES: gl.constexpr,
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    SPLIT_K: gl.constexpr,
    CHUNKS: gl.constexpr,
    LAYOUT: gl.constexpr,
    FOLD: gl.constexpr,
    PDL: gl.constexpr,
    SILU_MUL: gl.constexpr = False,
    ADD_NORM: gl.constexpr = False,
    NORM_SCALE: gl.constexpr = False,
    NORM_GROUP: gl.constexpr = 16,
):
    BLOCK_N: gl.constexpr = 16 * ROW_TILES * WARPS
    SCALES: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, words_layout(ROW_TILES, WARPS)))
    WORDS_COPY: gl.constexpr = words_copy_layout(WARPS)
    ACTS_COPY: gl.constexpr = acts_copy_layout(WARPS)

    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_k = gl.program_id(2)

    word_off, scale_off = _weight_offsets(
        pid_n, N, stride_wn, stride_sn, BLOCK_N, WORDS_COPY, SCALES, CHUNKS, chunk_words, chunk_scales, SILU_MUL
    )
    x_off, x_mask, first, steps = _activation_tile(
        pid_m, pid_k, M, K, stride_xm, chunk_words, ACTS_COPY, BLOCK_M, SPLIT_K, CHUNKS
    )
    acc = _ring_product(
        x_ptr, words_ptr, scales_ptr, word_off, scale_off, x_off, x_mask, first, steps, BLOCK_M, ROW_TILES, WARPS,
        STAGES, LAYOUT=LAYOUT, PDL=PDL, TRIGGER=_lets_dependents_start(PDL, SPLIT_K, FOLD, ADD_NORM or NORM_SCALE),
    )  # fmt: skip
    _store_product(
        acc, pid_n, pid_m, pid_k, out_ptr, bias_ptr, global_scale_ptr, M, N, K, stride_om, HAS_BIAS, BLOCK_M,
        SPLIT_K, CHUNKS, WARPS, FOLD, folded_ptr, arrivals_ptr, SILU_MUL, ADD_NORM, NORM_SCALE, NORM_GROUP,
        residual_ptr, norm_weight_ptr, weighted_ptr, sumsq_ptr, eps,
    )  # fmt: skip


@gluon.jit
def _activation_tile(
    pid_m, pid_k, M, K, stride_xm, chunk_words, LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr,
    SPLIT_K: gl.constexpr, CHUNKS: gl.constexpr,
):  # fmt: skip
    """A program's activations ``[4 BLOCK_M, 8V]`` in ``LAYOUT``: their offsets and mask at
    step 0 (row ``4 j + q``: quarter ``q`` of MMA column ``j``'s step, a token or, with rows in
    chunks, a token's chunk), and the steps the program takes from ``first``."""
    BLOCK_K: gl.constexpr = 32 * V
    xr = gl.arange(0, 4 * BLOCK_M, layout=gl.SliceLayout(1, LAYOUT))
    xc = gl.arange(0, 8 * V, layout=gl.SliceLayout(0, LAYOUT))
    if CHUNKS == 1:
        tokens = pid_m * BLOCK_M + xr // 4
        x_off = _activation_offsets(tokens, xr, xc, stride_xm)
        per_split = gl.cdiv(K // BLOCK_K, SPLIT_K)
        first = pid_k * per_split
        steps = gl.minimum(per_split, K // BLOCK_K - first)
    else:
        lane = pid_m * BLOCK_M + xr // 4  # column (token, chunk) of the MMA
        tokens = lane // CHUNKS
        x_off = gl.expand_dims(tokens.to(gl.int64) * stride_xm + (lane % CHUNKS) * (8 * chunk_words), 1)
        x_off += gl.expand_dims((xr % 4) * (8 * V), 1) + gl.expand_dims(xc, 0)
        first = 0
        steps = K // CHUNKS // BLOCK_K
    return x_off, gl.expand_dims(tokens < M, 1), first, steps


@gluon.jit
def _store_product(
    acc, pid_n, pid_m, pid_k, out_ptr, bias_ptr, global_scale_ptr, M, N, K, stride_om, HAS_BIAS: gl.constexpr,
    BLOCK_M: gl.constexpr, SPLIT_K: gl.constexpr, CHUNKS: gl.constexpr, WARPS: gl.constexpr,
    FOLD: gl.constexpr = False, folded_ptr=0, arrivals_ptr=0, SILU_MUL: gl.constexpr = False,
    ADD_NORM: gl.constexpr = False, NORM_SCALE: gl.constexpr = False, NORM_GROUP: gl.constexpr = 16,
    residual_ptr=0, norm_weight_ptr=0, weighted_ptr=0, sumsq_ptr=0, eps=0.0,
):  # fmt: skip
    """A program's ``acc [BLOCK_N, max(BLOCK_M, 8)]`` into ``out``: a tile of rows and tokens
    (``_store_tile``, fp32 partials when split, summed into ``folded_ptr`` by the last split
    where ``FOLD``; ``_store_fused`` unsplit where the launch fuses an activation or a norm, the
    reduce's SiLU-and-mul when split) or one of chunks (``_store_chunks``). A split launch never
    fuses a norm (``NormEpilogue``)."""
    BLOCK_N: gl.constexpr = acc.shape[0]
    MMA_M: gl.constexpr = acc.shape[1]
    ACC: gl.constexpr = acc.type.layout
    if CHUNKS == 1 and SPLIT_K == 1 and (SILU_MUL or ADD_NORM or NORM_SCALE):
        acc = acc * (gl.load(global_scale_ptr) * _EPILOGUE_FACTOR)
        _store_fused(
            acc, pid_n * BLOCK_N, pid_m * BLOCK_M, BLOCK_M, M, N, K, out_ptr, stride_om, bias_ptr, HAS_BIAS, SILU_MUL,
            ADD_NORM, NORM_SCALE, NORM_GROUP, residual_ptr, norm_weight_ptr, weighted_ptr, sumsq_ptr, eps, WARPS,
        )  # fmt: skip
    elif CHUNKS == 1:
        offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
        column = gl.arange(0, MMA_M, layout=gl.SliceLayout(0, ACC))
        offs_m = pid_m * BLOCK_M + column
        mask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims((offs_m < M) & (column < BLOCK_M), 0)
        _store_tile(
            acc, offs_n, offs_m, mask, out_ptr, bias_ptr, global_scale_ptr, pid_k, M, N, stride_om, HAS_BIAS, SPLIT_K
        )
        if FOLD and SPLIT_K > 1:
            _fold_splits(
                offs_n, offs_m, mask, out_ptr, folded_ptr, bias_ptr, global_scale_ptr, arrivals_ptr,
                pid_m * gl.num_programs(0) + pid_n, M, N, stride_om, HAS_BIAS, SPLIT_K,
            )  # fmt: skip
    else:
        _store_chunks(
            acc, pid_n, pid_m, out_ptr, bias_ptr, global_scale_ptr, M, N, K, stride_om, HAS_BIAS, BLOCK_M, CHUNKS,
            WARPS, SILU_MUL, ADD_NORM, NORM_SCALE, NORM_GROUP, residual_ptr, norm_weight_ptr, weighted_ptr, sumsq_ptr,
            eps,
        )  # fmt: skip


def _copyable(t: torch.Tensor) -> bool:
    """Rows ``cp.async`` can move in 16-byte chunks: Triton compiles the ring only for those, and
    a pointer it cannot prove aligned fails to build."""
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 and t.stride(-1) == 1


def aligned_activations(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a copy of it where ``cp.async`` could not read it (a view starting off 16 bytes,
    rows not whole 16-byte chunks). Weights are aligned once at bind; activations can arrive as
    any view, so they are checked each call."""
    return x if _copyable(x) else x.clone(memory_format=torch.contiguous_format)


@dataclass(frozen=True)
class AddNorm:
    """A residual add and the RMSNorm after it, in the epilogue of the projection before them
    (o, down; ``_store_add_norm``): the launch's ``out [M, N]`` becomes ``residual + x @ W^T``,
    ``weighted`` that times the norm's ``weight``, and ``sumsq`` holds at its front each
    token's sums of squares of ``out`` over each ``group`` rows, ``[M, N / group]``."""

    residual: torch.Tensor
    weight: torch.Tensor
    weighted: torch.Tensor
    sumsq: torch.Tensor
    group: int


@dataclass(frozen=True)
class NormScale:
    """The RMSNorm's per-token scale, in the epilogue of a projection it feeds (``_norm_scale``):
    the launch reads ``AddNorm.weighted`` as ``x`` and multiplies its product by
    ``rsqrt(sum of sumsq's [M, K / group] / K + eps)`` before the bias or activation."""

    sumsq: torch.Tensor
    group: int
    eps: float


def norm_group(m: int) -> int:
    """Rows a sum of squares covers in an ``AddNorm`` launch at ``m`` tokens: the fewest rows a
    program of the forms with the epilogue holds there (the chunked forms cut 32-row programs in
    8 chunks at one token, 4 at two, 2 at three or four; the others hold 16 or more), so every
    program stores whole groups, and each projection the norm feeds reads ``K / group`` sums a
    token (Llama-3-8B's 4096 features: 1024 at one token, 256 at eight, 4 KiB and 8 KiB)."""
    return 4 if m == 1 else 8 if m == 2 else 16


def norm_operands(
    out: torch.Tensor, rows_a_program: int, split: int, add_norm: AddNorm | None, norm_scale: NormScale | None
) -> dict:
    """The kernel's keyword arguments for a launch's norm epilogue (the residual, the norm's
    weight, weighted, the sums of squares, eps, and the constexprs), unused ones (``out``, 0.0)
    where it has none; a ``ValueError`` naming what the epilogue cannot take: both norms at
    once, a split launch (its programs hold part of K), programs whose rows are not whole
    groups, operands not laid out as ``out``."""
    unused = {"residual_ptr": out, "norm_weight_ptr": out, "weighted_ptr": out, "sumsq_ptr": out, "eps": 0.0}
    if add_norm is None and norm_scale is None:
        return unused
    if add_norm is not None and norm_scale is not None:
        raise ValueError("a launch fuses the norm before it or the one after it, not both")
    if split > 1:
        raise ValueError(f"SPLIT_K={split}: a norm epilogue needs each program's whole K (an unsplit config)")
    group = (add_norm or norm_scale).group
    if add_norm is not None:
        if rows_a_program % group:
            raise ValueError(f"group: {group} rows a sum of squares, {rows_a_program} rows a program")
        for name in ("residual", "weighted"):
            t = getattr(add_norm, name)
            if t.shape != out.shape or t.stride() != out.stride() or t.dtype != out.dtype:
                raise ValueError(f"{name}: got {t.dtype} {tuple(t.shape)}, need {out.dtype} {tuple(out.shape)} as out")
        if add_norm.weight.shape != (out.shape[1],):
            raise ValueError(f"weight: got {tuple(add_norm.weight.shape)}, need ({out.shape[1]},)")
    if add_norm is not None:
        args = {"residual_ptr": add_norm.residual, "norm_weight_ptr": add_norm.weight}
        args |= {"weighted_ptr": add_norm.weighted, "sumsq_ptr": add_norm.sumsq, "eps": 0.0}
    else:
        args = unused | {"sumsq_ptr": norm_scale.sumsq, "eps": float(norm_scale.eps)}
    return args | {"ADD_NORM": add_norm is not None, "NORM_SCALE": norm_scale is not None, "NORM_GROUP": group}


def launch(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    config: dict,
    use_prmt: bool,
    add_norm: AddNorm | None = None,
    norm_scale: NormScale | None = None,
) -> torch.Tensor:
    """Run the kernel; ``use_prmt`` is unused. K a multiple of ``BLOCK_K`` (``configs`` offers
    nothing else), and of ``CHUNKS x BLOCK_K`` where the rows are cut in chunks. Launched with
    PDL where ``PDL_LAUNCH``. ``SILU_MUL`` in ``config``: ``out [M, N / 2]`` is the SiLU-and-mul
    of a gate-and-up projection's output (``paired_row``). ``add_norm``, ``norm_scale``: a
    residual add and RMSNorm in the epilogue (``norm_operands``)."""
    chunks = config.get("CHUNKS", 1)
    chunk_words = words_per_chunk(2 * packed.shape[1], chunks)  # two elements a packed byte
    pdl = launch_pdl(PDL_LAUNCH)
    rows_a_program = 16 * config["ROW_TILES"] * config["WARPS"] // chunks
    norm = norm_operands(out, rows_a_program, config.get("SPLIT_K", 1), add_norm, norm_scale)
    return launch_ring(
        nvfp4_linear_mma_gluon_kernel, aligned_activations, x, packed, scales, global_scale, bias, out, config, pdl,
        chunk_words=chunk_words, chunk_scales=chunk_words // 8, CHUNKS=chunks, LAYOUT=config.get("LAYOUT", 0),
        PDL=pdl, SILU_MUL=bool(config.get("SILU_MUL", False)), **norm,
    )  # fmt: skip


# Launched with PDL (``_prime``: the weights copied before ``gdc_wait``, the activations after),
# the form starts while the kernel before it ends, if that kernel lets it. At 85e7a7a on the H200
# (``h200-e2e-llama-pdl-85e7a7a.json``) the seated Llama step took 2.69/2.97 ms at batch 1/8
# against 2.57/2.91 without: the kernels before each projection were torch.compile's, which then
# never let a kernel start early. With torch.compile's own PDL (inductor's ``triton.enable_pdl``)
# they do: 2.07/2.52 ms at batch 1/8 (0d80628, ``h200-e2e-llama-0d80628-pdl-b1b8.json``) against
# 2.25/2.71 without any PDL (22e4c07). So ``None``: launched with PDL exactly when
# torch.compile launches its kernels so (``decode.launch_pdl``); True or False forces it.
PDL_LAUNCH: bool | None = None


def words_per_chunk(k: int, chunks: int) -> int:
    """int32 words of a chunk of a K-element row cut in ``chunks`` (8 elements a word); 0 for
    whole rows, so they compile once for every K."""
    return k // 8 // chunks if chunks > 1 else 0


def require_bf16(name: str, t: torch.Tensor) -> None:
    """A ``ValueError`` naming ``t`` unless it is bf16: the tensor-core forms multiply bf16, and
    fp16 activations rounded to bf16 would lose three bits (the adjudicator records the refusal)."""
    if t.dtype != torch.bfloat16:
        raise ValueError(f"{name} must be bfloat16 for the bf16 tensor-core form, got {t.dtype}")


def check_ring_operands(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> None:
    """A ``ValueError`` naming the operand a ``cp.async`` ring form cannot take: activations
    not bf16 (``require_bf16``), weight bytes or scales not in whole aligned 16-byte chunks."""
    require_bf16("x", x)
    for name, t in (("packed", packed), ("scales", scales)):
        if not _copyable(t):
            raise ValueError(f"{name} must start on 16 bytes with rows of whole 16-byte chunks for cp.async")


def launch_ring(
    kernel, activations, x, packed, scales, global_scale, bias, out, config: dict, pdl: bool = False, **extra
) -> torch.Tensor:
    """Launch a ring-form kernel (this one, ``linear_wgmma_gluon``'s) on ``activations(x)``:
    the tile grid (``CHUNKS`` rows and columns a weight row and a token where rows are cut in
    chunks), weights as int32 words, and the split-K sum (a reduce launch, or folded into the
    kernel: ``FOLD_SPLITS``). bf16 activations only (``require_bf16``). ``pdl``: the kernel and
    its reduce launched with PDL, each to start while the kernel before it ends (the kernel's own
    ``PDL`` constexpr, in ``extra``, makes it wait before its first activation copy). ``SILU_MUL``
    in ``extra``: ``out [M, N / 2]`` (``check_silu_mul``), split sums reduced, never folded."""
    check_ring_operands(x, packed, scales)
    x = activations(x)
    m, k = x.shape
    n = packed.shape[0]
    block_n = 16 * config["ROW_TILES"] * config["WARPS"]
    split = config.get("SPLIT_K", 1)
    chunks = config.get("CHUNKS", 1)
    silu_mul = extra.get("SILU_MUL", False)
    if silu_mul:
        check_silu_mul(n, block_n // chunks, bias, out)
    target = split_target(out, split, n)
    grid = (cdiv(chunks * n, block_n), cdiv(chunks * m, config["BLOCK_M"]), split)
    fold = split > 1 and FOLD_SPLITS and not silu_mul
    arrivals = arrival_counters(out.device, grid[0] * grid[1]) if fold else None
    kernel[grid](
        x,
        packed.view(torch.int32),
        scales.view(torch.uint8).view(torch.int32),
        global_scale,
        bias if bias is not None else out,
        target,
        out,
        arrivals if arrivals is not None else out,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        packed.stride(0) // 4,
        scales.stride(0) // 4,
        HAS_BIAS=bias is not None,
        BLOCK_M=config["BLOCK_M"],
        ROW_TILES=config["ROW_TILES"],
        WARPS=config["WARPS"],
        STAGES=config["STAGES"],
        SPLIT_K=split,
        FOLD=arrivals is not None,
        num_warps=config["WARPS"],
        launch_pdl=pdl,
        **extra,
    )
    if split > 1 and arrivals is None:
        reduce_splits(target, global_scale, bias, out, pdl, silu_mul)
    return out


def check_silu_mul(n: int, rows_a_program: int, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """A ``ValueError`` naming what a SiLU-and-mul launch cannot take: a bias (vLLM's gate-and-up
    projections have none), an odd row count or program rows that split a gate-and-up pair, an
    output that is not ``[M, N / 2]``."""
    if bias is not None:
        raise ValueError("bias: a SiLU-and-mul launch takes none (add it to the gate and up rows before)")
    if n % 2 or rows_a_program % 2:
        raise ValueError(f"packed: {n} rows, {rows_a_program} a program; SiLU-and-mul needs both even (gate, up pairs)")
    if out.shape[1] != n // 2:
        raise ValueError(f"out: got {out.shape[1]} columns, a SiLU-and-mul of {n} rows has {n // 2}")


# Split-K launches of the ring forms sum their partials in the kernel (``_fold_splits``: the last
# split of a tile to arrive) instead of in a reduce launch after it. Bit for bit the reduce's on
# the H200, and slower there: Llama-3-8B's prefill 1.15x bf16 against 1.07x with the reduce, batch
# 8 1.76x against 1.79x (0d80628, ``h200-e2e-llama-0d80628-fold-b1b8.json`` and ``-fold-pdl-b1``). Off.
FOLD_SPLITS = False
# Arrival counters for folded launches, one int32 a tile: Llama-3-8B's gate_up at 128 tokens is
# 448 x 2 tiles of 64 rows and 64 tokens.
ARRIVAL_SLOTS = 1 << 14
_ARRIVALS: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The tile counters a folded launch of ``tiles`` tiles counts on, or None where it must
    launch its reduce instead (the same sum, bit for bit): more tiles than counters, or none
    made yet and a CUDA graph being captured. They are made once, zeroed, outside any capture,
    and every launch leaves them zero. One set a device, shared by every layer as vLLM's Marlin
    kernels share their lock workspace: launches run one after another on the model's stream,
    and two folded launches running at once on two streams would miscount."""
    counters = _ARRIVALS.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counters = _ARRIVALS[device] = torch.zeros(ARRIVAL_SLOTS, dtype=torch.int32, device=device)
    return counters if tiles <= counters.numel() else None


# Shared memory a ring may take: what sm_90, sm_100 and sm_110 give a block (227 KiB), less the
# compiler's own. sm_120 gives 99 KiB: there the larger rings fail to launch and are refused.
RING_BYTES = 224 << 10
# Rows cut in 2, 4 or 8 chunks, each chunk an MMA row of its own against its slice of the
# activations in an MMA column of its own: the columns a few tokens leave empty.
CHUNKS = (2, 4, 8)
# The chunked forms' ring depths. A chunked program is a few steps long (Llama's qkv at one
# token: 4 chunks of 4 steps), so 4 stages hold its whole read and bound how many programs
# share an SM; 2 stages take half the shared memory. H200, served config against the same with
# 2 stages (``bench/probe_bank_stages.py``, ``h200-probe-bank-stages-07ceaeb.json``), one token:
# Llama's qkv 7.42 against 7.66 us, gate_up 21.92 against 22.29, its LM head 78.40 against
# 81.47, Qwen3-30B's o 4.54 against 4.85, but Llama's down 14.19 against 12.91; 3 stages won
# nowhere by more than 1%. Both offered, the adjudicator picks.
CHUNK_STAGES = (2, 4)
# The unchunked forms' ring depths: 3 and 4 (six never won a shape at 1-64 tokens), and from a
# 16-token tile, whose ring stage carries 8 KiB of activations beside 4.5 KiB of a 32-row
# program's weight, 2 as well. H200, served config against the same with 2 stages
# (``bench/probe_bank_stages.py``, ``h200-probe-bank-stages-442140c-t8.json``), 16 tokens:
# Llama's o 8.59 against 9.52 us, gate_up 27.05 against 27.97, LM head 98.48 against 101.42,
# but Qwen3-30B's qkv 8.49 against 7.11; at 8 tokens 2 stages won nowhere by more than 1%.
UNCHUNKED_STAGES = (3, 4)
WIDE_TILE_STAGES = (2, *UNCHUNKED_STAGES)
WIDE_TILE = 16
MAX_TOKENS = 128  # from here on the tensor-core forms with larger tiles (mma, dequant) win
# The weight's bits as the checkpoint has them, or in ``ring_layout``: its decode in 15
# instructions a word instead of 19 and no activation PRMTs (H200, ``bench/probe_ring_layout.py``).
LAYOUTS = (ring_layout.CHECKPOINT, ring_layout.RING)


def ring_bytes(config: dict) -> int:
    """Shared memory of a config's ring: a step's words and scale bytes (144 bytes a row) and
    activations (512 bytes a token), times the stages."""
    block_n = 16 * config["ROW_TILES"] * config["WARPS"]
    return config["STAGES"] * (block_n * (4 * WORDS_PER_THREAD * 4 + 16) + config["BLOCK_M"] * BLOCK_K * 2)


def configs(m: int, n: int, k: int) -> list[dict]:
    """Candidates for one shape: bf16 activations, K in whole steps, on a compiled GPU.

    BLOCK_M the token tile: the smallest of 1-64 that holds the batch (one decoded fragment
    serves every token). Under 8 tokens the MMA still computes 8 columns, but the ring holds only
    the tokens there are: at one token a 32-row, 3-stage ring is 15 KiB instead of 26, which is
    what bounds how many programs share an SM (H200, one token, best config against the same
    configs with an 8-token ring: gate_up 28.8 against 30.2 us, the LM head 58.0 against 60.9;
    within 2% at 2 and 4 tokens). ROW_TILES 1-2 row tiles of 16 a warp, 2 or 4 warps: a program
    is 32-128 rows, small enough that a 4096-row layer still makes programs for every SM. One
    warp (16 rows) where 32-row programs leave most SMs idle gained nothing: H200, the expert-sized
    linears at 1-64 tokens with it offered (ff0ca03, ``h200-kernels-one-warp-ff0ca03.json``) won 3
    of 28 rows, each within 2% of the best without it, and Qwen3-30B's 2048 x 768 down at one
    token stayed at 3.42 us (int4 tinygemm 2.64).
    ``UNCHUNKED_STAGES`` 3-4, from 16-token tiles 2-4 (``WIDE_TILE_STAGES``). Where the tiles
    make too few programs, ``linear_mma.split_ks`` variants that reach it (each split at
    least two steps): H200, the 4096 x 14336 down projection at 1-8 tokens in 18 us split in 4,
    against 30 us unsplit. Up to 8 columns of tokens times chunks, ``CHUNKS`` variants (whole
    steps a chunk, ``CHUNK_STAGES``): on the H200 they were the fastest form for every Llama-3-8B and
    Qwen3-30B projection at one and two tokens but Llama's LM head at one (1% behind), and for 5
    of the 7 at four (``h200-probe-chunks-8adad4e.json``); deeper
    rings (5-8 stages) and 4 row tiles gained at most 5% anywhere and were left out
    (``h200-probe-ring-depth-8d01d40.json``).
    """
    from flashrt.kernels.decode import interpreted

    if interpreted() or k % BLOCK_K or m > MAX_TOKENS:
        return []
    block_m = next(bm for bm in (1, 2, 4, 8, 16, 32, 64) if bm >= min(m, 64))
    out = []
    for tiles in (1, 2):
        for warps in (2, 4):
            for stages in WIDE_TILE_STAGES if block_m >= WIDE_TILE else UNCHUNKED_STAGES:
                base = {"BLOCK_M": block_m, "ROW_TILES": tiles, "WARPS": warps, "STAGES": stages}
                if ring_bytes(base) > RING_BYTES:
                    continue
                out.append(base)
                programs = cdiv(n, 16 * tiles * warps) * cdiv(m, block_m)
                out += [{**base, "SPLIT_K": s} for s in split_ks(programs, k, BLOCK_K)]
    for chunks in CHUNKS:
        if m * chunks <= 8 and k % (chunks * BLOCK_K) == 0:
            lanes = next(bm for bm in (2, 4, 8) if bm >= m * chunks)
            out += [
                {"BLOCK_M": lanes, "ROW_TILES": tiles, "WARPS": warps, "STAGES": stages, "CHUNKS": chunks}
                for tiles in (1, 2)
                for warps in (2, 4)
                for stages in CHUNK_STAGES
            ]
    return out
