"""Seats on real transformers models built from small configs with random weights (CPU, reference kernels)."""

import dataclasses
import hashlib

import pytest
import torch
import torch.nn.functional as F
from flashrt.kernels import moe_ring_gluon, ops, ring_layout
from flashrt.runtime import SeatProfile, attach, discover, from_env
from flashrt.runtime.metrics import render


def _llama(tied: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=tied,
    )  # fmt: skip
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _qwen3_moe(moe_intermediate_size: int = 128):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=512, moe_intermediate_size=moe_intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
        max_position_embeddings=128,
    )  # fmt: skip
    return Qwen3MoeForCausalLM(config).to(torch.bfloat16).eval()


def _fingerprint(model: torch.nn.Module) -> dict:
    """Every module and parameter object, and a checksum of every parameter's and buffer's bytes."""
    digest = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
        digest[name] = (
            id(t),
            tuple(t.shape),
            hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy()).hexdigest(),
        )
    digest["__modules__"] = [(n, id(m), type(m).__name__, "forward" in m.__dict__) for n, m in model.named_modules()]
    return digest


# Random Gaussian weights have no trained structure: one NVFP4 projection reaches a cosine of
# about 0.995 against bf16, an expert bank (two chained GEMMs and a gate) about 0.987, and two
# layers of them 0.965-0.985 at the logits. The design's 0.99 floor is for trained weights; these
# tests hold the seats to 0.98 and the whole model to 0.95; a wrong layout or scale gives ~0.
FLOOR = 0.98
MODEL_FLOOR = 0.95
PROFILE = SeatProfile(min_params=0, parity_floor=FLOOR)


@pytest.mark.parametrize("make", [_llama, _qwen3_moe])
def test_detach_gives_back_the_model_bit_for_bit(make):
    model = make()
    before = _fingerprint(model)
    handle = attach(model, PROFILE)
    assert handle.summary()["seams"] > 0
    assert _fingerprint(model) != before
    handle.detach()
    assert _fingerprint(model) == before


def _recording(fn, into: list):
    """``fn``, each of its results also appended to ``into``."""

    def call(*args):
        into.append(fn(*args))
        return into[-1]

    return call


@pytest.mark.parametrize(
    ("make", "banks", "bank_layout"),
    [(_llama, 0, None), (_qwen3_moe, 2, ring_layout.CHECKPOINT), (lambda: _qwen3_moe(256), 2, ring_layout.RING)],
)
def test_seats_in_the_ring_layout_compute_the_checkpoints_numbers_and_detach_bit_for_bit(
    make, banks, bank_layout, monkeypatch
):
    """Where the device serves ``ring_layout`` (Hopper; forced here), projections and the LM head
    (K = 256: whole ring steps) are seated in it, and a bank where its inter size is whole ring
    steps (256, not 128) and the band sends it at most the ring form's rows; on the CPU the
    reference reads either layout, so the logits are the checkpoint layout's bit for bit, and
    detach gives the model back."""
    prompt = torch.randint(0, 1024, (2, 12))
    model = make()
    profile = dataclasses.replace(PROFILE, moe_band_t=moe_ring_gluon.MAX_TOKENS)  # both arms' banks serve the 24 rows
    handle = attach(model, profile)
    with torch.no_grad():
        checkpoint_logits = model(prompt).logits
    handle.detach()
    before = _fingerprint(model)
    dense, bank_pairs = [], []
    monkeypatch.setattr(ops, "for_serving", _recording(ops.for_serving, dense))
    monkeypatch.setattr(ops, "bank_for_serving", _recording(ops.bank_for_serving, bank_pairs))
    monkeypatch.setattr(ops, "_ring_layout_serves", lambda device: True)
    handle = attach(model, profile)
    with torch.no_grad():
        ring_logits = model(prompt).logits
    assert dense and all(w.layout == ring_layout.RING for w in dense)
    assert len(bank_pairs) == banks and all(w.layout == bank_layout for pair in bank_pairs for w in pair)
    assert torch.equal(ring_logits, checkpoint_logits)
    handle.detach()
    assert _fingerprint(model) == before


def test_discovery_is_structural_and_smallest_first():
    specs = discover(_qwen3_moe(), PROFILE)
    kinds = {s.kind for s in specs}
    assert kinds == {"dense", "experts", "head"}
    assert [s.params for s in specs] == sorted(s.params for s in specs)
    assert not any(s.name.rsplit(".", 1)[-1] == "gate" for s in specs), "the router is not a projection"
    assert not any("embed" in s.name for s in specs)


def test_a_router_beside_an_expert_bank_is_never_a_seat():
    """A router written as a plain ``nn.Linear`` (one output per expert) and a shared expert's
    one-output gate stay bf16; a projection of the same size elsewhere is a seat."""
    hidden, experts = 64, 4
    block = torch.nn.Module()
    block.experts = torch.nn.Module()
    block.experts.gate_up_proj = torch.nn.Parameter(torch.randn(experts, 64, hidden))
    block.experts.down_proj = torch.nn.Parameter(torch.randn(experts, hidden, 32))
    block.gate = torch.nn.Linear(hidden, experts, bias=False)
    block.shared_expert_gate = torch.nn.Linear(hidden, 1, bias=False)
    model = torch.nn.Module()
    model.mlp = block
    model.proj = torch.nn.Linear(hidden, experts, bias=False)
    names = {s.name: s.kind for s in discover(model, SeatProfile(min_params=0))}
    assert names == {"mlp.experts": "experts", "proj": "dense"}, names


def test_profile_filters_kinds_names_and_size():
    model = _llama()
    only_mlp = discover(model, SeatProfile(min_params=0, kinds=("dense",), include=("*.mlp.*",)))
    assert only_mlp and all(".mlp." in s.name and s.kind == "dense" for s in only_mlp)
    assert not discover(model, SeatProfile(min_params=10**9))
    assert all("down_proj" not in s.name for s in discover(model, SeatProfile(min_params=0, exclude=("*down_proj",))))


@pytest.mark.parametrize("make", [_llama, _qwen3_moe])
def test_seated_generation_keeps_parity_with_the_host(make):
    model = make()
    prompt = torch.randint(0, 1024, (2, 12))
    with torch.no_grad():
        host_logits = model(prompt).logits
    handle = attach(model, PROFILE)
    with torch.no_grad():
        seated_logits = model(prompt).logits
        generated = model.generate(prompt, max_new_tokens=6, do_sample=False)
    assert generated.shape == (2, 18)
    cos = F.cosine_similarity(seated_logits.float().flatten(1), host_logits.float().flatten(1), dim=1)
    assert (cos >= MODEL_FLOOR).all(), cos
    summary = handle.summary()
    assert summary["calls"] > 0 and summary["fallbacks"] == 0 and summary["never_called"] == 0
    handle.detach()


@pytest.mark.parametrize("make", [_llama, _qwen3_moe])
def test_a_seated_model_compiles_as_one_graph_and_computes_the_same(make):
    """Seats are opaque ops to dynamo, so ``torch.compile`` (what a serving loop wraps a model
    in) traces the seated model whole, with the shapes the ops declare."""
    model = make()
    handle = attach(model, PROFILE)
    prompt = torch.randint(0, 1024, (2, 12))
    calls = handle.summary()["calls"]
    with torch.no_grad():
        eager = model(prompt).logits
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)(prompt).logits
    assert torch.equal(compiled, eager)
    assert handle.summary()["calls"] > calls, "the compiled graph calls the seats"
    handle.detach()


def _flashrt_ops_called(fn) -> set[str]:
    """The ``flashrt::`` ops the dispatcher saw while ``fn`` ran (the profiler records each op
    call; it is a callback, not a dispatch mode, so it does not change which path a call takes)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith("flashrt::")}


@pytest.mark.parametrize("make", [_llama, _qwen3_moe])
def test_eager_calls_skip_the_dispatcher_and_compiled_graphs_call_the_ops(make):
    """Eager serving pays every ``torch.library`` hop in host time, a compiled graph must see
    the opaque ops: the same seat serves both, and counts both."""
    model = make()
    handle = attach(model, PROFILE)
    prompt = torch.randint(0, 1024, (1, 5))
    with torch.no_grad():
        calls = handle.summary()["calls"]
        assert _flashrt_ops_called(lambda: model(prompt)) == set()
        assert handle.summary()["calls"] > calls
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        compiled(prompt)  # traced here, outside the profile
        seen = _flashrt_ops_called(lambda: compiled(prompt))
    assert "flashrt::served_linear" in seen
    assert ("flashrt::served_moe" in seen) == (make is _qwen3_moe)
    handle.detach()


def test_fake_tensors_take_the_ops_fake_implementations():
    """Under a dispatch mode (fake tensors: shape propagation, memory planning) a seat must not
    run its body: it would count a call that never computed and launch on tensors with no data."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = torch.nn.Sequential(torch.nn.Linear(64, 48, dtype=torch.bfloat16))
    handle = attach(layer, SeatProfile(min_params=0))
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:  # the bias stays real
        out = layer(mode.from_tensor(torch.randn(3, 64, dtype=torch.bfloat16)))
    assert out.shape == (3, 48) and type(out).__name__ == "FakeTensor"
    assert handle.summary()["calls"] == 0
    handle.detach()


def test_tied_head_keeps_the_embedding_working():
    model = _llama(tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    handle = attach(model, PROFILE)
    head = next(s for s in handle.seats if s.kind == "head")
    assert head.state == "seated" and "tied" in head.reason
    assert model.model.embed_tokens.weight.numel() > 0
    with torch.no_grad():
        model(torch.randint(0, 1024, (1, 4)))
    handle.detach()


def test_untied_head_binds_as_slabs_above_the_row_limit():
    model = _llama(tied=False)
    prompt = torch.randint(0, 1024, (1, 8))
    with torch.no_grad():
        host = model(prompt).logits
    handle = attach(model, SeatProfile(min_params=0, kinds=("head",), head_slab_rows=384, parity_floor=FLOOR))
    assert model.lm_head.weight.numel() == 0, "the bf16 head is freed once seated"
    with torch.no_grad():
        seated = model(prompt).logits
    assert seated.shape == host.shape
    assert F.cosine_similarity(seated.float().flatten(), host.float().flatten(), dim=0) > FLOOR
    handle.detach()
    assert model.lm_head.weight.shape == (1024, 256)


def test_a_refused_seat_leaves_its_layer_untouched():
    model = _llama()
    before = _fingerprint(model)
    handle = attach(model, SeatProfile(min_params=0, parity_floor=1.0))  # NVFP4 never reaches 1.0
    assert handle.summary()["seams"] == 0
    assert all(s.state == "refused" and "parity" in s.reason for s in handle.seats)
    assert _fingerprint(model) == before
    assert "flashrt_no_seats 1.0" in render()


def test_a_seat_whose_parity_is_nan_is_refused():
    """A NaN in a weight makes the host's calibration output NaN, and the cosine NaN: no
    comparison with it is true, so until session 57 it passed the floor and the layer was
    seated. It is refused, and the layer stays the host's."""
    model = _llama()
    weight = model.model.layers[0].mlp.down_proj.weight
    with torch.no_grad():
        weight[0, 0] = float("nan")
    before = _fingerprint(model)
    handle = attach(model, SeatProfile(min_params=0, kinds=("dense",), parity_floor=FLOOR))
    seat = next(s for s in handle.seats if s.name.endswith("layers.0.mlp.down_proj"))
    assert seat.state == "refused" and seat.reason == f"parity nan under the floor {FLOOR}", seat.reason
    assert any(s.state == "seated" for s in handle.seats), "the other layers are seated"
    handle.detach()
    assert _fingerprint(model) == before


def test_strict_profile_raises_with_the_reasons_and_leaves_the_model_as_it_was():
    model = _llama()
    before = _fingerprint(model)
    with pytest.raises(RuntimeError, match=r"strict profile and nothing could be seated: .*parity"):
        attach(model, SeatProfile(min_params=0, parity_floor=1.0, strict=True))
    assert _fingerprint(model) == before


def test_a_seam_that_raises_falls_back_then_detaches_itself():
    model = _llama()
    handle = attach(model, SeatProfile(min_params=0, kinds=("dense",), max_faults=2, parity_floor=FLOOR))
    victim = next(s for s in handle.seats if s.name.endswith("layers.0.mlp.down_proj"))
    healthy = victim.seam
    calls = {"n": 0}

    def faulty(x, bias):  # raises on its second call and every call after
        calls["n"] += 1
        if calls["n"] >= 2:
            raise RuntimeError("injected fault")
        return healthy(x, bias)

    victim.seam = faulty
    prompt = torch.randint(0, 1024, (1, 6))
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 10), "every step still completes"
    assert victim.calls == 1 and victim.fallbacks == 2 and victim.state == "self_detached"
    assert "forward" not in victim.spec.module.__dict__ and victim.spec.module.weight.numel() > 0
    text = render()
    assert 'flashrt_seat_fallbacks_total{kind="dense",reason="RuntimeError"}' in text
    assert 'flashrt_seat_self_detached_total{kind="dense"}' in text
    assert handle.summary()["self_detached"] == 1
    handle.detach()


def test_metric_values_equal_the_calls_made():
    from prometheus_client import REGISTRY

    def calls(kind):
        return REGISTRY.get_sample_value("flashrt_seat_calls_total", {"kind": kind}) or 0.0

    model = _qwen3_moe()
    handle = attach(model, PROFILE)
    before = {k: calls(k) for k in ("dense", "experts", "head")}
    with torch.no_grad():
        model(torch.randint(0, 1024, (1, 5)))
    dense = sum(1 for s in handle.seats if s.kind == "dense" and s.state == "seated")
    experts = sum(1 for s in handle.seats if s.kind == "experts" and s.state == "seated")
    assert calls("dense") - before["dense"] == dense  # one forward: each projection once
    assert calls("experts") - before["experts"] == experts
    assert calls("head") - before["head"] == 1
    assert REGISTRY.get_sample_value("flashrt_seats", {"kind": "experts", "state": "seated"}) == experts
    handle.detach()


def test_kernel_choices_are_counted_by_source_from_the_attach_on(tmp_path, monkeypatch):
    """``attach`` wires the tuner to ``flashrt_kernel_choices_total``: each source's series is
    there from the attach, at zero, and every choice made after it (serving meets new token
    counts) is counted under its source: measured here, then this node's."""
    from flashrt.kernels.tuning import SOURCES, TUNER, Outcome, candidate
    from prometheus_client import REGISTRY

    def counted():
        return {s: REGISTRY.get_sample_value("flashrt_kernel_choices_total", {"source": s}) for s in SOURCES}

    monkeypatch.setenv("FLASHRT_CACHE_DIR", str(tmp_path))
    handle = attach(_qwen3_moe(), PROFILE)
    before = counted()
    assert None not in before.values()
    gemv = candidate("gemv", {"BLOCK_N": 8})
    for _ in range(2):
        TUNER.choose("test-gpu", "linear:M1:counted", [gemv], lambda c: Outcome(c, 1.0, 1.0), may_measure=True)
    after = counted()
    assert {s: after[s] - before[s] for s in SOURCES} == {"measured": 1, "node": 1, "shipped": 0}
    handle.detach()


def test_a_bad_shipped_choices_switch_stops_the_attach_before_any_seat(monkeypatch):
    monkeypatch.setenv("FLASHRT_SHIPPED_CHOICES", "yes")
    model = _qwen3_moe()
    with pytest.raises(ValueError, match=r"FLASHRT_SHIPPED_CHOICES='yes': use 1 .* or 0"):
        attach(model, PROFILE)
    assert not [name for name, m in model.named_modules() if "forward" in vars(m)], "no seat was bound"
    monkeypatch.setenv("FLASHRT_SHIPPED_CHOICES", "0")
    handle = attach(model, PROFILE)
    assert [name for name, m in model.named_modules() if "forward" in vars(m)], "0 is a value"
    handle.detach()


def test_expert_rows_above_the_band_go_to_the_retained_host_bank():
    model = _qwen3_moe()
    handle = attach(model, SeatProfile(min_params=0, kinds=("experts",), moe_band_t=4, parity_floor=FLOOR))
    seat = handle.seats[0]
    with torch.no_grad():
        model(torch.randint(0, 1024, (1, 3)))  # 3 rows: the packed bank
        served = seat.calls
        model(torch.randint(0, 1024, (1, 9)))  # 9 rows: above the band, the host bank
    assert served > 0 and seat.calls == served
    handle.detach()


def test_an_unset_band_is_the_devices_own(monkeypatch):
    """No ``moe_band_t`` in the profile: the bank serves up to ``ops.moe_band`` of its device's
    rows (16 on this CPU, 64 where the ring forms serve), and the seat's report says which."""
    model = _qwen3_moe()
    monkeypatch.setattr(ops, "moe_band", lambda device: 5)
    handle = attach(model, SeatProfile(min_params=0, kinds=("experts",), parity_floor=FLOOR))
    seat = handle.seats[0]
    assert seat.profile.moe_band_t == 5 and seat.reason.startswith("band 5 rows")
    with torch.no_grad():
        model(torch.randint(0, 1024, (1, 5)))  # 5 rows: the packed bank
        served = seat.calls
        model(torch.randint(0, 1024, (1, 6)))  # 6: above the band, the host bank
    assert served > 0 and seat.calls == served
    handle.detach()


def test_environment_configures_the_profile_and_rejects_bad_values():
    p = from_env({"FLASHRT_KINDS": "dense,head", "FLASHRT_PARITY_FLOOR": "0.995", "FLASHRT_STRICT": "yes",
                  "FLASHRT_ACTIVATIONS": "bf16"})  # fmt: skip
    assert p.kinds == ("dense", "head") and p.parity_floor == 0.995 and p.strict and p.activations == "bf16"
    bad = [
        ({"FLASHRT_KINDS": "dense,attention"}, r"FLASHRT_KINDS='dense,attention': \['attention'\] are not seat kinds"),
        ({"FLASHRT_STRICT": "maybe"}, r"FLASHRT_STRICT='maybe': not a boolean"),
        ({"FLASHRT_MOE_BAND_T": "sixteen"}, r"FLASHRT_MOE_BAND_T='sixteen': not an integer"),
        ({"FLASHRT_PARITY_FLOOR": "1.5"}, r"FLASHRT_PARITY_FLOOR: 1.5 is outside \(0, 1\]"),
        ({"FLASHRT_STICT": "1"}, r"FLASHRT_STICT: not a flashrt variable"),
        ({"FLASHRT_ACTIVATIONS": "fp8"}, r"FLASHRT_ACTIVATIONS='fp8': use one of auto, bf16, nvfp4"),
    ]
    for env, message in bad:
        with pytest.raises(ValueError, match=message):
            from_env(env)


CHILD = """
import torch
from flashrt.runtime import SeatProfile, attach
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128)).to(torch.bfloat16)
handle = attach(model, SeatProfile(min_params=0, parity_floor=0.98))
with torch.no_grad():
    for _ in range({steps}):
        model(torch.randn(3, 128, dtype=torch.bfloat16))
print(handle.summary()["seams"])
"""


def test_metrics_from_several_processes_add_up_in_multiprocess_mode(tmp_path):
    import os
    import subprocess
    import sys

    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    for steps in (2, 5):
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(steps=steps)], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "2"
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    assert registry.get_sample_value("flashrt_seat_calls_total", {"kind": "dense"}) == 2 * (2 + 5)
    text = generate_latest(registry).decode()
    assert "flashrt_weight_bytes" in text and "flashrt_runtime_info" in text


def test_serve_exposes_the_metrics_over_http():
    import socket
    import urllib.request

    from flashrt.runtime.metrics import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, _ = serve(port, addr="127.0.0.1")
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "flashrt_seats" in body
    finally:
        server.shutdown()


def test_metric_files_of_dead_processes_are_cleaned_at_start(tmp_path):
    import os
    import subprocess
    import sys

    from flashrt.runtime.vllm_plugin import clean_stale_metrics

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, live_pid = int(dead.stdout), os.getpid()
    for name in (f"counter_{dead_pid}.db", f"gauge_livesum_{dead_pid}.db", f"counter_{live_pid}.db", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    removed = clean_stale_metrics(str(tmp_path))
    assert sorted(removed) == sorted([f"counter_{dead_pid}.db", f"gauge_livesum_{dead_pid}.db"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"counter_{live_pid}.db", "notes.txt"])


def test_the_plugin_does_nothing_unless_enabled(monkeypatch):
    import importlib

    from flashrt.runtime import vllm_plugin

    calls = []
    monkeypatch.setattr(importlib, "import_module", lambda name: calls.append(name))
    monkeypatch.delenv("FLASHRT_ENABLE", raising=False)
    vllm_plugin.register()
    monkeypatch.setenv("FLASHRT_ENABLE", "0")
    vllm_plugin.register()
    assert calls == []


@pytest.mark.parametrize(
    ("device_type", "mode", "seated", "warns"),
    [
        ("cuda", "NONE", True, True),  # enforce_eager: vLLM sets cudagraph_mode none
        ("cuda", "FULL_AND_PIECEWISE", True, False),  # vLLM's default: decode replayed from graphs
        ("cuda", "NONE", False, False),  # nothing seated, nothing slower
        ("cpu", "NONE", True, False),  # the CPU backend has no graphs to choose
    ],
)
def test_a_gpu_engine_that_decodes_eagerly_is_told_seats_can_slow_it(
    device_type, mode, seated, warns, monkeypatch, caplog
):
    """After seating, a GPU runner without CUDA graphs gets a warning naming the cause and the fix:
    eager seated calls cost more host time than bf16's, so eager decode can get slower."""
    import enum
    import types

    from flashrt.runtime import vllm_plugin, vllm_seats

    Mode = enum.Enum("CUDAGraphMode", ["NONE", "PIECEWISE", "FULL_AND_PIECEWISE"])  # vLLM's is an enum
    seats = [types.SimpleNamespace(state="seated" if seated else "refused")]
    monkeypatch.setattr(vllm_seats, "attach_vllm", lambda model, profile: types.SimpleNamespace(seats=seats))
    monkeypatch.delenv("FLASHRT_METRICS_PORT", raising=False)

    class Runner:
        def __init__(self):
            self.device = torch.device(device_type)
            self.compilation_config = types.SimpleNamespace(cudagraph_mode=Mode[mode])

        def load_model(self):
            self.model = torch.nn.Linear(4, 4)
            return "loaded"

    load = vllm_plugin._seating(Runner.load_model)
    with caplog.at_level("WARNING", logger="flashrt"):
        assert load(Runner()) == "loaded"
    warned = [r.getMessage() for r in caplog.records if "without CUDA graphs" in r.getMessage()]
    assert len(warned) == warns
    if warns:
        assert "drop enforce_eager" in warned[0] and "flashrt.io/inject" in warned[0]
    assert vllm_plugin.eager_decode_warning("cuda", "NONE") and not vllm_plugin.eager_decode_warning("cuda", None)
