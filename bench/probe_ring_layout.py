"""Does the ring form run faster on fewer instructions? ``linear_mma_gluon`` three ways.

The SASS of the ring's main loop for sm_90 (Triton 3.9 here; 8 tokens, 32 rows, 4 stages) is
469 instructions a step a thread for 128 weight elements; at copy bandwidth the H200 issues
about 4 an element, and the ring reached 51-76% of copy bandwidth. Three variants of the same
configs, each checked against the reference first, then timed from HBM (``ops._time_us``):

* ``checkpoint``: the checkpoint's layout, the scale bytes moved into bf16 bits and two
  ``mul.bf16x2`` (453; through fp32 it was 469);
* ``ring``: the weight repacked in ``ring_layout`` (pairs that are K-neighbours, each a rotation
  or two from its bits at fd70e4d, a left shift or two since session 56; 359).

The first run (fd70e4d, ``h200-probe-ring-layout-fd70e4d.json``) also timed the scales through
fp32 (``head``): the new scales gave the same bits, 0-2% faster.

``python3 bench/probe_ring_layout.py OUT.json [SHAPE ...]`` with flashrt importable
(``bench/gpu_run.sh``).
"""

import functools
import json
import sys

import torch
import torch.nn.functional as F
from flashrt.bench.kernels import provenance
from flashrt.bench.probe_ring_depth import SHAPES, name, timed
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import linear_mma_gluon, nvfp4, ops, ring_layout

VARIANTS = {"checkpoint": ring_layout.CHECKPOINT, "ring": ring_layout.RING}


def main(path: str, shapes: list[str]) -> None:
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "rows": []}
    torch.manual_seed(0)
    for shape in shapes:
        n, k = SHAPES[shape]
        dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        w = nvfp4.quantize(dense)
        ring = ring_layout.pack(w.packed)
        assert torch.equal(ring_layout.unpack(ring), w.packed)
        nbytes = w.packed.numel() + w.scales.numel()
        for m in (1, 8):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)
            bf16_us = ops._time_us(functools.partial(F.linear, x, dense))
            row = {"shape": shape, "N": n, "K": k, "M": m, "bf16_us": bf16_us, "configs": {}}
            for c in linear_mma_gluon.configs(m, n, k):
                if c["STAGES"] != 4:
                    continue
                timings = {}
                for variant, layout in VARIANTS.items():
                    packed = ring if layout == ring_layout.RING else w.packed
                    cfg = {**c, "LAYOUT": layout}
                    run = functools.partial(
                        linear_mma_gluon.launch, x, packed, w.scales, w.global_scale, None, out, cfg, True
                    )
                    timings[variant] = timed(run, out, ref)
                row["configs"][name(c)] = timings
            for variant in VARIANTS:
                best = min(
                    ((t[variant]["us"], key) for key, t in row["configs"].items() if t[variant]["us"] is not None),
                    default=(None, None),
                )
                row[f"{variant}_us"], row[f"{variant}_config"] = best
                row[f"{variant}_bandwidth_frac"] = best[0] and nbytes / (best[0] * 1e-6) / (copy_tbps * 1e12)
            result["rows"].append(row)
            us = {v: row[f"{v}_us"] or float("nan") for v in VARIANTS}
            print(
                f"{shape:14s} M={m}: bf16 {bf16_us:7.2f}  checkpoint {us['checkpoint']:7.2f}  ring {us['ring']:7.2f} us"
                f" ({us['checkpoint'] / us['ring']:.3f}x, {bf16_us / us['ring']:.2f}x bf16,"
                f" {row['ring_bandwidth_frac'] or 0:.2f} of copy)",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(SHAPES))
