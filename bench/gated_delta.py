"""Qwen3.5's gated-delta-rule layers in the decode step as vLLM runs them, for both arms of
``bench.e2e``: the rule and the causal convolution each one op the compiler does not look into,
on flash-linear-attention's Triton kernels.

transformers calls the rule through a wrapper that takes flash-linear-attention's function where
the package imports, and ``e2e`` carried the package to the H200 from 2dc168a on. Yet the
captured decode step there did not run its kernel: the batch-1 kernel profile of 2dc168a
(``h200-e2e-qwen35-2dc168a-l8.json``) lists no ``fused_recurrent_gated_delta_rule`` kernel among
the 25 a step launches, and does list compiled reductions named for the ops of transformers'
torch loop (``select``, ``sum``, ``rsqrt``, ``exp``, ``softplus``): 200 us of the seated arm's
799 us of kernels a step, 92 and 72 of it in two reductions launched 5 times a step each (165
of bf16's 1293), for 6 layers whose states are 2 MB each. The convolution's update is torch's
(``causal_conv1d`` is not installed): a ``conv_depthwise2d`` kernel, 18 us a step, beside the
compiled concatenation and copy of its state. vLLM registers the rule as an op of its own
(``gdn_attention``), opaque to the compiler, and updates the convolution with one Triton kernel;
``gated_delta_rule_step`` and ``conv1d_step`` are those here, so both arms' steps run the kernels
a serving engine runs. Prefill keeps transformers' calls (the chunk kernels, which the prefill
profile shows).
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version

import torch
from flashrt.kernels.decode import cdiv, next_power_of_2

# The module-level functions transformers' gated-delta-rule layers call, whose decode calls the ops take.
RULE, CONV = "torch_recurrent_gated_delta_rule", "causal_conv1d_update"


@torch.library.custom_op("flashrt_bench::gated_delta_rule_step", mutates_args=("state",))
def gated_delta_rule_step(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """One step of the rule for ``[B, 1, H, D]`` inputs: the output, and ``state [B, H, K, V]``
    (fp32) advanced in place, as vLLM's kernel does: each program reads its slice of the state
    before it writes it. flash-linear-attention's own launcher writes a new state, which
    transformers then copies into its cache: at 32 sequences two more passes over a layer's 64 MB.
    Queries and keys L2-normalized in the kernel, as transformers asks."""
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd_kernel as kernel

    q, k, v, g, beta = (t.contiguous() for t in (query, key, value, g, beta))
    batch, steps, heads, dim_k = k.shape
    value_heads, dim_v = v.shape[2:]
    block_v = min(8, next_power_of_2(dim_v))  # flash-linear-attention's launcher's tile
    out = torch.empty_like(v)
    kernel[(cdiv(dim_v, block_v) * batch * value_heads,)](
        q=q, k=k, v=v, g=g, gk=None, gv=None, beta=beta, A_log=None, dt_bias=None, o=out, h0=state, ht=state,
        cu_seqlens=None, scale=dim_k**-0.5, T=steps, H=heads, HV=value_heads, K=dim_k, V=dim_v,
        BK=next_power_of_2(dim_k), BV=block_v, IS_BETA_HEADWISE=beta.ndim != v.ndim, USE_QK_L2NORM_IN_KERNEL=True,
        APPLY_BETA_SIGMOID=False, ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=False, num_warps=1, num_stages=3,
    )  # fmt: skip
    return out


@gated_delta_rule_step.register_fake
def _(query, key, value, g, beta, state):
    return torch.empty_like(value)


@torch.library.custom_op("flashrt_bench::conv1d_step", mutates_args=("conv_state",))
def conv1d_step(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, activation: str) -> torch.Tensor:
    """One token ``x [B, 1, D]`` through the depthwise causal convolution ``weight [D, W]`` whose
    last ``W - 1`` inputs ``conv_state [B, D, W]`` holds: ``[B, 1, D]``; the state shifted by the
    token, in place."""
    from fla.modules.causal_conv1d.ops import causal_conv1d_update

    return causal_conv1d_update(x, conv_state, weight=weight, activation=activation)[0]


@conv1d_step.register_fake
def _(x, conv_state, weight, activation):
    return torch.empty_like(x)


def _rule_through_the_op(reference):
    """transformers' rule with its decode calls (a contiguous state to start from, the new state
    wanted, L2 norm in the kernel, no packed sequences) taken by ``gated_delta_rule_step``."""

    def rule(
        query, key, value, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
        cu_seqlens=None, **kwargs,
    ):  # fmt: skip
        takes = initial_state is not None and initial_state.is_contiguous() and output_final_state
        if not takes or not use_qk_l2norm_in_kernel or cu_seqlens is not None:
            return reference(
                query, key, value, g=g, beta=beta, initial_state=initial_state, output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, **kwargs,
            )  # fmt: skip
        return gated_delta_rule_step(query, key, value, g, beta, initial_state), initial_state

    rule.reference = reference
    return rule


def _conv_through_the_op(reference):
    """transformers' convolution update (``hidden_states [B, D, T]``) with its one-token calls on a
    contiguous state as long as the kernel, without bias, taken by ``conv1d_step``."""

    def conv(hidden_states, conv_state, weight, bias=None, activation=None):
        takes = hidden_states.shape[-1] == 1 and conv_state.shape[-1] == weight.shape[-1] and bias is None
        if not takes or not conv_state.is_contiguous():
            return reference(hidden_states, conv_state, weight, bias, activation)
        return conv1d_step(hidden_states.transpose(1, 2), conv_state, weight, activation or "").transpose(1, 2)

    conv.reference = reference
    return conv


_ROUTES = {RULE: _rule_through_the_op, CONV: _conv_through_the_op}


def available() -> bool:
    return importlib.util.find_spec("fla") is not None


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]


def _modules(found: list[torch.nn.Module]) -> set:
    """The transformers modules whose functions the layers ``found`` call."""
    return {sys.modules[type(layer).__module__] for layer in found}


def install(model: torch.nn.Module) -> int:
    """The decode calls of every gated-delta-rule layer's rule and convolution go through the
    ops; returns how many layers. None where flash-linear-attention is not installed:
    transformers' calls stay, as ``kernels`` says."""
    found = layers(model) if available() else []
    for module in _modules(found):
        for name, route in _ROUTES.items():
            call = getattr(module, name)
            if not hasattr(call, "reference"):
                setattr(module, name, route(call))
    return len(found)


def uninstall(model: torch.nn.Module) -> None:
    for module in _modules(layers(model)):
        for name in _ROUTES:
            call = getattr(module, name)
            setattr(module, name, getattr(call, "reference", call))


def kernels() -> str:
    """What both arms run the layers with: the result's ``linear_attention_kernels``."""
    if not available():
        return "transformers' torch reference"
    try:
        release = version("fla-core")
    except PackageNotFoundError:
        release = "(version unknown)"
    return (
        f"flash-linear-attention {release}: decode through flashrt_bench::gated_delta_rule_step (fused "
        "recurrent) and flashrt_bench::conv1d_step (causal_conv1d_update), prefill through transformers (chunk)"
    )
