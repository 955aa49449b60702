"""Pod injection as one pure function: ``inject(pod, profile, settings) -> Injection``.

The webhook, ``flashrt inject`` and the tests all call it. It takes values and returns values:
no API client, no logger. The result holds the mutated pod and the JSON patch from the input to
it, a status and, for skips, the reason.

What it adds (design.md, data flow step 2): an init container that copies the runtime bundle
into an emptyDir; that folder first on the vLLM container's ``PYTHONPATH`` (an existing literal
value is kept after it); ``FLASHRT_ENABLE=1`` and the profile's ``FLASHRT_*`` settings; the
engine environment where the user has not set it; ``PROMETHEUS_MULTIPROC_DIR`` on an emptyDir;
the kernel choices and Triton's cache on an emptyDir that outlives container restarts;
node affinity for the allowed GPU compute majors; ``flashrt.io/status``. User settings win: an
environment variable the user set is never overwritten.

Skips are decisions, not errors: already injected, no vLLM container, ``PYTHONPATH`` from
``valueFrom``, or a user setting that would stop the seats. The pod then changes only by its
status annotation. Everything inject adds is recorded in ``flashrt.io/injected``, so
``uninject`` removes exactly that: ``uninject(inject(pod)) == pod``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson
from flashrt.operator.constants import (
    BUNDLE_MOUNT,
    BUNDLE_SIZE_LIMIT,
    BUNDLE_VOLUME,
    CACHE_MOUNT,
    CACHE_VOLUME,
    COMPUTE_MAJOR_LABEL,
    CONTAINER_ANNOTATION,
    DEFAULT_RUNTIME_IMAGE,
    ENGINE_ENV,
    INIT_CONTAINER,
    METRICS_MOUNT,
    METRICS_SIZE_LIMIT,
    METRICS_VOLUME,
    RECORD_ANNOTATION,
    STATUS_ANNOTATION,
    TRITON_CACHE,
)
from flashrt.operator.profile import Profile

RESTRICTED_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "seccompProfile": {"type": "RuntimeDefault"},
}
# What inject adds to a pod: each volume, and where the vLLM container mounts it.
POD_VOLUMES = (
    (
        {"name": BUNDLE_VOLUME, "emptyDir": {"sizeLimit": BUNDLE_SIZE_LIMIT}},
        {"mountPath": BUNDLE_MOUNT, "readOnly": True},
    ),
    ({"name": METRICS_VOLUME, "emptyDir": {"sizeLimit": METRICS_SIZE_LIMIT}}, {"mountPath": METRICS_MOUNT}),
    ({"name": CACHE_VOLUME, "emptyDir": {}}, {"mountPath": CACHE_MOUNT}),
)
VOLUMES = tuple(volume["name"] for volume, _ in POD_VOLUMES)
INIT_RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}


@dataclass(frozen=True)
class Settings:
    """Operator-wide choices (Helm values), as opposed to a profile's."""

    runtime_image: str = DEFAULT_RUNTIME_IMAGE


@dataclass(frozen=True)
class Injection:
    original: dict = field(repr=False)
    pod: dict
    status: str  # "injected", "skipped: <reason>", or "unchanged" (already injected)
    container: str | None = None

    @functools.cached_property
    def patch(self) -> list:
        """JSON patch from the input pod to ``pod``: what the webhook answers."""
        return structural_patch(self.original, self.pod)

    @property
    def injected(self) -> bool:
        return self.status == "injected"

    @property
    def reason(self) -> str | None:
        return self.status.removeprefix("skipped: ") if self.status.startswith("skipped") else None


def _json_copy(obj: object) -> object:
    """A deep copy of a JSON value (dicts, lists, scalars); a Mapping (kopf's body) becomes a dict.
    ``copy.deepcopy`` took 36 us on a production-stack vLLM pod, this 22 (2 cores), and an
    injection copies twice."""
    if isinstance(obj, dict):
        return {k: _json_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_copy(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: _json_copy(v) for k, v in obj.items()}
    return obj


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def structural_patch(before: object, after: object, path: str = "") -> list[dict]:
    """A JSON patch from ``before`` to ``after``: objects compared key by key, any other changed
    value (a list included) replaced whole. Not ``jsonpatch.make_patch``, which also diffs lists
    element by element: on a vLLM pod that diff was most of an admission's time (about 0.7 of
    1.0 ms a review on 2 cores), and a pod's lists are short enough to send whole. The values
    are ``after``'s own objects, not copies: the patch is serialised, never mutated."""
    if isinstance(before, dict) and isinstance(after, dict):
        ops = [{"op": "remove", "path": f"{path}/{_pointer(k)}"} for k in sorted(before.keys() - after.keys())]
        for key, value in after.items():
            if key in before:
                ops += structural_patch(before[key], value, f"{path}/{_pointer(key)}")
            else:
                ops.append({"op": "add", "path": f"{path}/{_pointer(key)}", "value": value})
        return ops
    if type(before) is type(after) and before == after:
        return []
    return [{"op": "replace", "path": path, "value": after}]


def _looks_like_vllm(container: Mapping) -> bool:
    words = [container.get("image", ""), *(container.get("command") or []), *(container.get("args") or [])]
    text = " ".join(str(w) for w in words).lower()
    return "vllm" in text


def find_target(pod: Mapping) -> tuple[int | None, str | None]:
    """Index of the container running vLLM, or a reason there is none."""
    containers = (pod.get("spec") or {}).get("containers") or []
    named = ((pod.get("metadata") or {}).get("annotations") or {}).get(CONTAINER_ANNOTATION)
    if named:
        for i, c in enumerate(containers):
            if c.get("name") == named:
                return i, None
        return None, f"{CONTAINER_ANNOTATION} names container {named!r}, which the pod does not have"
    matches = [i for i, c in enumerate(containers) if _looks_like_vllm(c)]
    if not matches:
        return None, "no vLLM container (image, command or args mention vllm); name one with " + CONTAINER_ANNOTATION
    if len(matches) > 1:
        names = [containers[i].get("name") for i in matches]
        return None, f"several containers look like vLLM ({names}); name the one to seat with {CONTAINER_ANNOTATION}"
    return matches[0], None


def _conflict(env: list[dict]) -> str | None:
    """A user setting under which seats could not work."""
    by_name = {e.get("name"): e for e in env}
    pythonpath = by_name.get("PYTHONPATH")
    if pythonpath is not None and "valueFrom" in pythonpath:
        return "PYTHONPATH comes from valueFrom, so the bundle cannot be prepended; set it as a literal value"
    plugins = by_name.get("VLLM_PLUGINS")
    if plugins is not None and "value" in plugins and plugins["value"] and "flashrt" not in plugins["value"].split(","):
        return f"VLLM_PLUGINS={plugins['value']!r} does not allow the flashrt plugin; add flashrt to it"
    enable = by_name.get("FLASHRT_ENABLE")
    if enable is not None and str(enable.get("value", "")).strip().lower() in ("0", "false", "no", "off"):
        return "FLASHRT_ENABLE is set to off in the container; remove it to seat"
    return None


def _keeps_triton_cache(container: Mapping) -> bool:
    """The user already chose where Triton's cache lives: ``TRITON_CACHE_DIR`` or ``TRITON_HOME``
    set, or a volume mounted where Triton's default (``~/.triton``) would be. Pointing Triton
    at flashrt's emptyDir would then silently drop a cache they keep."""
    env = {e.get("name") for e in container.get("env") or []}
    mounts = [str(m.get("mountPath", "")) for m in container.get("volumeMounts") or []]
    return bool(env & {"TRITON_CACHE_DIR", "TRITON_HOME"}) or any(".triton" in p.split("/") for p in mounts)


def _node_affinity(spec: dict, profile: Profile) -> dict | None:
    """Add the compute-major constraint; returns what was added, for uninject."""
    if profile.placement == "None":
        return None
    expression = {"key": COMPUTE_MAJOR_LABEL, "operator": "In", "values": [str(m) for m in profile.compute_majors]}
    node = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    if profile.placement == "Required":
        required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []})
        terms = required.setdefault("nodeSelectorTerms", [])
        if not terms:
            terms.append({"matchExpressions": [expression]})
            return {"required": "term"}
        for term in terms:  # terms are ORed: the constraint must join every one of them
            term.setdefault("matchExpressions", []).append(_json_copy(expression))
        return {"required": "expressions"}
    preferred = node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    preferred.append({"weight": 100, "preference": {"matchExpressions": [expression]}})
    return {"preferred": "term"}


def skip(pod: dict, reason: str) -> Injection:
    """The pod unchanged but for ``flashrt.io/status: skipped: <reason>``."""

    out = _json_copy(pod)
    out.setdefault("metadata", {}).setdefault("annotations", {})[STATUS_ANNOTATION] = f"skipped: {reason}"
    return Injection(pod, out, f"skipped: {reason}")


def inject(pod: Mapping, profile: Profile, settings: Settings | None = None) -> Injection:
    """The pod with flashrt injected into its vLLM container, or unchanged but for a skip status."""

    settings = settings or Settings()
    pod = pod if isinstance(pod, dict) else _json_copy(pod)  # never changed: the result is a copy
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get(STATUS_ANNOTATION) == "injected" or RECORD_ANNOTATION in annotations:
        return Injection(pod, pod, "unchanged")
    index, reason = find_target(pod)
    if index is None:
        return skip(pod, reason)
    container = pod["spec"]["containers"][index]
    conflict = _conflict(container.get("env") or [])
    if conflict:
        return skip(pod, conflict)

    out = _json_copy(pod)
    spec = out["spec"]
    target = spec["containers"][index]
    env = target.setdefault("env", [])
    names = {e.get("name") for e in env}
    record: dict = {"container": target["name"], "env": [], "pythonpath": None}

    pythonpath = next((e for e in env if e.get("name") == "PYTHONPATH"), None)
    if pythonpath is None:
        env.append({"name": "PYTHONPATH", "value": BUNDLE_MOUNT})
        record["env"].append("PYTHONPATH")
    else:
        record["pythonpath"] = pythonpath.get("value", "")
        pythonpath["value"] = BUNDLE_MOUNT + (":" + pythonpath["value"] if pythonpath.get("value") else "")
    wanted = [
        ("FLASHRT_ENABLE", "1"),
        *profile.env(),
        *ENGINE_ENV.items(),
        ("PROMETHEUS_MULTIPROC_DIR", METRICS_MOUNT),
        ("FLASHRT_CACHE_DIR", CACHE_MOUNT),
        *([("TRITON_CACHE_DIR", TRITON_CACHE)] if not _keeps_triton_cache(target) else []),
    ]
    for name, value in wanted:
        if name not in names:  # the user's setting wins, then the first in ``wanted``
            names.add(name)
            env.append({"name": name, "value": value})
            record["env"].append(name)

    target.setdefault("volumeMounts", []).extend({"name": v["name"], **mount} for v, mount in POD_VOLUMES)
    spec.setdefault("volumes", []).extend(_json_copy(v) for v, _ in POD_VOLUMES)
    security = _json_copy(target.get("securityContext") or RESTRICTED_SECURITY_CONTEXT)
    spec.setdefault("initContainers", []).append(
        {
            "name": INIT_CONTAINER,
            "image": profile.image(settings.runtime_image),
            "args": [BUNDLE_MOUNT],
            "resources": _json_copy(INIT_RESOURCES),
            "securityContext": security,
            "volumeMounts": [{"name": BUNDLE_VOLUME, "mountPath": BUNDLE_MOUNT}],
        }
    )
    record["created"] = [key for key in ("affinity", "volumes", "initContainers") if key not in pod["spec"]]
    record["affinity"] = _node_affinity(spec, profile)
    for key in ("volumeMounts", "env"):
        if key not in container:
            record["created"].append(f"container.{key}")
    meta = out.setdefault("metadata", {})
    if "annotations" not in (pod.get("metadata") or {}):
        record["created"].append("annotations")
    meta.setdefault("annotations", {})
    meta["annotations"][STATUS_ANNOTATION] = "injected"
    meta["annotations"][RECORD_ANNOTATION] = orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()
    return Injection(pod, out, "injected", target["name"])


def uninject(pod: Mapping) -> dict:
    """Remove exactly what ``inject`` added (the record annotation says what that was)."""
    out = _json_copy(pod)
    annotations = (out.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(RECORD_ANNOTATION)
    if raw is None:
        if annotations.get(STATUS_ANNOTATION, "").startswith("skipped"):
            del annotations[STATUS_ANNOTATION]
            if not annotations:
                del out["metadata"]["annotations"]
        return out
    record = json.loads(raw)
    spec = out["spec"]
    created = set(record.get("created", []))
    target = next(c for c in spec["containers"] if c["name"] == record["container"])
    target["env"] = [e for e in target.get("env", []) if e["name"] not in record["env"]]
    if record["pythonpath"] is not None:
        for e in target["env"]:
            if e["name"] == "PYTHONPATH":
                e["value"] = record["pythonpath"]
    target["volumeMounts"] = [m for m in target.get("volumeMounts", []) if m["name"] not in VOLUMES]
    for key in ("env", "volumeMounts"):
        if f"container.{key}" in created and not target[key]:
            del target[key]
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] not in VOLUMES]
    spec["initContainers"] = [c for c in spec.get("initContainers", []) if c["name"] != INIT_CONTAINER]
    affinity = record.get("affinity")
    if affinity:
        node = spec["affinity"]["nodeAffinity"]
        if affinity.get("required") == "term":
            node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].pop()
        elif affinity.get("required") == "expressions":
            for term in node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]:
                term["matchExpressions"].pop()
        else:
            node["preferredDuringSchedulingIgnoredDuringExecution"].pop()
        _prune(spec, ("affinity",))
    for key in ("volumes", "initContainers"):
        if key in created and not spec[key]:
            del spec[key]
    del annotations[STATUS_ANNOTATION]
    del annotations[RECORD_ANNOTATION]
    if "annotations" in created and not annotations:
        del out["metadata"]["annotations"]
    return out


def _prune(obj: dict, keys: tuple[str, ...]) -> None:
    """Drop empty containers that inject created under ``obj[key]``, deepest first."""
    for key in keys:
        value = obj.get(key)
        if isinstance(value, dict):
            _prune(value, tuple(value))
            if not value:
                del obj[key]
        elif isinstance(value, list) and not value:
            del obj[key]


# Metric label for a skip: the reasons themselves carry names and would make labels unbounded.
SKIP_CODES = (
    ("no vLLM container", "no_vllm_container"),
    ("several containers look like vLLM", "ambiguous_container"),
    ("names container", "named_container_missing"),
    ("PYTHONPATH comes from valueFrom", "pythonpath_value_from"),
    ("does not allow the flashrt plugin", "plugins_allowlist"),
    ("FLASHRT_ENABLE is set to off", "disabled_by_user"),
    ("not found", "profile_not_found"),
    ("is invalid", "profile_invalid"),
)


def reason_code(reason: str | None) -> str:
    if not reason:
        return ""
    return next((code for text, code in SKIP_CODES if text in reason), "other")
