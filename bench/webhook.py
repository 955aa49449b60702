"""``python -m flashrt.bench webhook``: admissions per second and latency of the real webhook.

The operator runs as in its tests (kopf, logged in to kmock's Kubernetes emulator, the HTTPS
webhook with a self-signed certificate), as many replicas as the chart deploys (two by default,
``--replicas``), each in a process of its own as each is a pod; kopf's peering pauses watching in
all but one replica, never the webhook server, so every replica answers admissions and the
Service spreads the API server's connections over them. 50 clients on loopback, in another
process (as the API server is), send AdmissionReviews of a vLLM pod as fast as the servers
answer, each client one request at a time on its own keep-alive connection, the connections
spread over the replicas. Prints and writes p50/p99 and throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import platform
import ssl
import statistics
import tempfile
import time
from pathlib import Path

NAMESPACE = "serving"


def _pod(i: int) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"vllm-{i}", "namespace": NAMESPACE, "labels": {"flashrt.io/inject": "enabled"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["--model", "m"],
                                 "env": [{"name": "HF_HOME", "value": "/data"}]}]},
    }  # fmt: skip


def _review(i: int) -> bytes:
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": f"u-{i}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": NAMESPACE,
                    "operation": "CREATE", "userInfo": {"username": "bench"}, "object": _pod(i)},
    }).encode()  # fmt: skip


async def _answer(session, url: str, body: bytes, context) -> bytes:
    async with session.post(url, data=body, ssl=context) as r:
        return await r.read()


class _Connection:
    """One keep-alive HTTPS connection speaking just enough HTTP/1.1 to post an AdmissionReview
    and read the answer: the load generator must cost little next to the server on two shared
    cores (the API server that calls a webhook is a Go process on other machines). aiohttp's
    client took about as much CPU a request as the operator (commit 1f077ab: 2159 admissions/s,
    p50 22 ms, p99 36 ms with it)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, path: str):
        self.reader, self.writer, self.host, self.path = reader, writer, host, path

    @classmethod
    async def open(cls, url: str, context) -> _Connection:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port, ssl=context)
        return cls(reader, writer, f"{parts.hostname}:{parts.port}", parts.path or "/")

    async def post(self, body: bytes) -> bytes:
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        headers = await self.reader.readuntil(b"\r\n\r\n")
        status = headers.split(b" ", 2)[1]
        if status != b"200":
            raise RuntimeError(f"webhook answered {headers.decode(errors='replace')!r}")
        length = next(
            int(line.split(b":", 1)[1])
            for line in headers.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return await self.reader.readexactly(length)


async def _clients(urls: list[str], cafile: str, clients: int, requests: int) -> tuple[list[float], float, int]:
    context = ssl.create_default_context(cafile=cafile)
    latencies: list[float] = []
    injected = 0
    connections = [await _Connection.open(urls[c % len(urls)], context) for c in range(clients)]
    for c, connection in enumerate(connections):  # warm each connection once
        await connection.post(_review(c))

    # Every review is encoded before the clock starts, and an answer is told injected by its
    # patch field: the clients' CPU is taken from the servers on two shared cores.
    reviews = [[_review(c * 100000 + i) for i in range(requests // clients)] for c in range(clients)]

    async def client(c: int) -> None:
        nonlocal injected
        connection = connections[c]
        for body in reviews[c]:
            start = time.perf_counter()
            answer = await connection.post(body)
            latencies.append(time.perf_counter() - start)
            injected += b'"patch":' in answer

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    wall = time.perf_counter() - start
    for connection in connections:
        connection.writer.close()
    return latencies, wall, injected


def _event_loop():
    """uvloop where installed, as ``kopf run`` chooses (the operator extra installs it)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _clients_process(urls: list[str], cafile: str, clients: int, requests: int) -> tuple[list[float], float, int]:
    with asyncio.Runner(loop_factory=_event_loop()) as runner:
        return runner.run(_clients(urls, cafile, clients, requests))


def _replica_process(api_url: str, cert: str, key: str, conn) -> None:
    """One operator replica: sends its webhook URL, serves until told to stop."""
    import logging

    logging.getLogger("kopf").setLevel(logging.WARNING)

    async def serve() -> None:
        from flashrt.operator.emulated import operator_at

        async with operator_at(api_url, [NAMESPACE], Path(cert), Path(key)) as url:
            conn.send(url)
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)

    with asyncio.Runner(loop_factory=_event_loop()) as runner:
        runner.run(serve())


async def _until_injecting(session, url: str, context) -> None:
    """Until the replica has indexed the profile and patches pods."""
    import aiohttp

    for _ in range(400):
        with contextlib.suppress(aiohttp.ClientError, OSError, KeyError, ValueError):
            if "patch" in json.loads(await _answer(session, url, _review(0), context))["response"]:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the operator at {url} did not inject: see its log")


async def run(clients: int, requests: int, replicas: int) -> dict:
    import aiohttp
    import kmock
    from flashrt.operator.emulated import declare_resources, self_signed_certificate

    cert, key = self_signed_certificate(Path(tempfile.mkdtemp()))
    context = ssl.create_default_context(cafile=str(cert))
    profile = {"apiVersion": "flashrt.io/v1alpha1", "kind": "SeatProfile",
               "metadata": {"name": "default", "namespace": NAMESPACE}, "spec": {}}  # fmt: skip
    spawn = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    async with (
        kmock.KubernetesEmulator() as api,
        kmock.Server(api),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session,
    ):
        declare_resources(api)
        async with session.post(
            f"{api.url}/apis/flashrt.io/v1alpha1/namespaces/{NAMESPACE}/seatprofiles", json=profile
        ):
            pass
        pipes = [spawn.Pipe() for _ in range(replicas)]
        procs = [spawn.Process(target=_replica_process, args=(str(api.url), str(cert), str(key), child))
                 for _, child in pipes]  # fmt: skip
        for proc in procs:
            proc.start()
        try:
            urls = [await loop.run_in_executor(None, parent.recv) for parent, _ in pipes]
            for url in urls:
                await _until_injecting(session, url, context)
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
                latencies, wall, injected = await loop.run_in_executor(
                    pool, _clients_process, urls, str(cert), clients, requests
                )
        finally:
            for parent, _ in pipes:
                parent.send("stop")
            for proc in procs:
                await loop.run_in_executor(None, proc.join, 15)
    latencies.sort()
    return {
        "clients": clients,
        "replicas": replicas,
        "requests": len(latencies),
        "injected": injected,
        "admissions_per_s": len(latencies) / wall,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1e3,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loop": "uvloop" if _event_loop() else "asyncio",
        "note": "each replica, the clients (plain asyncio streams over TLS) and the API emulator in "
        "processes of their own, on the same cores",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt.bench webhook")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--replicas", type=int, default=2, help="operator replicas (the chart deploys 2)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("kopf").setLevel(logging.WARNING)
    with asyncio.Runner(loop_factory=_event_loop()) as runner:
        result = runner.run(run(args.clients, args.requests, args.replicas))
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
