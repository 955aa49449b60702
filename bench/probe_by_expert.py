"""Does the gate_up read each routed expert once at 2-8 tokens (``BY_EXPERT``)?

At 8 tokens Qwen3-30B's 64 pairs route to about 52 experts, and the per-pair gate_up reads an
expert once a pair: 113 MB a layer for 92 routed. On an H100 its chunked config ran 40.9 us a
layer in the e2e step at a9ec47d (``h100-e2e-qwen3-30b-a3b-b8-a9ec47d.json``), 93% of copy
bandwidth on the bytes it read; L2 served few repeats (``bank-order-probe``, session 41). By
expert, one program reads an expert for every token routed to it, token t in MMA column t, and
the kernel finds the expert's pairs itself, so no grouping launch comes before it.

This times every config before the slot down offered at each token count (the chunked per-pair
gate_ups and the by-expert ones), in rounds (each once a round), every output checked against
the reference first, on the Qwen3-30B bank as a seat serves it; and prints what the adjudicator
serves now that both are offered.

``python3 bench/probe_by_expert.py OUT.json [TOKENS ...]`` with flashrt importable
(``bench/gpu_run.sh``); the JSON is rewritten after each token count.
"""

import functools
import sys

from flashrt.bench.probe_bank_halves import served_bank, served_case
from flashrt.bench.probe_bank_stages import rounds, write
from flashrt.bench.probe_ring_depth import HIDDEN, INTER, E
from flashrt.kernels import moe_ring_gluon


def name(config: dict) -> str:
    way = "by expert" if config.get("BY_EXPERT") else f"chunks {config['CHUNKS']}"
    return f"{way}, warps {config['WARPS']}, stages {config['STAGES']}, down warps {config['DOWN_WARPS']}"


def main(path: str, tokens: tuple[int, ...] = (8, 4, 2)) -> None:
    result, ((gu, dn), banks), layout, _ = served_bank()
    copy_tbps = result["copy_TBps"]
    result["rows"] = rows = []
    gate_up_bytes, bank_bytes = gu.nbytes / E, (gu.nbytes + dn.nbytes) / E
    for t in tokens:
        x, ids, weights, out, ref, chosen = served_case(t, (gu, dn), banks, layout)
        configs = [c for c in moe_ring_gluon.configs(t, INTER, HIDDEN) if "DOWN_SLOTS" in c]
        launch = functools.partial(moe_ring_gluon.launch, x, *banks, ids, weights, out)
        runs = {name(c): functools.partial(launch, c | {"LAYOUT": layout}, False) for c in configs}
        errors, timings, medians = rounds(runs, out, ref)
        timed = {key: us for key, us in medians.items() if us is not None}
        best = {
            way: min(((us, key) for key, us in timed.items() if key.startswith(way)), default=(None, None))
            for way in ("chunks", "by expert")
        }
        routed = len(ids.reshape(-1).unique())
        row = {
            "T": t,
            "pairs": ids.numel(),
            "routed_experts": routed,
            "served": chosen.name,
            "rel_err": errors,
            "us": timings,
            "median_us": medians,
            "best": {way: {"config": key, "us": us} for way, (us, key) in best.items()},
            "routed_gate_up_bytes": routed * gate_up_bytes,
            "pair_gate_up_bytes": ids.numel() * gate_up_bytes,
            "bandwidth_frac_routed": {
                key: routed * bank_bytes / (us * 1e-6) / (copy_tbps * 1e12) for key, us in timed.items()
            },
        }
        rows.append(row)
        (chunked_us, chunked), (expert_us, by_expert) = best["chunks"], best["by expert"]
        ratio = chunked_us / expert_us if chunked_us and expert_us else None
        print(
            f"T={t} ({ids.numel()} pairs, {routed} experts): best chunked {chunked_us and round(chunked_us, 2)} us "
            f"({chunked}), best by expert {expert_us and round(expert_us, 2)} us ({by_expert}), "
            f"chunked / by expert {ratio and round(ratio, 3)}; served {chosen.name}",
            flush=True,
        )
        write(path, result)


if __name__ == "__main__":
    main(sys.argv[1], tuple(int(t) for t in sys.argv[2:]) or (8, 4, 2))
