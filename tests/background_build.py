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


# Where ``make test`` puts the H200's Triton (torch 2.11's 3.6; the Makefile's ``H200_TRITON``)
# beside the suite's own. Gluon's API moves between releases: at 0d80628 the folded split-K sum
# built with the suite's Triton and failed on the H200's (a layout handed to ``gl.zeros`` not as a
# constexpr), which only a GPU call showed. So the Gluon kernels are built with it too.
H200_TRITON = Path(sys.prefix) / "h200-triton"


def _jobs() -> dict[str, tuple[list[str], dict]]:
    """Each build a session starts: its command and environment, by the directory it reports in."""
    from flashrt.kernels.build import TARGETS  # here: conftest.py sets TRITON_INTERPRET before any kernel imports

    build = ["nice", "-n", "19", sys.executable, "-m", "flashrt.kernels.build", "--pairwise"]
    env = compile_env()
    h200_path = os.pathsep.join(p for p in (str(H200_TRITON), env.get("PYTHONPATH")) if p)
    return {
        "targets": ([*build, *map(str, TARGETS)], env),
        "h200-triton": ([*build, "--gluon", "90"], env | {"PYTHONPATH": h200_path}),
    }


def start(root: Path) -> None:
    """Start every build, once per ``root``, at the lowest CPU priority."""
    root.mkdir(exist_ok=True)
    for name, (command, env) in _jobs().items():
        _start_one(root / name, command, env)


def _start_one(directory: Path, command: list[str], env: dict) -> None:
    directory.mkdir(exist_ok=True)
    try:
        log = (directory / "log").open("x")
    except FileExistsError:
        return
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    atexit.register(proc.kill)  # a session cut short leaves no build behind

    def record_end() -> None:
        (directory / "returncode.part").write_text(str(proc.wait()))
        (directory / "returncode.part").rename(directory / "returncode")

    threading.Thread(target=record_end, daemon=True).start()


def output(root: Path, name: str = "targets") -> str:
    """What build ``name`` printed, once it ended (every build started here if no one started them)."""
    start(root)
    directory = root / name
    while not (directory / "returncode").exists():
        time.sleep(1)
    return (directory / "log").read_text()
