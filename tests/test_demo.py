"""Both demos are run as tests: what the README promises runs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_server import flashrt_samples, value_of

FLASHRT = str(Path(sys.executable).with_name("flashrt"))


def test_vllm_serve_demo_seats_and_reports():
    """The demo is the served MoE engine's test too: both packed banks seated, and every forward
    pass of every request through both (each generated token is one pass)."""
    pytest.importorskip("vllm")
    done = subprocess.run([FLASHRT, "demo"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "[5/5] stopping the server" in out
    assert 'flashrt_seats{kind="experts",state="seated"} 2.0' in out
    # two layers' qkv and o projections; each layer's router (vLLM's GateLinear) stays bf16
    assert 'flashrt_seats{kind="dense",state="seated"} 4.0' in out
    assert 'flashrt_seat_calls_total{kind="dense"}' in out
    samples = flashrt_samples(
        "\n".join(line.strip() for line in out.splitlines() if line.strip().startswith("flashrt_"))
    )
    tokens = sum(int(n) for n in re.findall(r"\((\d+) tokens\)", out))
    assert tokens > 0, out[-3000:]
    assert value_of(samples, "flashrt_seat_calls_total", kind="experts") >= 2 * tokens
    assert not any(k.startswith("flashrt_seat_fallbacks_total") and v for k, v in samples.items())
    # vLLM keeps its bf16 copy beside the packed one: the seated bytes are more than the host's
    host, seated = (value_of(samples, "flashrt_weight_bytes", kind="dense", state=s) for s in ("host", "seated"))
    assert seated > host > 0


def test_transformers_demo_prints_the_seat_table():
    command = [FLASHRT, "demo", "--engine", "transformers", "--tokens", "4"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dense    seated" in done.stdout and "head     seated" in done.stdout
