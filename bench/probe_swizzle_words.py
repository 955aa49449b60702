"""Do the ring's weight words read faster from shared memory swizzled?

A thread of ``linear_mma_gluon``'s ring reads its 8 words of a row (32 bytes, two 16-byte
loads) where the 4 threads of its quad read the rest of the row's 128 bytes, and lanes 4 apart
read the next row. With the rows stored as they are copied (128 bytes a row, unswizzled), the 8
lanes of a 16-byte load's shared-memory phase are two rows whose words sit in the same 16 of
the 32 banks: every load takes two wavefronts. XOR-ing a row's 16-byte chunks with the row
(``SWIZZLE_WORDS``) spreads the two rows over all 32 banks; the copies in stay one row a phase.

Same run, same configs (the H200's tuned choice for each shape, ``bench/tuning``; the best
offered 4-stage config where none is cached), each from HBM after a read-only L2 flush
(``ops._time_us``), each checked against the reference first, weights in ``ring_layout``.

``python3 bench/probe_swizzle_words.py OUT.json [SHAPE ...]`` with flashrt importable
(``bench/gpu_run.sh``).
"""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import provenance
from flashrt.bench.probe_ring_depth import name, timed
from flashrt.bench.probe_warps import SHAPES, tuned
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import linear_mma_gluon, nvfp4, ops, ring_layout


def main(path: str, shapes: list[str]) -> None:
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "rows": []}
    torch.manual_seed(0)
    for shape in shapes:
        n, k = SHAPES[shape]
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        ring = ring_layout.pack(w.packed)
        nbytes = w.packed.numel() + w.scales.numel()
        for m in (1, 8, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)

            def run(c, x=x, out=out, ring=ring, w=w):
                cfg = {**c, "LAYOUT": ring_layout.RING}
                return linear_mma_gluon.launch(x, ring, w.scales, w.global_scale, None, out, cfg, True)

            choice = tuned(m, n, k)
            configs = [choice] if choice else [c for c in linear_mma_gluon.configs(m, n, k) if c["STAGES"] == 4]
            row = {"shape": shape, "N": n, "K": k, "M": m, "baseline_is_tuned": bool(choice), "configs": {}}
            for c in configs:
                row["configs"][name(c)] = {
                    arm: timed(functools.partial(run, {**c, "SWIZZLE_WORDS": sw}), out, ref)
                    for arm, sw in (("plain", 0), ("swizzled", 1))
                }
            for arm in ("plain", "swizzled"):
                us, key = min((t[arm]["us"], key) for key, t in row["configs"].items() if t[arm]["us"] is not None)
                row[f"{arm}_us"], row[f"{arm}_config"] = us, key
                row[f"{arm}_bandwidth_frac"] = nbytes / (us * 1e-6) / (copy_tbps * 1e12)
            result["rows"].append(row)
            p, s = row["plain_us"], row["swizzled_us"]
            print(
                f"{shape:14s} M={m:2d}: plain {p:7.2f} us  swizzled {s:7.2f} us  x{p / s:.3f}"
                f"  ({row['swizzled_bandwidth_frac']:.2f} of copy)",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(SHAPES))
