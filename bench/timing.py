"""Timing on a GPU the way a serving engine runs kernels: many calls captured in one CUDA graph.

Each timed call reads a different copy of its weights (``rotate``), so the weights come from
HBM, not from the 50 MB L2 left warm by the previous call. A graph replays the calls back to
back with no host launch gaps, which is how vLLM runs decode steps; the median over replays,
divided by calls a replay, is the figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

L2_BYTES = 50 << 20


def copies_for(nbytes: int, at_least: int = 2, at_most: int = 64) -> int:
    """Enough copies of a ``nbytes`` operand that cycling through them spans 3x the L2."""
    return max(at_least, min(at_most, -(-3 * L2_BYTES // max(nbytes, 1))))


def capture(warm: Callable[[], object], body: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """``body`` captured in a CUDA graph, after ``warm`` ran on a side stream (compile, tune and
    allocate outside the capture), replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        warm()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def graph_us(calls: list[Callable[[], object]], replays: int = 15, rounds: int = 4) -> float:
    """Median microseconds a call, for ``calls`` (one per weight copy) captured in one graph."""
    per_round = max(1, 64 // len(calls))

    def each_once():
        for fn in calls:
            fn()

    def body():
        for _ in range(per_round):
            each_once()

    graph = capture(each_once, body)
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        start.record()
        for _ in range(rounds):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (rounds * per_round * len(calls)))
    del graph
    return statistics.median(times)


def eager_us(calls: list[Callable[[], object]], replays: int = 15) -> float:
    """For arms that cannot be captured (a host sync per call): events around eager calls."""
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        start.record()
        for fn in calls:
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times)


def copy_bandwidth_tbps(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read plus bytes written, in TB/s."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = eager_us([lambda: dst.copy_(src)], replays=10)
    return 2 * nbytes / (us * 1e-6) / 1e12
