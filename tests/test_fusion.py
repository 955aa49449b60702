"""The SiLU-and-mul rewrite (``flashrt.runtime.fusion``) on graphs inductor really lowers, on the CPU."""

import pytest
import torch
import torch.nn.functional as F
import transformers
from flashrt.bench.e2e import merge_projections
from flashrt.kernels import ops
from flashrt.runtime import SeatProfile, attach, fusion
from torch._inductor import config as inductor
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

HIDDEN, INTER = 64, 96


@torch.library.custom_op("fusion_test::silu", mutates_args=())
def opaque_silu(x: torch.Tensor) -> torch.Tensor:
    """``silu`` behind a custom op: what the pass must not run at compile time to find out."""
    return F.silu(x)


@opaque_silu.register_fake
def _(x):
    return torch.empty_like(x)


class _Rewrites:
    """The pass as inductor runs it, counting what it rewrote and which ops the graph kept."""

    def __init__(self):
        self.fused, self.norms, self.targets = [], [], []

    def __call__(self, graph: torch.fx.Graph) -> None:
        counts = fusion.fuse_epilogues(graph)
        self.fused.append(counts["silu_mul"])
        self.norms.append(counts["add_norm"])
        self.targets += [str(n.target) for n in graph.nodes if n.op == "call_function"]

    def uuid(self):  # inductor's graph cache keys a custom pass by this
        return f"test-{id(self)}"


class TransformersMLP(torch.nn.Module):
    """transformers' Llama MLP, gate and up merged as vLLM serves them (``merge_projections``):
    ``act_fn(gate(x)) * up(x)`` over one GEMM's ``split``."""

    def __init__(self):
        super().__init__()
        self.mlp = LlamaMLP(transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, hidden_act="silu"))

    def forward(self, x):
        return self.mlp(x)


class VllmMLP(torch.nn.Module):
    """vLLM's ``SiluAndMul.forward_native`` (its custom ops are off under inductor) after a
    merged gate-and-up projection: ``silu(y[..., :d]) * y[..., d:]`` over slices."""

    def __init__(self, activation=F.silu, bias=False, keep=False):
        super().__init__()
        self.gate_up_proj = torch.nn.Linear(HIDDEN, 2 * INTER, bias=bias)
        self.down_proj = torch.nn.Linear(INTER, HIDDEN, bias=False)
        self.activation, self.keep = activation, keep

    def forward(self, x):
        y = self.gate_up_proj(x)
        d = y.shape[-1] // 2
        out = self.down_proj(self.activation(y[..., :d]) * y[..., d:])
        return out + y[..., :HIDDEN] if self.keep else out


def _seated(model: torch.nn.Module, seams: int = 2, **profile):
    torch.manual_seed(0)
    model = model.to(torch.bfloat16)
    merge_projections(model)
    handle = attach(model, SeatProfile(min_params=0, **profile))
    assert handle.summary()["seams"] == seams
    return model, handle


def _compiled(model) -> tuple[_Rewrites, torch.Tensor, torch.Tensor]:
    rewrites = _Rewrites()
    torch._dynamo.reset()
    x = torch.randn(5, HIDDEN, dtype=torch.bfloat16)
    with torch.no_grad(), inductor.patch(post_grad_custom_post_pass=rewrites):
        compiled = torch.compile(model, fullgraph=True)(x)
        eager = model(x)
    return rewrites, compiled, eager


@pytest.mark.parametrize("make", [TransformersMLP, VllmMLP])
def test_a_seated_gate_up_takes_the_silu_and_mul_after_it_in_both_spellings(make):
    """transformers' ``split`` and vLLM's slices, each through inductor's own decomposition of
    ``silu``: one ``served_linear_silu_mul`` in place of the projection and the activation,
    counted as the seat's calls, and the figures the unfused model computes."""
    model, handle = _seated(make())
    rewrites, compiled, eager = _compiled(model)
    assert rewrites.fused == [1]
    assert rewrites.targets.count("flashrt.served_linear_silu_mul.default") == 1
    assert rewrites.targets.count("flashrt.served_linear.default") == 1, "only the down projection left"
    assert not any("exp" in t or "sigmoid" in t or "silu" in t for t in rewrites.targets if "flashrt" not in t)
    torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=2e-3)
    assert {s.name: s.calls for s in handle.seats}[next(s.name for s in handle.seats if "gate_up" in s.name)] == 2


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (VllmMLP(activation=F.gelu), "gelu is not silu"),
        (VllmMLP(activation=lambda g: F.silu(g) * 2), "silu times two"),
        (VllmMLP(bias=True), "a bias, which the epilogue does not add"),
        (VllmMLP(keep=True), "the projection's output is read besides"),
        (VllmMLP(activation=opaque_silu), "a custom op, which the check never runs"),
    ],
)
def test_anything_but_a_bias_free_silu_and_mul_of_the_whole_output_is_left_alone(model, why):
    model, _ = _seated(model)
    rewrites, compiled, eager = _compiled(model)
    assert rewrites.fused == [0], why
    assert "flashrt.served_linear_silu_mul.default" not in rewrites.targets
    torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=2e-3)


def test_the_pass_is_keyed_by_its_source_and_rewrites_for_inductor_s_graph_cache():
    key = fusion.EpiloguePass().uuid()
    assert len(key) == 64 and key == fusion.EpiloguePass().uuid()
    assert len({key, fusion.EpiloguePass(add_norm=False).uuid(), fusion.EpiloguePass(silu_mul=False).uuid()}) == 3


# -- the residual add and RMSNorm ------------------------------------------------------------------


class TransformersBlock(torch.nn.Module):
    """What lies between a Llama layer's attention and the next layer's, as transformers spells
    it: o, the residual add in bf16, ``LlamaRMSNorm`` (float32 inside, the weight times its
    downcast), the MLP with gate and up merged, and the add after it."""

    def __init__(self, eps=1e-6, norm=None, keep_norm=False):
        super().__init__()
        config = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, hidden_act="silu")
        self.o_proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.post_attention_layernorm = norm or LlamaRMSNorm(HIDDEN, eps=eps)
        self.mlp = LlamaMLP(config)
        self.keep_norm = keep_norm
        with torch.no_grad():
            self.post_attention_layernorm.weight.uniform_(0.5, 1.5)

    def forward(self, x, residual):
        h = residual + self.o_proj(x)
        normed = self.post_attention_layernorm(h)
        out = h + self.mlp(normed)
        return out + normed if self.keep_norm else out


class VllmBlock(torch.nn.Module):
    """The same as vLLM's native ``fused_add_rms_norm`` spells it: the add in float32, the
    residual stream its downcast, the norm on the float32 sum, the weight after the downcast."""

    def __init__(self, eps=1e-5):
        super().__init__()
        self.o_proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.weight = torch.nn.Parameter(torch.rand(HIDDEN) + 0.5)
        self.gate_up_proj = torch.nn.Linear(HIDDEN, 2 * INTER, bias=False)
        self.down_proj = torch.nn.Linear(INTER, HIDDEN, bias=False)
        self.eps = eps

    def forward(self, x, residual):
        s = self.o_proj(x).float() + residual.float()
        stream = s.to(x.dtype)
        normed = (s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight
        y = self.gate_up_proj(normed)
        return stream + self.down_proj(F.silu(y[..., :INTER]) * y[..., INTER:])


class LayerNorm(torch.nn.LayerNorm):
    """A mean-subtracting norm where an RMSNorm would be: not what the epilogue computes."""

    def __init__(self, hidden, eps):
        super().__init__(hidden, eps=eps, bias=False)


def _compiled_block(model) -> tuple[_Rewrites, torch.Tensor, torch.Tensor]:
    rewrites = _Rewrites()
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, HIDDEN, generator=gen).to(torch.bfloat16)
    residual = (torch.randn(5, HIDDEN, generator=gen) * 4).to(torch.bfloat16)
    with torch.no_grad(), inductor.patch(post_grad_custom_post_pass=rewrites):
        compiled = torch.compile(model, fullgraph=True)(x, residual)
        eager = model(x, residual)
    return rewrites, compiled, eager


@pytest.mark.parametrize("make", [TransformersBlock, VllmBlock])
def test_the_add_and_norm_move_into_the_projections_around_them_in_both_spellings(make):
    """transformers' and vLLM's spellings, through inductor's decompositions: o becomes one
    ``served_linear_add_norm`` (the add, the norm's weight and sums of squares in its epilogue),
    gate_up one ``served_linear_normed`` with its SiLU-and-mul (the norm's scale in its
    epilogue), the residual stream the fused op's; no square root or mean left outside the ops;
    counted as the seats' calls; the figures the unfused model computes."""
    model, handle = _seated(make(), seams=3)
    rewrites, compiled, eager = _compiled_block(model)
    assert rewrites.fused == [1] and rewrites.norms == [1]
    for target, count in (("served_linear_add_norm", 1), ("served_linear_normed", 1), ("served_linear", 1)):
        assert rewrites.targets.count(f"flashrt.{target}.default") == count, target
    assert not any("rsqrt" in t or "mean" in t or "pow" in t for t in rewrites.targets)
    torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=5e-2)
    calls = {s.name: s.calls for s in handle.seats}
    assert calls[next(name for name in calls if "o_proj" in name)] == 2
    assert not any(s.epilogue_refusal for s in handle.seats), "each epilogue matched its projection unfused"


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (TransformersBlock(keep_norm=True), "the norm's output is read besides the projection"),
        (TransformersBlock(norm=LayerNorm(HIDDEN, 1e-6)), "a LayerNorm subtracts the mean"),
    ],
)
def test_a_norm_the_epilogues_do_not_compute_is_left_alone(model, why):
    model, _ = _seated(model, seams=3)
    rewrites, compiled, eager = _compiled_block(model)
    assert rewrites.norms == [0], why
    assert "flashrt.served_linear_add_norm.default" not in rewrites.targets
    torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=5e-2)


def test_a_seated_llama_takes_each_add_and_norm_between_its_projections_into_them():
    """transformers' Llama as the benchmark seats it (qkv and gate-and-up merged), six layers,
    compiled whole: the activation of each MLP and every residual add and RMSNorm whose reader
    is seated (after each attention, before each later layer's, before the LM head: 12) move
    into the projections; the first layer's norm, which reads the embedding, stays. The residual
    stream runs back through every layer's adds, and the early layers' norms are found as the
    late ones are. The LM head in two slabs, each taking the norm's scale. Logits as the unfused
    model's."""
    config = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, head_dim=32,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    for module in model.modules():
        if isinstance(module, LlamaRMSNorm):
            torch.nn.init.uniform_(module.weight, 0.5, 1.5)
    model, handle = _seated(model, seams=25, head_slab_rows=256)
    assert not any(s.epilogue_refusal for s in handle.seats)
    rewrites = _Rewrites()
    torch._dynamo.reset()
    ids = torch.randint(0, 512, (2, 7))
    with torch.no_grad(), inductor.patch(post_grad_custom_post_pass=rewrites):
        compiled = torch.compile(model, fullgraph=True)(ids).logits
        eager = model(ids).logits
    assert rewrites.fused == [6] and rewrites.norms == [12]
    assert F.cosine_similarity(compiled.float().flatten(), eager.float().flatten(), dim=0) > 0.9999


def test_a_seat_whose_epilogue_computes_something_else_serves_its_fused_calls_unfused(monkeypatch, caplog):
    """Each seat checks the fused epilogues at bind against its own projection unfused (at one
    token and at the calibration rows): an add-and-norm whose weighted output is off, or one that
    raises, is refused with the reason logged; the pass then leaves the seats' calls as they are
    (the compiled kernels it would remove are faster than the projection and torch's arithmetic),
    and a fused call that reaches such a seat anyway (a graph compiled before) is served so."""
    from flashrt.runtime import seats

    real = seats.linear_add_norm

    def halved(*args, **kwargs):
        h, weighted, sumsq = real(*args, **kwargs)
        return h, weighted * 0.5, sumsq

    def raising(*args, **kwargs):
        raise RuntimeError("no epilogue here")

    for broken, reason in ((halved, "the residual add and norm at 1 tokens: cosine"), (raising, "raised RuntimeError")):
        monkeypatch.setattr(seats, "linear_add_norm", broken)
        with caplog.at_level("WARNING", logger="flashrt"):
            model, handle = _seated(TransformersBlock(), seams=3)
        refusals = {s.name: s.epilogue_refusal for s in handle.seats}
        assert all(reason in refusal for refusal in refusals.values()), refusals
        assert "serves its fused calls unfused" in caplog.text
        rewrites, compiled, eager = _compiled_block(model)
        assert rewrites.norms == [0] and rewrites.fused == [0]
        assert not any("served_linear_" in t for t in rewrites.targets)
        torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=5e-2)
        o_proj = next(s for s in handle.seats if "o_proj" in s.name)
        x = torch.randn(3, HIDDEN, dtype=torch.bfloat16)
        residual, norm_weight = torch.randn(3, HIDDEN, dtype=torch.bfloat16), torch.ones(HIDDEN, dtype=torch.bfloat16)
        served = o_proj.serve_add_norm(x, None, residual, norm_weight)
        unfused = ops.add_norm(o_proj.seam(x, None).float(), residual, norm_weight, torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(served, unfused, strict=True))
        assert not any(s.fallbacks for s in handle.seats)
