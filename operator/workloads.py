"""Which workloads use a SeatProfile, from the labelled pods the operator indexes: no API call.

A pod names its profile (``flashrt.io/profile``, default ``default``) and carries the webhook's
``flashrt.io/status``. Its owner reference gives the workload: a ReplicaSet's pod belongs to the
Deployment named by the ReplicaSet's name without its ``-<pod-template-hash>`` suffix (the pod
carries that label), so no ReplicaSet is read; a LeaderWorkerSet's pods (owned by the
StatefulSets it makes) carry its name in ``leaderworkerset.sigs.k8s.io/name``; any other owner
(StatefulSet, DaemonSet, Job) is the workload itself; a bare pod is its own workload.

A pod uses the profile of its name in its own namespace, or else the one in the operator's
namespace (the chart's shared ``default``), as the webhook resolves it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from flashrt.operator.constants import DEFAULT_PROFILE, PROFILE_ANNOTATION, STATUS_ANNOTATION

ProfileKey = tuple[str, str]  # (namespace, name)


LWS_LABEL = "leaderworkerset.sigs.k8s.io/name"


def workload_of(meta: Mapping) -> tuple[str, str]:
    """(kind, name) of the workload that owns a pod."""
    lws = (meta.get("labels") or {}).get(LWS_LABEL)
    if lws:
        return "LeaderWorkerSet", lws
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller", True)]
    if not owners:
        return "Pod", meta.get("name", "")
    owner = owners[0]
    template_hash = (meta.get("labels") or {}).get("pod-template-hash")
    if owner.get("kind") == "ReplicaSet" and template_hash and owner["name"].endswith(f"-{template_hash}"):
        return "Deployment", owner["name"].removesuffix(f"-{template_hash}")
    return owner.get("kind", ""), owner.get("name", "")


def pod_entry(namespace: str, meta: Mapping) -> tuple[ProfileKey, dict]:
    """The index entry of one labelled pod: its profile reference and what the workloads need."""
    annotations = meta.get("annotations") or {}
    kind, name = workload_of(meta)
    entry = {
        "namespace": namespace,
        "kind": kind,
        "name": name,
        "injected": annotations.get(STATUS_ANNOTATION) == "injected",
    }
    return (namespace, annotations.get(PROFILE_ANNOTATION, DEFAULT_PROFILE)), entry


def resolve(
    reference: ProfileKey, has_profile: Callable[[str, str], bool], fallback_namespace: str | None
) -> ProfileKey:
    """The profile a pod's reference lands on: its own namespace's, else the operator's."""
    namespace, name = reference
    if has_profile(namespace, name) or not fallback_namespace:
        return reference
    return fallback_namespace, name


def profile_workloads(
    profile: ProfileKey,
    pods: Mapping[ProfileKey, Iterable[dict]],
    has_profile: Callable[[str, str], bool],
    fallback_namespace: str | None,
) -> list[dict]:
    """The workloads whose pods use ``profile``, with their pod and injected-pod counts."""
    counts: dict[tuple[str, str, str], list[int]] = {}
    for reference, entries in pods.items():
        if resolve(reference, has_profile, fallback_namespace) != profile:
            continue
        for entry in entries:
            count = counts.setdefault((entry["namespace"], entry["kind"], entry["name"]), [0, 0])
            count[0] += 1
            count[1] += entry["injected"]
    return [
        {"namespace": ns, "kind": kind, "name": name, "pods": pods_, "injectedPods": injected}
        for (ns, kind, name), (pods_, injected) in sorted(counts.items())
    ]


RESTART_ANNOTATION = "flashrt.io/restartedAt"
RESTARTABLE = {
    "Deployment": "apps/v1/deployments",
    "StatefulSet": "apps/v1/statefulsets",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1/leaderworkersets",
}


def restart_patch(kind: str, when: str) -> dict:
    """What ``kubectl rollout restart`` does: a pod-template annotation change rolls the pods.
    A LeaderWorkerSet has two templates (leader and workers); both change, so a group restarts
    whole."""
    annotate = {"metadata": {"annotations": {RESTART_ANNOTATION: when}}}
    if kind == "LeaderWorkerSet":
        return {"spec": {"leaderWorkerTemplate": {"leaderTemplate": annotate, "workerTemplate": annotate}}}
    return {"spec": {"template": annotate}}
