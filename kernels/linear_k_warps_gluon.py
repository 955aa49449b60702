"""Weight-only NVFP4 linear at 4-16 tokens: the ring form with K split across a program's warps (Gluon).

At 8 tokens the tokens fill ``mma.sync``'s 8 columns, so the ring form (``linear_mma_gluon``)
cannot cut rows in chunks as it does at 1-4 tokens, and Llama-3-8B's layers reach every SM only
by splitting K: each split stores fp32 partials and a reduce launch sums them. On the H200 that
is where the one-token forms' efficiency went: qkv 6.80 us at one token and 8.90 at 8, down
12.35 and 14.94, gate_up 21.18 and 25.59 (``h200-kernels.json``); the seated batch-8 step spent
201 us in 128 reduce launches, 162 of them not overlapped (``h200-e2e-llama-c8396f9-b1b8.json``).
Folding the sum into the last split to arrive lost (``linear_mma_gluon.FOLD_SPLITS``).

Here warp ``w`` of a program takes chunk ``w // ROW_WARPS`` of K for its rows, as the chunked
forms' MMA rows take theirs, but multiplies it by its own chunk of the activations: a batched
``mma.sync`` (``[K_WARPS, rows, tokens]``, the warps along the batch), then one sum across the
warps through shared memory and the output stored in bf16. No partials, no reduce launch, no
atomics. ``ROW_WARPS`` warps share a chunk, each on its own 16 rows. The cost: a program reads
its tokens' whole K of activations from L2 (at 8 tokens and 16 rows twice the weight's bytes),
and a ring stage holds ``K_WARPS`` activation steps.

H100, each from HBM, same run (``bench/probe_k_warps.py``,
``h100-probe-k-warps-98c9f4f.json``), best of this form against the config each card's tuning
table serves: at 8 tokens Llama's qkv 8.08 against 10.13 us, o 6.83 against 8.41, gate_up 26.84
against 30.02, down 15.06 against 16.81; at 16 tokens o 7.86 against 8.64, but qkv 10.72
against 9.83, gate_up 29.89 against 27.11 and down 17.46 against 16.82. So it is offered up to
16 tokens and the adjudicator picks. End to end on the H100 it served every projection and
the LM head of Llama-3-8B at batch 8: 2.37x bf16, 2.27x before it (4c57cb1 against d9dac6f,
``h100-e2e-llama-b8-4c57cb1.json``); the step gained 121 us where the standalone times promised
275, since under PDL the splits' launches had overlapped their neighbours. Under 8 tokens its
8-token tile runs with columns empty (H100, a9ec47d, ``h100-probe-k-warps-1-4-a9ec47d.json``):
at 4 tokens it beat the chunked forms served there on qkv (8.19 against 8.84 us), o (7.03
against 7.13) and down (15.53 against 16.08), not on gate_up (28.19 against 26.58); at one token
it lost on all four by 6-16%. So it is offered from 4 tokens.

The decode, the ring and its copies are the ring form's (``_prime``, ``_refill``,
``_weights_fragment``): a ring row is a row of a chunk, and the decoded fragment of every warp's
rows is reshaped, with no data moved, into the batched MMA's operand.
"""

from __future__ import annotations

import torch
from flashrt.kernels import linear_mma_gluon as ring
from flashrt.kernels.decode import cdiv, launch_pdl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.language.extra.cuda import gdc_launch_dependents

V = ring.V
BLOCK_K = ring.BLOCK_K
_BLOCK_K = gl.constexpr(BLOCK_K)
LAYOUTS = ring.LAYOUTS
# Tokens a launch must have for this form to be offered: at 1-3 the chunked ring forms fill the
# MMA's empty columns with chunks instead (at one token 6-16% faster on the H100, a9ec47d); at 4
# this form won three of Llama's four layers there.
MIN_TOKENS = 4
MAX_TOKENS = 16
K_WARPS = (2, 4, 8)
ROW_WARPS = (1, 2)
STAGES = (2, 3, 4)


@gluon.constexpr_function
def acts_layout(block_m, k_warps, row_warps):
    """A ring stage's activation steps ``[K_WARPS, 4 BLOCK_M, 8V]`` as the warps read them:
    ``linear_mma_gluon.activations_layout``, warp ``w`` on chunk ``w // ROW_WARPS``'s step."""
    run = 8 * ring.WORDS_PER_THREAD
    reg = [[0, 0, 1 << i] for i in range(run.bit_length() - 1)]
    reg += [[0, 32 << i, 0] for i in range((block_m // 8).bit_length() - 1)]
    lanes = [[0, 1, 0], [0, 2, 0], [0, 4, 0], [0, 8, 0], [0, 16, 0]]
    warps = [[0, 0, 0]] * (row_warps.bit_length() - 1) + [[1 << i, 0, 0] for i in range(k_warps.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, lanes, warps, [], [k_warps, 4 * block_m, run])


@gluon.jit
def _ring_rows(
    j, pid_n, N, stride, chunk, K_WARPS: gl.constexpr, ROW_WARPS: gl.constexpr, SILU_MUL: gl.constexpr = False
):  # fmt: skip
    """Where ring row ``j`` starts: ``words_layout(1, K_WARPS x ROW_WARPS)`` puts row ``r + 16 w``
    on warp ``w``, which takes chunk ``w // ROW_WARPS`` of the program's rows ``16 (w % ROW_WARPS)
    + r`` (the batched MMA's rows; paired for ``SILU_MUL``, ``ring.paired_row``). Rows past the
    end read the last one (never stored)."""
    w = j // 16
    rows = gl.minimum(pid_n * (16 * ROW_WARPS) + 16 * (w % ROW_WARPS) + j % 16, N - 1)
    return ring.paired_row(rows, N, SILU_MUL).to(gl.int64) * stride + (w // ROW_WARPS) * chunk


@gluon.jit
def nvfp4_linear_k_warps_gluon_kernel(
    x_ptr, words_ptr, scales_ptr, global_scale_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_om, stride_wn,
    stride_sn, chunk_words, chunk_scales, residual_ptr, norm_weight_ptr, weighted_ptr, sumsq_ptr, eps,
    HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr, K_WARPS: gl.constexpr, ROW_WARPS: gl.constexpr,
    STAGES: gl.constexpr, LAYOUT: gl.constexpr, PDL: gl.constexpr, SILU_MUL: gl.constexpr = False,
    ADD_NORM: gl.constexpr = False, NORM_SCALE: gl.constexpr = False, NORM_GROUP: gl.constexpr = 16,
):  # fmt: skip
    WARPS: gl.constexpr = K_WARPS * ROW_WARPS
    ROWS: gl.constexpr = 16 * ROW_WARPS
    RING_ROWS: gl.constexpr = ROWS * K_WARPS
    MMA_M: gl.constexpr = ring.mma_tokens(BLOCK_M)
    WORDS: gl.constexpr = ring.words_layout(1, WARPS)
    SCALES: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, WORDS))
    WORDS_COPY: gl.constexpr = ring.words_copy_layout(WARPS)
    ACTS_COPY: gl.constexpr = ring.acts_copy_layout(WARPS)
    ACC: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[K_WARPS, ROW_WARPS, 1], instr_shape=[1, 16, 8]
    )
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=ACC, k_width=2)
    PLAIN: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    SWIZZLED: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, order=[1, 0])

    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)

    wr = gl.arange(0, RING_ROWS, layout=gl.SliceLayout(1, WORDS_COPY))
    wc = gl.arange(0, 4 * V, layout=gl.SliceLayout(0, WORDS_COPY))
    word_off = gl.expand_dims(_ring_rows(wr, pid_n, N, stride_wn, chunk_words, K_WARPS, ROW_WARPS, SILU_MUL), 1)
    word_off = word_off + gl.expand_dims(wc, 0)
    sr = gl.arange(0, RING_ROWS, layout=gl.SliceLayout(1, SCALES))
    st = gl.arange(0, 4, layout=gl.SliceLayout(0, SCALES))
    scale_off = gl.expand_dims(_ring_rows(sr, pid_n, N, stride_sn, chunk_scales, K_WARPS, ROW_WARPS, SILU_MUL), 1)
    scale_off = scale_off + gl.expand_dims(st, 0)
    # activation ring row i: quarter i % 4 of token (i // 4) % BLOCK_M, chunk i // (4 BLOCK_M)
    xr = gl.arange(0, 4 * BLOCK_M * K_WARPS, layout=gl.SliceLayout(1, ACTS_COPY))
    xc = gl.arange(0, 8 * V, layout=gl.SliceLayout(0, ACTS_COPY))
    tokens = pid_m * BLOCK_M + (xr // 4) % BLOCK_M
    chunk = xr // (4 * BLOCK_M)
    x_off = gl.expand_dims(tokens.to(gl.int64) * stride_xm + chunk * (8 * chunk_words) + (xr % 4) * (8 * V), 1)
    x_off = x_off + gl.expand_dims(xc, 0)
    x_mask = gl.expand_dims(tokens < M, 1)
    steps = K // K_WARPS // _BLOCK_K

    words_ring = gl.allocate_shared_memory(gl.int32, [STAGES, RING_ROWS, 4 * V], ring.words_shared_layout())
    scales_ring = gl.allocate_shared_memory(gl.int32, [STAGES, RING_ROWS, 4], PLAIN)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 4 * BLOCK_M * K_WARPS, 8 * V], SWIZZLED)
    ring._prime(
        words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, 0, steps, word_off, scale_off, x_off,
        x_mask, STAGES, PDL=PDL,
    )  # fmt: skip

    acc = gl.zeros([K_WARPS, ROWS, MMA_M], gl.float32, layout=ACC)
    for i in range(steps):
        async_copy.wait_group(STAGES - 2)  # this thread's copies of step i have landed
        ring._barrier()  # everyone's have, and everyone is done with the slot refilled next
        ring._refill(
            i, words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, 0, steps, word_off, scale_off, x_off,
            x_mask, STAGES,
        )  # fmt: skip
        slot = i % STAGES
        words = words_ring.index(slot).reshape([RING_ROWS, 4, V // 2, 2]).load(WORDS)
        a = ring._weights_fragment(words, scales_ring.index(slot).load(SCALES), WARPS, LAYOUT)
        a = gl.convert_layout(gl.reshape(a, (K_WARPS, ROWS, _BLOCK_K)), A_OP, assert_trivial=True)
        x = x_ring.index(slot).reshape([K_WARPS, 4 * BLOCK_M, 8 * V]).load(acts_layout(BLOCK_M, K_WARPS, ROW_WARPS))
        if LAYOUT == 1:  # ring_layout.RING: the ring form's activation order, a chunk a warp
            x = gl.permute(gl.reshape(x, (K_WARPS, MMA_M, 4, V, 2, 2, 2)), (0, 3, 4, 5, 2, 6, 1))
        else:
            x = gl.permute(gl.reshape(x, (K_WARPS, MMA_M, 4, V, 2, 2, 2)), (0, 3, 5, 6, 2, 4, 1))
        b = gl.convert_layout(gl.reshape(x, (K_WARPS, _BLOCK_K, MMA_M)), B_OP, assert_trivial=True)
        acc = mma_v2(a, b, acc)
    async_copy.wait_group(0)
    if ring._lets_dependents_start(PDL, 1, False, ADD_NORM or NORM_SCALE):
        gdc_launch_dependents()

    total = gl.sum(acc, axis=0)  # [ROWS, MMA_M]: across the warps, through shared memory
    ring._store_product(
        total, pid_n, pid_m, 0, out_ptr, bias_ptr, global_scale_ptr, M, N, K, stride_om, HAS_BIAS, BLOCK_M, 1, 1,
        WARPS, SILU_MUL=SILU_MUL, ADD_NORM=ADD_NORM, NORM_SCALE=NORM_SCALE, NORM_GROUP=NORM_GROUP,
        residual_ptr=residual_ptr, norm_weight_ptr=norm_weight_ptr, weighted_ptr=weighted_ptr, sumsq_ptr=sumsq_ptr,
        eps=eps,
    )  # fmt: skip


def ring_bytes(config: dict) -> int:
    """Shared memory of a config's ring: ``K_WARPS`` chunks of the rows' step (144 bytes a row)
    and of the tokens' (512 bytes a token), times the stages."""
    rows = 16 * config["ROW_WARPS"] * config["K_WARPS"]
    acts = config["K_WARPS"] * config["BLOCK_M"] * BLOCK_K * 2
    return config["STAGES"] * (rows * (4 * V * 4 + 16) + acts)


def configs(m: int, n: int, k: int) -> list[dict]:
    """Candidates for one shape: ``MIN_TOKENS`` to ``MAX_TOKENS`` tokens in one token tile of 8
    or 16, K in whole ring steps a chunk, rings that fit, at most 8 warps, on a compiled GPU. One
    row tile a warp: two were within 1% of the best everywhere on the H100 (98c9f4f)."""
    from flashrt.kernels.decode import interpreted

    if interpreted() or not MIN_TOKENS <= m <= MAX_TOKENS:
        return []
    block_m = 8 if m <= 8 else 16
    out = []
    for k_warps in K_WARPS:
        for row_warps in ROW_WARPS:
            for stages in STAGES:
                c = {"BLOCK_M": block_m, "K_WARPS": k_warps, "ROW_WARPS": row_warps, "STAGES": stages}
                if k_warps * row_warps <= 8 and k % (k_warps * BLOCK_K) == 0 and ring_bytes(c) <= ring.RING_BYTES:
                    out.append(c)
    return out


def launch(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    config: dict,
    use_prmt: bool,
    add_norm: ring.AddNorm | None = None,
    norm_scale: ring.NormScale | None = None,
) -> torch.Tensor:
    """``out = x @ W^T`` (+ bias), one launch; ``use_prmt`` is unused. bf16 activations, K in
    whole ring steps a chunk. Launched with PDL as the ring form is (``linear_mma_gluon.PDL_LAUNCH``).
    ``SILU_MUL`` in ``config``: ``out [M, N / 2]``, as the ring form's (``ring.paired_row``).
    ``add_norm``, ``norm_scale``: a residual add and RMSNorm in the epilogue (``ring.norm_operands``)."""
    ring.check_ring_operands(x, packed, scales)
    m, k = x.shape
    n = packed.shape[0]
    k_warps = config["K_WARPS"]
    silu_mul = bool(config.get("SILU_MUL", False))
    if silu_mul:
        ring.check_silu_mul(n, 16 * config["ROW_WARPS"], bias, out)
    if k % (k_warps * BLOCK_K):
        raise ValueError(f"K={k} with K_WARPS={k_warps}: each warp's chunk of K must be whole {BLOCK_K}-wide steps")
    norm = ring.norm_operands(out, 16 * config["ROW_WARPS"], 1, add_norm, norm_scale)
    x = ring.aligned_activations(x)
    chunk_words = k // 8 // k_warps
    pdl = launch_pdl(ring.PDL_LAUNCH)
    grid = (cdiv(n, 16 * config["ROW_WARPS"]), cdiv(m, config["BLOCK_M"]))
    nvfp4_linear_k_warps_gluon_kernel[grid](
        x, packed.view(torch.int32), scales.view(torch.uint8).view(torch.int32), global_scale,
        bias if bias is not None else out, out, m, n, k, x.stride(0), out.stride(0), packed.stride(0) // 4,
        scales.stride(0) // 4, chunk_words, chunk_words // 8, HAS_BIAS=bias is not None, BLOCK_M=config["BLOCK_M"],
        K_WARPS=k_warps, ROW_WARPS=config["ROW_WARPS"], STAGES=config["STAGES"], LAYOUT=config.get("LAYOUT", 0),
        PDL=pdl, SILU_MUL=silu_mul, num_warps=k_warps * config["ROW_WARPS"], launch_pdl=pdl, **norm,
    )  # fmt: skip
    return out
