"""What the one-token ring waits on: its weight words, its scale bytes, or neither.

Two cuts of the ring's own instructions bought nothing: the tile-slot form's 37 fewer a step
(``bench/probe_tma_ring.py``) and the shift layout's third fewer on the integer pipe
(``bench/probe_shift_layout.py``). So this probe takes bytes away instead. The ring as served
(``bench/tuning``'s config, ``ring_layout``) runs four ways on the same activations:

- ``served``: the weight as a seat holds it;
- ``scales_l2``: every row's scale bytes are row 0's (a stride-0 view: after the first program,
  from L2), the words as served;
- ``words_l2``: every row's words are row 0's, the scales as served;
- ``both_l2``: both, so HBM serves almost nothing and what is left is the kernel's own time.

Each is checked against the reference of the weight it reads (row 0 repeated where the view
repeats it), then timed as the adjudicator times (``ops._time_us``, L2 flushed before each
call), with the read-only floor (``probe_rows.read_us``) of the whole weight.

``python3 bench/probe_streams.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

from __future__ import annotations

import sys

TOKENS = (1, 16)


def _repeated(t, rows: bool):
    """``t`` with every row row 0's, as a stride-0 view (``rows``), else ``t`` itself."""
    return t[:1].expand(t.shape[0], -1) if rows else t


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
    from flashrt.bench.timing import copy_bandwidth_tbps
    from flashrt.kernels import linear_mma_gluon, nvfp4, ops, ring_layout

    result = {**provenance(), "copy_TBps": copy_bandwidth_tbps(), "rows": []}
    for shape, w, ring, x, config in tuned_ring_cases(TOKENS, LLAMA_SHAPES | QWEN_SHAPES):
        (m, k), n = x.shape, w.shape[0]
        cfg = {**config, "LAYOUT": ring_layout.RING}
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        row = {"shape": shape, "N": n, "K": k, "M": m, "config": config, "arms": {}}
        for arm, words_l2, scales_l2 in (
            ("served", False, False),
            ("scales_l2", False, True),
            ("words_l2", True, False),
            ("both_l2", True, True),
        ):
            read = nvfp4.NVFP4Weight(
                _repeated(w.packed, words_l2).contiguous(), _repeated(w.scales, scales_l2).contiguous(), w.global_scale
            )
            ref = ops.linear_reference(x, read)
            packed, scales = _repeated(ring, words_l2), _repeated(w.scales, scales_l2)
            run = functools.partial(linear_mma_gluon.launch, x, packed, scales, w.global_scale, None, out, cfg, True)
            row["arms"][arm] = figure = timed(run, out, ref)
            print(f"{shape:14s} M={m:2d} {arm:10s} {json.dumps(figure)}", flush=True)
        if m == 1:
            row["read_us"], row["read_tiling"] = read_us(w)
        result["rows"].append(row)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
