"""Does the one-token ring form gain from reading its weights straight into registers?

``bench/probe_decode_cost.py`` (H200, 4140803): the ring form as served takes Llama's gate_up at
one token in 21.95 us, 19.73 with its decode left out, where a kernel that only reads the same
bytes takes 16.48. So most of what separates ours from merely reading is the ring: each thread's
``cp.async`` copies into shared memory, the wait and the block-wide barrier a step (which Triton's
shared-memory analysis puts back if it is left out: a probe build without ``_barrier`` kept its
``bar.sync``), the loads back out. The read-only kernel has none of them.

Here the weight words and scale words go from global memory straight into the registers of the
threads that decode them (the ``words_layout`` of ``linear_mma_gluon``: a thread's eight words of
a row step contiguous), ``AHEAD`` steps in flight in registers while a step is decoded, and the
activations of a step are loaded from global memory as it starts (L1/L2: every program reads
the same few KB; the load is under the step's decode). No shared memory and no barrier in the
loop. The step's decode and MMA are the ring form's (``_weights_fragment``,
``_times_activations``).

For each Llama shape and the LM head at one and 16 tokens, the H200's tuned ring config
(``kernels/choices``) run as served and the same tiling read direct, each checked against the
reference first, then each timed as the adjudicator times (``ops._time_us``); also the direct
form at the other warp counts, and the read-only floor of ``probe_rows``.

``python3 bench/probe_direct_words.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
H200 at 2463e7c (``h200-probe-direct-words-2463e7c.json``): the direct form lost by 2-3x at
every shape (gate_up at one token 50.78 us against the ring's 22.53), and going three steps ahead
lost to two: the words in flight hold the registers that would keep more warps' reads in flight.
"""

from __future__ import annotations

import sys

import torch
from flashrt.kernels.decode import cdiv
from flashrt.kernels.linear_mma import reduce_splits, split_target
from flashrt.kernels.linear_mma_gluon import (
    V,
    _activation_tile,
    _row_offsets,
    _store_product,
    _times_activations,
    _weights_fragment,
    acts_load_layout,
    mma_tokens,
    words_layout,
    words_per_chunk,
)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

AHEADS = (2, 3)


@gluon.jit
def _dim_range(n: gl.constexpr, dim: gl.constexpr, LAYOUT: gl.constexpr):
    """``arange(n)`` along dimension ``dim`` of a 4-D ``LAYOUT``, expanded to 4-D."""
    if dim == 0:
        r = gl.arange(0, n, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LAYOUT))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(r, 1), 2), 3)
    elif dim == 1:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, LAYOUT))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(r, 0), 2), 3)
    elif dim == 2:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LAYOUT))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(r, 0), 1), 3)
    else:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LAYOUT))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(r, 0), 1), 2)


@gluon.jit
def _load_weights(words_ptr, scales_ptr, word_off, scale_off, at):
    """Step ``at``'s weight words and scale words, into the registers that decode them."""
    return gl.load(words_ptr + word_off + at * (4 * V)), gl.load(scales_ptr + scale_off + at * (V // 2))


@gluon.jit
def _load_acts(x_ptr, x_off, x_mask, at, valid):
    """Step ``at``'s activations; zeros for a step past the last (its weights, re-read, then add
    nothing)."""
    return gl.load(x_ptr + x_off + at * (32 * V), mask=x_mask & valid, other=0.0)


@gluon.jit
def direct_words_kernel(
    x_ptr,
    words_ptr,
    scales_ptr,
    global_scale_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    stride_wn,
    stride_sn,
    chunk_words,
    chunk_scales,
    HAS_BIAS: gl.constexpr,
    BLOCK_M: gl.constexpr,
    ROW_TILES: gl.constexpr,
    WARPS: gl.constexpr,
    AHEAD: gl.constexpr,
    SPLIT_K: gl.constexpr,
    CHUNKS: gl.constexpr,
    LAYOUT: gl.constexpr,
):
    """``nvfp4_linear_mma_gluon_kernel``'s tiling, chunks and splits, its weights read straight
    into registers ``AHEAD`` (2 or 3) steps ahead; each step's activations loaded as it starts
    (from L1 or L2, under the step's decode)."""
    BLOCK_N: gl.constexpr = 16 * ROW_TILES * WARPS
    MMA_M: gl.constexpr = mma_tokens(BLOCK_M)
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    WORDS: gl.constexpr = words_layout(ROW_TILES, WARPS)
    SCALES: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, WORDS))
    X: gl.constexpr = acts_load_layout(BLOCK_M, WARPS)

    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_k = gl.program_id(2)

    rows = pid_n * BLOCK_N + _dim_range(BLOCK_N, 0, WORDS)
    word_off = _row_offsets(rows, N, stride_wn, CHUNKS, chunk_words)
    word_off += _dim_range(4, 1, WORDS) * V + _dim_range(V // 2, 2, WORDS) * 2 + _dim_range(2, 3, WORDS)
    sr = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, SCALES))
    scale_off = gl.expand_dims(_row_offsets(sr, N, stride_sn, CHUNKS, chunk_scales), 1)
    scale_off += gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, SCALES)), 0)

    x_off, x_mask, first, steps = _activation_tile(
        pid_m, pid_k, M, K, stride_xm, chunk_words, X, BLOCK_M, SPLIT_K, CHUNKS
    )
    last = first + steps - 1  # weights past the end re-read the last step's: in bounds

    # Unrolled by AHEAD with each buffer reloaded in place: rotating buffers through the loop
    # cost a register move a word and two PRMTs an activation pair (sm_90 SASS of a first cut).
    acc = gl.zeros([BLOCK_N, MMA_M], gl.float32, layout=ACC)
    w0, s0 = _load_weights(words_ptr, scales_ptr, word_off, scale_off, first)
    w1, s1 = _load_weights(words_ptr, scales_ptr, word_off, scale_off, gl.minimum(first + 1, last))
    if AHEAD == 3:
        w2, s2 = _load_weights(words_ptr, scales_ptr, word_off, scale_off, gl.minimum(first + 2, last))
    for i in range(0, steps, AHEAD):  # steps may be 0 (a split past the end): nothing is accumulated
        x = _load_acts(x_ptr, x_off, x_mask, first + i, i < steps)
        acc = _times_activations(acc, _weights_fragment(w0, s0, WARPS, LAYOUT), x, BLOCK_M, WARPS, LAYOUT)
        w0, s0 = _load_weights(words_ptr, scales_ptr, word_off, scale_off, gl.minimum(first + i + AHEAD, last))
        x = _load_acts(x_ptr, x_off, x_mask, first + i + 1, i + 1 < steps)
        acc = _times_activations(acc, _weights_fragment(w1, s1, WARPS, LAYOUT), x, BLOCK_M, WARPS, LAYOUT)
        w1, s1 = _load_weights(words_ptr, scales_ptr, word_off, scale_off, gl.minimum(first + i + 1 + AHEAD, last))
        if AHEAD == 3:
            x = _load_acts(x_ptr, x_off, x_mask, first + i + 2, i + 2 < steps)
            acc = _times_activations(acc, _weights_fragment(w2, s2, WARPS, LAYOUT), x, BLOCK_M, WARPS, LAYOUT)
            w2, s2 = _load_weights(words_ptr, scales_ptr, word_off, scale_off, gl.minimum(first + i + 2 + AHEAD, last))

    _store_product(
        acc, pid_n, pid_m, pid_k, out_ptr, bias_ptr, global_scale_ptr, M, N, stride_om, HAS_BIAS, BLOCK_M, SPLIT_K,
        CHUNKS, WARPS,
    )  # fmt: skip


def launch(x, packed, scales, global_scale, bias, out, config: dict) -> torch.Tensor:
    """``linear_mma_gluon.launch``'s grid and arguments for ``direct_words_kernel`` (``AHEAD``
    in place of ``STAGES``)."""
    m, k = x.shape
    n = packed.shape[0]
    chunks = config.get("CHUNKS", 1)
    chunk_words = words_per_chunk(k, chunks)
    block_n = 16 * config["ROW_TILES"] * config["WARPS"]
    split = config.get("SPLIT_K", 1)
    target = split_target(out, split)
    grid = (cdiv(chunks * n, block_n), cdiv(chunks * m, config["BLOCK_M"]), split)
    direct_words_kernel[grid](
        x, packed.view(torch.int32), scales.view(torch.uint8).view(torch.int32), global_scale,
        bias if bias is not None else out, target, m, n, k, x.stride(0), out.stride(0), packed.stride(0) // 4,
        scales.stride(0) // 4, chunk_words, chunk_words // 8, HAS_BIAS=bias is not None, BLOCK_M=config["BLOCK_M"],
        ROW_TILES=config["ROW_TILES"], WARPS=config["WARPS"], AHEAD=config["AHEAD"], SPLIT_K=split, CHUNKS=chunks,
        LAYOUT=config.get("LAYOUT", 0), num_warps=config["WARPS"],
    )  # fmt: skip
    if split > 1:
        reduce_splits(target, global_scale, bias, out)
    return out


def main(path: str) -> None:
    from flashrt.bench.probe_decode_cost import time_ring_arms

    def direct_arms(cfg: dict, operands: tuple) -> dict:
        arms = {}
        for warps in sorted({cfg["WARPS"], 2, 4}):
            for ahead in AHEADS:
                c = {**cfg, "WARPS": warps, "AHEAD": ahead}
                arms[f"direct_w{warps}_a{ahead}"] = lambda o, c=c, a=operands: launch(*a, o, c)
        return arms

    time_ring_arms(path, direct_arms)


if __name__ == "__main__":
    main(sys.argv[1])
