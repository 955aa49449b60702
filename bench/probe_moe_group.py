"""The expert bank's grouping launch (``moe_fused.group_pairs``) at 4, 8 and 16 warps, same run.
At 427f4ad on the H200 it took 6.3 us a layer in the Qwen3-30B-A3B step at 16 tokens (0.30 ms
of 7.16, one program of 128 pairs at 4 warps), and ptxas gives that program 230 registers a
thread at 4 warps and 116 at 16 (sm_90a); at c58d18d (``h200-probe-moe-group-c58d18d.json``) 8
warps were fastest up to 32 tokens, hence ``moe_fused.GROUP_WARPS``. ``python3 bench/probe_moe_group.py OUT.json`` with
flashrt importable (``bench/gpu_run.sh`` makes it so); times are ``timing.graph_us``."""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import provenance
from flashrt.bench.timing import graph_us
from flashrt.kernels import moe_fused, moe_ring_gluon

EXPERTS, TOP_K = 128, 8  # Qwen3-30B-A3B


def main() -> None:
    rows = []
    for tokens in (1, 8, 16, 32, 64):
        ids = torch.stack([torch.randperm(EXPERTS, device="cuda")[:TOP_K] for _ in range(tokens)]).int()
        g = moe_fused.group_pairs(ids, EXPERTS, moe_ring_gluon.GROUP_TILE)
        row = {"T": tokens, "pairs": ids.numel()}
        for warps in (4, 8, 16):
            launch = functools.partial(moe_fused.group_pairs, ids, EXPERTS, moe_ring_gluon.GROUP_TILE, warps)
            out = launch()
            held = g.pair_rows.long()  # rows that hold a pair; the padding rows are never written
            same = [torch.equal(out[i], g[i]) for i in (0, 1, 3)] + [torch.equal(out[2][held], g[2][held])]
            assert all(same), (warps, same)
            row[f"warps{warps}_us"] = graph_us([launch])
        rows.append(row)
        print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({**provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
