"""Would deeper rings, or more rows a warp, pay for the ring forms at 1-16 tokens?

``linear_mma_gluon`` offers 3 or 4 stages and 1 or 2 row tiles a warp; on the H200 the best
configs at one token are nearly all 4 stages (gate_up 25.5 us against 28.4 at 3, the LM head
54.9 against 59.5; ``h200-kernels-readflush.json``'s adjudication), the largest offered, and
gate_up's best is the largest tile (2 row tiles, 2 warps). A one-token ring slot of 32 rows is
4.6 KB, so 6-8 stages still fit many programs an SM. This times, same run, each from HBM
(``ops._time_us``):

- dense, the four Llama-3-8B projections and Qwen3-30B's attention projections: at one token
  every offered config, then the three best with 5, 6 and 8 stages and with twice the row tiles
  at 4 and 6 stages; at 8 and 16 tokens the best of the offered configs' top-4 by stages and
  the same variants of it;
- the Qwen3-30B expert bank on the ring (``moe_ring_gluon``) at 1, 8 and 16 tokens: every
  offered config, then the three best with 5 and 6 stages.

Every variant's output is checked against the reference (relative error under 1e-2) before
it is timed. ``python3 bench/probe_ring_depth.py OUT.json`` with flashrt importable
(``bench/gpu_run.sh`` makes it so); the JSON is rewritten after each shape.
"""

import functools
import json
import sys

import torch
from flashrt.bench.kernels import _routing, provenance
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import linear_mma_gluon, moe_ring_gluon, nvfp4, ops

SHAPES = {
    "llama_qkv": (6144, 4096),
    "llama_o": (4096, 4096),
    "llama_gate_up": (28672, 4096),
    "llama_down": (4096, 14336),
    "llama_lm_head": (128256, 4096),
    "qwen3_qkv": (5120, 2048),
    "qwen3_o": (2048, 4096),
}
E, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768


def qwen3_bank() -> tuple[nvfp4.NVFP4Weight, nvfp4.NVFP4Weight]:
    """Qwen3-30B-A3B's expert bank (gate_up, down) quantized from random bf16 weights on the GPU,
    from torch's generator as the caller seeded it."""
    gu = nvfp4.quantize(torch.randn(E, 2 * INTER, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02)
    dn = nvfp4.quantize(torch.randn(E, HIDDEN, INTER, device="cuda", dtype=torch.bfloat16) * 0.02)
    return gu, dn


def name(config: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(config.items()))


def variants(config: dict, fits) -> list[dict]:
    """Deeper rings of ``config`` and, for the dense form, twice its row tiles: those that fit."""
    out = [{**config, "STAGES": s} for s in (5, 6, 8) if s > config["STAGES"]]
    if "ROW_TILES" in config and config["ROW_TILES"] < 4:
        out += [{**config, "ROW_TILES": 2 * config["ROW_TILES"], "STAGES": s} for s in (4, 6)]
    return [c for c in out if fits(c)]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def timed(run, out, ref) -> dict:
    """Checked, then timed; a config that fails to build or launch is recorded, not fatal."""
    out.fill_(float("nan"))
    try:
        run()
        err = rel_err(out, ref)
        return {"rel_err": err, "us": ops._time_us(run) if err < 1e-2 else None}
    except Exception as e:
        return {"rel_err": None, "us": None, "error": f"{type(e).__name__}: {str(e)[:200]}"}


def fastest(results: dict) -> tuple[float | None, str | None]:
    """``(us, key)`` of the fastest of ``timed``'s results by key; ``(None, None)`` if none ran."""
    return min(((r["us"], key) for key, r in results.items() if r["us"] is not None), default=(None, None))


def dense(copy_tbps: float, rows: list, write) -> None:
    torch.manual_seed(0)
    for shape, (n, k) in SHAPES.items():
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        for m in (1, 8, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = ops.linear_reference(x, w)
            launch = functools.partial(linear_mma_gluon.launch, x, w.packed, w.scales, w.global_scale, None, out)
            offered = linear_mma_gluon.configs(m, n, k)
            if m > 1:  # the offered configs' 4-stage half: 4 stages won most shapes at 8-16 tokens
                offered = [c for c in offered if c["STAGES"] == 4]
            results = {name(c): timed(functools.partial(launch, c, True), out, ref) | {"config": c} for c in offered}
            ranked = sorted((r for r in results.values() if r["us"] is not None), key=lambda r: r["us"])
            best_offered = ranked[0]
            fits = lambda c: linear_mma_gluon.ring_bytes(c) <= linear_mma_gluon.RING_BYTES  # noqa: E731
            for base in ranked[: 3 if m == 1 else 1]:
                for c in variants(base["config"], fits):
                    if name(c) not in results:
                        results[name(c)] = timed(functools.partial(launch, c, True), out, ref) | {"config": c}
            best = min((r for r in results.values() if r["us"] is not None), key=lambda r: r["us"])
            nbytes = w.packed.numel() + w.scales.numel()
            row = {
                "shape": shape, "N": n, "K": k, "M": m,
                "offered_us": best_offered["us"], "offered_config": best_offered["config"],
                "best_us": best["us"], "best_config": best["config"],
                "offered_bandwidth_frac": nbytes / (best_offered["us"] * 1e-6) / (copy_tbps * 1e12),
                "best_bandwidth_frac": nbytes / (best["us"] * 1e-6) / (copy_tbps * 1e12),
                "all": {k: {"us": r["us"], "rel_err": r["rel_err"]} for k, r in results.items()},
            }  # fmt: skip
            rows.append(row)
            print(
                f"{shape:14s} M={m:2d}: offered {best_offered['us']:7.2f} us ({row['offered_bandwidth_frac']:.2f})"
                f"  best {best['us']:7.2f} us ({row['best_bandwidth_frac']:.2f})"
                f"  x{best_offered['us'] / best['us']:.3f}"
                f"  {name(best['config'])}",
                flush=True,
            )
            write()


def bank(rows: list, write) -> None:
    torch.manual_seed(0)
    gu, dn = qwen3_bank()
    banks = (gu.packed, gu.scales, gu.global_scale), (dn.packed, dn.scales, dn.global_scale)
    for t in (1, 8, 16):
        x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        _, ids, weights = x, *_routing(t, E, TOP_K, 0)
        out = torch.empty_like(x)
        ref = ops.moe_reference(x, gu, dn, ids, weights)
        launch = functools.partial(moe_ring_gluon.launch, x, *banks, ids, weights, out)
        offered = moe_ring_gluon.configs(t, INTER, HIDDEN)
        results = {name(c): timed(functools.partial(launch, c, False), out, ref) | {"config": c} for c in offered}
        ranked = sorted((r for r in results.values() if r["us"] is not None), key=lambda r: r["us"])
        for base in ranked[:3]:
            for c in variants(base["config"], lambda c: True):
                if name(c) not in results:
                    results[name(c)] = timed(functools.partial(launch, c, False), out, ref) | {"config": c}
        best = min((r for r in results.values() if r["us"] is not None), key=lambda r: r["us"])
        rows.append({
            "bank": "qwen3_30b", "T": t, "offered_us": ranked[0]["us"], "offered_config": ranked[0]["config"],
            "best_us": best["us"], "best_config": best["config"],
            "all": {k: {"us": r["us"], "rel_err": r["rel_err"]} for k, r in results.items()},
        })  # fmt: skip
        print(
            f"bank T={t:2d}: offered {ranked[0]['us']:7.2f} us  best {best['us']:7.2f} us"
            f"  x{ranked[0]['us'] / best['us']:.3f}  {name(best['config'])}",
            flush=True,
        )
        write()


def main(path: str) -> None:
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "dense": [], "bank": []}

    def write():
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    bank(result["bank"], write)
    dense(copy_tbps, result["dense"], write)


if __name__ == "__main__":
    main(sys.argv[1])
