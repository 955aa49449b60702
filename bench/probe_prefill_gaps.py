"""What do the seated prefill's launches cost beyond their own kernels' time?

Llama-3-8B's one-sequence prefill on the H200 (``h200-e2e-llama-c8820f2-b1b8.json``): the seated
graph took 10.78 ms and its kernels 9.90, 0.88 ms between kernels, where bf16's graph took its
kernels' 9.13. With the ``wgmma`` form's permute, projection and reduce chained by PDL
(``linear_wgmma_gluon.PDL_CHAIN``) the same prefill took 10.57 ms, its kernels 9.96. This probe
takes the projections out of the model to see what is left and where: Llama's four
projections at 128 tokens, 32 layers of them, captured in one CUDA graph, each after an
elementwise ATen kernel as in the prefill (the norm, the attention's output, the activation
precede them); the graph's time against its kernels' device time (profiler). Arms:

* ``bf16``: ``F.linear`` (cuBLAS);
* ``chained``: ours as served (``ops.linear``, the adjudicator's choice for each shape);
* ``unchained``: the same with ``PDL_CHAIN`` off;
* ``alone``: ours chained, the projections back to back with no ATen kernel between;
* ``ws_chained``: as ``chained`` with the warp-specialized form's chain on too
  (``linear_wgmma_ws_gluon.PDL_CHAIN``), which serves from 65 tokens.

H200 (97588c9, ``h200-probe-prefill-gaps-97588c9.json``): between kernels bf16 110 us, chained
187, unchained 215, alone 52; the kernels 4508 us against ours 5530. The launches are not where
the prefill's 1.1x goes; the projections' own time at 128 tokens is.

``python3 bench/probe_prefill_gaps.py OUT.json [TOKENS,...]`` (default 128) with flashrt importable
(``bench/gpu_run.sh``).
"""

import json
import statistics
import sys

import torch
import torch.nn.functional as F
from flashrt.bench.kernels import provenance
from flashrt.bench.timing import capture
from flashrt.kernels import linear_wgmma_gluon, linear_wgmma_ws_gluon, nvfp4, ops

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
TOKENS = (128,)
LAYERS = 32
ARMS = ("bf16", "chained", "unchained", "alone", "ws_chained")


def step_for(arm: str, xs: dict, weights: dict, packed: dict):
    def step():
        for _ in range(LAYERS):
            for name in SHAPES:
                a = xs[name] if arm == "alone" else xs[name] * 1.0
                if arm == "bf16":
                    F.linear(a, weights[name])
                else:
                    ops.linear(a, packed[name])

    return step


def measure(step, replays: int = 10) -> dict:
    """The graph's median time and, from the profiler over three replays, its kernels' summed
    device time, their count and the five largest by name."""
    from torch.profiler import ProfilerActivity, profile

    graph = capture(step, step)
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals.setdefault(event.name, []).append(event.device_time / 3)
    kernels_us = sum(sum(v) for v in totals.values())
    launches = sum(len(v) for v in totals.values()) / 3
    graph_us = statistics.median(times)
    top = sorted(totals.items(), key=lambda kv: -sum(kv[1]))[:6]
    del graph
    return {
        "graph_us": graph_us,
        "kernels_us": kernels_us,
        "gap_us": graph_us - kernels_us,
        "launches": launches,
        "top": [{"kernel": name[:80], "us": sum(v), "launches": len(v) / 3} for name, v in top],
    }


def main(path: str, tokens: tuple[int, ...] = TOKENS) -> None:
    served = linear_wgmma_gluon.PDL_CHAIN, linear_wgmma_ws_gluon.PDL_CHAIN
    result = {**provenance(), "layers": LAYERS, "shapes": SHAPES, "tokens": {}}
    torch.manual_seed(0)
    weights = {name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for name, (n, k) in SHAPES.items()}
    packed = {name: ops.for_serving(nvfp4.quantize(w)) for name, w in weights.items()}
    for m in tokens:
        xs = {name: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for name, (n, k) in SHAPES.items()}
        for name in SHAPES:
            ref = ops.linear_reference(xs[name], packed[name]).float()
            err = (ops.linear(xs[name], packed[name]).float() - ref).norm() / ref.norm()
            assert err < 1e-2, (name, float(err))
        arms = result["tokens"][m] = {}
        for arm in ARMS:
            linear_wgmma_gluon.PDL_CHAIN = arm != "unchained"
            linear_wgmma_ws_gluon.PDL_CHAIN = arm == "ws_chained"
            arms[arm] = fig = measure(step_for(arm, xs, weights, packed))
            print(
                f"{m:5d} {arm:10s} graph {fig['graph_us']:8.1f} us  kernels {fig['kernels_us']:8.1f}  "
                f"gap {fig['gap_us']:7.1f} ({fig['launches']:.0f} launches)",
                flush=True,
            )
            for t in fig["top"]:
                print(f"    {t['us']:8.1f} us  {t['launches']:4.0f}x  {t['kernel']}")
            with open(path, "w") as f:
                json.dump(result, f, indent=1)
        linear_wgmma_gluon.PDL_CHAIN, linear_wgmma_ws_gluon.PDL_CHAIN = served


if __name__ == "__main__":
    main(sys.argv[1], tuple(int(t) for t in sys.argv[2].split(",")) if len(sys.argv) > 2 else TOKENS)
