"""What to seat and how: one frozen profile, from code or from ``FLASHRT_*`` variables.

Every variable is read in one place (``ENV``) and documented in ``docs/configuration.md``; a
test fails when the two disagree. A bad value raises ``ValueError`` naming the variable, the
value and what is accepted: a typo must not silently seat nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

KINDS = ("dense", "experts", "head")
# auto: the adjudicator may pick W4A4 where the GPU has FP4 tensor cores (ranked below W4A16,
# so only a clear win above the parity floor); bf16: weight-only forms only; nvfp4: W4A4
# wherever it qualifies (compute major 10+), W4A16 elsewhere.
ACTIVATIONS = ("auto", "bf16", "nvfp4")

# Rows of one LM-head slab. The kernels index in int64, so this is not a hardware limit: it
# keeps each slab a shape the tuner measures once and shares across models with the same
# hidden size, and it bounds the calibration output (slab x batch) during attach.
HEAD_SLAB_ROWS = 65536


@dataclass(frozen=True)
class SeatProfile:
    """Which seats to install and how. Defaults are what a server should run with."""

    kinds: tuple[str, ...] = KINDS
    include: tuple[str, ...] = ()  # fnmatch patterns on module names; empty: everything
    exclude: tuple[str, ...] = ()
    # Seats under this many weight parameters are not bound: at 64K params (a 256 x 256
    # projection) the launch costs more than the bytes saved on any GPU we measured.
    min_params: int = 65536
    parity_floor: float = 0.99  # cosine of seam output against the host's on calibration input
    strict: bool = False  # nothing seated becomes an error instead of a report
    max_faults: int = 3  # a seam that raises this many times detaches itself
    retain_host_experts: bool = True  # keep bf16 experts for rows above the band (memory: +1x bank)
    # Token rows up to which the packed bank serves; None: the device's own (``ops.moe_band``:
    # 64 where the ring expert forms serve, 16 elsewhere), resolved when a bank is bound.
    moe_band_t: int | None = None
    head_slab_rows: int = HEAD_SLAB_ROWS
    activations: str = "auto"

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"kinds: {unknown} are not seat kinds; use some of {list(KINDS)}")
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations: {self.activations!r}; use one of {', '.join(ACTIVATIONS)}")
        if not 0.0 < self.parity_floor <= 1.0:
            raise ValueError(f"parity_floor: {self.parity_floor} is outside (0, 1]; 0.99 is the default")
        counts = ("min_params", "max_faults", "head_slab_rows")
        for name in counts if self.moe_band_t is None else (*counts, "moe_band_t"):  # None: the device's band
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "min_params" else 1):
                raise ValueError(f"{name}: {value!r} must be a positive integer")


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{name}={raw!r}: not a boolean; use 1/0, true/false, yes/no or on/off")


def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not an integer") from None


def _float(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not a number") from None


def _activations(name: str, raw: str) -> str:
    if raw not in ACTIVATIONS:
        raise ValueError(f"{name}={raw!r}: use one of {', '.join(ACTIVATIONS)}")
    return raw


def _list(name: str, raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _kinds(name: str, raw: str) -> tuple[str, ...]:
    kinds = _list(name, raw)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"{name}={raw!r}: {bad} are not seat kinds; use a comma list of {', '.join(KINDS)}")
    return kinds


@dataclass(frozen=True)
class EnvVar:
    name: str
    field: str | None  # the SeatProfile field it sets; None: read elsewhere
    parse: object = field(repr=False, default=None)
    meaning: str = ""


ENV = (
    EnvVar("FLASHRT_ENABLE", None, _bool, "Activate the vLLM plugin in this process (default off)."),
    EnvVar("FLASHRT_KINDS", "kinds", _kinds, "Seat kinds to install: comma list of dense, experts, head."),
    EnvVar(
        "FLASHRT_INCLUDE", "include", _list, "Comma list of fnmatch patterns; only matching module names are seated."
    ),
    EnvVar("FLASHRT_EXCLUDE", "exclude", _list, "Comma list of fnmatch patterns never seated."),
    EnvVar("FLASHRT_MIN_PARAMS", "min_params", _int, "Weights with fewer parameters are left to the host."),
    EnvVar("FLASHRT_PARITY_FLOOR", "parity_floor", _float, "Cosine a seam must reach on calibration input (0-1]."),
    EnvVar("FLASHRT_STRICT", "strict", _bool, "Fail instead of reporting when nothing could be seated."),
    EnvVar("FLASHRT_MAX_FAULTS", "max_faults", _int, "Faults after which a seam detaches itself."),
    EnvVar("FLASHRT_RETAIN_HOST_EXPERTS", "retain_host_experts", _bool, "Keep bf16 experts for rows above the band."),
    EnvVar(
        "FLASHRT_MOE_BAND_T",
        "moe_band_t",
        _int,
        "Token rows up to which the packed expert bank serves; unset: the GPU's own, 64 on Hopper and 16 elsewhere.",
    ),
    EnvVar("FLASHRT_HEAD_SLAB_ROWS", "head_slab_rows", _int, "Rows per LM-head slab."),
    EnvVar(
        "FLASHRT_ACTIVATIONS",
        "activations",
        _activations,
        "Activations of linear seats and expert banks: auto (W4A4 only where it wins on FP4 tensor cores), bf16 "
        "(weight-only), nvfp4 (W4A4 wherever the GPU has FP4 tensor cores).",
    ),
    EnvVar("FLASHRT_METRICS_PORT", None, _int, "Port of the runtime's own /metrics when vLLM's is not used."),
    EnvVar(
        "FLASHRT_CACHE_DIR",
        None,
        str,
        "Where kernel choices per device and shape are kept (~/.cache/flashrt; injected: /var/cache/flashrt).",
    ),
    EnvVar(
        "FLASHRT_SHIPPED_CHOICES",
        None,
        str,
        "1 (default): a shape this node has not measured takes the kernel choice shipped for its GPU; 0: every "
        "shape is measured here.",
    ),
    EnvVar("FLASHRT_COMMIT", None, str, "Benchmarks: the commit to record when the tree has no .git."),
    EnvVar("FLASHRT_TEST_SEED", None, _int, "Tests: replay a failed test with the seed it printed."),
    EnvVar("FLASHRT_CHECKOV", None, str, "Tests: the checkov executable (make test sets its own)."),
)


def from_env(environ: Mapping[str, str] | None = None, base: SeatProfile | None = None) -> SeatProfile:
    """A profile from ``FLASHRT_*`` variables over ``base``; unknown ``FLASHRT_`` names are errors."""
    environ = os.environ if environ is None else environ
    known = {v.name: v for v in ENV}
    for name in environ:
        if name.startswith("FLASHRT_") and name not in known:
            raise ValueError(f"{name}: not a flashrt variable; known: {', '.join(sorted(known))}")
    values = {}
    for var in ENV:
        if var.field and var.name in environ:
            values[var.field] = var.parse(var.name, environ[var.name])
    base = base or SeatProfile()
    merged = {f.name: getattr(base, f.name) for f in fields(SeatProfile)} | values
    try:
        return SeatProfile(**merged)
    except ValueError as exc:
        env_of = {v.field: v.name for v in ENV if v.field}
        field_name = str(exc).split(":", 1)[0]
        raise ValueError(f"{env_of.get(field_name, field_name)}: {str(exc).split(':', 1)[1].strip()}") from None
