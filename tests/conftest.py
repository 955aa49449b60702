"""Kernel tests run on a CUDA device when there is one, else under Triton's interpreter.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` runs, hence here, first.
"""

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import background_build
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def late_writer():
    """``late_writer.late_writer``: lets its PDL dependents start at once, then writes late."""
    from late_writer import late_writer

    return late_writer


@pytest.fixture(scope="session")
def same_bits_eager_and_replayed():
    """``check(step, out, expected)``: ``step`` run eagerly, then captured in a CUDA graph and
    replayed on a poisoned ``out``; each time ``out`` is ``expected`` bit for bit."""

    def check(step, out: torch.Tensor, expected: torch.Tensor) -> None:
        step()
        assert torch.equal(out, expected), "eager"
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        out.fill_(float("nan"))
        graph.replay()
        assert torch.equal(out, expected), "replayed"

    return check


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """Fresh random inputs in every test and every run; a failure prints the seed to replay it."""
    import random

    seed = int(os.environ.get("FLASHRT_TEST_SEED", random.SystemRandom().randrange(2**31)))
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        print(f"replay with FLASHRT_TEST_SEED={seed}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.rep_call = report
    return report


_BUILD_DIR = pytest.StashKey[Path]()


def _is_build(nodeid: str) -> bool:
    """A test of ``test_build.py``: its node id, as the controller and the workers both see it."""
    return nodeid.split("::")[0].endswith("test_build.py")


def pytest_configure(config):
    """One build directory a session: xdist's controller makes it and hands it to its workers."""
    given = getattr(config, "workerinput", {}).get("flashrt_build_dir")
    config.stash[_BUILD_DIR] = Path(given or Path(tempfile.gettempdir()) / f"flashrt-build-{uuid.uuid4().hex}")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["flashrt_build_dir"] = str(node.config.stash[_BUILD_DIR])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The controller starts the builds when a worker has collected their tests."""
    if any(map(_is_build, ids)):
        background_build.start(node.config.stash[_BUILD_DIR])


@pytest.fixture(scope="session")
def build_dir(pytestconfig) -> Path:
    return pytestconfig.stash[_BUILD_DIR]


# The files that start vLLM engines, with their seconds on two workers (3a57f9a, 2 cores). They go
# first, longest first: a worker takes a file at a time (``make test``'s ``--dist loadfile``), and
# the suite lasts as long as the file a worker starts last. Alphabetically they came last.
_ENGINE_FILES = {"test_vllm_server.py": 567, "test_vllm.py": 289, "test_demo.py": 106, "test_vllm_discovery.py": 23}


def pytest_collection_modifyitems(config, items):
    """The engine files first; the ahead-of-time kernel builds started now, in the background,
    unless xdist's controller does, and checked last (tests/test_build.py says why)."""
    items.sort(key=lambda item: -_ENGINE_FILES.get(item.path.name, 0))
    builds = [item for item in items if _is_build(item.nodeid)]
    if builds and not config.option.collectonly:
        if not hasattr(config, "workerinput"):
            background_build.start(config.stash[_BUILD_DIR])
        last = set(builds)
        items[:] = [item for item in items if item not in last] + builds


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        shutil.rmtree(config.stash[_BUILD_DIR], ignore_errors=True)
