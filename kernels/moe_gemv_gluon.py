"""The NVFP4 expert bank at decode sizes, as two GEMV launches (Gluon).

At a few tokens a routed expert sees one token, so grouping token-expert pairs by expert (what
``moe_fused`` does, and what pays from tens of tokens on) is a launch that buys nothing: each
pair is simply a GEMV against its expert's rows, read through ``linear_gemv_gluon.rows_dot``.

1. ``gate_up``: one program per (block of N rows, pair); it reads the pair's expert id, computes
   the gate rows and the matching up rows, and stores ``silu(gate) * up`` for the pair.
2. ``down``: one program per (block of output rows, token); it walks the token's top-k experts
   and sums ``weight * down_e @ h_pair`` in registers, so the reduction needs no atomics and is
   deterministic.

H200, Qwen3-30B-A3B bank at one token: the grouped design took 41 us in three launches (the
first two bound by launch and decode, not bytes), against 5 us of routed NVFP4 bytes.
"""

from __future__ import annotations

import torch
import triton
from flashrt.kernels.linear_gemv_gluon import DECODE_FACTOR, rows_dot, rows_layout
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

_DECODE_FACTOR = gl.constexpr(DECODE_FACTOR)


@gluon.jit
def moe_gate_up_gemv_kernel(
    hidden_ptr,
    words_ptr,
    scales_ptr,
    global_scale_ptr,
    topk_ids_ptr,
    h_ptr,
    N,
    K,
    TOP_K,
    stride_xm,
    stride_hm,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    X_FP16: gl.constexpr,
    EVEN_K: gl.constexpr,
    ROWS: gl.constexpr,
    GROUPS: gl.constexpr,
    WARPS_N: gl.constexpr,
    WARPS_K: gl.constexpr,
    PREFETCH: gl.constexpr,
):
    BLOCK_N: gl.constexpr = ROWS * WARPS_N
    pid_n = gl.program_id(0)
    pair = gl.program_id(1)
    expert = gl.load(topk_ids_ptr + pair).to(gl.int64)
    x_row = hidden_ptr + (pair // TOP_K).to(gl.int64) * stride_xm
    words = words_ptr + expert * stride_we
    scales = scales_ptr + expert * stride_se
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_layout(ROWS, GROUPS, WARPS_N, WARPS_K))
    gate = rows_dot(
        x_row,
        words,
        scales,
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
        PREFETCH,
    )
    up = rows_dot(
        x_row,
        words,
        scales,
        offs_n + N,
        2 * N,
        K,
        stride_wn,
        stride_sn,
        X_FP16,
        EVEN_K,
        ROWS,
        GROUPS,
        WARPS_N,
        WARPS_K,
        PREFETCH,
    )
    scale = gl.load(global_scale_ptr + expert) * _DECODE_FACTOR
    gate = gate * scale
    h = gate / (1.0 + gl.exp(-gate)) * (up * scale)
    gl.store(h_ptr + pair.to(gl.int64) * stride_hm + offs_n, h.to(h_ptr.dtype.element_ty), mask=offs_n < N)


@gluon.jit
def moe_down_gemv_kernel(
    h_ptr,
    words_ptr,
    scales_ptr,
    global_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    out_ptr,
    N,
    K,
    TOP_K,
    stride_hm,
    stride_om,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    EVEN_K: gl.constexpr,
    ROWS: gl.constexpr,
    GROUPS: gl.constexpr,
    WARPS_N: gl.constexpr,
    WARPS_K: gl.constexpr,
    PREFETCH: gl.constexpr,
):
    """``out[t, rows] = sum_k weight[t, k] * down_e(k) @ h[t * TOP_K + k]``; N output rows, K = inter."""
    BLOCK_N: gl.constexpr = ROWS * WARPS_N
    pid_n = gl.program_id(0)
    token = gl.program_id(1).to(gl.int64)
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_layout(ROWS, GROUPS, WARPS_N, WARPS_K))
    acc = gl.zeros([BLOCK_N], gl.float32, layout=rows_layout(ROWS, GROUPS, WARPS_N, WARPS_K))
    for slot in range(0, TOP_K):
        pair = token * TOP_K + slot
        expert = gl.load(topk_ids_ptr + pair).to(gl.int64)
        part = rows_dot(
            h_ptr + pair * stride_hm,
            words_ptr + expert * stride_we,
            scales_ptr + expert * stride_se,
            offs_n,
            N,
            K,
            stride_wn,
            stride_sn,
            False,
            EVEN_K,
            ROWS,
            GROUPS,
            WARPS_N,
            WARPS_K,
            PREFETCH,
        )
        weight = gl.load(topk_weights_ptr + pair).to(gl.float32)
        acc += part * (gl.load(global_scale_ptr + expert) * _DECODE_FACTOR * weight)
    gl.store(out_ptr + token * stride_om + offs_n, acc.to(out_ptr.dtype.element_ty), mask=offs_n < N)


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
    """Two launches; ``gate_up``/``down`` are (packed, scales, global_scale) of the NVFP4 bank."""
    gu_packed, gu_scales, gu_global = gate_up
    dn_packed, dn_scales, dn_global = down
    if gu_scales is None:
        raise ValueError("gate_up: the GEMV expert form reads NVFP4 banks only, got a bf16 bank")
    t, k = hidden.shape
    _, two_n, _ = gu_packed.shape
    n = two_n // 2
    top_k = topk_ids.shape[1]
    pairs = t * top_k
    h = torch.empty(pairs, n, dtype=torch.bfloat16, device=hidden.device)
    gu_words, dn_words = gu_packed.view(torch.int32), dn_packed.view(torch.int32)
    gu_scales, dn_scales = gu_scales.view(torch.uint8), dn_scales.view(torch.uint8)
    ids = topk_ids.reshape(-1)
    block_n = config["ROWS"] * config["WARPS_N"]
    step = 32 * config["GROUPS"] * config["WARPS_K"]
    layout = {key: config[key] for key in ("ROWS", "GROUPS", "WARPS_N", "WARPS_K", "PREFETCH")}
    warps = config["WARPS_N"] * config["WARPS_K"]
    moe_gate_up_gemv_kernel[(triton.cdiv(n, block_n), pairs)](
        hidden,
        gu_words,
        gu_scales,
        gu_global,
        ids,
        h,
        n,
        k,
        top_k,
        hidden.stride(0),
        h.stride(0),
        gu_words.stride(0),
        gu_words.stride(1),
        gu_scales.stride(0),
        gu_scales.stride(1),
        X_FP16=hidden.dtype == torch.float16,
        EVEN_K=(k // 16) % step == 0,
        num_warps=warps,
        **layout,
    )
    moe_down_gemv_kernel[(triton.cdiv(k, block_n), t)](
        h,
        dn_words,
        dn_scales,
        dn_global,
        ids,
        topk_weights.reshape(-1),
        out,
        k,
        n,
        top_k,
        h.stride(0),
        out.stride(0),
        dn_words.stride(0),
        dn_words.stride(1),
        dn_scales.stride(0),
        dn_scales.stride(1),
        EVEN_K=(n // 16) % step == 0,
        num_warps=warps,
        **layout,
    )
    return out


def configs(t: int, n: int, k: int) -> list[dict]:
    """Candidates up to 16 tokens (128 pairs at top-8), on a compiled GPU (Gluon has no
    interpreter). Four rows a thread or fewer: one token's 8 experts x 768 rows is 6144 rows, so
    larger blocks would leave SMs idle; warps split K (2048 or 768 along a row) 1-4 ways."""
    from flashrt.kernels.decode import interpreted

    if t > 16 or interpreted() or k % 16 or n % 16:
        return []
    return [
        {"ROWS": rows, "GROUPS": groups, "WARPS_N": 4 // warps_k, "WARPS_K": warps_k, "PREFETCH": 1}
        for rows in (1, 2, 4)
        for groups in (1, 2)
        for warps_k in (1, 2, 4)
    ]
