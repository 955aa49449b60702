"""The ``wgmma`` form's activation permute, same run: the shipped gather (``permute_steps``)
against a transpose in registers (16-byte loads and stores, the compiler's shuffle between
them), ATen's strided copy (what it replaced) and a plain copy of the same bytes (the floor).
At d1dd53c on the H200 the gather took 3.1 us a call in the Llama prefill (0.40 ms of 10.84),
its 2-byte loads rather than its bytes the bound. ``python3 bench/probe_permute_steps.py
OUT.json`` with flashrt importable (``bench/gpu_run.sh`` makes it so); times are
``timing.graph_us`` (CUDA graph, inputs rotated past L2)."""

import json
import sys

import torch
import triton
import triton.language as tl
from flashrt.bench.kernels import provenance
from flashrt.bench.timing import copies_for, graph_us
from flashrt.kernels import permute_steps


@triton.jit
def permute_steps_transposed_kernel(x_ptr, out_ptr, M, stride_xm, stride_om, ROWS: tl.constexpr, V: tl.constexpr):
    """``permute_steps_kernel``'s result from a contiguous tile: ``[t, v, e, q1, q0]`` permuted
    to ``[v, q1, q0, t, e]`` in registers."""
    STEP: tl.constexpr = 32 * V
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    step = tl.program_id(1)
    cols = tl.arange(0, STEP)
    mask = rows[:, None] < M
    tile = tl.load(x_ptr + rows[:, None] * stride_xm + step * STEP + cols[None, :], mask=mask)
    tile = tl.reshape(tile, (ROWS, 4, V, 2, 2, 2))
    tile = tl.reshape(tl.permute(tile, (0, 2, 4, 5, 1, 3)), (ROWS, STEP))
    tl.store(out_ptr + rows[:, None] * stride_om + step * STEP + cols[None, :], tile, mask=mask)


def transposed(x: torch.Tensor, rows: int = permute_steps.ROWS) -> torch.Tensor:
    m, k = x.shape
    out = torch.empty_like(x)
    grid = (triton.cdiv(m, rows), k // (32 * permute_steps.V))
    permute_steps_transposed_kernel[grid](x, out, m, x.stride(0), out.stride(0), ROWS=rows, V=permute_steps.V)
    return out


ARMS = {
    "gather": permute_steps.permute_steps,
    "transposed": transposed,
    "transposed_rows16": lambda x: transposed(x, 16),
    "aten": permute_steps.permute_steps_reference,
    "copy": torch.clone,
}


def main() -> None:
    rows = []
    for m in (17, 32, 128, 256):
        for k in (2048, 4096, 14336):
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(m * k * 2))]
            expected = permute_steps.permute_steps_reference(xs[0])
            row = {"M": m, "K": k}
            for name, arm in ARMS.items():
                if name != "copy":
                    assert torch.equal(arm(xs[0]), expected), name
                row[f"{name}_us"] = graph_us([lambda x=x, arm=arm: arm(x) for x in xs])
            rows.append(row)
            print("  ".join(f"{key} {value:.2f}" if isinstance(value, float) else f"{key} {value}"
                            for key, value in row.items()), flush=True)  # fmt: skip
    with open(sys.argv[1], "w") as f:
        json.dump({**provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
