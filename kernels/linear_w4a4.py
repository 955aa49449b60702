"""NVFP4 x NVFP4 linear (W4A4) on Blackwell's block-scaled FP4 tensor cores.

``y [M, N] = q(x) @ dequant(W)^T``: the activations are quantized per token to NVFP4 (E2M1
codes, one E4M3 scale per 16, one fp32 scale per token: ``quantizer.quantize_rows``, one launch,
bit-identical to ``nvfp4.quantize_reference`` row by row), then one
``tl.dot_scaled(e2m1, e4m3 scales, e2m1, e4m3 scales)`` main loop multiplies codes directly:
``UTCOMMA.4X`` on sm_100/sm_110, ``OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X`` on sm_120 (CI checks the
SASS). A weight-only kernel never reaches these instructions: its weights are upcast to bf16.
On sm_90 Triton decomposes the same ``dot_scaled`` into bf16 MMAs, so the form is not offered
there (the qualification reads the device's compute capability).

Quantizing activations changes the function: the adjudicator ranks this form below the W4A16
forms (``PRECISION``), so it wins only by more than the margin and only above the parity floor.
Its arithmetic is ``w4a4_reference``. Triton's interpreter reads ``dot_scaled`` scales as e8m0,
so interpreted runs multiply the decoded tiles instead (``decode.dot_nvfp4``): CI checks the
kernel's indexing and arithmetic on the CPU, the GPU suite the ``dot_scaled`` lowering.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import cdiv, dot_nvfp4, interpreted, load_nvfp4_codes
from flashrt.kernels.nvfp4 import NVFP4Weight, dequantize, quantize_reference
from flashrt.kernels.quantizer import quantize_rows

PRECISION = -1  # below the W4A16 forms (0): activations lose bits here
MIN_COMPUTE_MAJOR = 10  # block-scaled FP4 tensor cores: Blackwell (10, 12) and Thor (11)


@triton.jit
def nvfp4_linear_w4a4_kernel(
    # pointers
    xq_ptr,
    xs_ptr,
    xg_ptr,
    wq_ptr,
    ws_ptr,
    wg_ptr,
    bias_ptr,
    out_ptr,
    # dimensions
    M,
    N,
    K,
    # strides (packed rows in bytes, scale rows in scales, out in elements)
    stride_xm,
    stride_xsm,
    stride_wn,
    stride_wsn,
    stride_om,
    # meta-parameters
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    INTERPRETED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_rows = offs_m.to(tl.int64)
    w_rows = offs_n.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xq, xs = load_nvfp4_codes(xq_ptr, xs_ptr, x_rows, m_mask, K, k0, stride_xm, stride_xsm, BLOCK_K, EVEN_K)
        wq, ws = load_nvfp4_codes(wq_ptr, ws_ptr, w_rows, n_mask, K, k0, stride_wn, stride_wsn, BLOCK_K, EVEN_K)
        acc = dot_nvfp4(xq, xs, wq, ws, acc, INTERPRETED)
    acc = acc * tl.load(xg_ptr + offs_m, mask=m_mask, other=0.0)[:, None] * tl.load(wg_ptr)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def w4a4_reference(x: torch.Tensor, w: NVFP4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The form's arithmetic in plain torch: per-token NVFP4 ``x``, dequantized, times the
    dequantized weight, in float64, returned in ``x``'s dtype."""
    xq = quantize_reference(x.reshape(x.shape[0], 1, x.shape[1]).cpu())
    xd = dequantize(xq, torch.float64)[:, 0].to(x.device)
    out = xd @ dequantize(w, torch.float64).t()
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype)


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
    """Quantize ``x`` per token (one launch), then the FP4 x FP4 GEMM; ``use_prmt`` is unused."""
    m, k = x.shape
    n = packed.shape[0]
    xq = quantize_rows(x)
    grid = (cdiv(n, config["BLOCK_N"]), cdiv(m, config["BLOCK_M"]))
    nvfp4_linear_w4a4_kernel[grid](
        xq.packed,
        xq.scales.view(torch.uint8),
        xq.global_scale,
        packed,
        scales.view(torch.uint8),
        global_scale,
        bias if bias is not None else out,
        out,
        m,
        n,
        k,
        xq.packed.stride(0),
        xq.scales.stride(0),
        packed.stride(0),
        scales.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        EVEN_K=k % config["BLOCK_K"] == 0,
        INTERPRETED=interpreted(),
        BLOCK_M=config["BLOCK_M"],
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    return out


def qualifies(capability: tuple[int, int] | None) -> bool:
    """Offered only where the FP4 tensor cores are: compute major 10 or newer, not interpreted."""
    from flashrt.kernels.decode import interpreted

    return capability is not None and capability[0] >= MIN_COMPUTE_MAJOR and not interpreted()


def configs(m: int, n: int, k: int) -> list[dict]:
    """BLOCK_M 128 (the 5th-generation tensor core's M; smaller token counts pad), BLOCK_N
    64-256, BLOCK_K 128-256 (64-128 bytes of codes a row a step), 3-4 stages."""
    if k % 16:
        return []
    return [
        {"BLOCK_M": 128, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 4, "num_stages": stages}
        for bn in (64, 128, 256)
        for bk in (128, 256)
        for stages in (3, 4)
        if bn * bk <= 256 * 128
    ]
