"""The real operator against kmock's Kubernetes emulator: what the tests and the webhook benchmark run.

kopf's backbone waits until namespaces and CRDs are discoverable before it watches anything, so
the emulator declares them beside the resources the handlers use.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

RESOURCES = (
    ("flashrt.io/v1alpha1/seatprofiles", "SeatProfile", True),
    ("v1/pods", "Pod", True),
    ("apps/v1/deployments", "Deployment", True),
    ("apps/v1/statefulsets", "StatefulSet", True),
    ("v1/events", "Event", True),
    ("v1/namespaces", "Namespace", False),
    ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition", False),
)


def declare_resources(api) -> None:
    for resource, kind, namespaced in RESOURCES:
        api.resources[resource] = {"namespaced": namespaced, "verbs": {"list", "watch", "get", "patch", "create"}}
        api.resources[resource].kind = kind


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, made by the openssl command line."""
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def running_operator(api, namespaces: list[str], cert: Path, key: Path) -> AsyncIterator[str]:
    """Start ``flashrt.operator.handlers`` logged in to ``api``; yield the webhook's URL once it answers."""
    declare_resources(api)
    async with operator_at(str(api.url), namespaces, cert, key) as url:
        yield url


@contextlib.asynccontextmanager
async def operator_at(api_url: str, namespaces: list[str], cert: Path, key: Path) -> AsyncIterator[str]:
    """The operator logged in to the API server at ``api_url`` (one whose resources are declared);
    the benchmark runs replicas of it in processes of their own."""
    import aiohttp
    import kopf

    port = free_port()
    env = {"FLASHRT_OPERATOR_WEBHOOK_PORT": str(port), "FLASHRT_OPERATOR_TLS_CERT": str(cert),
           "FLASHRT_OPERATOR_TLS_KEY": str(key)}  # fmt: skip
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import flashrt.operator.handlers as handlers

    registry = kopf.get_default_registry()

    @kopf.on.login(registry=registry)
    def login(**_):
        from flashrt.operator import api as client

        info = kopf.ConnectionInfo(server=api_url)
        client.remember(info)
        return info

    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    settings.posting.level = 0
    stop = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        kopf.operator(registry=registry, settings=settings, namespaces=namespaces, standalone=True, stop_flag=stop)
    )
    url = f"https://127.0.0.1:{port}{handlers.WEBHOOK_PATH}"
    context = ssl.create_default_context(cafile=str(cert))
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.post(url, data=b"{}", ssl=context) as r:
                        await r.read()
                        break
                await asyncio.sleep(0.05)
        yield url
    finally:
        # Past a graceful second, cancelled: stopped by its flag, kopf waits 5 s for every task
        # begun since it started (the API server's and the clients' connections among them).
        stop.set_result(None)
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(task, timeout=1)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
