"""The kopf operator: small handlers over the pure functions in ``inject``, ``profile``, ``webhook``.

Run with ``kopf run -m flashrt.operator.handlers`` (the chart does). What each handler does:

* SeatProfiles are indexed in memory (``profiles``), so an admission reads a dict, never the API.
* A profile's creation or change validates it and writes ``status`` (a Ready condition with the
  error in words, ``observedGeneration``).
* ``mutate_pod``: pod CREATE, only pods labelled ``flashrt.io/inject: enabled`` (also the
  webhook's objectSelector). Never denies; a skip gets an Event on the pod's owner.
* A Deployment whose own metadata carries ``flashrt.io/profile`` gets it copied into its pod
  template, with the opt-in label, unless ``FLASHRT_OPERATOR_PROPAGATE=0`` (GitOps users who
  write the template themselves).
"""

from __future__ import annotations

import os

import kopf
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
from flashrt.operator.webhook import FailOpenWebhookServer, decide

SETTINGS = Settings(runtime_image=os.environ.get("FLASHRT_OPERATOR_RUNTIME_IMAGE", Settings().runtime_image))
# The path of the webhook in the MutatingWebhookConfiguration: kopf routes by handler id.
WEBHOOK_PATH = "/inject"
PROPAGATE = os.environ.get("FLASHRT_OPERATOR_PROPAGATE", "1") != "0"
OPERATOR_NAMESPACE = os.environ.get("FLASHRT_OPERATOR_NAMESPACE") or None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
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


@kopf.index(GROUP, VERSION, "seatprofiles")
def profiles(namespace, name, body, **_):
    return {(namespace, name): dict(body)}


@kopf.on.create(GROUP, VERSION, "seatprofiles")
@kopf.on.update(GROUP, VERSION, "seatprofiles")
@kopf.on.resume(GROUP, VERSION, "seatprofiles")
def profile_status(body, meta, patch, **_) -> None:
    try:
        from_object(body)
        condition = {"type": "Ready", "status": "True", "reason": "Valid", "message": "profile accepted"}
    except ValueError as exc:
        condition = {"type": "Ready", "status": "False", "reason": "Invalid", "message": str(exc)}
    patch.status["conditions"] = [condition | {"observedGeneration": meta.get("generation", 0)}]
    patch.status["observedGeneration"] = meta.get("generation", 0)


@kopf.on.mutate(
    "v1", "pods", id=WEBHOOK_PATH.strip("/"), operations={"CREATE"}, labels={INJECT_LABEL: INJECT_LABEL_VALUE}
)
def mutate_pod(body, namespace, patch, warnings, profiles: kopf.Index, logger, **_) -> None:
    def lookup(ns: str, name: str):
        found = profiles.get((ns, name))
        return next(iter(found), None) if found else None

    try:
        pod, reason = decide(dict(body), namespace or "default", lookup, SETTINGS, OPERATOR_NAMESPACE)
    except Exception as exc:  # never deny: the pod starts as it would have without flashrt
        logger.error(f"flashrt: injection failed, pod admitted unchanged: {exc!r}")
        ADMISSIONS.labels("error", type(exc).__name__).inc()
        HANDLER_ERRORS.labels("mutate_pod").inc()
        return
    status = (pod.get("metadata", {}).get("annotations") or {}).get(STATUS_ANNOTATION, "")
    result = "skipped" if reason else ("injected" if status == "injected" else "unchanged")
    ADMISSIONS.labels(result, reason_code(reason)).inc()
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
