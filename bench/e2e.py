"""``python -m flashrt.bench e2e``: decode end to end on the GPU, seated against bf16.

Models come from transformers configs with random weights (no download): a Llama-3-8B-shaped
dense model, a Qwen3-30B-A3B-shaped MoE and, where the installed transformers has it, a
Qwen3.5-35B-A3B-shaped hybrid MoE. Both arms run the same static KV cache, the same
``torch.compile`` of the model and the same decode step: the forward plus greedy selection
captured in one CUDA graph and replayed once a token, as a serving engine runs decode.
``generate()`` at batch 1 is reported beside it; its per-step host work caps any kernel's
speedup (design.md, "Measured anchors").

The bf16 arm's expert banks run ``moe_fused`` on bf16 weights (one grouped launch for gate_up,
one for down, config measured per row count), faster than vLLM's fused-MoE kernel on the H200
(bench/results/h200-kernels-acd7a4e.json: 37.6 us at one token against vLLM's 84.3). transformers' own
``grouped_mm`` reads the whole bank every step and would flatter the packed bank. The seated
arm keeps that bf16 bank as its host for rows above the MoE band (the runtime's default
profile); the band sweep measures decode with the packed bank and with the host bank at the
same batch, which is where the default band comes from.

Both arms run vLLM's merged projections (``merge_projections``: q, k and v one GEMM, gate and
up one, a gated-delta-rule layer's four input projections two), not transformers' separate
ones, a decode attention that reads each key-value head once, split along the cache
(``gqa_decode_attention``, ``decode_attention``), the router's logits GEMM (vLLM's
``GateLinear`` tier up to 16 tokens) and softmax and top-k in one launch each (``router_topk``),
and Qwen3.5's gated delta rule and convolution update in the decode step as ops on
flash-linear-attention's kernels that the compiler does not look into (``gated_delta``), as a
serving engine's do. Where torch has it, both compile their kernels with PDL (inductor's
``triton.enable_pdl``; ``--inductor-pdl off`` leaves it off), which the ring forms follow
(``decode.launch_pdl``): Llama-3-8B's seated step 2.25 to 2.07 ms at batch 1, its bf16 step
4.54 to 4.44 (H200, 0d80628). The decode attention's and the router's kernels are launched with
PDL in the arm where that is faster, the seated one (``PDL_ARMS``).

Random Gaussian weights give expert banks a parity near 0.987 against bf16 (two chained NVFP4
GEMMs and a gate), so MoE models use a parity floor of 0.98, stated in the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import inspect
import itertools
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from flashrt.bench import (
    breakdown,
    cache_preference,
    decode_attention,
    gated_delta,
    inductor_trigger,
    merge,
    router_topk,
)
from flashrt.bench.kernels import provenance
from flashrt.kernels import linear_mma_gluon, linear_mma_ws_gluon, moe_fused, ops
from flashrt.runtime import SeatProfile, attach, fusion
from flashrt.runtime.profile import from_env
from flashrt.runtime.seats import _is_expert_bank, _with_band

PROMPT, GENERATED, WARM_STEPS = 128, 128, 3
# Where torch.compile's kernels launched with PDL let the next one start (``--inductor-trigger``):
# after their last load, as inductor places it, or right after their wait (``inductor_trigger``).
TRIGGERS = ("last-load", "wait")
# How inductor picks its kernels' launch configs, in both arms (``--inductor-configs``; every
# run in docs/benchmarks.md, sessions 64-65). ``autotune`` (inductor's default) times a kernel's
# few configs at its first call and keeps the fastest it saw; for the 2-5 us q/k-norm, rotary and
# cache kernels that is close to a draw: 5-16 us a layer between processes, Qwen3-30B at batch 8
# on H100s 2.36x, 2.42x and 2.48x with the same kernels of ours
# (``h100-e2e-qwen3-30b-a3b-b8-*.json``). ``heuristic`` keeps the one config inductor's
# deterministic mode picks: 2.37x in two processes, the same each time but the slow end of the
# draws. ``coordinate-descent`` (``coordinate_descent_tuning``) tunes around the first pick and
# turns a matrix-vector ``mm``/``bmm`` into a reduction it fuses, at batch 1 the bf16 arm's
# projections too (gpt-fast's setting): Llama-3-8B at 1 2.60x against the default's 2.73x, its
# bf16 step no faster than cuBLAS's (``h100-e2e-llama-b1-coordinate-descent-0087151.json``);
# Qwen3-30B at 8 run only on four layers. So the default stays ``autotune``.
INDUCTOR_CONFIGS = ("autotune", "heuristic", "coordinate-descent")
BATCHES = (1, 4, 8, 16, 32)
# The arms whose decode attention and router kernels (``decode_attention.PDL_LAUNCH``,
# ``router_topk.PDL_LAUNCH``) are launched with PDL, as torch.compile's kernels. By default each
# arm as it runs faster, on the H200 in one call each. The attention: Llama-3-8B at batch 1
# (8dbc588, ``h200-e2e-llama-8dbc588-b1-attn-*.json``), the seated step gained 2.5% with it
# (483.4 to 495.7 tok/s: the output projection copies its weights during the merge) and the bf16
# one lost 2.2% (222.3 to 217.4; cuBLAS's projection after it gains nothing). The router:
# Qwen3-30B at batch 1 (9bdf706, ``h200-probe-pdl-switches-9bdf706.json``), the seated step 2.024
# to 1.946 ms with it, the bf16 one 3.638 to 3.875 (its graph's other launches are plain).
PDL_ARMS = {"seated": ("seated",), "both": ("bf16", "seated"), "off": ()}


def _pdl_for(arm: str, setting: str) -> None:
    """The decode attention and router kernels of ``arm`` (``bf16``, ``seated``) as ``setting``
    launches them: with PDL as torch.compile's kernels (``None``), or never."""
    decode_attention.PDL_LAUNCH = router_topk.PDL_LAUNCH = None if arm in PDL_ARMS[setting] else False


def _llama3_8b(layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers or 32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
        tie_word_embeddings=False,
    )  # fmt: skip


def _qwen3_30b_a3b(layers: int):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=layers or 48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1, norm_topk_prob=True,
        max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip


def _qwen35_35b_a3b(layers: int):
    from transformers import Qwen3_5MoeTextConfig  # the text model's defaults are the 35B-A3B's

    config = Qwen3_5MoeTextConfig()
    if layers:  # keep the 3:1 linear-to-full attention pattern of the first ``layers``
        types = config.layer_types[:layers]
        types[-1] = "full_attention"  # at least one: the cache's length is read from one
        config = Qwen3_5MoeTextConfig(num_hidden_layers=layers, layer_types=types)
    return config


MODELS = {"llama3-8b": _llama3_8b, "qwen3-30b-a3b": _qwen3_30b_a3b, "qwen3.5-35b-a3b": _qwen35_35b_a3b}


def build(name: str, layers: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    config = MODELS[name](layers)
    use_gqa_decode_attention(config)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval()


# -- attention ------------------------------------------------------------------------------------

GQA_DECODE = "gqa_decode_sdpa"  # no "flash" in it: transformers takes any such name for flash attention


def gqa_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """At one query token, the query heads that share a key-value head are that head's query rows
    (``[B, KV, G, D]``), so the cache is read once a key-value head, split along the cache over
    more programs (``decode_attention``); otherwise transformers' sdpa.

    transformers' sdpa takes its GQA path only without a mask, and the static cache needs one: it
    repeats K and V per query head, which on the Qwen3-30B shape (32 query heads over 4) at batch
    16 cost 1.11 ms of copies and 1.57 ms of attention over the repeated cache in a 10.3 ms step,
    in both arms (H200, cd6926f, ``bench/results/h200-e2e-qwen3-b16.json``). A serving engine's
    decode attention (vLLM's FlashAttention) reads each key-value head once."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    if q_len != 1 or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    rows = query.view(batch, kv_heads, heads // kv_heads, dim)
    if attention_mask is None:
        visible = torch.ones(batch, length, dtype=torch.bool, device=query.device)
    else:
        visible = attention_mask[:, 0, -1, :length].expand(batch, length)
    scale = dim**-0.5 if scaling is None else scaling
    out = decode_attention.decode_attention(rows, key, value, visible, scale)
    return out.reshape(batch, 1, heads, dim), None


def use_gqa_decode_attention(config) -> None:
    """``gqa_decode_attention`` as the config's attention; its masks sdpa's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_DECODE, gqa_decode_attention)
    AttentionMaskInterface.register(GQA_DECODE, sdpa_mask)
    config._attn_implementation = GQA_DECODE


# -- the bf16 arm's expert bank ------------------------------------------------------------------

_BANKS: list[torch.nn.Module] = []
_BANK_CONFIGS: dict[tuple, dict] = {}


@torch.library.custom_op("flashrt_bench::bf16_bank", mutates_args=())
def bf16_bank(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, bank: int) -> torch.Tensor:
    """``moe_fused`` on the bank's bf16 weights, the config measured once per row count (the
    first call of a shape must come before any capture, as the seated arm's adjudication does)."""
    module = _BANKS[bank]
    gate_up, down = (module.gate_up_proj, None, None), (module.down_proj, None, None)
    weights = top_k_weights.to(hidden.dtype)
    e, two_n, k = module.gate_up_proj.shape
    key = (hidden.shape[0], e, two_n, k, top_k_index.shape[1])
    out = torch.empty_like(hidden)
    if key not in _BANK_CONFIGS:
        configs = moe_fused.configs(hidden.shape[0], two_n // 2, k)
        launch = functools.partial(moe_fused.launch, hidden, gate_up, down, top_k_index, weights, out)
        _BANK_CONFIGS[key] = min(configs, key=lambda c: ops._time_us(functools.partial(launch, c, False)))
    return moe_fused.launch(hidden, gate_up, down, top_k_index, weights, out, _BANK_CONFIGS[key], False)


@bf16_bank.register_fake
def _(hidden, top_k_index, top_k_weights, bank):
    return torch.empty_like(hidden)


def install_bf16_banks(model: torch.nn.Module) -> int:
    """Every fused expert bank computes through ``bf16_bank``; returns how many."""
    count = 0
    for module in model.modules():
        if _is_expert_bank(module):
            _BANKS.append(module)
            index = len(_BANKS) - 1
            module.forward = lambda hidden, ids, weights, index=index: bf16_bank(hidden, ids, weights, index)
            count += 1
    return count


# -- vLLM's merged projections, in both arms -----------------------------------------------------

# vLLM serves q, k and v as one projection (QKVParallelLinear) and gate and up as one
# (MergedColumnParallelLinear), and a gated-delta-rule layer's four input projections as two
# (Qwen3.5's ``packed_modules_mapping``: ``in_proj_qkvz``, ``in_proj_ba``); transformers runs each
# separately. Both arms get vLLM's layout, so the ratio is the format's on the GEMMs a serving
# engine runs: at batch 1 a 1024-row k or v projection is mostly launch and ramp in either arm,
# and Qwen3.5's 32-row b and a projections are nothing else.
MERGED = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"),
    "in_proj_ba": ("in_proj_b", "in_proj_a"),
}


class _MergedGroup:
    """The one GEMM of a group of projections that read the same input, and its slices until each
    member has taken its own (then nothing is held between forwards)."""

    def __init__(self, linear: torch.nn.Linear, sizes: list[int]):
        self.linear, self.sizes = linear, sizes
        self.input = self.outputs = None
        self.taken = 0

    def take(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if x is not self.input:  # the group's first member this forward (input is None between)
            self.input, self.outputs, self.taken = x, self.linear(x).split(self.sizes, dim=-1), 0
        out = self.outputs[index]
        self.taken += 1
        if self.taken == len(self.sizes):
            self.input = self.outputs = None
        return out


class MergedMember(torch.nn.Module):
    """A member projection in its old place (``q_proj``), answering with its slice of the group's
    GEMM, so the model's own forward runs unchanged."""

    def __init__(self, group: _MergedGroup, index: int):
        super().__init__()
        self.group, self.index = group, index  # a plain object: the merged Linear is its parent's child

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.take(x, self.index)


def merge_projections(model: torch.nn.Module) -> int:
    """Replace each group of ``MERGED`` projections (same input size, dtype, device and bias) by
    one ``nn.Linear`` on their parent (``qkv_proj``, ``gate_up_proj``, ...), which is what seats
    then find; returns how many groups were merged."""
    count = 0
    for parent in list(model.modules()):
        for merged_name, names in MERGED.items():
            members = [getattr(parent, name, None) for name in names]
            if not all(type(m) is torch.nn.Linear for m in members):
                continue
            first = members[0]
            if any(
                (m.in_features, m.weight.dtype, m.weight.device, m.bias is None)
                != (first.in_features, first.weight.dtype, first.weight.device, first.bias is None)
                for m in members
            ):
                continue
            sizes = [m.out_features for m in members]
            linear = torch.nn.Linear(
                first.in_features, sum(sizes), bias=first.bias is not None, device=first.weight.device,
                dtype=first.weight.dtype,
            ).requires_grad_(False)  # fmt: skip
            with torch.no_grad():
                linear.weight.copy_(torch.cat([m.weight for m in members]))
                if first.bias is not None:
                    linear.bias.copy_(torch.cat([m.bias for m in members]))
            setattr(parent, merged_name, linear)
            group = _MergedGroup(linear, sizes)
            for index, name in enumerate(names):
                setattr(parent, name, MergedMember(group, index))
            count += 1
    return count


# -- one arm at one batch ------------------------------------------------------------------------


# Parts of the vocabulary ``greedy`` takes the largest logit of first: a divisor of each model's
# vocabulary (Llama-3's 128256, Qwen3's 151936 and Qwen3.5's 248320 are 128 x 1002, 1187, 1940).
GREEDY_PARTS = 128


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """``logits [B, V]`` -> ``[B, 1]``: each row's first largest logit, as ``argmax`` picks it, in
    two passes: the largest of each of ``GREEDY_PARTS`` parts (its first, as ``max`` gives it),
    then the first part holding the largest. torch's ``argmax`` over a batch-1 vocabulary is one
    block of a reduction, and inductor does not split an arg reduction: on the H200 it took 28.6 us
    of Llama-3-8B's seated 2.07 ms step and 35.0 of bf16's (2dc168a, the step's kernel profiles),
    where a serving engine's sampler takes a few, and it held the bf16 graph's launches up besides:
    Qwen3-30B's bf16 step at batch 1 took 3.946 ms with it and 3.648 with this, the seated one
    2.092 and 2.081 (3e935d0, ``bench/probe_greedy.py``)."""
    batch, vocab = logits.shape
    parts = math.gcd(vocab, GREEDY_PARTS)
    best, at = logits.reshape(batch, parts, vocab // parts).max(-1)
    part = best.argmax(-1, keepdim=True)
    return part * (vocab // parts) + at.gather(-1, part)


def select_program(compile_model: bool, backend: str = "inductor"):
    """The step's greedy selection: compiled as the model is (``batch_program``), or as it is."""
    return torch.compile(greedy, dynamic=False, backend=backend) if compile_model else greedy


class DecodeRun:
    """A static cache and the buffers one captured decode step reads and advances in place."""

    def __init__(self, model, compiled, prompt: torch.Tensor, select=greedy):
        from transformers import StaticCache

        self.model, self.compiled, self.prompt, self.select = model, compiled, prompt, select
        batch, length = prompt.shape[0], PROMPT + GENERATED + WARM_STEPS
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        device = prompt.device
        causal = torch.ones(PROMPT, length, dtype=torch.bool, device=device).tril()
        self.prefill_mask = causal[None, None].expand(batch, 1, PROMPT, length).contiguous()
        self.prefill_positions = torch.arange(PROMPT, device=device)[None].expand(batch, PROMPT).contiguous()
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.mask = torch.zeros(batch, 1, 1, length, dtype=torch.bool, device=device)
        wants_cache_position = "cache_position" in inspect.signature(model.forward).parameters
        self.extra = {"cache_position": self.position} if wants_cache_position else {}
        self.prefill_extra = {"cache_position": torch.arange(PROMPT, device=device)} if wants_cache_position else {}

    def prefill(self) -> torch.Tensor:
        """Fill the cache with the prompt from position 0; the last position's logits."""
        self.cache.reset()
        out = self.model(
            input_ids=self.prompt, attention_mask=self.prefill_mask, position_ids=self.prefill_positions,
            past_key_values=self.cache, use_cache=True, logits_to_keep=1, **self.prefill_extra,
        )  # fmt: skip
        logits = out.logits[:, -1].float()
        self.token.copy_(self.select(logits))
        self.position.fill_(PROMPT)
        self.positions.fill_(PROMPT)
        self.mask.zero_()
        self.mask[..., :PROMPT] = True
        return logits

    def step(self) -> None:
        self.mask.index_fill_(3, self.position, True)
        logits = self.compiled(
            input_ids=self.token, attention_mask=self.mask, position_ids=self.positions,
            past_key_values=self.cache, use_cache=True, **self.extra,
        ).logits  # fmt: skip
        self.logits = logits[:, -1]
        self.token.copy_(self.select(self.logits))
        self.position.add_(1)
        self.positions.add_(1)


def _graph(fn) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _replay_ms(graph: torch.cuda.CUDAGraph, times: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(times):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def batch_program(model, compile_model: bool, backend: str = "inductor"):
    """The decode step's program for one batch: compiled afresh, its shapes static.

    Under ``torch.compile``'s default a second batch size recompiles with a symbolic batch, so a
    batch's figure depended on the batches measured before it in the process. Qwen3-30B at 8
    sequences took 5.87 ms a step measured after batch 1 (51ae3f9), 4.96 and 4.79 ms measured
    alone (6c25fba, 2b124ad; H200). A serving engine captures one graph per batch size; each
    batch here is the program a run of that batch alone compiles."""
    if not compile_model:
        return model
    torch._dynamo.reset()
    return torch.compile(model, dynamic=False, backend=backend)


def measure(model, compile_model: bool, prompt: torch.Tensor, profile_kinds: bool = False, select=None) -> dict:
    """Prefill time, first-step logits and decode tokens/s at ``prompt``'s batch; ``select`` the
    greedy selection (``select_program``'s by default).

    Prefill and the decode step are each captured in a CUDA graph, so both arms are timed on
    the device alone: eager launches would add each arm's host dispatch to its figure."""
    program = batch_program(model, compile_model)  # resets dynamo: the selection is compiled after it
    run = DecodeRun(model, program, prompt, select or select_program(compile_model))
    with torch.no_grad():
        logits = run.prefill()  # first calls of every shape (adjudication, tuning) outside capture
        warm_start = time.perf_counter()
        for _ in range(WARM_STEPS):
            run.step()  # compiles on the first call
        torch.cuda.synchronize()
        warm_s = time.perf_counter() - warm_start
        step_graph = _graph(run.step)
        prefill_graph = _graph(run.prefill)
        prefill_ms = statistics.median(_replay_ms(prefill_graph, 1) for _ in range(5))
        prefill_graph.replay()  # the cache holds the prompt again; decode from position PROMPT
        seconds = _replay_ms(step_graph, GENERATED) / 1e3
        figures = {
            "decode_tok_s": prompt.shape[0] * GENERATED / seconds,
            "step_ms": seconds / GENERATED * 1e3,
            "prefill_ms": prefill_ms,
            "warm_steps_s": warm_s,
            "logits": logits,
        }
        if profile_kinds:
            prefill_graph.replay()  # from position PROMPT again: the cache holds PROMPT + GENERATED + WARM_STEPS
            figures["kernels"], figures["kernel_gaps"] = _kernel_breakdown(step_graph)
            figures["prefill_kernels"], _ = _kernel_breakdown(prefill_graph)  # where a prefill over 1.1x goes
    del step_graph, prefill_graph
    return figures


def idle_and_overlap(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """For each interval, in the order given: the time just before it started in which no
    interval ran, and the part of it during which one that started earlier still ran.
    Overlapping kernels (a PDL launch waiting in its prologue, cuBLAS's own early launches) leave
    no idle, so the first is what each launch and its dependency cost the GPU; the second is the
    share of a kernel's time that the step does not pay for it alone (H200, Llama at batch 8,
    856a2cf: the seated step's kernels add up to 2650 us, but some kernel ran for only 2511)."""
    out = [(0.0, 0.0)] * len(intervals)
    end = None
    for i in sorted(range(len(intervals)), key=lambda i: intervals[i]):
        start, stop = intervals[i]
        if end is not None:
            out[i] = (max(start - end, 0.0), max(min(stop, end) - start, 0.0))
        end = stop if end is None else max(end, stop)
    return out


def replayed_kernels(graph: torch.cuda.CUDAGraph, replays: int) -> list[tuple]:
    """Every kernel the profiler saw over ``replays`` back-to-back replays of ``graph``, each with
    the GPU's idle time just before it and the time it overlapped earlier kernels
    (``idle_and_overlap``): ``(event, idle, overlap)``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    timeline = idle_and_overlap([(e.time_range.start, e.time_range.end) for e in kernels])
    return [(e, idle, overlap) for e, (idle, overlap) in zip(kernels, timeline, strict=True)]


def gaps_by_predecessor(launches: list[tuple[str, float]], replays: int, top: int = 15) -> list[dict]:
    """The idle time before each kernel a step, by the kernel launched just before it: ``launches``
    ``(name, idle before)`` in start order, over ``replays`` steps; the ``top`` pairs with the most.
    Which launch waits is not in the by-name breakdown: on the H200 (afb0251) Qwen3-30B's seated
    step waited 0.45 us before each of its router's two kernels and its bank's gate_up, and 0.65
    before half its norms, about 118 us a step, where the bf16 step waited 58 in all."""
    totals: dict[tuple[str, str], list[float]] = {}  # (before, kernel): [launches, idle us]
    for (before, _), (name, idle) in itertools.pairwise(launches):
        total = totals.setdefault((before[:80], name[:80]), [0.0, 0.0])
        total[0] += 1 / replays
        total[1] += idle / replays
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]
    return [
        {"after": before, "kernel": name, "calls_per_step": calls, "idle_before_us_per_step": idle}
        for (before, name), (calls, idle) in ranked
        if idle > 0
    ]


def _kernel_breakdown(graph: torch.cuda.CUDAGraph, replays: int = WARM_STEPS) -> tuple[list[dict], list[dict]]:
    """Device time, launches and the idle time just before them, a step by kernel name (the 25
    with the most of both), from the profiler over graph replays; the ``all`` row adds the time
    some kernel ran and the time none did (the replays run back to back, so the gaps between
    them count too). Beside it the same idle by the kernel before (``gaps_by_predecessor``)."""
    try:
        launches = replayed_kernels(graph, replays)
        ordered = sorted(launches, key=lambda launch: launch[0].time_range.start)
        gaps = gaps_by_predecessor([(e.name, gap) for e, gap, _ in ordered], replays)
        idle = sum(gap for _, gap, _ in launches)
        totals: dict[str, list] = {}  # name: [device us, launches, idle us before them, us overlapped]
        for event, gap, overlap in launches:
            total = totals.setdefault(event.name, [0.0, 0, 0.0, 0.0])
            total[0] += event.device_time / replays
            total[1] += 1 / replays
            total[2] += gap / replays
            total[3] += overlap / replays
        ranked = sorted(totals.items(), key=lambda kv: -(kv[1][0] + kv[1][2]))  # time and idle before
        span = max(e.time_range.end for e, _, _ in launches) - min(e.time_range.start for e, _, _ in launches)
        return [
            *(
                {
                    "kernel": name[:120],
                    "us_per_step": us,
                    "calls_per_step": calls,
                    "idle_before_us_per_step": gap,
                    "overlapped_us_per_step": overlap,
                }
                for name, (us, calls, gap, overlap) in ranked[:25]
            ),
            {
                "kernel": "all",
                "us_per_step": sum(t[0] for t in totals.values()),
                "calls_per_step": sum(t[1] for t in totals.values()),
                "busy_us_per_step": (span - idle) / replays,
                "idle_us_per_step": idle / replays,
            },
        ], gaps
    except Exception as exc:  # a profile is an aid to the note, never a reason to lose the run
        return [{"error": f"{type(exc).__name__}: {exc}"[:300]}], []


def generate_tok_s(model, prompt: torch.Tensor, tokens: int = 64) -> float:
    """Greedy ``generate()`` (dynamic cache, eager), host work included."""
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        torch.cuda.synchronize()
    assert out.shape[1] == prompt.shape[1] + tokens
    return prompt.shape[0] * tokens / (time.perf_counter() - start)


def _w4a16_logits(model, handle, prompts: torch.Tensor, batches: list[int]) -> dict[int, torch.Tensor]:
    """First-step logits of the bf16 model with every seated weight replaced by its NVFP4 round
    trip, computed by cuBLAS: what the packed kernels should compute. Against it the seated
    logits check the kernels; against bf16 it is the cost of 4-bit weights alone (a deep
    random-weight model amplifies any perturbation, so that cost says little about a trained one)."""
    with torch.no_grad():
        for seat in handle.seats:
            if seat.state == "detached" and not seat.spec.tied:
                module = seat.spec.module
                params = (module.gate_up_proj, module.down_proj) if seat.kind == "experts" else (module.weight,)
                for param in params:
                    _round_trip_in_place(param.data)
        return {b: DecodeRun(model, model, prompts[:b]).prefill() for b in batches}


# Rows round-tripped at once: 64 MiB a float32 intermediate at K=2048.
ROUND_TRIP_ROWS = 8192


def _round_trip_in_place(weight: torch.Tensor) -> None:
    """``weight`` (``[N, K]`` or ``[E, N, K]``) replaced by its NVFP4 round trip, one matrix and
    ``ROUND_TRIP_ROWS`` rows at a time under each matrix's own global scale: the values the whole
    at once gives (``quantize``'s ``amax``). The whole at once did not fit: a Qwen3-30B gate_up
    bank's float32 intermediates (1.5 GiB each) beside the full-depth model on an 80 GB H100, an
    allocation of 1.16 GiB with 1.06 GiB free (session 58)."""
    from flashrt.kernels import dequantize, quantize
    from flashrt.kernels.nvfp4 import absolute_max

    for matrix in weight.view(-1, *weight.shape[-2:]):
        amax = absolute_max(matrix)
        for part in matrix.split(ROUND_TRIP_ROWS):
            part.copy_(dequantize(quantize(part, amax), part.dtype))


def _fake_quant_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` through per-token NVFP4 (the W4A4 forms' activation quantizer) and back."""
    from flashrt.kernels import dequantize
    from flashrt.kernels.nvfp4 import NVFP4Weight
    from flashrt.kernels.quantizer import quantize_rows

    q = quantize_rows(x.reshape(-1, x.shape[-1]))
    rows = NVFP4Weight(q.packed[:, None], q.scales[:, None], q.global_scale)
    return dequantize(rows, x.dtype)[:, 0].reshape(x.shape)


def _w4a4_bank(module, hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The W4A4 expert bank's arithmetic (``moe_w4a4``) on the round-tripped weights: per-token
    NVFP4 ``hidden``, then per expert ``silu(gate) * up`` in bf16 quantized per row, down."""
    w13, w2 = module.gate_up_proj, module.down_proj
    n = w2.shape[-1]
    x = _fake_quant_rows(hidden)
    flat, slot_weights = ids.reshape(-1), weights.reshape(-1).float()
    tokens = torch.arange(hidden.shape[0], device=hidden.device).repeat_interleave(ids.shape[1])
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for expert in flat.unique().tolist():
        pairs = (flat == expert).nonzero()[:, 0]
        y = x[tokens[pairs]].float() @ w13[expert].float().t()
        h = _fake_quant_rows((F.silu(y[:, :n]) * y[:, n:]).to(hidden.dtype))
        out.index_add_(0, tokens[pairs], (h.float() @ w2[expert].float().t()) * slot_weights[pairs, None])
    return out.to(hidden.dtype)


def _w4a4_logits(model, handle, prompts: torch.Tensor, batches: list[int]) -> dict[int, torch.Tensor]:
    """First-step logits with the W4A4 forms' arithmetic emulated in torch, after
    ``_w4a16_logits`` has round-tripped the seated weights: every seated projection's input
    quantized per token to NVFP4, expert banks through ``_w4a4_bank``. The H200 has no FP4
    tensor cores, so this is the accuracy cost of NVFP4 activations measured where the models run."""
    hooks, banks = [], []
    for seat in handle.seats:
        if seat.state != "detached" or seat.spec.tied:  # as _w4a16_logits: a tied head stays bf16
            continue
        module = seat.spec.module
        if seat.kind == "experts":
            banks.append((module, module.forward))
            module.forward = functools.partial(_w4a4_bank, module)
        else:
            hooks.append(module.register_forward_pre_hook(lambda mod, args: (_fake_quant_rows(args[0]), *args[1:])))
    try:
        with torch.no_grad():
            return {b: DecodeRun(model, model, prompts[:b]).prefill() for b in batches}
    finally:
        for hook in hooks:
            hook.remove()
        for module, forward in banks:
            module.forward = forward


def _set_band(handle, band: int) -> None:
    for seat in handle.seats:
        if seat.kind == "experts" and seat.state == "seated":
            seat.profile = dataclasses.replace(seat.profile, moe_band_t=band)


def _cosine_min(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.float(), b.float(), dim=-1).min())


_PROFILES = ("kernels", "kernel_gaps", "prefill_kernels")  # kernel profiles of the step and of the prefill
_PER_ROW = ("logits", *_PROFILES)  # in the rows, not the bf16 summary


def serve_as_engines_do(model: torch.nn.Module) -> dict:
    """Both arms' common ground, in place: vLLM's merged projections, the fused bf16 expert
    banks, the fused routers and the gated-delta-rule layers' decode ops (``gated_delta``); how
    many of each."""
    return {
        "merged_projections": merge_projections(model),
        "expert_banks": install_bf16_banks(model),
        "fused_routers": router_topk.install(model),
        "fused_recurrent_layers": gated_delta.install(model),
    }


def prompts_for(model: torch.nn.Module, batch: int) -> torch.Tensor:
    """``batch`` random prompts of ``PROMPT`` tokens, the same in every run (seed 1)."""
    torch.manual_seed(1)
    return torch.randint(0, model.config.vocab_size, (batch, PROMPT), device="cuda")


def compile_as_runs_do(
    inductor_pdl: bool, inductor_configs: str = "autotune", fuse_silu_mul: bool = True, fuse_add_norm: bool = True
) -> None:
    """torch.compile's settings for a run: dynamo keeps a program for every batch and arm (each
    batch is compiled afresh, ``batch_program``), inductor launches its kernels with PDL where
    ``inductor_pdl`` (its ``triton.enable_pdl``, on torches that have it) and picks their configs
    as ``inductor_configs`` says (``INDUCTOR_CONFIGS``; ``heuristic`` needs
    ``heuristic_configs_available``); ``fuse_silu_mul``: the seated gate-and-up projections take
    the SiLU-and-mul after them into their epilogue, ``fuse_add_norm``: the seated projections
    around each residual add and RMSNorm take them into theirs (``fusion.EpiloguePass``; the bf16
    arm has no seats, so nothing to rewrite)."""
    from torch._inductor import config as inductor

    fusing = fuse_silu_mul or fuse_add_norm
    inductor.post_grad_custom_post_pass = fusion.EpiloguePass(fuse_silu_mul, fuse_add_norm) if fusing else None
    torch._dynamo.config.cache_size_limit = 64
    if hasattr(inductor.triton, "enable_pdl"):
        inductor.triton.enable_pdl = inductor_pdl
    heuristic = inductor_configs == "heuristic"
    inductor.triton.autotune_pointwise = not heuristic
    inductor.coordinate_descent_tuning = inductor_configs == "coordinate-descent"
    if heuristic_configs_available():
        inductor.test_configs.force_filter_reduction_configs = heuristic


def heuristic_configs_available() -> bool:
    """Whether this torch's inductor can keep one config per reduction kernel without timing them
    (``test_configs.force_filter_reduction_configs``, what its deterministic mode does)."""
    from torch._inductor import config as inductor

    return hasattr(getattr(inductor, "test_configs", None), "force_filter_reduction_configs")


def run_profile(moe: bool) -> SeatProfile:
    """The seated arm's profile: the environment's settings over the parity floor the module
    docstring gives (0.98 for expert banks), with the MoE band a seat on this GPU resolves."""
    return _with_band(from_env(base=SeatProfile(parity_floor=0.98 if moe else 0.99)), torch.device("cuda"))


def probe_model(name: str, batch: int) -> tuple[torch.nn.Module, bool, torch.Tensor]:
    """What a probe of one model's decode step starts from (``bench/probe_greedy.py``,
    ``bench/probe_pdl_switches.py``): the full-depth model on the common ground of both arms,
    torch.compile's PDL on as ``main`` turns it on, whether it has expert banks, and ``batch``
    prompts."""
    compile_as_runs_do(inductor_pdl=True)
    model = build(name, 0)
    moe = serve_as_engines_do(model)["expert_banks"] > 0
    return model, moe, prompts_for(model, batch)


def run_model(
    name: str,
    layers: int,
    batches: list[int],
    compile_model: bool,
    band_batches: list[int],
    record,
    profiled: tuple[int, ...],
    pdl_arms: str = "seated",
) -> None:
    """Both arms of one model; ``record(figures, rows)`` after every step, so a run cut short
    keeps what it measured."""
    model = build(name, layers)
    config = model.config
    result = {
        "model": f"{name}-shaped, random weights",
        "layers": config.num_hidden_layers,
        "full_depth": not layers,
        "compiled": compile_model,
    }
    rows: list[dict] = []
    result |= serve_as_engines_do(model)
    moe = result["expert_banks"] > 0
    prompts = prompts_for(model, max([*batches, *band_batches]))
    bf16 = {}
    _pdl_for("bf16", pdl_arms)
    for b in batches:
        bf16[b] = measure(model, compile_model, prompts[:b], profile_kinds=b in profiled)
        figures = bf16[b]
        print(f"  {name} bf16  batch {b:3d}: {figures['decode_tok_s']:9.1f} tok/s  prefill {figures['prefill_ms']:.2f}")
        result["bf16"] = {b: {k: v for k, v in f.items() if k not in _PER_ROW} for b, f in bf16.items()}
        record(result, rows)
    bf16_generate = generate_tok_s(model, prompts[:1])

    # FLASHRT_* settings apply as in a served engine, e.g. FLASHRT_RETAIN_HOST_EXPERTS=0 sends the
    # 128-token prefill through the packed banks too, so the first-step logits exercise them.
    profile = run_profile(moe)
    result["parity_floor"] = profile.parity_floor
    result["retain_host_experts"], result["moe_band_t"] = profile.retain_host_experts, profile.moe_band_t
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    # A band sweep sends the packed banks up to its largest batch: they are bound for that band
    # (``ops.bank_for_serving``: the checkpoint's layout past the ring form's rows) and serve the
    # profile's band outside the sweep.
    bind_band = max([profile.moe_band_t, *band_batches]) if moe else profile.moe_band_t
    handle = attach(model, dataclasses.replace(profile, moe_band_t=bind_band))
    _set_band(handle, profile.moe_band_t)
    result["bind_moe_band_t"] = bind_band
    result["attach_seconds"] = handle.attach_seconds
    result["attach_peak_bytes"] = torch.cuda.max_memory_allocated()
    print(handle.table(), flush=True)
    seated = [s for s in handle.seats if s.state == "seated"]
    weight_bf16 = sum(s.bytes_before for s in seated)
    retained = sum(s.bytes_before for s in seated if s.kind == "experts" and s.band_host)
    packed = sum(s.bytes_after for s in seated) - retained
    result["seats"] = {kind: sum(1 for s in seated if s.kind == kind) for kind in ("dense", "experts", "head")} | {
        "refused": {s.name: s.reason for s in handle.seats if s.state == "refused"}
    }
    ours_logits = {}
    record(result, rows)
    _pdl_for("seated", pdl_arms)
    for b in batches:
        ours = measure(model, compile_model, prompts[:b], profile_kinds=b in profiled)
        ours_logits[b] = ours["logits"]
        row = {
            "model": name,
            "layers": config.num_hidden_layers,
            "batch": b,
            "bf16_tok_s": bf16[b]["decode_tok_s"],
            "ours_tok_s": ours["decode_tok_s"],
            "speedup": ours["decode_tok_s"] / bf16[b]["decode_tok_s"],
            "bf16_step_ms": bf16[b]["step_ms"],
            "ours_step_ms": ours["step_ms"],
            "bf16_prefill_ms": bf16[b]["prefill_ms"],
            "ours_prefill_ms": ours["prefill_ms"],
            "prefill_ratio": ours["prefill_ms"] / bf16[b]["prefill_ms"],
            "weight_bytes_bf16": weight_bf16,
            "weight_bytes_ours": packed,
            "weight_bytes_retained_host": retained,
            "logits_cosine": _cosine_min(ours["logits"], bf16[b]["logits"]),
            "warm_steps_s_bf16": bf16[b]["warm_steps_s"],
            "warm_steps_s_ours": ours["warm_steps_s"],
        }
        for kernels in _PROFILES:
            if kernels in ours:
                row[f"ours_{kernels}"], row[f"bf16_{kernels}"] = ours[kernels], bf16[b][kernels]
        rows.append(row)
        record(result, rows)
        print(
            f"  {name} ours  batch {b:3d}: {row['ours_tok_s']:9.1f} tok/s  x{row['speedup']:.2f}  "
            f"prefill x{row['prefill_ratio']:.2f}  cosine {row['logits_cosine']:.4f}",
            flush=True,
        )
    result["generate_batch1"] = {"bf16_tok_s": bf16_generate, "ours_tok_s": generate_tok_s(model, prompts[:1])}
    if moe and band_batches:
        sweep = []
        for b in band_batches:
            figures = {}
            for arm, band in (("packed", b), ("host", b - 1)):
                _set_band(handle, band)
                figures[arm] = measure(model, compile_model, prompts[:b])["decode_tok_s"]
            sweep.append({"batch": b, "packed_tok_s": figures["packed"], "host_tok_s": figures["host"]})
            print(f"  {name} band  batch {b:3d}: packed {figures['packed']:9.1f}  host {figures['host']:9.1f} tok/s")
            result["band_sweep"] = sweep
            record(result, rows)
        _set_band(handle, profile.moe_band_t)
        paying = [s["batch"] for s in sweep if s["packed_tok_s"] >= s["host_tok_s"]]
        result["band_pays_up_to"] = max(paying) if paying else 0
    summary = handle.summary()
    result["summary"] = {k: v for k, v in summary.items() if k != "refused"}
    result["notes"] = handle.notes
    record(result, rows)
    handle.detach()
    _release_compiled()
    w4a16 = _w4a16_logits(model, handle, prompts, batches)
    for row in rows:
        b = row["batch"]
        row["logits_cosine_vs_w4a16"] = _cosine_min(ours_logits[b], w4a16[b])
        row["w4a16_logits_cosine"] = _cosine_min(w4a16[b], bf16[b]["logits"])
    record(result, rows)
    w4a4 = _w4a4_logits(model, handle, prompts, batches)
    for row in rows:
        b = row["batch"]
        row["w4a4_logits_cosine"] = _cosine_min(w4a4[b], bf16[b]["logits"])
        row["w4a4_logits_cosine_vs_w4a16"] = _cosine_min(w4a4[b], w4a16[b])
    record(result, rows)
    _BANKS.clear()


def _run_here(names: list[str], args, out: Path, result: dict) -> None:
    batches = [int(b) for b in args.batches.split(",")]
    band_batches = [int(b) for b in args.band_batches.split(",") if b]
    profiled = tuple(int(b) for b in args.profile_batches.split(",") if b)
    for name in names:
        _run_one(name, args, batches, band_batches, profiled, out, result)
        _release_compiled()


def _release_compiled() -> None:
    """Let go of compiled steps and their graphs, and of the memory they held. They can hold a
    model's weights: after the seated arm's detach, 75.9 GiB stayed allocated on the H100 for
    Qwen3-30B's 56.3 GiB of bf16 weights (session 58)."""
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def _run_one(
    name: str, args, batches: list[int], band_batches: list[int], profiled: tuple[int, ...], out: Path, result: dict
) -> None:
    """One model into ``result``, written to ``out`` after every step; an error is recorded."""
    start = time.perf_counter()
    done_rows, done_models = list(result["rows"]), list(result["models"])
    latest: dict = {"figures": {"model": name}, "rows": []}

    def record(figures: dict, rows: list[dict]) -> None:
        latest.update(figures=figures, rows=rows)
        figures["seconds"] = time.perf_counter() - start
        result["rows"], result["models"] = done_rows + rows, [*done_models, figures]
        out.write_text(json.dumps(result, indent=1))

    try:
        run_model(name, args.layers, batches, not args.no_compile, band_batches, record, profiled, args.pdl_arms)
    except Exception as exc:  # one model that cannot run here must not lose the others
        import traceback

        traceback.print_exc()
        latest["figures"]["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        record(latest["figures"], latest["rows"])


def _on_gpus(names: list[str], args, out: Path, result: dict) -> None:
    """One process a model, models spread over the GPUs (each process sees one), one result."""
    import os
    import subprocess
    import sys

    gpus = torch.cuda.device_count()
    rest = ["--layers", str(args.layers), "--batches", args.batches, "--band-batches", args.band_batches]
    rest += ["--profile-batches", args.profile_batches]
    rest += ["--no-compile"] if args.no_compile else []
    rest += ["--cache-preference", args.cache_preference, "--split-sum", args.split_sum]
    rest += ["--mma-ws"] if args.mma_ws else []
    rest += ["--inductor-pdl", args.inductor_pdl] if args.inductor_pdl else []
    rest += ["--inductor-trigger", args.inductor_trigger, "--tune-after-us", str(args.tune_after_us)]
    rest += ["--pdl-arms", args.pdl_arms, "--inductor-configs", args.inductor_configs]
    rest += ["--fuse-silu-mul", args.fuse_silu_mul, "--fuse-add-norm", args.fuse_add_norm]
    queues = [names[i::gpus] for i in range(gpus)]
    procs = []
    for gpu, queue in enumerate(queues):
        if queue:
            part = out.with_suffix(f".gpu{gpu}.json")
            env = os.environ | {"CUDA_VISIBLE_DEVICES": str(gpu)}
            cmd = [sys.executable, "-m", "flashrt.bench", "e2e", "--models", ",".join(queue), "--out", str(part), *rest]
            procs.append((subprocess.Popen(cmd, env=env), part))
    for proc, part in procs:
        proc.wait()
        if part.exists():
            figures = json.loads(part.read_text())
            result["rows"] += figures["rows"]
            result["models"] += figures["models"]
            part.unlink()
    out.write_text(json.dumps(result, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt.bench e2e")
    parser.add_argument("--models", default="llama3-8b,qwen3-30b-a3b", help=f"of {', '.join(MODELS)}")
    parser.add_argument("--layers", type=int, default=0, help="0: full depth")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--band-batches", default="16,32,48,64", help="MoE band sweep: batches to measure")
    parser.add_argument("--profile-batches", default="1,16", help="batches whose step and prefill get a kernel profile")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--cache-preference",
        choices=("triton", "none"),
        default="triton",
        help="the L1/shared preference of Triton's kernels: as Triton loads them, or reset (bench/cache_preference.py)",
    )
    parser.add_argument(
        "--split-sum",
        choices=("reduce", "fold"),
        default="fold" if linear_mma_gluon.FOLD_SPLITS else "reduce",
        help="how the ring forms' split-K launches sum their partials: a reduce launch after them, or "
        "the last split of each tile (linear_mma_gluon.FOLD_SPLITS)",
    )
    parser.add_argument(
        "--mma-ws",
        action="store_true",
        help="offer the ring form with TMA slots, warp-specialized, to the adjudicator (linear_mma_ws_gluon.OFFERED)",
    )
    parser.add_argument(
        "--inductor-pdl",
        choices=("on", "off"),
        default=None,
        help="torch.compile's kernels launched with PDL (inductor's triton.enable_pdl, TORCHINDUCTOR_ENABLE_PDL=1) "
        "in both arms, which the ring forms follow (decode.launch_pdl); default: on where the installed torch has it",
    )
    parser.add_argument(
        "--inductor-trigger",
        choices=TRIGGERS,
        default="last-load",
        help="where torch.compile's kernels let the next kernel start, in both arms: after their last load "
        "(inductor's own) or right after their wait (bench/inductor_trigger.py), so a projection after "
        "one streams its weights while it runs",
    )
    parser.add_argument(
        "--tune-after-us",
        type=float,
        default=0.0,
        help="with --inductor-trigger wait: the seated projections' configs timed after a kernel of this many "
        "microseconds that lets them start at once (ops.SERVED_AFTER_US; the norms before qkv and gate_up take "
        "2.4-2.8 us at batch 1 on the H200), cached apart from those timed alone; 0: timed alone",
    )
    parser.add_argument(
        "--pdl-arms",
        choices=PDL_ARMS,
        default="seated",
        help="in which arms the decode attention's and router's kernels are launched with PDL as "
        "torch.compile's are (otherwise never): the default, each arm as it runs faster (PDL_ARMS)",
    )
    parser.add_argument(
        "--inductor-configs",
        choices=INDUCTOR_CONFIGS,
        default="autotune",
        help="how torch.compile's kernels get their launch configs, in both arms: timed at their first call "
        "(inductor's default, a near draw between processes for kernels of a few microseconds) or one per "
        "kernel by inductor's deterministic heuristic, the same in every process, or timed further around the "
        "first pick by coordinate descent, which also fuses matrix-vector products (INDUCTOR_CONFIGS)",
    )
    parser.add_argument(
        "--fuse-silu-mul",
        choices=("on", "off"),
        default="on",
        help="the seated gate-and-up projections take the SiLU-and-mul after them into their epilogue "
        "(runtime/fusion.py's post-grad pass)",
    )
    parser.add_argument(
        "--fuse-add-norm",
        choices=("on", "off"),
        default="on",
        help="the seated projections around each residual add and RMSNorm take them into their epilogues: "
        "the add, the norm's weight and sums of squares in o's and down's, its per-token scale in those it feeds "
        "(runtime/fusion.py's post-grad pass)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("flashrt bench e2e needs a CUDA GPU: this machine has none.")
        return 2
    if args.cache_preference == "none":
        cache_preference.reset_on_load(cache_preference.PREFER_NONE)
    linear_mma_gluon.FOLD_SPLITS = args.split_sum == "fold"
    linear_mma_ws_gluon.OFFERED = linear_mma_ws_gluon.OFFERED or args.mma_ws
    from torch._inductor import config as inductor

    has_pdl = hasattr(inductor.triton, "enable_pdl")
    if args.inductor_pdl == "on" and not has_pdl:
        print(f"--inductor-pdl on: torch {torch.__version__}'s inductor has no triton.enable_pdl; use off")
        return 2
    inductor_pdl = has_pdl and args.inductor_pdl != "off"
    if args.inductor_trigger == "wait" and not inductor_pdl:
        print("--inductor-trigger wait: torch.compile's kernels are launched without PDL here; use --inductor-pdl on")
        return 2
    if args.tune_after_us and args.inductor_trigger != "wait":
        print(
            "--tune-after-us times projections after a kernel that lets them start at once: add --inductor-trigger wait"
        )
        return 2
    if args.inductor_configs == "heuristic" and not heuristic_configs_available():
        print(
            f"--inductor-configs heuristic: torch {torch.__version__}'s inductor has no "
            "test_configs.force_filter_reduction_configs; use autotune"
        )
        return 2
    compile_as_runs_do(inductor_pdl, args.inductor_configs, args.fuse_silu_mul == "on", args.fuse_add_norm == "on")
    if args.inductor_trigger == "wait":
        inductor_trigger.install()
    ops.SERVED_AFTER_US = args.tune_after_us
    import transformers

    result = provenance() | {
        "transformers": transformers.__version__,
        "linear_attention_kernels": gated_delta.kernels(),
        "prompt_tokens": PROMPT,
        "generated_tokens": GENERATED,
        "cache_preference": args.cache_preference,
        "split_sum": args.split_sum,
        "mma_ws_offered": linear_mma_ws_gluon.OFFERED,
        "inductor_pdl": inductor_pdl,
        "inductor_trigger": args.inductor_trigger if inductor_pdl else None,
        "tuned_after_us": args.tune_after_us,
        "pdl_arms": args.pdl_arms if inductor_pdl else "off",
        "inductor_configs": args.inductor_configs,
        "fuse_silu_mul": args.fuse_silu_mul == "on",
        "fuse_add_norm": args.fuse_add_norm == "on",
        "router_logits_max_tokens": router_topk.LOGITS_MAX_TOKENS,
        "models": [],
        "rows": [],
    }
    gpu = result["device"].lower().replace("nvidia ", "").replace(" ", "-")
    # A run's own file; ``plot-e2e`` merges the runs it lists into ``{gpu}-e2e.json``.
    out = Path(args.out or merge.RESULTS / f"{gpu}-e2e-{result['commit'][:7]}.json")
    names = args.models.split(",")
    if torch.cuda.device_count() > 1 and len(names) > 1:
        _on_gpus(names, args, out, result)
    else:
        _run_here(names, args, out, result)
    for model_name in {r["model"] for r in result["rows"]}:
        speedups = [r["speedup"] for r in result["rows"] if r["model"] == model_name]
        print(f"{model_name}: decode speedup geomean x{math.exp(sum(map(math.log, speedups)) / len(speedups)):.2f}")
    profiled = breakdown.run_rows(result)
    if profiled:  # where each profiled step went, and what ratio it allows (bench/breakdown.py)
        print(breakdown.table(profiled), end="")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
