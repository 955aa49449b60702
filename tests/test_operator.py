"""The kopf operator against kmock's Kubernetes emulator, and its webhook over real HTTPS."""

import asyncio
import base64
import contextlib
import json
import socket
import ssl
import subprocess

import aiohttp
import jsonpatch
import kopf
import pytest
from flashrt.operator.constants import STATUS_ANNOTATION

NS = "serving"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def certificate(tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
async def operator(kmock, certificate, monkeypatch):
    """The real handlers module, logged in to kmock, with the webhook on a free HTTPS port."""
    port = _free_port()
    monkeypatch.setenv("FLASHRT_OPERATOR_WEBHOOK_PORT", str(port))
    monkeypatch.setenv("FLASHRT_OPERATOR_TLS_CERT", str(certificate[0]))
    monkeypatch.setenv("FLASHRT_OPERATOR_TLS_KEY", str(certificate[1]))
    # kopf's backbone waits for namespaces and CRDs to be discoverable before it watches anything.
    for resource, namespaced in (("flashrt.io/v1alpha1/seatprofiles", True), ("v1/pods", True),
                                 ("apps/v1/deployments", True), ("v1/events", True), ("v1/namespaces", False),
                                 ("apiextensions.k8s.io/v1/customresourcedefinitions", False)):  # fmt: skip
        kmock.resources[resource] = {"namespaced": namespaced, "verbs": {"list", "watch", "get", "patch", "create"}}
    kmock.resources["flashrt.io/v1alpha1/seatprofiles"].kind = "SeatProfile"
    kmock.resources["v1/pods"].kind = "Pod"
    kmock.resources["apps/v1/deployments"].kind = "Deployment"

    import flashrt.operator.handlers as handlers

    registry = kopf.get_default_registry()

    @kopf.on.login(registry=registry)
    def login(**_):
        return kopf.ConnectionInfo(server=str(kmock.url))

    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    settings.posting.level = 0
    stop = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        kopf.operator(registry=registry, settings=settings, namespaces=[NS], standalone=True, stop_flag=stop)
    )
    context = ssl.create_default_context(cafile=str(certificate[0]))
    url = f"https://127.0.0.1:{port}{handlers_path()}"
    async with aiohttp.ClientSession() as session:
        for _ in range(100):  # wait for the webhook server
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.post(url, data=b"{}", ssl=context) as r:
                    await r.read()
                    break
            await asyncio.sleep(0.05)
        yield kmock, session, url, context, handlers
    stop.set_result(None)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=10)


def _profile(name="default", **spec):
    return {"apiVersion": "flashrt.io/v1alpha1", "kind": "SeatProfile",
            "metadata": {"name": name, "namespace": NS, "generation": 1}, "spec": spec}  # fmt: skip


def _review(obj, uid="u-1", api="admission.k8s.io/v1", kind="Pod"):
    return {
        "apiVersion": api, "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": kind},
                    "resource": {"group": "", "version": "v1", "resource": "pods" if kind == "Pod" else "configmaps"},
                    "namespace": NS, "operation": "CREATE", "userInfo": {"username": "system:serviceaccount:x:y"},
                    "object": obj, "dryRun": False},
    }  # fmt: skip


def _vllm_pod(name="vllm-0", profile=None):
    meta = {"name": name, "namespace": NS, "labels": {"flashrt.io/inject": "enabled"}}
    if profile:
        meta["annotations"] = {"flashrt.io/profile": profile}
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["--model", "m"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container]}}


async def _post(session, url, context, payload: bytes):
    async with session.post(url, data=payload, ssl=context, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200
        body = await r.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"]["allowed"] is True
    return body


async def _create(kmock, path: str, obj: dict) -> None:
    """Create through the API, as a client would: the emulator then notifies its watchers."""
    async with aiohttp.ClientSession() as session, session.post(f"{kmock.url}{path}", json=obj) as r:
        assert r.status < 300, await r.text()


PROFILES = f"/apis/flashrt.io/v1alpha1/namespaces/{NS}/seatprofiles"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"


async def _wait(predicate, timeout=10.0):
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def test_profile_status_is_written_for_valid_and_invalid_profiles(operator):
    kmock, *_ = operator
    await _create(kmock, PROFILES, _profile())
    await _create(kmock, PROFILES, _profile("broken", placement="Sometimes"))

    def status(name):
        return (kmock.objects["flashrt.io/v1alpha1/seatprofiles", NS, name] or {}).get("status", {})

    await _wait(lambda: status("default").get("conditions") and status("broken").get("conditions"))
    assert status("default")["conditions"][0]["status"] == "True" and status("default")["observedGeneration"] == 1
    assert "spec.placement: got 'Sometimes'" in status("broken")["conditions"][0]["message"]


async def test_webhook_injects_over_https_and_every_odd_request_is_admitted(operator):
    kmock, session, url, context, _ = operator
    await _create(kmock, PROFILES, _profile())
    pod = _vllm_pod()
    await asyncio.sleep(0.5)  # the index sees the profile
    body = await _post(session, url, context, json.dumps(_review(pod)).encode())
    assert body["response"]["uid"] == "u-1" and body["response"]["patchType"] == "JSONPatch"
    patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(body["response"]["patch"])))
    assert patched["metadata"]["annotations"][STATUS_ANNOTATION] == "injected"

    from prometheus_client import REGISTRY

    def admissions(result, reason=""):
        return REGISTRY.get_sample_value("flashrt_operator_admissions_total", {"result": result, "reason": reason}) or 0

    assert admissions("injected") >= 1
    missing_before = admissions("skipped", "profile_not_found")
    for payload in (
        b"{not json",
        json.dumps(_review(pod, api="admission.k8s.io/v1beta1")).encode(),
        json.dumps(
            _review({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}, kind="ConfigMap")
        ).encode(),
        json.dumps(_review(pod | {"metadata": pod["metadata"] | {"annotations": {"big": "x" * (1 << 20)}}})).encode(),
        json.dumps(_review(_vllm_pod(profile="missing"))).encode(),
    ):
        await _post(session, url, context, payload)
    assert admissions("skipped", "profile_not_found") == missing_before + 1


async def test_a_missing_profile_admits_the_pod_with_a_warning_and_an_event(operator):
    kmock, session, url, context, _ = operator
    pod = _vllm_pod(profile="nope")
    body = await _post(session, url, context, json.dumps(_review(pod)).encode())
    assert any("SeatProfile serving/nope not found" in w for w in body["response"].get("warnings", []))
    admitted = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(body["response"]["patch"])))
    await _create(kmock, f"/api/v1/namespaces/{NS}/pods", admitted)  # what the API server stores

    def events():
        return [dict(obj or {}) for key, obj in zip(kmock.objects.keys(), kmock.objects.values(), strict=True)
                if "events" in str(key[0])]  # fmt: skip

    await _wait(lambda: any("nope not found" in (e or {}).get("message", "") for e in events()))


async def test_deployment_annotation_is_propagated_into_its_pod_template(operator):
    kmock, *_ = operator
    await _create(kmock, DEPLOYMENTS, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vllm", "namespace": NS, "annotations": {"flashrt.io/profile": "moe"}},
        "spec": {"selector": {"matchLabels": {"app": "v"}},
                 "template": {"metadata": {"labels": {"app": "v"}},
                              "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}}},
    })  # fmt: skip

    def template():
        return kmock.objects["apps/v1/deployments", NS, "vllm"]["spec"]["template"]["metadata"]

    await _wait(lambda: (template().get("annotations") or {}).get("flashrt.io/profile") == "moe")
    assert template()["labels"] == {"app": "v", "flashrt.io/inject": "enabled"}


def handlers_path() -> str:
    from flashrt.operator.handlers import WEBHOOK_PATH

    return WEBHOOK_PATH
