"""Does the gate_up gain from reading an expert once for two of its pairs (``DUO``)?

At 8 tokens Qwen3-30B's gate_up per pair reads an expert once a pair, 64 reads for about 52
routed experts, and ran at 85% of copy bandwidth on those bytes in the H100's e2e step
(68f4cdf: 39.6 us a layer for 64 x 1.77 MB); the by-expert gate_up that read each expert once
for all its tokens lost (f09c839: 8 tokens' activations in its ring, a third fewer programs an
SM). ``DUO`` keeps a pair's program and its chunks and puts a second pair of the same expert in
the MMA columns the first's chunks leave empty, so an expert with two pairs is read once and the
program's ring grows by one pair's activations. This times every chunked config with the
64-row slot down the bank is offered at each token count, with and without ``DUO``, in rounds
(each once a round), each output checked against the reference first, in the layout a seat
serves.

``python3 bench/probe_duo.py OUT.json [TOKENS ...]`` with flashrt importable
(``bench/gpu_run.sh``); the JSON is rewritten after each token count.
"""

import functools
import sys

import torch
from flashrt.bench.kernels import _routing
from flashrt.bench.probe_bank_halves import served_bank
from flashrt.bench.probe_bank_stages import rounds, write
from flashrt.bench.probe_ring_depth import HIDDEN, INTER, TOP_K, E, name
from flashrt.kernels import moe_ring_gluon, ops


def duo_reads(ids: torch.Tensor) -> int:
    """Expert reads of the gate_up with ``DUO``: an expert with p pairs is read ceil(p / 2) times."""
    counts = torch.bincount(ids.reshape(-1))
    return int(((counts + 1) // 2).sum())


def main(path: str, tokens: tuple[int, ...] = (8, 4, 2)) -> None:
    result, ((gu, dn), banks), layout, _ = served_bank()
    result["rows"] = rows = []
    gate_up_bytes = gu.nbytes / E
    for t in tokens:
        torch.manual_seed(t)
        x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        ids, weights = _routing(t, E, TOP_K, 0)
        ref = ops.moe_reference(x, gu, dn, ids, weights)
        out = torch.empty_like(x)
        base = [
            c | {"LAYOUT": layout}
            for c in moe_ring_gluon.configs(t, INTER, HIDDEN)
            if "DOWN_SLOTS" in c and not c.get("DUO") and c["DOWN_WARPS"] == moe_ring_gluon.DUO_DOWN_WARPS
        ]
        configs = {name(c): c for c in base} | {f"{name(c)} DUO": c | {"DUO": 1} for c in base}
        runs = {
            key: functools.partial(moe_ring_gluon.launch, x, *banks, ids, weights, out, config, False)
            for key, config in configs.items()
        }
        errors, timings, medians = rounds(runs, out, ref)
        timed_medians = {key: us for key, us in medians.items() if us is not None}
        per_pair = min((us, key) for key, us in timed_medians.items() if not key.endswith("DUO"))
        duo = min((us, key) for key, us in timed_medians.items() if key.endswith("DUO"))
        routed = len(ids.reshape(-1).unique())
        row = {
            "T": t,
            "pairs": t * TOP_K,
            "routed_experts": routed,
            "duo_reads": duo_reads(ids),
            "rel_err": errors,
            "us": timings,
            "median_us": medians,
            "best_per_pair": {"config": per_pair[1], "us": per_pair[0]},
            "best_duo": {"config": duo[1], "us": duo[0]},
            "duo_over_per_pair": per_pair[0] / duo[0],
            "gate_up_routed_bytes": routed * gate_up_bytes,
        }
        rows.append(row)
        print(
            f"T={t} ({t * TOP_K} pairs, {routed} experts, {row['duo_reads']} DUO reads): best per pair "
            f"{per_pair[0]:.2f} us ({per_pair[1]}), best DUO {duo[0]:.2f} ({duo[1]}), x{row['duo_over_per_pair']:.3f}",
            flush=True,
        )
        write(path, result)


if __name__ == "__main__":
    main(sys.argv[1], tuple(int(t) for t in sys.argv[2:]) or (8, 4, 2))
