"""What does the ring form's second CTA barrier a step cost?

``linear_mma_gluon._ring_product`` meets once a step at a barrier (every thread's copies of the
step landed, every thread done with the slot refilled next). Triton 3.6, the H200's, adds a
second between the refill's ``cp.async`` and the step's shared loads: its barrier analysis sees a
write and a read of the same ring allocation and cannot tell the slots apart (Triton 3.9, which CI
also builds with, puts none there). The slots differ (step i reads slot i mod STAGES, the refill
writes the slot of step i - 1, which the first barrier freed), so the second is not needed.

Same run, each from HBM (``ops._time_us``), weights in ``ring_layout``, the H200's tuned choice
(``bench/tuning``): the kernel as Triton 3.6 compiles it, and the same PTX with that one
``bar.sync`` taken out of the loop (``ir_override``: Triton compiles the edited PTX as the
kernel's), and the source's way of leaving it out (``SLOTS_APART``: each slot an allocation of its
own, the loop unrolled by the stages), the output bit for bit the same, each twice in turn, for
Llama-3-8B's projections and a 151936 x 2048 LM head at 1, 4, 8 and 16 tokens.

``python3 bench/probe_ring_barrier.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``);
the JSON is rewritten after each row; stops at ``DEADLINE_S``.
"""

import functools
import json
import os
import re
import sys
import tempfile
import time

import torch
from flashrt.bench.kernels import provenance
from flashrt.bench.probe_ring_depth import name, timed
from flashrt.bench.probe_warps import SHAPES, tuned
from flashrt.kernels import linear_mma_gluon, nvfp4, ops, ring_layout

DEADLINE_S = 200
TOKENS = (1, 8, 16, 4)


def without_second_barrier(ptx: str) -> tuple[str, int]:
    """The PTX with, in each block of the loop, the ``bar.sync`` after the block's
    ``cp.async.commit_group`` removed; and how many were."""
    out, removed, in_loop, committed = [], 0, False, False
    lines = ptx.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\$L__BB\d+_\d+:", line):
            label = line + (lines[i + 1] if i + 1 < len(lines) else "")
            in_loop, committed = "in Loop:" in label or "Loop Header" in label, False
        elif in_loop and "cp.async.commit_group;" in line:
            committed = True
        elif in_loop and committed and line.strip().startswith("bar.sync"):
            removed += 1
            committed = False
            continue
        out.append(line)
    return "\n".join(out) + "\n", removed


class Kernel:
    """The ring kernel as ``launch_ring`` calls it, launched from ``override`` PTX if set; the
    compiled kernel of the last launch kept."""

    def __init__(self, kernel):
        self.kernel, self.override, self.compiled = kernel, None, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            extra = {"ir_override": self.override} if self.override else {}
            self.compiled = self.kernel[grid](*args, **kwargs, **extra)
            return self.compiled

        return launch


def main(path: str) -> None:
    start = time.monotonic()
    result = {**provenance(), "rows": []}
    kernel = Kernel(linear_mma_gluon.nvfp4_linear_mma_gluon_kernel)
    linear_mma_gluon.nvfp4_linear_mma_gluon_kernel = kernel
    scratch = tempfile.mkdtemp()
    torch.manual_seed(0)
    for shape, (n, k) in SHAPES.items():
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        ring = ring_layout.pack(w.packed)
        for m in TOKENS:
            if time.monotonic() - start > DEADLINE_S:
                print("deadline: stopping", flush=True)
                return
            choice = tuned(m, n, k)
            if choice is None or choice[0] != "mma_gluon":
                continue
            config = {**choice[1], "LAYOUT": ring_layout.RING}
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)
            run = functools.partial(linear_mma_gluon.launch, x, ring, w.scales, w.global_scale, None, out, config, True)
            kernel.override = None
            run()
            compiled = out.clone()
            ptx, removed = without_second_barrier(kernel.compiled.asm["ptx"])
            edited = os.path.join(scratch, f"{shape}-{m}.ptx")
            with open(edited, "w") as f:
                f.write(ptx)
            row = {"shape": shape, "N": n, "K": k, "M": m, "config": name(choice[1]), "removed": removed}
            row["bar_sync"] = kernel.compiled.asm["ptx"].count("bar.sync")
            apart = functools.partial(
                linear_mma_gluon.launch,
                x,
                ring,
                w.scales,
                w.global_scale,
                None,
                out,
                config | {"SLOTS_APART": True},
                True,
            )
            arms = (("compiled", None, run), ("edited", edited, run), ("apart", None, apart))
            row |= {arm: [] for arm, _, _ in arms}
            for _ in range(2):
                for arm, override, launch in arms:
                    kernel.override = override
                    row[arm].append(timed(launch, out, ref))
                    if arm != "compiled":
                        row[f"{arm}_same_bits"] = torch.equal(out, compiled) and row.get(f"{arm}_same_bits", True)
                    if arm == "apart":
                        row["apart_bar_sync"] = kernel.compiled.asm["ptx"].count("bar.sync")
            kernel.override = None
            result["rows"].append(row)
            us = {arm: [r["us"] and round(r["us"], 2) for r in row[arm]] for arm, _, _ in arms}
            print(
                f"{shape:14s} M={m:2d} {row['config']}: removed {removed} of {row['bar_sync']} bar.sync;"
                f" compiled {us['compiled']} edited {us['edited']} apart {us['apart']} ({row['apart_bar_sync']})"
                f" same bits {row.get('edited_same_bits')} {row.get('apart_same_bits')}",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
