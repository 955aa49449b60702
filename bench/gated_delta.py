"""Qwen3.5's gated delta rule in the decode step as vLLM runs it, for both arms of ``bench.e2e``:
flash-linear-attention's fused recurrent kernel behind one op the compiler does not look into.

transformers calls the rule through a wrapper that takes flash-linear-attention's function where
the package imports, and ``e2e`` carried the package to the H200 from 2dc168a on. Yet the
captured decode steps there did not run its kernel: the kernel profiles of 2dc168a and a040892
(``h200-e2e-qwen35-2dc168a-l8.json``, batch 1) list no ``fused_recurrent_gated_delta_rule``
kernel among the 25 a step launches, and do list compiled reductions named for the ops of
transformers' torch loop (``select``, ``sum``, ``rsqrt``, ``exp``, ``softplus``): 200 us of the
seated arm's 799 us of kernels a step at batch 1 (92 and 72 of it in two reductions a layer),
the same in bf16's, for 6 layers whose states are 2 MB each. vLLM registers the rule
as an op of its own (``gdn_attention``), opaque to the compiler; ``gated_delta_rule_step`` is
that op here, so both arms' steps run the kernel a serving engine runs. Prefill keeps
transformers' call (the chunk kernels, which the prefill profile shows).
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version

import torch

RULE = "torch_recurrent_gated_delta_rule"  # the module-level name transformers' layers call


@torch.library.custom_op("flashrt_bench::gated_delta_rule_step", mutates_args=())
def gated_delta_rule_step(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the rule for ``[B, 1, H, D]`` inputs from ``state [B, H, K, V]``: the output and
    the new state (fp32), queries and keys L2-normalized in the kernel, as transformers asks."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    return fused_recurrent_gated_delta_rule(
        query, key, value, g=g, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )


@gated_delta_rule_step.register_fake
def _(query, key, value, g, beta, state):
    return torch.empty_like(value), torch.empty_like(state, dtype=torch.float32)


def _through_the_op(reference):
    """transformers' rule with its decode calls (a state to start from, the new state wanted, L2
    norm in the kernel, no packed sequences) taken by ``gated_delta_rule_step``."""

    def rule(
        query, key, value, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
        cu_seqlens=None, **kwargs,
    ):  # fmt: skip
        if initial_state is None or not output_final_state or not use_qk_l2norm_in_kernel or cu_seqlens is not None:
            return reference(
                query, key, value, g=g, beta=beta, initial_state=initial_state, output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, **kwargs,
            )  # fmt: skip
        return gated_delta_rule_step(query, key, value, g, beta, initial_state)

    rule.reference = reference
    return rule


def available() -> bool:
    return importlib.util.find_spec("fla") is not None


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]


def install(model: torch.nn.Module) -> int:
    """The decode calls of every gated-delta-rule layer's rule go through ``gated_delta_rule_step``;
    returns how many layers. None where flash-linear-attention is not installed: transformers'
    torch loops stay, as ``kernels`` says."""
    found = layers(model) if available() else []
    for module in {sys.modules[type(layer).__module__] for layer in found}:
        rule = getattr(module, RULE)
        if not hasattr(rule, "reference"):
            setattr(module, RULE, _through_the_op(rule))
    return len(found)


def uninstall(model: torch.nn.Module) -> None:
    for module in {sys.modules[type(layer).__module__] for layer in layers(model)}:
        rule = getattr(module, RULE)
        setattr(module, RULE, getattr(rule, "reference", rule))


def kernels() -> str:
    """What both arms run the rule with: the result's ``linear_attention_kernels``."""
    if not available():
        return "transformers' torch reference"
    try:
        release = version("fla-core")
    except PackageNotFoundError:
        release = "(version unknown)"
    return (
        f"flash-linear-attention {release}: decode through flashrt_bench::gated_delta_rule_step "
        "(fused recurrent), prefill through transformers (chunk)"
    )
