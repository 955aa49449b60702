"""Weight-only NVFP4 linear for 17-512 tokens on Hopper's warpgroup MMA (Gluon, sm_90).

``y^T = W @ x^T`` (swap-AB) as ``linear_mma_gluon`` computes it, with the same ring of
``cp.async`` copies and the same bit-placement decode into ``mma.sync`` A-fragment registers,
but the product is ``wgmma``: its A operand may come from registers in exactly that fragment
layout (per warp it is ``mma.sync``'s), and its B operand, the activations, is read by the
tensor cores straight from the ring. ``mma.sync`` needs every warp to load the whole activation
step into registers for its 16 weight rows, a shared-memory read that grows with the tokens;
``wgmma`` takes the step once per warpgroup of 64 rows.

The decode chooses the K order of the pairs it makes (see ``linear_mma_gluon``); the ring form
permutes the activations to that order in registers, here the launcher permutes them once per
call (``permute_steps``: a copy of ``x``, 1 MB at 128 tokens of a 4096-wide layer), so the ring
holds them as the MMA reads them.

H200, the 28672 x 4096 gate_up at 128 tokens: Triton's own ``tl.dot`` on register-decoded
weights (``bench/probe_prefill.py``: wgmma through shared memory, one buffer) ran it in 100 us,
the plain-Triton ``linear_mma`` in 124; this form in 75 (c7a942a, ``h200-kernels-wgmma.json``),
cuBLAS bf16 in 67-72. At 64 tokens 47 us against ``mma_gluon``'s 72 and cuBLAS's 61.

Gluon does not run under ``TRITON_INTERPRET``; CI builds it for sm_90 (the only target with
``wgmma``) and the GPU suite checks it against the reference.
"""

from __future__ import annotations

import functools

import torch
from flashrt.kernels import ring_layout
from flashrt.kernels.decode import cdiv
from flashrt.kernels.linear_mma import SMS, split_ks
from flashrt.kernels.linear_mma_gluon import (
    BLOCK_K,
    V,
    _barrier,
    _fold_splits,
    _fragment,
    _lets_dependents_start,
    _prime,
    _refill,
    _scale_byte,
    _store_tile,
    _weight_offsets,
    launch_ring,
    words_layout,
)
from flashrt.kernels.permute_steps import permute_steps
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
from triton.language.extra.cuda import gdc_launch_dependents


@gluon.jit
def _decoded_chunk(
    words_step, scale_word, c: gl.constexpr, CHUNK_WORDS: gl.constexpr, A_OP: gl.constexpr, LAYOUT: gl.constexpr
):
    """The A fragment ``[rows, 64]`` of group ``c`` of a step (each thread's words 2c and 2c + 1
    and scale byte c): K positions ``64 c .. 64 c + 63`` of the permuted order."""
    words = words_step.slice(c, 1, dim=2).load(CHUNK_WORDS)
    return _fragment(words, _scale_byte(gl.expand_dims((scale_word >> (8 * c)) & 0xFF, 2)), A_OP, LAYOUT)


@gluon.jit
def nvfp4_linear_wgmma_gluon_kernel(
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
    # meta-parameters
    HAS_BIAS: gl.constexpr,
    BLOCK_M: gl.constexpr,
    ROW_TILES: gl.constexpr,
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    SPLIT_K: gl.constexpr,
    ASYNC_MMA: gl.constexpr,
    LAYOUT: gl.constexpr,
    PDL: gl.constexpr,
    FOLD: gl.constexpr,
):
    BLOCK_N: gl.constexpr = 16 * ROW_TILES * WARPS
    BLOCK_K: gl.constexpr = 32 * V
    ACC: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BLOCK_M, 16]
    )
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    CHUNK_WORDS: gl.constexpr = words_layout(ROW_TILES, WARPS, 2)  # one scale group: 64 of K
    CHUNKS: gl.constexpr = V // 2
    CHUNK_K: gl.constexpr = BLOCK_K // CHUNKS
    SCALES: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, CHUNK_WORDS))
    WORDS_COPY: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [WARPS, 1], [1, 0])
    ACTS_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    PLAIN: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    ACTS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    pid_k = gl.program_id(2)

    word_off, scale_off = _weight_offsets(pid_n, N, stride_wn, stride_sn, BLOCK_N, WORDS_COPY, SCALES)
    xr = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ACTS_COPY))
    xc = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, ACTS_COPY))
    tokens = pid_m * BLOCK_M + xr
    x_off = gl.expand_dims(tokens.to(gl.int64) * stride_xm, 1) + gl.expand_dims(xc, 0)
    x_mask = gl.expand_dims(tokens < M, 1)

    words_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 4 * V], PLAIN)
    scales_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 4], PLAIN)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], ACTS)

    per_split = gl.cdiv(K // BLOCK_K, SPLIT_K)
    first = pid_k * per_split
    steps = gl.minimum(per_split, K // BLOCK_K - first)
    _prime(
        words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, first, steps, word_off, scale_off, x_off,
        x_mask, STAGES, PDL=PDL,
    )  # fmt: skip

    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
    for i in range(steps):
        async_copy.wait_group(STAGES - 2)
        fence_async_shared()  # the ring's generic-proxy writes, before wgmma's async-proxy reads
        _barrier()
        _refill(
            i, words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, first, steps, word_off, scale_off,
            x_off, x_mask, STAGES,
        )  # fmt: skip
        slot = i % STAGES
        words_step = words_ring.index(slot).reshape([BLOCK_N, 4, V // 2, 2])
        scale_word = scales_ring.index(slot).load(SCALES)
        x_step = x_ring.index(slot)
        if ASYNC_MMA:  # chunk c + 1 decodes while chunk c multiplies; each A fragment lives until its MMA retires
            a = _decoded_chunk(words_step, scale_word, 0, CHUNK_WORDS, A_OP, LAYOUT)
            acc = warpgroup_mma(a, x_step.slice(0, CHUNK_K, dim=1).permute((1, 0)), acc, is_async=True)
            for c in gl.static_range(1, CHUNKS):
                a_next = _decoded_chunk(words_step, scale_word, c, CHUNK_WORDS, A_OP, LAYOUT)
                acc = warpgroup_mma(
                    a_next, x_step.slice(c * CHUNK_K, CHUNK_K, dim=1).permute((1, 0)), acc, is_async=True
                )
                acc, a = warpgroup_mma_wait(1, deps=[acc, a])
                a = a_next
            acc, a = warpgroup_mma_wait(0, deps=[acc, a])  # the ring slot is refilled next step
        else:
            for c in gl.static_range(CHUNKS):
                a = _decoded_chunk(words_step, scale_word, c, CHUNK_WORDS, A_OP, LAYOUT)
                acc = warpgroup_mma(a, x_step.slice(c * CHUNK_K, CHUNK_K, dim=1).permute((1, 0)), acc)
    async_copy.wait_group(0)
    if _lets_dependents_start(PDL, SPLIT_K, FOLD):  # every read of the ring done: the reduce may start
        gdc_launch_dependents()

    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
    mask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims(offs_m < M, 0)
    _store_tile(
        acc, offs_n, offs_m, mask, out_ptr, bias_ptr, global_scale_ptr, pid_k, M, N, stride_om, HAS_BIAS, SPLIT_K
    )
    if FOLD and SPLIT_K > 1:
        _fold_splits(
            offs_n, offs_m, mask, out_ptr, folded_ptr, bias_ptr, global_scale_ptr, arrivals_ptr,
            pid_m * gl.num_programs(0) + pid_n, M, N, stride_om, HAS_BIAS, SPLIT_K,
        )  # fmt: skip


def qualifies(capability: tuple[int, int] | None) -> bool:
    """``wgmma`` is sm_90a's alone: Blackwell has ``tcgen05`` instead, Ampere neither."""
    from flashrt.kernels.decode import interpreted

    return capability is not None and capability[0] == 9 and not interpreted()


def refuse_oversized_ring(config: dict, taken: int) -> None:
    """A ``ValueError`` for a config whose ring (``taken`` bytes) would not fit ``RING_BYTES``."""
    if taken > RING_BYTES:
        raise ValueError(f"config {config}: its ring takes {taken} bytes of shared memory, over {RING_BYTES}")


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
    """Run the kernel (``linear_mma_gluon.launch_ring``) after its permute and before its reduce,
    the three chained (``PDL_CHAIN``); ``use_prmt`` is unused. K in whole steps."""
    from flashrt.kernels.decode import interpreted

    refuse_oversized_ring(config, ring_bytes(config))
    kernel = nvfp4_linear_wgmma_gluon_kernel
    layout = config.get("LAYOUT", ring_layout.CHECKPOINT)
    chain = PDL_CHAIN and not interpreted()  # the permute runs interpreted on CPU, griddepcontrol would not
    return launch_ring(
        kernel, functools.partial(permute_steps, layout=layout, pdl=chain), x, packed, scales, global_scale, bias,
        out, config, pdl=chain, ASYNC_MMA=config["ASYNC_MMA"], LAYOUT=layout, PDL=chain,
    )  # fmt: skip


# The permute, the projection and its split-K reduce chained with programmatic dependent launch:
# each lets the next start before it ends, the projection copies its first steps' weights before
# it waits for the permuted activations, the reduce waits before it reads. In Llama-3-8B's
# 128-token prefill on the H200 (c8820f2, ``h200-e2e-llama-c8820f2-b1b8.json``) the seated
# graph took 10.78 ms of which its kernels 9.90: 0.88 ms between kernels, 160 of whose launches
# are these permutes (1.7 us each) and reduces (3.5 us), where cuBLAS's bf16 graph has none.
# Chained (0c15abf, ``h200-e2e-llama-0c15abf-b1.json``): 10.57 ms, 0.61 between kernels; the four
# projections alone, 32 layers in one graph (``bench/probe_prefill_gaps.py``, 97588c9): 187 us
# between kernels against 215 unchained and cuBLAS's 110.
PDL_CHAIN = True
# The weight's bits as the checkpoint has them, or in ``ring_layout`` (its activations permuted to match).
LAYOUTS = (ring_layout.CHECKPOINT, ring_layout.RING)
RING_BYTES = 224 << 10  # sm_90's 227 KiB a block, less the compiler's own
# The token counts it is offered for, whole adjudication buckets (17-32 ... 257-512). At 16 and
# under the ring form's 8-column MMA wastes nothing where this one's 64 would. H200: at 256
# tokens the adjudicator chose this form for gate_up, down and the LM head and dequant-then-
# cuBLAS for qkv (c7a942a, bench/results/h200-kernels-wgmma.json). At 512 (bddf04e,
# ``bench/probe_large_m.py``, ``h200-probe-large-m-bddf04e.json``) it beat the served dequant
# form on the LM head (671.7 against 851.4 us), Llama's gate_up and down (251.6 against 254.9,
# 126.8 against 128.3) and both expert-sized downs (9.3 against 11.0, 7.8 against 10.3), and lost
# on qkv and the expert-sized gate_ups; at 2048 dequant won all four shapes timed (the small
# ones, by 15-55%).
MIN_TOKENS = 17
MAX_TOKENS = 512


# ``ASYNC_MMA``: chunk c + 1 decoded while chunk c's wgmma is in flight, its A fragment kept
# live beside the next one. H200, both orders of every config offered at 64-256 tokens on the
# four Llama layers (221c29b, bench/results/h200-probe-wgmma-async.json): pipelined faster in
# 280 of the 285 configs whose accumulator is under 128 fp32 registers a thread (BLOCK_M x
# ROW_TILES < 256; median 5%, up to 16%), slower in all 35 at 128 (4-25%), where the second
# fragment spills (sm_90, Triton 3.6: 88 bytes of stack against 16). So the order follows from
# the tile and is not an axis to measure at attach.
ASYNC_MMA_SPILLS = 256


def ring_bytes(config: dict) -> int:
    """A step's words and scale bytes (144 bytes a row) and activations (512 bytes a token), times the stages."""
    block_n = 16 * config["ROW_TILES"] * config["WARPS"]
    return config["STAGES"] * (block_n * (4 * V * 4 + 16) + config["BLOCK_M"] * BLOCK_K * 2)


def configs(m: int, n: int, k: int) -> list[dict]:
    """Candidates for one shape.

    BLOCK_M, the token tile, is wgmma's N: 32 or 64 to 32 tokens, 64 to 64, 64 or 128 past
    that (the accumulator is ``BLOCK_M / 2`` fp32 registers a thread a row tile). H200, 32
    tokens (``bench/probe_wgmma_tokens.py``, ``h200-probe-wgmma-tokens-ad512bb.json``): a
    32-token tile ran Llama's gate_up in 36.4 us against 40.2 for the best of the ring form and
    the 64-token tile, qkv 13.75 against 13.88; tiles of 8 and 16 at 8 and 16 tokens lost to the
    ring form by 9-19%, which is why the form starts at 17. One or two warpgroups of one or two
    row tiles: 64-256 weight rows a program. That is the lever here, since every program reads
    the whole activation step from L2 for its rows: at 128 tokens and 128 rows, 3.6 bytes of
    activations for every byte of weight. STAGES 2-3 (a 128-token step is 64 KiB of ring).
    Split-K where the tiles make fewer than ``linear_mma.MIN_PROGRAMS`` programs, from the split
    that gives every SM one (``linear_mma.split_ks``).
    """
    from flashrt.kernels.decode import interpreted

    if interpreted() or k % BLOCK_K or not MIN_TOKENS <= m <= MAX_TOKENS:
        return []
    out = []
    for block_m in (64, 128) if m > 64 else (64,) if m > 32 else (32, 64):
        for tiles in (1, 2):
            for warps in (4, 8):
                for stages in (2, 3):
                    base = {"BLOCK_M": block_m, "ROW_TILES": tiles, "WARPS": warps, "STAGES": stages}
                    if ring_bytes(base) > RING_BYTES:
                        continue
                    base["ASYNC_MMA"] = int(block_m * tiles < ASYNC_MMA_SPILLS)
                    out.append(base)
                    programs = cdiv(n, 16 * tiles * warps) * cdiv(m, block_m)
                    out += [{**base, "SPLIT_K": s} for s in split_ks(programs, k, BLOCK_K, least=SMS)]
    return out
