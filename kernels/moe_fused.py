"""Fused NVFP4 MoE expert bank: ``out [T, K] = sum_j w_tj * down_e(silu(gate_e(x_t)) * up_e(x_t))``.

Weights: ``gate_up [E, 2N, K]`` (gate rows first, then up, as vLLM and transformers store
them) and ``down [E, K, N]``, both NVFP4 with one global scale per expert. Routing (softmax,
top-k, renormalize) stays with the caller; this op takes ``topk_ids``/``topk_weights [T, k]``.

Three launches for the whole bank, whatever the routing:

1. ``group``: token-expert pairs sorted by expert, each expert's run padded to BLOCK_M rows,
   plus each pair's row. One program per 128 pairs; each recounts the histogram itself
   (128 x E compares per step), cheaper than a second launch to share it.
2. ``gate_up``: for each BLOCK_M rows of one expert, ``silu(gate) * up`` on tensor cores
   (swap-AB as in ``linear_mma``), written to an intermediate ``[rows, N]`` in expert order.
3. ``down``: one program per (token, output tile) walks the token's k experts and sums
   ``w * (h @ down_e^T)`` in fp32, so the weighted reduce is fused, deterministic and needs no
   zeroed output. At decode sizes the down weights a token reads are mostly its own; above the
   MoE band, vLLM's host bank serves the rows (design.md, "MoE band dispatch").

Only the experts that the tokens route to are read: at one token that is 8 of 128 experts.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import cdiv, dot, interpreted, k_mask, load_weight_halves, next_power_of_2

GROUP_PAIRS = 128
# Warps of the group launch. Qwen3-30B-A3B's bank on the H200 (c58d18d, bench/probe_moe_group.py,
# h200-probe-moe-group-c58d18d.json): 1.76/3.19/5.67/6.58 us at 1/8/16/32 tokens against 4 warps'
# 1.86/3.66/6.33/6.94; 16 warps were within 0.14 us of 8 from 16 tokens on and 0.40 slower at one.
GROUP_WARPS = 8


@triton.jit
def moe_group_kernel(
    # pointers
    topk_ids_ptr,
    expert_offsets_ptr,
    expert_counts_ptr,
    sorted_pairs_ptr,
    pair_rows_ptr,
    # dimensions
    P,
    E,
    # meta-parameters
    E_POW2: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_e = tl.arange(0, E_POW2)
    offs_p = tl.arange(0, BLOCK_PAIRS)
    counts = tl.zeros((E_POW2,), dtype=tl.int32)
    before = tl.zeros((E_POW2,), dtype=tl.int32)
    for start in range(0, P, BLOCK_PAIRS):
        ids = tl.load(topk_ids_ptr + start + offs_p, mask=start + offs_p < P, other=E_POW2).to(tl.int32)
        hits = tl.sum((ids[:, None] == offs_e[None, :]).to(tl.int32), axis=0)
        counts += hits
        before += tl.where(start < pid * BLOCK_PAIRS, hits, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    offsets = tl.cumsum(padded, axis=0) - padded
    if pid == 0:
        tl.store(expert_offsets_ptr + offs_e, offsets, mask=offs_e < E)
        tl.store(expert_offsets_ptr + E, tl.sum(padded, axis=0))
        tl.store(expert_counts_ptr + offs_e, counts, mask=offs_e < E)

    mine = pid * BLOCK_PAIRS + offs_p
    ids = tl.load(topk_ids_ptr + mine, mask=mine < P, other=E_POW2).to(tl.int32)
    same_earlier = (ids[:, None] == ids[None, :]) & (offs_p[None, :] < offs_p[:, None])
    rank = tl.sum(same_earlier.to(tl.int32), axis=1)
    one_hot = (ids[:, None] == offs_e[None, :]).to(tl.int32)
    row = tl.sum(one_hot * (offsets + before)[None, :], axis=1) + rank
    tl.store(sorted_pairs_ptr + row, mine, mask=mine < P)
    tl.store(pair_rows_ptr + mine, row, mask=mine < P)


@triton.jit
def expert_rows(expert_offsets_ptr, expert_counts_ptr, E, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's BLOCK_M rows of the grouped layout (program axis 0): the expert whose
    padded run holds them (E when past the last run), that expert clamped to a valid index, the
    rows, and which of them hold a pair."""
    offs_e = tl.arange(0, E_POW2)
    row_start = tl.program_id(0) * BLOCK_M
    ends = tl.load(expert_offsets_ptr + 1 + offs_e, mask=offs_e < E, other=2**30)
    e = tl.sum((ends <= row_start).to(tl.int32), axis=0)
    e_safe = tl.minimum(e, E - 1)
    valid_end = tl.load(expert_offsets_ptr + e_safe) + tl.load(expert_counts_ptr + e_safe)
    rows = row_start + tl.arange(0, BLOCK_M)
    return e, e_safe, rows, rows < valid_end


@triton.jit
def moe_gate_up_kernel(
    # pointers
    x_ptr,
    packed_ptr,
    scales_ptr,
    global_scale_ptr,
    sorted_pairs_ptr,
    expert_offsets_ptr,
    expert_counts_ptr,
    h_ptr,
    # dimensions
    N,
    K,
    E,
    TOP_K,
    # strides (elements; packed rows in bytes, scale rows in scales)
    stride_xm,
    stride_hm,
    stride_wn,
    stride_sn,
    # meta-parameters
    WEIGHT_BF16: tl.constexpr,
    USE_PRMT: tl.constexpr,
    EVEN_K: tl.constexpr,
    INTERPRETED: tl.constexpr,
    E_POW2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(1)
    e, e_safe, rows, row_mask = expert_rows(expert_offsets_ptr, expert_counts_ptr, E, E_POW2, BLOCK_M)
    if e >= E:
        return
    HALF_K: tl.constexpr = BLOCK_K // 2

    tokens = tl.load(sorted_pairs_ptr + rows, mask=row_mask, other=0) // TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    gate_rows = e_safe.to(tl.int64) * 2 * N + offs_n.to(tl.int64)
    up_rows = gate_rows + N
    x_rows = x_ptr + tokens.to(tl.int64)[:, None] * stride_xm

    acc_gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x_mask = k_mask(row_mask, k0 + offs_k, K, EVEN_K)
        x = tl.load(x_rows + k0 + offs_k[None, :], mask=x_mask, other=0.0).to(tl.bfloat16)
        x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_M, HALF_K, 2)))
        x_even = tl.trans(x_even)
        x_odd = tl.trans(x_odd)
        lo, hi = load_weight_halves(
            packed_ptr,
            scales_ptr,
            gate_rows,
            n_mask,
            K,
            k0,
            stride_wn,
            stride_sn,
            BLOCK_N,
            BLOCK_K,
            USE_PRMT,
            EVEN_K,
            WEIGHT_BF16,
        )
        acc_gate = dot(lo, x_even, acc_gate, INTERPRETED)
        acc_gate = dot(hi, x_odd, acc_gate, INTERPRETED)
        lo, hi = load_weight_halves(
            packed_ptr, scales_ptr, up_rows, n_mask, K, k0, stride_wn, stride_sn,
            BLOCK_N, BLOCK_K, USE_PRMT, EVEN_K, WEIGHT_BF16,
        )  # fmt: skip
        acc_up = dot(lo, x_even, acc_up, INTERPRETED)
        acc_up = dot(hi, x_odd, acc_up, INTERPRETED)

    g_scale = tl.load(global_scale_ptr + e_safe)
    gate = acc_gate * g_scale
    h = gate / (1.0 + tl.exp(-gate)) * (acc_up * g_scale)
    out = h_ptr + rows.to(tl.int64)[None, :] * stride_hm + offs_n[:, None]
    tl.store(out, h.to(h_ptr.dtype.element_ty), mask=n_mask[:, None] & row_mask[None, :])


@triton.jit
def moe_down_kernel(
    # pointers
    h_ptr,
    packed_ptr,
    scales_ptr,
    global_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    pair_rows_ptr,
    out_ptr,
    # dimensions
    N,
    K,
    TOP_K,
    # strides (elements; packed rows in bytes, scale rows in scales)
    stride_hm,
    stride_om,
    stride_wn,
    stride_sn,
    # meta-parameters
    WEIGHT_BF16: tl.constexpr,
    USE_PRMT: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``out[t, n-tile] = sum_j w_tj * g_e * (h[row_tj] @ down_e[n-tile]^T)``; here the GEMM's
    reduction runs over the intermediate size (``K`` of this kernel is the bank's N)."""
    token = tl.program_id(0)
    pid_n = tl.program_id(1)
    HALF_K: tl.constexpr = BLOCK_K // 2
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_h = tl.arange(0, HALF_K)

    acc = tl.zeros((BLOCK_N, HALF_K), dtype=tl.float32)  # reduced across threads once, at the end
    for j in range(0, TOP_K):
        pair = token * TOP_K + j
        expert = tl.load(topk_ids_ptr + pair).to(tl.int64)
        weight = tl.load(topk_weights_ptr + pair).to(tl.float32)
        h_row = h_ptr + tl.load(pair_rows_ptr + pair).to(tl.int64) * stride_hm
        w_rows = expert * N + offs_n.to(tl.int64)
        part = tl.zeros((BLOCK_N, HALF_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            lo, hi = load_weight_halves(
                packed_ptr,
                scales_ptr,
                w_rows,
                n_mask,
                K,
                k0,
                stride_wn,
                stride_sn,
                BLOCK_N,
                BLOCK_K,
                USE_PRMT,
                EVEN_K,
                WEIGHT_BF16,
            )
            h_mask = (k0 + 2 * offs_h < K) | EVEN_K  # strided, not split: see linear_gemv
            h_even = tl.load(h_row + k0 + 2 * offs_h, mask=h_mask, other=0.0).to(tl.float32)
            h_odd = tl.load(h_row + k0 + 2 * offs_h + 1, mask=h_mask, other=0.0).to(tl.float32)
            part += lo.to(tl.float32) * h_even[None, :] + hi.to(tl.float32) * h_odd[None, :]
        acc += part * (weight * tl.load(global_scale_ptr + expert))
    acc = tl.sum(acc, axis=1)
    out = out_ptr + token.to(tl.int64) * stride_om + offs_n
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def max_rows(pairs: int, experts: int, block_m: int) -> int:
    """Rows the grouped layout can need: every routed expert's run rounded up to BLOCK_M."""
    return cdiv(pairs, block_m) * block_m + min(experts, pairs) * block_m


class Grouping(NamedTuple):
    """Token-expert pairs in expert order: each routed expert's run starts at
    ``expert_offsets[e]`` (padded to BLOCK_M rows) and holds ``expert_counts[e]`` pairs;
    ``sorted_pairs[row]`` is the pair (``token * top_k + slot``) a row holds, ``pair_rows[pair]``
    the row a pair landed on, ``rows`` the rows allocated (``max_rows``)."""

    expert_offsets: torch.Tensor
    expert_counts: torch.Tensor
    sorted_pairs: torch.Tensor
    pair_rows: torch.Tensor
    rows: int


def group_pairs(topk_ids: torch.Tensor, experts: int, block_m: int, num_warps: int = GROUP_WARPS) -> Grouping:
    """The ``group`` launch: one program per 128 pairs (``bench/probe_moe_group.py`` times its warps)."""
    pairs = topk_ids.numel()
    rows = max_rows(pairs, experts, block_m)
    device = topk_ids.device
    g = Grouping(
        torch.empty(experts + 1, dtype=torch.int32, device=device),
        torch.empty(experts, dtype=torch.int32, device=device),
        torch.empty(rows, dtype=torch.int32, device=device),
        torch.empty(pairs, dtype=torch.int32, device=device),
        rows,
    )
    block_pairs = min(GROUP_PAIRS, max(16, next_power_of_2(pairs)))
    moe_group_kernel[(cdiv(pairs, block_pairs),)](
        topk_ids.reshape(-1),
        g.expert_offsets,
        g.expert_counts,
        g.sorted_pairs,
        g.pair_rows,
        pairs,
        experts,
        E_POW2=next_power_of_2(experts),
        BLOCK_PAIRS=block_pairs,
        BLOCK_M=block_m,
        num_warps=num_warps,
    )
    return g


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
    """Three launches; ``gate_up``/``down`` are (packed, scales, global_scale) of the bank, or
    ``(bf16 weight, None, None)`` for the bf16 arm of the benchmark (same design, bf16 bytes)."""
    t, k = hidden.shape
    gu_packed, gu_scales, gu_global = gate_up
    dn_packed, dn_scales, dn_global = down
    weight_bf16 = gu_scales is None
    if weight_bf16:
        gu_scales = dn_scales = gu_packed.new_empty(0, dtype=torch.uint8)  # never read
        gu_global = dn_global = torch.ones(gu_packed.shape[0], dtype=torch.float32, device=hidden.device)
    e, two_n, _ = gu_packed.shape
    n = two_n // 2
    top_k = topk_ids.shape[1]
    block_m = config["BLOCK_M"]
    g = group_pairs(topk_ids, e, block_m)
    h = torch.empty(g.rows, n, dtype=torch.bfloat16, device=hidden.device)
    topk_flat = topk_ids.reshape(-1)
    moe_gate_up_kernel[(g.rows // block_m, cdiv(n, config["BLOCK_N"]))](
        hidden,
        gu_packed,
        gu_scales.view(torch.uint8),
        gu_global,
        g.sorted_pairs,
        g.expert_offsets,
        g.expert_counts,
        h,
        n,
        k,
        e,
        top_k,
        hidden.stride(0),
        h.stride(0),
        gu_packed.stride(1),
        gu_scales.stride(1) if not weight_bf16 else 0,
        WEIGHT_BF16=weight_bf16,
        USE_PRMT=use_prmt,
        EVEN_K=k % config["BLOCK_K"] == 0,
        INTERPRETED=interpreted(),
        E_POW2=next_power_of_2(e),
        BLOCK_M=block_m,
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    moe_down_kernel[(t, cdiv(k, config["DOWN_BLOCK_N"]))](
        h,
        dn_packed,
        dn_scales.view(torch.uint8),
        dn_global,
        topk_flat,
        topk_weights.reshape(-1),
        g.pair_rows,
        out,
        k,
        n,
        top_k,
        h.stride(0),
        out.stride(0),
        dn_packed.stride(1),
        dn_scales.stride(1) if not weight_bf16 else 0,
        WEIGHT_BF16=weight_bf16,
        USE_PRMT=use_prmt,
        EVEN_K=n % config["DOWN_BLOCK_K"] == 0,
        BLOCK_N=config["DOWN_BLOCK_N"],
        BLOCK_K=config["DOWN_BLOCK_K"],
        num_warps=config["down_num_warps"],
        num_stages=1,
    )
    return out


def configs(t: int, n: int, k: int) -> list[dict]:
    """Candidates for one (tokens, bank) shape.

    BLOCK_M 16 at decode (a routed expert sees one or two tokens), larger with more tokens;
    gate_up BLOCK_N 32-64 gives 12-24 programs an expert, so even one token's 8 experts fill
    most of 132 SMs; down BLOCK_N 16-32 rows a program: one token's 2048 outputs make 64-128
    programs, each walking 8 experts.
    """
    block_m = 16 if t <= 32 else (32 if t <= 128 else 64)
    return [
        {
            "BLOCK_M": block_m,
            "BLOCK_N": bn,
            "BLOCK_K": 128,
            "num_warps": 4,
            "num_stages": 3,
            "DOWN_BLOCK_N": dbn,
            "DOWN_BLOCK_K": dbk,
            "down_num_warps": 4,
        }
        for bn in (32, 64)
        for dbn, dbk in ((16, 256), (8, 512), (32, 128))
    ]
