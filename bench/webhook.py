"""``python -m flashrt.bench webhook``: admissions per second and latency of the real webhook.

The operator runs as in its tests (kopf, logged in to kmock's Kubernetes emulator, the HTTPS
webhook with a self-signed certificate); 50 clients on loopback, in another process (as the API
server is), send AdmissionReviews of a vLLM pod as fast as the server answers, each client one
request at a time. Prints and writes p50/p99 and throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import platform
import ssl
import statistics
import tempfile
import time
from pathlib import Path


def _pod(i: int) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"vllm-{i}", "namespace": "serving", "labels": {"flashrt.io/inject": "enabled"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["--model", "m"],
                                 "env": [{"name": "HF_HOME", "value": "/data"}]}]},
    }  # fmt: skip


def _review(i: int) -> bytes:
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": f"u-{i}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "serving",
                    "operation": "CREATE", "userInfo": {"username": "bench"}, "object": _pod(i)},
    }).encode()  # fmt: skip


async def _answer(session, url: str, body: bytes, context) -> bytes:
    async with session.post(url, data=body, ssl=context) as r:
        return await r.read()


async def _clients(url: str, cafile: str, clients: int, requests: int) -> tuple[list[float], float, int]:
    import aiohttp

    context = ssl.create_default_context(cafile=cafile)
    latencies: list[float] = []
    injected = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        await asyncio.gather(*(_answer(session, url, _review(c), context) for c in range(clients)))  # connect

        async def client(c: int) -> None:
            nonlocal injected
            for i in range(requests // clients):
                body = _review(c * 100000 + i)
                start = time.perf_counter()
                answer = json.loads(await _answer(session, url, body, context))
                latencies.append(time.perf_counter() - start)
                injected += "patch" in answer["response"]

        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return latencies, time.perf_counter() - start, injected


def _event_loop():
    """uvloop where installed, as ``kopf run`` chooses (the operator extra installs it)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _clients_process(url: str, cafile: str, clients: int, requests: int) -> tuple[list[float], float, int]:
    with asyncio.Runner(loop_factory=_event_loop()) as runner:
        return runner.run(_clients(url, cafile, clients, requests))


async def run(clients: int, requests: int) -> dict:
    import aiohttp
    import kmock
    from flashrt.operator.emulated import running_operator, self_signed_certificate

    cert, key = self_signed_certificate(Path(tempfile.mkdtemp()))
    context = ssl.create_default_context(cafile=str(cert))
    profile = {"apiVersion": "flashrt.io/v1alpha1", "kind": "SeatProfile",
               "metadata": {"name": "default", "namespace": "serving"}, "spec": {}}  # fmt: skip
    async with (
        kmock.KubernetesEmulator() as api,
        kmock.Server(api),
        running_operator(api, ["serving"], cert, key) as url,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session,
    ):
        async with session.post(f"{api.url}/apis/flashrt.io/v1alpha1/namespaces/serving/seatprofiles", json=profile):
            pass
        for _ in range(200):  # until the profile is indexed and pods get patched
            async with session.post(url, data=_review(0), ssl=context) as r:
                if "patch" in (await r.json())["response"]:
                    break
            await asyncio.sleep(0.05)
        ready = json.loads(await _answer(session, url, _review(1), context))
        assert "patch" in ready["response"], "the operator did not inject: see its log"
        loop = asyncio.get_running_loop()
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            latencies, wall, injected = await loop.run_in_executor(
                pool, _clients_process, url, str(cert), clients, requests
            )
    latencies.sort()
    return {
        "clients": clients,
        "requests": len(latencies),
        "injected": injected,
        "admissions_per_s": len(latencies) / wall,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1e3,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loop": "uvloop" if _event_loop() else "asyncio",
        "note": "clients in one process, the operator in another, on the same cores",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt.bench webhook")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("kopf").setLevel(logging.WARNING)
    with asyncio.Runner(loop_factory=_event_loop()) as runner:
        result = runner.run(run(args.clients, args.requests))
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
