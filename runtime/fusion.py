"""Graph rewrites that move what follows a seated projection into the projection's epilogue.

A decode step's small kernels between the projections cost a seated model more than their work:
each is a launch that waits for the projection before it and holds up the one after. On the H100
(``bench/probe_norm_bound.py``, Llama-3-8B's captured seated step at 6b079d3,
``h100-probe-norm-bound-b{1,8}-6b079d3.json``) leaving out the 32 SiLU-and-mul kernels saved
22 us of 2.12 ms at batch 1 and 76 us of 2.54 ms at batch 8.

``fuse_silu_mul`` runs on the graph inductor lowers (a post-grad pass, ``SiluMulPass``): the
benchmark's ``torch.compile`` and vLLM's compile pipeline both produce it, and both spell the
activation in plain torch (vLLM runs its custom ops natively under inductor by default), which
inductor decomposes differently from one torch release to the next. So the rewrite does not
match the decomposition: it takes any elementwise chain from the gate half to a product with
the up half, and keeps it only where the chain computes ``silu`` (run on a probe tensor).
"""

from __future__ import annotations

import hashlib
import logging
import operator
from pathlib import Path

import torch
import torch.nn.functional as F
from flashrt.runtime import seats  # noqa: F401 (registers the served ops)
from torch._inductor.custom_graph_pass import CustomGraphPass

log = logging.getLogger("flashrt")

_SERVED_LINEAR = torch.ops.flashrt.served_linear.default
_SERVED_LINEAR_SILU_MUL = torch.ops.flashrt.served_linear_silu_mul.default
_SLICE = torch.ops.aten.slice.Tensor
_SPLIT = (torch.ops.aten.split_with_sizes.default, torch.ops.aten.split.Tensor)
_MUL = torch.ops.aten.mul.Tensor
# Where the check runs the chain: across SiLU's bend and tails, in the gate's dtype.
_PROBE = torch.linspace(-12.0, 12.0, 97)
# Longest chain from the gate to its SiLU: inductor's decomposition is 6 nodes (to float32, neg,
# exp, add, div, back), and a chain any longer is not an activation this pass knows.
MAX_CHAIN = 12


def _last_dim(node: torch.fx.Node, dim) -> bool:
    val = node.meta.get("val")
    return dim == -1 or (val is not None and dim == val.dim() - 1)


def _half(node: torch.fx.Node, source: torch.fx.Node, width: int) -> int | None:
    """0 or 1 where ``node`` is the first or second half of ``source``'s last dimension (``width``
    wide), through ``split``/``split_with_sizes`` and ``getitem`` or through a ``slice``."""
    if node.op != "call_function":
        return None
    half = width // 2
    if node.target is operator.getitem:
        split, index = node.args
        if not (isinstance(split, torch.fx.Node) and split.target in _SPLIT and split.args[0] is source):
            return None
        sizes, dim = split.args[1], split.args[2] if len(split.args) > 2 else 0
        if sizes not in ([half, half], half) or not _last_dim(source, dim):
            return None
        return index if index in (0, 1) else None
    if node.target is _SLICE and node.args[0] is source:
        dim, start, end = [*node.args[1:4], 0, None, None][:3]
        step = node.args[4] if len(node.args) > 4 else 1
        if step != 1 or not _last_dim(source, dim):
            return None
        if start in (0, None) and end == half:
            return 0
        if start == half and (end is None or end >= width):
            return 1
    return None


def _elementwise_candidate(node: torch.fx.Node) -> bool:
    """An aten or prims op: what the check may run at compile time. A custom op, a collective
    (``_c10d_functional``) or a Python function is never run, so never part of a chain."""
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target.namespace in ("aten", "prims")


def _chain(top: torch.fx.Node, gate: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes ``top`` is computed from, back to ``gate``, in graph order, or None where any
    of them reads something else (a placeholder, another tensor), is not an aten or prims op,
    or the chain is too long."""
    seen, stack = {}, [top]
    while stack:
        node = stack.pop()
        if node is gate or node in seen:
            continue
        if node.op != "call_function" or not _elementwise_candidate(node) or len(seen) >= MAX_CHAIN:
            return None
        seen[node] = None
        for arg in node.all_input_nodes:
            stack.append(arg)
    return [n for n in top.graph.nodes if n in seen]


def _computes_silu(chain: list[torch.fx.Node], gate: torch.fx.Node) -> bool:
    """Whether ``chain`` applied to ``gate`` is ``silu`` to the gate dtype's precision."""
    val = gate.meta.get("val")
    dtype = val.dtype if val is not None else torch.bfloat16
    probe = _PROBE.to(dtype)
    env = {gate: probe}

    def load(a):
        return torch.fx.node.map_arg(a, lambda n: env[n])

    try:
        for node in chain:
            env[node] = node.target(*load(node.args), **load(node.kwargs))
    except Exception:
        return False
    out = env[chain[-1]]
    if not isinstance(out, torch.Tensor) or out.shape != probe.shape:
        return False
    return torch.allclose(out.float(), F.silu(probe.float()), rtol=2e-2, atol=1e-3)


def fuse_silu_mul(graph: torch.fx.Graph) -> int:
    """Rewrite each ``silu(y[..., :d]) * y[..., d:]`` of a seated projection ``y`` with no bias
    (``flashrt::served_linear``) into one ``flashrt::served_linear_silu_mul``, where nothing else
    reads ``y`` or its halves; returns how many were rewritten."""
    fused = 0
    for linear in [n for n in graph.nodes if n.op == "call_function" and n.target is _SERVED_LINEAR]:
        x, bias, seat, width = linear.args
        if bias is not None or width % 2:
            continue
        halves = {}
        for user in linear.users:
            for node in [user] + (list(user.users) if user.target in _SPLIT else []):
                index = _half(node, linear, width)
                if index is not None:
                    halves.setdefault(index, node)
        if set(halves) != {0, 1}:
            continue
        gate, up = halves[0], halves[1]
        products = [m for m in up.users if m.target is _MUL and len(m.args) == 2 and up in m.args]
        for product in products:
            other = product.args[0] if product.args[1] is up else product.args[1]
            if not isinstance(other, torch.fx.Node):
                continue
            chain = _chain(other, gate)
            if chain is None or not _computes_silu(chain, gate):
                continue
            splits = {n.args[0] for n in (gate, up) if n.target is operator.getitem}
            inside = {linear, gate, up, product, *chain, *splits}
            if any(user not in inside for node in inside - {product} for user in node.users):
                continue
            with graph.inserting_before(product):
                node = graph.call_function(_SERVED_LINEAR_SILU_MUL, (x, seat, width // 2))
            node.meta.update(product.meta)
            product.replace_all_uses_with(node)
            for dead in reversed([n for n in graph.nodes if n in inside]):
                if not dead.users:
                    graph.erase_node(dead)
            fused += 1
            break
    if fused:
        log.info("flashrt: %d SiLU-and-mul fused into the epilogue of seated gate-and-up projections", fused)
    return fused


class SiluMulPass(CustomGraphPass):
    """``fuse_silu_mul`` as inductor's post-grad pass (``post_grad_custom_post_pass``), keyed by
    this file's bytes so that inductor's graph cache tells a graph rewritten by one version of
    the pass from another's."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        fuse_silu_mul(graph)

    def uuid(self) -> str:
        return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
