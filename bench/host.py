"""``python -m flashrt.bench host``: host time of one eager seated projection call, against bf16.

Eager serving (vLLM with ``enforce_eager``, its CPU backend, transformers ``generate()``) pays a
seated call's Python and dispatcher time on every token, where a captured decode step replays
device work only. Calls are issued back to back and timed on the wall clock, with one
synchronization at the end: at one token the device work of a 4096 x 4096 projection (a few
microseconds) is shorter than any arm's host work, so the figure is the host's.

Arms, all on the same weight and input: ``bf16`` (``nn.Linear``, what an unseated engine runs),
``seated`` (the seated module as it is called eagerly), and ``through_ops``: the same seat
entered through both ``torch.library`` ops, as an eager call was served before eager calls
skipped the dispatcher (the outer op measured whole, the inner op's hop as its difference
from the direct call). On a GPU the direct call is also taken apart: ``choose`` (the tuning
cache's recall of the shape's choice, ``ops.choose_linear``) and ``launch`` (the chosen form's
launcher on a ready output: its grid and Triton's launch); the rest of the direct call is the
checks, the reshapes and the output's allocation. At ed4426a the direct call took 63.9 us of the
seated call's 74.3 on the H200's host, against bf16's 19.2. Writes
``bench/results/<device>-host.json`` with provenance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from flashrt.bench.kernels import provenance
from flashrt.kernels import linear, ops, quantize
from flashrt.runtime import SeatProfile, attach


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _us_per_call(arms: dict, device: torch.device, calls: int, rounds: int = 15) -> dict[str, float]:
    """Median microseconds a call for each arm; the arms take turns within a round, so a drift of
    the machine's speed lands on all of them alike."""
    for fn in arms.values():
        for _ in range(max(10, calls // 10)):
            fn()
    _sync(device)
    times = {name: [] for name in arms}
    for _ in range(rounds):
        for name, fn in arms.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync(device)
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


def _direct_call_parts(x: torch.Tensor, w) -> dict:
    """The direct call's two large parts as arms of their own: the recall of its choice and the
    chosen form's launch (on a GPU, where ``linear`` launches a kernel)."""
    choice = ops.choose_linear(x, w.packed, w.scales, w.global_scale, None, w.layout)
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    form, params, prmt = ops.LINEAR_FORMS[choice.form], ops.launch_params(choice, w.layout), ops._use_prmt(x.device)
    return {
        "choose": lambda: ops.choose_linear(x, w.packed, w.scales, w.global_scale, None, w.layout),
        "launch": lambda: form.launch(x, w.packed, w.scales, w.global_scale, None, out, params, prmt),
    }


def run(features: int, calls: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    layer = torch.nn.Linear(features, features, bias=False, dtype=torch.bfloat16, device=device)
    bf16 = torch.nn.Linear(features, features, bias=False, dtype=torch.bfloat16, device=device)
    bf16.weight.data.copy_(layer.weight.data)
    model = torch.nn.Sequential(layer)
    x = torch.randn(1, features, dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        w = quantize(layer.weight.detach())  # what the seat packs (quantize is deterministic)
        handle = attach(model, SeatProfile(min_params=0))
        seat = handle.seats[0]
        assert seat.state == "seated", seat.reason
        arms = {
            "bf16": lambda: bf16(x),
            "seated": lambda: model(x),
            "outer_op": lambda: torch.ops.flashrt.served_linear(x, None, seat.served, features),
            "inner_op": lambda: torch.ops.flashrt.nvfp4_linear(x, w.packed, w.scales, w.global_scale, None, w.layout),
            "inner_direct": lambda: linear(x, w),
        }
        if device.type == "cuda":
            arms |= _direct_call_parts(x, w)
        assert ops.eager(x)
        figures = _us_per_call(arms, device, calls)
    handle.detach()
    through_ops = figures["outer_op"] + figures["inner_op"] - figures["inner_direct"]
    parts = {}
    if "launch" in figures:
        parts = {"direct_rest_us": figures["inner_direct"] - figures["choose"] - figures["launch"]}
    return parts | {
        "features": features,
        "tokens": 1,
        "bf16_us": figures["bf16"],
        "seated_us": figures["seated"],
        "through_ops_us": through_ops,
        "arms_us": figures,
        "seated_vs_bf16": figures["seated"] / figures["bf16"],
        "through_ops_vs_seated": through_ops / figures["seated"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt.bench host")
    parser.add_argument(
        "--features",
        type=int,
        default=0,
        help="square weight; 0: 4096 on a GPU, 64 on the CPU (where the reference arithmetic would hide the host time)",
    )
    parser.add_argument("--calls", type=int, default=0, help="calls a round; 0: 2000 on a GPU, 500 on the CPU")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    row = run(args.features or (4096 if gpu else 64), args.calls or (2000 if gpu else 500), device)
    result = provenance() | {"rows": [row]}
    name = result["device"].lower().replace("nvidia ", "").replace(" ", "-")
    out = Path(args.out or f"bench/results/{name}-host.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"{result['device']}, torch {result['torch']}, {row['features']} x {row['features']}, one token, eager")
    for arm, us in row["arms_us"].items():
        print(f"  {arm:13s} {us:8.1f} us a call")
    if "direct_rest_us" in row:
        print(f"  the direct call less choose and launch: {row['direct_rest_us']:.1f} us")
    print(f"  seated {row['seated_us']:.1f} us against bf16 {row['bf16_us']:.1f} (x{row['seated_vs_bf16']:.2f})")
    print(f"  through both ops {row['through_ops_us']:.1f} us (x{row['through_ops_vs_seated']:.2f} the seated call)")
    print(f"wrote {out}")
    return 0
