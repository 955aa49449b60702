"""``flashrt bundle DIR``: the folder the runtime image's init container copies into a pod.

The installed ``flashrt`` package (pure Python; torch and Triton come from the vLLM image) and a
``flashrt-<version>.dist-info`` whose ``entry_points.txt`` registers the vLLM plugin. Put on
``PYTHONPATH`` with nothing installed, vLLM discovers the plugin in every process it starts.
"""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import flashrt

# The operator (kopf) and the benchmarks have no place in a vLLM pod.
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "operator", "bench")


def bundle(target: str | Path) -> Path:
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    package = Path(flashrt.__file__).parent  # not resolve(): an editable install links files, not the folder
    shutil.copytree(package, target / "flashrt", ignore=IGNORE, dirs_exist_ok=True, symlinks=False)
    dist = importlib.metadata.distribution("flashrt")
    info = target / f"flashrt-{dist.version}.dist-info"
    info.mkdir(exist_ok=True)
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: flashrt\nVersion: {dist.version}\n")
    groups: dict[str, list[str]] = {}
    for ep in dist.entry_points:
        groups.setdefault(ep.group, []).append(f"{ep.name} = {ep.value}")
    info.joinpath("entry_points.txt").write_text(
        "".join(f"[{group}]\n" + "\n".join(lines) + "\n\n" for group, lines in sorted(groups.items()))
    )
    return target
