"""Seats: where a packed kernel stands in for the host's computation, and how it gets there.

``discover(model, profile) -> [SeatSpec]`` finds seats by structure, never by class or model
name: a projection is a module with a 2-D ``weight`` and ``in_features``/``out_features``; an
expert bank has 3-D ``gate_up_proj [E, 2N, K]`` and ``down_proj [E, K, N]`` (transformers v5's
fused experts); the LM head is the model's output embedding.

``attach(model, profile) -> Handle`` binds them smallest first (early frees make room for the big
binds on tight cards). A seat is bound only if its output on calibration input reaches the
parity floor against the host's; otherwise it is refused with the measured figure, and the
module is left exactly as it was. ``Handle.detach()`` restores the model bit for bit: the same
module objects, the same parameter objects with the same bytes.

Binding a projection moves its bf16 weight off the device (to host memory, kept for detach) and
serves it from the NVFP4 copy. A seam that raises is served by the host path (the plain-torch
reference on the packed weight; for experts, the retained host bank) and counted; after
``max_faults`` faults the seat detaches itself and the host serves from then on.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from flashrt.kernels import (
    NVFP4Weight,
    absolute_max,
    linear,
    linear_add_norm,
    linear_mma_gluon,
    linear_normed,
    linear_reference,
    linear_silu_mul,
    moe,
    moe_reference,
    norm_scale_after,
    ops,
    quantize,
)
from flashrt.kernels.tuning import SOURCES, TUNER, shipped_on
from flashrt.runtime.metrics import metrics
from flashrt.runtime.profile import SeatProfile

log = logging.getLogger("flashrt")
CALIBRATION_ROWS = 8
# A fused epilogue (``fusion``'s rewrites) against the same packed projection unfused and then the
# same arithmetic in torch, on calibration rows: the two differ only in where an intermediate is
# rounded, so anything under this is a kernel that computes something else.
EPILOGUE_PARITY_FLOOR = 0.999


@dataclass(frozen=True)
class SeatSpec:
    name: str
    kind: str  # dense | experts | head
    module: torch.nn.Module
    params: int
    tied: bool = False  # the head shares its weight with the input embedding
    # The whole weight's absolute maximum where the module holds a shard of it (tensor
    # parallelism): one per weight, or per expert of gate_up and down for a bank.
    amax: tuple[torch.Tensor, ...] | None = None


def _is_projection(module: torch.nn.Module) -> bool:
    w = getattr(module, "weight", None)
    return (
        isinstance(w, torch.nn.Parameter)
        and w.dim() == 2
        and hasattr(module, "in_features")
        and hasattr(module, "out_features")
    )


def _is_expert_bank(module: torch.nn.Module) -> bool:
    gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not (isinstance(gu, torch.nn.Parameter) and isinstance(dn, torch.nn.Parameter)):
        return False
    return (
        gu.dim() == 3
        and dn.dim() == 3
        and gu.shape[0] == dn.shape[0]
        and dn.shape[1:] == (gu.shape[2], gu.shape[1] // 2)
    )


def routing_projections(model: torch.nn.Module, banks: dict[str, set[int]], rows) -> set[str]:
    """Names of the projections that route tokens to an expert bank; they are never seats.

    A router's logits choose the experts: NVFP4 error there flips the top-k on near ties and
    sends tokens to other experts, a change no parity floor on the logits' cosine sees. Every
    NVFP4 checkpoint recipe keeps routers in bf16 (ModelOpt's defaults disable ``*router*``,
    ``*mlp.gate.*`` and ``*mlp.shared_expert_gate.*``), and their bytes are a rounding error of
    the bank's (Qwen3-30B-A3B: 0.26 M parameters beside a bank of 604 M). Found by structure:
    a projection beside the bank in its MoE block (a child of the bank's parent or grandparent:
    ``mlp.gate`` beside ``mlp.experts`` or ``mlp.experts.routed_experts``) with one output per
    expert (the router) or a single output (a shared expert's gate). ``banks`` maps a bank's
    name to its expert counts (local and global); ``rows(module)`` is a projection's output
    rows, or None for anything else."""
    modules = dict(model.named_modules())
    found = set()
    for bank, experts in banks.items():
        parts = bank.split(".")
        for up in (1, 2):
            if len(parts) <= up:
                break
            block = ".".join(parts[:-up])
            for child, module in modules[block].named_children():
                if rows(module) in experts | {1}:
                    found.add(f"{block}.{child}")
    return found


def discover(model: torch.nn.Module, profile: SeatProfile) -> list[SeatSpec]:
    """Seats the profile admits, smallest first; an expert bank's router is never one."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    banks = {name: {m.gate_up_proj.shape[0]} for name, m in model.named_modules() if _is_expert_bank(m)}
    routers = routing_projections(model, banks, lambda m: m.weight.shape[0] if _is_projection(m) else None)
    found = []
    for name, module in model.named_modules():
        if name in routers:
            continue
        if module is head and _is_projection(module):
            kind = "head"
            params = module.weight.numel()
        elif _is_projection(module):
            kind = "dense"
            params = module.weight.numel()
        elif _is_expert_bank(module):
            kind = "experts"
            params = module.gate_up_proj.numel() + module.down_proj.numel()
        else:
            continue
        if kind not in profile.kinds or params < profile.min_params:
            continue
        if profile.include and not any(fnmatch.fnmatchcase(name, p) for p in profile.include):
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in profile.exclude):
            continue
        tied = kind == "head" and embedding is not None and embedding.weight is module.weight
        found.append(SeatSpec(name, kind, module, params, tied))
    return sorted(found, key=lambda s: s.params)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0))


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Refused(Exception):
    """A seat that cannot be bound; the message is the reason a platform engineer reads."""


@dataclass
class Seat:
    spec: SeatSpec
    profile: SeatProfile
    state: str = "pending"  # seated | refused | self_detached | detached
    reason: str = ""
    parity: float | None = None
    calls: int = 0
    fallbacks: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    served: int | None = None  # the seat's number for the served ops
    band_host: bool = False  # rows above the MoE band go to the host (a retained bank)
    seam: object = field(default=None, repr=False)  # the packed kernel's path
    host: object = field(default=None, repr=False)  # what serves a fault (and rows above the MoE band)
    _stash: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # The labelled child, looked up once: ``labels()`` on every call cost 2.4 us against
        # 0.9 us for ``inc()`` on a kept child (2-core CPU, 2026-12-02).
        self._calls_counter = metrics()["flashrt_seat_calls_total"].labels(self.kind)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    # -- serving ----------------------------------------------------------------------------------

    def _serve(self, seam, host, *args):
        try:
            out = seam(*args)
            self.calls += 1
            self._calls_counter.inc()
            return out
        except Exception as exc:
            self.fallbacks += 1
            reason = type(exc).__name__
            metrics()["flashrt_seat_fallbacks_total"].labels(self.kind, reason).inc()
            log.warning("flashrt: seat %s fell back to the host (%s: %s)", self.name, reason, exc)
            if self.fallbacks >= self.profile.max_faults:
                self.unbind()
                self.state = "self_detached"
                self.reason = f"{self.fallbacks} faults, last {reason}: {exc}"
                metrics()["flashrt_seat_self_detached_total"].labels(self.kind).inc()
                log.warning("flashrt: seat %s detached itself after %d faults", self.name, self.fallbacks)
            return host(*args)

    # -- binding ----------------------------------------------------------------------------------

    def bind(self) -> None:
        raise NotImplementedError

    def _require_parity(self, seam_out: torch.Tensor, host_out: torch.Tensor) -> None:
        """The seam's cosine against the host on calibration input, refused under the floor. A NaN
        cosine (NaN or inf in either output) is refused too: no comparison with NaN is true, and
        until session 57 such a seat was bound."""
        self.parity = _cosine(seam_out, host_out)
        if not self.parity >= self.profile.parity_floor:
            raise Refused(f"parity {self.parity:.4f} under the floor {self.profile.parity_floor}")

    def unbind(self) -> None:
        """Restore the host module exactly: drop the forward override, give the bytes back."""
        module = self.spec.module
        if "forward" in module.__dict__:
            del module.forward
        for param, data in self._stash.items():
            param.data = data.to(param.device) if data.device != param.device else data
        self._stash.clear()

    def _free(self, param: torch.nn.Parameter) -> None:
        """Move a parameter's bytes to host memory; the Parameter object stays where it is."""
        self._stash[param] = param.data.cpu() if param.is_cuda else param.data
        param.data = torch.empty(0, dtype=param.dtype, device=param.device)


def _calibration(rows: int, k: int, like: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator(device=like.device).manual_seed(0)
    dtype = like.dtype if like.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    return torch.randn(rows, k, generator=gen, device=like.device, dtype=torch.float32).to(dtype)


# Seats by number, for the served ops below: an op takes tensors and numbers, not objects.
_SERVED: list[Seat | None] = []


def _serving(seat: Seat) -> int:
    _SERVED.append(seat)
    seat.served = len(_SERVED) - 1
    return seat.served


def _serve_linear_body(x: torch.Tensor, bias: torch.Tensor | None, seat: int, out_features: int) -> torch.Tensor:
    s = _SERVED[seat]
    return s._serve(s.seam, s.host, x, bias)


def _serve_linear_silu_mul_body(x: torch.Tensor, seat: int, out_features: int) -> torch.Tensor:
    return _SERVED[seat].serve_silu_mul(x)


def _serve_linear_add_norm_body(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    seat: int,
    out_features: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _SERVED[seat].serve_add_norm(x, bias, residual, norm_weight)


def _serve_linear_normed_body(
    x: torch.Tensor,
    sumsq: torch.Tensor,
    eps: float,
    bias: torch.Tensor | None,
    seat: int,
    out_features: int,
    silu_mul_after: bool,
) -> torch.Tensor:
    return _SERVED[seat].serve_normed(x, sumsq, eps, bias, silu_mul_after)


def _serve_moe_body(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, seat: int) -> torch.Tensor:
    s = _SERVED[seat]
    if s.band_host and x.shape[0] > s.profile.moe_band_t:
        return s.host(x, topk_weights, topk_ids)
    return s._serve(s.seam, s.host, x, topk_weights, topk_ids)


# One seated projection call: the seam, or the host on a fault, counted. An opaque op because
# compilers (vLLM's, ``torch.compile`` on a transformers model) trace with dynamo, which cannot
# trace the counting, the try/except or the host's own dispatch: the op runs them eagerly
# inside the compiled graph.
served_linear = torch.library.custom_op("flashrt::served_linear", _serve_linear_body, mutates_args=())

# A seated gate-and-up projection and the SiLU-and-mul after it, where ``fusion.fuse_silu_mul``
# found that pattern in a compiled graph: the activation in the projection's epilogue.
served_linear_silu_mul = torch.library.custom_op(
    "flashrt::served_linear_silu_mul", _serve_linear_silu_mul_body, mutates_args=()
)

# A seated projection, the residual add after it and an RMSNorm's first half (o or down, then
# the norm), and a seated projection that norm feeds, its scale in the epilogue (qkv, gate_up,
# the LM head), where ``fusion.fuse_add_norm`` found that pattern in a compiled graph.
served_linear_add_norm = torch.library.custom_op(
    "flashrt::served_linear_add_norm", _serve_linear_add_norm_body, mutates_args=()
)
served_linear_normed = torch.library.custom_op(
    "flashrt::served_linear_normed", _serve_linear_normed_body, mutates_args=()
)

# One seated expert bank call: rows above the MoE band go to the retained host bank, the rest
# to the packed one. The band test is a Python branch on the row count, so it lives in this
# opaque op: in a graph traced without shape guards it would be frozen at the traced size.
served_moe = torch.library.custom_op("flashrt::served_moe", _serve_moe_body, mutates_args=())


@served_linear.register_fake
def _(x, bias, seat, out_features):
    return x.new_empty(*x.shape[:-1], out_features)


@served_linear_silu_mul.register_fake
def _(x, seat, out_features):
    return x.new_empty(*x.shape[:-1], out_features)


@served_linear_add_norm.register_fake
def _(x, bias, residual, norm_weight, seat, out_features):
    rows = x.numel() // x.shape[-1]
    sumsq = x.new_empty(ops.sumsq_numel(rows, out_features), dtype=torch.float32)
    return residual.new_empty(residual.shape), residual.new_empty(residual.shape), sumsq  # contiguous, as served


@served_linear_normed.register_fake
def _(x, sumsq, eps, bias, seat, out_features, silu_mul_after):
    return x.new_empty(*x.shape[:-1], out_features)


@served_moe.register_fake
def _(x, topk_weights, topk_ids, seat):
    return torch.empty_like(x)


def takes_epilogues(seat: int) -> bool:
    """Whether seat ``seat``'s calls may be rewritten into fused ones (``fusion``): bound here,
    and its epilogues passed their check at bind (``ProjectionSeat._check_epilogues``). A seat
    that failed it would serve a fused call as the projection and then torch's arithmetic,
    slower than the compiled kernel the rewrite removes."""
    s = _SERVED[seat] if 0 <= seat < len(_SERVED) else None
    return s is not None and s.state == "seated" and not getattr(s, "epilogue_refusal", "refused")


def serve_linear(x: torch.Tensor, bias: torch.Tensor | None, seat: int, out_features: int) -> torch.Tensor:
    """A seated projection's forward: the op for tracers, its body for eager calls (``ops.eager``)."""
    return (_serve_linear_body if ops.eager(x) else served_linear)(x, bias, seat, out_features)


def serve_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, seat: int) -> torch.Tensor:
    """A seated expert bank's forward: the op for tracers, its body for eager calls."""
    return (_serve_moe_body if ops.eager(x) else served_moe)(x, topk_weights, topk_ids, seat)


class ProjectionSeat(Seat):
    """A dense projection or the LM head: ``y = x W^T + b`` through ``flashrt.kernels.linear``."""

    def bind(self) -> None:
        module = self.spec.module
        weight = module.weight
        bias = getattr(module, "bias", None)
        if weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise Refused(f"weight dtype {weight.dtype} is not a float weight")
        if weight.shape[1] % 16:
            raise Refused(f"K = {weight.shape[1]} is not a multiple of 16 (NVFP4 blocks)")
        slabs = self._slabs(weight.detach())
        x = _calibration(CALIBRATION_ROWS, weight.shape[1], weight)
        host = F.linear(x.to(weight.dtype), weight.detach())
        self._require_parity(self._seam(slabs)(x, None), host)
        self.bytes_before = _nbytes(weight)
        self.bytes_after = sum(s.nbytes for s in slabs)
        tied, out_features = self.spec.tied, weight.shape[0]
        if not tied:
            self._free(weight)
        self.seam, self.host = self._seam(slabs), self._reference(slabs)
        self._serve_fused_from(slabs)
        index = _serving(self)
        module.forward = lambda x: serve_linear(x, bias, index, out_features)
        self.state = "seated"
        self.reason = "tied to the input embedding: bf16 weight kept for it" if tied else ""

    def _serve_fused_from(self, slabs: list[NVFP4Weight]) -> None:
        """What the fused calls run (``fusion``'s rewrites): the ops with the epilogue (a head's
        slabs each take the norm's scale in theirs; a head is never a gate-and-up projection or
        the one before a norm, which take the projection and then the same arithmetic in torch
        there), and on a fault, or where the epilogues failed their check at bind
        (``epilogue_refusal``, which also keeps ``fusion`` from rewriting this seat's calls), the
        projection and then that arithmetic: vLLM's activation, ``ops.add_norm``, ``ops.norm_scale``."""

        def bf16(x: torch.Tensor) -> torch.Tensor:
            return x if x.dtype in (torch.bfloat16, torch.float16) else x.to(torch.bfloat16)

        self.epilogue_refusal = self._check_epilogues(slabs[0])
        if self.epilogue_refusal:
            log.warning("flashrt: seat %s serves its fused calls unfused: %s", self.name, self.epilogue_refusal)
        fused = not self.epilogue_refusal
        one = fused and len(slabs) == 1

        def silu_mul_seam(x: torch.Tensor) -> torch.Tensor:
            if one:
                return linear_silu_mul(bf16(x), slabs[0]).to(x.dtype)
            return ops.silu_mul(self.seam(x, None))

        def add_norm_seam(x, bias, residual, norm_weight):
            if one:
                return linear_add_norm(bf16(x), slabs[0], residual, norm_weight, bias)
            return _add_norm_after(self.seam(x, None), bias, residual, norm_weight)

        def add_norm_host(x, bias, residual, norm_weight):
            return _add_norm_after(self.host(x, None), bias, residual, norm_weight)

        def normed_seam(x, sumsq, eps, bias, silu_mul_after):
            if one:
                return linear_normed(bf16(x), slabs[0], sumsq, eps, bias, silu_mul_after).to(x.dtype)
            if fused and not silu_mul_after:
                out = torch.cat([linear_normed(bf16(x), s, sumsq, eps) for s in slabs], dim=-1)
                return (out if bias is None else out + bias.to(out.dtype)).to(x.dtype)
            return _normed_after(self.seam(x, None), x, sumsq, eps, bias, silu_mul_after)

        def normed_host(x, sumsq, eps, bias, silu_mul_after):
            return _normed_after(self.host(x, None), x, sumsq, eps, bias, silu_mul_after)

        self._silu_mul_seam, self._silu_mul_host = silu_mul_seam, lambda x: ops.silu_mul(self.host(x, None))
        self._add_norm_seam, self._add_norm_host = add_norm_seam, add_norm_host
        self._normed_seam, self._normed_host = normed_seam, normed_host

    def _check_epilogues(self, slab: NVFP4Weight) -> str:
        """Why the fused epilogues must not serve this seat, or "" where they may: each (the
        SiLU-and-mul, the residual add and norm, the norm's scale) at one token and at
        ``CALIBRATION_ROWS`` against the same packed projection unfused and then the same
        arithmetic in torch (``EPILOGUE_PARITY_FLOOR``), and whether it runs at all here (a form
        whose epilogue does not build on this GPU). Refused, the fused calls are served unfused:
        a kernel that computes something else never reaches a request."""
        plain = self._seam([slab])
        gen = torch.Generator(device=slab.packed.device).manual_seed(2)
        for m in (1, CALIBRATION_ROWS):
            for name, (fused, unfused) in _epilogue_checks(plain, slab, m, gen).items():
                try:
                    parity = _cosine(fused(), unfused())
                except Exception as exc:
                    return f"{name} at {m} tokens raised {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                if not parity >= EPILOGUE_PARITY_FLOOR:
                    return f"{name} at {m} tokens: cosine {parity:.4f} to the unfused projection"
        return ""

    def serve_silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """The projection and the SiLU-and-mul after it (``served_linear_silu_mul``), counted and
        falling back as ``serve_linear``'s calls are."""
        return self._serve(self._silu_mul_seam, self._silu_mul_host, x)

    def serve_add_norm(self, x, bias, residual, norm_weight):
        """The projection, the residual add after it and the norm's first half
        (``served_linear_add_norm``), counted and falling back as ``serve_linear``'s calls are."""
        return self._serve(self._add_norm_seam, self._add_norm_host, x, bias, residual, norm_weight)

    def serve_normed(self, x, sumsq, eps, bias, silu_mul_after):
        """The projection fed by a norm, its scale in the epilogue (``served_linear_normed``)."""
        return self._serve(self._normed_seam, self._normed_host, x, sumsq, eps, bias, silu_mul_after)

    def _slabs(self, weight: torch.Tensor) -> list[NVFP4Weight]:
        """The weight quantized in slabs of ``head_slab_rows`` rows (the head; one slab for the
        rest), every slab under the whole weight's global scale: the standard recipe's bytes,
        whatever the slab height or the tensor-parallel shard (``SeatSpec.amax``)."""
        rows = self.profile.head_slab_rows if self.kind == "head" else weight.shape[0]
        amax = self.spec.amax[0] if self.spec.amax else None
        if amax is None and rows < weight.shape[0]:
            amax = absolute_max(weight)
        return [ops.for_serving(quantize(weight[i : i + rows], amax)) for i in range(0, weight.shape[0], rows)]

    @staticmethod
    def _seam(slabs: list[NVFP4Weight]):
        def run(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            xs = x if x.dtype in (torch.bfloat16, torch.float16) else x.to(torch.bfloat16)
            outs = [linear(xs, s) for s in slabs]
            out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
            if bias is not None:
                out = out + bias.to(out.dtype)
            return out.to(x.dtype)

        return run

    @staticmethod
    def _reference(slabs: list[NVFP4Weight]):
        def run(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            flat = x.reshape(-1, x.shape[-1])
            xs = flat if flat.dtype in (torch.bfloat16, torch.float16) else flat.to(torch.bfloat16)
            out = torch.cat([linear_reference(xs, s) for s in slabs], dim=-1)
            if bias is not None:
                out = out + bias.to(out.dtype)
            return out.reshape(*x.shape[:-1], -1).to(x.dtype)

        return run


def _epilogue_checks(plain, slab: NVFP4Weight, m: int, gen: torch.Generator) -> dict:
    """Each fused epilogue a projection ``[N, K]`` can take at ``m`` calibration tokens, as
    (fused, unfused) calls: the SiLU-and-mul (N even), the residual add and norm (N in whole
    groups), the norm's scale (on ``ops.add_norm``'s sums of a stream of K features)."""
    n, k = slab.shape
    x = _calibration(m, k, slab.global_scale)
    residual = (torch.randn(m, n, generator=gen, device=x.device) * 4).to(x.dtype)
    norm_weight = (torch.rand(n, generator=gen, device=x.device) + 0.5).to(x.dtype)
    stream = torch.randn(m, k, generator=gen, device=x.device) * 3
    _, weighted, sumsq = ops.add_norm(stream, torch.zeros_like(x), torch.ones_like(x[0]), x.dtype)
    held = m * (n // linear_mma_gluon.norm_group(m))
    checks = {}
    if n % 2 == 0:
        checks["the SiLU-and-mul"] = (lambda: linear_silu_mul(x, slab), lambda: ops.silu_mul(plain(x, None)))
    if n % 16 == 0:
        checks["the residual add and norm"] = (
            lambda: _front(linear_add_norm(x, slab, residual, norm_weight), held),
            lambda: _front(_add_norm_after(plain(x, None), None, residual, norm_weight), held),
        )
    checks["the norm's scale"] = (
        lambda: linear_normed(weighted, slab, sumsq, 1e-6),
        lambda: _normed_after(plain(weighted, None), weighted, sumsq, 1e-6, None, False),
    )
    return checks


def _front(outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor], held: int) -> torch.Tensor:
    """An add-and-norm's three outputs as one vector to compare: the stream, the weighted
    stream and the ``held`` sums of squares at the front of its buffer (the rest is unwritten)."""
    h, weighted, sumsq = outputs
    return torch.cat([h.float().flatten(), weighted.float().flatten(), sumsq[:held]])


def _add_norm_after(
    product: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor, norm_weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``ops.add_norm`` of a projection computed apart (a head's slabs, the host's), in the
    residual's shape and dtype."""
    n = residual.shape[-1]
    flat = product.reshape(-1, n).float()
    if bias is not None:
        flat = flat + bias.float()
    h, weighted, sumsq = ops.add_norm(flat, residual.reshape(-1, n), norm_weight, residual.dtype)
    return h.reshape(residual.shape), weighted.reshape(residual.shape), sumsq


def _normed_after(
    product: torch.Tensor, x: torch.Tensor, sumsq: torch.Tensor, eps: float, bias, silu_mul_after: bool
) -> torch.Tensor:
    """A projection computed apart, times its input's norm scale (``ops.norm_scale``), then the
    bias or the SiLU-and-mul (``norm_scale_after``'s arithmetic), in ``x``'s shape and dtype."""
    k = x.shape[-1]
    scale = ops.norm_scale(sumsq, x.numel() // k, k, eps)
    flat = norm_scale_after.reference(product.reshape(-1, product.shape[-1]), scale, bias, silu_mul_after)
    return flat.reshape(*x.shape[:-1], -1).to(x.dtype)


def _with_band(profile: SeatProfile, device: torch.device) -> SeatProfile:
    """The profile with its MoE band set: the profile's own, or the device's (``ops.moe_band``)."""
    return profile if profile.moe_band_t is not None else replace(profile, moe_band_t=ops.moe_band(device))


class ExpertSeat(Seat):
    """A fused expert bank: rows up to the MoE band go to the packed bank, more to the host."""

    def bind(self) -> None:
        module = self.spec.module
        gu_w, dn_w = module.gate_up_proj, module.down_proj
        if gu_w.shape[2] % 16 or dn_w.shape[2] % 16:
            raise Refused(f"hidden {gu_w.shape[2]} or intermediate {dn_w.shape[2]} is not a multiple of 16")
        host_forward = module.forward  # what the bank computes now: the class's forward or the caller's
        self.profile = _with_band(self.profile, gu_w.device)
        gate_up, down = quantize(gu_w.detach()), quantize(dn_w.detach())
        if self.profile.retain_host_experts:  # the host serves past the band; a bank that serves all keeps its layout
            gate_up, down = ops.bank_for_serving(gate_up, down, self.profile.moe_band_t)
        e, k = gu_w.shape[0], gu_w.shape[2]
        x = _calibration(CALIBRATION_ROWS * 2, k, gu_w)
        gen = torch.Generator(device=gu_w.device).manual_seed(1)
        top_k = min(getattr(module, "top_k", 8), e)
        probs = torch.rand(x.shape[0], e, generator=gen, device=gu_w.device).softmax(-1)
        weights, ids = torch.topk(probs, top_k)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        with torch.no_grad():
            expected = host_forward(x.to(gu_w.dtype), ids, weights.to(gu_w.dtype))
            self._require_parity(moe(x, gate_up, down, ids, weights), expected)
        self.bytes_before = _nbytes(gu_w, dn_w)
        self.bytes_after = gate_up.nbytes + down.nbytes
        self.band_host = self.profile.retain_host_experts
        if not self.band_host:
            self._free(gu_w)
            self._free(dn_w)
        else:
            self.bytes_after += self.bytes_before

        def seam(hidden, top_k_weights, top_k_index):
            h = hidden if hidden.dtype in (torch.bfloat16, torch.float16) else hidden.to(torch.bfloat16)
            return moe(h, gate_up, down, top_k_index, top_k_weights.to(h.dtype)).to(hidden.dtype)

        def reference(hidden, top_k_weights, top_k_index):
            h = hidden if hidden.dtype in (torch.bfloat16, torch.float16) else hidden.to(torch.bfloat16)
            return moe_reference(h, gate_up, down, top_k_index, top_k_weights).to(hidden.dtype)

        def host(hidden, top_k_weights, top_k_index):
            return host_forward(hidden, top_k_index, top_k_weights)

        self.seam, self.host = seam, host if self.band_host else reference
        index = _serving(self)
        module.forward = lambda hidden, top_k_index, top_k_weights: serve_moe(hidden, top_k_weights, top_k_index, index)
        self.state = "seated"
        self.reason = f"band {self.profile.moe_band_t} rows" + (
            "; bf16 bank retained for larger batches" if self.band_host else ""
        )


SEAT_TYPES = {"dense": ProjectionSeat, "head": ProjectionSeat, "experts": ExpertSeat}


@dataclass
class Handle:
    """What ``attach`` installed; ``detach()`` gives the model back as it was."""

    model: torch.nn.Module
    profile: SeatProfile
    seats: list[Seat]
    notes: list[str]
    attach_seconds: float = 0.0

    def detach(self) -> None:
        for seat in reversed(self.seats):
            if seat.state == "seated":
                seat.unbind()
                seat.state = "detached"
            if seat.served is not None:  # drop the packed weights with the seat
                _SERVED[seat.served] = None
        _publish(self)

    def summary(self) -> dict:
        seated = [s for s in self.seats if s.state == "seated"]
        return {
            "seams": len(seated),
            "calls": sum(s.calls for s in self.seats),
            "fallbacks": sum(s.fallbacks for s in self.seats),
            "seams_fell_back": sum(1 for s in self.seats if s.fallbacks),
            "self_detached": sum(1 for s in self.seats if s.state == "self_detached"),
            "never_called": sum(1 for s in seated if not s.calls),
            "clean": sum(1 for s in seated if s.calls and not s.fallbacks),
            "refused": {s.name: s.reason for s in self.seats if s.state == "refused"},
            "weight_bytes_before": sum(s.bytes_before for s in seated),
            "weight_bytes_after": sum(s.bytes_after for s in seated),
        }

    def table(self) -> str:
        rows = {}
        for s in self.seats:
            r = rows.setdefault((s.kind, s.state), [0, 0, 0, None])
            r[0] += 1
            r[1] += s.bytes_before
            r[2] += s.bytes_after
            if s.parity is not None:
                r[3] = s.parity if r[3] is None else min(r[3], s.parity)
        lines = [f"{'kind':8s} {'state':14s} {'seats':>5s} {'before MiB':>10s} {'after MiB':>10s} {'min parity':>10s}"]
        for (kind, state), (n, before, after, parity) in sorted(rows.items()):
            p = f"{parity:10.4f}" if parity is not None else f"{'-':>10s}"
            lines.append(f"{kind:8s} {state:14s} {n:5d} {before / 2**20:10.2f} {after / 2**20:10.2f} {p}")
        for s in self.seats:
            if s.state == "refused":
                lines.append(f"refused {s.name}: {s.reason}")
        return "\n".join(lines)


def _publish(handle: Handle) -> None:
    m = metrics()
    for kind in ("dense", "experts", "head"):
        for state in ("seated", "refused", "self_detached"):
            m["flashrt_seats"].labels(kind, state).set(
                sum(1 for s in handle.seats if s.kind == kind and s.state == state)
            )
        seated = [s for s in handle.seats if s.kind == kind and s.state == "seated"]
        m["flashrt_weight_bytes"].labels(kind, "host").set(sum(s.bytes_before for s in seated))
        m["flashrt_weight_bytes"].labels(kind, "seated").set(sum(s.bytes_after for s in seated))
        parities = [s.parity for s in seated if s.parity is not None]
        if parities:
            m["flashrt_seat_parity"].labels(kind).set(min(parities))
    m["flashrt_attach_seconds"].set(handle.attach_seconds)
    m["flashrt_no_seats"].set(0 if any(s.state == "seated" for s in handle.seats) else 1)


def _count_choice(source: str) -> None:
    metrics()["flashrt_kernel_choices_total"].labels(source).inc()


def attach(model: torch.nn.Module, profile: SeatProfile | None = None, discover=discover, seat_types=None) -> Handle:
    """Seat every admitted projection, expert bank and LM head of ``model``; never raises for a
    seat that cannot be bound (``profile.strict`` raises when none could). ``discover`` and
    ``seat_types`` are what an engine integration (``vllm_seats``) replaces."""
    seat_types = seat_types or SEAT_TYPES
    import triton
    from flashrt import __version__

    profile = profile or SeatProfile()
    ops.pin_activations(profile.activations)
    shipped_on()  # a bad FLASHRT_SHIPPED_CHOICES stops here, as the profile's variables do, not in every seat
    for source in SOURCES:  # every source's series from the first scrape, at 0
        metrics()["flashrt_kernel_choices_total"].labels(source)
    TUNER.on_choice = _count_choice  # the choices serving makes later are counted too
    chosen_before = TUNER.sources.copy()
    start = time.perf_counter()
    seats, notes = [], []
    for spec in discover(model, profile):
        seat = seat_types[spec.kind](spec, profile)
        try:
            with torch.no_grad():
                seat.bind()
            notes.append(f"{spec.name}: {spec.kind}, {spec.params} params, parity {seat.parity:.5f}, seated")
        except Refused as exc:
            seat.unbind()
            seat.state, seat.reason = "refused", str(exc)
            notes.append(f"{spec.name}: {spec.kind}, refused: {exc}")
        except Exception as exc:  # a seat that cannot be bound is refused; the engine still starts
            seat.unbind()
            seat.state, seat.reason = "refused", f"{type(exc).__name__}: {exc}"
            notes.append(f"{spec.name}: {spec.kind}, refused: {type(exc).__name__}: {exc}")
        seats.append(seat)
    on_gpu = any(p.is_cuda for p in model.parameters())
    if on_gpu:
        # Calibration calls ran the adjudication for their shapes: keep every outcome.
        notes += [f"kernel {key}: " + "; ".join(outcomes) for key, outcomes in TUNER.all_notes().items()]
        chosen = TUNER.sources - chosen_before
        kernels = "kernel choices: " + ", ".join(f"{chosen[source]} {source}" for source in SOURCES)
    else:
        kernels = "kernels: the plain-torch reference serves every seam (no CUDA device)"
    notes.append(kernels)
    handle = Handle(model, profile, seats, notes, time.perf_counter() - start)
    form = "triton" if on_gpu else "reference"
    metrics()["flashrt_runtime_info"].labels(__version__, torch.__version__, triton.__version__, form).set(1)
    _publish(handle)
    log.info("flashrt: attach took %.2f s (%s)\n%s", handle.attach_seconds, kernels, handle.table())
    if not any(s.state == "seated" for s in seats):
        reasons = "; ".join(f"{s.name}: {s.reason}" for s in seats) or "no seat found in the model"
        if profile.strict:
            handle.detach()
            raise RuntimeError(f"flashrt: strict profile and nothing could be seated: {reasons}")
        log.warning("flashrt: activation on, but nothing was seated: %s", reasons)
    return handle
