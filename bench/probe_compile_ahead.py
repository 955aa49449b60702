"""How long adjudicating a shape takes on a cold device, with its candidates compiled ahead on a
thread pool (``tuning.compile_ahead``) and one after another as each is first timed.

Each way runs in a process of its own, with empty Triton and flashrt caches, so every candidate
is compiled from source: what an attach on a fresh node pays. The two ways must choose among
the same candidates; which one wins may differ within the adjudicator's noise.

``python3 bench/probe_compile_ahead.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import json
import os
import subprocess
import sys
import tempfile
import time

# Layers whose candidates differ in kind: the chunked ring forms at one token, the split ring
# forms at 16, Qwen3-30B's expert bank at 8.
LINEARS = (("qkv", 6144, 4096, 1), ("expert_gate_up_30b", 1536, 2048, 16))
BANK = ("qwen3-30b-a3b", 128, 768, 2048, 8, 8)


def adjudicate(ahead: bool) -> dict:
    """In this process: every shape chosen afresh (its first call), its wall time and what it chose."""
    import torch
    from flashrt.bench.kernels import _routing
    from flashrt.kernels import moe_ring_gluon, nvfp4, ops, tuning

    if not ahead:
        tuning.compile_ahead = lambda launches, workers=None: 0
    torch.manual_seed(0)
    rows = {}

    def first_call(layer: str, m: int, call) -> None:
        before = set(tuning.TUNER.all_notes())
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        (key,) = set(tuning.TUNER.all_notes()) - before
        notes = tuning.TUNER.notes(key)
        rows[layer] = {"M": m, "seconds": seconds, "candidates": len(notes) - 1, "chosen": notes[-1]}

    for name, n, k, m in LINEARS:
        w = ops.for_serving(nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16)))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        first_call(name, m, lambda x=x, w=w: ops.linear(x, w))
    name, e, inter, hidden, t, top = BANK
    gate_up = nvfp4.quantize(torch.randn(e, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16) * 0.02)
    down = nvfp4.quantize(torch.randn(e, hidden, inter, device="cuda", dtype=torch.bfloat16) * 0.02)
    gate_up, down = ops.bank_for_serving(gate_up, down, moe_ring_gluon.MAX_TOKENS)
    x = torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16)
    ids, weights = _routing(t, e, top, 0)
    first_call(name + " bank", t, lambda: ops.moe(x, gate_up, down, ids, weights))
    return {"candidates": rows}


def main(path: str) -> None:
    from flashrt.bench.kernels import provenance

    result = {**provenance(), "cpus": os.cpu_count(), "ways": {}}
    for way in ("serial", "ahead"):
        env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(), FLASHRT_CACHE_DIR=tempfile.mkdtemp())
        done = subprocess.run([sys.executable, __file__, "--way", way], env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{way}: exit {done.returncode}\n{done.stderr[-3000:]}")
        result["ways"][way] = json.loads(done.stdout.strip().splitlines()[-1])["candidates"]
        for layer, row in result["ways"][way].items():
            print(f"{way:6s} {layer:26s} M={row['M']:3d} {row['seconds']:6.1f} s  {row['chosen']}", flush=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "--way":
        print(json.dumps(adjudicate(sys.argv[2] == "ahead")))
    else:
        main(sys.argv[1])
