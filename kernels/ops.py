"""The public NVFP4 ops: checked Python entry points over ``torch.library`` custom ops.

``linear`` and ``moe`` validate their inputs (a ``ValueError`` names the tensor, what it got and
what it needs) and call ``torch.ops.flashrt.*``. Each custom op has a fake implementation, so
it traces under ``torch.compile(fullgraph=True)`` as one opaque node, and it launches only
device work with preallocated outputs, so it records into a CUDA graph.

On a CUDA device the op runs the Triton form that ``flashrt.kernels.tuning`` measured fastest
for the shape; elsewhere it runs the plain-torch reference (dequantize, then matmul), which is
also what the tests compare against. A weight's ``layout`` (the checkpoint's, or ``ring_layout``'s,
which seats on Hopper take: ``for_serving``) travels with it into the op, and only forms that
read it are offered.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from flashrt.kernels import (
    add_norm_after,
    decode,
    linear_dequant,
    linear_gemv,
    linear_gemv_gluon,
    linear_k_warps_gluon,
    linear_mma,
    linear_mma_gluon,
    linear_mma_ws_gluon,
    linear_w4a4,
    linear_wgmma_gluon,
    linear_wgmma_ws_gluon,
    moe_fused,
    moe_gemv_gluon,
    moe_ring_gluon,
    moe_w4a4,
    norm_scale_after,
    ring_layout,
)
from flashrt.kernels.nvfp4 import BLOCK_SIZE, NVFP4Weight, check_weight, dequantize
from flashrt.kernels.tuning import TUNER, Candidate, Outcome, bucket, candidate
from torch.utils._python_dispatch import _get_current_dispatch_mode

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)
LINEAR_FORMS = {
    "gemv": linear_gemv,
    "gemv_gluon": linear_gemv_gluon,
    "mma": linear_mma,
    "mma_gluon": linear_mma_gluon,
    "k_warps_gluon": linear_k_warps_gluon,
    "mma_ws_gluon": linear_mma_ws_gluon,
    "wgmma_gluon": linear_wgmma_gluon,
    "wgmma_ws_gluon": linear_wgmma_ws_gluon,
    "w4a4": linear_w4a4,
    "dequant": linear_dequant,
}
MOE_FORMS = {"fused": moe_fused, "gemv_gluon": moe_gemv_gluon, "ring_gluon": moe_ring_gluon, "w4a4": moe_w4a4}
# Forms whose launch takes ``SILU_MUL``: a gate-and-up projection's SiLU-and-mul in their epilogue
# (``linear_mma_gluon.paired_row``), the decode forms. The others run the projection, then
# ``silu_mul`` on its output: a launch more, as vLLM runs it.
SILU_MUL_FORMS = frozenset({"mma_gluon", "k_warps_gluon"})
# Forms whose unsplit launches take a residual add and RMSNorm in their epilogue
# (``linear_mma_gluon.AddNorm``, ``NormScale``): the decode forms. The others run the projection
# and then one launch of the same arithmetic (``add_norm_after``, ``norm_scale_after``).
NORM_FORMS = frozenset({"mma_gluon", "k_warps_gluon"})


# -- references ----------------------------------------------------------------------------------


def linear_reference(x: torch.Tensor, w: NVFP4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequant(W)^T + bias`` in float32, returned in ``x``'s dtype."""
    out = x.float() @ dequantize(w, torch.float32).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def silu_mul(y: torch.Tensor) -> torch.Tensor:
    """vLLM's ``SiluAndMul``: ``silu(y[..., :d]) * y[..., d:]`` for ``y [..., 2d]``, in float32."""
    d = y.shape[-1] // 2
    return (F.silu(y[..., :d].float()) * y[..., d:].float()).to(y.dtype)


def linear_silu_mul_reference(x: torch.Tensor, w: NVFP4Weight) -> torch.Tensor:
    """``silu_mul(x @ dequant(W)^T)`` on the float32 product, as the fused epilogue takes it."""
    return silu_mul(x.float() @ dequantize(w, torch.float32).t()).to(x.dtype)


def sumsq_numel(m: int, n: int) -> int:
    """Length of the sums-of-squares buffer an add-and-norm over ``n`` features at ``m`` tokens
    returns: fixed by the finest group (one token's), so its shape does not depend on which
    group a launch takes; ``[m, n / norm_group(m)]`` at its front is what is read."""
    return m * (n // linear_mma_gluon.norm_group(1))


def add_norm(
    product: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A projection's float32 ``product [M, N]`` plus the residual, as ``AddNorm``'s epilogue
    takes them: the residual stream ``h`` in ``dtype``; ``weighted = h * weight``; each token's
    sums of squares of ``h`` over each ``norm_group(M)`` features, ``[M, N / group]`` at the
    front of a ``sumsq_numel`` buffer (the rest zero)."""
    m, n = product.shape
    group = linear_mma_gluon.norm_group(m)
    h, weighted, sums = add_norm_after.reference(product, residual, weight, group, dtype)
    sumsq = torch.zeros(sumsq_numel(m, n), dtype=torch.float32, device=product.device)
    sumsq[: m * (n // group)] = sums.flatten()
    return h, weighted, sumsq


def norm_scale(sumsq: torch.Tensor, m: int, k: int, eps: float) -> torch.Tensor:
    """Each token's RMSNorm scale ``rsqrt(mean(h**2) + eps)`` from ``add_norm``'s sums of squares
    of its ``k`` features, float32 ``[m, 1]``."""
    groups = k // linear_mma_gluon.norm_group(m)
    return torch.rsqrt(sumsq[: m * groups].view(m, groups).sum(1, keepdim=True) / k + eps)


def linear_add_norm_reference(
    x: torch.Tensor, w: NVFP4Weight, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``add_norm`` of ``x @ dequant(W)^T + bias`` in float32: the epilogue's arithmetic."""
    product = x.float() @ dequantize(w, torch.float32).t()
    if bias is not None:
        product = product + bias.float()
    return add_norm(product, residual, weight, x.dtype)


def linear_normed_reference(
    x: torch.Tensor,
    w: NVFP4Weight,
    sumsq: torch.Tensor,
    eps: float,
    bias: torch.Tensor | None = None,
    silu_mul_after: bool = False,
) -> torch.Tensor:
    """A projection fed by a norm (``x`` is ``add_norm``'s ``weighted``): the float32 product
    times each token's ``norm_scale``, then the bias, or the SiLU-and-mul."""
    product = x.float() @ dequantize(w, torch.float32).t()
    scale = norm_scale(sumsq, x.shape[0], w.shape[1], eps)
    return norm_scale_after.reference(product, scale, bias, silu_mul_after).to(x.dtype)


def moe_reference(
    hidden: torch.Tensor, gate_up: NVFP4Weight, down: NVFP4Weight, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """Per routed expert: dequantize, ``silu(gate) * up``, down, weighted sum; float32 inside."""
    n = gate_up.packed.shape[1] // 2
    x = hidden.float()
    out = torch.zeros_like(x)
    for expert in topk_ids.unique().tolist():
        token, slot = (topk_ids == expert).nonzero(as_tuple=True)
        gu = dequantize(gate_up.expert(expert), torch.float32)
        dn = dequantize(down.expert(expert), torch.float32)
        h = x[token] @ gu.t()
        h = F.silu(h[:, :n]) * h[:, n:]
        out.index_add_(0, token, (h @ dn.t()) * topk_weights[token, slot].float()[:, None])
    return out.to(hidden.dtype)


# -- device dispatch -----------------------------------------------------------------------------


@functools.cache
def _device_key(index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    import triton

    name = props.name.replace(" ", "-")
    return f"{name}-sm{props.major}{props.minor}-triton{triton.__version__}"


def _capability(device: torch.device) -> tuple[int, int] | None:
    """The device's compute capability; asked once a device (an eager call asks on every call,
    and torch answers through its device properties each time)."""
    if device.type != "cuda":
        return None
    return _capability_of(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _capability_of(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _use_prmt(device: torch.device) -> bool:
    from flashrt.kernels.decode import use_prmt

    return use_prmt(_capability(device))


def _may_measure(device: torch.device) -> bool:
    return device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


# Rows of the weight whose outputs a candidate's parity is checked on: the reference
# dequantizes them in fp32, and a whole LM-head slab would cost 0.5 GB during attach.
PARITY_ROWS = 2048


# Microseconds of the kernel a projection is timed after (``_time_us``); 0: timed alone. A seat's
# projection follows a compiled kernel (a norm, the activation); where that kernel lets it start
# as soon as it has waited (``bench/inductor_trigger.py``), the projection copies the weight steps
# its ring holds while that kernel runs, so a deeper ring may win there that loses alone. Choices
# made so are cached apart (``_served_after_key``).
SERVED_AFTER_US = 0.0


def _served_after_key() -> str:
    return f":after{SERVED_AFTER_US:g}us" if SERVED_AFTER_US else ""


def _time_us(fn, calls: int = 16, replays: int = 7, after_us: float = 0.0) -> float:
    """Device microseconds a call from HBM: ``calls`` calls captured in one CUDA graph, each after
    an L2 flush, minus a graph of the flushes alone; median of replays. With ``after_us``, each
    call follows a ``decode.lead`` kernel of that length after the flush, in both graphs: what is
    timed is the call's time past the lead, with what it copied during it (``SERVED_AFTER_US``).

    Eager launches timed with events measure the host: a Triton launch costs 20-40 us of Python
    against 5-60 us of GPU work (H200: every form of a 28672 x 4096 GEMV timed 56-81 us eagerly
    and 29-50 us in a graph), so an eager race picks the cheapest launcher. Without the flush a
    weight smaller than L2 is timed from L2, which no decode step sees: on the H200 that picked
    a form for a 4096 x 14336 layer at 16 tokens that ran 87 us from HBM against another's 58.
    Not ``triton.testing.do_bench``: it allocates a 256 MB flush buffer per call, which lands in
    the peak memory of an attach; this one is 1.5x the L2, freed on return.

    The flush reads (a sum), it does not write: a written flush leaves the L2 full of dirty
    lines that the timed call's own reads must write back to HBM first, which no decode step
    pays (the kernel before it read weights; it wrote a few activations). H200, the 6144 x 4096
    projection at one token: with a written flush (d63d0e4) the adjudicator timed the ring form
    at 10.0 us and the GEMV at 10.3 and picked the ring, which the benchmark's rotated weights
    ran in 9.4 against the GEMV's 8.9; with this one (a548e8c) it times them 9.78 and 9.56 and
    picks the GEMV (8.9 in the benchmark), and times gate_up's ring at 25.5 us (28.5 before)
    against the benchmark's 24.8."""
    import statistics

    device = torch.cuda.current_device()
    flush_words = torch.cuda.get_device_properties(device).L2_cache_size * 3 // 8  # int32s: 1.5x the L2
    scratch = torch.zeros(flush_words, dtype=torch.int32, device=device)
    total = torch.empty((), dtype=torch.int64, device=device)
    lead_ns = round(after_us * 1e3)
    run_lead = functools.partial(decode.lead[(1,)], lead_ns, num_warps=1, launch_pdl=True) if lead_ns else None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        if run_lead:
            run_lead()
        fn()  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(stream)

    def capture(with_call: bool) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                torch.sum(scratch, 0, out=total)
                if run_lead:
                    run_lead()
                if with_call:
                    fn()
        graph.replay()
        return graph

    graphs = capture(True), capture(False)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        pair = []
        for graph in graphs:
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            pair.append(start.elapsed_time(end) * 1e3)
        times.append((pair[0] - pair[1]) / calls)
    return statistics.median(times)


def _reason(exc: Exception) -> str:
    """A refusal in one line: a config that does not build here is refused, not fatal."""
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {first}"


# CUDA errors after which nothing more runs in the process: its context is lost. A candidate that
# raises one is not refused as a config that does not build here is: every candidate after it,
# and the host path after them, fail the same way (an H100, session 57: 64 refusals and a host
# path that faulted too, one log line of 30 KB that named no cause).
_CONTEXT_LOST = (
    "illegal memory access",
    "misaligned address",
    "illegal instruction",
    "unspecified launch failure",
    "hardware stack error",
)


def _refused(c: Candidate, exc: Exception) -> Outcome:
    """The outcome of a candidate that raised: refused, unless the CUDA context is lost, which
    ends the adjudication there. CUDA reports a fault at a later call, so the kernel that
    faulted is this candidate's or one launched before it."""
    reason = _reason(exc)
    if any(lost in str(exc) for lost in _CONTEXT_LOST):
        raise RuntimeError(
            f"the CUDA context was lost while measuring {c.name} ({reason}): that candidate's kernels or "
            "one launched before them faulted, and nothing more runs in this process"
        ) from exc
    return Outcome(c, refused=reason)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0))


# Which activation precisions the forms may use, pinned per process by the runtime from
# its profile (``SeatProfile.activations``): "auto", "bf16" or "nvfp4".
_ACTIVATIONS = "auto"


def pin_activations(mode: str) -> None:
    """Restrict the linear and expert-bank forms: "bf16" offers only weight-only forms, "nvfp4"
    only W4A4 where it qualifies (weight-only elsewhere), "auto" all. Choices are cached per offer, so a change
    re-adjudicates instead of reusing a choice made among other forms."""
    global _ACTIVATIONS
    if mode not in ("auto", "bf16", "nvfp4"):
        raise ValueError(f"activations: {mode!r}; use one of auto, bf16, nvfp4")
    _ACTIVATIONS = mode


def _forms_offered(forms: dict, capability: tuple[int, int] | None, configs_of, layout: int) -> list[Candidate]:
    """Every form's configs; a form for one generation's instructions (``qualifies``: the FP4 x FP4
    forms, ``wgmma``) only where they are, the FP4 x FP4 forms as the activation pin allows, and
    only forms that read the weight's ``layout`` (``LAYOUTS``: the checkpoint's by default)."""
    w4a4 = forms["w4a4"].qualifies(capability) and _ACTIVATIONS != "bf16"
    only_w4a4 = w4a4 and _ACTIVATIONS == "nvfp4"
    out = []
    for form, mod in forms.items():
        qualifies = getattr(mod, "qualifies", lambda _: True)
        if not (w4a4 if form == "w4a4" else not only_w4a4 and qualifies(capability)):
            continue
        if layout not in getattr(mod, "LAYOUTS", (ring_layout.CHECKPOINT,)):
            continue
        precision = getattr(mod, "PRECISION", 0)
        out += [candidate(form, cfg, precision) for cfg in configs_of(mod)]
    return out


def linear_candidates(
    m: int, n: int, k: int, capability: tuple[int, int] | None = None, layout: int = ring_layout.CHECKPOINT
) -> list[Candidate]:
    return _forms_offered(LINEAR_FORMS, capability, lambda mod: mod.configs(m, n, k), layout)


def moe_candidates(
    t: int, n: int, k: int, capability: tuple[int, int] | None = None, layout: int = ring_layout.CHECKPOINT
) -> list[Candidate]:
    return _forms_offered(MOE_FORMS, capability, lambda mod: mod.configs(t, n, k), layout)


def _layout_key(layout: int) -> str:
    """What a choice's key adds for a weight in ``ring_layout``: its forms and times are its own."""
    return ":ring" if layout == ring_layout.RING else ""


def launch_params(c: Candidate, layout: int) -> dict:
    """A choice's config as its form's launcher takes it: with ``LAYOUT`` for a weight in ``ring_layout``."""
    return c.params | {"LAYOUT": layout} if layout == ring_layout.RING else c.params


def choose_linear(
    x: torch.Tensor, packed, scales, global_scale, bias, layout: int = ring_layout.CHECKPOINT
) -> Candidate:
    m, k = x.shape
    n = packed.shape[0]
    device = x.device
    key = f"linear:{x.dtype}:M{bucket(m)}:N{n}:K{k}{_layout_key(layout)}{_served_after_key()}"

    def call(c: Candidate, out: torch.Tensor) -> functools.partial:
        launch = LINEAR_FORMS[c.form].launch
        params = launch_params(c, layout)
        return functools.partial(launch, x, packed, scales, global_scale, bias, out, params, _use_prmt(device))

    def measure(c: Candidate) -> Outcome:
        out = torch.empty(m, n, dtype=x.dtype, device=device)
        run = call(c, out)
        try:
            run()
            rows = slice(0, PARITY_ROWS)
            sample = NVFP4Weight(packed[rows], scales[rows], global_scale, layout)
            ref = linear_reference(x, sample, None if bias is None else bias[rows])
            return Outcome(c, _time_us(run, after_us=SERVED_AFTER_US), parity=_cosine(out[:, rows], ref))
        except Exception as exc:  # a config that does not build here is refused, not fatal
            return _refused(c, exc)

    device_key, memo = _device_key(device.index or 0), (key, _ACTIVATIONS)
    chosen = TUNER.recall(device_key, memo)
    if chosen is not None:
        return chosen
    cands = linear_candidates(m, n, k, _capability(device), layout)
    return TUNER.choose(
        device_key, key, cands, measure, _may_measure(device), memo,
        launch=lambda c: call(c, torch.empty(m, n, dtype=x.dtype, device=device))(),
    )  # fmt: skip


def choose_moe(hidden, gate_up, down, topk_ids, topk_weights, layout: int = ring_layout.CHECKPOINT) -> Candidate:
    t, k = hidden.shape
    e, two_n, _ = gate_up[0].shape
    key = f"moe:{hidden.dtype}:T{bucket(t)}:E{e}:N{two_n // 2}:K{k}:top{topk_ids.shape[1]}{_layout_key(layout)}"
    device = hidden.device
    device_key, memo = _device_key(device.index or 0), (key, _ACTIVATIONS)
    chosen = TUNER.recall(device_key, memo)
    if chosen is not None:
        return chosen
    cands = moe_candidates(t, two_n // 2, k, _capability(device), layout)

    def call(c: Candidate, out: torch.Tensor) -> functools.partial:
        launch = MOE_FORMS[c.form].launch
        params = launch_params(c, layout)
        return functools.partial(launch, hidden, gate_up, down, topk_ids, topk_weights, out, params, _use_prmt(device))

    def measure(c: Candidate) -> Outcome:
        out = torch.empty_like(hidden)
        run = call(c, out)
        try:
            run()
            ref = moe_reference(
                hidden, NVFP4Weight(*gate_up, layout), NVFP4Weight(*down, layout), topk_ids, topk_weights
            )
            return Outcome(c, _time_us(run), parity=_cosine(out, ref))
        except Exception as exc:
            return _refused(c, exc)

    return TUNER.choose(
        device_key, key, cands, measure, _may_measure(device), memo,
        launch=lambda c: call(c, torch.empty_like(hidden))(),
    )  # fmt: skip


# -- serving layout ------------------------------------------------------------------------------

# Where seats hold their weights in ``ring_layout``: Hopper, where every row count has a form that
# reads it (the ring forms to 128 tokens, ``wgmma`` and the dequant from 17 and 64) and it was
# measured. H200, ``bench/probe_ring_layout.py`` (``h200-probe-ring-layout-fd70e4d.json``): the
# ring form 1.03-1.12x faster than on the checkpoint's layout, the same configs, at 1 and 8 tokens
# on Llama-3-8B's and Qwen3-30B's projections (the LM head at one token 82.1 against 89.2 us).
# Blackwell and Thor keep the checkpoint's: their FP4 x FP4 forms read only that, and neither
# layout was measured there.
RING_LAYOUT_MAJORS = (9,)


def _ring_layout_serves(device: torch.device) -> bool:
    from flashrt.kernels.decode import interpreted

    capability = _capability(device)
    return capability is not None and capability[0] in RING_LAYOUT_MAJORS and not interpreted()


def for_serving(w: NVFP4Weight) -> NVFP4Weight:
    """A projection's weight in the layout its device serves fastest: ``ring_layout`` where it
    pays (``RING_LAYOUT_MAJORS``, K in whole ring steps), else as it is. Bit-exact either way
    (``NVFP4Weight.in_layout``, ``to_modelopt`` give the checkpoint's bytes back)."""
    if _ring_layout_serves(w.packed.device) and w.shape[-1] % linear_mma_gluon.BLOCK_K == 0:
        return w.in_layout(ring_layout.RING)
    return w


# Rows up to which a packed expert bank serves where a profile leaves the band unset. Where the
# ring expert forms serve (Hopper), their reach: the full Qwen3-30B-A3B step ran the packed bank
# 1.93/2.07/2.35/2.51x its bf16 host at 24/32/48/64 rows on the H200 (51ae3f9 and 416ab12,
# ``h200-e2e-qwen3-51ae3f9-b32-band32.json``, ``h200-e2e-qwen3-416ab12-b16-band64.json``).
# Elsewhere ``moe_fused`` serves past 16 rows, which ran that step 1.026x and 1.015x the host at
# 24 and 32 rows (e8c5967, ``h200-e2e-qwen3-e8c5967-b16b32.json``), inside the 3% margin that
# goes to the higher-precision path, and 0.88x the same design on bf16 weights at 64 tokens.
FUSED_MOE_BAND = 16


def moe_band(device: torch.device) -> int:
    """The MoE band for a bank on ``device`` when the profile sets none (``FUSED_MOE_BAND``)."""
    return moe_ring_gluon.MAX_TOKENS if _ring_layout_serves(device) else FUSED_MOE_BAND


def bank_for_serving(gate_up: NVFP4Weight, down: NVFP4Weight, max_tokens: int) -> tuple[NVFP4Weight, NVFP4Weight]:
    """An expert bank's two weights in one layout: ``ring_layout`` where the ring expert form
    serves every row count the seat sends the bank (``max_tokens``: past ``moe_ring_gluon.MAX_TOKENS``
    only the grouped Triton form is offered, which reads the checkpoint's) and its ring down
    takes the intermediate size; else as they are."""
    _, two_n, k = gate_up.shape
    steps = linear_mma_gluon.BLOCK_K
    if (
        _ring_layout_serves(gate_up.packed.device)
        and max_tokens <= moe_ring_gluon.MAX_TOKENS
        and k % steps == 0
        and (two_n // 2) % steps == 0
    ):
        return gate_up.in_layout(ring_layout.RING), down.in_layout(ring_layout.RING)
    return gate_up, down


# -- custom ops ----------------------------------------------------------------------------------


def eager(x: torch.Tensor) -> bool:
    """Whether a call may run an op's body directly instead of through the dispatcher.

    The ops exist for tracers: a compiler (dynamo, vLLM's, ``torch.export``) must see one opaque
    node with a fake implementation, and a dispatch mode (fake tensors, functionalization) must
    see the op. An eager call needs neither, and each ``torch.library`` hop costs it host time:
    on the H200 machine's host (``python -m flashrt.bench host``, ed4426a) a seated 4096 x 4096
    call at one token took 74.3 us direct against 109.6 through both ops (bf16's ``nn.Linear``:
    19.2). In a captured decode step that host time is not replayed; eager serving
    (``enforce_eager``, transformers ``generate()``, vLLM's CPU backend) pays it every call."""
    return type(x) is torch.Tensor and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None


def _nvfp4_linear_body(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    layout: int,
) -> torch.Tensor:
    if x.device.type != "cuda":
        return linear_reference(x, NVFP4Weight(packed, scales, global_scale, layout), bias)
    c = choose_linear(x, packed, scales, global_scale, bias, layout)
    out = torch.empty(x.shape[0], packed.shape[0], dtype=x.dtype, device=x.device)
    params = launch_params(c, layout)
    return LINEAR_FORMS[c.form].launch(x, packed, scales, global_scale, bias, out, params, _use_prmt(x.device))


_nvfp4_linear = torch.library.custom_op("flashrt::nvfp4_linear", _nvfp4_linear_body, mutates_args=())


@_nvfp4_linear.register_fake
def _(x, packed, scales, global_scale, bias, layout):
    return x.new_empty(x.shape[0], packed.shape[0])


def _nvfp4_linear_silu_mul_body(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor, layout: int
) -> torch.Tensor:
    """The projection's choice for the shape (``choose_linear``: timed without the epilogue, the
    same weight bytes and MMAs), with the SiLU-and-mul in its epilogue where the form has one."""
    if x.device.type != "cuda":
        return linear_silu_mul_reference(x, NVFP4Weight(packed, scales, global_scale, layout))
    c = choose_linear(x, packed, scales, global_scale, None, layout)
    params = launch_params(c, layout)
    m, n = x.shape[0], packed.shape[0]
    launch = LINEAR_FORMS[c.form].launch
    if c.form in SILU_MUL_FORMS:
        out = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
        return launch(x, packed, scales, global_scale, None, out, params | {"SILU_MUL": True}, _use_prmt(x.device))
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    return silu_mul(launch(x, packed, scales, global_scale, None, out, params, _use_prmt(x.device)))


_nvfp4_linear_silu_mul = torch.library.custom_op(
    "flashrt::nvfp4_linear_silu_mul", _nvfp4_linear_silu_mul_body, mutates_args=()
)


@_nvfp4_linear_silu_mul.register_fake
def _(x, packed, scales, global_scale, layout):
    return x.new_empty(x.shape[0], packed.shape[0] // 2)


def _takes_norm(c: Candidate, n: int) -> bool:
    """Whether a choice can launch with a norm in its epilogue: a decode form, unsplit, whole groups of rows."""
    return c.form in NORM_FORMS and c.params.get("SPLIT_K", 1) == 1 and n % 16 == 0


def _nvfp4_linear_add_norm_body(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    layout: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The projection's choice for the shape with the residual add and the norm's weight and
    sums of squares in its epilogue (``linear_mma_gluon.AddNorm``) where the form has them, else
    the projection and ``add_norm_after``'s launch."""
    if x.device.type != "cuda":
        return linear_add_norm_reference(
            x, NVFP4Weight(packed, scales, global_scale, layout), residual, norm_weight, bias
        )
    c = choose_linear(x, packed, scales, global_scale, bias, layout)
    params = launch_params(c, layout)
    m, n = x.shape[0], packed.shape[0]
    launch = LINEAR_FORMS[c.form].launch
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    weighted = torch.empty_like(out)
    sumsq = torch.empty(sumsq_numel(m, n), dtype=torch.float32, device=x.device)
    residual, group = residual.contiguous(), linear_mma_gluon.norm_group(m)
    if not _takes_norm(c, n):
        launch(x, packed, scales, global_scale, bias, out, params, _use_prmt(x.device))
        add_norm_after.launch(out, residual, norm_weight, weighted, sumsq, group)
        return out, weighted, sumsq
    epilogue = linear_mma_gluon.AddNorm(residual, norm_weight.contiguous(), weighted, sumsq, group)
    launch(x, packed, scales, global_scale, bias, out, params, _use_prmt(x.device), add_norm=epilogue)
    return out, weighted, sumsq


_nvfp4_linear_add_norm = torch.library.custom_op(
    "flashrt::nvfp4_linear_add_norm", _nvfp4_linear_add_norm_body, mutates_args=()
)


@_nvfp4_linear_add_norm.register_fake
def _(x, packed, scales, global_scale, bias, residual, norm_weight, layout):
    m, n = x.shape[0], packed.shape[0]
    out = x.new_empty(m, n)
    return out, x.new_empty(m, n), x.new_empty(sumsq_numel(m, n), dtype=torch.float32)


def _nvfp4_linear_normed_body(
    x: torch.Tensor,
    sumsq: torch.Tensor,
    eps: float,
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    layout: int,
    silu_mul_after: bool,
) -> torch.Tensor:
    """A projection fed by a norm: the projection's choice with the norm's per-token scale (and
    the SiLU-and-mul where ``silu_mul_after``) in its epilogue where the form has them, else the
    projection and ``norm_scale_after``'s launch."""
    if x.device.type != "cuda":
        w = NVFP4Weight(packed, scales, global_scale, layout)
        return linear_normed_reference(x, w, sumsq, eps, bias, silu_mul_after)
    c = choose_linear(x, packed, scales, global_scale, None if silu_mul_after else bias, layout)
    params = launch_params(c, layout)
    m, n, k = x.shape[0], packed.shape[0], x.shape[1]
    launch = LINEAR_FORMS[c.form].launch
    if _takes_norm(c, n) and (not silu_mul_after or c.form in SILU_MUL_FORMS):
        epilogue = linear_mma_gluon.NormScale(sumsq, linear_mma_gluon.norm_group(m), eps)
        if silu_mul_after:
            out = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
            params = params | {"SILU_MUL": True}
            return launch(x, packed, scales, global_scale, None, out, params, _use_prmt(x.device), norm_scale=epilogue)
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        return launch(x, packed, scales, global_scale, bias, out, params, _use_prmt(x.device), norm_scale=epilogue)
    product = torch.empty(m, n, dtype=x.dtype, device=x.device)
    launch(x, packed, scales, global_scale, None, product, params, _use_prmt(x.device))
    out = torch.empty(m, n // 2 if silu_mul_after else n, dtype=x.dtype, device=x.device)
    group = linear_mma_gluon.norm_group(m)
    return norm_scale_after.launch(product, sumsq, k, eps, bias, out, group, silu_mul_after)


_nvfp4_linear_normed = torch.library.custom_op(
    "flashrt::nvfp4_linear_normed", _nvfp4_linear_normed_body, mutates_args=()
)


@_nvfp4_linear_normed.register_fake
def _(x, sumsq, eps, packed, scales, global_scale, bias, layout, silu_mul_after):
    return x.new_empty(x.shape[0], packed.shape[0] // 2 if silu_mul_after else packed.shape[0])


def _nvfp4_moe_body(
    hidden: torch.Tensor,
    gu_packed: torch.Tensor,
    gu_scales: torch.Tensor,
    gu_global: torch.Tensor,
    dn_packed: torch.Tensor,
    dn_scales: torch.Tensor,
    dn_global: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    layout: int,
) -> torch.Tensor:
    gate_up = (gu_packed, gu_scales, gu_global)
    down = (dn_packed, dn_scales, dn_global)
    if hidden.device.type != "cuda":
        return moe_reference(hidden, NVFP4Weight(*gate_up, layout), NVFP4Weight(*down, layout), topk_ids, topk_weights)
    c = choose_moe(hidden, gate_up, down, topk_ids, topk_weights, layout)
    out = torch.empty_like(hidden)
    launch = MOE_FORMS[c.form].launch
    params = launch_params(c, layout)
    return launch(hidden, gate_up, down, topk_ids, topk_weights, out, params, _use_prmt(hidden.device))


_nvfp4_moe = torch.library.custom_op("flashrt::nvfp4_moe", _nvfp4_moe_body, mutates_args=())


@_nvfp4_moe.register_fake
def _(hidden, gu_packed, gu_scales, gu_global, dn_packed, dn_scales, dn_global, topk_ids, topk_weights, layout):
    return torch.empty_like(hidden)


# -- checked entry points ------------------------------------------------------------------------


def _check_activation(name: str, x: torch.Tensor, k: int, device: torch.device) -> None:
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"{name}: got dtype {x.dtype}, need one of {ACTIVATION_DTYPES}")
    if x.shape[-1] != k:
        raise ValueError(f"{name}: got {x.shape[-1]} features (shape {tuple(x.shape)}), the weight needs K = {k}")
    if x.device != device:
        raise ValueError(f"{name}: on {x.device}, the weight on {device}; move both to one device")


def _token_rows(x: torch.Tensor, w: NVFP4Weight) -> torch.Tensor:
    """``x [..., K]`` as the ``[M, K]`` rows a projection op takes (unit stride along K), once
    ``w`` and ``x`` are checked to meet (a ``ValueError`` naming the one that does not)."""
    check_weight("w", w)
    k = w.shape[1]
    if k % BLOCK_SIZE:
        raise ValueError(f"w: K = {k} is not a multiple of {BLOCK_SIZE}")
    _check_activation("x", x, k, w.packed.device)
    rows = x.reshape(-1, k)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def linear(x: torch.Tensor, w: NVFP4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K] @ dequant(W)[N, K]^T + bias -> [..., N]`` in ``x``'s dtype."""
    x2 = _token_rows(x, w)
    n = w.shape[0]
    if bias is not None and (bias.shape != (n,) or bias.device != x.device):
        raise ValueError(f"bias: got shape {tuple(bias.shape)} on {bias.device}, need ({n},) on {x.device}")
    op = _nvfp4_linear_body if eager(x2) else torch.ops.flashrt.nvfp4_linear
    out = op(x2, w.packed, w.scales, w.global_scale, bias, w.layout)
    return out.reshape(*x.shape[:-1], n)


def linear_silu_mul(x: torch.Tensor, w: NVFP4Weight) -> torch.Tensor:
    """``silu_mul(x [..., K] @ dequant(W)[2I, K]^T) -> [..., I]``: a gate-and-up projection (gate
    rows first, as vLLM merges them) and its SiLU-and-mul in one op, in ``x``'s dtype."""
    x2 = _token_rows(x, w)
    n = w.shape[0]
    if n % 2:
        raise ValueError(f"w: {n} rows; a gate-and-up projection has an even count (gate rows, then up rows)")
    op = _nvfp4_linear_silu_mul_body if eager(x2) else torch.ops.flashrt.nvfp4_linear_silu_mul
    out = op(x2, w.packed, w.scales, w.global_scale, w.layout)
    return out.reshape(*x.shape[:-1], n // 2)


def linear_add_norm(
    x: torch.Tensor, w: NVFP4Weight, residual: torch.Tensor, norm_weight: torch.Tensor, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A projection, the residual add after it and an RMSNorm's first half, in one op (o or
    down, then the norm before the next projection): ``h = residual + x @ dequant(W)^T + bias``
    ``[..., N]`` (the residual stream), ``weighted = h * norm_weight`` and the sums of squares
    (``add_norm``) that ``linear_normed`` finishes the norm with."""
    x2 = _token_rows(x, w)
    n = w.shape[0]
    lead = x.shape[:-1]
    if residual.shape != (*lead, n) or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(
            f"residual: got {residual.dtype} {tuple(residual.shape)} on {residual.device}, need {x.dtype} "
            f"{(*lead, n)} on {x.device}"
        )
    if norm_weight.shape != (n,) or norm_weight.device != x.device:
        raise ValueError(f"norm_weight: got shape {tuple(norm_weight.shape)} on {norm_weight.device}, need ({n},)")
    if n % 16:
        raise ValueError(f"w: {n} rows; a norm's sums of squares are taken over groups of 16 features")
    if bias is not None and (bias.shape != (n,) or bias.device != x.device):
        raise ValueError(f"bias: got shape {tuple(bias.shape)} on {bias.device}, need ({n},) on {x.device}")
    op = _nvfp4_linear_add_norm_body if eager(x2) else torch.ops.flashrt.nvfp4_linear_add_norm
    h, weighted, sumsq = op(
        x2, w.packed, w.scales, w.global_scale, bias, residual.reshape(-1, n), norm_weight, w.layout
    )
    return h.reshape(*lead, n), weighted.reshape(*lead, n), sumsq


def linear_normed(
    x: torch.Tensor,
    w: NVFP4Weight,
    sumsq: torch.Tensor,
    eps: float,
    bias: torch.Tensor | None = None,
    silu_mul_after: bool = False,
) -> torch.Tensor:
    """A projection fed by an RMSNorm that ``linear_add_norm`` began: ``x`` its ``weighted``,
    ``sumsq`` its sums of squares; the product times each token's ``rsqrt(mean(h**2) + eps)``,
    then the bias, or the SiLU-and-mul (a gate-and-up projection, ``[..., N / 2]``)."""
    x2 = _token_rows(x, w)
    n, k = w.shape
    if sumsq.dtype != torch.float32 or sumsq.shape != (sumsq_numel(x2.shape[0], k),):
        raise ValueError(
            f"sumsq: got {sumsq.dtype} {tuple(sumsq.shape)}, need float32 ({sumsq_numel(x2.shape[0], k)},) "
            "from linear_add_norm over these tokens"
        )
    if silu_mul_after and (n % 2 or bias is not None):
        raise ValueError(f"w: {n} rows with bias {bias is not None}; a SiLU-and-mul takes an even count and no bias")
    op = _nvfp4_linear_normed_body if eager(x2) else torch.ops.flashrt.nvfp4_linear_normed
    out = op(x2, sumsq, float(eps), w.packed, w.scales, w.global_scale, bias, w.layout, silu_mul_after)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def moe(
    hidden: torch.Tensor, gate_up: NVFP4Weight, down: NVFP4Weight, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """Fused expert bank: ``hidden [T, K]``, ``gate_up [E, 2N, K]``, ``down [E, K, N]`` -> ``[T, K]``."""
    check_weight("gate_up", gate_up, batched=True)
    check_weight("down", down, batched=True)
    if gate_up.layout != down.layout:
        raise ValueError(
            f"down.layout: got {down.layout}, gate_up has {gate_up.layout}; a bank's two weights share one layout "
            "(NVFP4Weight.in_layout)"
        )
    e, two_n, k = gate_up.shape
    if two_n % 2:
        raise ValueError(f"gate_up: got {two_n} rows an expert, need 2N (gate rows, then up rows)")
    if down.shape != (e, k, two_n // 2):
        raise ValueError(f"down: got shape {down.shape}, need {(e, k, two_n // 2)} to match gate_up {gate_up.shape}")
    if hidden.dim() != 2:
        raise ValueError(f"hidden: got rank {hidden.dim()} {tuple(hidden.shape)}, need [T, K]")
    _check_activation("hidden", hidden, k, gate_up.packed.device)
    if topk_ids.dim() != 2 or topk_ids.shape[0] != hidden.shape[0] or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"topk_ids: got {topk_ids.dtype} {tuple(topk_ids.shape)}, need int32/int64 [{hidden.shape[0]}, top_k]"
        )
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise ValueError(
            f"topk_weights: got {topk_weights.dtype} {tuple(topk_weights.shape)}, need floating {tuple(topk_ids.shape)}"
        )
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.device != hidden.device:
            raise ValueError(f"{name}: on {t.device}, hidden on {hidden.device}; move both to one device")
    op = _nvfp4_moe_body if eager(hidden) else torch.ops.flashrt.nvfp4_moe
    return op(
        hidden.contiguous(),
        gate_up.packed,
        gate_up.scales,
        gate_up.global_scale,
        down.packed,
        down.scales,
        down.global_scale,
        topk_ids.contiguous(),
        topk_weights.contiguous(),
        gate_up.layout,
    )
