"""Decode attention split along the cache, for both arms of ``bench.e2e``.

At one query token, cuDNN's sdpa (what ``torch.compile`` picks on the H200 for the query heads of a
key-value head as its rows) runs one program a (sequence, key-value head) over the whole cache:
4 programs a layer for Qwen3-30B-A3B at batch 1, 8 for Llama-3-8B. On the H200 that took
11.3 us a layer at batch 1 and 24 at batch 16 for a 259-position cache (b045f1b,
``bench/results/h200-e2e-qwen3-router-b1.json``, ``-b16.json``): 0.54 and 1.15 ms of a 3.1 and
8.1 ms seated step, in both arms, for a cache a layer of 0.5 MB (batch 1) to 8.5 MB (16). A
serving engine's decode attention splits the cache over more programs and merges their partial
softmaxes (FlashAttention's split-KV decode, vLLM's ``flash_attn_with_kvcache``): this is that
kernel for the benchmark, where vLLM is not installed.

1. ``decode_attention_kernel``: one program a (sequence, key-value head, split); its query heads
   are the rows of ``tl.dot`` (padded to 16), its split of the cache streamed in ``BLOCK_L``
   keys with the online softmax; out the split's unnormalized output, running max and sum.
   Its dots run on the tensor cores (bf16 in, fp32 accumulated; the probabilities rounded to
   bf16 for the second, as FlashAttention does). At b045f1b they were fp32 FMAs (``ieee``):
   on the H200 one 32-key step of 8 query heads took 6.5 us (58.8 us for 9 steps unsplit),
   so at 16 sequences the split ran 42 us a layer against cuDNN's 26
   (``h200-probe-decode-attention-2f962ec.json``). fp32 inputs, and every input under the
   interpreter (``UPCAST``), keep the fp32 dots: Triton 3.9's interpreter gets bf16 ``tl.dot``
   wrong (off by 1e9 on CPU).
2. ``merge_splits_kernel``: one program a (sequence, query head), the splits' partial softmaxes
   merged in split order (deterministic, no atomics). Where the pairs alone fill the GPU and the
   cache is one split (Llama-3-8B from 17 sequences), the split kernel normalizes its output
   itself (``WHOLE``) and there is no merge, as FlashAttention's split-KV decode does at one
   split: at 32 sequences that merge was a launch a layer, 51 us of bf16's 5.14 ms step
   (a040892, ``h200-e2e-llama-a040892-b4b16b32-profiled.json``).

On the H200 (427f4ad, ``bench/results/h200-probe-decode-attention-427f4ad.json``, the cache
from HBM) it took a Qwen3-30B-A3B layer's attention from cuDNN's 17.1/25.5/25.8/28.2 us to
5.0/7.5/10.2/12.1 at batch 1/8/16/32, and a Llama-3-8B layer's from 18.5/26.1/44.2 to
5.8/9.1/17.3 at 1/8/32: faster at every e2e shape, so the e2e runs it at every one.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import cdiv, interpreted, launch_pdl, next_power_of_2, wait_then_let_next_start

# Programs to aim for a layer: the H200's 132 SMs, so a batch-1 layer's 4 key-value heads split
# 9 ways (36 programs, all the cache allows at 32 keys a step) and batch 16's 64 heads 3 ways (192).
TARGET_PROGRAMS = 132


class Tile(NamedTuple):
    """The split kernel's step (``BLOCK_L`` keys), warps and software-pipelined stages."""

    keys: int
    warps: int
    stages: int


# The split kernel's tile, by the (sequence, key-value head) pairs of a layer: ``NARROW`` below
# ``WIDE_FROM_PAIRS``, ``WIDE`` from it. Where the pairs are few the cache is split many ways and a
# 32-key step keeps nine splits possible; from 32 pairs a split is two or more 32-key steps, which
# a program runs one after another, so a 64-key step, twice the cache in flight a program, pays.
# H200, e7e919e (``bench/results/h200-probe-decode-attention-tiles-e7e919e.json``), 18 tiles of
# 32/64/128 keys, 4/8 warps, 2-4 stages at every e2e batch: 64 keys, 4 warps, 3 stages was the
# fastest or within 0.1 us from 32 pairs, Llama-3-8B's layer 17.2 -> 15.9 us at 32 sequences
# (256 pairs), 11.5 -> 10.3 at 16, 9.0 -> 8.7 at 8, Qwen3-30B-A3B's 12.3 -> 10.7 at 32, 7.6 -> 7.3
# at 8 (32 pairs); below 32 pairs (Qwen3 at 1 and 4, Llama at 1) 0.1-0.3 us slower than 32 keys.
# 128 keys never won by more than 0.1 us; 8 warps never won.
# The sweep's layers have heads of 128; at Qwen3.5-35B-A3B's 256 a 64-key step holds twice the
# keys and values a thread, and it has not been timed, so those layers keep ``NARROW``.
NARROW = Tile(keys=32, warps=4, stages=3)
WIDE = Tile(keys=64, warps=4, stages=3)
WIDE_FROM_PAIRS = 32
WIDE_MAX_DIM = 128
MASKED = tl.constexpr(-1.0e30)  # a masked key's score: finite, so a split with no visible key stays NaN-free
# Both kernels launched with PDL where torch.compile launches its kernels so (``decode.launch_pdl``,
# as the ring forms): each waits for the kernel before it, then lets the one after it start. A
# serving engine's decode attention takes part the same way (FlashMLA's split-KV decode and its
# combine wait with ``cudaGridDependencySynchronize``); without it the output projection after
# the merge starts only once the merge has ended, the one projection of a layer whose first weight
# steps are not in flight while the kernel before it runs. Both arms run these kernels.
PDL_LAUNCH: bool | None = None


@triton.jit
def decode_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    visible_ptr,
    partial_ptr,
    max_ptr,
    sum_ptr,
    KV_HEADS,
    G,
    L,
    D,
    scale,
    stride_qb,
    stride_qh,
    stride_qg,
    stride_kb,
    stride_kh,
    stride_kl,
    stride_vb,
    stride_vh,
    stride_vl,
    stride_mb,
    stride_ml,
    SPLIT_L: tl.constexpr,
    BLOCK_L: tl.constexpr,
    G_POW2: tl.constexpr,
    D_POW2: tl.constexpr,
    UPCAST: tl.constexpr,
    WHOLE: tl.constexpr,
    PDL: tl.constexpr,
):
    """``partial[b, h, split, g]``, ``max``, ``sum``: query head g of key-value head h of sequence b
    over the visible keys of cache positions ``[split * SPLIT_L, (split + 1) * SPLIT_L)``. With
    ``WHOLE`` (one split) the softmax is already whole: ``partial`` is the output, normalized in
    its dtype, and there is no max or sum to keep."""
    wait_then_let_next_start(PDL)  # the query and cache are the kernels' before; the next may start and wait
    bh, split = tl.program_id(0), tl.program_id(1)
    b, h = bh // KV_HEADS, bh % KV_HEADS
    rows = tl.arange(0, G_POW2)
    dims = tl.arange(0, D_POW2)
    dim_mask = dims < D
    q_off = b * stride_qb + h * stride_qh + rows[:, None] * stride_qg + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=(rows[:, None] < G) & dim_mask[None, :], other=0.0)
    k_rows = k_ptr + b * stride_kb + h * stride_kh + dims[None, :]
    v_rows = v_ptr + b * stride_vb + h * stride_vh + dims[None, :]
    running_max = tl.full([G_POW2], MASKED, dtype=tl.float32)
    running_sum = tl.zeros([G_POW2], dtype=tl.float32)
    acc = tl.zeros([G_POW2, D_POW2], dtype=tl.float32)
    for start in range(split * SPLIT_L, tl.minimum((split + 1) * SPLIT_L, L), BLOCK_L):
        keys = start + tl.arange(0, BLOCK_L)
        in_cache = keys < L
        visible = tl.load(visible_ptr + b * stride_mb + keys * stride_ml, mask=in_cache, other=0) != 0
        kv_mask = visible[:, None] & dim_mask[None, :]  # a hidden key's slot is never read
        k = tl.load(k_rows + keys[:, None] * stride_kl, mask=kv_mask, other=0.0)
        if UPCAST:
            scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
        else:
            scores = tl.dot(q, tl.trans(k)) * scale
        scores = tl.where(visible[None, :], scores, MASKED)
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        kept = tl.exp(running_max - new_max)
        p = tl.where(visible[None, :], tl.exp(scores - new_max[:, None]), 0.0)
        running_sum = running_sum * kept + tl.sum(p, axis=1)
        v = tl.load(v_rows + keys[:, None] * stride_vl, mask=kv_mask, other=0.0)
        if UPCAST:
            acc = acc * kept[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * kept[:, None] + tl.dot(p.to(v.dtype), v)
        running_max = new_max
    splits = tl.num_programs(1)
    at = (bh * splits + split) * G + rows
    out_mask = (rows[:, None] < G) & dim_mask[None, :]
    if WHOLE:
        out = acc / running_sum[:, None]
        tl.store(partial_ptr + at[:, None] * D + dims[None, :], out.to(partial_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(partial_ptr + at[:, None] * D + dims[None, :], acc, mask=out_mask)
        tl.store(max_ptr + at, running_max, mask=rows < G)
        tl.store(sum_ptr + at, running_sum, mask=rows < G)


@triton.jit
def merge_splits_kernel(
    partial_ptr,
    max_ptr,
    sum_ptr,
    out_ptr,
    G,
    D,
    SPLITS,
    SPLITS_POW2: tl.constexpr,
    D_POW2: tl.constexpr,
    PDL: tl.constexpr,
):
    """``out[b, h, g] = sum_s e^(max_s - M) partial_s / sum_s e^(max_s - M) sum_s``, M the splits'
    largest max: the softmax over every split's keys (a split with no visible key weighs 0)."""
    wait_then_let_next_start(PDL)  # the partials are the split kernel's; the output projection may start
    row = tl.program_id(0)  # (b * KV + h) * G + g
    bh, g = row // G, row % G
    splits = tl.arange(0, SPLITS_POW2)
    dims = tl.arange(0, D_POW2)
    at = (bh * SPLITS + splits) * G + g
    maxes = tl.load(max_ptr + at, mask=splits < SPLITS, other=MASKED)
    weights = tl.exp(maxes - tl.max(maxes, axis=0))
    sums = tl.load(sum_ptr + at, mask=splits < SPLITS, other=0.0)
    mask = (splits[:, None] < SPLITS) & (dims[None, :] < D)
    partials = tl.load(partial_ptr + at[:, None] * D + dims[None, :], mask=mask, other=0.0)
    out = tl.sum(partials * weights[:, None], axis=0) / tl.sum(sums * weights, axis=0)
    tl.store(out_ptr + row * D + dims, out.to(out_ptr.dtype.element_ty), mask=dims < D)


def tile_for(programs: int, dim: int) -> Tile:
    """The split kernel's tile for ``programs`` (sequence, key-value head) pairs of heads of ``dim``."""
    return WIDE if programs >= WIDE_FROM_PAIRS and dim <= WIDE_MAX_DIM else NARROW


def split_keys(programs: int, length: int, dim: int) -> int:
    """Cache positions a split, for ``programs`` (sequence, key-value head) pairs of heads of
    ``dim``: whole steps of their tile, splits enough for ``TARGET_PROGRAMS``, at most one a step."""
    block_l = tile_for(programs, dim).keys
    steps = cdiv(length, block_l)
    wanted = max(1, min(cdiv(TARGET_PROGRAMS, programs), steps))
    return block_l * cdiv(steps, wanted)


def split_count(programs: int, length: int, dim: int) -> int:
    """The splits ``decode_attention`` launches (``split_keys`` positions each)."""
    return cdiv(length, split_keys(programs, length, dim))


@torch.library.custom_op("flashrt_bench::decode_attention", mutates_args=())
def decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """``[B, KV, G, D]``: query rows ``[B, KV, G, D]`` (the G query heads of each key-value head)
    attending over the cache ``key``/``value [B, KV, L, D]`` where ``visible [B, L]`` (bool)."""
    batch, kv_heads, groups, dim = query.shape
    length = key.shape[2]
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.stride(-1) != 1:
            raise ValueError(f"decode_attention: {name} needs its last dimension contiguous, got strides {t.stride()}")
    if visible.dtype != torch.bool or visible.shape != (batch, length):
        raise ValueError(
            f"decode_attention: visible must be bool [{batch}, {length}], got {visible.dtype} {list(visible.shape)}"
        )
    tile = tile_for(batch * kv_heads, dim)
    split_l = split_keys(batch * kv_heads, length, dim)
    splits = cdiv(length, split_l)
    out = torch.empty(batch, kv_heads, groups, dim, dtype=query.dtype, device=query.device)
    whole = splits == 1
    if whole:  # the split kernel writes the output: no partials, max or sum to keep, no merge
        partial = maxes = sums = out
    else:
        partial = query.new_empty(batch, kv_heads, splits, groups, dim, dtype=torch.float32)
        maxes = query.new_empty(batch, kv_heads, splits, groups, dtype=torch.float32)
        sums = torch.empty_like(maxes)
    d_pow2 = next_power_of_2(dim)
    pdl = launch_pdl(PDL_LAUNCH)
    decode_attention_kernel[(batch * kv_heads, splits)](
        query, key, value, visible, partial, maxes, sums,
        kv_heads, groups, length, dim, scale,
        query.stride(0), query.stride(1), query.stride(2),
        key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2),
        visible.stride(0), visible.stride(1),
        SPLIT_L=split_l, BLOCK_L=tile.keys, G_POW2=max(16, next_power_of_2(groups)), D_POW2=d_pow2,
        UPCAST=interpreted() or query.dtype == torch.float32, WHOLE=whole, PDL=pdl, launch_pdl=pdl,
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    if not whole:
        merge_splits_kernel[(batch * kv_heads * groups,)](
            partial, maxes, sums, out, groups, dim, splits, SPLITS_POW2=next_power_of_2(splits), D_POW2=d_pow2,
            PDL=pdl, launch_pdl=pdl,
        )  # fmt: skip
    return out


@decode_attention.register_fake
def _(query, key, value, visible, scale):
    return torch.empty_like(query)


def reference(query, key, value, visible, scale):
    """The same attention in plain torch: the query heads of a key-value head over its cache."""
    hidden = ~visible[:, None, :, None]  # a hidden slot may hold anything, NaN too: read as 0
    scores = (query.float() @ key.float().masked_fill(hidden, 0).transpose(-1, -2)) * scale  # [B, KV, G, L]
    scores = scores.masked_fill(hidden.transpose(-1, -2), float("-inf"))
    return (scores.softmax(-1) @ value.float().masked_fill(hidden, 0)).to(query.dtype)
