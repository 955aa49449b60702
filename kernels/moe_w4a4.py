"""NVFP4 x NVFP4 expert bank (W4A4) on Blackwell's block-scaled FP4 tensor cores.

The same function as ``moe_fused`` with both GEMMs' activations quantized per row to NVFP4, so
both main loops are ``tl.dot_scaled(e2m1, e4m3, e2m1, e4m3)`` (``UTCOMMA.4X`` on sm_100/sm_110,
``OMMA...E2M1.E2M1.UE4M3`` on sm_120: CI checks the SASS). Six launches for the whole bank:

1. ``group`` (``moe_fused.group_pairs``): pairs in expert order, runs padded to BLOCK_M rows.
2. ``quantize_rows`` of ``hidden``: one global scale per token.
3. ``gate_up``: swap-AB (the expert's 128 weight rows are the MMA's M, the run's tokens its N,
   so one token still fills a tensor-core tile), ``silu(gate) * up`` -> ``h [rows, N]`` bf16.
4. ``quantize_rows`` of ``h``: one global scale per row (a token's activation for one expert).
5. ``down``: grouped like gate_up; each row's result times its routing weight -> ``y [rows, K]``
   fp32.
6. ``reduce``: ``out[t] = sum_j y[row of (t, j)]`` in slot order: deterministic, no atomics.

The weighted reduce cannot be fused into ``down`` as ``moe_fused`` does, because there one
program walks a token's experts with CUDA-core dot products, and here a program owns one
expert's tile of rows. Padded rows of a run hold whatever ``h`` held; their codes and scales
are garbage but each output row depends only on its own input row, and none is stored.

Quantizing activations changes the function, so the form ranks below the W4A16 forms
(``PRECISION``): the adjudicator seats it only on a clear win, above the parity floor.
``moe_w4a4_reference`` is the arithmetic in plain torch, in the same two stages as the launches
(``gate_up_reference``, ``down_reference``), so each stage is checked on its own input: quantizing
``h`` amplifies a one-ulp difference (a row's amax moves its global scale and flips codes near
their rounding boundaries), so the composed form agrees with the composed reference only to a
few percent on small banks. Under ``TRITON_INTERPRET=1`` the kernels multiply the decoded tiles
instead of calling ``dot_scaled`` (``decode.dot_nvfp4``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from flashrt.kernels import linear_w4a4
from flashrt.kernels.decode import cdiv, dot_nvfp4, interpreted, load_nvfp4_codes, next_power_of_2
from flashrt.kernels.moe_fused import Grouping, expert_rows, group_pairs
from flashrt.kernels.nvfp4 import NVFP4Weight, dequantize, quantize_reference
from flashrt.kernels.quantizer import quantize_rows

PRECISION = linear_w4a4.PRECISION
REDUCE_BLOCK = 512  # outputs a reduce program sums: 2048-wide hidden -> 4 programs a token


@triton.jit
def moe_gate_up_w4a4_kernel(
    # pointers
    xq_ptr,
    xs_ptr,
    xg_ptr,
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
    # strides (packed rows in bytes, scale rows in scales, h in elements)
    stride_xm,
    stride_xsm,
    stride_hm,
    stride_wn,
    stride_sn,
    # meta-parameters
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
    tokens = tl.load(sorted_pairs_ptr + rows, mask=row_mask, other=0) // TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    gate_rows = e_safe.to(tl.int64) * 2 * N + offs_n.to(tl.int64)
    up_rows = gate_rows + N
    x_rows = tokens.to(tl.int64)

    acc_gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xq, xs = load_nvfp4_codes(xq_ptr, xs_ptr, x_rows, row_mask, K, k0, stride_xm, stride_xsm, BLOCK_K, EVEN_K)
        wq, ws = load_nvfp4_codes(
            packed_ptr, scales_ptr, gate_rows, n_mask, K, k0, stride_wn, stride_sn, BLOCK_K, EVEN_K
        )
        acc_gate = dot_nvfp4(wq, ws, xq, xs, acc_gate, INTERPRETED)
        wq, ws = load_nvfp4_codes(packed_ptr, scales_ptr, up_rows, n_mask, K, k0, stride_wn, stride_sn, BLOCK_K, EVEN_K)
        acc_up = dot_nvfp4(wq, ws, xq, xs, acc_up, INTERPRETED)

    scale = tl.load(global_scale_ptr + e_safe) * tl.load(xg_ptr + tokens, mask=row_mask, other=0.0)[None, :]
    gate = acc_gate * scale
    h = gate / (1.0 + tl.exp(-gate)) * (acc_up * scale)
    out = h_ptr + rows.to(tl.int64)[None, :] * stride_hm + offs_n[:, None]
    tl.store(out, h.to(h_ptr.dtype.element_ty), mask=n_mask[:, None] & row_mask[None, :])


@triton.jit
def moe_down_w4a4_kernel(
    # pointers
    hq_ptr,
    hs_ptr,
    hg_ptr,
    packed_ptr,
    scales_ptr,
    global_scale_ptr,
    sorted_pairs_ptr,
    topk_weights_ptr,
    expert_offsets_ptr,
    expert_counts_ptr,
    y_ptr,
    # dimensions (this GEMM's N is the bank's hidden size, its K the intermediate size)
    N,
    K,
    E,
    # strides (packed rows in bytes, scale rows in scales, y in elements)
    stride_hm,
    stride_hsm,
    stride_ym,
    stride_wn,
    stride_sn,
    # meta-parameters
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
    pairs = tl.load(sorted_pairs_ptr + rows, mask=row_mask, other=0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_rows = e_safe.to(tl.int64) * N + offs_n.to(tl.int64)
    h_rows = rows.to(tl.int64)

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        hq, hs = load_nvfp4_codes(hq_ptr, hs_ptr, h_rows, row_mask, K, k0, stride_hm, stride_hsm, BLOCK_K, EVEN_K)
        wq, ws = load_nvfp4_codes(packed_ptr, scales_ptr, w_rows, n_mask, K, k0, stride_wn, stride_sn, BLOCK_K, EVEN_K)
        acc = dot_nvfp4(wq, ws, hq, hs, acc, INTERPRETED)

    row_scale = tl.load(hg_ptr + rows, mask=row_mask, other=0.0)
    row_scale *= tl.load(topk_weights_ptr + pairs, mask=row_mask, other=0.0).to(tl.float32)
    acc = acc * (tl.load(global_scale_ptr + e_safe) * row_scale)[None, :]
    out = y_ptr + rows.to(tl.int64)[None, :] * stride_ym + offs_n[:, None]
    tl.store(out, acc, mask=n_mask[:, None] & row_mask[None, :])


@triton.jit
def moe_reduce_kernel(y_ptr, pair_rows_ptr, out_ptr, K, TOP_K, stride_ym, stride_om, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < K
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(0, TOP_K):
        row = tl.load(pair_rows_ptr + token * TOP_K + j).to(tl.int64)
        acc += tl.load(y_ptr + row * stride_ym + offs, mask=mask, other=0.0)
    tl.store(out_ptr + token.to(tl.int64) * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def gate_up_reference(hidden: torch.Tensor, gate_up: NVFP4Weight, topk_ids: torch.Tensor) -> torch.Tensor:
    """Stage one in plain torch, float64: per-token NVFP4 ``hidden``, then for every pair
    ``silu(gate) * up`` of its expert, rounded to bf16 as the kernel stores it -> ``[T, k, N]``."""
    n = gate_up.packed.shape[1] // 2
    x = _fake_quant(hidden)
    h = torch.empty(*topk_ids.shape, n, dtype=torch.bfloat16, device=hidden.device)
    for expert in topk_ids.unique().tolist():
        token, slot = (topk_ids == expert).nonzero(as_tuple=True)
        gu = dequantize(gate_up.expert(expert), torch.float64)
        y = x[token] @ gu.t()
        h[token, slot] = (F.silu(y[:, :n]) * y[:, n:]).to(torch.bfloat16)
    return h


def down_reference(
    h: torch.Tensor, down: NVFP4Weight, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """Stage two in plain torch, float64: each pair's ``h [T, k, N]`` through per-row NVFP4, its
    expert's down projection, weighted sum over the pairs -> ``[T, K]`` float64."""
    t, top_k, n = h.shape
    hq = _fake_quant(h.reshape(t * top_k, n)).reshape(t, top_k, n)
    out = torch.zeros(t, down.packed.shape[1], dtype=torch.float64, device=h.device)
    for expert in topk_ids.unique().tolist():
        token, slot = (topk_ids == expert).nonzero(as_tuple=True)
        dn = dequantize(down.expert(expert), torch.float64)
        out.index_add_(0, token, (hq[token, slot] @ dn.t()) * topk_weights[token, slot].double()[:, None])
    return out


def moe_w4a4_reference(
    hidden: torch.Tensor, gate_up: NVFP4Weight, down: NVFP4Weight, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """The form's arithmetic in plain torch (both stages), returned in ``hidden``'s dtype."""
    h = gate_up_reference(hidden, gate_up, topk_ids)
    return down_reference(h, down, topk_ids, topk_weights).to(hidden.dtype)


def _fake_quant(x: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` through per-row NVFP4 and back, float64."""
    q = quantize_reference(x.reshape(x.shape[0], 1, x.shape[1]).cpu())
    return dequantize(q, torch.float64)[:, 0].to(x.device)


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
    """Six launches (module docstring); ``gate_up``/``down`` are (packed, scales, global_scale);
    ``use_prmt`` is unused (nothing is decoded to bf16)."""
    g = group_pairs(topk_ids, gate_up[0].shape[0], config["BLOCK_M"])
    h = launch_gate_up(hidden, gate_up, topk_ids.shape[1], g, config)
    return launch_down(h, down, topk_weights, g, out, config)


def launch_gate_up(hidden: torch.Tensor, gate_up: tuple, top_k: int, g: Grouping, config: dict) -> torch.Tensor:
    """Launches 2-3: ``quantize_rows(hidden)`` and the gate_up GEMM -> ``h [rows, N]`` bf16."""
    k = hidden.shape[1]
    gu_packed, gu_scales, gu_global = gate_up
    e, two_n, _ = gu_packed.shape
    n = two_n // 2
    block_m = config["BLOCK_M"]
    xq = quantize_rows(hidden)
    h = torch.empty(g.rows, n, dtype=torch.bfloat16, device=hidden.device)
    moe_gate_up_w4a4_kernel[(g.rows // block_m, cdiv(n, config["BLOCK_N"]))](
        xq.packed,
        xq.scales.view(torch.uint8),
        xq.global_scale,
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
        xq.packed.stride(0),
        xq.scales.stride(0),
        h.stride(0),
        gu_packed.stride(1),
        gu_scales.stride(1),
        EVEN_K=k % config["BLOCK_K"] == 0,
        INTERPRETED=interpreted(),
        E_POW2=next_power_of_2(e),
        BLOCK_M=block_m,
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    return h


def launch_down(
    h: torch.Tensor, down: tuple, topk_weights: torch.Tensor, g: Grouping, out: torch.Tensor, config: dict
) -> torch.Tensor:
    """Launches 4-6: ``quantize_rows(h)``, the down GEMM into ``y``, the reduce into ``out``."""
    t, k = out.shape
    n = h.shape[1]
    dn_packed, dn_scales, dn_global = down
    e = dn_packed.shape[0]
    block_m = config["BLOCK_M"]
    top_k = topk_weights.shape[1]
    hq = quantize_rows(h)
    y = torch.empty(g.rows, k, dtype=torch.float32, device=h.device)
    moe_down_w4a4_kernel[(g.rows // block_m, cdiv(k, config["DOWN_BLOCK_N"]))](
        hq.packed,
        hq.scales.view(torch.uint8),
        hq.global_scale,
        dn_packed,
        dn_scales.view(torch.uint8),
        dn_global,
        g.sorted_pairs,
        topk_weights.reshape(-1),
        g.expert_offsets,
        g.expert_counts,
        y,
        k,
        n,
        e,
        hq.packed.stride(0),
        hq.scales.stride(0),
        y.stride(0),
        dn_packed.stride(1),
        dn_scales.stride(1),
        EVEN_K=n % config["DOWN_BLOCK_K"] == 0,
        INTERPRETED=interpreted(),
        E_POW2=next_power_of_2(e),
        BLOCK_M=block_m,
        BLOCK_N=config["DOWN_BLOCK_N"],
        BLOCK_K=config["DOWN_BLOCK_K"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    moe_reduce_kernel[(t, cdiv(k, REDUCE_BLOCK))](
        y, g.pair_rows, out, k, top_k, y.stride(0), out.stride(0), BLOCK=REDUCE_BLOCK, num_warps=4
    )
    return out


def qualifies(capability: tuple[int, int] | None) -> bool:
    """Where ``linear_w4a4`` is: the block-scaled FP4 tensor cores, compute major 10 and up."""
    return linear_w4a4.qualifies(capability)


def configs(t: int, n: int, k: int) -> list[dict]:
    """Weight rows a program (the MMA's M, swap-AB): 128, the 5th-generation tensor core's M;
    tokens a run (BLOCK_M, the MMA's N): 16 at decode, more with more tokens; BLOCK_K 128 or
    256 (64-128 bytes of codes a row a step) for each GEMM."""
    if k % 16 or n % 16:
        return []
    block_m = 16 if t <= 32 else (32 if t <= 128 else 64)
    return [
        {
            "BLOCK_M": block_m,
            "BLOCK_N": 128,
            "BLOCK_K": bk,
            "DOWN_BLOCK_N": 128,
            "DOWN_BLOCK_K": dbk,
            "num_warps": 4,
            "num_stages": 3,
        }
        for bk in (128, 256)
        for dbk in (128, 256)
    ]
