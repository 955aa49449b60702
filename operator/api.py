"""The operator's writes to objects other than the one a handler runs for.

kopf applies a handler's ``patch`` to the handler's own object only. A profile's status follows
its pods' events, and ``rollout: OnChange`` restarts Deployments when a profile changes: those
two writes go through ``merge_patch`` with the credentials kopf logged in with (the login
handler hands them to ``remember``): the service account in a cluster, a kubeconfig outside.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile

_CONNECTION = None  # kopf.ConnectionInfo
_SSL: ssl.SSLContext | bool = False  # built once a login, not once a request
_RELOGIN = None  # how to log in again when the API answers 401 (a rotated service-account token)


def remember(info, relogin=None) -> None:
    global _CONNECTION, _SSL, _RELOGIN
    _CONNECTION, _SSL, _RELOGIN = info, _ssl_context(info), relogin


def _data(value: str | bytes) -> bytes:
    """kubeconfig ``*-data`` fields are base64; kopf passes them through as found."""
    raw = value.encode() if isinstance(value, str) else value
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        return raw


def _ssl_context(info) -> ssl.SSLContext | bool:
    if not info.server.startswith("https"):
        return False
    if info.insecure:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    else:
        cadata = _data(info.ca_data).decode() if info.ca_data else None
        context = ssl.create_default_context(cafile=os.fspath(info.ca_path) if info.ca_path else None, cadata=cadata)
    cert, key = info.certificate_path, info.private_key_path
    if info.certificate_data and info.private_key_data:
        folder = tempfile.mkdtemp(prefix="flashrt-client-")
        cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        for path, value in ((cert, info.certificate_data), (key, info.private_key_data)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(_data(value))
    if cert and key:
        context.load_cert_chain(os.fspath(cert), os.fspath(key))
    return context


async def merge_patch(path: str, body: dict) -> int:
    """PATCH ``path`` (``/apis/...``) with a JSON merge patch; the HTTP status (404: gone). A 401
    logs in again once (kubelet rotates projected service-account tokens) and retries."""
    status = await _patch_once(path, body)
    if status == 401 and _RELOGIN is not None:
        info = _RELOGIN()
        if info is not None:
            remember(info, _RELOGIN)
            status = await _patch_once(path, body)
    if status >= 300 and status != 404:
        raise RuntimeError(f"PATCH {path}: HTTP {status}")
    return status


async def _patch_once(path: str, body: dict) -> int:
    import aiohttp

    info = _CONNECTION
    if info is None:
        raise RuntimeError("not logged in: the operator's login handler has not run")
    headers = {"Content-Type": "application/merge-patch+json"}
    if info.token:
        headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
    auth = aiohttp.BasicAuth(info.username, info.password or "") if info.username else None
    async with (
        aiohttp.ClientSession(auth=auth) as session,
        session.patch(info.server.rstrip("/") + path, json=body, headers=headers, ssl=_SSL) as r,
    ):
        return r.status
