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
from flashrt.kernels.decode import cdiv
from flashrt.kernels.linear_gemv_gluon import (
    DECODE_FACTOR,
    accumulate,
    load_step,
    rows_dot,
    rows_layout,
    step_offsets,
    words_layout,
)
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
):
    BLOCK_N: gl.constexpr = ROWS * WARPS_N
    pid_n = gl.program_id(0)
    pair = gl.program_id(1)
    expert = gl.load(topk_ids_ptr + pair).to(gl.int64)
    x_row = hidden_ptr + (pair // TOP_K).to(gl.int64) * stride_xm
    words = words_ptr + expert * stride_we
    scales = scales_ptr + expert * stride_se
    # Gate row j and up row j + N interleaved in one block: one pass over K reads both, so the
    # thread has twice the bytes in flight and one dependency chain instead of two.
    both = gl.arange(0, 2 * BLOCK_N, layout=rows_layout(2 * ROWS, GROUPS, WARPS_N, WARPS_K))
    rows = pid_n * BLOCK_N + both // 2
    rows = gl.where(rows < N, rows + (both % 2) * N, 2 * N)  # past the end: masked in rows_dot
    gate, up = gl.split(
        gl.reshape(
            rows_dot(
                x_row,
                words,
                scales,
                rows,
                2 * N,
                K,
                stride_wn,
                stride_sn,
                X_FP16,
                EVEN_K,
                2 * ROWS,
                GROUPS,
                WARPS_N,
                WARPS_K,
            ),
            (BLOCK_N, 2),
        )
    )
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gate.type.layout)
    scale = gl.load(global_scale_ptr + expert) * _DECODE_FACTOR
    gate = gate * scale
    h = gate / (1.0 + gl.exp(-gate)) * (up * scale)
    gl.store(h_ptr + pair.to(gl.int64) * stride_hm + offs_n, h.to(h_ptr.dtype.element_ty), mask=offs_n < N)


@gluon.jit
def _routed_step(
    words_ptr,
    scales_ptr,
    topk_ids_ptr,
    first,
    steps,
    stride_we,
    stride_se,
    groups_k,
    word_off,
    scale_off,
    row_mask,
    group,
    i,
    EVEN_K: gl.constexpr,
    STEP_GROUPS: gl.constexpr,
):
    """Step ``i`` of a token's walk over its experts' rows: step ``i % steps`` of slot ``i // steps``."""
    expert = gl.load(topk_ids_ptr + first + i // steps).to(gl.int64)
    return load_step(
        words_ptr + expert * stride_we,
        scales_ptr + expert * stride_se,
        (i % steps) * STEP_GROUPS,
        groups_k,
        word_off,
        scale_off,
        row_mask,
        group,
        EVEN_K,
    )


@gluon.jit
def _routed_rows_dot(
    h_ptr,
    words_ptr,
    scales_ptr,
    global_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    token,
    TOP_K,
    rows,
    n_rows,
    K,
    stride_hm,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    EVEN_K: gl.constexpr,
    ROWS: gl.constexpr,
    GROUPS: gl.constexpr,
    WARPS_N: gl.constexpr,
    WARPS_K: gl.constexpr,
):
    """``sum_slot weight * global_e * down_e[rows] @ h[pair]`` over a token's top-k experts, as
    one loop over (slot, step) with the next two steps always in flight, across expert
    boundaries: a loop per expert (``rows_dot`` each) waited out one HBM latency per expert per
    program (H200: 26 us for one token's 8 experts against 5 us of bytes). Two steps ahead
    instead of one: the Qwen3-30B bank 20.1/102.0 us to 19.5/99.7 at 1/8 tokens. Each slot's
    factor rides on its block scales."""
    WORDS: gl.constexpr = words_layout(ROWS, GROUPS, WARPS_N, WARPS_K)
    BLOCK_N: gl.constexpr = ROWS * WARPS_N
    STEP_GROUPS: gl.constexpr = 32 * GROUPS * WARPS_K
    row_mask, group, word_off, scale_off, x_group, pair_off = step_offsets(
        rows, n_rows, stride_wn, stride_sn, ROWS, GROUPS, WARPS_N, WARPS_K
    )

    groups_k = K // 16
    steps = gl.cdiv(groups_k, STEP_GROUPS)
    first = token * TOP_K
    last = TOP_K * steps - 1
    walk = (words_ptr, scales_ptr, topk_ids_ptr, first, steps, stride_we, stride_se, groups_k, word_off, scale_off)
    w, scale = _routed_step(*walk, row_mask, group, 0, EVEN_K, STEP_GROUPS)
    w1, scale1 = _routed_step(*walk, row_mask, group, gl.minimum(1, last), EVEN_K, STEP_GROUPS)
    acc = gl.zeros([BLOCK_N, STEP_GROUPS, 2], gl.float32, layout=WORDS)
    for i in range(0, TOP_K * steps):
        pair = first + i // steps
        g0 = (i % steps) * STEP_GROUPS
        # Two steps ahead, across expert boundaries; the last steps re-read the last.
        w2, scale2 = _routed_step(*walk, row_mask, group, gl.minimum(i + 2, last), EVEN_K, STEP_GROUPS)
        expert = gl.load(topk_ids_ptr + pair).to(gl.int64)
        factor = gl.load(global_scale_ptr + expert) * gl.load(topk_weights_ptr + pair).to(gl.float32)
        x_pairs = (h_ptr + pair * stride_hm).to(gl.pointer_type(gl.int32), bitcast=True)
        acc = accumulate(acc, w, scale, factor, x_pairs, g0, groups_k, x_group, pair_off, False)
        w, scale, w1, scale1 = w1, scale1, w2, scale2
    return gl.sum(gl.sum(acc, axis=2), axis=1) * _DECODE_FACTOR


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
):
    """``out[t, rows] = sum_k weight[t, k] * down_e(k) @ h[t * TOP_K + k]``; N output rows, K = inter."""
    BLOCK_N: gl.constexpr = ROWS * WARPS_N
    pid_n = gl.program_id(0)
    token = gl.program_id(1).to(gl.int64)
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_layout(ROWS, GROUPS, WARPS_N, WARPS_K))
    acc = _routed_rows_dot(
        h_ptr,
        words_ptr,
        scales_ptr,
        global_scale_ptr,
        topk_ids_ptr,
        topk_weights_ptr,
        token,
        TOP_K,
        offs_n,
        N,
        K,
        stride_hm,
        stride_we,
        stride_wn,
        stride_se,
        stride_sn,
        EVEN_K,
        ROWS,
        GROUPS,
        WARPS_N,
        WARPS_K,
    )
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
    if gu_scales is None:
        raise ValueError("gate_up: the GEMV expert form reads NVFP4 banks only, got a bf16 bank")
    t, k = hidden.shape
    _, two_n, _ = gu_packed.shape
    n = two_n // 2
    top_k = topk_ids.shape[1]
    pairs = t * top_k
    h = torch.empty(pairs, n, dtype=torch.bfloat16, device=hidden.device)
    gu_words, gu_scales = gu_packed.view(torch.int32), gu_scales.view(torch.uint8)
    ids = topk_ids.reshape(-1)
    block_n = config["ROWS"] * config["WARPS_N"]
    step = 32 * config["GROUPS"] * config["WARPS_K"]
    layout = {key: config[key] for key in ("ROWS", "GROUPS", "WARPS_N", "WARPS_K")}
    warps = config["WARPS_N"] * config["WARPS_K"]
    moe_gate_up_gemv_kernel[(cdiv(n, block_n), pairs)](
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
    return launch_down(h, down, topk_ids, topk_weights, out, layout)


def launch_down(
    h: torch.Tensor, down: tuple, topk_ids: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor, layout: dict
) -> torch.Tensor:
    """The down launch: ``out[t] = sum_k weight[t, k] * down_e(k) @ h[t * TOP_K + k]`` for
    ``h [pairs, N]`` (also ``moe_ring_gluon``'s); ``layout`` the GEMV's ROWS, GROUPS, WARPS_N,
    WARPS_K."""
    dn_packed, dn_scales, dn_global = down
    t, top_k = topk_ids.shape
    k, n = dn_packed.shape[1], h.shape[1]
    dn_words, dn_scales = dn_packed.view(torch.int32), dn_scales.view(torch.uint8)
    step = 32 * layout["GROUPS"] * layout["WARPS_K"]
    moe_down_gemv_kernel[(cdiv(k, layout["ROWS"] * layout["WARPS_N"]), t)](
        h,
        dn_words,
        dn_scales,
        dn_global,
        topk_ids.reshape(-1),
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
        num_warps=layout["WARPS_N"] * layout["WARPS_K"],
        **layout,
    )
    return out


def configs(t: int, n: int, k: int) -> list[dict]:
    """Candidates up to 16 tokens (128 pairs at top-8), on a compiled GPU (Gluon has no
    interpreter). Two or four rows a thread (gate_up doubles them: gate and up rows): one token's
    8 experts x 768 rows is 6144 rows, so larger blocks would leave SMs idle; warps split K (2048
    or 768 along a row) 1-4 ways. One row a thread and 16-byte loads never won on the H200
    (bench/results/h200-kernels-acd7a4e.json, h200-moe-band.json). Both kernels keep the next step in
    flight."""
    from flashrt.kernels.decode import interpreted

    if t > 16 or interpreted() or k % 16 or n % 16:
        return []
    return [
        {"ROWS": rows, "GROUPS": 1, "WARPS_N": 4 // warps_k, "WARPS_K": warps_k}
        for rows in (2, 4)
        for warps_k in (1, 2, 4)
    ]
