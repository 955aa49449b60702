"""A ``SeatProfile`` object (``flashrt.io/v1alpha1``) as a frozen value, and what it means for a pod.

The CRD's schema validates objects at the API server; this parser validates again, because
``flashrt inject`` reads profiles from files that never passed an API server, and a bad value
must name its field and the fix rather than inject something surprising.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from flashrt.operator.constants import DEFAULT_PROFILE, DEFAULT_RUNTIME_IMAGE

PLACEMENTS = ("Required", "Preferred", "None")
METRICS_MODES = ("vllm", "port")
ROLLOUTS = ("Manual", "OnChange")
ACTIVATIONS = ("auto", "bf16", "nvfp4")  # flashrt.runtime.profile.ACTIVATIONS (no torch import here)
SEAT_KINDS = ("dense", "experts", "head")


@dataclass(frozen=True)
class Profile:
    name: str = DEFAULT_PROFILE
    seats: tuple[str, ...] = SEAT_KINDS
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    moe_band_t: int | None = None  # None: the runtime picks the GPU's own band (flashrt.runtime.profile)
    parity_floor: float = 0.99
    strict: bool = False
    retain_host_experts: bool = True
    compute_majors: tuple[int, ...] = (10, 11, 12)  # Blackwell and Thor; Hopper (9) is opt-in
    placement: str = "Required"
    activations: str = "auto"
    runtime_image: str = ""
    metrics_mode: str = "vllm"
    metrics_port: int = 9400
    settings: tuple[tuple[str, str], ...] = field(default=())
    rollout: str = "Manual"
    generation: int = 0

    def image(self, default: str = DEFAULT_RUNTIME_IMAGE) -> str:
        return self.runtime_image or default

    def env(self) -> list[tuple[str, str]]:
        """The ``FLASHRT_*`` variables this profile sets in the vLLM container."""
        env = [
            ("FLASHRT_KINDS", ",".join(self.seats)),
            ("FLASHRT_PARITY_FLOOR", str(self.parity_floor)),
            ("FLASHRT_STRICT", "1" if self.strict else "0"),
            ("FLASHRT_RETAIN_HOST_EXPERTS", "1" if self.retain_host_experts else "0"),
            ("FLASHRT_ACTIVATIONS", self.activations),
        ]
        if self.moe_band_t is not None:
            env.append(("FLASHRT_MOE_BAND_T", str(self.moe_band_t)))
        if self.include:
            env.append(("FLASHRT_INCLUDE", ",".join(self.include)))
        if self.exclude:
            env.append(("FLASHRT_EXCLUDE", ",".join(self.exclude)))
        if self.metrics_mode == "port":
            env.append(("FLASHRT_METRICS_PORT", str(self.metrics_port)))
        # A setting overrides the field that sets the same variable, as the later of two entries
        # did when both went in (with the API server's warning that it "hides previous definition").
        return list((dict(env) | dict(self.settings)).items())


def _expect(value, kinds, path: str, fix: str):
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    # bool is an int in Python; in a profile, `true` where a number belongs is a mistake.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ValueError(f"{path}: got {value!r}, {fix}")
    return value


def from_object(obj: Mapping) -> Profile:
    """Parse a SeatProfile object (``metadata`` + ``spec``); errors name the field and the fix."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ValueError(f"spec: got {type(spec).__name__}, need a mapping")
    known = {"seats", "include", "exclude", "moeBandT", "parityFloor", "strict", "retainHostExperts", "computeMajors",
             "placement", "activations", "runtimeImage", "metrics", "settings", "rollout"}  # fmt: skip
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ValueError(f"spec: unknown fields {unknown}; known fields are {sorted(known)}")
    seats = spec.get("seats", {})
    _expect(seats, dict, "spec.seats", "need a mapping of dense/experts/head to true or false")
    bad = sorted(set(seats) - set(SEAT_KINDS))
    if bad:
        raise ValueError(f"spec.seats: unknown kinds {bad}; use dense, experts, head")
    for kind, on in seats.items():
        _expect(on, bool, f"spec.seats.{kind}", "need true or false")
    kinds = tuple(k for k in SEAT_KINDS if seats.get(k, True))
    band = spec.get("moeBandT")  # unset: the runtime picks the GPU's own
    if band is not None and _expect(band, int, "spec.moeBandT", "need a positive integer (token rows)") < 1:
        raise ValueError(f"spec.moeBandT: got {band}, need a positive integer (token rows)")
    floor = _expect(spec.get("parityFloor", 0.99), (int, float), "spec.parityFloor", "need a number in (0, 1]")
    if not 0 < floor <= 1:
        raise ValueError(f"spec.parityFloor: got {floor}, need a number in (0, 1]")
    majors = spec.get("computeMajors", [10, 11, 12])
    _expect(majors, list, "spec.computeMajors", "need a list of GPU compute majors such as [10, 11, 12]")
    for m in majors:
        if not isinstance(m, int) or isinstance(m, bool) or not 7 <= m <= 20:
            raise ValueError(
                f"spec.computeMajors: {m!r} is not a GPU compute major; Hopper is 9, Blackwell 10 and 12, Thor 11"
            )
    if not majors:
        raise ValueError("spec.computeMajors: empty; list at least one GPU compute major, e.g. [10, 11, 12]")
    placement = spec.get("placement", "Required")
    if placement not in PLACEMENTS:
        raise ValueError(f"spec.placement: got {placement!r}, need one of {list(PLACEMENTS)}")
    activations = spec.get("activations", "auto")
    if activations not in ACTIVATIONS:
        raise ValueError(
            f"spec.activations: got {activations!r}, need one of {list(ACTIVATIONS)} "
            "(auto: W4A4 only where it wins on FP4 tensor cores; bf16: weight-only; nvfp4: W4A4 wherever it qualifies)"
        )
    metrics = spec.get("metrics", {}) or {}
    mode = metrics.get("mode", "vllm")
    if mode not in METRICS_MODES:
        raise ValueError(f"spec.metrics.mode: got {mode!r}, need one of {list(METRICS_MODES)}")
    port = _expect(metrics.get("port", 9400), int, "spec.metrics.port", "need a port number")
    if not 1 <= port <= 65535:
        raise ValueError(f"spec.metrics.port: got {port}, need 1-65535")
    settings = spec.get("settings", {}) or {}
    _expect(settings, dict, "spec.settings", "need a mapping of FLASHRT_* names to strings")
    for k, v in settings.items():
        if not k.startswith("FLASHRT_") or k == "FLASHRT_ENABLE":
            raise ValueError(f"spec.settings.{k}: only FLASHRT_* variables (not FLASHRT_ENABLE) can be set here")
        if not isinstance(v, str):
            raise ValueError(f"spec.settings.{k}: got {v!r}, need a string (quote numbers in YAML)")
    rollout = spec.get("rollout", "Manual")
    if rollout not in ROLLOUTS:
        raise ValueError(f"spec.rollout: got {rollout!r}, need one of {list(ROLLOUTS)}")
    for name in ("include", "exclude"):
        patterns = spec.get(name, [])
        _expect(patterns, list, f"spec.{name}", "need a list of module-name patterns")
    for name in ("strict", "retainHostExperts"):
        if name in spec:
            _expect(spec[name], bool, f"spec.{name}", "need true or false")
    image = spec.get("runtimeImage", "")
    _expect(image, str, "spec.runtimeImage", "need an image reference")
    return Profile(
        name=meta.get("name", DEFAULT_PROFILE),
        seats=kinds,
        include=tuple(spec.get("include", [])),
        exclude=tuple(spec.get("exclude", [])),
        moe_band_t=band,
        parity_floor=float(floor),
        strict=spec.get("strict", False),
        retain_host_experts=spec.get("retainHostExperts", True),
        compute_majors=tuple(majors),
        placement=placement,
        activations=activations,
        runtime_image=image,
        metrics_mode=mode,
        metrics_port=port,
        settings=tuple(sorted(settings.items())),
        rollout=rollout,
        generation=int(meta.get("generation", 0) or 0),
    )
