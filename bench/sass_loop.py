"""What one step of a kernel's main loop issues, from its sm_90 SASS: on any machine, no GPU.

The decode forms' figures in docs/benchmarks.md count instructions a step a thread (the ring form
at one token: 337 on Llama's gate_up, 246 of them the decode), because at few tokens that count
is what the SMs' issue rate divides the weight bytes by (Nsight Compute, efde653: 5.7 bytes of
weight an instruction on qkv, 0.47-0.60 issued a cycle a scheduler). Triton builds a kernel for
a GPU it does not have (``kernels/build.py``), so a kernel edit can be counted before any device
runs it: the main loop is the backward branch whose body holds the most MMAs (the spin loops of
mbarrier waits hold none), the shortest such.

``python3 bench/sass_loop.py`` prints the loop of the ring form's config that the H200 serves for
Llama-3-8B's gate_up at one token (``kernels/choices``), opcodes by count. Run it with the H200's
Triton (``PYTHONPATH=.venv/h200-triton``) for the figures of the kernels that ran there.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")
_TARGET = re.compile(r"\b0x([0-9a-f]+)\b")


def sass(cubin: bytes) -> str:
    """The disassembly of ``cubin`` by the ``cuobjdump`` Triton ships."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout


def instructions(text: str) -> list[tuple[int, str]]:
    """``(address, instruction without its predicate)`` of every SASS line."""
    out = []
    for line in text.splitlines():
        hit = _LINE.match(line)
        if hit:
            out.append((int(hit.group(1), 16), _PREDICATE.sub("", hit.group(2))))
    return out


def main_loop(text: str) -> list[str]:
    """The main loop's instructions, one step: of the backward branches, the body with the most
    MMAs (``HMMA``/``HGMMA``), the shortest of those."""
    code = instructions(text)
    loops = []
    for at, instruction in code:
        target = _TARGET.search(instruction) if instruction.startswith("BRA") else None
        if target and int(target.group(1), 16) < at:
            body = [i for a, i in code if int(target.group(1), 16) <= a <= at]
            loops.append((-sum(i.startswith(("HMMA", "HGMMA")) for i in body), len(body), body))
    if not loops:
        raise ValueError("no backward branch: the kernel has no loop")
    return min(loops)[2]


def mix(body: list[str]) -> collections.Counter:
    """Opcodes (``LOP3.LUT`` counts as ``LOP3``) by count."""
    return collections.Counter(i.split()[0].split(".")[0] for i in body)


def served_ring_build(m: int, n: int, k: int):
    """The ``linear_mma_gluon`` build of the H200's committed choice for ``[m, k] @ [n, k]^T``
    in the ring layout, as ``build.builds()`` makes it (no PDL, no folded split)."""
    from flashrt.bench.probe_warps import tuned

    form, config = tuned(m, n, k) or (None, None)
    if form != "mma_gluon":
        raise ValueError(f"M={m} N={n} K={k}: the H200 serves {form}, not the ring form")
    return find_build("linear_mma_gluon", **{"CHUNKS": 1, "SPLIT_K": 1, **config, "FOLD": False})


def find_build(name: str, maxnreg: int | None = None, **constexprs):
    """The first of ``build.builds()`` of kernel ``name`` with ``constexprs`` (in the ring layout
    and without PDL unless they say otherwise; a split as 2, which every split compiles as) and,
    where given, the register cap ``maxnreg``."""
    from flashrt.kernels import build

    want = {"LAYOUT": 1, "PDL": False, **constexprs}
    want["SPLIT_K"] = min(want.get("SPLIT_K", 1), 2)  # every split compiles alike (build._split_build)
    for b in build.builds():
        if (
            b.name == name
            and maxnreg in (None, b.maxnreg)
            and all(b.constexprs.get(key) == v for key, v in want.items())
        ):
            return b
    raise ValueError(f"no build of {name} has {want}" + (f" and maxnreg={maxnreg}" if maxnreg else ""))


def main() -> None:
    from flashrt.kernels import build

    m, n, k = 1, 28672, 4096
    b = served_ring_build(m, n, k)
    body = main_loop(sass(build.compile_for(b, 90).asm["cubin"]))
    counts = mix(body)
    print(f"gate_up {n} x {k}, M={m}, {b.constexprs}: {len(body)} instructions a step, {counts['HMMA']} HMMA")
    print(" ".join(f"{op} {c}" for op, c in counts.most_common()))


if __name__ == "__main__":
    sys.exit(main())
