"""Weight-only NVFP4 linear: the ring form with its slots filled by TMA, warp-specialized (Gluon).

``mma_gluon``'s tiling, chunks, splits, decode and MMA (its own functions), its ring filled the
way ``wgmma_ws_gluon`` fills its own: one producer warp copies each step's weight words, scale
words and activations into a slot with three TMA copies under one mbarrier, and the MMA warps
wait for the slot, load it into registers, release it and decode. Why: after its decode, what
separates the ring form from a kernel that only reads the same bytes (Llama's gate_up at one
token 19.73 us against 16.48, ``bench/probe_decode_cost.py``, 4140803) is how its slots are
filled. There every thread computes the addresses of its 16-byte ``cp.async`` copies (64-bit
adds), issues them (7 ``LDGSTS`` a step a thread at one token), counts them and meets the others
at a CTA barrier. Here the MMA warps issue no copy and meet only among themselves: in the sm_90
SASS (``bench/sass_loop.py``, the H200's Triton 3.6) one step of gate_up at one token is 306
instructions with 2 barriers against the ring's 343 at 4 warps (337 at the 2 it is served with),
and 329 against 379 at 16 tokens.

The boxes land in the layouts the ring's loads already read: 128-byte swizzling XORs a row's
16-byte chunk with the row, as ``linear_mma_gluon.words_shared_layout`` and the activations'
swizzle do. The descriptors view the rows in chunks (``[N, CHUNKS, K / CHUNKS]`` and the like),
so a box's rows are the ring's program rows ``CHUNKS n + c`` and its activation rows ``4 (CHUNKS
t + c) + q`` in the ring's order; rows and tokens past the operands' ends arrive as zeros. A
one-token tile loads two token rows: a one-row box in the swizzled layout does not build (Triton
3.6: "Illegal shared layout"), and the MMA has 8 columns either way.

``warp_specialize`` takes warpgroups: a program is 4 or 8 MMA warps and the producer's
warpgroup, and the launch's register cap (``registers``) decides how many programs share an SM
(``PROGRAMS``), where the ring form keeps several small programs' copies in flight. TMA slots
cost no registers, so the ring can be deeper than ``cp.async``'s 2-4 stages. The programs are
persistent: ``PROGRAMS`` an SM, each taking every so-many-th tile, its ring running on from one
tile's steps into the next's (the producer fills the next tile's slots while the MMA warps store
the last): a program's ring fills once, not once a tile.

Not offered unless ``OFFERED`` (``--mma-ws`` on the ``kernels`` and ``e2e`` benchmarks): fewer
instructions did not make it faster. On an H100, twice at 22973c7 (``bench/probe_tma_ring.py``,
``bench/results/h100-probe-tma-ring-22973c7*.json``), the served ring beat it on Llama's and
Qwen3-30B's layers at 1, 8 and 16 tokens (by 17-25% on Llama's qkv at one token) but for the
LM head, where the form ran 2.5-4.7% faster at 1 and 16 tokens, and ties on Llama's gate_up at 8
and 16. Not timed on an H200 or on Blackwell. A wait on an mbarrier that never completes hangs
the GPU (488c899's lost step count, ``_first_step``): its GPU test runs in a process of its own.
"""

from __future__ import annotations

import functools

import torch
from flashrt.kernels import linear_mma_gluon, linear_wgmma_gluon, ring_layout
from flashrt.kernels.decode import cdiv, launch_pdl
from flashrt.kernels.linear_mma import SMS, reduce_splits, split_ks, split_target
from flashrt.kernels.linear_mma_gluon import (
    BLOCK_K,
    WORDS_PER_THREAD,
    V,
    _copyable,
    _store_product,
    _times_activations,
    _weights_fragment,
    acts_load_layout,
    aligned_activations,
    mma_tokens,
    require_bf16,
    words_layout,
)
from flashrt.kernels.linear_wgmma_ws_gluon import _PRODUCER_REGISTERS, register_cap
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

# Offered to the adjudicator: off, since the ring won where a GPU timed both (the module's
# docstring); the LM head's 3 us a step does not pay for every shape's extra candidates at attach.
OFFERED = False
# (MMA warps, stages, programs an SM): 4 MMA warps at two and three programs an SM (register caps
# 128 and 80; no spills at 80 in the sm_90 build), 3 and 4 stages. On the H100 (22973c7, both
# probe runs) these four were the fastest shape in all 36 rows, 3 stages in 31; 6 stages and 8
# MMA warps never were, and are no longer offered.
SHAPES = ((4, 3, 2), (4, 3, 3), (4, 4, 2), (4, 4, 3))
# An SM's shared memory (sm_90, sm_100): a config whose programs' rings would not fit together is left out.
SM_SHARED_BYTES = 228 << 10
# The weight's bits as the checkpoint has them (Blackwell's and Thor's seats) or in ``ring_layout``
# (Hopper's, ``ops.for_serving``), as the ring form reads them.
LAYOUTS = linear_mma_gluon.LAYOUTS

# A row's step of weight words (32 words, 128 bytes) and a token's step of activations in four
# 64-wide quarters (128 bytes each): 128-byte swizzling puts chunk c of row r at c ^ (r % 8), the
# ring's own shared layouts. The scale words (16 bytes a row a step) go unswizzled, as the ring's.
WORDS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=3)
SCALES_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
ACTS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4)


@gluon.jit
def _tile(tile, n_tiles, m_tiles, chunk_steps, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, SPLIT_K: gl.constexpr,
          CHUNKS: gl.constexpr):  # fmt: skip
    """Tile ``tile``'s row tile, token tile and split (row tiles fastest), its first step and step
    count (none past the last), and the first row and token of its boxes in the chunked views of
    ``descriptors``."""
    pid_n = tile % n_tiles
    pid_m = (tile // n_tiles) % m_tiles
    pid_k = tile // (n_tiles * m_tiles)
    per_split = gl.cdiv(chunk_steps, SPLIT_K)
    first = pid_k * per_split
    steps = gl.maximum(gl.minimum(per_split, chunk_steps - first), 0)
    return pid_n, pid_m, pid_k, first, steps, pid_n * (BLOCK_N // CHUNKS), pid_m * (BLOCK_M // CHUNKS)


@gluon.jit
def _first_step():
    """The ring's step counter, which both partitions carry across a program's tiles, counting each
    step they take. Carried out of the step loop: counted as ``done += steps`` beside that loop
    (488c899), the MMA warps' count was lost (Triton 3.6's gluon-inline made their tile loop yield
    its own argument), so each of their tiles began again at slot 0 and phase 0 while the producer
    counted on, and a program's second tile waited forever (the H100,
    ``bench/results/h100-probe-tma-ring-488c899.log``). Unsigned: its slot is a cheaper modulo."""
    return gl.to_tensor(0).to(gl.uint32)


@gluon.jit
def _ring_place(it, STAGES: gl.constexpr):
    """Step ``it``'s slot and the parity of its pass through the ring."""
    return (it % STAGES).to(gl.int32), ((it // STAGES) & 1).to(gl.int32)


@gluon.jit
def _producer(
    words_desc, scales_desc, x_desc, words_ring, scales_ring, x_ring, full, empty, n_tiles, m_tiles, tiles,
    chunk_steps, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, SPLIT_K: gl.constexpr,
    CHUNKS: gl.constexpr, PDL: gl.constexpr,
):  # fmt: skip
    """The program's tiles' steps, one after the other, into the ring: step ``it`` (counted across
    tiles) into slot ``it % STAGES`` once the MMA warps have released it (a fresh mbarrier passes
    the phase before its first). ``PDL``: the first tile's first ``STAGES`` steps' weights, which
    no kernel writes, are copied before ``gdc_wait``, every activation copy after it."""
    NBYTES: gl.constexpr = words_desc.block_type.nbytes + scales_desc.block_type.nbytes + x_desc.block_type.nbytes
    primed = 0
    if PDL:
        _, _, _, first, steps, row0, _ = _tile(
            gl.program_id(0), n_tiles, m_tiles, chunk_steps, BLOCK_N, BLOCK_M, SPLIT_K, CHUNKS
        )
        primed = gl.minimum(steps, STAGES)
        for i in range(primed):  # fresh slots: nothing to wait for
            mbarrier.expect(full.index(i), NBYTES)
            _copy_weights(words_desc, scales_desc, words_ring, scales_ring, full.index(i), i, row0, first + i)
        gdc_wait()
    it = _first_step()
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        _, _, _, first, steps, row0, tok0 = _tile(
            tile, n_tiles, m_tiles, chunk_steps, BLOCK_N, BLOCK_M, SPLIT_K, CHUNKS
        )
        for at in range(first, first + steps):
            slot, phase = _ring_place(it, STAGES)
            bar = full.index(slot)
            if it >= primed:
                mbarrier.wait(empty.index(slot), phase ^ 1)
                mbarrier.expect(bar, NBYTES)
                _copy_weights(words_desc, scales_desc, words_ring, scales_ring, bar, slot, row0, at)
            _tma_load(x_desc, [tok0, 0, 4 * at, 0], bar, x_ring.index(slot))
            it += 1


@gluon.jit
def _copy_weights(words_desc, scales_desc, words_ring, scales_ring, bar, slot, row0, at):
    """Step ``at``'s weight words and scale words into ring slot ``slot``."""
    _tma_load(words_desc, [row0, 0, 4 * V * at], bar, words_ring.index(slot))
    _tma_load(scales_desc, [row0, 0, (V // 2) * at], bar, scales_ring.index(slot))


@gluon.jit
def _consumer(
    words_ring, scales_ring, x_ring, full, empty, n_tiles, m_tiles, tiles, chunk_steps, global_scale_ptr, bias_ptr,
    out_ptr, M, N, stride_om, HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr, WARPS: gl.constexpr,
    STAGES: gl.constexpr, SPLIT_K: gl.constexpr, CHUNKS: gl.constexpr, LAYOUT: gl.constexpr,
):  # fmt: skip
    """The MMA warps, tile after tile: each step's slot loaded into the ring form's registers and
    released before its decode, each tile's product stored as the ring form stores its own."""
    BLOCK_N: gl.constexpr = 16 * WARPS
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    SCALES: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, words_layout(1, WARPS)))
    it = _first_step()
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        pid_n, pid_m, pid_k, _, steps, _, _ = _tile(
            tile, n_tiles, m_tiles, chunk_steps, BLOCK_N, BLOCK_M, SPLIT_K, CHUNKS
        )
        acc = gl.zeros([BLOCK_N, mma_tokens(BLOCK_M)], gl.float32, layout=ACC)
        for _ in range(steps):
            slot, phase = _ring_place(it, STAGES)
            mbarrier.wait(full.index(slot), phase)
            words = words_ring.index(slot).reshape([BLOCK_N, 4, V // 2, 2]).load(words_layout(1, WARPS))
            scales = scales_ring.index(slot).reshape([BLOCK_N, 4]).load(SCALES)
            x = x_ring.index(slot).reshape([4 * BLOCK_M, 8 * V]).load(acts_load_layout(BLOCK_M, WARPS))
            mbarrier.arrive(empty.index(slot), count=1)
            acc = _times_activations(acc, _weights_fragment(words, scales, WARPS, LAYOUT), x, BLOCK_M, WARPS, LAYOUT)
            it += 1
        _store_product(
            acc, pid_n, pid_m, pid_k, out_ptr, bias_ptr, global_scale_ptr, M, N, 0, stride_om, HAS_BIAS, BLOCK_M,
            SPLIT_K, CHUNKS, WARPS,
        )  # fmt: skip


@gluon.jit
def nvfp4_linear_mma_ws_gluon_kernel(
    words_desc,
    scales_desc,
    x_desc,
    global_scale_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_om,
    HAS_BIAS: gl.constexpr,
    BLOCK_M: gl.constexpr,
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    SPLIT_K: gl.constexpr,
    CHUNKS: gl.constexpr,
    LAYOUT: gl.constexpr,
    PDL: gl.constexpr = False,
):
    """``out = x @ W^T`` (+ bias) in tiles of ``16 WARPS`` program rows (weight rows, or chunks of
    them), ``BLOCK_M`` MMA columns (tokens, or their chunks) and one split of K, the ring form's,
    each program taking every ``num_programs``-th tile (persistent: ``launch`` makes as many
    programs as share the SMs at once, so the ring runs on from one tile into the next)."""
    BLOCK_N: gl.constexpr = 16 * WARPS
    STEP_K: gl.constexpr = 32 * V
    chunk_steps = K // CHUNKS // STEP_K
    n_tiles = gl.cdiv(CHUNKS * N, BLOCK_N)
    m_tiles = gl.cdiv(CHUNKS * M, BLOCK_M)
    tiles = n_tiles * m_tiles * SPLIT_K

    words_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N // CHUNKS, CHUNKS, 4 * V], words_desc.layout)
    scales_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N // CHUNKS, CHUNKS, 4], scales_desc.layout)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M // CHUNKS, CHUNKS, 4, 8 * V], x_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize(
        [
            (_consumer, (words_ring, scales_ring, x_ring, full, empty, n_tiles, m_tiles, tiles, chunk_steps,
                         global_scale_ptr, bias_ptr, out_ptr, M, N, stride_om, HAS_BIAS, BLOCK_M, WARPS, STAGES,
                         SPLIT_K, CHUNKS, LAYOUT)),
            (_producer, (words_desc, scales_desc, x_desc, words_ring, scales_ring, x_ring, full, empty, n_tiles,
                         m_tiles, tiles, chunk_steps, BLOCK_N, BLOCK_M, STAGES, SPLIT_K, CHUNKS, PDL)),
        ],
        [1],
        [_PRODUCER_REGISTERS],
    )  # fmt: skip
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(full.index(s))
        mbarrier.invalidate(empty.index(s))
    if PDL:  # every tile stored: the next kernel may start
        gdc_launch_dependents()


def descriptors(x: torch.Tensor, words: torch.Tensor, scale_words: torch.Tensor, config: dict) -> tuple:
    """TMA descriptors of the weight words ``[N, K/8]`` int32, the scale words ``[N, K/64]`` and
    the activations ``[M, K]``, each viewed with its rows in ``CHUNKS`` chunks of K (the
    activations' chunks also in 64-wide quarters), boxed as one ring step of one program."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    chunks = config.get("CHUNKS", 1)
    n, m, k = words.shape[0], x.shape[0], x.shape[1]
    rows = 16 * config["WARPS"] // chunks
    chunk_words, chunk_scales, chunk_k = k // 8 // chunks, k // 64 // chunks, k // chunks
    words_desc = TensorDescriptor(
        words, [n, chunks, chunk_words], [words.stride(0), chunk_words, 1], [rows, chunks, 4 * WORDS_PER_THREAD],
        WORDS_LAYOUT,
    )  # fmt: skip
    scales_desc = TensorDescriptor(
        scale_words, [n, chunks, chunk_scales], [scale_words.stride(0), chunk_scales, 1], [rows, chunks, 4],
        SCALES_LAYOUT,
    )  # fmt: skip
    x_desc = TensorDescriptor(
        x, [m, chunks, chunk_k // 64, 64], [x.stride(0), chunk_k, 64, 1], [config["BLOCK_M"] // chunks, chunks, 4, 64],
        ACTS_LAYOUT,
    )  # fmt: skip
    return words_desc, scales_desc, x_desc


def multiprocessors(device: torch.device) -> int:
    """The SMs of ``device`` (an H200's 132 where it is not a GPU: what CI's launches are checked at)."""
    if device.type != "cuda":
        return SMS
    return _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def registers(config: dict) -> int:
    """The launch's register cap: ``PROGRAMS`` programs of the MMA warps and the producer's
    warpgroup in the SM's 64K registers."""
    return register_cap(config["WARPS"], config["PROGRAMS"])


def ring_bytes(config: dict) -> int:
    """Shared memory of a config's ring: the ring form's at one row tile."""
    return linear_mma_gluon.ring_bytes({**config, "ROW_TILES": 1})


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
    """``out = x @ W^T`` (+ bias): the kernel, and its reduce where split. bf16 activations, K in
    whole steps of every chunk; ``use_prmt`` is unused. Launched with PDL as the ring form is
    (``linear_mma_gluon.PDL_LAUNCH``). ``PERSISTENT`` 0 (a probe's, never offered): a program a
    tile, as the ring form launches, where the hardware hands out the tiles."""
    require_bf16("x", x)
    linear_wgmma_gluon.refuse_oversized_ring(config, ring_bytes(config))
    m, k = x.shape
    n = packed.shape[0]
    chunks = config.get("CHUNKS", 1)
    if chunks > 1 and config.get("SPLIT_K", 1) > 1:
        raise ValueError(
            f"CHUNKS={chunks} with SPLIT_K={config['SPLIT_K']}: rows cut in chunks are summed in the program "
            "(as the ring form's), so K is not also split; use one of the two"
        )
    if config["BLOCK_M"] % chunks or k % (chunks * BLOCK_K):
        raise ValueError(
            f"BLOCK_M={config['BLOCK_M']}, CHUNKS={chunks}, K={k}: the token tile must hold whole tokens' chunks "
            f"and K whole {BLOCK_K}-wide steps a chunk"
        )
    for name, t in (("packed", packed), ("scales", scales)):
        if not _copyable(t):
            raise ValueError(f"{name} must start on 16 bytes with rows of whole 16-byte chunks for TMA")
    x = aligned_activations(x)
    words, scale_words = packed.view(torch.int32), scales.view(torch.uint8).view(torch.int32)
    split = config.get("SPLIT_K", 1)
    target = split_target(out, split)
    pdl = launch_pdl(linear_mma_gluon.PDL_LAUNCH)
    tiles = cdiv(chunks * n, 16 * config["WARPS"]) * cdiv(chunks * m, config["BLOCK_M"]) * split
    programs = config["PROGRAMS"] * multiprocessors(x.device) if config.get("PERSISTENT", 1) else tiles
    grid = (min(tiles, programs),)
    nvfp4_linear_mma_ws_gluon_kernel[grid](
        *descriptors(x, words, scale_words, config), global_scale, bias if bias is not None else out, target, m, n,
        k, out.stride(0), HAS_BIAS=bias is not None, BLOCK_M=config["BLOCK_M"], WARPS=config["WARPS"],
        STAGES=config["STAGES"], SPLIT_K=split, CHUNKS=chunks, LAYOUT=config.get("LAYOUT", ring_layout.CHECKPOINT),
        PDL=pdl, num_warps=config["WARPS"], maxnreg=registers(config), launch_pdl=pdl,
    )  # fmt: skip
    if split > 1:
        reduce_splits(target, global_scale, bias, out, pdl)
    return out


def qualifies(capability: tuple[int, int] | None) -> bool:
    """TMA, mbarriers and warp specialization: Hopper and Blackwell (built for sm_90-120 in CI)."""
    from flashrt.kernels.decode import interpreted

    return capability is not None and capability[0] >= 9 and not interpreted()


def configs(m: int, n: int, k: int) -> list[dict]:
    """Candidates for one shape where ``OFFERED`` (``tile_configs``), else none."""
    from flashrt.kernels.decode import interpreted

    if not OFFERED or interpreted():
        return []
    return tile_configs(m, n, k)


def fits(config: dict) -> bool:
    """A config whose ring fits a block and whose ``PROGRAMS`` rings fit an SM together."""
    taken = ring_bytes(config)
    return taken <= linear_mma_gluon.RING_BYTES and config["PROGRAMS"] * taken <= SM_SHARED_BYTES


def tile_configs(m: int, n: int, k: int) -> list[dict]:
    """The ring form's token tiles (``linear_mma_gluon.configs``: the smallest that holds the
    batch, here at least two rows; under 8 tokens also rows cut in chunks, as many as fill the
    MMA's 8 columns) in each of ``SHAPES``, with the splits that bring a launch to enough
    programs (``linear_mma.split_ks``), whatever ``OFFERED`` says (``kernels/build.py`` builds
    them)."""
    if k % BLOCK_K or m > linear_mma_gluon.MAX_TOKENS:
        return []
    block_m = max(2, next(bm for bm in (1, 2, 4, 8, 16, 32, 64) if bm >= min(m, 64)))
    out = []
    for warps, stages, programs in SHAPES:
        shape = {"WARPS": warps, "STAGES": stages, "PROGRAMS": programs}
        base = {"BLOCK_M": block_m, **shape}
        tiles = cdiv(n, 16 * warps) * cdiv(m, block_m)
        offered = [base] + [{**base, "SPLIT_K": s} for s in split_ks(tiles, k, BLOCK_K)]
        for chunks in linear_mma_gluon.CHUNKS:
            if m * chunks <= 8 and k % (chunks * BLOCK_K) == 0:
                lanes = next(bm for bm in (2, 4, 8) if bm >= m * chunks)
                offered.append({"BLOCK_M": lanes, "CHUNKS": chunks, **shape})
        out += [c for c in offered if fits(c)]
    return out
