"""Would the ring form's split-K sum pay inside the program, its warps along K, at 8 and 16 tokens?

At 8 tokens the tokens fill the MMA's 8 columns, so the ring form cannot cut rows in chunks as
it does at 1-4 (``linear_mma_gluon.CHUNKS``); Llama-3-8B's layers reach every SM only by
splitting K, and each split launch stores fp32 partials that a reduce launch sums. On the H200
that is where the one-token forms' efficiency goes: qkv 6.80 us at one token and 8.90 at 8, down
12.35 and 14.94, gate_up 21.18 and 25.59 (``h200-kernels.json``), and the seated batch-8 step
spends 201 us in 128 reduce launches, 162 of them not overlapped (``h200-e2e-llama-c8396f9-b1b8.json``),
6.8% of its 2.40 ms. Folding the sum into the last split to arrive lost (``FOLD_SPLITS``: an
arrival counter a tile, a wait on an atomic at the end of every program).

Here a program's warps split K instead: warp ``w`` takes chunk ``w`` of the program's rows, as
the chunked forms' MMA rows do, but each warp multiplies its chunk by its own chunk of the
activations: a batched ``mma.sync`` (``[K_WARPS, rows, tokens]``, the warps along the batch),
then one sum across the warps through shared memory, and the output stored in bf16. No partials,
no reduce launch, no atomics. What it costs: a program of ``16 ROW_TILES ROW_WARPS`` rows reads
its tokens' whole K of activations from L2 (twice the weight bytes at 8 tokens and 16 rows,
where the served qkv split 4 reads half), and a ring stage carries ``K_WARPS`` activation steps.
``ROW_WARPS`` puts warps along the rows too (the served forms' ``WARPS``): more rows a program,
fewer activation bytes a weight byte, fewer programs.

This times, same run, each from HBM (``ops._time_us``), each checked against the reference
first, the weight in ``ring_layout`` as a Hopper seat serves it: Llama-3-8B's qkv, o, gate_up
and down at 8 and 16 tokens, the config each card's committed tuning table serves there (its
reduce launch in the time; ``served_choices``) against every K-warps config that fits.

``python3 bench/probe_k_warps.py OUT.json`` with flashrt importable (``bench/gpu_run.sh OUTDIR
probe probe_k_warps``); the JSON is rewritten after each shape.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import sys

import torch
from flashrt.kernels import linear_mma_gluon as ring
from flashrt.kernels import tuning
from flashrt.kernels.decode import cdiv
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

V = ring.V
BLOCK_K = ring.BLOCK_K
_BLOCK_K = gl.constexpr(BLOCK_K)
SHAPES = {
    "llama_qkv": (6144, 4096),
    "llama_o": (4096, 4096),
    "llama_gate_up": (28672, 4096),
    "llama_down": (4096, 14336),
}
TOKENS = (8, 16)
K_WARPS = (2, 4, 8)
ROW_TILES = (1, 2)
ROW_WARPS = (1, 2)
STAGES = (2, 3, 4)


@gluon.constexpr_function
def acts3_layout(block_m, k_warps, row_warps):
    """The activation steps of a ring stage ``[K_WARPS, 4 BLOCK_M, 8V]`` as the warps read them:
    ``activations_layout`` with warp ``w`` on chunk ``w // ROW_WARPS``'s step."""
    run = 8 * ring.WORDS_PER_THREAD
    reg = [[0, 0, 1 << i] for i in range(run.bit_length() - 1)]
    reg += [[0, 32 << i, 0] for i in range((block_m // 8).bit_length() - 1)]
    lanes = [[0, 1, 0], [0, 2, 0], [0, 4, 0], [0, 8, 0], [0, 16, 0]]
    warps = [[0, 0, 0]] * (row_warps.bit_length() - 1) + [[1 << i, 0, 0] for i in range(k_warps.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, lanes, warps, [], [k_warps, 4 * block_m, run])


@gluon.jit
def _ring_rows(
    j, pid_n, N, stride, chunk, ROW_TILES: gl.constexpr, K_WARPS: gl.constexpr, ROW_WARPS: gl.constexpr
):  # fmt: skip
    """Where ring row ``j`` starts: ``words_layout(ROW_TILES, K_WARPS x ROW_WARPS)`` puts row
    ``r + 16 w + 16 K_WARPS ROW_WARPS t`` on warp ``w``, which takes chunk ``w // ROW_WARPS`` of
    rows ``16 (w % ROW_WARPS) + 16 ROW_WARPS t + r`` of the program's (the batched MMA's rows)."""
    r = j % 16
    w = (j // 16) % (K_WARPS * ROW_WARPS)
    t = j // (16 * K_WARPS * ROW_WARPS)
    row = 16 * (w % ROW_WARPS) + 16 * ROW_WARPS * t + r
    rows = gl.minimum(pid_n * (16 * ROW_TILES * ROW_WARPS) + row, N - 1)
    return rows.to(gl.int64) * stride + (w // ROW_WARPS) * chunk


@gluon.jit
def nvfp4_linear_k_warps_kernel(
    x_ptr, words_ptr, scales_ptr, global_scale_ptr, out_ptr, M, N, K, stride_xm, stride_om, stride_wn, stride_sn,
    chunk_words, chunk_scales,
    BLOCK_M: gl.constexpr, ROW_TILES: gl.constexpr, K_WARPS: gl.constexpr, ROW_WARPS: gl.constexpr,
    STAGES: gl.constexpr, LAYOUT: gl.constexpr,
):  # fmt: skip
    WARPS: gl.constexpr = K_WARPS * ROW_WARPS
    ROWS: gl.constexpr = 16 * ROW_TILES * ROW_WARPS
    RING_ROWS: gl.constexpr = ROWS * K_WARPS
    MMA_M: gl.constexpr = ring.mma_tokens(BLOCK_M)
    WORDS: gl.constexpr = ring.words_layout(ROW_TILES, WARPS)
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
    word_off = gl.expand_dims(_ring_rows(wr, pid_n, N, stride_wn, chunk_words, ROW_TILES, K_WARPS, ROW_WARPS), 1)
    word_off = word_off + gl.expand_dims(wc, 0)
    sr = gl.arange(0, RING_ROWS, layout=gl.SliceLayout(1, SCALES))
    st = gl.arange(0, 4, layout=gl.SliceLayout(0, SCALES))
    scale_off = gl.expand_dims(_ring_rows(sr, pid_n, N, stride_sn, chunk_scales, ROW_TILES, K_WARPS, ROW_WARPS), 1)
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
        x_mask, STAGES,
    )  # fmt: skip

    acc = gl.zeros([K_WARPS, ROWS, MMA_M], gl.float32, layout=ACC)
    for i in range(steps):
        async_copy.wait_group(STAGES - 2)
        ring._barrier()
        ring._refill(
            i, words_ring, scales_ring, x_ring, words_ptr, scales_ptr, x_ptr, 0, steps, word_off, scale_off, x_off,
            x_mask, STAGES,
        )  # fmt: skip
        slot = i % STAGES
        words = words_ring.index(slot).reshape([RING_ROWS, 4, V // 2, 2]).load(WORDS)
        a = ring._weights_fragment(words, scales_ring.index(slot).load(SCALES), WARPS, LAYOUT)
        a = gl.reshape(a, (ROW_TILES, K_WARPS, ROW_WARPS, 16, _BLOCK_K))  # ring row: (t, chunk, row warp, r)
        a = gl.reshape(gl.permute(a, (1, 0, 2, 3, 4)), (K_WARPS, ROWS, _BLOCK_K))
        a = gl.convert_layout(a, A_OP, assert_trivial=True)
        x = x_ring.index(slot).reshape([K_WARPS, 4 * BLOCK_M, 8 * V]).load(acts3_layout(BLOCK_M, K_WARPS, ROW_WARPS))
        if LAYOUT == 1:
            x = gl.permute(gl.reshape(x, (K_WARPS, MMA_M, 4, V, 2, 2, 2)), (0, 3, 4, 5, 2, 6, 1))
        else:
            x = gl.permute(gl.reshape(x, (K_WARPS, MMA_M, 4, V, 2, 2, 2)), (0, 3, 5, 6, 2, 4, 1))
        b = gl.convert_layout(gl.reshape(x, (K_WARPS, _BLOCK_K, MMA_M)), B_OP, assert_trivial=True)
        acc = mma_v2(a, b, acc)
    async_copy.wait_group(0)

    total = gl.sum(acc, axis=0)  # [ROWS, MMA_M]: across the warps, through shared memory
    OUT: gl.constexpr = total.type.layout
    offs_n = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, OUT))
    column = gl.arange(0, MMA_M, layout=gl.SliceLayout(0, OUT))
    offs_m = pid_m * BLOCK_M + column
    mask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims((offs_m < M) & (column < BLOCK_M), 0)
    ring._store_tile(total, offs_n, offs_m, mask, out_ptr, out_ptr, global_scale_ptr, 0, M, N, stride_om, False, 1)


def ring_bytes(config: dict) -> int:
    """Shared memory of a K-warps ring: ``K_WARPS`` chunks of the rows' step and of the tokens'."""
    rows = 16 * config["ROW_TILES"] * config["ROW_WARPS"] * config["K_WARPS"]
    acts = config["K_WARPS"] * config["BLOCK_M"] * BLOCK_K * 2
    return config["STAGES"] * (rows * (4 * V * 4 + 16) + acts)


def configs(m: int, n: int, k: int) -> list[dict]:
    """Every K-warps config for ``m`` tokens (8 to 16: where the MMA's columns are full) whose
    ring fits and whose chunks are whole ring steps."""
    block_m = 8 if m <= 8 else 16
    out = []
    for k_warps in K_WARPS:
        for row_warps in ROW_WARPS:
            for tiles in ROW_TILES:
                for stages in STAGES:
                    c = {"BLOCK_M": block_m, "ROW_TILES": tiles, "K_WARPS": k_warps, "ROW_WARPS": row_warps}
                    c["STAGES"] = stages
                    if k_warps * row_warps <= 8 and k % (k_warps * BLOCK_K) == 0 and ring_bytes(c) <= ring.RING_BYTES:
                        out.append(c)
    return out


def launch(x, packed, scales, global_scale, out, config: dict, layout: int) -> torch.Tensor:
    """``out = x @ W^T`` (no bias) by the K-warps kernel."""
    m, k = x.shape
    n = packed.shape[0]
    chunk_words = k // 8 // config["K_WARPS"]
    grid = (cdiv(n, 16 * config["ROW_TILES"] * config["ROW_WARPS"]), cdiv(m, config["BLOCK_M"]))
    nvfp4_linear_k_warps_kernel[grid](
        x, packed.view(torch.int32), scales.view(torch.uint8).view(torch.int32), global_scale, out, m, n, k,
        x.stride(0), out.stride(0), packed.stride(0) // 4, scales.stride(0) // 4, chunk_words, chunk_words // 8,
        LAYOUT=layout, num_warps=config["K_WARPS"] * config["ROW_WARPS"], **config,
    )  # fmt: skip
    return out


SIGNATURE = {
    "x_ptr": "*bf16",
    "words_ptr": "*i32",
    "scales_ptr": "*i32",
    "global_scale_ptr": "*fp32",
    "out_ptr": "*bf16",
    **{name: "i32" for name in ("M", "N", "K", "stride_xm", "stride_om", "stride_wn", "stride_sn")},
    "chunk_words": "i32",
    "chunk_scales": "i32",
    **{name: "constexpr" for name in ("BLOCK_M", "ROW_TILES", "K_WARPS", "ROW_WARPS", "STAGES", "LAYOUT")},
}


def compile_for(config: dict, layout: int, arch: int = 90):
    """The kernel compiled for ``sm_<arch>`` without a GPU, every pointer and integer but M
    aligned to 16 as Llama's layers are (``kernels.build.compile_for``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, (name, kind) in enumerate(SIGNATURE.items())
        if kind != "constexpr" and name != "M"
    }
    src = GluonASTSource(
        fn=nvfp4_linear_k_warps_kernel, signature=SIGNATURE, constexprs=config | {"LAYOUT": layout}, attrs=aligned
    )
    return triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"num_warps": config["K_WARPS"] * config["ROW_WARPS"]}
    )


def served_choices(m: int, n: int, k: int) -> dict[str, dict]:
    """The ring-layout config each card's committed tuning table serves ``m x n x k`` with, by
    card (``kernels/choices/``), where it is this form's."""
    out = {}
    for path in sorted(glob.glob(os.path.join(tuning.SHIPPED, "tuning-*.json"))):
        with open(path) as f:
            entry = json.load(f).get(f"linear:torch.bfloat16:M{m}:N{n}:K{k}:ring")
        if entry and entry["form"] == "mma_gluon":
            out[os.path.basename(path).split("-sm")[0].removeprefix("tuning-")] = dict(entry["config"])
    return out


def main(path: str) -> None:
    from flashrt.bench.kernels import provenance
    from flashrt.bench.probe_ring_depth import fastest, name, timed
    from flashrt.bench.timing import copy_bandwidth_tbps
    from flashrt.kernels import nvfp4, ops, ring_layout

    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "rows": []}
    torch.manual_seed(0)
    for shape, (n, k) in SHAPES.items():
        w = ops.for_serving(nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16)))
        layout = w.layout
        for m in TOKENS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)

            def served(config, x=x, w=w, out=out, layout=layout):
                params = config | {"LAYOUT": layout} if layout == ring_layout.RING else config
                ring.launch(x, w.packed, w.scales, w.global_scale, None, out, params, False)

            def k_warps(config, x=x, w=w, out=out, layout=layout):
                launch(x, w.packed, w.scales, w.global_scale, out, config, layout)

            choices = served_choices(m, n, k)
            offered = {}
            for card, c in choices.items():
                offered.setdefault(name(c), timed(functools.partial(served, c), out, ref) | {"config": c, "cards": []})
                offered[name(c)]["cards"].append(card)
            ours = {name(c): timed(functools.partial(k_warps, c), out, ref) | {"config": c} for c in configs(m, n, k)}
            row = {"shape": shape, "N": n, "K": k, "M": m, "layout": layout, "served": offered, "k_warps": ours}
            for label, results in (("served", offered), ("k_warps", ours)):
                us, key = fastest(results)
                row[f"{label}_us"], row[f"{label}_config"] = us, key
                row[f"{label}_bandwidth_frac"] = None if us is None else w.nbytes / (us * 1e-6) / (copy_tbps * 1e12)
            result["rows"].append(row)
            print(f"{shape} M={m}: served {row['served_us']} us ({row['served_config']}), "
                  f"k_warps {row['k_warps_us']} us ({row['k_warps_config']})", flush=True)  # fmt: skip
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
