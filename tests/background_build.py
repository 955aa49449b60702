"""The ahead-of-time kernel builds of ``test_build.py`` (its docstring says why they run in the
background), started once a test session by the process that outlives every test: pytest itself,
or xdist's controller when ``make test`` spreads the suite over workers. A worker can be shut
down while another still runs tests, so no worker owns the build; each reads its output from a
directory, where ``returncode`` appears when the build ends."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def compile_env() -> dict:
    """The environment of every compile here. Triton's cache key holds the variables that change
    code, ``TRITON_DEFAULT_FP_FUSION`` among them: with one environment the checks after the
    builds find their kernels in the cache (cold, they compiled them again: 4 minutes)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    return env


def start(directory: Path) -> None:
    """Build every target in one process at the lowest CPU priority, once per ``directory``."""
    directory.mkdir(exist_ok=True)
    try:
        log = (directory / "log").open("x")
    except FileExistsError:
        return
    from flashrt.kernels.build import TARGETS  # here: conftest.py sets TRITON_INTERPRET before any kernel imports

    command = ["nice", "-n", "19", sys.executable, "-m", "flashrt.kernels.build", "--pairwise", *map(str, TARGETS)]
    proc = subprocess.Popen(command, env=compile_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
    atexit.register(proc.kill)  # a session cut short leaves no build behind

    def record_end() -> None:
        (directory / "returncode.part").write_text(str(proc.wait()))
        (directory / "returncode.part").rename(directory / "returncode")

    threading.Thread(target=record_end, daemon=True).start()


def output(directory: Path) -> str:
    """What the builds printed, once they ended (started here if no one started them)."""
    start(directory)
    while not (directory / "returncode").exists():
        time.sleep(1)
    return (directory / "log").read_text()
