"""Weight-only NVFP4 linear on tensor cores: ``y [M, N] = x [M, K] @ dequant(W)[N, K]^T + bias``.

The weight is decoded in registers and fed to ``tl.dot`` as the *left* operand: the kernel
computes ``y^T = W @ x^T`` (swap-AB), so a tile of weight rows fills the MMA's M side (64/128,
what wgmma wants) and the few tokens of a decode step sit on its N side. The decoded weight
never goes to shared memory; only the small activation tile does.

Each byte holds two neighbours along K, so the kernel splits the activation tile into even and
odd columns (``tl.split``) and issues two dots per K step, one per nibble, with no interleave.

Block scales (one E4M3 per 16 weights) are applied while decoding (exact in bf16); the global
scale and the bias are applied once in the epilogue.

Split-K (``SPLIT_K`` > 1): at decode token counts a layer with few weight rows has too few
programs to keep HBM busy (H200, 16 tokens: the 4096 x 14336 down projection made 64 programs
for 132 SMs and ran at 0.13 of copy bandwidth, 58 us against cuBLAS bf16's 33). Each program
then covers a K range, writes fp32 partials, and ``splitk_reduce_kernel`` sums them in split
order (deterministic), scales, adds the bias and casts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import cdiv, dot, interpreted, k_mask, load_nvfp4_halves, next_power_of_2
from triton.language.extra.cuda import gdc_wait


@triton.jit
def nvfp4_linear_mma_kernel(
    # pointers
    x_ptr,
    packed_ptr,
    scales_ptr,
    global_scale_ptr,
    bias_ptr,
    out_ptr,
    # dimensions
    M,
    N,
    K,
    K_SPLIT,  # K each split covers, a multiple of BLOCK_K (K when SPLIT_K is 1)
    # strides (elements; packed rows in bytes, scale rows in scales)
    stride_xm,
    stride_om,
    stride_wn,
    stride_sn,
    # meta-parameters
    HAS_BIAS: tl.constexpr,
    USE_PRMT: tl.constexpr,
    EVEN_K: tl.constexpr,
    INTERPRETED: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    HALF_K: tl.constexpr = BLOCK_K // 2

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    rows = offs_n.to(tl.int64)
    x_row = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_start = pid_k * K_SPLIT
    for k0 in range(k_start, tl.minimum(k_start + K_SPLIT, K), BLOCK_K):
        lo, hi = load_nvfp4_halves(
            packed_ptr, scales_ptr, rows, n_mask, K, k0, stride_wn, stride_sn, BLOCK_N, BLOCK_K, USE_PRMT, EVEN_K
        )
        x_mask = k_mask(m_mask, k0 + offs_k, K, EVEN_K)
        x = tl.load(x_row + k0 + offs_k[None, :], mask=x_mask, other=0.0).to(tl.bfloat16)
        x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_M, HALF_K, 2)))
        acc = dot(lo, tl.trans(x_even), acc, INTERPRETED)
        acc = dot(hi, tl.trans(x_odd), acc, INTERPRETED)

    mask = n_mask[:, None] & m_mask[None, :]
    if SPLIT_K > 1:  # fp32 partials [SPLIT_K, M, N]; the reduce applies scale and bias
        part = out_ptr + (pid_k * M + offs_m.to(tl.int64))[None, :] * N + offs_n[:, None]
        tl.store(part, acc, mask=mask)
    else:
        acc = acc * tl.load(global_scale_ptr)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        out = out_ptr + offs_m.to(tl.int64)[None, :] * stride_om + offs_n[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def splitk_reduce_kernel(
    part_ptr,
    global_scale_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    stride_om,
    SPLIT_K: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    SILU_MUL: tl.constexpr = False,
):
    """``SILU_MUL``: the partials' columns are a gate-and-up projection's rows in pairs (column
    ``2p`` gate ``p``, ``2p + 1`` up ``p``; ``linear_mma_gluon.paired_row``) and output column
    ``p`` is ``silu(gate) * up`` of their sums (no bias)."""
    if PDL:  # launched with PDL: the partials are read only once the kernel that writes them is done
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if SILU_MUL:
        mask = offs < N // 2
        gate = tl.zeros((BLOCK,), dtype=tl.float32)
        up = tl.zeros((BLOCK,), dtype=tl.float32)
        for split in tl.static_range(SPLIT_K):
            gate += tl.load(part_ptr + (split * M + row) * N + 2 * offs, mask=mask, other=0.0)
            up += tl.load(part_ptr + (split * M + row) * N + 2 * offs + 1, mask=mask, other=0.0)
        if HAS_SCALE:
            gate = gate * tl.load(global_scale_ptr)
            up = up * tl.load(global_scale_ptr)
        acc = gate * tl.sigmoid(gate) * up
    else:
        mask = offs < N
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for split in tl.static_range(SPLIT_K):  # every split's load in flight at once
            acc += tl.load(part_ptr + (split * M + row) * N + offs, mask=mask, other=0.0)
        if HAS_SCALE:
            acc = acc * tl.load(global_scale_ptr)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


# Elements a reduce program, largest first. At 1024 alone, the 16-token expert bank's grouped down
# reduced its [8, 16, 2048] partials in 32 programs, each loading its 8 splits one after another:
# 5.4 us a layer, 0.26 ms of a 7.16 ms Qwen3-30B step (H200, 427f4ad,
# bench/results/h200-e2e-qwen3-attn-b16.json), for 1 MB; at one token 2 programs did a layer's.
REDUCE_BLOCKS = (1024, 512, 256, 128)


def reduce_block(m: int, n: int) -> int:
    """The largest block that still launches ``MIN_PROGRAMS`` programs for ``[m, n]``, else the smallest."""
    return next((b for b in REDUCE_BLOCKS if m * cdiv(n, b) >= MIN_PROGRAMS), REDUCE_BLOCKS[-1])


def split_target(out: torch.Tensor, split: int, rows: int | None = None) -> torch.Tensor:
    """Where a launch split ``split`` ways along K writes: ``out`` itself when unsplit, else fp32
    partials ``[split, M, rows]`` for ``reduce_splits`` (``rows``: the weight's, where the output
    has fewer columns, as a SiLU-and-mul launch's half; default ``out``'s columns)."""
    if split == 1:
        return out
    m, n = out.shape
    return torch.empty(split, m, rows or n, dtype=torch.float32, device=out.device)


def reduce_splits(
    partials: torch.Tensor,
    global_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    pdl: bool = False,
    silu_mul: bool = False,
) -> None:
    """``out = sum of partials in split order * global_scale + bias``: one launch, deterministic.
    No global scale: the partials carry theirs (the ring expert downs fold them into h). ``pdl``:
    launched to start while the kernel before it finishes (one that lets it:
    ``gdc_launch_dependents``), waiting for it before the first load. ``silu_mul``: the partials
    are a gate-and-up projection's rows in pairs, and ``out [M, rows / 2]`` their SiLU-and-mul."""
    split, m, n = partials.shape
    block = reduce_block(m, out.shape[1])
    splitk_reduce_kernel[(m, cdiv(out.shape[1], block))](
        partials, global_scale if global_scale is not None else out, bias if bias is not None else out, out, m, n,
        out.stride(0), SPLIT_K=split, HAS_SCALE=global_scale is not None, HAS_BIAS=bias is not None,
        BLOCK=block, PDL=pdl, SILU_MUL=silu_mul, num_warps=4, launch_pdl=pdl,
    )  # fmt: skip


# Programs a launch should have at least before splitting K pays: two per SM of an H200 (132).
MIN_PROGRAMS = 264
# One program per SM of an H200: where the ``wgmma`` form's splits start (``split_ks``'s ``least``).
SMS = 132


def split_ks(programs: int, k: int, block_k: int, least: int = MIN_PROGRAMS) -> list[int]:
    """The K splits worth offering for a launch of ``programs`` tiles: the powers of two from the
    first that brings it to ``least`` programs to the one past the first that brings it to
    ``MIN_PROGRAMS``, each split at least two ``block_k`` steps, at most 16. Where K is too short
    for the first, the largest that fits: H200, 64 tokens (``bench/probe_large_m.py``,
    ``h200-probe-large-m-ws-7fbdb27.json``), Qwen3-30B's and Qwen3.5's expert-sized gate_ups (1536
    and 1024 x 2048: 48 and 32 programs of 32 rows) split in four ran 6.90 and 6.78 us against 11.09 and
    10.98 unsplit, where bf16 takes 6.5 and 6.3.

    ``least=SMS`` for the ``wgmma`` form at 17-512 tokens, whose programs hold a whole 128-token
    step: on the H200 (``bench/probe_prefill_splits.py``, ``h200-probe-prefill-splits-2463e7c.json``)
    Llama's 4096 x 4096 o_proj at 128 tokens ran 128 tiles split in two (256 programs of 8 steps)
    in 17.97 us, against 20.08 for the best config offered before (split in four) and 21.11 for
    the ring form's tuned one; the 4096 x 14336 down 45.86 against 46.41."""
    most = k // (2 * block_k)  # each split at least two steps
    if most < 2:
        return []
    first = min(next_power_of_2(cdiv(least, programs)), 1 << (min(most, 16).bit_length() - 1))
    last = 2 * next_power_of_2(cdiv(MIN_PROGRAMS, programs))
    return [s for s in (1 << e for e in range(1, 5)) if first <= s <= last and s <= most]


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
    """Run the kernel; ``x``/``out`` are ``[M, K]``/``[M, N]`` with unit stride along the last dim."""
    m, k = x.shape
    n = packed.shape[0]
    split = config.get("SPLIT_K", 1)
    k_split = cdiv(cdiv(k, split), config["BLOCK_K"]) * config["BLOCK_K"]
    split = cdiv(k, k_split)
    target = split_target(out, split)
    grid = (cdiv(n, config["BLOCK_N"]), cdiv(m, config["BLOCK_M"]), split)
    nvfp4_linear_mma_kernel[grid](
        x,
        packed,
        scales.view(torch.uint8),
        global_scale,
        bias if bias is not None else out,
        target,
        m,
        n,
        k,
        k_split,
        x.stride(0),
        out.stride(0),
        packed.stride(0),
        scales.stride(0),
        HAS_BIAS=bias is not None,
        USE_PRMT=use_prmt,
        EVEN_K=k % config["BLOCK_K"] == 0,
        INTERPRETED=interpreted(),
        SPLIT_K=split,
        BLOCK_M=config["BLOCK_M"],
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    if split > 1:
        reduce_splits(target, global_scale, bias, out)
    return out


def configs(m: int, n: int, k: int) -> list[dict]:
    """Candidates the adjudicator times for one shape.

    BLOCK_M follows the token count (16 is the smallest dot side); BLOCK_N 64 or 128 matches
    wgmma's M of one or two warpgroups; BLOCK_K 128-256 keeps 64-128 bytes of each weight row
    in flight per step, the smallest that issues 16-byte loads for every thread. Where the
    tiles make fewer than ``MIN_PROGRAMS`` programs, split-K variants that reach it are offered
    too (each split at least two BLOCK_K steps).
    """
    if k % 16:
        return []
    block_ms = [bm for bm in (16, 32, 64, 128) if bm // 2 < max(m, 16) or bm == 16]
    out = []
    for bm in block_ms[-2:]:
        for bn in (64, 128):
            for bk in (128, 256):
                base = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 4, "num_stages": 3}
                out.append(base)
                programs = cdiv(n, bn) * cdiv(m, bm)
                out += [{**base, "SPLIT_K": s} for s in split_ks(programs, k, bk)]
    return out
