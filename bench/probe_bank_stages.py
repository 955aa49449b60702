"""Are the chunked ring forms short of programs an SM at 1-8 tokens?

Nsight Compute on Qwen3-30B's bank at 8 tokens as served (``h200-ncu-ring8-db199b9.txt``): the
gate_up's 2-warp programs take 41 KiB of shared memory each, so 5 share an SM (2.5 warps a
scheduler, an instruction every 4.0 cycles a warp), the slot down's 4-warp ones 53 KiB, 4 an SM.
Its ring is ``STAGES`` steps deep, and until 7c8dda6 the chunked forms were offered 4 stages
only, where a pair's gate_up chunk is 4 steps (K 2048 in 2 chunks) and the down 3 (inter 768):
the ring held a program's whole read. Fewer stages mean less of it in flight a program and more
programs an SM. This times the served config against the same with 2, 3 and 4 stages in the
gate_up, in the down (``DOWN_STAGES``) and in both, in rounds (each variant once a round), every
output checked against the reference first. Then the same for the dense layers of Llama-3-8B and
Qwen3-30B at those token counts where the ring form (``mma_gluon``) serves them, chunked or not:
the served stages against the others.

``python3 bench/probe_bank_stages.py OUT.json [TOKENS ...]`` with flashrt importable
(``bench/gpu_run.sh``); the JSON is rewritten after each token count. The 8c79d3e and 07ceaeb
runs timed the dense layers at 1 and 2 tokens only; 442140c's (``-442140c-t8.json``) everything
at 8, 16 and 4, where 2 stages won three of Llama's layers at 16 (``linear_mma_gluon.WIDE_TILE_STAGES``).
"""

import functools
import json
import statistics
import sys

import torch
from flashrt.bench.probe_bank_halves import served_bank, served_case
from flashrt.bench.probe_ring_depth import SHAPES, E, timed
from flashrt.kernels import linear_mma_gluon, moe_ring_gluon, nvfp4, ops

STAGES = (2, 3, 4)
ROUNDS = 3


def variants(served: dict) -> dict[str, dict]:
    """The served config, and each (gate_up stages, down stages) pair it is not."""
    down = moe_ring_gluon.down_stages(served)
    out = {"served": served}
    for gate_up in STAGES:
        for down_stages in STAGES:
            if (gate_up, down_stages) != (served["STAGES"], down):
                out[f"gate_up {gate_up}, down {down_stages}"] = served | {"STAGES": gate_up, "DOWN_STAGES": down_stages}
    return out


def rounds(runs: dict, out: torch.Tensor, ref: torch.Tensor) -> tuple[dict, dict, dict]:
    """Each run checked and timed once a round, ``ROUNDS`` rounds: errors, timings, medians."""
    timings: dict[str, list] = {name: [] for name in runs}
    errors = {}
    for _ in range(ROUNDS):
        for name, run in runs.items():
            got = timed(run, out, ref)
            errors[name] = got.get("error") or got["rel_err"]
            timings[name].append(got["us"])
    medians = {name: statistics.median(us) if None not in us else None for name, us in timings.items()}
    return errors, timings, medians


def dense(copy_tbps: float, rows: list, write, tokens: tuple[int, ...]) -> None:
    """The dense layers at ``tokens`` where the ring form serves them."""
    torch.manual_seed(0)
    for shape, (n, k) in SHAPES.items():
        w = ops.for_serving(nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16)))
        for m in tokens:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)
            chosen = ops.choose_linear(x, w.packed, w.scales, w.global_scale, None, w.layout)
            served = ops.launch_params(chosen, w.layout)
            if chosen.form != "mma_gluon":
                print(f"{shape} M={m}: served {chosen.name}, not the ring form; skipped", flush=True)
                continue
            configs = {"served": served} | {
                f"stages {s}": served | {"STAGES": s} for s in STAGES if s != served["STAGES"]
            }
            runs = {
                name: functools.partial(
                    linear_mma_gluon.launch, x, w.packed, w.scales, w.global_scale, None, out, config, False
                )
                for name, config in configs.items()
            }
            errors, timings, medians = rounds(runs, out, ref)
            rows.append(
                {
                    "shape": shape,
                    "N": n,
                    "K": k,
                    "M": m,
                    "config": chosen.name,
                    "rel_err": errors,
                    "us": timings,
                    "median_us": medians,
                    "bandwidth_frac": {
                        name: w.nbytes / (us * 1e-6) / (copy_tbps * 1e12) for name, us in medians.items() if us
                    },
                }
            )
            print(
                f"{shape} M={m} {chosen.name}: "
                + ", ".join(f"{name} {us and round(us, 2)}" for name, us in medians.items()),
                flush=True,
            )
            write()


def main(path: str, tokens: tuple[int, ...] = (1, 2, 4, 8)) -> None:
    result, ((gu, dn), banks), layout, _ = served_bank()
    copy_tbps = result["copy_TBps"]
    result["rows"] = rows = []
    bank_bytes = (gu.nbytes + dn.nbytes) / E
    for t in tokens:
        x, ids, weights, out, ref, chosen = served_case(t, (gu, dn), banks, layout)
        served = ops.launch_params(chosen, layout)
        runs = {
            name: functools.partial(moe_ring_gluon.launch, x, *banks, ids, weights, out, config, False)
            for name, config in variants(served).items()
        }
        errors, timings, medians = rounds(runs, out, ref)
        routed = len(ids.reshape(-1).unique())
        row = {
            "T": t,
            "routed_experts": routed,
            "config": chosen.name,
            "rel_err": errors,
            "us": timings,
            "median_us": medians,
            "bandwidth_frac": {
                name: routed * bank_bytes / (us * 1e-6) / (copy_tbps * 1e12)
                for name, us in medians.items()
                if us is not None
            },
        }
        rows.append(row)
        print(
            f"T={t} ({routed} experts) {chosen.name}: "
            + ", ".join(f"{name} {us and round(us, 2)}" for name, us in medians.items()),
            flush=True,
        )
        write(path, result)
    dense(copy_tbps, rows, lambda: write(path, result), tokens)


def write(path: str, result: dict) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], tuple(int(t) for t in sys.argv[2:]) or (1, 2, 4, 8))
