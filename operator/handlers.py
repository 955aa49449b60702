"""The kopf operator: small handlers over the pure functions in ``inject``, ``profile``, ``webhook``.

Run with ``kopf run -m flashrt.operator.handlers`` (the chart does). What each handler does:

* SeatProfiles are indexed in memory (``profiles``), so an admission reads a dict, never the API.
* A profile's creation or change validates it and writes ``status`` (a Ready condition with the
  error in words, ``observedGeneration``, the workloads using it).
* Labelled pods are indexed too (``labelled_pods``); each of their events rewrites the
  ``workloads`` of the profile they use when it changed (``workloads.profile_workloads``).
* A profile with ``rollout: OnChange`` whose spec changes restarts the Deployments,
  StatefulSets and LeaderWorkerSets using it, as ``kubectl rollout restart`` does, with an
  Event for each.
* ``mutate_pod``: pod CREATE, only pods labelled ``flashrt.io/inject: enabled`` (also the
  webhook's objectSelector). Never denies; a skip gets an Event on the pod's owner.
* A Deployment whose own metadata carries ``flashrt.io/profile`` gets it copied into its pod
  template, with the opt-in label, unless ``FLASHRT_OPERATOR_PROPAGATE=0`` (GitOps users who
  write the template themselves).
"""

from __future__ import annotations

import datetime
import gc
import os

import kopf
from flashrt.operator import api, workloads
from flashrt.operator.constants import (
    GROUP,
    INJECT_LABEL,
    INJECT_LABEL_VALUE,
    PROFILE_ANNOTATION,
    STATUS_ANNOTATION,
    VERSION,
)
from flashrt.operator.inject import Settings, reason_code
from flashrt.operator.metrics import ADMISSIONS, HANDLER_ERRORS
from flashrt.operator.profile import from_object
from flashrt.operator.webhook import FailOpenWebhookServer, answer, decide

SETTINGS = Settings(runtime_image=os.environ.get("FLASHRT_OPERATOR_RUNTIME_IMAGE", Settings().runtime_image))
# The path of the webhook in the MutatingWebhookConfiguration: kopf routes by handler id.
WEBHOOK_PATH = "/inject"
PROPAGATE = os.environ.get("FLASHRT_OPERATOR_PROPAGATE", "1") != "0"
OPERATOR_NAMESPACE = os.environ.get("FLASHRT_OPERATOR_NAMESPACE") or None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    # Everything loaded so far lives as long as the process: out of the cyclic collector's scans,
    # which otherwise walk kopf's and aiohttp's modules in the middle of admissions.
    gc.freeze()
    settings.admission.server = FailOpenWebhookServer(
        addr="0.0.0.0",
        port=int(os.environ.get("FLASHRT_OPERATOR_WEBHOOK_PORT", "9443")),
        certfile=os.environ.get("FLASHRT_OPERATOR_TLS_CERT") or None,
        pkeyfile=os.environ.get("FLASHRT_OPERATOR_TLS_KEY") or None,
    )
    settings.persistence.finalizer = f"{GROUP}/operator"
    port = int(os.environ.get("FLASHRT_OPERATOR_METRICS_PORT", "0"))
    if port:
        from prometheus_client import start_http_server

        start_http_server(port)


@kopf.on.login()
def login(**kwargs):
    """kopf's own service-account and kubeconfig logins, remembered for ``api``'s writes."""

    def fresh():
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    info = fresh()
    if info is not None:
        api.remember(info, relogin=fresh)
    return info


@kopf.index(GROUP, VERSION, "seatprofiles")
def profiles(namespace, name, body, **_):
    """Parsed when a profile changes, not at every admission (8 us of each)."""
    try:
        return {(namespace, name): from_object(body)}
    except ValueError as exc:
        return {(namespace, name): ValueError(str(exc))}  # not the exception: it holds its frames


@kopf.index("v1", "pods", labels={INJECT_LABEL: INJECT_LABEL_VALUE})
def labelled_pods(namespace, meta, **_):
    key, entry = workloads.pod_entry(namespace, meta)
    return {key: entry}


# The workloads last written per profile: a pod event that changes no count writes nothing.
_WRITTEN: dict[workloads.ProfileKey, list[dict]] = {}


def _workloads(profile: workloads.ProfileKey, pods: kopf.Index, known: kopf.Index) -> list[dict]:
    return workloads.profile_workloads(profile, pods, lambda ns, n: (ns, n) in known, OPERATOR_NAMESPACE)


@kopf.on.create(GROUP, VERSION, "seatprofiles")
@kopf.on.update(GROUP, VERSION, "seatprofiles")
@kopf.on.resume(GROUP, VERSION, "seatprofiles")
def profile_status(body, meta, namespace, name, patch, labelled_pods: kopf.Index, profiles: kopf.Index, **_) -> None:
    try:
        from_object(body)
        condition = {"type": "Ready", "status": "True", "reason": "Valid", "message": "profile accepted"}
    except ValueError as exc:
        condition = {"type": "Ready", "status": "False", "reason": "Invalid", "message": str(exc)}
    patch.status["conditions"] = [condition | {"observedGeneration": meta.get("generation", 0)}]
    patch.status["observedGeneration"] = meta.get("generation", 0)
    found = _workloads((namespace, name), labelled_pods, profiles)
    patch.status["workloads"], patch.status["workloadCount"] = found, len(found)
    _WRITTEN[namespace, name] = found


@kopf.on.event("v1", "pods", labels={INJECT_LABEL: INJECT_LABEL_VALUE})
async def workload_status(namespace, meta, labelled_pods: kopf.Index, profiles: kopf.Index, **_) -> None:
    reference, _ = workloads.pod_entry(namespace, meta)
    profile = workloads.resolve(reference, lambda ns, n: (ns, n) in profiles, OPERATOR_NAMESPACE)
    if profile not in profiles:
        return
    found = _workloads(profile, labelled_pods, profiles)
    if _WRITTEN.get(profile) == found:
        return
    status = {"status": {"workloads": found, "workloadCount": len(found)}}
    if (
        await api.merge_patch(
            f"/apis/{GROUP}/{VERSION}/namespaces/{profile[0]}/seatprofiles/{profile[1]}/status", status
        )
        < 300
    ):
        _WRITTEN[profile] = found


@kopf.on.update(GROUP, VERSION, "seatprofiles", field="spec")
async def rollout(body, namespace, name, labelled_pods: kopf.Index, profiles: kopf.Index, logger, **_) -> None:
    """``rollout: OnChange``: restart what uses the profile, so its pods are injected anew."""
    if (body.get("spec") or {}).get("rollout") != "OnChange":
        return
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    for workload in _workloads((namespace, name), labelled_pods, profiles):
        resource = workloads.RESTARTABLE.get(workload["kind"])
        if resource is None:
            logger.info(f"flashrt: {workload['kind']} {workload['name']} is not restarted (restart it to re-inject)")
            continue
        group_version, plural = resource.rsplit("/", 1)
        path = f"/apis/{group_version}/namespaces/{workload['namespace']}/{plural}/{workload['name']}"
        if await api.merge_patch(path, workloads.restart_patch(workload["kind"], when)) < 300:
            kopf.info(
                body,
                reason="FlashrtRollout",
                message=f"restarted {workload['kind']} {workload['namespace']}/{workload['name']}",
            )


@kopf.on.mutate(
    "v1", "pods", id=WEBHOOK_PATH.strip("/"), operations={"CREATE"}, labels={INJECT_LABEL: INJECT_LABEL_VALUE}
)
async def mutate_pod(body, namespace, patch, warnings, profiles: kopf.Index, logger, **_) -> None:
    """Async: a review is pure CPU work of well under a millisecond, cheaper than a thread hop."""

    def lookup(ns: str, name: str):
        found = profiles.get((ns, name))
        return next(iter(found), None) if found else None

    try:
        injection = decide(dict(body), namespace or "default", lookup, SETTINGS, OPERATOR_NAMESPACE)
        ops = injection.patch
    except Exception as exc:  # never deny: the pod starts as it would have without flashrt
        logger.error(f"flashrt: injection failed, pod admitted unchanged: {exc!r}")
        ADMISSIONS.labels("error", type(exc).__name__).inc()
        HANDLER_ERRORS.labels("mutate_pod").inc()
        return
    reason = injection.reason
    result = "skipped" if reason else ("injected" if injection.injected else "unchanged")
    ADMISSIONS.labels(result, reason_code(reason)).inc()
    if not answer(ops):
        pod = injection.pod
        patch.fns.append(lambda target: (target.clear(), target.update(pod)))
    if reason:
        warnings.append(f"flashrt: not injected: {reason}")


@kopf.on.create("v1", "pods", labels={INJECT_LABEL: INJECT_LABEL_VALUE}, annotations={STATUS_ANNOTATION: kopf.PRESENT})
def report_skip(body, meta, **_) -> None:
    """An Event on the pod's owner for every skip (a webhook cannot post Events itself: kopf's
    event poster runs in the watching side). The owner is what a user looks at: the Deployment's
    ReplicaSet, the StatefulSet, the LeaderWorkerSet; a bare pod gets it on itself."""
    status = meta["annotations"][STATUS_ANNOTATION]
    if not status.startswith("skipped"):
        return
    owners = meta.get("ownerReferences") or []
    target = dict(owners[0], metadata={"namespace": meta.get("namespace")}) if owners else dict(body)
    kopf.warn(target, reason="FlashrtSkipped", message=status.removeprefix("skipped: "))


@kopf.on.create("apps", "v1", "deployments", annotations={PROFILE_ANNOTATION: kopf.PRESENT})
@kopf.on.update("apps", "v1", "deployments", annotations={PROFILE_ANNOTATION: kopf.PRESENT})
def propagate_profile(meta, spec, patch, **_) -> None:
    if not PROPAGATE:
        return
    profile = meta["annotations"][PROFILE_ANNOTATION]
    template = (spec.get("template") or {}).get("metadata") or {}
    if (template.get("annotations") or {}).get(PROFILE_ANNOTATION) == profile and (template.get("labels") or {}).get(
        INJECT_LABEL
    ) == INJECT_LABEL_VALUE:
        return
    patch.spec["template"] = {
        "metadata": {"annotations": {PROFILE_ANNOTATION: profile}, "labels": {INJECT_LABEL: INJECT_LABEL_VALUE}}
    }
