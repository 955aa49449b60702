"""What makes every launch in the seated graphs wait longer?

Llama-3-8B on the H200 (6de6337, ``h200-e2e-llama-6de6337-b1.json``, ``idle_and_overlap`` in its
kernel breakdowns): in the bf16 arm's graphs a kernel starts about 0.1 us after the one before
it ends (decode step 57 us idle in 490 launches; prefill 345 in 1627), in the seated arm's about
0.45 (185 in 427; 886 in 1820), and not only before our kernels: the same ATen and compiled
kernels wait 0.43-0.46 us there (the norm's ``rsqrt`` 27.9 us in 65 launches against 5.8). At
0.1 us a launch the seated prefill would be 1.07x bf16, not 1.12x. Qwen3-30B's bf16 arm, whose
experts are our Triton bank, waits 0.5 us a launch too.

What the slow graphs share: kernels of ours with more than 48 KiB of shared memory (the ring
forms, the Triton expert bank), for which Triton's loader sets ``CU_FUNC_CACHE_PREFER_SHARED``;
the fast one has only small Triton kernels and cuBLAS.

Here: 256 ATen adds in a chain, captured in one CUDA graph, and the same chain with one other
ingredient of the seated graphs: a plain Triton kernel every 8 adds, a Gluon ring linear
(``linear_mma_gluon``, one token) every 8, the same ring with its cache preference reset to
``CU_FUNC_CACHE_PREFER_NONE``, with its dynamic shared memory limit cut from the device's
maximum (where Triton's loader sets it) to what it launches with, and with both, cuBLAS bf16 on
the same shape every 8, one device-to-device copy
(the seated decode step has one), and a split-K reduce launched with PDL every 8. For each arm,
the idle time before the adds (from the profiler, as ``bench/e2e.py``'s ``idle_and_overlap``) and the
graph's replay time.

``python3 bench/probe_graph_gaps.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import json
import statistics
import sys

import torch
import triton
import triton.language as tl
from flashrt.bench.cache_preference import PREFER_NONE, PREFER_SHARED, limit_loaded, reset_loaded
from flashrt.bench.e2e import replayed_kernels
from flashrt.bench.kernels import provenance
from flashrt.bench.timing import capture
from flashrt.kernels import linear_mma, linear_mma_gluon, nvfp4, ring_layout
from flashrt.kernels.decode import cdiv

ADDS = 256
EVERY = 8
ELEMENTS = 1 << 20
# The H200's tuned ring config for a 4096 x 4096 layer at one token (kernels/choices).
RING_CONFIG = {"BLOCK_M": 8, "CHUNKS": 8, "ROW_TILES": 1, "STAGES": 4, "WARPS": 4, "LAYOUT": 1}


@triton.jit
def add_one_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)


# What each later ring arm changes on the loaded kernel, in order (each after the one before):
# the cache preference to the driver's default; back to Triton's, with the dynamic shared memory
# limit down to what the kernel launches with; both.
RING_SETTINGS = {
    "prefer_none": lambda fn: reset_loaded(fn, PREFER_NONE),
    "exact_smem": lambda fn: reset_loaded(fn, PREFER_SHARED) + limit_loaded(fn),
    "prefer_none_exact_smem": lambda fn: reset_loaded(fn, PREFER_NONE),
}


def arms() -> dict:
    x = torch.zeros(ELEMENTS, device="cuda")
    copy_to = torch.empty_like(x)
    w = nvfp4.quantize(torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16))
    ring = ring_layout.pack(w.packed)
    acts = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1, 4096, device="cuda", dtype=torch.bfloat16)
    partials = torch.randn(2, 16, 4096, device="cuda")
    summed = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)

    dense = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def ring_linear():
        linear_mma_gluon.launch(acts, ring, w.scales, w.global_scale, None, out, RING_CONFIG, True)

    extras = {
        "aten": None,
        "triton": lambda: add_one_kernel[(cdiv(ELEMENTS, 1024),)](x, ELEMENTS, BLOCK=1024),
        "gluon_ring": ring_linear,
        **{f"gluon_ring_{setting}": ring_linear for setting in RING_SETTINGS},  # main sets each first
        "cublas": lambda: torch.mm(acts, dense.t(), out=out),
        "pdl_reduce": lambda: linear_mma.reduce_splits(partials, None, None, summed, pdl=True),
    }

    def chain(extra, copy=False):
        def body():
            if copy:
                copy_to.copy_(x)
            for i in range(ADDS):
                x.add_(1.0)
                if extra is not None and i % EVERY == EVERY - 1:
                    extra()

        return body

    built = {name: chain(extra) for name, extra in extras.items()}
    built["memcpy"] = chain(None, copy=True)
    return built


def measure(body, replays: int = 10) -> dict:
    graph = capture(body, body)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(15):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    launches = replayed_kernels(graph, replays)
    adds = [gap for e, gap, _ in launches if "add" in e.name.lower() and "Functor" in e.name]
    by_other: dict = {}  # name: (idle before, device time) of each launch
    for e, gap, _ in launches:
        if "Functor" not in e.name:
            by_other.setdefault(e.name[:60], []).append((gap, e.device_time))
    return {
        "graph_us": statistics.median(times),
        "launches_per_replay": len(launches) / replays,
        "idle_us_per_replay": sum(gap for _, gap, _ in launches) / replays,
        "idle_before_add_us": statistics.mean(adds),
        "idle_before_add_median_us": statistics.median(adds),
        "idle_before_others_us": {name: statistics.mean(g for g, _ in runs) for name, runs in by_other.items()},
        "others_us": {name: statistics.mean(t for _, t in runs) for name, runs in by_other.items()},
    }


def main(path: str) -> None:
    result = {**provenance(), "adds": ADDS, "every": EVERY, "arms": {}}
    ring_kernel = linear_mma_gluon.nvfp4_linear_mma_gluon_kernel
    for name, body in arms().items():
        setting = name.removeprefix("gluon_ring_")
        if setting in RING_SETTINGS:  # the kernel is loaded by the "gluon_ring" arm before
            result[f"set_{setting}"] = RING_SETTINGS[setting](ring_kernel)
        result["arms"][name] = measure(body)
        row = result["arms"][name]
        print(
            f"{name:28s} graph {row['graph_us']:8.1f} us  launches {row['launches_per_replay']:5.0f}  "
            f"idle {row['idle_us_per_replay']:7.1f} us  before an add {row['idle_before_add_us']:.3f} us "
            f"(median {row['idle_before_add_median_us']:.3f})  others: idle {row['idle_before_others_us']} "
            f"own {row['others_us']}",
            flush=True,
        )
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
