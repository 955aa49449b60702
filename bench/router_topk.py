"""The MoE router as a serving engine runs it, for both arms of ``bench.e2e``: its logits GEMM
and its softmax and top-k, one launch each.

transformers routes with ``F.linear``, ``softmax``, ``torch.topk`` and a renormalizing divide.
Under ``torch.compile`` the top-k stays two aten kernels (``gatherTopK`` and
``bitonicSortKVInPlace``): on the H200 they took 0.44 ms of a 3.3 ms Qwen3-30B-A3B decode step at
batch 1 (9a6de5f, ``bench/results/h200-e2e-qwen3-ringdown-b1.json``) and 0.57 ms of 8.4 at batch
16 (eabb2d0, ``h200-e2e-qwen3-gqa-b8b16.json``), in both arms. vLLM routes with one fused kernel
(``topk_softmax``); ``router_topk`` is that kernel for the benchmark, where vLLM is not
installed: one program a token, its expert logits in registers, ``TOP_K`` rounds of max and
argmax.

The logits GEMM is tiny (Qwen3-30B-A3B: 128 experts x 2048, 512 KB) and cuBLAS runs it on two
64-row tiles: 5.0 us a layer at batch 1 on the H200 (``nvjet_sm90_tst_64x8_64x16_2x1``, 0d80628,
``h200-e2e-qwen3-0d80628-pdl-b1.json``), 241 us of each arm's 2.3-4.0 ms step. vLLM's
``GateLinear`` (0.32) runs its own low-latency bf16 GEMM there on sm_90 and newer up to 16
tokens (``LL_BF16_MAX_TOKENS``) and cuBLAS past them; ``router_logits`` stands in for it the
same way: a program a token and ``EXPERTS_A_PROGRAM`` experts, their whole rows loaded at once,
so a 128-expert router at one token is 64 programs each reading 8 KB (the tokens' programs read
the same rows, from L2 but for the first).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from flashrt.kernels.decode import cdiv, launch_pdl, next_power_of_2, wait_then_let_next_start

# As vLLM's GateLinear: its own GEMM up to 16 tokens, cuBLAS past them.
LOGITS_MAX_TOKENS = 16
EXPERTS_A_PROGRAM = 2
# Where on (``decode.launch_pdl``: ``None`` follows torch.compile), both kernels are launched with
# PDL: each waits for the kernel before it, then lets the next one start, as the decode
# attention's do. In Qwen3-30B's seated step at batch 1 the two waited 0.45 us each for their
# launch, between PDL launches (afb0251), and a graph pays for each change between PDL and plain
# launches (``bench/probe_launch_gaps.py``: 0.61 us a launch all with PDL, 1.10 alternating).
# Each e2e arm sets it as it runs faster (``e2e.PDL_ARMS``); plain by default.
PDL_LAUNCH: bool | None = False


@triton.jit
def router_logits_kernel(
    x_ptr,
    weight_ptr,
    out_ptr,
    E,
    K,
    stride_xm,
    stride_we,
    stride_om,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """``out[m, e] = x[m] . weight[e]`` for token ``m`` (program axis 1) and the program's
    ``BLOCK_E`` experts, whole rows (``BLOCK_K >= K``), summed in fp32."""
    wait_then_let_next_start(PDL)
    experts = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    m = tl.program_id(1)
    k = tl.arange(0, BLOCK_K)
    mask = (experts[:, None] < E) & (k[None, :] < K)
    rows = tl.load(weight_ptr + experts[:, None] * stride_we + k[None, :], mask=mask, other=0.0)
    x = tl.load(x_ptr + m * stride_xm + k, mask=k < K, other=0.0)
    logits = tl.sum(rows.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.store(out_ptr + m * stride_om + experts, logits.to(out_ptr.dtype.element_ty), mask=experts < E)


@torch.library.custom_op("flashrt_bench::router_logits", mutates_args=())
def router_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` for a router: ``x [T, K]``, ``weight [E, K]``, both contiguous
    rows, ``[T, E]`` in x's dtype."""
    tokens, k = x.shape
    experts = weight.shape[0]
    out = torch.empty(tokens, experts, dtype=x.dtype, device=x.device)
    if tokens:
        block_k = next_power_of_2(k)
        pdl = launch_pdl(PDL_LAUNCH)
        router_logits_kernel[(cdiv(experts, EXPERTS_A_PROGRAM), tokens)](
            x,
            weight,
            out,
            experts,
            k,
            x.stride(0),
            weight.stride(0),
            out.stride(0),
            BLOCK_E=EXPERTS_A_PROGRAM,
            BLOCK_K=block_k,
            PDL=pdl,
            num_warps=min(16, max(4, block_k // 512)),  # 16 fp32 weights a thread
            launch_pdl=pdl,
        )
    return out


@router_logits.register_fake
def _(x, weight):
    return x.new_empty(x.shape[0], weight.shape[0])


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
    PDL: tl.constexpr,
):
    """``weights[t], ids[t]``: token t's ``TOP_K`` largest softmax probabilities over its E
    logits, largest first (ties to the lower expert), divided by their sum when
    ``RENORMALIZE``."""
    wait_then_let_next_start(PDL)
    token = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    logits = tl.load(logits_ptr + token * stride_lm + experts, mask=experts < E, other=float("-inf"))
    logits = logits.to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, axis=0))
    probs = probs / tl.sum(probs, axis=0)
    # A NaN or infinite logit (a model broken upstream) makes every probability NaN, which no
    # comparison picks: the expert would be E_POW2, past the bank, whose kernels would read out
    # of bounds and fault. NaN counts as -1, below every probability: still TOP_K experts.
    probs = tl.where(probs == probs, probs, -1.0)
    slots = tl.arange(0, TOP_K_POW2)
    top = tl.zeros([TOP_K_POW2], dtype=tl.float32)
    ids = tl.zeros([TOP_K_POW2], dtype=tl.int32)
    for slot in tl.static_range(TOP_K):
        best = tl.max(probs, axis=0)
        expert = tl.min(tl.where(probs == best, experts, E_POW2), axis=0)
        top = tl.where(slots == slot, best, top)
        ids = tl.where(slots == slot, expert, ids)
        probs = tl.where(experts == expert, -2.0, probs)  # taken: below every probability and NaN's -1
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
        pdl = launch_pdl(PDL_LAUNCH)
        router_topk_kernel[(tokens,)](
            logits,
            weights,
            ids,
            experts,
            logits.stride(0),
            TOP_K=top_k,
            TOP_K_POW2=next_power_of_2(top_k),
            E_POW2=next_power_of_2(experts),
            RENORMALIZE=renormalize,
            PDL=pdl,
            num_warps=1,
            launch_pdl=pdl,
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
    ``router_logits`` (up to ``LOGITS_MAX_TOKENS``) and ``router_topk``."""

    def __init__(self, router: torch.nn.Module):
        super().__init__()
        self.weight, self.top_k = router.weight, router.top_k
        self.renormalize = bool(ROUTERS[type(router).__name__](router))

    def forward(self, hidden_states: torch.Tensor):
        x = hidden_states.reshape(-1, self.weight.shape[1])
        if x.shape[0] <= LOGITS_MAX_TOKENS:
            logits = router_logits(x.contiguous(), self.weight.contiguous())
        else:
            logits = torch.nn.functional.linear(x, self.weight)
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
