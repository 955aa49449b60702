"""The admission side: pods are never denied, whatever reaches the webhook.

``FailOpenWebhookServer`` is kopf's own HTTPS webhook server (self-signed or mounted
certificates, restarted with new ones when the files rotate) with two changes:

* A request it cannot serve is answered with an AdmissionReview that allows the object
  unchanged, not with an HTTP error. An HTTP error would block pod creation under failurePolicy
  Fail, and under Ignore it still costs every pod the API server's timeout; a webhook that
  injects an optimisation has no business stopping a pod.
* HTTP is spoken by ``AdmissionProtocol`` (httptools, the parser under uvicorn) rather than an
  aiohttp application, and JSON by orjson. With 50 clients on 2 cores (``python -m flashrt.bench
  webhook``) that took two replicas from 3600 to 5500 admissions/s and the p99 from 25.6 to
  17-19 ms; kopf's admission engine and the ``@kopf.on.mutate`` handler are unchanged.

``decide(pod, namespace, lookup, settings)`` is the decision for one pod, pure: it returns the
``Injection`` (the pod, its JSON patch, the skip reason for the Event). The kopf handler calls
it and hands the patch to the server with ``answer``: kopf would otherwise diff the whole pod
again to build its own patch, which was two thirds of an admission's time.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import ssl
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path

import httptools
import orjson
from flashrt.operator.constants import DEFAULT_PROFILE, PROFILE_ANNOTATION
from flashrt.operator.inject import Injection, Settings, inject, skip
from flashrt.operator.profile import Profile, from_object
from multidict import CIMultiDict


def allow(request: Mapping | None, patch: list | None = None, warning: str | None = None) -> dict:
    """A valid AdmissionReview v1 response that admits the object (with ``patch`` if any)."""
    uid = ""
    if isinstance(request, Mapping) and isinstance(request.get("request"), Mapping):
        uid = str(request["request"].get("uid", ""))
    response: dict = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    if warning:
        response["warnings"] = [warning]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


# (namespace, name) -> the SeatProfile: its object, or already parsed (``Profile``, or the
# ``ValueError`` that parsing raised) as the operator's index keeps it.
ProfileLookup = Callable[[str, str], Mapping | Profile | ValueError | None]


def parse(found: Mapping | Profile | ValueError) -> Profile:
    """A looked-up profile as a ``Profile``; raises the ``ValueError`` of an invalid one."""
    if isinstance(found, ValueError):
        raise found
    return found if isinstance(found, Profile) else from_object(found)


def decide(
    pod: Mapping, namespace: str, lookup: ProfileLookup, settings: Settings, fallback_namespace: str | None = None
) -> Injection:
    """The pod as it should be admitted, with its patch and skip reason. Pure: the lookup is a dict
    read, never an API call, so an admission costs no round trip to the API server. A profile
    missing in the pod's namespace is looked up in ``fallback_namespace`` (the operator's): the
    chart's ``default`` profile there serves every namespace that has none of its own."""
    name = ((pod.get("metadata") or {}).get("annotations") or {}).get(PROFILE_ANNOTATION, DEFAULT_PROFILE)
    found = lookup(namespace, name)
    if found is None and fallback_namespace and fallback_namespace != namespace:
        found = lookup(fallback_namespace, name)
    if found is None:
        return skip(dict(pod), f"SeatProfile {namespace}/{name} not found; create it or set {PROFILE_ANNOTATION}")
    try:
        profile = parse(found)
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


async def review(fn, payload: bytes | None, webhook: str, sslpeer, headers: Mapping) -> bytes:
    """The AdmissionReview answering ``payload`` (None: one over ``MAX_REVIEW_BYTES``), encoded:
    kopf's admission engine (``fn``, which runs the ``@kopf.on.mutate`` handler) with the patch
    ``answer`` handed over, and allowed whatever happens. orjson, not json: encoding the patch
    and the answer was 0.13 of a replica's CPU with the standard library."""
    if payload is None:
        return orjson.dumps(allow(None))
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return orjson.dumps(allow(None))
    holder: list[list] = []
    token = _ANSWER.set(holder)
    try:
        response = await fn(data, webhook=webhook, sslpeer=sslpeer, headers=headers)
        response["apiVersion"], response["kind"] = "admission.k8s.io/v1", "AdmissionReview"
        response.setdefault("response", {})["allowed"] = True  # fail open: see the module docstring
        response["response"].pop("status", None)
        if holder and holder[-1]:
            patch = base64.b64encode(orjson.dumps(holder[-1])).decode()
            response["response"].update(patchType="JSONPatch", patch=patch)
        return orjson.dumps(response)
    except Exception:
        return orjson.dumps(allow(data))
    finally:
        _ANSWER.reset(token)


_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_PENDING_LIMIT = 8  # reviews queued on one connection before it stops reading (pipelining clients)
# A connection with nothing in flight is closed after this long, as aiohttp's keep-alive timeout
# did: the API server's Go client keeps idle connections 90 s and reopens them as it needs.
IDLE_TIMEOUT_S = 75.0
MAX_HEADER_BYTES = 64 << 10  # the request line and headers; an AdmissionReview's are a few hundred bytes


class AdmissionProtocol(asyncio.Protocol):
    """HTTP/1.1 over one connection, parsed by httptools: every POST answered with ``review``.

    What kopf's aiohttp application did, less its routing, request and response objects, which
    were a fifth of a replica's CPU; answers go out in request order (HTTP/1.1 pipelining)."""

    def __init__(self, fn, path: str):
        self.fn, self.path = fn, path.rstrip("/")
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.last: asyncio.Future | None = None
        self.pending = 0

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.sslpeer = transport.get_extra_info("peercert")
        self.loop = asyncio.get_running_loop()
        self.active = self.loop.time()
        self.idle = self.loop.call_later(IDLE_TIMEOUT_S, self._close_if_idle)

    def connection_lost(self, exc) -> None:
        self.idle.cancel()

    def _close_if_idle(self) -> None:
        """One timer a connection, re-armed for what is left: cheaper than one a request."""
        left = self.active + IDLE_TIMEOUT_S - self.loop.time()
        if self.pending or left > 0:
            self.idle = self.loop.call_later(max(left, 0.0) or IDLE_TIMEOUT_S, self._close_if_idle)
        else:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.active = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:  # headers over the limit or an upgrade too: plain HTTP/1.1 only
            self.transport.write(_BAD_REQUEST)
            self.transport.close()

    def on_message_begin(self) -> None:
        # Header names are case-insensitive (RFC 9110), and kopf's own server handed handlers
        # aiohttp's case-insensitive multidict.
        self.url, self.headers, self.body, self.size, self.head = b"", CIMultiDict(), [], 0, 0

    def _count_head(self, size: int) -> None:
        self.head += size
        if self.head > MAX_HEADER_BYTES:
            raise ValueError("request head too large")  # feed_data raises it as a parser error

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        self.headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        # curl asks before sending a large body; behind an unanswered review the interim answer
        # would come out of order, and the client sends anyway after its wait.
        if self.headers.get("Expect", "").lower() == "100-continue" and self.pending == 0:
            self.transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size <= MAX_REVIEW_BYTES:
            self.body.append(body)

    def on_message_complete(self) -> None:
        payload = b"".join(self.body) if self.size <= MAX_REVIEW_BYTES else None
        webhook = httptools.parse_url(self.url).path.decode("latin-1").removeprefix(self.path).lstrip("/")
        keep_alive = self.parser.should_keep_alive()
        self.pending += 1
        if self.pending > _PENDING_LIMIT:
            self.transport.pause_reading()
        self.last = asyncio.ensure_future(self._respond(self.last, payload, webhook, self.headers, keep_alive))

    async def _respond(self, previous, payload: bytes | None, webhook: str, headers: Mapping, keep_alive: bool) -> None:
        body = await review(self.fn, payload, webhook, self.sslpeer, headers)
        if previous is not None:
            await previous
        if self.transport.is_closing():
            return
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (len(body), b"" if keep_alive else b"Connection: close\r\n", body)
        )
        self.pending -= 1
        if not keep_alive:
            self.transport.close()
        elif self.pending == _PENDING_LIMIT:
            self.transport.resume_reading()


async def until_files_change(paths: list[str], interval: float) -> None:
    """Return once the content of any of ``paths`` changes. Mounted Secrets are swapped by
    symlink and send no events that survive it, so the files are read again every ``interval``."""

    def digest() -> bytes:
        hasher = hashlib.sha256()
        for path in paths:
            hasher.update(Path(path).read_bytes())
        return hasher.digest()

    initial = digest()
    while True:
        await asyncio.sleep(interval)
        with contextlib.suppress(OSError):  # mid-rotation: a file may be missing for a moment
            if digest() != initial:
                return


def _fail_open_server():
    import kopf

    class FailOpenWebhookServer(kopf.WebhookServer):
        """kopf's HTTPS webhook server (its certificate handling: mounted or self-signed files,
        the CA bundle for the webhook configuration) serving ``AdmissionProtocol``, restarted
        with the new certificate when the files rotate."""

        async def __call__(self, fn):
            loop = asyncio.get_running_loop()
            files = [f for f in (self.certfile, self.pkeyfile, self.cafile) if f is not None]
            cadata, context = self._build_ssl()
            while True:
                port = self.port or self._allocate_free_port()
                server = await loop.create_server(
                    lambda: AdmissionProtocol(fn, self.path or ""), self.addr or None, port, ssl=context,
                    reuse_address=True, reuse_port=True,
                )  # fmt: skip
                try:
                    host = self.host or self.DEFAULT_HOST or self._get_accessible_addr(self.addr)
                    config = {"url": self._build_url("https" if context else "http", host, port, self.path or "")}
                    if cadata is not None:
                        config["caBundle"] = base64.b64encode(cadata).decode("ascii")
                    yield config
                    if not files:
                        await asyncio.Event().wait()
                    while True:  # the old certificate serves until the new files load together
                        await until_files_change(files, self.file_check_interval)
                        with contextlib.suppress(OSError, ssl.SSLError):  # half-written: wait for the rest
                            cadata, context = self._build_ssl()
                            break
                finally:
                    server.close()

    return FailOpenWebhookServer


def FailOpenWebhookServer(**kwargs):
    return _fail_open_server()(**kwargs)
