"""Does the decode ring gain from TMA slots filled by a producer warp (``linear_mma_ws_gluon``)?

``bench/probe_decode_cost.py`` (H200, 4140803): the ring form without its decode still takes
Llama's gate_up at one token 20% longer than a kernel that only reads the same bytes (19.73 us
against 16.48), and ``bench/probe_direct_words.py`` (2463e7c) found that reading the words
straight into registers loses 2-3x. What is left of the ring's own cost is how its slots are
filled: each step every thread computes the addresses of its 16-byte copies, issues them
(``LDGSTS``: 7 a step a thread at one token), counts them and meets the others at a CTA barrier.
``linear_mma_ws_gluon`` keeps the ring form's tiling, chunks, splits, decode and MMA and fills
each slot with three TMA copies from one producer warp: 306 instructions a step of the MMA warps
against the ring's 343 at 4 warps (gate_up at one token, sm_90 SASS, ``bench/sass_loop.py``).

Filling the slots with TMA in the loop instead, one thread of the program issuing the copies
where the ring issues its own, was counted and left out (this probe's kernel at ce61334): 384
instructions a step with 10 CTA barriers, because Triton 3.6's shared-memory analysis puts a
barrier before every operation on an mbarrier's allocation.

For each Llama shape, the LM head and Qwen3-30B's attention projections at 1, 16 and 8 tokens
(``TOKENS``; 8 last, where a call's limit would cut it: ``DEADLINE_S``) that the H200 serves
with the ring form: its tuned config (``kernels/choices``) as served, the ring at 4 warps where the
config has fewer, and the form in the served config's tiling at each of ``WS_SHAPES`` (more
than the form offers, to choose its ``SHAPES`` from; two of them also a program a tile), each
checked against the reference first, then timed as the adjudicator times (``ops._time_us``),
with the read-only floor of ``probe_rows`` at one token. A win is what makes the form offered
by default (``linear_mma_ws_gluon.OFFERED``); on an H100 at 22973c7 it won the LM head only
(``docs/benchmarks.md``, session 56).

``python3 bench/probe_tma_ring.py OUT.json [--tiles]`` with flashrt importable (``bench/gpu_run.sh``).
A kernel that waits on an mbarrier that never completes hangs the GPU: run it under ``timeout``.
"""

from __future__ import annotations

import sys

TOKENS = (1, 16, 8)
# Past this no row starts (the JSON is rewritten after each): a device call is 600 s, and the
# form's GPU test comes first in it.
DEADLINE_S = 360
# Llama's layers and a Qwen-sized LM head (``probe_decode_cost.SHAPES``) and Qwen3-30B's attention
# projections, the small layers that run at a quarter of copy bandwidth in its decode step.
SHAPES = {"qwen3_qkv": (5120, 2048), "qwen3_o": (2048, 4096)}
# (MMA warps, stages, programs an SM) timed: 1-3 programs an SM (register caps 255, 128, 80),
# 3-6 stages, 4 and 8 MMA warps.
WS_SHAPES = (
    (4, 4, 1),
    (4, 6, 1),
    (4, 3, 2),
    (4, 4, 2),
    (4, 6, 2),
    (4, 3, 3),
    (4, 4, 3),
    (8, 3, 1),
    (8, 4, 1),
    (8, 4, 2),
)
# Two of the form's own shapes also launched a program a tile (``PERSISTENT`` 0), as the ring
# form launches: whether the form's persistent programs, each taking every so-many-th tile, pay.
TILES_SHAPES = ((4, 4, 2), (8, 4, 1))


def ws_config(config: dict, warps: int, stages: int, programs: int) -> dict:
    """The ring form's ``config`` as ``linear_mma_ws_gluon`` takes it: the same token tile (a
    one-token tile widened to two rows, as the form's ``tile_configs``), chunks and split, one
    row tile of ``warps`` MMA warps, ``stages`` slots, ``programs`` an SM."""
    tiling = {key: config[key] for key in ("CHUNKS", "SPLIT_K", "LAYOUT") if key in config}
    shape = {"WARPS": warps, "STAGES": stages, "PROGRAMS": programs}
    return {"BLOCK_M": max(config["BLOCK_M"], 2), **tiling, **shape}


def main(path: str, tiles_only: bool = False) -> None:
    """Every arm of the docstring; ``tiles_only`` (``--tiles``): each of ``WS_SHAPES`` launched a
    program a tile only. On the H100 at 488c899 the first persistent arm, Llama's qkv at one token
    (384 tiles, 132 programs), never finished (the MMA warps' step count was lost in the compiler,
    ``linear_mma_ws_gluon._first_step``): that call was cut after 420 s with only the ring's two
    arms timed."""
    from flashrt.bench.probe_decode_cost import SHAPES as LLAMA_SHAPES
    from flashrt.bench.probe_decode_cost import time_ring_arms
    from flashrt.kernels import linear_mma_gluon, linear_mma_ws_gluon

    def ws_arms(cfg: dict, operands: tuple) -> dict:
        arms = {}
        if cfg["WARPS"] < 4:  # the specialized kernel's MMA warps are warpgroups: the ring so too
            arms["ring_w4"] = lambda o, c={**cfg, "WARPS": 4}, a=operands: linear_mma_gluon.launch(*a, o, c, True)
        ways = (
            [(*shape, False) for shape in WS_SHAPES]
            if tiles_only
            else ([(*shape, True) for shape in WS_SHAPES] + [(*shape, False) for shape in TILES_SHAPES])
        )
        for warps, stages, programs, persistent in ways:
            c = {**ws_config(cfg, warps, stages, programs), **({} if persistent else {"PERSISTENT": 0})}
            if linear_mma_ws_gluon.fits(c):
                name = f"ws_w{warps}_s{stages}_p{programs}" + ("" if persistent else "_tiles")
                arms[name] = lambda o, c=c, a=operands: linear_mma_ws_gluon.launch(*a, o, c, True)
        return arms

    time_ring_arms(path, ws_arms, TOKENS, DEADLINE_S, LLAMA_SHAPES | SHAPES)
    for line in summary(path):
        print(line, flush=True)


def summary(path: str) -> list[str]:
    """A line a row of the result at ``path``: the served ring's microseconds, the fastest
    warp-specialized arm's, and the ring's time over it (over 1: the form wins there)."""
    import json

    from flashrt.bench.probe_ring_depth import fastest

    with open(path) as f:
        rows = json.load(f)["rows"]
    lines = []
    for row in rows:
        ring = row["arms"]["ring"]["us"]
        us, arm = fastest({name: figure for name, figure in row["arms"].items() if name.startswith("ws_")})
        ratio = f"{ring / us:.3f}" if ring and us else "-"
        lines.append(f"{row['shape']:14s} M={row['M']:2d} ring {ring} us, best {arm} {us} us: ring / best {ratio}")
    return lines


if __name__ == "__main__":
    main(sys.argv[1], "--tiles" in sys.argv[2:])
