"""What the one-token ring waits on: HBM, or its own time.

Two cuts of the ring's own instructions bought nothing: the tile-slot form's 37 fewer a step
(``bench/probe_tma_ring.py``) and the shift layout's third fewer on the integer pipe
(``bench/probe_shift_layout.py``). So this probe changes where the bytes come from instead. The
ring as served (``kernels/choices``'s config, ``ring_layout``) runs on the same activations:

- ``served``: the weight as a seat holds it, from HBM;
- ``scales_l2``: every row's scale bytes row 0's (a stride-0 view), the words as served;
- ``part_hbm`` and ``part_l2``: the weight's first rows, as many as make ``PART_BYTES`` (a third
  of the H100's and H200's 50 MB L2), from HBM (the L2 flushed before each call) and from L2
  (the same call replayed back to back): how far HBM is from the kernel's own time.

A stride-0 view of the words too was tried first (830aea1): every program then read the same
few L2 lines, and the kernel ran 1.1-2.8x slower than served. L2 serves one hot line slowly.

Each arm is checked against the reference of the weight it reads, then timed: from HBM as the
adjudicator times (``ops._time_us``), from L2 as ``bench.timing.graph_us`` times one call
(back to back in a graph, nothing flushed).

``python3 bench/probe_streams.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).

H100 (830aea1, 3350f27; docs/benchmarks.md, session 56): scales from L2 took 9-14% off the long
layers (they are 11% of the bytes); 16 MB of a layer from HBM took 1.3-2.7 us more than from L2,
a third or more of either call the kernel's start and end.
"""

from __future__ import annotations

import sys

TOKENS = (1, 16)
PART_BYTES = 16 << 20


def main(path: str) -> None:
    import functools
    import json

    import torch
    from flashrt.bench.kernels import provenance
    from flashrt.bench.probe_decode_cost import SHAPES as LLAMA_SHAPES
    from flashrt.bench.probe_decode_cost import tuned_ring_cases
    from flashrt.bench.probe_ring_depth import timed
    from flashrt.bench.probe_rows import read_us
    from flashrt.bench.probe_tma_ring import SHAPES as QWEN_SHAPES
    from flashrt.bench.timing import copy_bandwidth_tbps, graph_us
    from flashrt.kernels import linear_mma_gluon, nvfp4, ops, ring_layout

    result = {**provenance(), "copy_TBps": copy_bandwidth_tbps(), "rows": []}
    for shape, w, ring, x, config in tuned_ring_cases(TOKENS, LLAMA_SHAPES | QWEN_SHAPES):
        (m, k), n = x.shape, w.shape[0]
        cfg = {**config, "LAYOUT": ring_layout.RING}
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        row = {"shape": shape, "N": n, "K": k, "M": m, "config": config, "arms": {}}
        for arm, scales_l2 in (("served", False), ("scales_l2", True)):
            scales = w.scales[:1].expand(w.scales.shape[0], -1) if scales_l2 else w.scales  # row 0's, stride 0
            read = nvfp4.NVFP4Weight(w.packed, scales.contiguous(), w.global_scale)
            run = functools.partial(linear_mma_gluon.launch, x, ring, scales, w.global_scale, None, out, cfg, True)
            row["arms"][arm] = figure = timed(run, out, ops.linear_reference(x, read))
            print(f"{shape:14s} M={m:2d} {arm:10s} {json.dumps(figure)}", flush=True)
        part = min(n, PART_BYTES // (k // 2 + k // 16))
        part_w = nvfp4.NVFP4Weight(w.packed[:part], w.scales[:part], w.global_scale)
        part_out = out[:, :part]
        run = functools.partial(
            linear_mma_gluon.launch, x, ring[:part], w.scales[:part], w.global_scale, None, part_out, cfg, True
        )
        row["part_rows"] = part
        row["arms"]["part_hbm"] = figure = timed(run, part_out, ops.linear_reference(x, part_w))
        if figure["us"] is not None:
            row["arms"]["part_l2"] = {"rel_err": figure["rel_err"], "us": graph_us([run])}
        print(f"{shape:14s} M={m:2d} {part} rows: {json.dumps(row['arms'].get('part_hbm'))} "
              f"{json.dumps(row['arms'].get('part_l2'))}", flush=True)  # fmt: skip
        if m == 1:
            row["read_us"], row["read_tiling"] = read_us(w)
        result["rows"].append(row)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
