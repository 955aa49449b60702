"""The end-to-end benchmark measures the computation a serving engine runs: its decode step
(the one captured in a CUDA graph on the GPU) must produce ``generate()``'s greedy tokens."""

import random

import pytest
import torch
from flashrt.bench import e2e, inductor_trigger
from flashrt.runtime import fusion


def _tiny(kind: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3MoeConfig

    common = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    if kind == "dense":
        config = LlamaConfig(intermediate_size=128, tie_word_embeddings=False, **common)
    else:
        config = Qwen3MoeConfig(
            intermediate_size=128, moe_intermediate_size=32, head_dim=16, num_experts=8, num_experts_per_tok=2, **common
        )
    e2e.use_gqa_decode_attention(config)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_decode_step_computes_what_a_full_forward_computes(kind, device):
    """Prefill, then steps that read the static cache, the 4-D mask and the positions they advance
    in place: each step's logits equal those of one uncached forward over the whole sequence."""
    model = _tiny(kind).to(device)
    prompt = torch.randint(0, 512, (3, e2e.PROMPT), device=device)
    run = e2e.DecodeRun(model, model, prompt)
    tokens, logits = [], []
    with torch.no_grad():
        logits.append(run.prefill())
        for _ in range(6):
            tokens.append(run.token.clone())
            run.step()
            logits.append(run.logits.float())
        full = model(torch.cat([prompt, *tokens], dim=1)).logits.float()
    for i, step_logits in enumerate(logits):
        torch.testing.assert_close(step_logits, full[:, e2e.PROMPT - 1 + i], atol=1e-4, rtol=1e-4)
        assert torch.equal(step_logits.argmax(-1), [*tokens, run.token][i][:, 0]), "greedy: the next input"
    assert int(run.position) == e2e.PROMPT + 6
    with torch.no_grad():
        run.prefill()  # starts over: the cache and the step's buffers are reset in place
    assert torch.equal(run.token, tokens[0]) and int(run.position) == e2e.PROMPT


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("vocab", [512, 1000, 151936])
def test_greedy_picks_argmax_s_token_ties_and_all(vocab, compiled):
    """The step's two-pass selection is ``argmax``: the first of tied largest logits, within a
    part and across parts, at vocabularies whose parts do and do not come in 128 (1000: 8 of 125),
    as it runs and as inductor compiles it for the step."""
    select = e2e.select_program(compiled)
    logits = torch.randint(-50, 50, (6, vocab)).float()
    logits[1, [7, vocab - 3]] = 99.0  # tied across parts
    logits[2, [vocab // 2, vocab // 2 + 1]] = 99.0  # tied within a part
    logits[3] = 5.0  # every logit tied
    assert torch.equal(select(logits), logits.argmax(-1, keepdim=True))
    assert torch.equal(select(logits.bfloat16()), logits.bfloat16().argmax(-1, keepdim=True))


def _symbolic_inputs(graph: torch.fx.GraphModule) -> list[str]:
    """The graph's inputs that are symbolic sizes or have one."""
    values = {node.name: node.meta.get("example_value") for node in graph.graph.nodes if node.op == "placeholder"}
    return [
        name
        for name, value in values.items()
        if isinstance(value, torch.SymInt)
        or (isinstance(value, torch.Tensor) and any(isinstance(size, torch.SymInt) for size in value.shape))
    ]


def test_each_batch_steps_the_static_program_a_run_of_it_alone_compiles(device):
    """Under torch.compile's default the second batch size traces a symbolic batch: a batch's
    figure would depend on the batches measured before it in the process. On the benchmark's
    device: the decode attention is a Triton kernel, which takes CPU tensors only interpreted."""
    model = _tiny("dense").to(device)
    traced = []

    def spy(graph, example_inputs):
        traced.append(_symbolic_inputs(graph))
        return graph.forward

    def step(program, batch: int) -> None:
        run = e2e.DecodeRun(model, program, torch.randint(0, 512, (batch, e2e.PROMPT), device=device))
        with torch.no_grad():
            run.prefill()
            run.step()

    shared = torch.compile(model, backend=spy)
    for batch in (1, 3):
        step(shared, batch)
    assert traced[0] == [] and traced[1], "the default's second batch is symbolic"
    traced.clear()
    for batch in (1, 3):
        step(e2e.batch_program(model, True, backend=spy), batch)
    assert traced == [[], []]
    assert e2e.batch_program(model, False) is model


def test_decode_attention_reads_each_kv_head_once_and_computes_sdpas_result(device):
    """One query token: the query heads of a key-value head as its rows give transformers' sdpa
    over the repeated cache, masked positions and all, also traced whole as the benchmark compiles
    it (the split attention's fake); the step test above runs it in a model."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 4, True
    query = torch.randn(3, 8, 1, 16, device=device)
    key, value = torch.randn(2, 3, 2, 40, 16, device=device)
    mask = torch.rand(3, 1, 1, 40, device=device) < 0.7
    mask[..., 0] = True
    ours, _ = e2e.gqa_decode_attention(module, query, key, value, mask, scaling=0.25)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert ours.shape == expected.shape == (3, 1, 8, 16)
    torch.testing.assert_close(ours, expected)
    torch._dynamo.reset()
    traced = torch.compile(e2e.gqa_decode_attention, backend="eager", fullgraph=True)
    torch.testing.assert_close(traced(module, query, key, value, mask, scaling=0.25)[0], ours, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("batch", "kv_heads", "groups", "length", "dim", "visible_upto", "dtype", "splits"),
    [
        (1, 4, 8, 259, 128, 130, torch.bfloat16, 9),  # Qwen3-30B at batch 1: the last 4 splits with no visible key
        (8, 4, 8, 259, 128, 130, torch.bfloat16, 5),  # at batch 8: the wide tile, 64 keys a split, the last 2 hidden
        (5, 2, 1, 70, 80, 70, torch.float32, 3),  # one query head a key-value head, a dimension not a power of 2
        (2, 3, 4, 33, 16, 1, torch.float32, 2),  # one visible key
        (33, 4, 2, 100, 16, 60, torch.bfloat16, 1),  # 132 pairs fill the GPU: one split, normalized in place, no merge
        (16, 2, 2, 100, 64, 60, torch.float32, 2),  # 32 pairs: 64-key steps, 2 splits
        (16, 2, 2, 100, 256, 60, torch.float32, 4),  # the same with Qwen3.5's heads of 256: 32-key steps, 4 splits
    ],
)
def test_split_decode_attention_is_attention_over_the_visible_cache(
    batch, kv_heads, groups, length, dim, visible_upto, dtype, splits, device
):
    """The split kernel and its merge against plain softmax attention: every split's partial
    softmax weighed by its max, splits with no visible key adding nothing, positions past the
    visible ones (a static cache's unwritten slots, here poisoned) never read into the output."""
    from flashrt.bench import decode_attention

    query = torch.randn(batch, kv_heads, groups, dim, device=device).to(dtype)
    key, value = torch.randn(2, batch, kv_heads, length, dim, device=device).to(dtype)
    visible = torch.zeros(batch, length, dtype=torch.bool, device=device)
    visible[:, :visible_upto] = True
    visible[0, 0] = visible_upto == 1  # with more visible, a sequence whose first key is hidden
    key[:, :, visible_upto:] = value[:, :, visible_upto:] = float("nan")
    assert decode_attention.split_count(batch * kv_heads, length, dim) == splits
    ours = decode_attention.decode_attention(query, key, value, visible, dim**-0.5)
    expected = decode_attention.reference(query, key, value, visible, dim**-0.5)
    assert ours.shape == expected.shape and ours.dtype == dtype and not ours.isnan().any()
    torch.testing.assert_close(ours, expected, **({} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)))


def test_every_tile_the_attention_probe_times_computes_the_attention(device):
    """``probe_decode_attention``'s tile arms (keys a step, warps, stages) against plain softmax
    attention, splits with no visible key and poisoned hidden slots included: a tile the probe
    finds faster is one the benchmark may take. The interpreter has no warps or stages, so on the
    CPU each width of step runs once."""
    from flashrt.bench import decode_attention, probe_decode_attention

    tiles = probe_decode_attention.TILES
    if device.type == "cpu":
        tiles = list({keys: (keys, warps, stages) for keys, warps, stages in tiles}.values())
    query = torch.randn(2, 2, 4, 64, device=device).to(torch.bfloat16)
    key, value = torch.randn(2, 2, 2, 259, 64, device=device).to(torch.bfloat16)
    visible = torch.zeros(2, 259, dtype=torch.bool, device=device)
    visible[:, :150] = True
    key[:, :, 150:] = value[:, :, 150:] = float("nan")
    expected = decode_attention.reference(query, key, value, visible, 0.125)
    for keys, warps, stages in tiles:
        tile = decode_attention.Tile(keys, warps, stages)
        ours = probe_decode_attention._with_settings(NARROW=tile, WIDE=tile)(query, key, value, visible, 0.125)
        assert (decode_attention.NARROW, decode_attention.WIDE) == ((32, 4, 3), (64, 4, 3)), "put back"
        assert not ours.isnan().any(), (keys, warps, stages)
        torch.testing.assert_close(ours, expected, atol=2e-2, rtol=2e-2, msg=f"tile {keys, warps, stages}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PDL needs a GPU")
@pytest.mark.parametrize("batch", [1, 17])  # 9 splits and the merge; 136 pairs, one split, no merge
def test_split_decode_attention_launched_with_pdl_reads_what_the_kernel_before_wrote(
    batch, late_writer, same_bits_eager_and_replayed, monkeypatch
):
    """``PDL_LAUNCH``: the split kernel and its merge start while the kernel before them runs (that
    kernel lets them, then spends 50 us before writing the query), and read the query only after
    it is done (``gdc_wait``), the merge (at 9 splits) the partials only after the split kernel is;
    eagerly and in a CUDA graph. Bit for bit the attention on the query written long before."""
    from flashrt.bench import decode_attention

    kv_heads, groups, length, dim = 8, 4, 259, 128
    source = torch.randn(batch, kv_heads, groups, dim, device="cuda").to(torch.bfloat16)
    query = torch.empty_like(source)
    key, value = torch.randn(2, batch, kv_heads, length, dim, device="cuda").to(torch.bfloat16)
    visible = torch.ones(batch, length, dtype=torch.bool, device="cuda")
    expected = decode_attention.decode_attention(source, key, value, visible, dim**-0.5)
    monkeypatch.setattr(decode_attention, "PDL_LAUNCH", True)
    out = torch.empty_like(expected)

    def step():
        query.fill_(float("nan"))
        late_writer[(1,)](source, query, 50_000, source.numel(), BLOCK=1 << (source.numel() - 1).bit_length())
        out.copy_(decode_attention.decode_attention(query, key, value, visible, dim**-0.5))

    same_bits_eager_and_replayed(step, out, expected)


def test_split_decode_attention_names_a_bad_mask():
    from flashrt.bench import decode_attention

    query, key = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match=r"visible must be bool \[1, 8\], got torch.float32"):
        decode_attention.decode_attention(query, key, key, torch.ones(1, 8), 0.25)


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "renormalize"), [(1, 128, 8, True), (5, 60, 6, False), (16, 256, 8, True)]
)
def test_fused_router_picks_transformers_experts_and_weights(tokens, experts, top_k, renormalize, device):
    """The one-launch routing against transformers' (softmax, ``torch.topk``, renormalize): experts
    of the same logits in the same order, the same weights to bf16 rounding; 60 experts, not a
    power of 2. bf16 logits tie (256 experts of them often do), and where they do, ``torch.topk``
    picks either: the fused one takes the lower expert, and every expert once."""
    from flashrt.bench import router_topk

    logits = torch.randn(tokens, experts, dtype=torch.bfloat16, device=device) * 3
    weights, ids = router_topk.router_topk(logits, top_k, renormalize)
    expected_weights, expected_ids = router_topk.reference(logits, top_k, renormalize)
    assert ids.dtype == torch.int64 and weights.dtype == torch.bfloat16
    assert torch.equal(logits.gather(1, ids), logits.gather(1, expected_ids))
    torch.testing.assert_close(weights, expected_weights)
    for row, chosen in zip(logits.cpu(), ids.tolist(), strict=True):
        assert len(set(chosen)) == top_k
        for expert in chosen:
            lower_tie = [e for e in range(expert) if row[e] == row[expert] and e not in chosen]
            assert not lower_tie, "ties go to the lower expert"


def test_fused_router_picks_experts_of_the_bank_from_nan_logits(device):
    """NaN logits (a model broken upstream; an infinite one makes the softmax NaN too) still route
    each token to ``top_k`` distinct experts of the bank, never to an index past it, which the
    expert kernels would read out of bounds. A finite row routes as before."""
    from flashrt.bench import router_topk

    experts, top_k = 60, 8
    logits = torch.randn(3, experts, dtype=torch.bfloat16, device=device)
    logits[0, 7] = float("nan")
    logits[1] = float("nan")
    logits[2, 3] = float("inf")
    _, ids = router_topk.router_topk(logits, top_k, True)
    assert ((ids >= 0) & (ids < experts)).all(), ids
    assert all(len(set(row)) == top_k for row in ids.tolist()), ids
    finite = logits[:1].clone()
    finite[0, 7] = 0.0
    chosen, expected = router_topk.router_topk(finite, top_k, True)[1], router_topk.reference(finite, top_k, True)[1]
    assert torch.equal(finite.gather(1, chosen), finite.gather(1, expected)), "the same logits; ties either way"


@pytest.mark.parametrize(("tokens", "experts", "k"), [(1, 128, 2048), (5, 60, 768), (16, 256, 2048)])
def test_router_logits_are_the_routers_linear(tokens, experts, k, device):
    """The router's own GEMM against float64 (rounded once, to bf16) and against ``F.linear``
    (within a bf16 rounding of it: the fp32 sums run in another order); 60 experts leave the
    last program half empty, K 768 is not a power of 2."""
    from flashrt.bench import router_topk

    x = torch.randn(tokens, k, dtype=torch.bfloat16, device=device)
    weight = torch.randn(experts, k, dtype=torch.bfloat16, device=device) * 0.02
    logits = router_topk.router_logits(x, weight)
    assert logits.shape == (tokens, experts) and logits.dtype == torch.bfloat16
    exact = (x.double() @ weight.double().T).to(torch.bfloat16)
    torch.testing.assert_close(logits, exact, rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(logits, torch.nn.functional.linear(x, weight), rtol=2**-7, atol=1e-3)


def test_fused_router_takes_its_own_gemm_up_to_16_tokens(monkeypatch, device):
    """``FusedTopKRouter`` computes its logits with ``router_logits`` at up to
    ``LOGITS_MAX_TOKENS`` tokens, as vLLM's ``GateLinear`` does, and with ``F.linear`` past them."""
    from flashrt.bench import router_topk

    model = _tiny("moe").to(device)
    router_topk.install(model)
    router = next(m for m in model.modules() if isinstance(m, router_topk.FusedTopKRouter))
    calls = []
    monkeypatch.setattr(router_topk, "router_logits", lambda x, w: calls.append(len(x)) or x @ w.T)
    with torch.no_grad():
        for tokens in (1, 16, 17):
            router(torch.randn(tokens, router.weight.shape[1], dtype=router.weight.dtype, device=device))
    assert calls == [1, 16]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PDL launches need a GPU")
def test_routers_launched_with_pdl_give_every_bit_they_give_without(monkeypatch):
    """``router_topk.PDL_LAUNCH``: the logits GEMM and the top-k, each waiting for the kernel
    before it, on fresh hidden states back to back, eagerly and replayed in a CUDA graph: bit for
    bit what they give launched plainly."""
    from flashrt.bench import router_topk

    weight = torch.randn(128, 2048, dtype=torch.bfloat16, device="cuda")
    xs = [torch.randn(3, 2048, dtype=torch.bfloat16, device="cuda") for _ in range(6)]

    def route(x):
        logits = router_topk.router_logits(x * 1.0, weight)  # x * 1.0: a kernel before, as the norm
        return router_topk.router_topk(logits, 8, True)

    def run_all(on: bool):
        monkeypatch.setattr(router_topk, "PDL_LAUNCH", on)
        eager = [route(x) for x in xs]
        graph, outs = torch.cuda.CUDAGraph(), []
        with torch.cuda.graph(graph):
            outs = [route(x) for x in xs]
        graph.replay()
        torch.cuda.synchronize()
        return eager, outs

    plain, plain_graph = run_all(False)
    for got in run_all(True):
        for (weights, ids), (want_weights, want_ids) in zip(got, plain, strict=True):
            assert torch.equal(weights, want_weights) and torch.equal(ids, want_ids)
    for (weights, ids), (want_weights, want_ids) in zip(plain_graph, plain, strict=True):
        assert torch.equal(weights, want_weights) and torch.equal(ids, want_ids)


def test_each_arm_launches_its_attention_and_router_kernels_with_pdl_as_its_setting_says(monkeypatch):
    """``e2e.PDL_ARMS``: by default the seated arm launches the decode attention's and the router's
    kernels as torch.compile launches its own (``None``) and the bf16 arm plainly; ``both`` and
    ``off`` set both arms alike."""
    from flashrt.bench import decode_attention, e2e, router_topk

    monkeypatch.setattr(decode_attention, "PDL_LAUNCH", "unset")
    monkeypatch.setattr(router_topk, "PDL_LAUNCH", "unset")
    for setting, arm, want in (
        ("seated", "seated", None),
        ("seated", "bf16", False),
        ("both", "bf16", None),
        ("off", "seated", False),
    ):
        e2e._pdl_for(arm, setting)
        assert decode_attention.PDL_LAUNCH is want and router_topk.PDL_LAUNCH is want, (setting, arm)


def test_inductor_configs_reach_the_switches_inductor_reads():
    """``e2e.INDUCTOR_CONFIGS``: ``heuristic`` turns inductor's pointwise autotuning off and has
    the filter its reductions' configs pass through keep one of them, as its deterministic mode
    does, the same in every process; ``coordinate-descent`` has inductor turn a matrix-vector
    product into a reduction it can fuse (and tune around its first pick); ``autotune`` (the
    default) leaves every config to be timed and the product to the matmul library."""
    import triton
    from torch._inductor import config as inductor
    from torch._inductor import decomposition
    from torch._inductor.runtime import triton_heuristics

    assert e2e.heuristic_configs_available(), "this torch's inductor: the suite's pins have the switch"
    assert set(e2e.INDUCTOR_CONFIGS) == {"autotune", "heuristic", "coordinate-descent"}
    configs = [triton.Config({"XBLOCK": x, "R0_BLOCK": 128}, num_warps=w) for x, w in ((1, 2), (8, 4), (32, 8))]
    # a decode row times a weight, on a device that is neither the CPU nor MPS (which inductor
    # leaves to their matmul) and without one: the meta device
    row, weight = torch.empty(1, 64, device="meta"), torch.empty(64, 32, device="meta")
    # what ``compile_as_runs_do`` writes, put back afterwards by the config modules' own ``patch``
    # (monkeypatch would delete them: they are not in a config module's ``__dict__``)
    written = ["triton.autotune_pointwise", "coordinate_descent_tuning", "test_configs.force_filter_reduction_configs"]
    written += ["post_grad_custom_post_pass"]
    written += ["triton.enable_pdl"] if hasattr(inductor.triton, "enable_pdl") else []
    now = inductor.get_config_copy()
    with (
        inductor.patch({name: now[name] for name in written}),
        torch._dynamo.config.patch(cache_size_limit=torch._dynamo.config.cache_size_limit),
    ):
        for setting, pointwise, kept, fused in (
            ("heuristic", False, 1, False),
            ("coordinate-descent", True, 3, True),
            ("autotune", True, 3, False),
        ):
            e2e.compile_as_runs_do(inductor_pdl=False, inductor_configs=setting)
            meta = {"force_filter_reduction_configs": inductor.test_configs.force_filter_reduction_configs}
            assert inductor.triton.autotune_pointwise is pointwise, setting
            assert len(triton_heuristics.filter_reduction_configs_for_determinism(meta, configs)) == kept, setting
            assert (decomposition.mm(row, weight) is not NotImplemented) is fused, setting
            installed = inductor.post_grad_custom_post_pass
            assert isinstance(installed, fusion.EpiloguePass) and installed.silu_mul and installed.add_norm
        e2e.compile_as_runs_do(inductor_pdl=False, fuse_add_norm=False)
        installed = inductor.post_grad_custom_post_pass
        assert installed.silu_mul and not installed.add_norm, "--fuse-add-norm off"
        e2e.compile_as_runs_do(inductor_pdl=False, fuse_silu_mul=False, fuse_add_norm=False)
        assert inductor.post_grad_custom_post_pass is None, "--fuse-silu-mul off --fuse-add-norm off"
    assert inductor.get_config_copy() == now, "the settings are put back"


def test_fused_routers_replace_transformers_routers_and_keep_the_models_logits(device):
    """``install`` swaps each Qwen3-MoE router for the fused one on the same weight: the model's
    logits do not change, traced whole by ``torch.compile`` too (the op's fake), and the dense
    model has none to swap."""
    from flashrt.bench import router_topk

    model = _tiny("moe").to(device)
    ids = torch.randint(0, 512, (3, 9), device=device)
    with torch.no_grad():
        expected = model(ids).logits
        assert router_topk.install(model) == 2 and router_topk.install(_tiny("dense")) == 0
        assert sum(isinstance(m, router_topk.FusedTopKRouter) for m in model.modules()) == 2
        torch.testing.assert_close(model(ids).logits, expected)
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(model, backend="eager", fullgraph=True)(ids).logits, expected)


def _tiny_qwen35(device):
    from transformers import AutoModelForCausalLM, Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16,
    )  # fmt: skip
    e2e.use_gqa_decode_attention(config)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval().to(device)


def _untuned_on_the_cpu(monkeypatch, modeling=None) -> None:
    """What autotunes, which needs a GPU driver, does not on the CPU: prefill's chunk kernels
    (transformers' torch code instead) and the convolution's tile (the first config). Without
    flash-linear-attention nothing does."""
    import importlib.util
    import inspect

    if importlib.util.find_spec("fla") is None:
        return
    import fla.modules.causal_conv1d.ops as fla_conv

    if modeling is not None:
        chunk = "torch_chunk_gated_delta_rule"
        monkeypatch.setattr(modeling, chunk, inspect.unwrap(getattr(modeling, chunk)))
    tuner = fla_conv.causal_conv1d_update_kernel
    while not hasattr(tuner, "configs"):
        tuner = tuner.fn
    monkeypatch.setattr(tuner, "configs", tuner.configs[:1])


def test_qwen35_decode_step_runs_flash_linear_attention_kernels_inside_the_compiled_step(monkeypatch, device):
    """``gated_delta.install``: each gated-delta-rule layer's decode calls (the rule and the
    convolution's update) go through the ops, which dynamo keeps whole (``fullgraph``: no break,
    so the kernels run inside the captured step), and the step, eager or compiled by inductor,
    computes what transformers' torch code computes, the cache's states included (the rule's is
    advanced in place); prefill's calls are not taken."""
    pytest.importorskip("fla")
    import collections
    import inspect
    import sys

    import fla.modules.causal_conv1d.ops as fla_conv
    import fla.ops.gated_delta_rule.fused_recurrent as fla_rule
    from flashrt.bench import gated_delta

    model = _tiny_qwen35(device)
    modeling = sys.modules[type(gated_delta.layers(model)[0]).__module__]
    names = (gated_delta.RULE, gated_delta.CONV)
    chosen = {name: getattr(modeling, name) for name in names}  # what transformers chose
    if device.type == "cpu":
        _untuned_on_the_cpu(monkeypatch, modeling)
    kernel_calls = collections.Counter()

    class Counted:  # a kernel whose launches are counted
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            kernel_calls[self.name] += 1
            return self.kernel[grid]

    kernels = {fla_rule: "fused_recurrent_gated_delta_rule_fwd_kernel", fla_conv: "causal_conv1d_update_kernel"}
    for module, name in kernels.items():
        monkeypatch.setattr(module, name, Counted(name, getattr(module, name)))
    prompt = torch.randint(0, 512, (2, e2e.PROMPT), device=device)

    def step(program) -> list[torch.Tensor]:
        run = e2e.DecodeRun(model, program, prompt)
        with torch.no_grad():
            run.prefill()
            run.step()
        layer = run.cache.layers[0]
        return [run.logits.float(), layer.recurrent_states[0].clone(), layer.conv_states[0].clone()]

    for name in names:
        monkeypatch.setattr(modeling, name, inspect.unwrap(chosen[name]))  # transformers' torch code
    expected = step(model)
    for name in names:
        monkeypatch.setattr(modeling, name, chosen[name])
    assert gated_delta.install(model) == 3 and gated_delta.install(_tiny("moe")) == 0
    try:
        assert not kernel_calls
        for program in (model, torch.compile(model, backend="inductor", fullgraph=True)):
            torch._dynamo.reset()
            kernel_calls.clear()
            figures = step(program)
            assert kernel_calls == dict.fromkeys(kernels.values(), 3), "a launch each a layer"
            for got, want in zip(figures, expected, strict=True):
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    finally:
        gated_delta.uninstall(model)
    assert {name: getattr(modeling, name) for name in names} == chosen


def test_the_gated_delta_ops_take_only_the_calls_their_kernels_compute(monkeypatch, device):
    """Prefill's calls, a strided state, no L2 norm in the kernel, several tokens or a bias stay
    transformers'; a decode call goes to the op, the rule's state advanced in place."""
    pytest.importorskip("fla")
    from flashrt.bench import gated_delta

    if device.type == "cpu":
        _untuned_on_the_cpu(monkeypatch)
    taken = []
    rule = gated_delta._rule_through_the_op(lambda *args, **kwargs: taken.append("rule"))
    conv = gated_delta._conv_through_the_op(lambda *args, **kwargs: taken.append("conv"))
    q, k, v = (torch.randn(1, 1, 2, 16, device=device) for _ in range(3))
    g, beta = -torch.rand(1, 1, 2, device=device), torch.rand(1, 1, 2, device=device)
    state = torch.randn(1, 2, 16, 16, device=device)
    decode = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    rule(q, k, v, g, beta, **decode)
    rule(q, k, v, g, beta, initial_state=state.transpose(2, 3), **decode)
    rule(q, k, v, g, beta, initial_state=state, output_final_state=True)
    x, conv_state = torch.randn(1, 8, 1, device=device), torch.randn(1, 8, 4, device=device)
    weight = torch.randn(8, 4, device=device)
    conv(torch.randn(1, 8, 2, device=device), conv_state, weight, None, "silu")
    conv(x, conv_state, weight, torch.zeros(8, device=device), "silu")
    conv(x, conv_state.transpose(1, 2).contiguous().transpose(1, 2), weight, None, "silu")
    assert taken == ["rule"] * 3 + ["conv"] * 3
    before = state.clone()
    out, advanced = rule(q, k, v, g, beta, initial_state=state, **decode)
    assert advanced is state and not torch.equal(state, before) and out.shape == v.shape
    assert conv(x, conv_state, weight, None, "silu").shape == x.shape and taken == ["rule"] * 3 + ["conv"] * 3


def test_every_arm_of_the_gated_delta_probe_computes_transformers_step(monkeypatch, device):
    """``bench/probe_gated_delta.py`` times what transformers' code computes: each arm's output
    and advanced state at the probe's Qwen3.5 shapes, and the checker sees a wrong one."""
    pytest.importorskip("fla")
    from flashrt.bench import probe_gated_delta

    if device.type == "cpu":
        _untuned_on_the_cpu(monkeypatch)
    found = probe_gated_delta.arms(compiled=False)
    worst = probe_gated_delta.errors(found, 1, device)
    assert set(worst) == {*probe_gated_delta.RULE_ARMS, *probe_gated_delta.CONV_ARMS}
    assert max(worst.values()) < 1e-2, worst
    wrong = {name: found[name] for name in ("torch_loop", "conv_torch")}
    wrong["in_place"] = lambda i: probe_gated_delta.gated_delta.gated_delta_rule_step(
        i["query"], i["key"], i["value"], i["g"] * 2, i["beta"], i["state"]
    )
    assert probe_gated_delta.errors(wrong, 1, device)["in_place"] > 1e-2


@pytest.mark.parametrize(("kind", "groups", "removed"), [("dense", 4, 6), ("moe", 2, 4), ("qwen35", 11, 12)])
def test_merged_projections_compute_what_the_separate_ones_compute(kind, groups, removed, monkeypatch):
    """Both arms run vLLM's layout: one GEMM for q, k and v, one for gate and up, and Qwen3.5's
    gated-delta-rule layers' two (qkv and z, b and a), each a ``nn.Linear`` the seats find,
    computing transformers' logits; under ``torch.compile(fullgraph=True)`` the traced step has
    exactly the merged-away GEMMs fewer (members share the group's). The Qwen3.5 model: 3
    gated-delta-rule layers and 1 of attention, a shared expert in each."""
    if kind == "qwen35":
        import sys

        from flashrt.bench import gated_delta

        model = _tiny_qwen35(torch.device("cpu"))
        _untuned_on_the_cpu(monkeypatch, sys.modules[type(gated_delta.layers(model)[0]).__module__])
    else:
        model = _tiny(kind)
    ids = torch.randint(0, 512, (2, 16))
    linears = sum(1 for m in model.modules() if type(m) is torch.nn.Linear)

    def traced_gemms(module) -> int:
        gemms = []

        def backend(graph_module, example_inputs):
            gemms.extend(n for n in graph_module.graph.nodes if n.target is torch.nn.functional.linear)
            return graph_module

        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(module, backend=backend, fullgraph=True)(ids).logits, expected)
        return len(gemms)

    with torch.no_grad():
        expected = model(ids).logits
        separate = traced_gemms(model)
        assert e2e.merge_projections(model) == groups
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-5, atol=1e-5)
        assert traced_gemms(model) == separate - removed
    names = [name for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    assert sum(n.endswith(tuple(f".{group}" for group in e2e.MERGED)) for n in names) == groups
    assert not [n for n in names if n.endswith(tuple(f".{m}" for members in e2e.MERGED.values() for m in members))]
    assert len(names) == linears - removed


def test_the_committed_e2e_result_is_the_listed_runs_merged_and_the_figure_draws_it(tmp_path):
    """``bench/results/h200-e2e.json`` is exactly ``DEFAULT_RESULTS`` merged (a run added to the
    list and not merged, or a hand edit, fails here); each (model, layers, batch) once, from the
    first run that has it, with that run's commit, file, attach time and ``generate()`` figures; runs of
    other versions are refused."""
    import json

    from flashrt.bench import merge, plot_e2e

    merged = plot_e2e.merged_result(plot_e2e.DEFAULT_RESULTS)
    assert json.loads(plot_e2e.DEFAULT_MERGED.read_text()) == json.loads(json.dumps(merged))
    h100 = plot_e2e.merged_result(plot_e2e.H100_RESULTS)
    assert json.loads(plot_e2e.H100_MERGED.read_text()) == json.loads(json.dumps(h100))
    assert h100["device"] == "NVIDIA H100 80GB HBM3" and merged["device"] == "NVIDIA H200"
    results = {path.name: json.loads(path.read_text()) for path in plot_e2e.DEFAULT_RESULTS}
    rows = merged["rows"]
    key = plot_e2e.key
    everywhere = {key(r) for result in results.values() for r in result["rows"]}
    assert len({key(r) for r in rows}) == len(rows) == len(everywhere)
    for row in rows:  # each from the first run that has it, as that run measured it
        first = next(name for name, res in results.items() if any(key(r) == key(row) for r in res["rows"]))
        own = next(r for r in results[first]["rows"] if key(r) == key(row))
        assert row["source"] == first and row["commit"] == results[first]["commit"] and row == own | row
        model = next(m for m in results[first]["models"] if m["model"].startswith(row["model"] + "-shaped"))
        assert row["attach_seconds"] == model["attach_seconds"] > 0, "the attach of the run the row is from"
        generate = model.get("generate_batch1") or {}
        assert (row["generate_bf16_tok_s"], row["generate_ours_tok_s"]) == (
            generate.get("bf16_tok_s"),
            generate.get("ours_tok_s"),
        )
    assert merged["commit"] == list(dict.fromkeys(r["commit"] for r in rows))
    assert all(merged[key] == results[merged["sources"][0]][key] for key in plot_e2e.SHARED)
    again = merge.merged_rows([*results.values(), *results.values()], plot_e2e.key)  # a measurement is taken once
    assert len(again) == len(rows)

    other = tmp_path / "other.json"
    other.write_text(json.dumps(results[merged["sources"][0]] | {"torch": "2.99"}))
    with pytest.raises(ValueError, match="torch: the runs differ"):
        plot_e2e.merged_result([plot_e2e.DEFAULT_RESULTS[0], other])

    png = tmp_path / "speedup.png"
    lines = plot_e2e.plot(merged, png)
    assert sum(len(b) for b, _ in lines.values()) == len(rows) > 0
    assert len(lines) == len({(r["model"], r["layers"]) for r in rows}) == 4  # Qwen3.5 at 8 layers and at 40
    for label, (batches, speedups) in lines.items():
        assert batches == sorted(batches)
        for b, s in zip(batches, speedups, strict=True):
            row = next(r for r in rows if label == f"{r['model']} ({r['layers']} layers)" and r["batch"] == b)
            assert s == pytest.approx(row["ours_tok_s"] / row["bf16_tok_s"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("header", "merged"), [("| model |", "DEFAULT_MERGED"), ("| H100: model |", "H100_MERGED")], ids=["h200", "h100"]
)
def test_the_readme_s_decode_table_is_the_committed_e2e_result(header, merged):
    """Every row of a README decode table (the H200's, the H100's) is a row of its merged result
    (``bench/results/h200-e2e.json``, ``h100-e2e.json``) as that file has it (tokens/s to 0.1,
    ratios to 0.01, the run's commit), and every row of the file is in the table: a re-measured
    run merged without the README, or a figure edited by hand in one of them, fails here."""
    import json
    from pathlib import Path

    from flashrt.bench import plot_e2e

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    header += " batch | bf16 tok/s | seated tok/s |"
    lines = readme[readme.index(header) :].splitlines()[2:]
    table = [[c.strip() for c in line.strip("|").split("|")] for line in lines[: lines.index("")]]
    models = {"Llama-3-8B": "llama3-8b", "Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen3.5-35B-A3B": "qwen3.5-35b-a3b"}
    rows = {plot_e2e.key(r): r for r in json.loads(getattr(plot_e2e, merged).read_text())["rows"]}
    seen, model, layers = set(), None, None
    for name, batch, bf16, ours, decode, prefill, commit in table:
        if name:  # "<model>-shaped, 32 layers" or "<model>-shaped, 8 of 40 layers"
            model = next(key for label, key in models.items() if name.startswith(label))
            layers = int(name.split(", ")[1].split()[0])
        row = rows[model, layers, int(batch)]
        assert (bf16, ours) == (f"{row['bf16_tok_s']:.1f}", f"{row['ours_tok_s']:.1f}"), (model, batch)
        assert (
            decode == f"**{row['ours_tok_s'] / row['bf16_tok_s']:.2f}x**" and prefill == f"{row['prefill_ratio']:.2f}x"
        )
        assert commit == row["commit"][:7], (model, batch)
        seen.add((model, layers, int(batch)))
    assert seen == set(rows)


def test_the_committed_kernel_table_is_the_listed_runs_merged(tmp_path):
    """``bench/results/h200-kernels.json`` is exactly ``kernels.DEFAULT_RESULTS`` merged by
    ``kernels --merge``: every measurement once, from the first run that has it, with that run's
    commit, file and copy bandwidth, and the issue's summary of those rows."""
    import json
    import math

    from flashrt.bench import kernels

    out = tmp_path / "kernels.json"
    assert kernels.main(["--merge", *map(str, kernels.DEFAULT_RESULTS), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert json.loads(kernels.DEFAULT_MERGED.read_text()) == merged
    runs = {path.name: json.loads(path.read_text()) for path in kernels.DEFAULT_RESULTS}
    keys = [kernels.key(r) for r in merged["rows"]]
    assert len(set(keys)) == len(keys) and set(keys) == {kernels.key(r) for run in runs.values() for r in run["rows"]}
    for row in merged["rows"]:
        first = next(name for name, run in runs.items() if any(kernels.key(r) == kernels.key(row) for r in run["rows"]))
        own = next(r for r in runs[first]["rows"] if kernels.key(r) == kernels.key(row))
        assert row == own | {"commit": runs[first]["commit"], "date": runs[first]["date"]} | {
            "copy_TBps": runs[first]["copy_TBps"],
            "source": first,
        }
    assert merged["copy_TBps"] == [runs[source]["copy_TBps"] for source in merged["sources"]]
    anchors = [
        r["speedup_vs_bf16"]
        for r in merged["rows"]
        if r["op"] == "linear" and r["M"] == 1 and r["name"] in {"qkv", "gate_up", "down", "lm_head"}
    ]
    assert len(anchors) == 4
    geomean = math.exp(sum(map(math.log, anchors)) / 4)
    assert merged["summary"]["linear_M1_geomean_vs_bf16"] == pytest.approx(geomean)
    for row in merged["rows"]:  # the fields
        if row["op"] == "linear":
            assert {"N", "K", "M", "ours_us", "bf16_us", "fp8_us", "int4_us", "bandwidth_frac"} <= set(row)
        if row["op"] == "moe":
            assert {"E", "top_k", "ours_us", "bf16_us", "grouped_mm_us", "loop_us", "bandwidth_frac"} <= set(row)


def test_w4a4_emulation_of_the_bank_is_the_w4a4_kernels_arithmetic(device):
    """The benchmark measures the accuracy cost of NVFP4 activations on the H200 (no FP4 tensor
    cores) by emulating the W4A4 bank on round-tripped weights; that emulation must be the
    arithmetic ``moe_w4a4`` is checked against. On the device the benchmark runs on: its
    activation quantizer is a Triton kernel, compiled there and interpreted on the CPU."""
    from flashrt.kernels import dequantize, nvfp4
    from flashrt.kernels.moe_w4a4 import moe_w4a4_reference

    e, n, k, t = 4, 64, 128, 16
    gu = nvfp4.quantize_reference(torch.randn(e, 2 * n, k, dtype=torch.bfloat16))
    dn = nvfp4.quantize_reference(torch.randn(e, k, n, dtype=torch.bfloat16))
    bank = torch.nn.Module()
    bank.gate_up_proj = torch.nn.Parameter(dequantize(gu, torch.float32).to(device))
    bank.down_proj = torch.nn.Parameter(dequantize(dn, torch.float32).to(device))
    hidden = torch.randn(t, k, dtype=torch.bfloat16)
    weights, ids = torch.randn(t, e).softmax(-1).topk(2)
    with torch.no_grad():
        got = e2e._w4a4_bank(bank, hidden.to(device), ids.to(device), weights.to(device, torch.bfloat16))
    ref = moe_w4a4_reference(hidden, gu, dn, ids, weights.to(torch.bfloat16)).double()
    got = got.double().cpu()
    # The two round in different precisions (fp32 here, float64 there), so now and then an element
    # of h sits on an NVFP4 rounding boundary and flips its code, taking that token's cosine to
    # about 0.99. So the median over tokens: at least 0.99963 in 150 seeds, 0.99999 typically;
    # without quantizing h 0.9972 typically (0.9961 the lowest); without any activation
    # quantization about 0.988.
    per_token = torch.nn.functional.cosine_similarity(got, ref, dim=1)
    assert per_token.median() > 0.999


@pytest.mark.parametrize("shape", [(40, 32), (3, 40, 32)])
def test_the_w4a16_round_trip_in_slabs_gives_every_value_the_whole_at_once_gives(shape, monkeypatch, device):
    """The benchmark round-trips seated weights a few rows at a time (an 80 GB H100 had no room for
    a whole bank's intermediates); under each matrix's own global scale the slabs must give the
    bytes the whole weight gives, the rows with the largest element in only one of them."""
    from flashrt.kernels import dequantize, quantize

    monkeypatch.setattr(e2e, "ROUND_TRIP_ROWS", 16)
    weight = torch.randn(shape, dtype=torch.bfloat16, device=device)
    weight.view(-1, *shape[-2:])[:, -1, 0] = 9.0  # each matrix's amax in its last slab alone
    weight.view(-1, *shape[-2:])[-1, -1, 0] = 30.0  # and one matrix's larger than the others'
    whole = dequantize(quantize(weight), weight.dtype)
    e2e._round_trip_in_place(weight)
    assert torch.equal(weight, whole)


def test_a_result_names_the_commit_whose_code_ran(tmp_path, monkeypatch):
    """A tree whose files differ from its HEAD (the device's copy: the session's first commit as
    HEAD under its latest files) is recorded as that commit ``-dirty``, not as the commit."""
    import subprocess

    from flashrt.bench.kernels import source_commit

    monkeypatch.delenv("FLASHRT_COMMIT", raising=False)
    git = lambda *args: subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / "kernel.py").write_text("version = 1\n")
    git("add", "kernel.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD").stdout.strip()
    assert source_commit(str(tmp_path)) == head
    (tmp_path / "kernel.py").write_text("version = 2\n")
    assert source_commit(str(tmp_path)) == f"{head}-dirty"
    monkeypatch.setenv("FLASHRT_COMMIT", "abc123")
    assert source_commit(str(tmp_path)) == "abc123", "the commit that was sent wins"
    assert source_commit(str(tmp_path / "nowhere")) == "abc123"
    monkeypatch.delenv("FLASHRT_COMMIT")
    assert source_commit("/") == "unknown"


def test_the_host_bench_times_every_arm_and_writes_its_provenance(tmp_path, capsys):
    """``python -m flashrt.bench host``: every arm timed on the same seated weight (on a GPU the
    direct call's recall and launch too), the old path's figure composed from the arms it names,
    the result with its commit."""
    import json

    from flashrt.bench import host

    out = tmp_path / "host.json"
    assert host.main(["--features", "32", "--calls", "5", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["commit"] and result["source_digest"] and result["torch"] == torch.__version__
    (row,) = result["rows"]
    arms = row["arms_us"]
    parts = {"choose", "launch"} if torch.cuda.is_available() else set()  # the direct call taken apart
    assert set(arms) == {"bf16", "seated", "outer_op", "inner_op", "inner_direct"} | parts
    assert all(us > 0 for us in arms.values())
    if parts:
        assert row["direct_rest_us"] == pytest.approx(arms["inner_direct"] - arms["choose"] - arms["launch"])
    assert row["through_ops_us"] == pytest.approx(arms["outer_op"] + arms["inner_op"] - arms["inner_direct"])
    assert row["seated_vs_bf16"] == pytest.approx(arms["seated"] / arms["bf16"])
    assert "through both ops" in capsys.readouterr().out


def test_gaps_are_summed_by_the_kernel_launched_before_them():
    """Two steps of four launches: the idle before each, summed a step by (kernel before, kernel),
    ranked by idle; a pair that never waited is left out, and so is every pair past ``top``."""
    step = [("norm", 0.2), ("router", 0.5), ("gate_up", 0.4), ("down", 0.0)]
    gaps = e2e.gaps_by_predecessor(step + step, replays=2)
    assert gaps == [
        {"after": "norm", "kernel": "router", "calls_per_step": 1.0, "idle_before_us_per_step": 0.5},
        {"after": "router", "kernel": "gate_up", "calls_per_step": 1.0, "idle_before_us_per_step": 0.4},
        {"after": "down", "kernel": "norm", "calls_per_step": 0.5, "idle_before_us_per_step": 0.1},
    ]
    assert [g["kernel"] for g in e2e.gaps_by_predecessor(step + step, replays=2, top=1)] == ["router"]


def test_the_step_profile_ranks_kernels_and_the_gaps_before_them(monkeypatch):
    """``_kernel_breakdown`` over what the profiler saw (events out of start order, as it may list
    them): each kernel's time, launches and idle a step, and the idle by the kernel before it."""
    from types import SimpleNamespace

    def event(name, start, end):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_time=end - start)

    events = [event("gate_up", 8.0, 20.0), event("norm", 0.0, 2.0), event("router", 3.0, 7.0)]
    monkeypatch.setattr(e2e, "replayed_kernels", lambda graph, replays: [
        (e, idle, overlap) for e, (idle, overlap) in zip(
            events, e2e.idle_and_overlap([(e.time_range.start, e.time_range.end) for e in events]), strict=True
        )
    ])  # fmt: skip
    kernels, gaps = e2e._kernel_breakdown(None, replays=1)
    assert [k["kernel"] for k in kernels] == ["gate_up", "router", "norm", "all"]
    assert kernels[0]["idle_before_us_per_step"] == 1.0 and kernels[-1]["idle_us_per_step"] == 2.0
    assert gaps == [
        {"after": "norm", "kernel": "router", "calls_per_step": 1.0, "idle_before_us_per_step": 1.0},
        {"after": "router", "kernel": "gate_up", "calls_per_step": 1.0, "idle_before_us_per_step": 1.0},
    ]


def test_idle_counts_only_time_no_kernel_ran_and_overlap_only_time_an_earlier_one_ran():
    """Two kernels overlapping (a PDL launch), a 3 us gap, one kernel inside another, in any
    order: idle before each, and the part of each that an earlier-started kernel shared."""
    timeline = e2e.idle_and_overlap([(0.0, 5.0), (3.0, 7.0), (10.0, 20.0), (12.0, 15.0)])
    assert timeline == [(0.0, 0.0), (0.0, 2.0), (3.0, 0.0), (0.0, 3.0)]
    timeline = e2e.idle_and_overlap([(12.0, 15.0), (10.0, 20.0), (0.0, 5.0), (21.0, 22.0)])
    assert timeline == [(0.0, 3.0), (5.0, 0.0), (0.0, 0.0), (1.0, 0.0)]
    assert e2e.idle_and_overlap([]) == []


def test_the_fold_probe_takes_every_committed_split_choice_of_the_ring_forms():
    """``bench/probe_fold.py`` compares the folded sum with the reduce on what the H200 serves:
    every committed ring-layout choice of either ring form that splits K, its tokens and shape
    read from the key, both forms among them (decode and prefill)."""
    import json

    from flashrt.bench import probe_fold
    from flashrt.kernels import tuning

    table = {}
    for path in tuning.SHIPPED.glob("tuning-*H200*.json"):
        table |= json.loads(path.read_text())
    choices = probe_fold.split_choices()
    keys = [f"linear:torch.bfloat16:M{m}:N{n}:K{k}:ring" for m, n, k, _, _ in choices]
    assert len(set(keys)) == len(keys) > 0
    for key, (_, _, _, form, config) in zip(keys, choices, strict=True):
        assert table[key]["form"] == form and dict(table[key]["config"]) == config and config["SPLIT_K"] > 1
    splitting = [
        key
        for key, entry in table.items()
        if key.endswith(":ring") and entry["form"] in probe_fold.FORMS and dict(entry["config"]).get("SPLIT_K", 1) > 1
    ]
    assert sorted(splitting) == sorted(keys)
    assert {form for *_, form, _ in choices} == {"mma_gluon", "wgmma_gluon"}


def test_the_device_call_runs_every_test_file_that_takes_the_gpu():
    """``bench/gpu_run.sh`` is how the GPU tests run on the device: a test file whose tests take
    the GPU where there is one (the ``device`` fixture, a CUDA skip) and that it leaves out never
    runs there (until da5a3a0 it ran ``test_kernels.py`` alone, and a ``test_bench.py`` test that
    broke on the H200 went unseen)."""
    import re
    from pathlib import Path

    tests = Path(__file__).parent
    script = (tests.parent / "bench" / "gpu_run.sh").read_text()
    takes_gpu = re.compile(r"def test_\w+\([^)]*\bdevice\b|cuda\.is_available\(\)|\bON_GPU\b")
    files = sorted(p.name for p in tests.glob("test_*.py") if takes_gpu.search(p.read_text()))
    assert "test_kernels.py" in files and "test_bench.py" in files, files
    for name in files:
        assert f"tests/{name}" in script, f"bench/gpu_run.sh does not run {name}"


def test_the_tma_ring_probe_says_for_each_row_whether_the_form_beat_the_served_ring(tmp_path):
    """``bench/probe_tma_ring.py``'s closing lines: for each row the served ring's time, the
    fastest warp-specialized arm and the ring's time over it; an arm that failed its check or
    its build (no time) is never the fastest, and a row where none ran says so."""
    import json

    from flashrt.bench import probe_tma_ring

    ring_only = {"ring": {"us": 98.0}, "ws_w4_s4_p2": {"us": None, "error": "OutOfResources"}}
    rows = [
        {"shape": "llama_qkv", "M": 1, "arms": {"ring": {"us": 7.5}, "ring_w4": {"us": 6.0}, "ws_w4_s4_p2": {"us": 6.0},
                                                "ws_w8_s4_p1": {"us": 5.0}, "ws_w4_s6_p2": {"us": None}}},
        {"shape": "lm_head", "M": 16, "arms": ring_only},
    ]  # fmt: skip
    path = tmp_path / "probe.json"
    path.write_text(json.dumps({"rows": rows}))
    first, second = probe_tma_ring.summary(str(path))
    assert "ring 7.5 us" in first and "best ws_w8_s4_p1 5.0 us" in first and first.endswith("1.500"), first
    assert "M=16" in second and "best None" in second and second.endswith("-"), second


def _inductor_body(launches_inside_loop: bool):
    """A kernel body as inductor's PDL codegen leaves it before ``_filter_pdl``: the wait hoisted
    before a reduction loop, a wait and a launch after each load (inside the loop or after it),
    a deferred line (not a string) among them, the stores last."""
    from torch._inductor.utils import DeferredLineBase, IndentedBuffer

    class Deferred(DeferredLineBase):
        def __call__(self):
            return self.line

        def _new_line(self, line):
            return Deferred(line)

    body = IndentedBuffer()
    body.writeline("xoffset = tl.program_id(0) * XBLOCK")
    body.writeline(inductor_trigger.WAIT)
    body.writeline("for r0_offset in range(0, r0_numel, R0_BLOCK):")
    with body.indent():
        body.writeline("tmp0 = tl.load(in_ptr0 + r0_index)")
        if launches_inside_loop:
            body.writeline(inductor_trigger.WAIT)
            body.writeline(inductor_trigger.LAUNCH)
    body.writeline(inductor_trigger.WAIT)
    body.writeline(inductor_trigger.LAUNCH)
    body._lines.append(Deferred("tmp1 = tmp0 * 2"))
    body.writeline("tl.store(out_ptr0 + x0, tmp1)")
    return body


@pytest.mark.parametrize("launches_inside_loop", [False, True])
def test_a_compiled_kernel_lets_the_next_one_start_right_after_its_first_wait(launches_inside_loop, monkeypatch):
    """``inductor_trigger``: inductor's own filter keeps the first wait and the last launch (after
    the loop); installed, the kernel's one launch comes right after its first wait, at its
    indentation, and every other line stays where it was, deferred ones included. A body with no
    wait keeps its lines, and installing twice wraps inductor once."""
    import torch._functorch.config as functorch
    from torch._inductor import config as inductor
    from torch._inductor.codegen.triton import TritonKernel

    kernel = type("Kernel", (), {"GDC_WAIT": TritonKernel.GDC_WAIT, "GDC_LAUNCH": TritonKernel.GDC_LAUNCH})()
    assert (inductor_trigger.WAIT, inductor_trigger.LAUNCH) == (kernel.GDC_WAIT, kernel.GDC_LAUNCH)
    inductors = _inductor_body(launches_inside_loop)
    TritonKernel._filter_pdl(kernel, inductors)
    before = [line if isinstance(line, str) else line() for line in inductors._lines]
    assert before.count(inductor_trigger.WAIT) == 1 and before.count(inductor_trigger.LAUNCH) == 1
    assert before.index(inductor_trigger.LAUNCH) == len(before) - 3, "inductor's: after the loop's loads"

    monkeypatch.setattr(TritonKernel, "_filter_pdl", TritonKernel._filter_pdl)
    with inductor.patch(fx_graph_cache=True), functorch.patch(enable_autograd_cache=True):
        inductor_trigger.install()
        wrapped = TritonKernel._filter_pdl
        inductor_trigger.install()
        assert TritonKernel._filter_pdl is wrapped, "installed once"
        assert not inductor.fx_graph_cache and not functorch.enable_autograd_cache, "caches that would not see it"
    ours = _inductor_body(launches_inside_loop)
    TritonKernel._filter_pdl(kernel, ours)
    after = [line if isinstance(line, str) else line() for line in ours._lines]
    wait = after.index(inductor_trigger.WAIT)
    assert after[wait + 1] == inductor_trigger.LAUNCH and after.count(inductor_trigger.LAUNCH) == 1
    assert [line for line in after if line != inductor_trigger.LAUNCH] == [
        line for line in before if line != inductor_trigger.LAUNCH
    ], "every other line in its place"
    assert not isinstance(ours._lines[-2], str), "a deferred line stays one"

    indented = ["x = 1", "    " + inductor_trigger.WAIT, "    y = 2", "    " + inductor_trigger.LAUNCH]
    assert inductor_trigger.trigger_after_wait(indented) == [
        "x = 1", "    " + inductor_trigger.WAIT, "    " + inductor_trigger.LAUNCH, "    y = 2"
    ]  # fmt: skip
    no_wait = ["x = 1", inductor_trigger.LAUNCH, "y = 2"]
    assert inductor_trigger.trigger_after_wait(no_wait) == no_wait


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inductor emits PDL only for CUDA devices")
def test_a_projection_after_an_early_triggering_compiled_kernel_gives_every_bit_it_gave_before(monkeypatch):
    """A compiled norm, a seated projection launched with PDL after it, and a compiled activation
    after that, inductor's kernels generated with the trigger right after their wait: every
    kernel inductor generated triggers there, and the output is the same bits as with inductor's
    own trigger, run as compiled and replayed in a CUDA graph."""
    import torch._functorch.config as functorch
    from flashrt.kernels import nvfp4, ops
    from torch._inductor import config as inductor
    from torch._inductor.codegen.triton import TritonKernel
    from torch._inductor.utils import run_and_get_code

    q = ops.for_serving(nvfp4.quantize(torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.02))
    g = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    x, r = (torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def block(x, r):
        h = x + r
        normed = (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype) * g
        return torch.nn.functional.silu(ops.linear(normed, q)), h

    monkeypatch.setattr(TritonKernel, "_filter_pdl", TritonKernel._filter_pdl)
    outputs = []
    with (
        inductor.patch({"triton.enable_pdl": True, "fx_graph_cache": False}),  # a cache hit compiles nothing to read
        functorch.patch(enable_autograd_cache=False),
    ):
        for early in (False, True):
            if early:
                inductor_trigger.install()
            torch._dynamo.reset()
            program = torch.compile(block, fullgraph=True)
            (y, h), sources = run_and_get_code(program, x, r)
            kernels = [s for s in "".join(sources).split("@triton.jit")[1:] if inductor_trigger.WAIT in s]
            assert kernels, "inductor launched its kernels with PDL"
            for source in kernels:
                lines = [line.strip() for line in source.splitlines()]
                assert lines.count(inductor_trigger.LAUNCH) <= 1, source
                assert not early or lines[lines.index(inductor_trigger.WAIT) + 1] == inductor_trigger.LAUNCH, source
            static = program(x, r)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static = program(x, r)
            for out in static:
                out.fill_(float("nan"))
            graph.replay()
            assert all(torch.equal(a, b) for a, b in zip(static, (y, h), strict=True)), "replayed"
            outputs.append(y)
    assert torch.equal(outputs[0], outputs[1])


def test_the_norm_bound_probe_leaves_out_only_what_it_names_and_puts_it_back():
    """``bench/probe_norm_bound.py``'s arms: with the add-norms left out no norm runs, with the
    activation too no SiLU runs and the merged gate-up group still lets go of its GEMM; restored,
    the model computes what it did, bit for bit."""
    from flashrt.bench import probe_norm_bound

    model = _tiny("dense")
    e2e.merge_projections(model)
    ids = torch.randint(0, 512, (2, 5))
    with torch.no_grad():
        served = model(ids).logits
    calls = {"norm": 0, "act": 0}

    def count(kind):
        return lambda *_: calls.__setitem__(kind, calls[kind] + 1)

    for layer in model.model.layers:
        layer.input_layernorm.register_forward_hook(count("norm"))
        layer.post_attention_layernorm.register_forward_hook(count("norm"))
        layer.mlp.act_fn.register_forward_hook(count("act"))
    for activation, expected in ((False, {"norm": 0, "act": 2}), (True, {"norm": 0, "act": 0})):
        calls.update(norm=0, act=0)
        probe_norm_bound.leave_out(model, activation)
        with torch.no_grad():
            left_out = model(ids).logits
        assert calls == expected and not torch.equal(left_out, served)
        assert all(layer.mlp.gate_proj.group.input is None for layer in model.model.layers)
        probe_norm_bound.restore(model)
    calls.update(norm=0, act=0)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, served)
    assert calls == {"norm": 4, "act": 2}


def test_the_norm_bound_probe_takes_each_ratio_against_its_own_bf16_arm():
    """The served ratio from the mean of the two served arms, each left-out arm's from its own
    step, all against the bf16 step measured first in the same process."""
    from flashrt.bench import probe_norm_bound

    bf16, steps = random.uniform(3, 5), [random.uniform(1.5, 2.5) for _ in range(4)]
    arms = ["served", "no add-norm", "no add-norm, no activation", "served"]
    rows = [{"arm": "bf16", "step_ms": bf16}] + [{"arm": a, "step_ms": s} for a, s in zip(arms, steps, strict=True)]
    assert probe_norm_bound.bounds(rows) == pytest.approx(
        {"served": 2 * bf16 / (steps[0] + steps[3]), "no add-norm": bf16 / steps[1], arms[2]: bf16 / steps[2]}
    )
    assert list(probe_norm_bound.bounds(rows[:2])) == ["served"]


def _profile(kernels: dict[str, tuple[float, float]], idle: float) -> list[dict]:
    """An arm's step profile as ``e2e._kernel_breakdown`` writes it: ``kernels`` name: (us a step,
    us of it overlapping kernels started before)."""
    rows = [{"kernel": k, "us_per_step": us, "overlapped_us_per_step": over} for k, (us, over) in kernels.items()]
    total = sum(us for us, _ in kernels.values())
    busy = total - sum(over for _, over in kernels.values())
    return [*rows, {"kernel": "all", "us_per_step": total, "busy_us_per_step": busy, "idle_us_per_step": idle}]


def _breakdown_row(batch: int, ours_projections_us: float) -> dict:
    """A dense row whose arms share 1000 us a step (attention 600, compiled 380, idle 20) and a
    cuBLAS GEMM no seat takes (10 us), bf16's projections 2000 us, ours ``ours_projections_us``
    (100 of them overlapping the attention before, a PDL launch waiting), weights 8x smaller."""
    shared = {"decode_attention_kernel": (600.0, 0.0), "triton_red_fused_mean_0": (380.0, 0.0)}
    gate = {"void dot_kernel<float, 128>": (10.0, 0.0)}
    bf16 = _profile({"nvjet_sm90_tst_64x8": (2000.0, 0.0), **gate, **shared}, idle=20.0)
    ours = _profile({"nvfp4_linear_mma_gluon_kernel": (ours_projections_us + 100.0, 100.0), **gate, **shared}, 20.0)
    return {
        "model": "llama3-8b",
        "layers": 32,
        "batch": batch,
        "bf16_step_ms": 3.01,
        "ours_step_ms": (ours_projections_us + 1010.0) / 1e3,
        "weight_bytes_bf16": 8e9,
        "weight_bytes_ours": 1e9,
        "bf16_kernels": bf16,
        "ours_kernels": ours,
    }


def test_breakdown_s_ceilings_on_a_step_whose_answers_are_known():
    """The analysis of a step built by hand: the seated kernels each arm pays for alone (a PDL
    launch's wait is the kernel it waits on), the rest, both ceilings and the rest that issue 7's
    target needs, and no rest at all where the seated kernels are slower than the target."""
    from flashrt.bench import breakdown

    a = breakdown.analysis(_breakdown_row(1, ours_projections_us=500.0))
    assert a["ours_by_kind"] == {
        "projections": 500.0,
        "experts": 0.0,
        "cuBLAS": 10.0,
        "attention": 600.0,
        "routing": 0.0,
        "compiled": 380.0,
        "other": 0.0,
        "idle": 20.0,
    }
    assert a["bf16_by_kind"]["projections"] == 2000.0 and a["bf16_by_kind"]["cuBLAS"] == 10.0
    assert (a["seated_bf16_us"], a["seated_ours_us"], a["seated_ratio"]) == (2000.0, 500.0, 4.0)
    assert a["rest_bf16_us"] == pytest.approx(1010.0) and a["rest_ours_us"] == pytest.approx(1010.0)
    assert a["decode"] == pytest.approx(3010 / 1510) and a["target"] == 2.5
    assert a["ceiling_seated_free"] == pytest.approx(3010 / 1010)
    assert a["ceiling_at_byte_ratio"] == pytest.approx(3010 / (1010 + 250))  # 2000 us / 8
    # 2.5x: (3010 - c) / (1510 - c) = 2.5, c = 510 us from each arm's rest; at 8x, from 1260: c = 93.3
    assert a["rest_for_target_us"] == pytest.approx(500.0)
    assert a["seated_ratio_for_target"] == pytest.approx(2000 / (3010 / 2.5 - 1010))  # the rest as it ran
    assert a["rest_for_target_at_byte_ratio_us"] == pytest.approx(1010 - (2.5 * 1260 - 3010) / 1.5)

    slow = breakdown.analysis(_breakdown_row(8, ours_projections_us=1000.0))  # seated 2.0x, the target 2.2x
    assert slow["target"] == 2.2 and slow["rest_for_target_us"] is None
    assert slow["rest_for_target_at_byte_ratio_us"] == pytest.approx(1010 - (2.2 * 1260 - 3010) / 1.2)
    assert breakdown.analysis(_breakdown_row(4, 500.0))["rest_for_target_us"] is None  # no target at 4
    # bf16's step 2400 us: 2.5x is 960 us, under the rest alone; free seated kernels would not do
    assert breakdown.analysis(_breakdown_row(1, 500.0) | {"bf16_step_ms": 2.4})["seated_ratio_for_target"] is None
    assert "| out of reach / " in breakdown.table([_breakdown_row(8, 1000.0) | {"device": "H200", "commit": "0" * 7}])


def test_breakdown_kinds_cover_every_committed_profile():
    """In every profiled row of the committed tables' runs, each arm's kinds add up to its
    profiled step, the seated arm's own kernels are seated kinds and bf16's are not, and the
    kernels no kind names (ATen's copies and fills, those past the 25 longest) stay under 8% of
    either arm's step (Qwen3.5's at one token: 6.7%)."""
    from flashrt.bench import breakdown

    rows = breakdown.committed_rows()
    assert {(r["device"][:11], r["model"]) for r in rows} >= {
        ("NVIDIA H200", "llama3-8b"),
        ("NVIDIA H200", "qwen3-30b-a3b"),
        ("NVIDIA H100", "qwen3-30b-a3b"),
    }
    for row in rows:
        for arm in ("bf16_kernels", "ours_kernels"):
            total = next(k for k in row[arm] if k["kernel"] == "all")
            kinds = breakdown.by_kind(row[arm])
            assert sum(kinds.values()) == pytest.approx(total["busy_us_per_step"] + total["idle_us_per_step"])
            assert kinds["other"] < 0.08 * sum(kinds.values()), (row["source"], row["batch"], arm)
        names = {k["kernel"] for k in row["ours_kernels"]}
        assert all(breakdown.kind(n) in breakdown.SEATED for n in names if n.startswith(("nvfp4_", "moe_")))
        assert not any(breakdown.kind(k["kernel"]) == "projections" for k in row["bf16_kernels"])
        a = breakdown.analysis(row)
        assert a["ceiling_seated_free"] > a["ceiling_at_byte_ratio"] > 1


def test_the_docs_breakdown_is_the_committed_profiles():
    """docs/benchmarks.md's tables of what the targets ask are ``python -m flashrt.bench breakdown``'s
    output on the committed runs, character for character."""
    from pathlib import Path

    from flashrt.bench import breakdown

    docs = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    assert breakdown.table(breakdown.committed_rows()) in docs


def test_breakdown_without_a_profile_names_the_fields_and_the_flag(tmp_path, capsys):
    import json

    from flashrt.bench import breakdown, merge

    run = json.loads((merge.RESULTS / "h200-e2e-qwen35-7c5f6d1-l8-b4.json").read_text())
    assert run["rows"] and not any(breakdown.profiled(r) for r in run["rows"])
    assert breakdown.main([str(merge.RESULTS / "h200-e2e-qwen35-7c5f6d1-l8-b4.json")]) == 2
    err = capsys.readouterr().err
    assert "bf16_kernels, ours_kernels" in err and "--profile-batches" in err
    assert breakdown.main([str(merge.RESULTS / "h200-e2e-llama-c8396f9-b1b8.json")]) == 0
    out = capsys.readouterr().out
    assert "| H200 | llama3-8b, 32 | 8 |" in out and "c8396f9" in out
