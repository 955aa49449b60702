"""The SiLU-and-mul rewrite (``flashrt.runtime.fusion``) on graphs inductor really lowers, on the CPU."""

import pytest
import torch
import torch.nn.functional as F
import transformers
from flashrt.bench.e2e import merge_projections
from flashrt.runtime import SeatProfile, attach, fusion
from torch._inductor import config as inductor
from transformers.models.llama.modeling_llama import LlamaMLP

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
        self.fused, self.targets = [], []

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.fused.append(fusion.fuse_silu_mul(graph))
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


def _seated(model: torch.nn.Module):
    torch.manual_seed(0)
    model = model.to(torch.bfloat16)
    merge_projections(model)
    handle = attach(model, SeatProfile(min_params=0))
    assert handle.summary()["seams"] == 2
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


def test_the_pass_is_keyed_by_its_source_for_inductor_s_graph_cache():
    key = fusion.SiluMulPass().uuid()
    assert len(key) == 64 and key == fusion.SiluMulPass().uuid()
