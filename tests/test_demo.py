"""Both demos are run as tests: what the README promises runs."""

import subprocess
import sys
from pathlib import Path

import pytest

FLASHRT = str(Path(sys.executable).with_name("flashrt"))


def test_vllm_serve_demo_seats_and_reports():
    pytest.importorskip("vllm")
    done = subprocess.run([FLASHRT, "demo"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "[5/5] stopping the server" in out
    assert 'flashrt_seats{kind="experts",state="seated"} 2.0' in out
    assert 'flashrt_seat_calls_total{kind="dense"}' in out


def test_transformers_demo_prints_the_seat_table():
    command = [FLASHRT, "demo", "--engine", "transformers", "--tokens", "4"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dense    seated" in done.stdout and "head     seated" in done.stdout
