"""The admission side: pods are never denied, whatever reaches the webhook.

``FailOpenWebhookServer`` is kopf's own HTTPS webhook server (self-signed or mounted
certificates, reloaded when the files rotate) with one change: a request it cannot serve is
answered with an AdmissionReview that allows the object unchanged, not with an HTTP error. An
HTTP error would block pod creation under failurePolicy Fail, and under Ignore it still costs
every pod the API server's timeout; a webhook that injects an optimisation has no business
stopping a pod.

``decide(pod, namespace, lookup, settings)`` is the decision for one pod, pure: it returns the
``Injection`` (the pod, its JSON patch, the skip reason for the Event). The kopf handler calls
it and hands the patch to the server with ``answer``: kopf would otherwise diff the whole pod
again to build its own patch, which was two thirds of an admission's time.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from contextvars import ContextVar

from flashrt.operator.constants import DEFAULT_PROFILE, PROFILE_ANNOTATION
from flashrt.operator.inject import Injection, Settings, inject, skip
from flashrt.operator.profile import Profile, from_object


def allow(request: Mapping | None, patch: list | None = None, warning: str | None = None) -> dict:
    """A valid AdmissionReview v1 response that admits the object (with ``patch`` if any)."""
    uid = ""
    if isinstance(request, Mapping) and isinstance(request.get("request"), Mapping):
        uid = str(request["request"].get("uid", ""))
    response: dict = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warning:
        response["warnings"] = [warning]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


ProfileLookup = Callable[[str, str], Mapping | None]  # (namespace, name) -> SeatProfile object


def decide(
    pod: Mapping, namespace: str, lookup: ProfileLookup, settings: Settings, fallback_namespace: str | None = None
) -> Injection:
    """The pod as it should be admitted, with its patch and skip reason. Pure: the lookup is a dict
    read, never an API call, so an admission costs no round trip to the API server. A profile
    missing in the pod's namespace is looked up in ``fallback_namespace`` (the operator's): the
    chart's ``default`` profile there serves every namespace that has none of its own."""
    name = ((pod.get("metadata") or {}).get("annotations") or {}).get(PROFILE_ANNOTATION, DEFAULT_PROFILE)
    obj = lookup(namespace, name)
    if obj is None and fallback_namespace and fallback_namespace != namespace:
        obj = lookup(fallback_namespace, name)
    if obj is None:
        return skip(dict(pod), f"SeatProfile {namespace}/{name} not found; create it or set {PROFILE_ANNOTATION}")
    try:
        profile: Profile = from_object(obj)
    except ValueError as exc:
        return skip(dict(pod), f"SeatProfile {namespace}/{name} is invalid: {exc}")
    return inject(pod, profile, settings)


# The JSON patch of the review being served, from the handler to ``FailOpenWebhookServer``.
_ANSWER: ContextVar[list[list] | None] = ContextVar("flashrt_admission_patch", default=None)


def answer(patch: list) -> bool:
    """Hand ``patch`` to the server answering this review; False where another server (one of
    kopf's development tunnels) serves it, and the handler must patch through kopf instead."""
    holder = _ANSWER.get()
    if holder is None:
        return False
    holder.append(patch)
    return True


MAX_REVIEW_BYTES = 8 << 20  # twice the largest review a 1.5 MiB object can produce, with headroom


def _fail_open_server():
    import aiohttp.web
    import kopf

    class FailOpenWebhookServer(kopf.WebhookServer):
        @staticmethod
        async def _serve(fn, request: aiohttp.web.Request) -> aiohttp.web.Response:
            # Not request.text(): aiohttp caps it at 1 MiB, and an AdmissionReview of a large pod
            # (Kubernetes allows 1.5 MiB objects, sent with their old version) is larger.
            payload = b""
            while chunk := await request.content.read(1 << 16):  # read() may return a part only
                payload += chunk
                if len(payload) > MAX_REVIEW_BYTES:
                    break
            try:
                if len(payload) > MAX_REVIEW_BYTES:
                    raise ValueError("review too large")
                data = json.loads(payload)
            except ValueError:
                return aiohttp.web.json_response(allow(None))
            holder: list[list] = []
            token = _ANSWER.set(holder)
            try:
                sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
                response = await fn(
                    data, webhook=request.match_info.get("id"), sslpeer=sslpeer, headers=dict(request.headers)
                )
                response["apiVersion"], response["kind"] = "admission.k8s.io/v1", "AdmissionReview"
                response.setdefault("response", {})["allowed"] = True  # fail open: see the module docstring
                response["response"].pop("status", None)
                if holder and holder[-1]:
                    patch = base64.b64encode(json.dumps(holder[-1]).encode()).decode()
                    response["response"].update(patchType="JSONPatch", patch=patch)
                return aiohttp.web.json_response(response)
            except Exception:
                return aiohttp.web.json_response(allow(data))
            finally:
                _ANSWER.reset(token)

    return FailOpenWebhookServer


def FailOpenWebhookServer(**kwargs):
    return _fail_open_server()(**kwargs)
