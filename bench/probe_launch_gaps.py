"""What one launch costs a CUDA graph, by how its kernels are launched.

Two e2e observations this answers (docs/benchmarks.md, session 44): torch's eager ``argmax`` at
the end of Qwen3-30B's bf16 step made each of its launches wait about 0.45 us (318 us a step, 58
without it), and in the seated step the kernels launched without PDL after ones launched with it
wait about 0.45 us each while the same kernels in the bf16 step wait 0.1. Here graphs of
``LAUNCHES`` one-program Triton kernels (each adds 1 to a counter, so every launch depends on the
one before), launched with PDL (``gdc_wait`` then ``gdc_launch_dependents``, as inductor's and the
ring forms' are) or without, with and without aten kernels among them, each timed over replays:

- ``plain`` / ``pdl``: every launch without PDL / with it;
- ``plain+aten_end`` / ``pdl+aten_end``: the same, and one aten ``argmax`` at the end (the e2e's old
  greedy selection);
- ``alternating``: PDL and plain launches in turn (the seated step's mix);
- ``pdl+aten_every_8``: an aten add after every eighth PDL launch.

``python3 bench/probe_launch_gaps.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).

H200 at 45c1956 (``h200-probe-launch-gaps-45c1956.json``, three runs alike to 0.002 us): 0.607 us
a launch all with PDL, 0.746 all plain (0.924 once PDL launches have run in the process), 1.099
alternating, 0.961 plain with the argmax at the end and 0.646 with PDL.
"""

import json
import sys

import torch
import triton
import triton.language as tl
from flashrt.bench.kernels import provenance
from flashrt.kernels.decode import wait_then_let_next_start

LAUNCHES = 256
REPLAYS = 50


@triton.jit
def bump_kernel(counter_ptr, PDL: tl.constexpr):
    """``counter += 1``: with ``PDL``, after the kernel before it, letting the next one start."""
    wait_then_let_next_start(PDL)
    tl.store(counter_ptr, tl.load(counter_ptr) + 1)


def bump(counter: torch.Tensor, pdl: bool) -> None:
    bump_kernel[(1,)](counter, PDL=pdl, launch_pdl=pdl, num_warps=1)


def step(kind: str, counter: torch.Tensor, logits: torch.Tensor, token: torch.Tensor) -> int:
    """One graph's launches of ``kind``; the Triton launches among them."""
    triton_launches = 0
    for i in range(LAUNCHES):
        pdl = kind.startswith("pdl") or (kind == "alternating" and i % 2 == 0)
        bump(counter, pdl)
        triton_launches += 1
        if kind == "pdl+aten_every_8" and i % 8 == 7:
            counter.add_(0)
    if kind.endswith("aten_end"):
        token.copy_(logits.argmax(-1, keepdim=True))
    return triton_launches


def timed(kind: str) -> dict:
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    logits = torch.randn(1, 151936, device="cuda")
    token = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(kind, counter, logits, token)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launches = step(kind, counter, logits, token)
    counter.zero_()
    graph.replay()
    torch.cuda.synchronize()
    if int(counter) != launches:
        raise RuntimeError(f"{kind}: {int(counter)} bumps, {launches} launched: a launch did not wait for the last")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / REPLAYS
    return {"kind": kind, "graph_us": us, "us_a_triton_launch": us / launches}


def main(path: str) -> None:
    result = {**provenance(), "launches": LAUNCHES, "replays": REPLAYS, "rows": []}
    for kind in ("plain", "pdl", "plain+aten_end", "pdl+aten_end", "alternating", "pdl+aten_every_8", "plain", "pdl"):
        row = timed(kind)
        result["rows"].append(row)
        print(f"{kind:18s} {row['graph_us']:8.1f} us a graph, {row['us_a_triton_launch']:.3f} a launch", flush=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
