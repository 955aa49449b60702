"""Which of an SM's pipes the ring decode's instructions take, and the bit layouts that spare the busiest.

On sm_90 ``LOP3``, ``SHF`` and ``PRMT`` issue to the integer pipe, which takes half as many warp
instructions a cycle as the FMA pipes that take ``HMUL2`` and ``IMAD`` (H100, 658570b,
``bench/results/h100-probe-pipes-658570b.json``, warp instructions an SM a nanosecond: ``LOP3``
3.73, ``SHF`` 3.59, ``PRMT`` 3.60, the E4M3 pair conversion 3.46, ``HMUL2`` 6.61; ``LOP3`` and
``SHF`` alternated 3.84, ``LOP3`` and ``IMAD.SHL`` alternated 6.87: two pipes). The ring's
one-token step (``bench/sass_loop.py``, Llama's gate_up, 337 instructions) put 205 on the
integer pipe, 182 of them the decode's ``LOP3``/``SHF``. A left shift by a constant is an
``IMAD.SHL`` to ptxas (a rotation stays an ``SHF``), so a layout whose pairs are reached by left
shifts moves the decode's shifts to the FMA pipe: ``layouts()`` searches them, and
``ring_layout`` took one of the best (133 integer-pipe instructions a step). It bought 0.5-0.9%
(``bench/probe_shift_layout.py``): the integer pipe was not what the ring waits on.

``python3 bench/probe_pipes.py OUT.json`` on a GPU: each instruction in eight independent chains a
thread, a full SM of warps; ``lop3+imad.shl`` alternates the two (a chain of shifts alone ptxas
folds away). Without a GPU, ``python3 bench/probe_pipes.py --layouts`` prints the best layouts.
"""

from __future__ import annotations

import itertools
import json
import sys

import triton
import triton.language as tl

# One instruction a chain step: PTX, and how many PTX instructions a step holds.
CHAINS = {
    "lop3": ("lop3.b32 $0, $1, 0x0F0F0F0F, 0x33333333, 0x96;", 1),
    "shf.r.wrap": ("shf.r.wrap.b32 $0, $1, $1, 3;", 1),
    "prmt": ("prmt.b32 $0, $1, 0x76543210, 0x3210;", 1),
    "hmul2.bf16": ("mul.rn.bf16x2 $0, $1, $1;", 1),
    "f2fp.e4m3x2": ("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.rn.f16x2.e4m3x2 $0, lo; }", 1),
    "lop3+imad.shl": ("{ .reg .b32 t; shl.b32 t, $1, 3; lop3.b32 $0, t, 0x0F0F0F0F, 0x33333333, 0x96; }", 2),
    "lop3+shf": ("{ .reg .b32 t; shf.r.wrap.b32 t, $1, $1, 3; lop3.b32 $0, t, 0x0F0F0F0F, 0x33333333, 0x96; }", 2),
}
STEPS = 4096
BLOCK = 1024  # 4 warps, 8 chains a thread


@triton.jit
def _chain(out, STEPS: tl.constexpr, ASM_TEXT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a = (offs * 40503).to(tl.uint32)
    for _ in range(STEPS):
        a = tl.inline_asm_elementwise(ASM_TEXT, "=r,r", [a], dtype=tl.uint32, is_pure=False, pack=1)
    tl.store(out + offs, a)


def measure(path: str) -> None:
    import torch
    from flashrt.bench.kernels import provenance
    from flashrt.bench.timing import eager_us

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = 16 * sms  # 64 warps an SM
    out = torch.empty(programs * BLOCK, device="cuda", dtype=torch.int32)
    rows = {}
    for name, (text, per_step) in CHAINS.items():

        def run(text=text):
            _chain[(programs,)](out, STEPS, text, BLOCK, num_warps=4)

        us = eager_us([run], replays=5)
        warp_instructions = programs * 4 * STEPS * (BLOCK // 128) * per_step
        rows[name] = {"us": us, "warp_instructions_a_sm_a_ns": warp_instructions / sms / (us * 1e3)}
        print(f"{name:16s} {us:9.1f} us {rows[name]['warp_instructions_a_sm_a_ns']:.2f} a SM a ns", flush=True)
    with open(path, "w") as f:
        json.dump({**provenance(), "sms": sms, "steps": STEPS, "rows": rows}, f, indent=1)


MAGNITUDES = (6, 7, 8, 22, 23, 24)  # where the decode wants a pair's code bits m, e0, e1 (both halves)
SIGNS = (15, 31)


def _sources(targets, shift: int):
    """The bits that shifting a word left by ``shift`` (right where negative) moves onto ``targets``."""
    sources = [t - shift for t in targets]
    return sources if all(0 <= s < 32 for s in sources) else None


def layouts(top: int = 10) -> list[tuple[int, int, tuple]]:
    """Every way to place a word's four pairs so each is ``(w << a) & magnitudes | (w << b) & signs``
    (``a == b``: one shift and one mask), its bits disjoint from the others': ``(integer-pipe
    instructions, all instructions, ((a, b) a pair))``, fewest first. Counted as ptxas builds
    them (``bench/sass_loop.py``): a mask or a merge is a ``LOP3``, a left shift an ``IMAD.SHL``
    (not counted against the integer pipe), a right shift an ``SHF``; a pair already in place takes
    its mask only."""
    pairs = {}
    for a, b in itertools.product(range(-9, 16), repeat=2):
        if a == b:
            bits = _sources(MAGNITUDES + SIGNS, a)
        else:
            m, s = _sources(MAGNITUDES, a), _sources(SIGNS, b)
            bits = m + s if m and s and not set(m) & set(s) else None
        if bits:
            pairs[(a, b)] = frozenset(bits)

    def covers(free: frozenset, chosen: tuple):
        """Every set of pairs that tiles ``free`` exactly, each taken by its lowest bit."""
        if not free:
            yield chosen
            return
        low = min(free)
        for shift, bits in pairs.items():
            if low in bits and bits <= free:
                yield from covers(free - bits, (*chosen, shift))

    found = []
    for shifts in covers(frozenset(range(32)), ()):
        lop3 = sum(1 if a == b else 2 for a, b in shifts)
        right = sum((a < 0) + (b < 0 and b != a) for a, b in shifts)
        left = sum((a > 0) + (b > 0 and b != a) for a, b in shifts)
        found.append((lop3 + right, lop3 + right + left, tuple(sorted(shifts))))
    return sorted(found)[:top]


if __name__ == "__main__":
    if sys.argv[1:] == ["--layouts"]:
        for line in layouts():
            print(*line)
    else:
        measure(sys.argv[1])
