"""The NVFP4 expert bank at decode sizes on the ring (Gluon): gate_up, then down.

``moe_gemv_gluon`` runs each token-expert pair as a GEMV that keeps one step of loads in
flight; on the dense layers the ring form (``linear_mma_gluon``: ``STAGES - 1`` steps of
``cp.async`` copies ahead, the decode straight into ``mma.sync`` fragments) won over the GEMV
at one token on the H200 from the 59 M-parameter down projection up
(bench/results/h200-kernels-readflush.json). The routed gate_up of a Qwen3-30B-A3B bank is 8
pairs of 3.1 M parameters at one token and 64 at eight. So here both GEMMs are on the ring:

1. grouped only: ``moe_fused``'s ``group`` launch, the pairs sorted by expert in runs of 8 rows
   (an expert that two tokens route to is then read once, not twice: at 16 tokens the Qwen3
   bank's 128 pairs route to about 80 experts);
2. ``gate_up``: one program per (block of N rows, pair or 8-row tile). The program's ring rows
   are its gate rows, then the same up rows (the ring form's two row tiles), so each thread
   holds the gate and up outputs of the same rows and the SiLU-and-mul needs no data moved;
   ``h [pairs, N]`` in pair order either way, each row times its routing weight and its
   expert's down global scale where the ring down follows;
3. ``down``: the ring walking each token's experts one after the other (one program a row
   block and token; split along the walk at one token, then ``linear_mma``'s ordered reduce):
   the copies run ahead across experts, where the GEMV down waited on each expert's first
   load. Or grouped by expert as the gate_up (``DOWN_GROUPED``: each routed expert read once
   for all its pairs, fp32 partials a pair, then the same reduce). Or ``moe_gemv_gluon``'s own
   down (per token, its k experts summed in registers). Every way deterministic, no atomics.

At 1-8 tokens the MMA's 8 columns are mostly empty, and both GEMMs cut their rows in chunks as
``linear_mma_gluon``'s ``CHUNKS`` do: the gate_up per pair with a pair's rows in 2 or 4 chunks
of the hidden size (chunk c meets the token's chunk c in column c), and the down with a token's
experts side by side (``DOWN_SLOTS``: row ``8 n + j`` is row n of slot j's expert and meets pair
j's h in column j), no partials and no reduce launch. Qwen3-30B's bank on the H200: 15.2 us at
one token against 17.9 (``SLOTS_UPTO``).

Every kernel here reads either layout of the banks (``LAYOUT``: ``ring_layout``'s on Hopper,
where the seat sends the bank at most ``MAX_TOKENS`` rows). H200, the kernel benchmark in that
layout (``h200-kernels-m1-bank-1c59e32.json``): Qwen3-30B's bank 13.7/57.2/89.3 us at 1/8/16
tokens against 14.3/67.5/95.2 at bcb02a5; with 2-stage rings offered to the chunked ways
(``CHUNK_STAGES``, ``h200-kernels-stages-7c8dda6.json``) 12.5/31.0/54.7 us at 1/4/8.

H200, Qwen3-30B-A3B's bank (E=128, top-8, 2048 x 768), 9a6de5f
(``bench/results/h200-probe-moe-ring-down.json``, every config checked against the reference):
18.7/67.0/107.3 us at 1/8/16 tokens against the GEMV form's 20.5/100.4/188.1; with the GEMV down,
19.5/84.8/142.1. Per pair won at 1 and 8 tokens, grouped at 16. The walk down reads an
expert once a token routed to it (at 16 tokens 128 experts' rows for about 80 routed); the
down grouped by expert reads it once, and at ea7c354 (``h200-probe-moe-ring-staged.json``) took
the 16-token bank from 106.5 to 100.0 us, even at 8 (68.7 against the grouped walk's 68.8, the
per-pair walk's 67.2) and lost at one (22.6 against 21.8). Launching a row block's pairs
together so the repeats come from L2 (the grid pairs first) gained at most 0.4 us per pair
and lost 1-10% grouped: not kept. With the grouped down offered (eabb2d0,
``h200-probe-moe-ring-offered.json``): 18.5/67.4/99.6 us against the GEMV form's 20.0/99.8/188.0.
"""

from __future__ import annotations

import torch
from flashrt.kernels import moe_fused, moe_gemv_gluon, ring_layout
from flashrt.kernels.decode import cdiv, launch_pdl, next_power_of_2
from flashrt.kernels.linear_mma import reduce_splits, split_ks, split_target
from flashrt.kernels.linear_mma_gluon import (
    _EPILOGUE_FACTOR,
    BLOCK_K,
    UNCHUNKED_STAGES,
    WIDE_TILE,
    WIDE_TILE_STAGES,
    V,
    _activation_offsets,
    _copyable,
    _ring_product,
    _store_tile,
    _sum_chunks,
    _weight_offsets,
    acts_copy_layout,
    aligned_activations,
    mma_tokens,
    require_bf16,
    words_copy_layout,
    words_layout,
    words_per_chunk,
)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.extra.cuda import gdc_wait


@gluon.jit
def _gate_up_offsets(i, pid_n, N, stride, HALF: gl.constexpr, CHUNKS: gl.constexpr, chunk):
    """Where program row ``i`` starts: of the ``HALF // CHUNKS`` gate rows from ``pid_n * HALF //
    CHUNKS`` for the first ``HALF`` program rows, of the matching up rows (``N`` further) for the
    rest; with ``CHUNKS > 1`` program row ``CHUNKS j + c`` is chunk ``c`` (``chunk`` apart) of
    row ``j``. Rows past N read row N - 1's (never stored)."""
    if CHUNKS == 1:
        row = gl.minimum(pid_n * HALF + i % HALF, N - 1)
        start = (row + (i // HALF) * N).to(gl.int64) * stride
    else:
        ROWS: gl.constexpr = HALF // CHUNKS
        j = i // CHUNKS
        row = gl.minimum(pid_n * ROWS + j % ROWS, N - 1)
        start = (row + (j // ROWS) * N).to(gl.int64) * stride + (i % CHUNKS) * chunk
    return start


@gluon.jit
def _tile_run(
    pid_m, expert_offsets_ptr, expert_counts_ptr, E, E_POW2: gl.constexpr, BLOCK_M: gl.constexpr, WARPS: gl.constexpr
):
    """Tile ``pid_m`` of ``moe_fused.group_pairs``' layout: its first row, its expert (E - 1 past
    the last run), where that expert's pairs end, and whether the tile holds any (past the
    last run it has no steps and stores nothing)."""
    row_start = pid_m * BLOCK_M
    offs_e = gl.arange(0, E_POW2, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    ends = gl.load(expert_offsets_ptr + 1 + offs_e, mask=offs_e < E, other=2**30)
    e = gl.sum((ends <= row_start).to(gl.int32), axis=0)  # E past the last run
    expert = gl.minimum(e, E - 1).to(gl.int64)
    valid_end = gl.load(expert_offsets_ptr + expert) + gl.load(expert_counts_ptr + expert)
    return row_start, expert, valid_end, e < E


@gluon.jit
def _tile_pairs(sorted_pairs_ptr, row_start, offs, valid_end):
    """The pairs at rows ``row_start + offs`` of a grouped tile, and which of those rows hold one."""
    rows = row_start + offs
    valid = rows < valid_end
    return gl.load(sorted_pairs_ptr + rows, mask=valid, other=0), valid


@gluon.jit
def moe_gate_up_ring_kernel(
    hidden_ptr,
    words_ptr,
    scales_ptr,
    global_scale_ptr,
    topk_ids_ptr,
    sorted_pairs_ptr,
    expert_offsets_ptr,
    expert_counts_ptr,
    topk_weights_ptr,
    down_global_scale_ptr,
    h_ptr,
    N,
    K,
    E,
    TOP_K,
    stride_xm,
    stride_hm,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    chunk_words,
    chunk_scales,
    BLOCK_M: gl.constexpr,
    E_POW2: gl.constexpr,
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    FOLD_DOWN: gl.constexpr,
    CHUNKS: gl.constexpr,
    LAYOUT: gl.constexpr,
    TRIGGER: gl.constexpr,
    PDL: gl.constexpr = False,
):
    """``h[pair, rows] = silu(gate_e @ x_t) * (up_e @ x_t)``, e and t the pair's expert and token;
    weight words and scale words (int32) by expert, row. ``BLOCK_M == 1``: one program a pair
    (``topk_ids``). Else grouped: one program a ``BLOCK_M``-row tile of ``moe_fused.group_pairs``'
    layout, the pairs of one expert, which it reads once for all of them; past the last run a
    program has no steps and stores nothing. ``PDL`` (``PDL_GATE_UP``): launched with PDL, it
    waits for the kernel before it (the routing's) before it reads anything. ``FOLD_DOWN``: each
    pair's row of h times its routing weight and its expert's down global scale, what the ring
    downs sum as they are (a global scale of 0, an expert a checkpoint pruned, then adds
    nothing). ``CHUNKS > 1`` (one
    program a pair): the rows cut in chunks of K as ``linear_mma_gluon``'s, chunk c of the
    pair's token in MMA column c, ``16 * WARPS / CHUNKS`` gate rows and as many up rows a
    program (``chunk_words`` and ``chunk_scales`` int32 words a chunk)."""
    HALF: gl.constexpr = 16 * WARPS  # a row tile of gate rows, then one of up rows
    ROWS: gl.constexpr = HALF // CHUNKS  # gate rows a program, and as many up rows
    BLOCK_K: gl.constexpr = 32 * V
    RING_M: gl.constexpr = BLOCK_M * CHUNKS  # the ring's columns: pairs, or the chunks of one
    MMA_M: gl.constexpr = mma_tokens(RING_M)
    SCALES: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, words_layout(2, WARPS)))
    WORDS_COPY: gl.constexpr = words_copy_layout(WARPS)
    ACTS_COPY: gl.constexpr = acts_copy_layout(WARPS)

    if PDL:
        gdc_wait()
    pid_n, pid_m = gl.program_id(0), gl.program_id(1)
    xr = gl.arange(0, 4 * RING_M, layout=gl.SliceLayout(1, ACTS_COPY))
    xc = gl.arange(0, 8 * V, layout=gl.SliceLayout(0, ACTS_COPY))
    if BLOCK_M == 1:
        expert = gl.load(topk_ids_ptr + pid_m).to(gl.int64)
        x_tokens = pid_m // TOP_K + xr // (4 * CHUNKS)
        x_valid = xr < 4 * CHUNKS
        steps = K // CHUNKS // BLOCK_K
    else:
        row_start, expert, valid_end, has_run = _tile_run(
            pid_m, expert_offsets_ptr, expert_counts_ptr, E, E_POW2, BLOCK_M, WARPS
        )
        x_pairs, x_valid = _tile_pairs(sorted_pairs_ptr, row_start, xr // 4, valid_end)
        x_tokens = x_pairs // TOP_K
        steps = (K // BLOCK_K) * has_run.to(gl.int32)

    wr = gl.arange(0, 2 * HALF, layout=gl.SliceLayout(1, WORDS_COPY))
    wc = gl.arange(0, 4 * V, layout=gl.SliceLayout(0, WORDS_COPY))
    word_rows = _gate_up_offsets(wr, pid_n, N, stride_wn, HALF, CHUNKS, chunk_words) + expert * stride_we
    word_off = gl.expand_dims(word_rows, 1) + gl.expand_dims(wc, 0)
    sr = gl.arange(0, 2 * HALF, layout=gl.SliceLayout(1, SCALES))
    st = gl.arange(0, 4, layout=gl.SliceLayout(0, SCALES))
    scale_rows = _gate_up_offsets(sr, pid_n, N, stride_sn, HALF, CHUNKS, chunk_scales) + expert * stride_se
    scale_off = gl.expand_dims(scale_rows, 1) + gl.expand_dims(st, 0)
    x_off = _activation_offsets(x_tokens, xr, xc, stride_xm)
    if CHUNKS > 1:
        x_off += gl.expand_dims((xr // 4) * (8 * chunk_words), 1)  # ring row xr reads chunk xr // 4
    x_mask = gl.expand_dims(x_valid, 1)

    acc = _ring_product(
        hidden_ptr,
        words_ptr,
        scales_ptr,
        word_off,
        scale_off,
        x_off,
        x_mask,
        0,
        steps,
        RING_M,
        2,
        WARPS,
        STAGES,
        LAYOUT=LAYOUT,
        TRIGGER=TRIGGER,
    )  # [2 * HALF, MMA_M]: gate rows, then up rows; a column a pair (or a chunk of the pair)
    if CHUNKS > 1:
        acc = _sum_chunks(acc, CHUNKS, CHUNKS, WARPS)  # [2 * ROWS, MMA_M / CHUNKS]: column 0 the pair
        both = gl.permute(gl.reshape(acc, (2, ROWS, MMA_M // CHUNKS)), (1, 2, 0))
        both = gl.convert_layout(both, gl.BlockedLayout([1, 1, 2], [32, 1, 1], [WARPS, 1, 1], [2, 1, 0]))
    else:
        both = gl.permute(gl.reshape(acc, (2, HALF, MMA_M)), (1, 2, 0))
    gate, up = gl.split(both)  # a thread's gate and up of the same rows
    scale = gl.load(global_scale_ptr + expert) * _EPILOGUE_FACTOR
    gate = gate * scale
    h = gate / (1.0 + gl.exp(-gate)) * (up * scale)
    H: gl.constexpr = gate.type.layout
    offs_n = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, H))
    column = gl.arange(0, MMA_M // CHUNKS, layout=gl.SliceLayout(0, H))
    if BLOCK_M == 1:
        pairs = pid_m + column * 0
        column_valid = column < 1
    else:
        pairs, column_valid = _tile_pairs(sorted_pairs_ptr, row_start, column, valid_end)  # BLOCK_M is MMA_M
    if FOLD_DOWN:
        routed = gl.load(topk_weights_ptr + pairs, mask=column_valid, other=0.0).to(gl.float32)
        h = h * gl.expand_dims(routed * gl.load(down_global_scale_ptr + expert), 0)
    mask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims(column_valid, 0)
    out = h_ptr + gl.expand_dims(pairs.to(gl.int64) * stride_hm, 0) + gl.expand_dims(offs_n, 1)
    gl.store(out, h.to(h_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def moe_down_ring_kernel(
    h_ptr,
    words_ptr,
    scales_ptr,
    topk_ids_ptr,
    out_ptr,
    M,
    N,
    K,
    TOP_K,
    stride_om,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    TOP_K_POW2: gl.constexpr,
    EXPERT_STEPS: gl.constexpr,
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    SPLIT_K: gl.constexpr,
    LAYOUT: gl.constexpr,
    PDL: gl.constexpr,
):
    """``out[t, rows] = sum_j down_e(j) @ h[t * TOP_K + j]`` over token t's experts, h folded
    (``FOLD_DOWN``), so the sum takes no weights; N output rows, K = inter in ``EXPERT_STEPS``
    ring steps. One program a (row block, token, split): its ring walks the token's experts,
    one expert's steps after the other's, the copies ``STAGES - 1`` steps ahead across experts
    (the GEMV down waits on each expert's first load); a token's pair rows of h lie end to end,
    so its activations just step along. Split, the walk is cut ``SPLIT_K`` ways into fp32
    partials, through an expert too."""
    BLOCK_N: gl.constexpr = 16 * WARPS
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    SCALES: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, words_layout(1, WARPS)))
    ACTS_COPY: gl.constexpr = acts_copy_layout(WARPS)
    WALK: gl.constexpr = gl.BlockedLayout([TOP_K_POW2], [32], [WARPS], [0])  # every thread holds the walk

    pid_n, token = gl.program_id(0), gl.program_id(1)
    pid_k = gl.program_id(2)
    word_off, scale_off = _weight_offsets(pid_n, N, stride_wn, stride_sn, BLOCK_N, words_copy_layout(WARPS), SCALES)
    slots = gl.arange(0, TOP_K_POW2, layout=WALK)
    experts = gl.load(topk_ids_ptr + token * TOP_K + slots, mask=slots < TOP_K, other=0).to(gl.int64)
    xr = gl.arange(0, 4, layout=gl.SliceLayout(1, ACTS_COPY))
    xc = gl.arange(0, 8 * V, layout=gl.SliceLayout(0, ACTS_COPY))
    x_off = _activation_offsets(token + xr * 0, xr, xc, TOP_K * K)
    x_mask = gl.expand_dims(xr < 4, 1)

    walk = TOP_K * EXPERT_STEPS
    per_split = gl.cdiv(walk, SPLIT_K)
    first = pid_k * per_split
    steps = gl.minimum(per_split, walk - first)
    acc = _ring_product(
        h_ptr, words_ptr, scales_ptr, word_off, scale_off, x_off, x_mask, first, steps, 1, 1, WARPS, STAGES,
        experts * stride_we, experts * stride_se, EXPERT_STEPS, LAYOUT, PDL=PDL, TRIGGER=PDL,
    )  # fmt: skip

    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
    column = gl.arange(0, 8, layout=gl.SliceLayout(0, ACC))
    mask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims(column < 1, 0)
    # no global scale: the down's are in h
    _store_tile(
        acc, offs_n, token + column * 0, mask, out_ptr, out_ptr, out_ptr, pid_k, M, N, stride_om, False, SPLIT_K, False
    )


@gluon.jit
def _slot_offsets(i, pid_n, token, topk_ids_ptr, N, TOP_K, stride, stride_e, SLOTS: gl.constexpr, ROWS: gl.constexpr):
    """Where program row ``i = SLOTS n + j`` starts: row ``pid_n * ROWS + n`` of the expert in
    slot ``j`` of the token's walk (expert 0's for the slots past ``TOP_K``, which meet no
    activations). Rows past N read row N - 1's (never stored)."""
    j = i % SLOTS
    row = gl.minimum(pid_n * ROWS + i // SLOTS, N - 1)
    expert = gl.load(topk_ids_ptr + token * TOP_K + j, mask=j < TOP_K, other=0).to(gl.int64)
    return row.to(gl.int64) * stride + expert * stride_e


@gluon.jit
def moe_down_slots_ring_kernel(
    h_ptr,
    words_ptr,
    scales_ptr,
    topk_ids_ptr,
    out_ptr,
    N,
    K,
    TOP_K,
    stride_om,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    SLOTS: gl.constexpr,
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    LAYOUT: gl.constexpr,
    PDL: gl.constexpr,
    ROW_TILES: gl.constexpr = 1,
):
    """The walk's sum, ``out[t, rows] = sum_j down_e(j) @ h[t * TOP_K + j]`` (h folded), with
    the token's experts side by side instead of one after the other: program row ``SLOTS n + j``
    is row n of slot j's expert and meets pair j's row of h in MMA column j, ``linear_mma_gluon``'s
    rows cut in chunks with an expert a chunk (``SLOTS``, ``TOP_K`` rounded up to a power of 2,
    at most the MMA's 8 columns). One program a (block of ``16 * WARPS / SLOTS`` rows, token),
    K / ``BLOCK_K`` steps: the walk's programs take ``TOP_K`` times the steps, or split them
    into partials that a second launch reduces."""
    BLOCK_N: gl.constexpr = 16 * ROW_TILES * WARPS
    ROWS: gl.constexpr = BLOCK_N // SLOTS
    BLOCK_K: gl.constexpr = 32 * V
    SCALES: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, words_layout(ROW_TILES, WARPS)))
    WORDS_COPY: gl.constexpr = words_copy_layout(WARPS)
    ACTS_COPY: gl.constexpr = acts_copy_layout(WARPS)

    pid_n, token = gl.program_id(0), gl.program_id(1)
    wr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WORDS_COPY))
    wc = gl.arange(0, 4 * V, layout=gl.SliceLayout(0, WORDS_COPY))
    word_rows = _slot_offsets(wr, pid_n, token, topk_ids_ptr, N, TOP_K, stride_wn, stride_we, SLOTS, ROWS)
    word_off = gl.expand_dims(word_rows, 1) + gl.expand_dims(wc, 0)
    sr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, SCALES))
    st = gl.arange(0, 4, layout=gl.SliceLayout(0, SCALES))
    scale_rows = _slot_offsets(sr, pid_n, token, topk_ids_ptr, N, TOP_K, stride_sn, stride_se, SLOTS, ROWS)
    scale_off = gl.expand_dims(scale_rows, 1) + gl.expand_dims(st, 0)
    xr = gl.arange(0, 4 * SLOTS, layout=gl.SliceLayout(1, ACTS_COPY))
    xc = gl.arange(0, 8 * V, layout=gl.SliceLayout(0, ACTS_COPY))
    slot = xr // 4
    x_off = _activation_offsets(token * TOP_K + slot, xr, xc, K)  # a token's pair rows lie end to end
    x_mask = gl.expand_dims(slot < TOP_K, 1)
    acc = _ring_product(
        h_ptr, words_ptr, scales_ptr, word_off, scale_off, x_off, x_mask, 0, K // BLOCK_K, SLOTS, ROW_TILES, WARPS,
        STAGES, LAYOUT=LAYOUT, PDL=PDL, TRIGGER=PDL,
    )  # fmt: skip
    acc = _sum_chunks(acc, TOP_K, SLOTS, WARPS)  # [ROWS, MMA columns / SLOTS]: column 0 the token
    OUT: gl.constexpr = acc.type.layout
    rows = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, OUT))
    column = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, OUT))
    mask = gl.expand_dims(rows < N, 1) & gl.expand_dims(column < 1, 0)
    out = out_ptr + gl.expand_dims(token.to(gl.int64) * stride_om + column * 0, 0) + gl.expand_dims(rows, 1)
    gl.store(out, (acc * _EPILOGUE_FACTOR).to(out_ptr.dtype.element_ty), mask=mask)  # the global scales are in h


@gluon.jit
def moe_down_grouped_ring_kernel(
    h_ptr,
    words_ptr,
    scales_ptr,
    sorted_pairs_ptr,
    expert_offsets_ptr,
    expert_counts_ptr,
    partials_ptr,
    M,
    N,
    K,
    E,
    TOP_K,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    BLOCK_M: gl.constexpr,
    E_POW2: gl.constexpr,
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    LAYOUT: gl.constexpr,
    PDL: gl.constexpr,
):
    """The down grouped by expert, ``partials[j, t, rows] = down_e @
    h[t * TOP_K + j]`` for the pairs of one expert's tile, the expert read once for all of them
    (the walk reads it once a token). h folded, so ``linear_mma``'s ordered reduce over j is the
    bank's output. One program a (row block of ``16 * WARPS``, ``BLOCK_M``-pair tile)."""
    BLOCK_N: gl.constexpr = 16 * WARPS
    BLOCK_K: gl.constexpr = 32 * V
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    SCALES: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, words_layout(1, WARPS)))
    ACTS_COPY: gl.constexpr = acts_copy_layout(WARPS)

    pid_n, pid_m = gl.program_id(0), gl.program_id(1)
    row_start, expert, valid_end, has_run = _tile_run(
        pid_m, expert_offsets_ptr, expert_counts_ptr, E, E_POW2, BLOCK_M, WARPS
    )
    word_off, scale_off = _weight_offsets(pid_n, N, stride_wn, stride_sn, BLOCK_N, words_copy_layout(WARPS), SCALES)
    xr = gl.arange(0, 4 * BLOCK_M, layout=gl.SliceLayout(1, ACTS_COPY))
    xc = gl.arange(0, 8 * V, layout=gl.SliceLayout(0, ACTS_COPY))
    x_pairs, x_valid = _tile_pairs(sorted_pairs_ptr, row_start, xr // 4, valid_end)
    x_off = _activation_offsets(x_pairs, xr, xc, K)
    steps = (K // BLOCK_K) * has_run.to(gl.int32)
    acc = _ring_product(
        h_ptr, words_ptr, scales_ptr, word_off + expert * stride_we, scale_off + expert * stride_se, x_off,
        gl.expand_dims(x_valid, 1), 0, steps, BLOCK_M, 1, WARPS, STAGES, LAYOUT=LAYOUT, PDL=PDL, TRIGGER=PDL,
    )  # fmt: skip

    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
    column = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
    pairs, column_valid = _tile_pairs(sorted_pairs_ptr, row_start, column, valid_end)
    partial_rows = ((pairs % TOP_K) * M + pairs // TOP_K).to(gl.int64)
    mask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims(column_valid, 0)
    out = partials_ptr + gl.expand_dims(partial_rows * N, 0) + gl.expand_dims(offs_n, 1)
    gl.store(out, acc * _EPILOGUE_FACTOR, mask=mask)


def down_stages(config: dict) -> int:
    """The ring down's stages: the gate_up's unless the config sets ``DOWN_STAGES``."""
    return config.get("DOWN_STAGES", config["STAGES"])


# A grouped tile is the MMA's 8 columns: fewer tokens would compute 8 anyway, and at up to 16
# tokens (128 pairs over 128 experts) one tile holds every pair of an expert but the rarest.
GROUP_TILE = 8


def launch(
    hidden: torch.Tensor,
    gate_up: tuple,
    down: tuple,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    out: torch.Tensor,
    config: dict,
    use_prmt: bool,
) -> torch.Tensor:
    """The ring gate_up (after ``moe_fused``'s grouping, grouped), then the down: on the ring
    (``DOWN_WARPS`` in the config: the walk, split or not, or grouped by expert; then the
    ordered reduce where split or grouped) or ``moe_gemv_gluon``'s. bf16 activations, K in
    whole ring steps (``configs`` offers nothing else)."""
    ring_down = "DOWN_WARPS" in config
    layout = config.get("LAYOUT", ring_layout.CHECKPOINT)
    if layout != ring_layout.CHECKPOINT and not ring_down:
        raise ValueError(
            "LAYOUT: the GEMV down (DOWN_ROWS) reads the checkpoint's layout; a bank in ring_layout "
            "needs a config with DOWN_WARPS (the ring down)"
        )
    n = gate_up[0].shape[1] // 2
    if ring_down and n % BLOCK_K:
        raise ValueError(
            f"down: the ring walk takes the inter size in whole {BLOCK_K}-element steps, got {n}; "
            "use a config with DOWN_ROWS (the GEMV down)"
        )
    banks = (("gate_up", gate_up), ("down", down)) if ring_down else (("gate_up", gate_up),)
    for bank, (packed, scales, _) in banks:
        if scales is None:
            raise ValueError(f"{bank}: the ring expert form reads NVFP4 banks only, got a bf16 bank")
        for name, t in ((f"{bank} packed", packed), (f"{bank} scales", scales)):
            if not (t.is_contiguous() and _copyable(t.flatten(0, 1))):
                raise ValueError(
                    f"{name} must be contiguous, on 16 bytes, with rows of whole 16-byte chunks for cp.async"
                )
    require_bf16("hidden", hidden)
    gu_packed, gu_scales, gu_global = gate_up
    hidden = aligned_activations(hidden)
    t, k = hidden.shape
    top_k = topk_ids.shape[1]
    pairs = t * top_k
    experts = gu_packed.shape[0]
    h = torch.empty(pairs, n, dtype=torch.bfloat16, device=hidden.device)
    words, scale_words = gu_packed.view(torch.int32), gu_scales.view(torch.uint8).view(torch.int32)
    ids = topk_ids.reshape(-1)
    g = moe_fused.group_pairs(topk_ids, experts, GROUP_TILE) if config["GROUPED"] or "DOWN_GROUPED" in config else None
    if config["GROUPED"]:
        grouping, block_m, tiles = (g.sorted_pairs, g.expert_offsets, g.expert_counts), GROUP_TILE, g.rows // GROUP_TILE
    else:
        grouping, block_m, tiles = (ids, ids, ids), 1, pairs  # unread
    chunks = config.get("CHUNKS", 1)
    if chunks > 1 and (config["GROUPED"] or k % (chunks * BLOCK_K)):
        raise ValueError(
            f"CHUNKS={chunks}: the gate_up cuts a pair's rows in chunks of whole {BLOCK_K}-element steps, "
            f"one program a pair: needs GROUPED=0 and hidden a multiple of {chunks * BLOCK_K}, got "
            f"GROUPED={config['GROUPED']} and {k}; use CHUNKS=1"
        )
    chunk_words = words_per_chunk(k, chunks)
    pdl = ring_down and launch_pdl(PDL_DOWN)
    gate_up_pdl = launch_pdl(PDL_GATE_UP)
    moe_gate_up_ring_kernel[(cdiv(n, 16 * config["WARPS"] // chunks), tiles)](
        hidden,
        words,
        scale_words,
        gu_global,
        ids,
        *grouping,
        topk_weights.reshape(-1),
        down[2],
        h,
        n,
        k,
        experts,
        top_k,
        hidden.stride(0),
        h.stride(0),
        words.stride(0),
        words.stride(1),
        scale_words.stride(0),
        scale_words.stride(1),
        chunk_words,
        chunk_words // 8,
        BLOCK_M=block_m,
        E_POW2=next_power_of_2(experts),
        WARPS=config["WARPS"],
        STAGES=config["STAGES"],
        FOLD_DOWN=ring_down,
        CHUNKS=chunks,
        LAYOUT=layout,
        TRIGGER=pdl,
        PDL=gate_up_pdl,
        num_warps=config["WARPS"],
        launch_pdl=gate_up_pdl,
    )
    if ring_down:
        return launch_down(h, down, topk_ids, out, config, g, pdl)
    warps_k = config["DOWN_WARPS_K"]
    down_layout = {"ROWS": config["DOWN_ROWS"], "GROUPS": 1, "WARPS_N": 4 // warps_k, "WARPS_K": warps_k}
    return moe_gemv_gluon.launch_down(h, down, topk_ids, topk_weights, out, down_layout)


def launch_down(
    h: torch.Tensor,
    down: tuple,
    topk_ids: torch.Tensor,
    out: torch.Tensor,
    config: dict,
    grouping=None,
    pdl: bool = False,
) -> torch.Tensor:
    """The ring down on the folded ``h [pairs, N]``, ``16 * DOWN_WARPS`` rows a program, the
    ring's stages the gate_up's: the walk, a program a (row block, token, split); a token's
    experts side by side (``DOWN_SLOTS``), a program a (block of ``16 * DOWN_WARPS / SLOTS``
    rows, token), no partials; or grouped (``DOWN_GROUPED``, on ``grouping``), a program a (row
    block, tile), fp32 partials a pair. ``pdl``: it and its reduce launched with PDL
    (``PDL_DOWN``)."""
    dn_packed, dn_scales, _ = down  # the global scales are folded into h
    t, top_k = topk_ids.shape
    k, n = dn_packed.shape[1], h.shape[1]
    words, scale_words = dn_packed.view(torch.int32), dn_scales.view(torch.uint8).view(torch.int32)
    warps = config["DOWN_WARPS"]
    layout = config.get("LAYOUT", ring_layout.CHECKPOINT)
    if "DOWN_SLOTS" in config:
        slots = next_power_of_2(top_k)
        if slots > 8:
            raise ValueError(
                f"DOWN_SLOTS: a token's experts side by side take the MMA's 8 columns, so top_k <= 8, "
                f"got {top_k}; use a config with DOWN_SPLIT (the walk)"
            )
        row_tiles = config.get("DOWN_ROW_TILES", 1)
        moe_down_slots_ring_kernel[(cdiv(k, 16 * row_tiles * warps // slots), t)](
            h,
            words,
            scale_words,
            topk_ids.reshape(-1),
            out,
            k,
            n,
            top_k,
            out.stride(0),
            words.stride(0),
            words.stride(1),
            scale_words.stride(0),
            scale_words.stride(1),
            SLOTS=slots,
            WARPS=warps,
            STAGES=down_stages(config),
            LAYOUT=layout,
            PDL=pdl,
            ROW_TILES=row_tiles,
            num_warps=warps,
            launch_pdl=pdl,
        )
        return out
    if "DOWN_GROUPED" in config:
        partials = torch.empty(top_k, t, k, dtype=torch.float32, device=out.device)
        moe_down_grouped_ring_kernel[(cdiv(k, 16 * warps), grouping.rows // GROUP_TILE)](
            h,
            words,
            scale_words,
            grouping.sorted_pairs,
            grouping.expert_offsets,
            grouping.expert_counts,
            partials,
            t,
            k,
            n,
            dn_packed.shape[0],
            top_k,
            words.stride(0),
            words.stride(1),
            scale_words.stride(0),
            scale_words.stride(1),
            BLOCK_M=GROUP_TILE,
            E_POW2=next_power_of_2(dn_packed.shape[0]),
            WARPS=warps,
            STAGES=down_stages(config),
            LAYOUT=layout,
            PDL=pdl,
            num_warps=warps,
            launch_pdl=pdl,
        )
        reduce_splits(partials, None, None, out, pdl)
        return out
    split = config["DOWN_SPLIT"]
    target = split_target(out, split)
    moe_down_ring_kernel[(cdiv(k, 16 * warps), t, split)](
        h,
        words,
        scale_words,
        topk_ids.reshape(-1),
        target,
        t,
        k,
        n,
        top_k,
        out.stride(0),
        words.stride(0),
        words.stride(1),
        scale_words.stride(0),
        scale_words.stride(1),
        TOP_K_POW2=next_power_of_2(top_k),
        EXPERT_STEPS=n // BLOCK_K,
        WARPS=warps,
        STAGES=down_stages(config),
        SPLIT_K=split,
        LAYOUT=layout,
        PDL=pdl,
        num_warps=warps,
        launch_pdl=pdl,
    )
    if split > 1:
        reduce_splits(target, None, None, out, pdl)
    return out


# The ring down launched with PDL, and the gate_up letting it start once the gate_up's ring is
# read: the down's launch, its routing reads and its first weight copies overlap the gate_up's
# end (``linear_mma_gluon._prime``). At one token the Qwen3-30B down is 5.3 us a layer for 7 MB
# of weights, 1.6 at copy bandwidth (H200, 3d985f9, ``h200-e2e-qwen3-3d985f9-b1.json``). With
# torch.compile's PDL it is launched so (``None``, as ``linear_mma_gluon.PDL_LAUNCH``): Qwen3-30B
# at one token 1.70x bf16 with both, as without (0d80628, ``h200-e2e-qwen3-0d80628-pdl-b1.json``).
PDL_DOWN: bool | None = None
# The gate_up launched with PDL too, waiting for the routing before it reads anything: a graph
# whose launches mix PDL and plain ones pays for each change of kind. H200, graphs of 256
# dependent one-program launches (``bench/probe_launch_gaps.py``, ``h200-probe-launch-gaps-45c1956.json``):
# 0.61 us a launch all with PDL, 0.75-0.92 all without, 1.10 alternating; Qwen3-30B's seated step
# at batch 1 waited 0.45 us before its gate_up (afb0251). With torch.compile's PDL (``None``) that
# step fell from 1.946 to 1.909 ms, the router's kernels with PDL in both (9bdf706,
# ``h200-probe-pdl-switches-9bdf706.json``).
PDL_GATE_UP: bool | None = None
# The walk configs assume: a top-8 bank's down walks 8 experts, so splits keep two steps each
# (fewer experts: a split past the walk stores zeros, which the reduce adds).
WALK_EXPERTS = 8
# Rows cut in chunks (the gate_up's CHUNKS, the down's DOWN_SLOTS) where few tokens leave the
# MMA's columns empty. H200, Qwen3-30B's bank (``bench/probe_moe_chunks.py``,
# ``h200-probe-moe-chunks-f714056.json``): 15.2/23.7/37.4 us at 1/2/4 tokens against 17.9/26.0/41.0
# without; its down alone at one token 6.5 us against the walk's 7.7 split 8. Every best config
# had the slot down's 32-row programs (16-row ones 1-6% behind) and 2 or 4 chunks (8: 11-24%
# behind the best, so not offered). At 8 tokens 63.4 us against 65.8, at 16 113.2 against 93.2
# (``h200-probe-moe-chunks-574c692.json``): up to 8.
SLOTS_UPTO = 8
# The slot down's warps: 32-row programs, or 64 (8 output rows of 8 experts), never timed until
# b14cfbb (``bench/probe_wide.py``, ``h200-probe-wide-b14cfbb.json``, the bank in ring layout):
# the best config with 4 took the bank at 2/4/8 tokens in 21.36/33.75/56.86 us against
# 21.97/34.28/57.74 with 2, and at one token was 2% behind (14.51 against 14.23).
# Neither 8 warps (128 rows), nor 3 stages (``DOWN_STAGES``; a 768-wide down is 3 ring steps),
# nor two row tiles a warp (``DOWN_ROW_TILES``: a warp's loads of h serve 32 rows) gained more than
# 1% at 1-16 tokens (13dd3dc, 5744288, ``bench/probe_down_width.py``): not offered.
SLOT_DOWN_WARPS = (2, 4)
# The chunked gate_up's and slot down's ring depth (the down's the gate_up's). With 4, a
# program's ring holds its whole read (a pair's chunk is 2-4 steps, the down 3) and shared
# memory bounds the gate_up to 5 programs an SM at 8 tokens (Nsight Compute,
# ``h200-ncu-ring8-db199b9.txt``). H200, Qwen3-30B's bank, served config against the same with
# 2 stages in both halves (``bench/probe_bank_stages.py``, two calls,
# ``h200-probe-bank-stages-8c79d3e.json`` and ``-07ceaeb.json``): 13.43 and 13.45 us against
# 14.35 and 14.49 at one token, 20.75 and 21.02 against 21.94 and 21.95 at two; at 4 and 8
# tokens within 1% (34.78 against 34.03, 56.65 against 56.85 with 2 in the down alone); 3
# stages in either half behind both everywhere. Offered both, the kernel benchmark's adjudicator
# took 2 at 1, 4 and 8 tokens, at 4 and 8 with a one-warp gate_up of whole rows (16 ring rows,
# the fewest bytes a program): 12.54/30.98/54.69 us against 13.72/32.89/55.84 before
# (``h200-kernels-stages-7c8dda6.json`` against ``h200-kernels-moe-37845a7.json``, 4 tokens
# ``h200-kernels-moe-m512-fd9e9fb.json``; other calls).
CHUNK_STAGES = (2, 4)


def ring_stages(t: int) -> tuple[int, ...]:
    """The unchunked ways' ring depths: the dense ring form's (``linear_mma_gluon``), 2 as well
    from a 16-token tile. H200, Qwen3-30B's bank at 16 tokens, its served config (3 stages)
    against the same with 2 stages in both halves, the depth a config sets for both
    (``bench/probe_bank_stages.py``, ``h200-probe-bank-stages-442140c-t8.json``): 83.73 us
    against 85.31. Offered, the kernel benchmark's adjudicator took 2 for both banks at 16 and 32
    tokens: Qwen3-30B's at 16 in 83.70 us against 86.94, Qwen3.5-35B's 71.74 against 74.57
    (``h200-kernels-bank-stages-c797099.json`` against ``h200-kernels-moe-37845a7.json``)."""
    return WIDE_TILE_STAGES if t >= WIDE_TILE else UNCHUNKED_STAGES


# Rows the ring forms are offered to; past them the grouped Triton form (``moe_fused``). Up to 16
# first: past that the e2e band sweep found the packed bank a loss, which was ``moe_fused``'s, not
# the ring's: Qwen3-30B's full step on the H200 at 24 and 32 rows took 15.2 and 17.6 ms packed
# against 6.9 at 16 (e8c5967, ``h200-e2e-qwen3-e8c5967-b16b32.json``), its bf16 host 15.6 and 17.9.
# The ring at 24 and 32 rows (band 32): 2808.8 and 3524.8 tok/s against the host's 1452.2 and
# 1701.2 (51ae3f9, ``h200-e2e-qwen3-51ae3f9-b32-band32.json``); offered to 64, at 48 and 64 rows
# 5254.2 and 6727.5 against 2238.5 and 2678.2 (416ab12, ``h200-e2e-qwen3-416ab12-b16-band64.json``).
# Where the ring serves, the runtime's MoE band is this reach (``ops.moe_band``).
MAX_TOKENS = 64
# The banks' bits as the checkpoint has them, or in ``ring_layout`` (the ring downs only: the GEMV
# down reads the checkpoint's).
LAYOUTS = (ring_layout.CHECKPOINT, ring_layout.RING)
GATE_UP_CHUNKS = (1, 2, 4)
# The grouped down from 8 tokens on: about 54 experts for 64 pairs there, where it tied the walk
# (68.7 against 68.8 us, ea7c354), and it lost at one token (22.6 against 21.8).
DOWN_GROUPED_FROM = 8
# The grouped down's warps: 32- and 64-row programs. H200, Qwen3-30B's bank at 16 tokens with
# its grouped gate_up (13dd3dc, ``bench/probe_down_width.py``, ``h200-probe-down-width-13dd3dc.json``):
# 85.4-85.5 us with 4 warps, 86.4-86.6 with 2, 86.3-88.4 with 8 and 90.8-95.1 with 1, which was
# offered until then. The slot down at 8 warps or with 3 stages gained nothing either (56.8-58.5
# against 57.2 at 8 tokens): the down's programs are not short of rows.
GROUPED_DOWN_WARPS = (2, 4)
# Past the 16 tokens where the H200 timed every way, only the two ways that won there: gate_up and
# down both grouped by expert (Qwen3-30B's 128 experts) and the gate_up per pair with the unsplit
# walk (Qwen3.5-35B's 256, where 16 tokens' 128 pairs meet about 100 experts; the tuning cache,
# ``kernels/choices/``), each with its warps and stages: 16 configs to compile and time at a cold
# first call where 16 tokens offer 40 (a cold 32-token call outran a 270 s run at 8f05645).
TIMED_UPTO = 16


def configs(t: int, n: int, k: int) -> list[dict]:
    """Up to ``MAX_TOKENS`` tokens, K in whole ring steps, on a compiled GPU (Gluon has no interpreter).

    What the H200 kept of 96-108 configs a token count (9a6de5f,
    ``bench/results/h200-probe-moe-ring-down.json``, Qwen3-30B's bank at 1, 8 and 16 tokens):
    the gate_up per pair or grouped by expert (per pair won at 1 and 8 tokens, grouped at 16),
    one or two warps (32 or 64 ring rows; four were 3-19% off the best every time), three or
    four stages, from 16 tokens two as well (``ring_stages``). The down where the inter size is
    whole ring steps: the walk, 16 or 32 rows a
    program (64 were 2-55% off), unsplit and split as ``linear_mma.split_ks`` offers for its
    programs (split 4 won at one token, unsplit at 8 and 16), and from 8 tokens on grouped by
    expert after the grouped gate_up (``DOWN_GROUPED``: 100.0 against the walk's best 106.5 us
    at 16 tokens, ea7c354, ``h200-probe-moe-ring-staged.json``; 32- and 64-row programs,
    ``GROUPED_DOWN_WARPS``); elsewhere the two
    ``moe_gemv_gluon`` layouts that won its own (two rows a thread and K split in two at one
    token, four rows otherwise: ``h200-kernels-moe-prefetch2.json``), which lost to the walk
    by 4/27/32% at 1/8/16 tokens. Up to ``SLOTS_UPTO`` tokens, where the inter size is whole
    ring steps, also the gate_up per pair with its rows in ``GATE_UP_CHUNKS`` chunks and the
    slot down (``DOWN_SLOTS``, 32 or 64 rows of 8 experts a program), 2 or 4 stages
    (``CHUNK_STAGES``); they won every one of those
    token counts on the H200. Past ``TIMED_UPTO`` tokens, the ways that won at 16. Fewer
    configs, a shorter attach: each is compiled and timed at first use."""
    from flashrt.kernels.decode import interpreted

    if t > MAX_TOKENS or interpreted() or k % BLOCK_K or n % 16:
        return []
    if n % BLOCK_K:
        downs = [{"DOWN_ROWS": rows, "DOWN_WARPS_K": warps_k} for rows, warps_k in ((2, 2), (4, 1))]
    else:
        downs = []
        for warps in (1, 2):
            programs = cdiv(k, 16 * warps) * t
            splits = (1, *split_ks(programs, WALK_EXPERTS * n, BLOCK_K))
            downs += [{"DOWN_WARPS": warps, "DOWN_SPLIT": split} for split in splits]
    if n % BLOCK_K == 0 and t > TIMED_UPTO:
        ways = [(0, down) for down in downs if down["DOWN_SPLIT"] == 1]
    else:
        ways = [(grouped, down) for grouped in (0, 1) for down in downs]
    if n % BLOCK_K == 0 and t >= DOWN_GROUPED_FROM:
        ways += [(1, {"DOWN_WARPS": warps, "DOWN_GROUPED": 1}) for warps in GROUPED_DOWN_WARPS]
    offered = [
        {"GROUPED": grouped, "WARPS": warps, "STAGES": stages, **down}
        for grouped, down in ways
        for warps in (1, 2)
        for stages in ring_stages(t)
    ]
    if n % BLOCK_K == 0 and t <= SLOTS_UPTO:
        offered += [
            {
                "GROUPED": 0,
                "WARPS": warps,
                "STAGES": stages,
                "CHUNKS": chunks,
                "DOWN_WARPS": down_warps,
                "DOWN_SLOTS": 1,
            }
            for chunks in GATE_UP_CHUNKS
            if k % (chunks * BLOCK_K) == 0
            for warps in (1, 2)
            for down_warps in SLOT_DOWN_WARPS
            for stages in CHUNK_STAGES
        ]
    return offered
