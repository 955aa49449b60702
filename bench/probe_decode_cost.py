"""How much of the ring form's one-token time is its decode?

``bench/probe_rows.py`` (H200, 3f2dd04): a one-token call of ours costs 4.27 us plus its bytes
at 3.78 TB/s, where a kernel that only reads the same bytes costs 2.17 us plus 4.57 TB/s. The
loop is 337 SASS instructions a step a warp at one token, 246 of them the decode (15 a word and
the scales), so the decode is the first suspect for both the slower rate and the larger fixed
cost (what the SMs hold when the last bytes land is decoded after them). Leaving a stage out
and doing it twice, on the same ring, the same tuned config and the same bytes, measures it:

* ``base``: the form as served (checked against the reference first);
* ``nodecode``: each word's four pairs are the word itself, no scales (143 instructions a
  step instead of 337; the output is garbage, only its time counts);
* ``double``: the decode done twice, the second on the first's pairs folded into the word;
* ``read``: the read-only kernel of ``probe_rows`` on the same bytes, the floor.

If ``nodecode`` runs at the read-only figures, the decode's issue is what separates them and a
cheaper decode is the only lever; if it runs where ``base`` does, the ring itself (its copies,
barriers, shared memory) is. ``double`` says how far the time follows the instruction count.

Each arm compiles in a process of its own (the decode is a module constant the kernel reads
when it compiles), with a fresh Triton cache. Weights in ``ring_layout`` as seats hold them on
Hopper; the H200's tuned config for each shape (``kernels/choices``).

H200 (4140803, ``h200-probe-decode-cost-4140803.json``): without the decode 4-14% faster
(gate_up at one token 19.73 us against 21.95), still 20% over the read-only kernel (16.48);
twice the decode 58% slower. So the ring, not the decode's issue, is most of the gap.

``python3 bench/probe_decode_cost.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import json
import os
import subprocess
import sys
import tempfile

SHAPES = {
    "llama_qkv": (6144, 4096),
    "llama_gate_up": (28672, 4096),
    "llama_down": (4096, 14336),
    "lm_head": (151936, 2048),
}
TOKENS = (1, 16)
ARMS = ("base", "nodecode", "double")


def decode_twice_ptx() -> str:
    """``ring_layout.decode_ptx`` done twice: the second decodes the word XOR-ed with the first's
    four pairs, so neither can be dropped or merged."""
    from flashrt.kernels import ring_layout

    lines = ring_layout.decode_ptx().splitlines()
    body = lines[3:-1]  # after "{", ".reg", "mov scale2"; before "}"
    fold = ["xor.b32 w2, $4, $0;", *[f"xor.b32 w2, w2, ${q};" for q in (1, 2, 3)]]
    again = [line.replace("$4", "w2") for line in body]
    return "\n".join(["{", ".reg .b32 m, s, scale2, w2;", lines[2], *body, *fold, *again, "}"])


def patch(arm: str) -> None:
    from flashrt.kernels import linear_mma_gluon
    from triton.experimental.gluon import language as gl

    if arm == "nodecode":
        linear_mma_gluon._DECODE_RING = gl.constexpr("\n".join(f"mov.b32 ${q}, $4;" for q in range(4)))
    elif arm == "double":
        linear_mma_gluon._DECODE_RING = gl.constexpr(decode_twice_ptx())


def tuned_ring_cases(tokens=TOKENS, shapes=SHAPES):
    """``(shape, weight, its bytes in ring_layout, activations, config)`` at each of ``tokens``
    (in that order: a run cut short loses the last) for each of ``shapes`` that the H200 serves
    with the ring form there, in its tuned config (``kernels/choices``); random operands, the same
    every run."""
    import torch
    from flashrt.bench.probe_warps import tuned
    from flashrt.kernels import nvfp4, ring_layout

    torch.manual_seed(0)
    weights = {}
    for shape, (n, k) in shapes.items():
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        weights[shape] = w, ring_layout.pack(w.packed)
    for m in tokens:
        for shape, (n, k) in shapes.items():
            form, config = tuned(m, n, k) or (None, None)
            if form == "mma_gluon":
                yield shape, *weights[shape], torch.randn(m, k, device="cuda", dtype=torch.bfloat16), config


def time_ring_arms(path: str, arms_for, tokens=TOKENS, deadline_s: float | None = None, shapes=SHAPES) -> None:
    """The probes' harness over ``tuned_ring_cases(tokens, shapes)``: for each, the ring as served and
    the arms ``arms_for(config, operands)`` adds (name -> run on ``out``; the config in the ring
    layout, operands ``x, ring words, scales, global scale, bias``), each checked against the
    reference, then timed (``probe_ring_depth.timed``); at one token the read-only floor too.
    A row's kernels are compiled together first (``tuning.compile_ahead``). The JSON is
    rewritten after each row, and no row starts past ``deadline_s``."""
    import functools
    import json
    import time

    import torch
    from flashrt.bench.kernels import provenance
    from flashrt.bench.probe_ring_depth import timed
    from flashrt.bench.probe_rows import read_us
    from flashrt.bench.timing import copy_bandwidth_tbps
    from flashrt.kernels import linear_mma_gluon, ops, ring_layout
    from flashrt.kernels.tuning import compile_ahead

    start = time.monotonic()
    result = {**provenance(), "copy_TBps": copy_bandwidth_tbps(), "rows": []}
    for shape, w, ring, x, config in tuned_ring_cases(tokens, shapes):
        if deadline_s is not None and time.monotonic() - start > deadline_s:
            print("deadline: stopping", flush=True)
            break
        (m, k), n = x.shape, w.shape[0]
        ref = ops.linear_reference(x, w)
        cfg = {**config, "LAYOUT": ring_layout.RING}
        operands = (x, ring, w.scales, w.global_scale, None)
        arms = {"ring": lambda o, c=cfg, a=operands: linear_mma_gluon.launch(*a, o, c, True)}
        arms |= arms_for(cfg, operands)
        row = {"shape": shape, "N": n, "K": k, "M": m, "config": config, "arms": {}}
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        compile_ahead([functools.partial(run, out) for run in arms.values()])
        for arm, run in arms.items():
            row["arms"][arm] = figure = timed(functools.partial(run, out), out, ref)
            print(f"{shape:14s} M={m:2d} {arm:16s} {json.dumps(figure)}", flush=True)
        if m == 1:
            row["read_us"], row["read_tiling"] = read_us(w)
        result["rows"].append(row)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def run_arm(arm: str, path: str) -> None:
    """One arm, every shape and token count: microseconds (``ops._time_us``)."""
    patch(arm)
    import torch
    from flashrt.bench.probe_ring_depth import rel_err
    from flashrt.bench.probe_rows import read_us
    from flashrt.bench.timing import copy_bandwidth_tbps
    from flashrt.kernels import linear_mma_gluon, ops, ring_layout

    rows = []
    for shape, w, ring, x, config in tuned_ring_cases():
        (m, k), n = x.shape, w.shape[0]
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        cfg = {**config, "LAYOUT": ring_layout.RING}

        def run(x=x, out=out, ring=ring, w=w, cfg=cfg):
            return linear_mma_gluon.launch(x, ring, w.scales, w.global_scale, None, out, cfg, True)

        run()
        row = {"shape": shape, "N": n, "K": k, "M": m, "config": config, "us": ops._time_us(run)}
        if arm == "base":
            row["rel_err"] = rel_err(out, ops.linear_reference(x, w))
            if m == TOKENS[0]:
                row["read_us"], row["read_tiling"] = read_us(w)
        rows.append(row)
        print(f"{arm:9s} {shape:14s} M={m:2d} {row['us']:8.2f} us", flush=True)
    with open(path, "w") as f:
        json.dump({"copy_TBps": copy_bandwidth_tbps() if arm == "base" else None, "rows": rows}, f)


def main(path: str) -> None:
    from flashrt.bench.kernels import provenance

    result = {**provenance(), "arms": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in ARMS:
            part = os.path.join(tmp, f"{arm}.json")
            env = {**os.environ, "TRITON_CACHE_DIR": os.path.join(tmp, f"cache-{arm}")}
            done = subprocess.run([sys.executable, __file__, "--arm", arm, part], env=env, check=False)
            if done.returncode or not os.path.exists(part):
                result["arms"][arm] = {"error": f"exit {done.returncode}"}
                continue
            with open(part) as f:
                result["arms"][arm] = json.load(f)
            with open(path, "w") as f:
                json.dump(result, f, indent=1)
    base = {(r["shape"], r["M"]): r for r in result["arms"].get("base", {}).get("rows", [])}
    for arm in ARMS[1:]:
        for r in result["arms"].get(arm, {}).get("rows", []):
            b = base.get((r["shape"], r["M"]))
            if b:
                floor = f"  read-only {b['read_us']:7.2f}" if "read_us" in b else ""
                print(f"{r['shape']:14s} M={r['M']:2d}: base {b['us']:7.2f}  {arm} {r['us']:7.2f} us{floor}")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "--arm":
        run_arm(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
