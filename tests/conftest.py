"""Kernel tests run on a CUDA device when there is one, else under Triton's interpreter.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` runs, hence here, first.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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


def pytest_collection_modifyitems(config, items):
    """Start the ahead-of-time kernel builds now, in the background, and check them last
    (tests/test_build.py says why)."""
    builds = [item for item in items if hasattr(getattr(item, "module", None), "start_background_build")]
    if builds and not config.option.collectonly:
        builds[0].module.start_background_build()
        last = set(builds)
        items[:] = [item for item in items if item not in last] + builds
