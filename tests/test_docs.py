"""The metric and configuration tables in docs/ say exactly what the code defines."""

import re
from pathlib import Path

from flashrt.runtime.metrics import DEFINITIONS
from flashrt.runtime.profile import ENV

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _rows(path: Path) -> list[list[str]]:
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("| `"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def _names(cell: str) -> tuple[str, ...]:
    return tuple(re.findall(r"`([^`]+)`", cell))


def test_metrics_document_matches_the_code():
    documented = {_names(r[0])[0]: (r[1], _names(r[2]), r[3]) for r in _rows(DOCS / "metrics.md")}
    defined = {d.name: (d.kind, d.labels, d.meaning) for d in DEFINITIONS}
    assert documented == defined


def test_metric_names_follow_prometheus_conventions():
    for d in DEFINITIONS:
        assert d.name.startswith("flashrt_") and ":" not in d.name
        assert d.name.endswith("_total") == (d.kind == "counter"), d.name


def test_configuration_document_matches_the_code():
    documented = {
        _names(r[0])[0]: (_names(r[1])[0] if _names(r[1]) else None, r[2]) for r in _rows(DOCS / "configuration.md")
    }
    defined = {v.name: (v.field, v.meaning) for v in ENV}
    assert documented == defined
