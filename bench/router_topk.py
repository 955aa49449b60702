"""The MoE router's softmax and top-k in one launch, for both arms of ``bench.e2e``.

transformers routes with ``softmax``, ``torch.topk`` and a renormalizing divide, and under
``torch.compile`` the top-k stays two aten kernels (``gatherTopK`` and ``bitonicSortKVInPlace``).
On the H200 those took 0.44 ms of a 3.3 ms Qwen3-30B-A3B decode step at batch 1 (9a6de5f,
``bench/results/h200-e2e-qwen3-ringdown-b1.json``) and 0.57 ms of 8.4 at batch 16 (eabb2d0,
``h200-e2e-qwen3-gqa-b8b16.json``), in both arms. A serving engine routes with one fused kernel
(vLLM's ``topk_softmax``); this is that kernel for the benchmark, where vLLM is not installed:
one program a token, its expert logits in registers, ``TOP_K`` rounds of max and argmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def router_topk_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    E,
    stride_lm,
    TOP_K: tl.constexpr,
    TOP_K_POW2: tl.constexpr,
    E_POW2: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    """``weights[t], ids[t]``: token t's ``TOP_K`` largest softmax probabilities over its E
    logits, largest first (ties to the lower expert), divided by their sum when
    ``RENORMALIZE``."""
    token = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    logits = tl.load(logits_ptr + token * stride_lm + experts, mask=experts < E, other=float("-inf"))
    logits = logits.to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, axis=0))
    probs = probs / tl.sum(probs, axis=0)
    slots = tl.arange(0, TOP_K_POW2)
    top = tl.zeros([TOP_K_POW2], dtype=tl.float32)
    ids = tl.zeros([TOP_K_POW2], dtype=tl.int32)
    for slot in tl.static_range(TOP_K):
        best = tl.max(probs, axis=0)
        expert = tl.min(tl.where(probs == best, experts, E_POW2), axis=0)
        top = tl.where(slots == slot, best, top)
        ids = tl.where(slots == slot, expert, ids)
        probs = tl.where(experts == expert, -1.0, probs)  # taken; probabilities are >= 0
    if RENORMALIZE:
        top = top / tl.sum(top, axis=0)  # the slots past TOP_K hold 0
    out = token * TOP_K + slots
    tl.store(weights_ptr + out, top.to(weights_ptr.dtype.element_ty), mask=slots < TOP_K)
    tl.store(ids_ptr + out, ids.to(tl.int64), mask=slots < TOP_K)


@torch.library.custom_op("flashrt_bench::router_topk", mutates_args=())
def router_topk(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, top_k] in the logits' dtype, ids [T, top_k] int64)``, as transformers'
    routers return them."""
    tokens, experts = logits.shape
    weights = torch.empty(tokens, top_k, dtype=logits.dtype, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    if tokens:
        router_topk_kernel[(tokens,)](
            logits,
            weights,
            ids,
            experts,
            logits.stride(0),
            TOP_K=top_k,
            TOP_K_POW2=triton.next_power_of_2(top_k),
            E_POW2=triton.next_power_of_2(experts),
            RENORMALIZE=renormalize,
            num_warps=1,
        )
    return weights, ids


@router_topk.register_fake
def _(logits, top_k, renormalize):
    tokens = logits.shape[0]
    return logits.new_empty(tokens, top_k), logits.new_empty(tokens, top_k, dtype=torch.int64)


def reference(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' Qwen3-MoE routing, in plain torch."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(logits.dtype), ids


# The routers whose forward is exactly ``reference`` on ``F.linear(x, weight)``, and whether
# each renormalizes (Qwen3.5's always does; Qwen3's as its config says).
ROUTERS = {
    "Qwen3MoeTopKRouter": lambda router: router.norm_topk_prob,
    "Qwen3_5MoeTopKRouter": lambda router: True,
}


class FusedTopKRouter(torch.nn.Module):
    """A transformers top-k router (same weight, same outputs) that routes through
    ``router_topk``."""

    def __init__(self, router: torch.nn.Module):
        super().__init__()
        self.weight, self.top_k = router.weight, router.top_k
        self.renormalize = bool(ROUTERS[type(router).__name__](router))

    def forward(self, hidden_states: torch.Tensor):
        logits = torch.nn.functional.linear(hidden_states.reshape(-1, self.weight.shape[1]), self.weight)
        weights, ids = router_topk(logits, self.top_k, self.renormalize)
        return logits, weights, ids


def install(model: torch.nn.Module) -> int:
    """Every router ``ROUTERS`` knows becomes a ``FusedTopKRouter``; returns how many."""
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child).__name__ in ROUTERS
    ]
    for parent, name, child in found:
        setattr(parent, name, FusedTopKRouter(child))
    return len(found)
