"""Seats in a vLLM model: interception at ``quant_method``, never module replacement.

vLLM's linear layers compute through ``self.quant_method.apply(self, x, bias)`` and
``RowParallelLinear`` all-reduces in its own forward after ``apply``; the LM head is consulted
through ``lm_head.quant_method.apply``. A seat therefore swaps the layer's ``quant_method`` for
a proxy that serves ``apply`` from NVFP4 and hands every other attribute (``embedding``,
``process_weights_after_loading``, ...) to the original method object, which ``detach`` puts
back. Each tensor-parallel rank seats its own shard.

Structure, not class names: a projection has a ``quant_method`` and a 2-D weight with
``input_size``/``output_size`` (on vLLM's CPU backend the weight was emptied after loading and
the plugin kept a copy); the head is the model's ``lm_head``. Expert banks are not seated in
vLLM yet (their runner layout differs between 0.32 and 0.33): they stay on vLLM's kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from flashrt.kernels import quantize
from flashrt.runtime.profile import SeatProfile
from flashrt.runtime.seats import CALIBRATION_ROWS, ProjectionSeat, Refused, SeatSpec, _calibration, _cosine, attach
from flashrt.runtime.vllm_plugin import _STASH


def _weight(layer: torch.nn.Module) -> torch.Tensor | None:
    stashed = getattr(layer, _STASH, None)
    if stashed is not None:
        return stashed
    w = getattr(layer, "weight", None)
    return w if isinstance(w, torch.Tensor) and w.dim() == 2 and w.numel() > 0 else None


def discover_vllm(model: torch.nn.Module, profile: SeatProfile) -> list[SeatSpec]:
    import fnmatch

    head = getattr(model, "lm_head", None)
    found = []
    for name, module in model.named_modules():
        if getattr(module, "quant_method", None) is None or not hasattr(module.quant_method, "apply"):
            continue
        w = _weight(module)
        if w is None:
            continue
        if module is head:
            kind = "head"
        elif hasattr(module, "input_size") and hasattr(module, "output_size"):
            kind = "dense"
        else:
            continue
        if kind not in profile.kinds or w.numel() < profile.min_params:
            continue
        if profile.include and not any(fnmatch.fnmatchcase(name, p) for p in profile.include):
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in profile.exclude):
            continue
        found.append(SeatSpec(name, kind, module, w.numel()))
    return sorted(found, key=lambda s: s.params)


# Seats by number, for the custom op below: an op takes tensors and numbers, not objects.
_SERVED: list[QuantMethodSeat] = []


@torch.library.custom_op("flashrt::served_linear", mutates_args=())
def served_linear(x: torch.Tensor, bias: torch.Tensor | None, seat: int, out_features: int) -> torch.Tensor:
    """One seated ``apply``: the seam, or the host on a fault, counted. An opaque op, because
    vLLM compiles the model with dynamo, which cannot trace the counting, the try/except or
    the host's own dispatch; the op runs them eagerly inside the compiled graph."""
    seat_obj = _SERVED[seat]
    return seat_obj._serve(seat_obj.seam_with_bias, seat_obj.host_apply, x, bias)


@served_linear.register_fake
def _(x, bias, seat, out_features):
    return x.new_empty(*x.shape[:-1], out_features)


@dataclass
class _SeatedMethod:
    """Stands in for a layer's ``quant_method``: ``apply`` from NVFP4, the rest from the host's."""

    host: object
    seat: int
    out_features: int

    def apply(self, layer, x, bias=None):
        return torch.ops.flashrt.served_linear(x, bias, self.seat, self.out_features)

    def __getattr__(self, name):
        return getattr(self.host, name)


class QuantMethodSeat(ProjectionSeat):
    def bind(self) -> None:
        layer = self.spec.module
        weight = _weight(layer)
        if weight is None:
            raise Refused("the layer's weight is not available after loading")
        if weight.dtype not in (torch.bfloat16, torch.float16):
            raise Refused(f"weight dtype {weight.dtype}: only unquantized bf16/fp16 checkpoints are seated")
        if weight.shape[1] % 16:
            raise Refused(f"K = {weight.shape[1]} is not a multiple of 16 (NVFP4 blocks)")
        rows = self.profile.head_slab_rows if self.kind == "head" else weight.shape[0]
        slabs = [quantize(weight.detach()[i : i + rows]) for i in range(0, weight.shape[0], rows)]
        host = layer.quant_method
        x = _calibration(CALIBRATION_ROWS, weight.shape[1], weight)
        self.parity = _cosine(self._seam(slabs, None)(x), host.apply(layer, x, None))
        if self.parity < self.profile.parity_floor:
            raise Refused(f"parity {self.parity:.4f} under the floor {self.profile.parity_floor}")
        self.bytes_before = weight.numel() * weight.element_size()
        self.bytes_after = sum(s.nbytes for s in slabs)
        self.seam_with_bias = lambda x, bias: self._seam(slabs, bias)(x)
        self.host_apply = lambda x, bias: host.apply(layer, x, bias)
        _SERVED.append(self)
        layer.quant_method = _SeatedMethod(host, len(_SERVED) - 1, weight.shape[0])
        self.state = "seated"
        self._drop_stash()

    def _drop_stash(self) -> None:
        if hasattr(self.spec.module, _STASH):
            delattr(self.spec.module, _STASH)

    def unbind(self) -> None:
        layer = self.spec.module
        if isinstance(layer.quant_method, _SeatedMethod):
            layer.quant_method = layer.quant_method.host
        self._drop_stash()


def attach_vllm(model: torch.nn.Module, profile: SeatProfile):
    """``attach`` with vLLM's discovery and seats; what is not seated is left to vLLM."""
    handle = attach(
        model, profile, discover=discover_vllm, seat_types={"dense": QuantMethodSeat, "head": QuantMethodSeat}
    )
    for module in model.modules():  # copies kept for seats that were refused or filtered out
        if hasattr(module, _STASH):
            delattr(module, _STASH)
    return handle
