"""``flashrt inject`` / ``flashrt uninject`` for GitOps users: manifests in, manifests out.

Like ``istioctl kube-inject``: every pod template in the input (Pod, Deployment, StatefulSet,
DaemonSet, ReplicaSet, Job, CronJob, LeaderWorkerSet, and ``List`` of them, in a multi-document
YAML) goes through the same pure ``inject`` the webhook calls. Other objects pass unchanged.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

from flashrt.operator.inject import Settings, inject, uninject
from flashrt.operator.profile import Profile, from_object

# Where each kind keeps its pod templates.
TEMPLATE_PATHS = {
    "Deployment": [("spec", "template")],
    "StatefulSet": [("spec", "template")],
    "DaemonSet": [("spec", "template")],
    "ReplicaSet": [("spec", "template")],
    "Job": [("spec", "template")],
    "CronJob": [("spec", "jobTemplate", "spec", "template")],
    "LeaderWorkerSet": [
        ("spec", "leaderWorkerTemplate", "leaderTemplate"),
        ("spec", "leaderWorkerTemplate", "workerTemplate"),
    ],
}


def _templates(obj: dict) -> Iterator[tuple[dict, str]]:
    for path in TEMPLATE_PATHS.get(obj.get("kind", ""), []):
        node = obj
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
            if node is None:
                break
        if isinstance(node, dict):
            yield node, ".".join(path)


def transform(obj: dict, pod_fn: Callable[[dict], tuple[dict, str | None]], notes: list[str]) -> dict:
    """Apply ``pod_fn`` to the object's pods (the object itself for a Pod; items of a List)."""
    kind = obj.get("kind")
    name = (obj.get("metadata") or {}).get("name", "?")
    if kind == "List":
        return {**obj, "items": [transform(item, pod_fn, notes) for item in obj.get("items", [])]}
    if kind == "Pod":
        pod, note = pod_fn(obj)
        if note:
            notes.append(f"Pod/{name}: {note}")
        return pod
    for template, path in _templates(obj):
        pod, note = pod_fn(
            {"apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata", {}), "spec": template["spec"]}
        )
        template["metadata"], template["spec"] = pod["metadata"], pod["spec"]
        if note:
            notes.append(f"{kind}/{name} {path}: {note}")
    return obj


def run(command: str, source: str, profile_file: str | None) -> int:
    import yaml

    profile = Profile()
    if profile_file:
        with open(profile_file) as f:
            profile = from_object(yaml.safe_load(f))
    if source == "-":
        text = sys.stdin.read()
    else:
        with open(source) as f:
            text = f.read()
    notes: list[str] = []

    def do_inject(pod: dict) -> tuple[dict, str | None]:
        result = inject(pod, profile, Settings())
        return result.pod, result.status if not result.injected else None

    def do_uninject(pod: dict) -> tuple[dict, str | None]:
        return uninject(pod), None

    fn = do_inject if command == "inject" else do_uninject
    docs = [transform(doc, fn, notes) for doc in yaml.safe_load_all(text) if doc is not None]
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
    for note in notes:
        print(f"flashrt {command}: {note}", file=sys.stderr)
    return 0
