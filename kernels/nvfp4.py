"""NVFP4: the weight format every flashrt kernel reads.

A weight ``W [N, K]`` becomes three tensors:

* ``packed  uint8 [N, K/2]``: E2M1 codes, two per byte, the element at even ``k`` in the low
  nibble. A code is ``sign << 3 | magnitude``, magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
* ``scales  float8_e4m3fn [N, K/16]``: one scale per 16 consecutive elements along K.
* ``global_scale  float32 []``: one per tensor (one per expert for a bank ``[E, N, K]``).

``W ~= e2m1(packed) * scales * global_scale``: 0.5625 bytes a parameter against bf16's 2, so a
memory-bound decode can run at most 3.56x faster.

The recipe is the standard one (NVIDIA ModelOpt): ``global = amax(|W|) / (6 * 448)`` puts the
largest block scale at E4M3's maximum; ``scale = e4m3(amax(block) / 6 / global)`` puts each
block's largest element at E2M1's maximum; elements round to the nearest E2M1 value, ties to
even. Because a block's largest element always lands on code 7 (6.0) when its scale is a normal
E4M3 number, dequantizing and quantizing again gives the same bytes.

Checkpoint layouts: ModelOpt stores ``weight``, ``weight_scale``, ``weight_scale_2`` (the global
scale as a multiplier); compressed-tensors stores ``weight_packed``, ``weight_scale``,
``weight_global_scale`` (the global scale as a divisor). Packing is the same in both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from flashrt.kernels import ring_layout

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Round-to-nearest-even between neighbouring E2M1 magnitudes: a magnitude goes up one code when
# it passes a midpoint, and also on the midpoint itself where the upper neighbour is even
# (mantissa 0: codes 2, 4, 6).
_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))

WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class NVFP4Weight:
    """A packed weight ``[*batch, N, K]``: a plain linear has no batch, an expert bank has ``[E]``."""

    packed: torch.Tensor  # uint8 [*batch, N, K/2]
    scales: torch.Tensor  # float8_e4m3fn [*batch, N, K/16]
    global_scale: torch.Tensor  # float32 [*batch]
    layout: int = ring_layout.CHECKPOINT  # the bits of packed: the checkpoint's, or ``ring_layout``'s

    @property
    def shape(self) -> tuple[int, ...]:
        *batch, n, half_k = self.packed.shape
        return (*batch, n, half_k * 2)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales, self.global_scale))

    def expert(self, e: int) -> NVFP4Weight:
        """Expert ``e`` of a bank ``[E, N, K]``, as views."""
        return NVFP4Weight(self.packed[e], self.scales[e], self.global_scale[e], self.layout)

    def to(self, device: torch.device | str) -> NVFP4Weight:
        return NVFP4Weight(self.packed.to(device), self.scales.to(device), self.global_scale.to(device), self.layout)

    def in_layout(self, layout: int) -> NVFP4Weight:
        """The same weight with its codes in ``layout`` (a permutation of each word's bits)."""
        if layout == self.layout:
            return self
        packed = ring_layout.pack(self.packed) if layout == ring_layout.RING else ring_layout.unpack(self.packed)
        return NVFP4Weight(packed, self.scales, self.global_scale, layout)


def check_weight(name: str, w: NVFP4Weight, batched: bool = False) -> None:
    """Raise ``ValueError`` naming the field when ``w`` is not a well-formed NVFP4 weight."""
    rank = 3 if batched else 2
    if w.layout not in (ring_layout.CHECKPOINT, ring_layout.RING):
        raise ValueError(
            f"{name}.layout: got {w.layout!r}, need ring_layout.CHECKPOINT ({ring_layout.CHECKPOINT}) "
            f"or ring_layout.RING ({ring_layout.RING})"
        )
    if w.packed.dtype != torch.uint8:
        raise ValueError(f"{name}.packed: got dtype {w.packed.dtype}, need torch.uint8 (two E2M1 codes a byte)")
    if w.packed.dim() != rank:
        raise ValueError(f"{name}.packed: got rank {w.packed.dim()} {tuple(w.packed.shape)}, need rank {rank}")
    if w.scales.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{name}.scales: got dtype {w.scales.dtype}, need torch.float8_e4m3fn")
    *batch, n, half_k = w.packed.shape
    if tuple(w.scales.shape) != (*batch, n, half_k * 2 // BLOCK_SIZE) or half_k % (BLOCK_SIZE // 2):
        raise ValueError(
            f"{name}.scales: got shape {tuple(w.scales.shape)} for packed {tuple(w.packed.shape)}, "
            f"need {(*batch, n, half_k * 2 // BLOCK_SIZE)} (one scale per {BLOCK_SIZE} elements)"
        )
    if w.global_scale.dtype != torch.float32 or tuple(w.global_scale.shape) != tuple(batch):
        raise ValueError(
            f"{name}.global_scale: got {w.global_scale.dtype} {tuple(w.global_scale.shape)}, "
            f"need torch.float32 {tuple(batch)}"
        )
    for field in ("scales", "global_scale"):
        if getattr(w, field).device != w.packed.device:
            raise ValueError(
                f"{name}.{field}: on {getattr(w, field).device}, packed on {w.packed.device}; move both to one device"
            )
    if not (w.packed.is_contiguous() and w.scales.is_contiguous()):
        raise ValueError(f"{name}: packed and scales must be contiguous; call .contiguous() on them")


def _check_dense(name: str, weight: torch.Tensor) -> None:
    if weight.dtype not in WEIGHT_DTYPES:
        raise ValueError(f"{name}: got dtype {weight.dtype}, need one of {WEIGHT_DTYPES}")
    if weight.dim() not in (2, 3):
        raise ValueError(f"{name}: got rank {weight.dim()} {tuple(weight.shape)}, need [N, K] or [E, N, K]")
    if weight.shape[-1] % BLOCK_SIZE:
        raise ValueError(
            f"{name}: K = {weight.shape[-1]} is not a multiple of {BLOCK_SIZE}; pad K to a multiple of {BLOCK_SIZE}"
        )


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, sign in bit 3) of ``x`` already divided by its scale, ties to even."""
    mag = x.abs()
    code = torch.zeros_like(x, dtype=torch.uint8)
    for mid, tie_up in _MIDPOINTS:
        code += (mag >= mid) if tie_up else (mag > mid)
    sign = ((x < 0) & (code > 0)).to(torch.uint8) << 3
    return code | sign


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """Float32 values of E2M1 codes."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    mag = table[(codes & 7).long()]
    return torch.where((codes & 8).bool(), -mag, mag)


def _divide(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """``x / divisor`` rounded as IEEE division on every device. CUDA torch multiplies by the
    reciprocal of a Python-number divisor instead ("may lose one bit of precision", its
    ``BinaryDivTrueKernel.cu``), and a tensor divisor it divides by. On the H200 at 856a2cf
    ``bench kernels`` found the reference run there differing from the kernel on expert banks
    (``matches_reference`` false), while the GPU test, which ran the reference on the CPU,
    passed bit for bit."""
    return x / x.new_tensor(divisor)


def global_scale_of(amax: torch.Tensor) -> torch.Tensor:
    """The per-tensor scale that puts ``amax`` at the largest block scale times the largest element."""
    amax = amax.float()
    return torch.where(amax > 0, _divide(amax, E2M1_MAX * E4M3_MAX), torch.ones_like(amax))


def absolute_max(weight: torch.Tensor) -> torch.Tensor:
    """fp32 ``max |w|`` of each matrix of ``[N, K]`` or ``[E, N, K]`` (the ``amax`` that
    ``quantize`` takes), as the larger of the largest and the negated smallest element: no
    temporary of the weight's size, which ``abs()`` would allocate (622 MB for a 151936 x 2048
    head) while the engine loads."""
    dims = (-2, -1)
    return torch.maximum(weight.amax(dim=dims), -weight.amin(dim=dims)).float()


def _check_amax(amax: torch.Tensor, weight: torch.Tensor) -> None:
    batch = tuple(weight.shape[:-2])
    if not isinstance(amax, torch.Tensor) or tuple(amax.shape) != batch:
        got = tuple(amax.shape) if isinstance(amax, torch.Tensor) else type(amax).__name__
        raise ValueError(f"amax: got {got}, need a tensor of shape {batch} (one per weight matrix)")


def quantize_reference(weight: torch.Tensor, amax: torch.Tensor | None = None) -> NVFP4Weight:
    """Plain-torch NVFP4 quantization of ``[N, K]`` or ``[E, N, K]`` (one global scale per expert).

    The definition every faster quantizer is checked against, bit for bit: the same bytes on
    every device (``_divide``). ``amax`` is the whole weight's where ``weight`` is a part of it
    (``quantize``).
    """
    _check_dense("weight", weight)
    *batch, n, k = weight.shape
    w = weight.float()
    if amax is None:
        amax = absolute_max(w)
    else:
        _check_amax(amax, weight)
    global_scale = global_scale_of(amax.to(w.device))
    g = global_scale.reshape(*batch, 1, 1, 1)
    blocks = w.reshape(*batch, n, k // BLOCK_SIZE, BLOCK_SIZE)
    block_amax = blocks.abs().amax(dim=-1, keepdim=True)
    # The block holding the tensor's amax lands on 448 give or take an ulp; float8 casts of
    # anything above 448 are NaN in torch, so clamp first (the kernel rounds the same way).
    scales = (_divide(block_amax, E2M1_MAX) / g).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = scales.float() * g
    codes = e2m1_codes(torch.where(denom > 0, blocks / denom, torch.zeros_like(blocks)))
    codes = codes.reshape(*batch, n, k // 2, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return NVFP4Weight(packed.contiguous(), scales.reshape(*batch, n, k // BLOCK_SIZE).contiguous(), global_scale)


def dequantize(w: NVFP4Weight, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``e2m1 * scale * global`` in float32, cast once to ``dtype``."""
    check_weight("w", w, batched=w.packed.dim() == 3)
    w = w.in_layout(ring_layout.CHECKPOINT)
    *batch, n, half_k = w.packed.shape
    codes = torch.stack((w.packed & 15, w.packed >> 4), dim=-1).reshape(*batch, n, half_k * 2 // BLOCK_SIZE, BLOCK_SIZE)
    values = e2m1_values(codes) * w.scales.float().unsqueeze(-1)
    values = values * w.global_scale.reshape(*batch, 1, 1, 1)
    return values.reshape(*batch, n, half_k * 2).to(dtype)


def quantize(weight: torch.Tensor, amax: torch.Tensor | None = None) -> NVFP4Weight:
    """NVFP4-quantize a weight: the Triton kernel on a CUDA device, the reference elsewhere.

    Both give the same bytes. On an H200 the kernel runs near copy bandwidth, fast enough to
    quantize at model load (figure in ``bench/results/``).

    ``amax`` (shape ``weight.shape[:-2]``) sets the global scale instead of the weight's own
    absolute maximum: give the whole weight's when ``weight`` is a part of it (a tensor-parallel
    shard, a slab of the head). The E4M3 block scales and E2M1 codes of a row depend only on
    that row and the global scale, so the parts then hold exactly the bytes the whole would.
    """
    if weight.is_cuda:
        from flashrt.kernels.quantizer import quantize_triton

        return quantize_triton(weight, amax)
    return quantize_reference(weight, amax)


# -- checkpoint layouts --------------------------------------------------------------------------


def to_modelopt(w: NVFP4Weight) -> dict[str, torch.Tensor]:
    """ModelOpt names: ``weight_scale_2`` is the global scale itself (a multiplier)."""
    w = w.in_layout(ring_layout.CHECKPOINT)
    return {"weight": w.packed, "weight_scale": w.scales, "weight_scale_2": w.global_scale}


def from_modelopt(tensors: dict[str, torch.Tensor]) -> NVFP4Weight:
    w = NVFP4Weight(
        tensors["weight"].contiguous(),
        tensors["weight_scale"].contiguous(),
        tensors["weight_scale_2"].float().reshape(tensors["weight"].shape[:-2]),
    )
    check_weight("modelopt", w, batched=w.packed.dim() == 3)
    return w


def to_compressed_tensors(w: NVFP4Weight) -> dict[str, torch.Tensor]:
    """compressed-tensors names: ``weight_global_scale`` is the reciprocal (a divisor)."""
    w = w.in_layout(ring_layout.CHECKPOINT)
    return {"weight_packed": w.packed, "weight_scale": w.scales, "weight_global_scale": 1.0 / w.global_scale}


def from_compressed_tensors(tensors: dict[str, torch.Tensor]) -> NVFP4Weight:
    packed = tensors["weight_packed"]
    w = NVFP4Weight(
        packed.contiguous(),
        tensors["weight_scale"].contiguous(),
        (1.0 / tensors["weight_global_scale"].float()).reshape(packed.shape[:-2]),
    )
    check_weight("compressed_tensors", w, batched=packed.dim() == 3)
    return w
