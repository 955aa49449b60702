"""Prometheus metrics of the seats, in one process or across vLLM's processes.

Every metric is declared in ``DEFINITIONS`` and documented in ``docs/metrics.md``; a test fails
when the two disagree. Labels stay bounded (seat kind, state, reason), never layer names.

Multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before the process starts) supports
counters and gauges with an explicit mode, not Info or custom collectors, so the build info is
a gauge of value 1. Gauges use ``livesum``/``livemin``/``livemax``: a dead process's seats must
not be counted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PREFIX = "flashrt_"


@dataclass(frozen=True)
class Definition:
    name: str  # as exposed (counters end in _total)
    kind: str  # counter | gauge
    labels: tuple[str, ...]
    meaning: str
    multiprocess_mode: str = "livesum"


DEFINITIONS = (
    Definition(
        "flashrt_seats", "gauge", ("kind", "state"), "Seats by kind and state (seated, refused, self_detached)."
    ),
    Definition("flashrt_seat_calls_total", "counter", ("kind",), "Calls served by seams."),
    Definition(
        "flashrt_seat_fallbacks_total",
        "counter",
        ("kind", "reason"),
        "Calls a seam could not serve, served by the host path.",
    ),
    Definition(
        "flashrt_seat_self_detached_total",
        "counter",
        ("kind",),
        "Seams that detached themselves after repeated faults.",
    ),
    Definition(
        "flashrt_seat_parity",
        "gauge",
        ("kind",),
        "Lowest cosine of a bound seam against its host on calibration input.",
        "livemin",
    ),
    Definition(
        "flashrt_weight_bytes",
        "gauge",
        ("kind", "state"),
        "Device bytes of seated weights: state=host before, state=seated after (packed, plus any copy the host"
        " keeps: vLLM's own, a retained expert bank).",
    ),
    Definition("flashrt_attach_seconds", "gauge", (), "Seconds the last attach took.", "livemax"),
    Definition(
        "flashrt_kernel_choices_total",
        "counter",
        ("source",),
        "Kernel choices made, by source: measured here, from this node's cache, or shipped for this GPU.",
    ),
    Definition(
        "flashrt_no_seats", "gauge", (), "1 when activation ended with no seat at all in this process.", "livemax"
    ),
    Definition(
        "flashrt_runtime_info",
        "gauge",
        ("version", "torch", "triton", "form"),
        "Build of the runtime; value 1.",
        "livemax",
    ),
)


class Metrics:
    """The registered metric objects, created once per process."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self._by_name = {}
        multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        for d in DEFINITIONS:
            if d.kind == "counter":
                self._by_name[d.name] = Counter(d.name.removesuffix("_total"), d.meaning, d.labels)
            else:
                kwargs = {"multiprocess_mode": d.multiprocess_mode} if multiprocess else {}
                self._by_name[d.name] = Gauge(d.name, d.meaning, d.labels, **kwargs)

    def __getitem__(self, name: str):
        return self._by_name[name]


_METRICS: Metrics | None = None


def metrics() -> Metrics:
    global _METRICS
    if _METRICS is None:
        _METRICS = Metrics()
    return _METRICS


def registry():
    """The registry to expose: every process's files in multiprocess mode, else this process's."""
    from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg)
        return reg
    return REGISTRY


def serve(port: int, addr: str = "0.0.0.0"):
    """Expose ``/metrics`` for users outside vLLM (vLLM's own endpoint serves them inside it)."""
    from prometheus_client import start_http_server

    metrics()  # the flashrt_ families are listed from the first scrape, before any attach
    return start_http_server(port, addr=addr, registry=registry())


def render() -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry()).decode()
