"""Graph rewrites that move what follows a seated projection into the projection's epilogue.

A decode step's small kernels between the projections cost a seated model more than their work:
each is a launch that waits for the projection before it and holds up the one after. On the H100
(``bench/probe_norm_bound.py``, Llama-3-8B's captured seated step at 6b079d3,
``h100-probe-norm-bound-b{1,8}-6b079d3.json``) leaving out the 32 SiLU-and-mul kernels saved
22 us of 2.12 ms at batch 1 and 76 us of 2.54 ms at batch 8.

Same probe, batch 8: the 64 residual adds and RMSNorms (inductor fuses each pair into one
kernel) cost 181 us. ``fuse_add_norm`` moves each into the projections around it: the add, the
norm's weight and each token's sums of squares into the epilogue of o or down before it, the
per-token ``rsqrt(mean + eps)`` into the epilogue of each projection it feeds, where that
factor passes through the sums (``linear_mma_gluon.AddNorm``, ``NormScale``).

The rewrites run on the graph inductor lowers (a post-grad pass, ``EpiloguePass``): the
benchmark's ``torch.compile`` and vLLM's compile pipeline both produce it, and both spell the
activation and the norm in plain torch (vLLM runs its custom ops natively under inductor by
default), which inductor decomposes differently from one torch release to the next. So the
rewrites do not match a decomposition: they take any aten chain of the right shape (from the
gate half to a product with the up half; from a projection's output and one more tensor to what
only projections read) and keep it only where running it on a probe gives ``silu``, or
``rms_norm(residual + y) * weight`` with one of the chain's constants as eps.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import operator
from pathlib import Path

import torch
import torch.nn.functional as F
from flashrt.runtime import seats  # the served ops, and which seats take their epilogues
from torch._inductor.custom_graph_pass import CustomGraphPass

log = logging.getLogger("flashrt")

_SERVED_LINEAR = torch.ops.flashrt.served_linear.default
_SERVED_LINEAR_SILU_MUL = torch.ops.flashrt.served_linear_silu_mul.default
_SERVED_LINEAR_ADD_NORM = torch.ops.flashrt.served_linear_add_norm.default
_SERVED_LINEAR_NORMED = torch.ops.flashrt.served_linear_normed.default
_CONVERT = torch.ops.prims.convert_element_type.default
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
    env = _run_chain(chain, {gate: probe})
    if env is None:
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
        if bias is not None or width % 2 or not seats.takes_epilogues(seat):
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


# Longest chain from a projection's output to the norm that feeds the next projections: the
# residual add, the norm's float32 upcast, square, mean, eps, rsqrt, product, downcast and weight
# are 9-12 nodes in the spellings of transformers and vLLM; anything longer is left alone.
MAX_NORM_CHAIN = 24
# Rows of the norm's probe: one token at each magnitude, the last two small enough that eps
# (1e-5 or 1e-6 in Llama and Qwen3) moves their scale, so the check finds which constant it is.
_NORM_PROBE_SCALES = (1.0, 0.1, 3e-3, 1e-3)


def _above(node: torch.fx.Node, depth: int) -> tuple[set[torch.fx.Node], list[torch.fx.Node]]:
    """What ``node`` (itself included) is computed from through aten and prims ops, up to
    ``depth`` of them back, and the seated projections met there, nearest first: where a norm's
    chain may start. Bounded by depth, not by count: a residual stream runs back through every
    layer's adds."""
    seen, projections, frontier = {node}, [], [node]
    for _ in range(depth):
        step = []
        for n in frontier:
            for a in n.all_input_nodes:
                if a in seen:
                    continue
                seen.add(a)
                if a.op == "call_function" and a.target is _SERVED_LINEAR:
                    projections.append(a)
                elif a.op == "call_function" and _elementwise_candidate(a):
                    step.append(a)
        frontier = step
    inside = {n for n in seen if n is node or (n.op == "call_function" and _elementwise_candidate(n))}
    return inside, projections


def _reachable(node: torch.fx.Node, within: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """The nodes of ``within`` that ``node`` flows into."""
    seen, stack = set(), [node]
    while stack:
        for user in stack.pop().users:
            if user in within and user not in seen:
                seen.add(user)
                stack.append(user)
    return seen


def _source(node: torch.fx.Node) -> torch.fx.Node:
    """A dtype conversion's input (the add reads the residual and the weight upcast, the op
    takes them as they are), else the node."""
    return node.args[0] if node.target is _CONVERT and isinstance(node.args[0], torch.fx.Node) else node


def _val(node: torch.fx.Node):
    return node.meta.get("val")


def _shape(node: torch.fx.Node) -> list[str] | None:
    """A node's shape as text: symbolic sizes compared by name, with no guard added."""
    val = _val(node)
    return None if val is None else [str(d) for d in val.shape]


def _norm_probe(y_val, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A projection output, a residual and a norm weight to run a chain on: rows at the
    ``_NORM_PROBE_SCALES`` magnitudes, in the graph's rank and dtype."""
    gen = torch.Generator().manual_seed(0)
    shape = (len(_NORM_PROBE_SCALES), *([1] * (y_val.dim() - 2)), n)
    scales = torch.tensor(_NORM_PROBE_SCALES).view(-1, *([1] * (len(shape) - 1)))
    y = (torch.randn(shape, generator=gen) * scales).to(y_val.dtype)
    residual = (torch.randn(shape, generator=gen) * scales).to(y_val.dtype)
    weight = (torch.rand(n, generator=gen) + 0.5).to(y_val.dtype)
    return y, residual, weight


def _run_chain(chain: list[torch.fx.Node], env: dict) -> dict | None:
    """``env`` with every node of ``chain`` (graph order) run on it; None where one cannot run."""
    env = dict(env)

    def load(a):
        return torch.fx.node.map_arg(a, lambda node: env[node])

    try:
        for node in chain:
            env[node] = node.target(*load(node.args), **load(node.kwargs))
    except Exception:
        return None
    return env


def _norm_eps(chain, env, normed, stream, weight) -> float | None:
    """The eps with which ``env[normed]`` is ``rms_norm(stream) * weight`` (each float constant of
    the chain tried), or None where none is: then the chain is not that norm."""
    out = env.get(normed)
    if not isinstance(out, torch.Tensor) or out.shape != stream.shape:
        return None
    constants = {a for node in chain for a in node.args if isinstance(a, float) and 0 < a < 1e-2}
    s = stream.float()
    for eps in sorted(constants):
        expected = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + eps) * weight.float()
        if torch.allclose(out.float(), expected, rtol=2e-2, atol=1e-2 * float(expected.abs().max())):
            return eps
    return None


def _match_add_norm(normed: torch.fx.Node, consumers: list[torch.fx.Node]):
    """The seated projection, residual, norm weight, eps and residual-stream outputs of an
    RMSNorm after a residual add whose output ``normed`` only seated projections read, or None.

    The chain is what ``normed`` is computed from among what a seated projection ``y`` (no other
    reader) flows into through aten and prims ops; besides ``y`` it may read one tensor shaped as
    ``y`` (the residual) and one ``[N]`` (the weight), each perhaps upcast. What leaves the chain
    is the residual stream, ``residual + y`` as the chain's add computes it or its downcast to
    ``y``'s dtype: what the fused op's first output replaces. The chain is run on a probe to check
    that it is exactly that norm (``_norm_eps``)."""
    if any(user not in consumers or not seats.takes_epilogues(user.args[-2]) for user in normed.users):
        return None
    above, projections = _above(normed, MAX_NORM_CHAIN)
    for producer in projections:
        if not seats.takes_epilogues(producer.args[2]):
            continue
        chain = _reachable(producer, above)
        if normed not in chain or any(user not in chain for user in producer.users) or len(chain) > MAX_NORM_CHAIN:
            continue
        leaves = {a for node in chain for a in node.all_input_nodes if a not in chain and a is not producer}
        y_val = _val(producer)
        n = producer.args[3]
        if y_val is None or len(leaves) != 2 or n % 16:  # sums of squares in groups of up to 16 features
            continue
        by_rank = sorted(leaves, key=lambda a: _val(a).dim() if _val(a) is not None else -1)
        weight_leaf, residual_leaf = by_rank
        if (
            _val(weight_leaf) is None
            or tuple(_val(weight_leaf).shape) != (n,)
            or _shape(residual_leaf) != _shape(producer)
            or _val(normed) is None
            or _val(normed).dtype != y_val.dtype
        ):
            continue
        y, residual, weight = _norm_probe(y_val, n)
        env = {
            producer: y,
            residual_leaf: residual.to(_val(residual_leaf).dtype),
            weight_leaf: weight.to(_val(weight_leaf).dtype),
        }
        ordered = [node for node in normed.graph.nodes if node in chain]
        ran = _run_chain(ordered, env)
        if ran is None:
            continue
        stream = (y.float() + residual.float()).to(y.dtype)
        eps = _norm_eps(ordered, ran, normed, stream, weight)
        if eps is None:
            continue
        outputs = [node for node in ordered if any(user not in chain for user in node.users) and node is not normed]
        if all(_is_stream(node, ran[node], stream, chain) for node in outputs):
            return producer, _source(residual_leaf), _source(weight_leaf), eps, ordered, outputs
    return None


def _is_stream(node: torch.fx.Node, value, stream: torch.Tensor, chain: set[torch.fx.Node]) -> bool:
    """Whether a chain node read outside the chain is the residual stream (its probe value is
    ``stream``'s) and each outside reader can take the fused op's, in ``stream``'s dtype: as it
    is, or through a downcast to that dtype, which it replaces."""
    if not isinstance(value, torch.Tensor) or not torch.allclose(value.float(), stream.float(), rtol=1e-2, atol=1e-2):
        return False
    for user in node.users:
        if user in chain:
            continue
        if not (value.dtype == stream.dtype or (user.target is _CONVERT and user.args[1] == stream.dtype)):
            return False
    return True


def _with_val(node: torch.fx.Node) -> torch.fx.Node:
    """``node`` with its fake value (``meta["val"]``) from its inputs', as inductor's own nodes have."""
    from torch._guards import detect_fake_mode

    args = torch.fx.node.map_arg(node.args, _val)
    if node.target is operator.getitem:
        node.meta["val"] = args[0][args[1]]
        return node
    mode = detect_fake_mode([a for a in torch.utils._pytree.tree_leaves(args) if isinstance(a, torch.Tensor)])
    with mode if mode is not None else contextlib.nullcontext():
        node.meta["val"] = node.target(*args)
    return node


def fuse_add_norm(graph: torch.fx.Graph) -> int:
    """Rewrite each residual add and RMSNorm between a seated projection with no other reader
    (o, down: ``flashrt::served_linear``) and the seated projections that alone read the norm
    (qkv, gate_up, possibly already with its SiLU-and-mul, the LM head): the first becomes
    ``flashrt::served_linear_add_norm`` (the add, the norm's weight and its sums of squares in
    its epilogue), the others ``flashrt::served_linear_normed`` (the norm's per-token scale in
    theirs). Returns how many norms were rewritten."""
    readers: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        projection = node.op == "call_function" and node.target in (_SERVED_LINEAR, _SERVED_LINEAR_SILU_MUL)
        if projection and isinstance(node.args[0], torch.fx.Node):
            readers.setdefault(node.args[0], []).append(node)
    fused = 0
    for normed, consumers in readers.items():
        match = _match_add_norm(normed, consumers)
        if match is None:
            continue
        producer, residual, weight, eps, chain, outputs = match
        order = {node: i for i, node in enumerate(graph.nodes)}
        last_input = max((producer, residual, weight), key=lambda node: order[node])
        x, bias, seat, width = producer.args
        with graph.inserting_after(last_input):
            fused_node = _with_val(
                graph.call_function(_SERVED_LINEAR_ADD_NORM, (x, bias, residual, weight, seat, width))
            )
        with graph.inserting_after(fused_node):
            stream, weighted, sumsq = (
                _with_val(graph.call_function(operator.getitem, (fused_node, i))) for i in range(3)
            )
        for output in outputs:
            for user in list(output.users):
                if user in chain:
                    continue
                if _val(output).dtype == _val(stream).dtype:
                    user.replace_input_with(output, stream)
                else:  # a downcast of the float32 stream (``_is_stream``)
                    user.replace_all_uses_with(stream)
                    graph.erase_node(user)
        for consumer in consumers:
            silu_mul = consumer.target is _SERVED_LINEAR_SILU_MUL
            cbias = None if silu_mul else consumer.args[1]
            cseat, cwidth = consumer.args[-2], consumer.args[-1]
            with graph.inserting_before(consumer):
                node = graph.call_function(
                    _SERVED_LINEAR_NORMED, (weighted, sumsq, eps, cbias, cseat, cwidth, silu_mul)
                )
            _with_val(node)  # not the projection's meta: its recorded inputs are another op's
            consumer.replace_all_uses_with(node)
            graph.erase_node(consumer)
        for dead in reversed([n for n in graph.nodes if n in set(chain) | {producer}]):
            if not dead.users:
                graph.erase_node(dead)
        fused += 1
    if fused:
        log.info("flashrt: %d residual adds and RMSNorms fused into the epilogues of seated projections", fused)
    return fused


def fuse_epilogues(graph: torch.fx.Graph, silu_mul: bool = True, add_norm: bool = True) -> dict[str, int]:
    """Every rewrite of this module, the SiLU-and-mul first (a gate-and-up projection fed by a
    norm takes both); how many of each."""
    return {
        "silu_mul": fuse_silu_mul(graph) if silu_mul else 0,
        "add_norm": fuse_add_norm(graph) if add_norm else 0,
    }


class EpiloguePass(CustomGraphPass):
    """``fuse_epilogues`` as inductor's post-grad pass (``post_grad_custom_post_pass``), keyed by
    this file's bytes and the rewrites it makes, so that inductor's graph cache tells a graph
    rewritten by one version or choice of the pass from another's."""

    def __init__(self, silu_mul: bool = True, add_norm: bool = True):
        self.silu_mul, self.add_norm = silu_mul, add_norm

    def __call__(self, graph: torch.fx.Graph) -> None:
        fuse_epilogues(graph, self.silu_mul, self.add_norm)

    def uuid(self) -> str:
        digest = hashlib.sha256(Path(__file__).read_bytes())
        digest.update(f"silu_mul={self.silu_mul},add_norm={self.add_norm}".encode())
        return digest.hexdigest()
