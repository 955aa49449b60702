"""Weight-only NVFP4 linear for many tokens: decode the weight to bf16 once, then cuBLAS.

At prefill sizes the GEMM is compute-bound, and cuBLAS's GEMMs beat the Triton forms that decode
the weight in registers again for every tile of tokens: on the H200 a seated Llama-3-8B-shaped
model prefilled 128-4096 rows at 1.7-2.0x the bf16 time through those forms
(bench/results/h200-e2e.json). Decoding once is a pass over the weight (0.56 bytes read and 2
written a parameter) that a GEMM over ``MIN_ROWS`` rows or more mostly hides; the adjudicator
measures whether it pays for each shape. The decoded copy is transient: it lives for one call.

The kernel writes each weight element as ``e2m1 * e4m3`` (exact in bf16) times the global scale,
rounded once to the activations' dtype: the same numbers ``nvfp4.dequantize`` gives.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import load_nvfp4_halves

# Below this many rows the decode pass costs more than the GEMM it feeds: the register-decoding
# forms win there, so the form is not offered (and not timed) for fewer rows.
MIN_ROWS = 64
# The decoded copy is transient but real memory: a Llama-3-8B MLP projection is 117 MiB in bf16,
# an LM-head slab 512 MiB. Layers above this are left to the forms that need no copy, so a
# serving engine that sized its KV cache to the card never meets a spike of that order.
MAX_DECODED_BYTES = 256 << 20


@triton.jit
def nvfp4_dequant_kernel(
    packed_ptr,
    scales_ptr,
    global_scale_ptr,
    out_ptr,
    N,
    K,
    stride_wn,
    stride_sn,
    stride_on,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PRMT: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    n_mask = rows < N
    wide = rows.to(tl.int64)
    lo, hi = load_nvfp4_halves(
        packed_ptr, scales_ptr, wide, n_mask, K, k0, stride_wn, stride_sn, BLOCK_N, BLOCK_K, USE_PRMT, EVEN_K
    )
    weight = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))  # byte b holds k = 2b (low nibble), 2b + 1
    weight = weight.to(tl.float32) * tl.load(global_scale_ptr)
    cols = k0 + tl.arange(0, BLOCK_K)
    mask = n_mask[:, None] if EVEN_K else n_mask[:, None] & (cols[None, :] < K)
    weight = weight.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")  # as torch rounds
    tl.store(out_ptr + wide[:, None] * stride_on + cols[None, :], weight, mask=mask)


def dequantize_triton(packed, scales, global_scale, dtype: torch.dtype, config: dict, use_prmt: bool) -> torch.Tensor:
    """The weight ``[N, K]`` in ``dtype``, decoded on the device."""
    n, k = packed.shape[0], packed.shape[1] * 2
    out = torch.empty(n, k, dtype=dtype, device=packed.device)
    grid = (triton.cdiv(n, config["BLOCK_N"]), triton.cdiv(k, config["BLOCK_K"]))
    nvfp4_dequant_kernel[grid](
        packed,
        scales.view(torch.uint8),
        global_scale,
        out,
        n,
        k,
        packed.stride(0),
        scales.stride(0),
        out.stride(0),
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"],
        USE_PRMT=use_prmt,
        EVEN_K=k % config["BLOCK_K"] == 0,
        num_warps=config["num_warps"],
    )
    return out


def launch(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    config: dict,
    use_prmt: bool,
) -> torch.Tensor:
    weight = dequantize_triton(packed, scales, global_scale, x.dtype, config, use_prmt)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias.to(x.dtype), x, weight.t(), out=out)


def configs(m: int, n: int, k: int) -> list[dict]:
    """Two tile shapes of the decode pass (it is a copy: 8-16 KB of codes in, 32-64 KB out a
    program); only from ``MIN_ROWS`` rows, where the GEMM can hide the pass, and only for layers
    whose decoded copy stays under ``MAX_DECODED_BYTES``."""
    if m < MIN_ROWS or k % 16 or n * k * 2 > MAX_DECODED_BYTES:
        return []
    return [{"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4}, {"BLOCK_N": 32, "BLOCK_K": 1024, "num_warps": 8}]
