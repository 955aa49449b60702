"""The kopf operator against kmock's Kubernetes emulator, and its webhook over real HTTPS."""

import asyncio
import base64
import json
import ssl

import aiohttp
import jsonpatch
import pytest
from flashrt.operator.constants import STATUS_ANNOTATION
from flashrt.operator.emulated import running_operator, self_signed_certificate
from flashrt.operator.handlers import SETTINGS
from flashrt.operator.inject import inject
from flashrt.operator.profile import from_object

NS = "serving"


@pytest.fixture
async def operator(kmock, tmp_path):
    """The real handlers module, logged in to kmock, with the webhook on a free HTTPS port."""
    cert, key = self_signed_certificate(tmp_path)
    context = ssl.create_default_context(cafile=str(cert))
    async with running_operator(kmock, [NS], cert, key) as url, aiohttp.ClientSession() as session:
        yield kmock, session, url, context, None


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
    assert patched == inject(pod, from_object(_profile()), SETTINGS).pod, "the answer is the pure function's"

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


def _owned_pod(name: str, owner_kind: str, owner_name: str, status: str, template_hash: str | None = None) -> dict:
    pod = _vllm_pod(name)
    meta = pod["metadata"]
    meta["annotations"] = {STATUS_ANNOTATION: status}
    owner = {"apiVersion": "apps/v1", "kind": owner_kind, "name": owner_name, "uid": f"uid-{owner_name}"}
    meta["ownerReferences"] = [owner | {"controller": True}]
    if template_hash:
        meta["labels"]["pod-template-hash"] = template_hash
    return pod


async def _patch(kmock, path: str, body: dict) -> None:
    headers = {"Content-Type": "application/merge-patch+json"}
    async with aiohttp.ClientSession() as session, session.patch(f"{kmock.url}{path}", json=body, headers=headers) as r:
        assert r.status < 300, await r.text()


PODS = f"/api/v1/namespaces/{NS}/pods"


async def test_profile_status_lists_the_workloads_using_it_with_their_injected_pods(operator):
    kmock, *_ = operator
    await _create(kmock, PROFILES, _profile())
    await _create(kmock, PODS, _owned_pod("vllm-6d9f-a", "ReplicaSet", "vllm-6d9f", "injected", "6d9f"))
    await _create(kmock, PODS, _owned_pod("vllm-6d9f-b", "ReplicaSet", "vllm-6d9f", "skipped: no vLLM", "6d9f"))
    await _create(kmock, PODS, _owned_pod("moe-0", "StatefulSet", "moe", "injected"))

    def status():
        return (kmock.objects["flashrt.io/v1alpha1/seatprofiles", NS, "default"] or {}).get("status", {})

    expected = [
        {"namespace": NS, "kind": "Deployment", "name": "vllm", "pods": 2, "injectedPods": 1},
        {"namespace": NS, "kind": "StatefulSet", "name": "moe", "pods": 1, "injectedPods": 1},
    ]
    await _wait(lambda: status().get("workloads") == expected)
    assert status()["workloadCount"] == 2
    assert status()["conditions"][0]["status"] == "True", "the workloads do not replace the rest of the status"


async def test_rollout_on_change_restarts_the_deployments_using_the_profile_and_manual_does_not(operator):
    kmock, *_ = operator
    for name, rollout in (("auto", "OnChange"), ("manual", "Manual")):
        await _create(kmock, PROFILES, _profile(name, rollout=rollout))
        await _create(kmock, DEPLOYMENTS, {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"vllm-{name}", "namespace": NS},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}}},
        })  # fmt: skip
        pod = _owned_pod(f"vllm-{name}-77c4-x", "ReplicaSet", f"vllm-{name}-77c4", "injected", "77c4")
        pod["metadata"]["annotations"]["flashrt.io/profile"] = name
        await _create(kmock, PODS, pod)

    def workloads(name):
        return (kmock.objects["flashrt.io/v1alpha1/seatprofiles", NS, name] or {}).get("status", {}).get("workloads")

    def restarted(name):
        template = kmock.objects["apps/v1/deployments", NS, f"vllm-{name}"]["spec"]["template"]["metadata"]
        return (template.get("annotations") or {}).get("flashrt.io/restartedAt")

    await _wait(lambda: workloads("auto") and workloads("manual"))
    for name in ("auto", "manual"):
        await _patch(kmock, f"{PROFILES}/{name}", {"spec": {"moeBandT": 8}})
    await _wait(lambda: restarted("auto"))
    await asyncio.sleep(1.0)  # the manual profile's handlers ran by now too
    assert restarted("manual") is None
    assert kmock.objects["apps/v1/deployments", NS, "vllm-auto"]["spec"]["template"]["metadata"]["labels"] == {
        "app": "auto"
    }, "the restart changes one annotation, nothing else"


async def test_the_operator_writes_with_its_token_and_logs_in_again_when_it_rotated():
    import kopf
    from aiohttp import web
    from flashrt.operator import api
    from flashrt.operator.emulated import free_port

    seen = []

    async def handler(request):
        seen.append((request.headers.get("Authorization"), request.content_type, await request.json()))
        return web.Response(status=401 if len(seen) == 1 else 200)

    app = web.Application()
    app.router.add_patch("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    server = f"http://127.0.0.1:{port}"
    try:
        rotated = kopf.ConnectionInfo(server=server, token="new")
        api.remember(kopf.ConnectionInfo(server=server, token="old"), relogin=lambda: rotated)
        assert await api.merge_patch("/apis/apps/v1/namespaces/n/deployments/d", {"spec": {}}) == 200
    finally:
        await runner.cleanup()
    assert [s[0] for s in seen] == ["Bearer old", "Bearer new"]
    assert seen[1][1:] == ("application/merge-patch+json", {"spec": {}})


async def _echo(request, **_):
    """kopf's webhook-function protocol at its simplest: the server, not the engine, is tested."""
    return {"response": {"uid": request["request"]["uid"], "allowed": True}}


async def _exchange(port: int, context, raw: bytes, answers: int = 1) -> list[bytes]:
    """Send ``raw`` on one TLS connection; the heads and bodies of ``answers`` responses (a 1xx
    interim response counts as one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    writer.write(raw)
    out = []
    try:
        for _ in range(answers):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]) if b" 100 " not in head else 0
            out.append(head + await reader.readexactly(length))
    finally:
        writer.close()
    return out


def _request(body: bytes, extra: bytes = b"") -> bytes:
    return b"POST /inject HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def _uid_request(uid: str, extra: bytes = b"") -> bytes:
    return _request(json.dumps(_review({}, uid=uid)).encode(), extra)


async def test_webhook_server_answers_in_order_refuses_what_it_cannot_serve_and_reloads_rotated_certificates(
    tmp_path, monkeypatch
):
    from flashrt.operator import webhook
    from flashrt.operator.emulated import free_port
    from flashrt.operator.webhook import MAX_HEADER_BYTES, MAX_REVIEW_BYTES, FailOpenWebhookServer

    (tmp_path / "old").mkdir(), (tmp_path / "new").mkdir()
    cert, key = self_signed_certificate(tmp_path / "old")
    new_cert, new_key = self_signed_certificate(tmp_path / "new")
    port = free_port()
    server = FailOpenWebhookServer(
        addr="127.0.0.1", port=port, certfile=str(cert), pkeyfile=str(key), file_check_interval=0.05
    )
    configs = server(_echo)
    config = await anext(configs)
    assert config["url"] == f"https://127.0.0.1:{port}" and base64.b64decode(config["caBundle"]) == cert.read_bytes()
    restarted = asyncio.ensure_future(anext(configs))  # serves until the files change
    old_ca = ssl.create_default_context(cafile=str(cert))
    try:
        first, second = await _exchange(port, old_ca, _uid_request("u-1") + _uid_request("u-2"), 2)
        assert b'"uid":"u-1"' in first and b'"uid":"u-2"' in second, "pipelined reviews are answered in order"
        interim, final = await _exchange(port, old_ca, _uid_request("u-3", b"Expect: 100-continue\r\n"), 2)
        assert interim.startswith(b"HTTP/1.1 100 Continue") and b'"uid":"u-3"' in final
        interim, final = await _exchange(port, old_ca, _uid_request("u-4", b"EXPECT: 100-Continue\r\n"), 2)
        assert interim.startswith(b"HTTP/1.1 100 Continue") and b'"uid":"u-4"' in final, "header names ignore case"
        (oversized,) = await _exchange(port, old_ca, _request(b"x" * (MAX_REVIEW_BYTES + 1)))
        assert oversized.startswith(b"HTTP/1.1 200") and b'"allowed":true' in oversized
        (garbage,) = await _exchange(port, old_ca, b"GARBAGE / NOT-HTTP\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400") and b"Connection: close" in garbage
        (huge_head,) = await _exchange(
            port, old_ca, _uid_request("u-h", b"X-Pad: " + b"p" * MAX_HEADER_BYTES + b"\r\n")
        )
        assert huge_head.startswith(b"HTTP/1.1 400"), "a request head over the limit is refused, not buffered"
        monkeypatch.setattr(webhook, "IDLE_TIMEOUT_S", 0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=old_ca)
        try:
            assert await asyncio.wait_for(reader.read(), timeout=5) == b"", "an idle connection is closed"
        finally:
            writer.close()
        monkeypatch.undo()

        new_cert.replace(cert)  # a rotation written file by file: the new certificate, then its key
        await asyncio.sleep(0.3)
        assert not restarted.done(), "a certificate without its key does not replace the one serving"
        (answer,) = await _exchange(port, old_ca, _uid_request("u-mid"))
        assert b'"uid":"u-mid"' in answer
        new_key.replace(key)
        config = await asyncio.wait_for(restarted, timeout=10)
        assert base64.b64decode(config["caBundle"]) == cert.read_bytes()
        (answer,) = await _exchange(port, ssl.create_default_context(cafile=str(cert)), _uid_request("u-4"))
        assert b'"uid":"u-4"' in answer
        with pytest.raises(ssl.SSLCertVerificationError):
            await _exchange(port, old_ca, _uid_request("u-5"))
    finally:
        restarted.cancel()
        await configs.aclose()
