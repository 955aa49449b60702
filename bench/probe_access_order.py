"""Does the order a program reads its weight bytes in cost HBM bandwidth?

The timeline of the ring form at one token (``bench/probe_timeline.py``,
``h200-probe-timeline-4f2ba29.json``) has every program of Llama's qkv starting within 0.13 us
and ending 4.3-5.9 us later, after four ring steps of about 1.1-1.6 us each: 13.4 MB in 6 us,
2.2 TB/s, where a copy moves 4.1. Each step a program copies 128 bytes from each of its 32 rows,
rows 2 KB apart (a checkpoint's row-major words), so HBM sees 128-byte pieces scattered over the
whole weight. Here a plain Triton read walks the same bytes in the same program-and-step shape,
its pipeline in flight (``tl.range(num_stages=)``), in four orders:

- ``rows``: a step reads ``STEP`` bytes of each of the program's rows (the ring's order at 128);
- ``tiled``: the same bytes laid out so a step's are contiguous (a program's region is a
  sequence of ``ROWS x STEP``-byte blocks): one 4 KB piece a step instead of 32.

Same bytes, same programs, same steps; only the addresses differ. Timed as the adjudicator
times a call (``ops._time_us``), and each read's sum checked against the words'.

``python3 bench/probe_access_order.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).

Answer, H200 at 3882099 (``h200-probe-access-order-3882099.json``): little. Within 10% both ways
in 38 of 48 pairs; the contiguous order won the other 10 by 10-32%. At the ring's own shape (32
rows, 128-byte steps, 4 stages) Llama's down read in 14.27 us contiguous against 15.82 in rows,
qkv 6.29 against 6.71, gate_up and Qwen3's qkv within 2% (docs/benchmarks.md, session 44).
"""

import functools
import itertools
import json
import sys

import torch
import triton
import triton.language as tl
from flashrt.bench.kernels import provenance
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import ops

# (layer, rows, row bytes): Llama-3-8B's qkv, gate_up and down, Qwen3-30B's qkv, as NVFP4 words.
SHAPES = (
    ("llama_qkv", 6144, 2048),
    ("llama_gate_up", 28672, 2048),
    ("llama_down", 4096, 7168),
    ("qwen3_qkv", 5120, 1024),
)
ORDERS = ("rows", "tiled")
STEP_BYTES = (128, 256, 512)
ROWS = (32, 64)
STAGES = (2, 4)
WARPS = 2


@triton.jit
def read_kernel(words_ptr, sums_ptr, ROW_WORDS: tl.constexpr, ROWS: tl.constexpr, STEP: tl.constexpr,
                TILED: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    """Program p reads its ``ROWS`` rows' words a ``STEP``-word step at a time and stores their sum."""
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, STEP)[None, :]
    base = words_ptr + pid * ROWS * ROW_WORDS
    offs = r * STEP + c if TILED else r * ROW_WORDS + c
    acc = tl.zeros((ROWS, STEP), dtype=tl.int32)
    for s in tl.range(0, ROW_WORDS // STEP, num_stages=STAGES):
        acc += tl.load(base + s * (ROWS * STEP if TILED else STEP) + offs)
    tl.store(sums_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


def wrapped_sum(t: torch.Tensor) -> int:
    return int(t.to(torch.int64).sum()) % 2**32


def read(words: torch.Tensor, sums: torch.Tensor, row_words: int, rows: int, step: int, tiled: bool, stages: int):
    read_kernel[(sums.numel(),)](
        words, sums, ROW_WORDS=row_words, ROWS=rows, STEP=step, TILED=tiled, STAGES=stages, num_warps=WARPS
    )


def main(path: str) -> None:
    copy_tbps = copy_bandwidth_tbps()
    result = {**provenance(), "copy_TBps": copy_tbps, "warps": WARPS, "rows": []}
    for layer, n, row_bytes in SHAPES:
        words = torch.randint(-(2**30), 2**30, (n * row_bytes // 4,), dtype=torch.int32, device="cuda")
        for rows, step_bytes, stages, order in itertools.product(ROWS, STEP_BYTES, STAGES, ORDERS):
            sums = torch.empty(n // rows, dtype=torch.int32, device="cuda")
            run = functools.partial(read, words, sums, row_bytes // 4, rows, step_bytes // 4, order == "tiled", stages)
            run()
            if wrapped_sum(sums) != wrapped_sum(words):
                raise RuntimeError(f"{layer} {order}: the read kernel's sums do not add up to the words'")
            us = ops._time_us(run)
            row = {"layer": layer, "N": n, "row_bytes": row_bytes, "rows": rows, "step_bytes": step_bytes,
                   "stages": stages, "order": order, "us": us, "bytes": words.numel() * 4}  # fmt: skip
            row["bandwidth_frac"] = row["bytes"] / (us * 1e-6) / (copy_tbps * 1e12)
            result["rows"].append(row)
            print(
                f"{layer:14s} rows {rows:3d} step {step_bytes:4d} B stages {stages} {order:6s} {us:7.2f} us "
                f"({row['bandwidth_frac']:.2f} of copy)",
                flush=True,
            )
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
