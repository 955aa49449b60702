"""The ``wgmma`` form's activation permute, same run: the shipped transpose in registers
(``permute_steps``, 16-byte loads and stores) at 8 and 16 rows a program, against the gather it
replaced (2-byte loads from one row segment a step), ATen's strided copy (what the gather
replaced) and a plain copy of the same bytes (the floor). At c58d18d on the H200
(``h200-probe-permute-steps-c58d18d.json``) the transpose took 1.23-4.71 us, the gather 1.73-10.13.
``python3 bench/probe_permute_steps.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``
makes it so); times are ``timing.graph_us`` (CUDA graph, inputs rotated past L2)."""

import json
import sys

import torch
import triton
import triton.language as tl
from flashrt.bench.kernels import provenance
from flashrt.bench.timing import copies_for, graph_us
from flashrt.kernels import permute_steps
from flashrt.kernels.decode import cdiv


@triton.jit
def permute_steps_gather_kernel(x_ptr, out_ptr, M, stride_xm, stride_om, ROWS: tl.constexpr, V: tl.constexpr):
    """``permute_steps_kernel``'s result gathered: each output element loads its natural index."""
    STEP: tl.constexpr = 32 * V
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    step = tl.program_id(1)
    p = tl.arange(0, STEP)
    natural = 8 * V * ((p // 2) % 4) + 8 * (p // 32) + 4 * (p % 2) + 2 * ((p // 16) % 2) + (p // 8) % 2
    mask = rows[:, None] < M
    vals = tl.load(x_ptr + rows[:, None] * stride_xm + step * STEP + natural[None, :], mask=mask)
    tl.store(out_ptr + rows[:, None] * stride_om + step * STEP + p[None, :], vals, mask=mask)


def gathered(x: torch.Tensor) -> torch.Tensor:
    """``permute_steps`` with the gather kernel: the same grid, rows and warps."""
    m, k = x.shape
    out = torch.empty_like(x)
    grid = (cdiv(m, permute_steps.ROWS), k // (32 * permute_steps.V))
    permute_steps_gather_kernel[grid](
        x, out, m, x.stride(0), out.stride(0), ROWS=permute_steps.ROWS, V=permute_steps.V, num_warps=4
    )
    return out


ARMS = {
    "transposed": permute_steps.permute_steps,
    "transposed_rows16": lambda x: permute_steps.permute_steps(x, 16),
    "gather": gathered,
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
