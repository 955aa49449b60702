"""Where does a one-token projection's time go: a fixed cost a launch, or bytes at a rate?

At one token the ring form reads Llama-3-8B's gate_up (66 MB) at 71% of the copy bandwidth and
a 295 MB LM head at 85% (``h200-kernels-m1-bank-1c59e32.json``,
``h200-probe-ring-layout-fd70e4d.json``): as if every call paid a few microseconds on top of
streaming at about 90%. cuBLAS bf16 looks the same on the small layers (qkv's 50 MB in 15.9
us, 3.2 TB/s) but not on gate_up's 235 MB (4.2 TB/s). A fixed cost that large caps the small
layers' ratio whatever the kernel does with its bytes, so it decides where work can pay.

Each arm is timed on one K and a range of N (rows), one token, the way the adjudicator times
(``ops._time_us``: from HBM, each call after a read-only L2 flush, in a CUDA graph), and fitted
``us = fixed + bytes / rate``:

* ``ours``: the best offered ``mma_gluon`` config, weights in ``ring_layout``, each checked
  against the reference first;
* ``bf16``: ``F.linear`` on the bf16 weight (cuBLAS);
* ``read``: a Triton kernel that only reads the NVFP4 bytes (16-byte loads, best of a few
  tilings): the memory system's own fixed cost and rate for these sizes;
* ``empty``: a launch of 132 programs that read nothing, the graph's cost a kernel.

``python3 bench/probe_rows.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import functools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from flashrt.bench.kernels import provenance
from flashrt.bench.probe_ring_depth import name, timed
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import linear_mma_gluon, nvfp4, ops, ring_layout
from flashrt.kernels.decode import cdiv

K = 4096
ROWS = (4096, 8192, 14336, 28672, 57344, 114688)
READ_TILINGS = ((1024, 4, 4), (2048, 4, 4), (2048, 8, 8), (4096, 4, 8), (1024, 1, 4), (4096, 2, 4))
DEADLINE_S = float(os.environ.get("PROBE_DEADLINE_S", "1e9"))


@triton.jit
def _read_kernel(src, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    base = tl.program_id(0) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], tl.int32)
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n, other=0)
    tl.store(out + tl.program_id(0), tl.sum(acc, axis=0))


@triton.jit
def _empty_kernel(out):
    tl.store(out + tl.program_id(0), 0)


def read_us(w) -> tuple[float, str]:
    """Best of ``READ_TILINGS`` reading the bytes of NVFP4 weight ``w`` (packed and scales) once."""
    words = torch.cat([w.packed.view(-1), w.scales.view(torch.uint8).view(-1)]).view(torch.int32)
    best = None
    for block, iters, warps in READ_TILINGS:
        programs = cdiv(words.numel(), block * iters)
        out = torch.empty(programs, dtype=torch.int32, device=words.device)
        kernel = _read_kernel[(programs,)]
        run = functools.partial(kernel, words, out, words.numel(), BLOCK=block, ITERS=iters, num_warps=warps)
        us = ops._time_us(run)
        if best is None or us < best[0]:
            best = (us, f"BLOCK={block},ITERS={iters},warps={warps}")
    return best


def fit(points: list[tuple[float, float]]) -> dict:
    """Least squares ``us = fixed_us + bytes / rate``: the fixed cost and the rate in TB/s."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    slope = sum((b - mx) * (t - my) for b, t in points) / sum((b - mx) ** 2 for b, _ in points)
    fixed = my - slope * mx
    worst = max(abs(t - fixed - slope * b) for b, t in points)
    return {"fixed_us": fixed, "rate_TBps": 1e-6 / slope if slope > 0 else None, "worst_residual_us": worst}


def main(path: str) -> None:
    start = time.monotonic()
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "K": K, "M": 1, "rows": []}
    sink = torch.empty(132, dtype=torch.int32, device="cuda")
    result["empty_us"] = ops._time_us(lambda: _empty_kernel[(132,)](sink))
    print(f"copy {copy_tbps:.2f} TB/s, an empty launch {result['empty_us']:.2f} us", flush=True)
    torch.manual_seed(0)
    for n in ROWS:
        if time.monotonic() - start > DEADLINE_S:
            print("deadline: stopping", flush=True)
            break
        w16 = torch.randn(n, K, device="cuda", dtype=torch.bfloat16)
        w = nvfp4.quantize(w16)
        ring = ring_layout.pack(w.packed)
        nbytes = w.packed.numel() + w.scales.numel()
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        ref = ops.linear_reference(x, w)

        def run(c, ring=ring, w=w, x=x, out=out):
            cfg = {**c, "LAYOUT": ring_layout.RING}
            return linear_mma_gluon.launch(x, ring, w.scales, w.global_scale, None, out, cfg, True)

        offered = linear_mma_gluon.configs(1, n, K)
        ours = {name(c): timed(functools.partial(run, c), out, ref) | {"config": c} for c in offered}
        best = min((r for r in ours.values() if r["us"] is not None), key=lambda r: r["us"])
        bf16_us = ops._time_us(lambda w16=w16, x=x: F.linear(x, w16))
        read, tiling = read_us(w)
        row = {
            "N": n, "nvfp4_bytes": nbytes, "bf16_bytes": 2 * n * K,
            "ours_us": best["us"], "ours_config": best["config"], "bf16_us": bf16_us, "read_us": read,
            "read_tiling": tiling,
            "all_ours": {k: {"us": r["us"], "rel_err": r["rel_err"]} for k, r in ours.items()},
        }  # fmt: skip
        result["rows"].append(row)
        print(
            f"N={n:6d} {nbytes / 1e6:6.1f} MB: ours {best['us']:7.2f} us"
            f" ({nbytes / best['us'] / 1e6 / copy_tbps:.2f} of copy)"
            f"  read {read:7.2f} ({nbytes / read / 1e6 / copy_tbps:.2f})  bf16 {bf16_us:7.2f}"
            f" ({2 * n * K / bf16_us / 1e6 / copy_tbps:.2f})  x{bf16_us / best['us']:.2f}  {name(best['config'])}",
            flush=True,
        )
        del w16, w, ring
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    if len(result["rows"]) >= 3:
        for arm, size in (("ours", "nvfp4_bytes"), ("read", "nvfp4_bytes"), ("bf16", "bf16_bytes")):
            result[f"{arm}_fit"] = fit([(r[size], r[f"{arm}_us"]) for r in result["rows"]])
            f_ = result[f"{arm}_fit"]
            rate = f_["rate_TBps"] or 0
            print(
                f"{arm:5s}: fixed {f_['fixed_us']:6.2f} us, rate {rate:.2f} TB/s ({rate / copy_tbps:.2f} of copy),"
                f" worst residual {f_['worst_residual_us']:.2f} us"
            )
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
