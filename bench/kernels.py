"""``python -m flashrt.bench kernels``: NVFP4 linear and expert bank against the other formats.

Every arm is measured in the same run on the same device (``bench.timing``: CUDA graphs,
weights rotated past L2, medians). The table goes to stdout; the JSON with its provenance to
``bench/results/<gpu>-kernels-<commit>.json``. A whole run is longer than one ten-minute device
call, so ``bench/results/h200-kernels.json`` is the runs listed in ``DEFAULT_RESULTS`` merged
(``--merge``, no GPU needed; ``bench.merge``), each row with its run's commit, file and copy
bandwidth.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from flashrt.bench import merge
from flashrt.bench.timing import copies_for, copy_bandwidth_tbps, eager_us, graph_us
from flashrt.kernels import linear_mma_ws_gluon, moe_fused, moe_ring_gluon, nvfp4, ops
from flashrt.kernels.nvfp4 import NVFP4Weight
from flashrt.kernels.tuning import TUNER

# (name, N, K): design.md's anchors plus the expert shapes of Qwen3-30B-A3B (768 inter) and
# Qwen3.5-35B-A3B (512 inter).
LINEAR_SHAPES = [
    ("qkv", 6144, 4096),
    ("gate_up", 28672, 4096),
    ("down", 4096, 14336),
    ("lm_head", 151936, 2048),
    ("expert_gate_up_30b", 1536, 2048),
    ("expert_down_30b", 2048, 768),
    ("expert_gate_up_35b", 1024, 2048),
    ("expert_down_35b", 2048, 512),
]
# The probes' layers: the table's, with Llama-3-8B's o projection after its four.
PROBE_SHAPES = [*LINEAR_SHAPES[:4], ("o", 4096, 4096), *LINEAR_SHAPES[4:]]
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 512, 2048]
# (name, E, top_k, hidden, inter)
MOE_SHAPES = [("qwen3-30b-a3b", 128, 8, 2048, 768), ("qwen3.5-35b-a3b", 256, 8, 2048, 512)]
MOE_TOKENS = [1, 4, 8, 16, 64, 256]

DEFAULT_RESULTS = [  # the first run that has a measurement gives it
    merge.RESULTS / "h200-kernels-bank-stages-c797099.json",  # both banks at 16 and 32, 2-stage rings offered there
    merge.RESULTS / "h200-kernels-experts-large-23ada83.json",  # the expert linears at 64-2048, narrow decode tiles
    merge.RESULTS / "h200-kernels-m64-128-16f57c4.json",  # every linear at 64 and 128, re-tuned (compile_ahead)
    merge.RESULTS / "h200-kernels-m32-17801e0.json",  # qkv, down and the expert linears at 32, re-tuned
    merge.RESULTS / "h200-kernels-m32b-16f57c4.json",  # gate_up and the LM head at 32, re-tuned
    merge.RESULTS / "h200-kernels-experts-16f57c4.json",  # the expert linears at 1-16, re-tuned
    merge.RESULTS / "h200-kernels-wide-stages-99e436d.json",  # Llama's four at 4-16, 2-stage rings from 16-token tiles
    merge.RESULTS / "h200-kernels-stages-7c8dda6.json",  # Llama's four at 1-2 and both banks at 1-8, 2-stage rings
    merge.RESULTS / "h200-kernels-m128-e0910ac.json",  # Llama's four and the LM head at 128, re-tuned
    merge.RESULTS / "h200-kernels-lmhead2048-e0910ac.json",  # the LM head at 2048
    merge.RESULTS / "h200-kernels-small-59aeccb.json",  # qkv and the expert linears at 64-2048
    merge.RESULTS / "h200-kernels-large-4f7f091.json",  # Llama's four and the LM head at 32-2048 (to 512)
    merge.RESULTS / "h200-kernels-moe-37845a7.json",  # both banks at 1, 8 and 16 tokens again
    merge.RESULTS / "h200-kernels-m1-37845a7.json",  # qkv, gate_up, down, lm_head at 1 and 16 tokens again
    merge.RESULTS / "h200-kernels-moe-m512-fd9e9fb.json",  # both banks at 1-256 tokens; linear at 512 (wgmma to 512)
    merge.RESULTS / "h200-kernels-quantize-0ea68c7.json",  # quantize, the reference run on the GPU (71fbefa)
    merge.RESULTS / "h200-kernels-856a2cf.json",  # quantize; linear qkv, gate_up, down, lm_head (cut at the limit)
    merge.RESULTS / "h200-kernels-experts-856a2cf.json",  # the expert linears and both banks
]
DEFAULT_MERGED = merge.RESULTS / "h200-kernels.json"
# What every merged run must share; a row's own commit, date, file and copy bandwidth go into the row.
SHARED = ("device", "capability", "cuda", "torch", "triton")


def key(row: dict) -> tuple:
    """One measurement of the table: an op on a shape at a token count (quantize rows have none)."""
    return row["op"], row["name"], row.get("M")


def merged_result(paths: list[Path]) -> dict:
    """The runs at ``paths`` as one result (``merge.merged_result``) with the issue's summary of its
    rows; ``copy_TBps`` lists each source's copy bandwidth, in the order of ``sources``."""
    merged = merge.merged_result(paths, SHARED, key, tags=("copy_TBps",))
    copy = {row["source"]: row["copy_TBps"] for row in merged["rows"]}
    return merged | {"copy_TBps": [copy[source] for source in merged["sources"]], "summary": summarize(merged["rows"])}


def source_digest() -> str:
    """sha256 (16 hex) of the package's Python sources by path: names the code that ran where git
    cannot (the device's copy of the tree carried the session's first commit as its HEAD)."""
    import hashlib

    import flashrt

    root = Path(flashrt.__file__).parent
    files = {}
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        files |= {(Path(folder) / n).relative_to(root).as_posix(): Path(folder) / n for n in names if n.endswith(".py")}
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].read_bytes())
    return digest.hexdigest()[:16]


def source_commit(cwd: str | None = None) -> str:
    """``FLASHRT_COMMIT``, else git's HEAD, with ``-dirty`` where the tree differs from it. The
    device's copy of the tree carries the session's first commit as HEAD under the session's
    latest files: a result measured there without ``FLASHRT_COMMIT`` named a commit whose code
    had not run (ba64f9a's run recorded 7554cb7), and ``-dirty`` says so in the result itself."""
    commit = os.environ.get("FLASHRT_COMMIT")
    if commit:
        return commit
    git = functools.partial(subprocess.check_output, text=True, stderr=subprocess.DEVNULL, cwd=cwd)
    try:
        head = git(["git", "rev-parse", "HEAD"]).strip()
        changed = git(["git", "status", "--porcelain"]).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if changed else head


def provenance() -> dict:
    """Device, versions, commit and date of a result: the GPU's, or on a machine without one the
    processor's (``bench host`` runs on both)."""
    import triton

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = {
            "device": props.name,
            "capability": f"sm_{props.major}{props.minor}",
            "sms": props.multi_processor_count,
            "cuda": torch.version.cuda,
        }
    else:
        device = {"device": platform.processor() or platform.machine(), "cpus": torch.get_num_threads()}
    return device | {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "commit": source_commit(),
        "source_digest": source_digest(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        # kernel choices already cached when the run started (bench/gpu_run.sh seeds them from
        # kernels/choices/): attach times and warm-up figures depend on it; -1: not recorded
        "tuning_shapes_at_start": int(os.environ.get("TUNING_SHAPES_AT_START") or -1),
    }


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


# -- linear ----------------------------------------------------------------------------------------


def _int4_arm(w: torch.Tensor):
    """PyTorch's int4 tinygemm (group 128), random codes: only its time is used."""
    n, k = w.shape
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=w.device)
    packed = torch._convert_weight_to_int4pack(codes, 8)
    scales_zeros = torch.ones(k // 128, n, 2, dtype=torch.bfloat16, device=w.device)
    return lambda x: torch._weight_int4pack_mm(x, packed, 128, scales_zeros)


def _fp8_arm(w: torch.Tensor):
    w8 = w.to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32, device=w.device)

    def run(x8):
        return torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return run


def bench_linear(name: str, n: int, k: int, tokens: list[int], bw: float, record: Callable[[dict], None]) -> None:
    """Each M's row handed to ``record`` as soon as it is measured (which saves it: a run cut short
    by a time limit keeps every row it finished)."""
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = ops.for_serving(nvfp4.quantize(w))  # the layout a seat serves it in
    qbytes = q.nbytes
    q_copies = [q] + [
        NVFP4Weight(q.packed.clone(), q.scales.clone(), q.global_scale.clone(), q.layout)
        for _ in range(copies_for(qbytes) - 1)
    ]
    w_copies = [w] + [w.clone() for _ in range(copies_for(w.numel() * 2) - 1)]
    arms_other = {}
    for arm, make in (("fp8", _fp8_arm), ("int4", _int4_arm)):
        try:
            arms_other[arm] = [make(wc) for wc in w_copies]
        except Exception as exc:
            print(f"  {arm} arm unavailable for {name}: {type(exc).__name__}: {exc}")
    for m in tokens:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        out = ops.linear(x, q)  # tunes this shape once
        err = _rel_err(out, ops.linear_reference(x, q))
        row = {
            "op": "linear",
            "name": name,
            "N": n,
            "K": k,
            "M": m,
            "rel_err": err,
            "form": ops.choose_linear(x, q.packed, q.scales, q.global_scale, None, q.layout).name,
            "layout": q.layout,
        }
        row["ours_us"] = graph_us([lambda qc=qc: ops.linear(x, qc) for qc in q_copies])
        row["bf16_us"] = graph_us([lambda wc=wc: F.linear(x, wc) for wc in w_copies])
        if "fp8" in arms_other:
            x8 = x.to(torch.float8_e4m3fn)
            try:
                row["fp8_us"] = graph_us([lambda f=f: f(x8) for f in arms_other["fp8"]])
            except Exception as exc:
                row["fp8_us"] = None
                row["fp8_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        if "int4" in arms_other:
            try:
                row["int4_us"] = graph_us([lambda f=f: f(x) for f in arms_other["int4"]])
            except Exception as exc:
                row["int4_us"] = None
                row["int4_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        row["weight_bytes"] = qbytes
        row["bandwidth_frac"] = qbytes / (row["ours_us"] * 1e-6) / (bw * 1e12)
        row["speedup_vs_bf16"] = row["bf16_us"] / row["ours_us"]
        print(
            f"  linear {name:22s} M={m:5d} ours {row['ours_us']:8.2f} us  bf16 {row['bf16_us']:8.2f}  "
            f"fp8 {row.get('fp8_us') or float('nan'):8.2f}  int4 {row.get('int4_us') or float('nan'):8.2f}  "
            f"x{row['speedup_vs_bf16']:.2f}  bw {row['bandwidth_frac']:.2f}  err {err:.1e}  {row['form']}",
            flush=True,
        )
        record(row)


# -- expert bank -----------------------------------------------------------------------------------


def _routing(t: int, e: int, top_k: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(t, e, device="cuda", generator=gen)
    weights, ids = torch.topk(logits.softmax(-1), top_k)
    return ids.to(torch.int32), (weights / weights.sum(-1, keepdim=True)).to(torch.bfloat16)


def _grouped_mm_arm(w13: torch.Tensor, w2: torch.Tensor):
    """transformers v5's fused experts: sort by expert, ``torch._grouped_mm`` over the whole bank."""
    e, two_n, _ = w13.shape
    n = two_n // 2
    w13_t, w2_t = w13.transpose(1, 2), w2.transpose(1, 2)

    def run(x, ids, weights):
        flat = ids.reshape(-1)
        order = flat.argsort()
        tokens = order // ids.shape[1]
        counts = torch.zeros(e, dtype=torch.int64, device=flat.device).scatter_add_(
            0, flat.long(), torch.ones_like(flat, dtype=torch.int64)
        )
        offs = counts.cumsum(0).to(torch.int32)  # bincount would sync with the host: not capturable
        h = torch._grouped_mm(x[tokens], w13_t, offs=offs)
        h = F.silu(h[:, :n]) * h[:, n:]
        y = torch._grouped_mm(h, w2_t, offs=offs) * weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, tokens, y)

    return run


def _loop_arm(w13: torch.Tensor, w2: torch.Tensor):
    n = w13.shape[1] // 2

    def run(x, ids, weights):
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():
            token, slot = (ids == e).nonzero(as_tuple=True)
            h = F.linear(x[token], w13[e])
            h = F.silu(h[:, :n]) * h[:, n:]
            out.index_add_(0, token, F.linear(h, w2[e]) * weights[token, slot, None])
        return out

    return run


def bench_moe(
    name: str, e: int, top_k: int, hidden: int, inter: int, tokens: list[int], bw: float, record: Callable[[dict], None]
) -> None:
    """As ``bench_linear``: each T's row handed to ``record`` as soon as it is measured."""
    w13 = torch.randn(e, 2 * inter, hidden, dtype=torch.bfloat16, device="cuda") * 0.02
    w2 = torch.randn(e, hidden, inter, dtype=torch.bfloat16, device="cuda") * 0.02
    checkpoint = nvfp4.quantize(w13), nvfp4.quantize(w2)

    def with_twin(bank):  # two copies, rotated between calls
        return [
            bank,
            tuple(NVFP4Weight(b.packed.clone(), b.scales.clone(), b.global_scale.clone(), b.layout) for b in bank),
        ]

    # A seat's bank (the default band) and, past it, the checkpoint's layout the grouped form reads.
    served = ops.bank_for_serving(*checkpoint, moe_ring_gluon.MAX_TOKENS)
    checkpoint_banks = with_twin(checkpoint)
    served_banks = checkpoint_banks if served[0].layout == checkpoint[0].layout else with_twin(served)
    banks_b = [(w13, w2), (w13.clone(), w2.clone())]
    per_expert_q = (checkpoint[0].nbytes + checkpoint[1].nbytes) / e
    grouped = [_grouped_mm_arm(a, b) for a, b in banks_b]
    loop = _loop_arm(*banks_b[0])
    for t in tokens:
        banks_q = served_banks if t <= moe_ring_gluon.MAX_TOKENS else checkpoint_banks
        gu, dn = banks_q[0]
        x = torch.randn(t, hidden, dtype=torch.bfloat16, device="cuda")
        routings = [_routing(t, e, top_k, seed) for seed in range(8)]
        routed = sum(len(ids.unique()) for ids, _ in routings) / len(routings)
        ids0, w0 = routings[0]
        out = ops.moe(x, gu, dn, ids0, w0)
        err = _rel_err(out, ops.moe_reference(x, gu, dn, ids0, w0))
        calls = [(banks_q[i % 2], routings[i]) for i in range(8)]
        ours = graph_us([lambda b=b, r=r: ops.moe(x, b[0], b[1], r[0], r[1]) for b, r in calls])
        best_bf16 = None
        for cfg in moe_fused.configs(t, inter, hidden):

            def bf16_call(b, r, cfg=cfg):
                out = torch.empty_like(x)
                return moe_fused.launch(x, (b[0], None, None), (b[1], None, None), r[0], r[1], out, cfg, False)

            us = graph_us([lambda b=banks_b[i % 2], r=routings[i]: bf16_call(b, r) for i in range(8)], replays=7)
            best_bf16 = us if best_bf16 is None else min(best_bf16, us)
        row = {
            "op": "moe",
            "name": name,
            "E": e,
            "top_k": top_k,
            "N": inter,
            "K": hidden,
            "M": t,
            "routed_experts": routed,
            "rel_err": err,
            "form": ops.choose_moe(
                x, (gu.packed, gu.scales, gu.global_scale), (dn.packed, dn.scales, dn.global_scale), ids0, w0, gu.layout
            ).name,
            "layout": gu.layout,
            "ours_us": ours,
            "bf16_us": best_bf16,
        }
        try:
            row["grouped_mm_us"] = graph_us(
                [lambda g=grouped[i % 2], r=routings[i]: g(x, r[0], r[1]) for i in range(8)]
            )
        except Exception as exc:
            row["grouped_mm_us"] = None
            row["grouped_mm_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        row["loop_us"] = eager_us([lambda r=r: loop(x, r[0], r[1]) for r in routings[:4]], replays=5)
        row["routed_bytes"] = routed * per_expert_q
        row["bandwidth_frac"] = row["routed_bytes"] / (ours * 1e-6) / (bw * 1e12)
        row["speedup_vs_bf16"] = best_bf16 / ours
        print(
            f"  moe {name:16s} T={t:4d} experts {routed:6.1f} ours {ours:8.2f} us  bf16-fused {best_bf16:8.2f}  "
            f"grouped_mm {row['grouped_mm_us'] or float('nan'):8.2f}  loop {row['loop_us']:8.2f}  "
            f"x{row['speedup_vs_bf16']:.2f}  bw {row['bandwidth_frac']:.2f}  err {err:.1e}",
            flush=True,
        )
        record(row)


# -- quantization ---------------------------------------------------------------------------------


def bench_quantize() -> list[dict]:
    """Throughput on bf16 input; the 60 GB figure assumes Qwen3-30B-A3B's mix (97% expert banks)."""
    rows = []
    for name, shape in (
        ("expert_bank_gate_up", (128, 1536, 2048)),
        ("expert_bank_down", (128, 2048, 768)),
        ("dense_gate_up", (28672, 4096)),
    ):
        w = torch.randn(*shape, dtype=torch.bfloat16, device="cuda")
        ref = nvfp4.quantize_reference(w[:2] if w.dim() == 3 else w[:256])
        got = nvfp4.quantize(w[:2] if w.dim() == 3 else w[:256])
        exact = torch.equal(ref.packed, got.packed) and torch.equal(
            ref.scales.view(torch.uint8), got.scales.view(torch.uint8)
        )
        us = eager_us([lambda: nvfp4.quantize(w)], replays=5)
        gbps = w.numel() * 2 / (us * 1e-6) / 1e9
        rows.append(
            {
                "op": "quantize",
                "name": name,
                "shape": list(shape),
                "us": us,
                "bf16_GBps": gbps,
                "matches_reference": exact,
            }
        )
        print(
            f"  quantize {name:20s} {list(shape)} {us / 1e3:8.2f} ms  {gbps:8.1f} GB/s of bf16  exact={exact}",
            flush=True,
        )
    bank = [r for r in rows if r["name"].startswith("expert")]
    bank_gbps = (
        sum(r["shape"][0] * r["shape"][1] * r["shape"][2] * 2 for r in bank) / sum(r["us"] * 1e-6 for r in bank) / 1e9
    )
    dense_gbps = rows[-1]["bf16_GBps"]
    seconds_60gb = 60 * 0.97 / bank_gbps + 60 * 0.03 / dense_gbps
    rows.append(
        {
            "op": "quantize",
            "name": "60GB_qwen3_30b_mix_seconds",
            "seconds": seconds_60gb,
            "bank_GBps": bank_gbps,
            "dense_GBps": dense_gbps,
        }
    )
    print(f"  quantize 60 GB (Qwen3-30B-A3B mix): {seconds_60gb:.1f} s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt.bench kernels")
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/<gpu>-kernels-<commit>.json)")
    parser.add_argument(
        "--merge",
        nargs="*",
        metavar="RESULT",
        help="measure nothing: write the RESULTs (default: DEFAULT_RESULTS) merged into --out "
        "(default bench/results/h200-kernels.json)",
    )
    parser.add_argument("--quick", action="store_true", help="M in {1, 16, 64} only")
    parser.add_argument("--only", choices=["linear", "moe", "quantize"], action="append")
    parser.add_argument("--moe-tokens", default=None, help="comma-separated T for the expert bank (the band sweep)")
    parser.add_argument("--tokens", default=None, help="comma-separated M for the linear layers")
    parser.add_argument("--shapes", default=None, help="comma-separated linear layer names (default: all)")
    parser.add_argument(
        "--mma-ws",
        action="store_true",
        help="offer the ring form with TMA slots, warp-specialized, to the adjudicator (linear_mma_ws_gluon.OFFERED)",
    )
    args = parser.parse_args(argv)
    if args.merge is not None:
        merged = merged_result([Path(p) for p in args.merge] or DEFAULT_RESULTS)
        out = Path(args.out or DEFAULT_MERGED)
        out.write_text(json.dumps(merged, indent=1) + "\n")
        print(json.dumps(merged["summary"], indent=1))
        print(f"wrote {out} from {', '.join(merged['sources'])}")
        return 0
    if not torch.cuda.is_available():
        print("flashrt bench kernels needs a CUDA GPU: this machine has none (torch.cuda.is_available() is False).")
        return 2
    parts = args.only or ["quantize", "linear", "moe"]
    tokens = [1, 16, 64] if args.quick else TOKENS
    moe_tokens = [1, 8, 16] if args.quick else MOE_TOKENS
    if args.moe_tokens:
        moe_tokens = [int(t) for t in args.moe_tokens.split(",")]
    if args.tokens:
        tokens = [int(t) for t in args.tokens.split(",")]
    shapes = [s for s in LINEAR_SHAPES if not args.shapes or s[0] in args.shapes.split(",")]
    if not shapes:
        print(f"--shapes {args.shapes}: none of {', '.join(s[0] for s in LINEAR_SHAPES)}")
        return 2
    linear_mma_ws_gluon.OFFERED = linear_mma_ws_gluon.OFFERED or args.mma_ws
    result = provenance() | {"mma_ws_offered": linear_mma_ws_gluon.OFFERED}
    bw = copy_bandwidth_tbps()
    result["copy_TBps"] = bw
    print(
        f"{result['device']} ({result['capability']}), torch {result['torch']}, triton {result['triton']}, copy {bw:.2f} TB/s",
        flush=True,
    )
    gpu = result["device"].lower().replace("nvidia ", "").replace(" ", "-")
    out = Path(args.out or merge.RESULTS / f"{gpu}-kernels-{result['commit'][:7]}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = result["rows"] = []

    def save() -> None:  # after every measurement: a run cut short still leaves its figures
        result["summary"] = summarize(rows)
        result["adjudication"] = {key: list(notes) for key, notes in TUNER.all_notes().items()}
        out.write_text(json.dumps(result, indent=1))

    def record(row: dict) -> None:
        rows.append(row)
        save()

    if "quantize" in parts:
        rows += bench_quantize()
        save()
    if "linear" in parts:
        for name, n, k in shapes:
            bench_linear(name, n, k, tokens, bw, record)
            torch.cuda.empty_cache()
    if "moe" in parts:
        for name, e, top_k, hidden, inter in MOE_SHAPES:
            bench_moe(name, e, top_k, hidden, inter, moe_tokens, bw, record)
            torch.cuda.empty_cache()
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {out}")
    return 0


def summarize(rows: list[dict]) -> dict:
    """The issue's targets, as figures: geometric-mean speedups and worst cases. Logs summed with
    ``math.fsum``, exactly rounded on every Python: 3.12's ``sum`` compensates and 3.11's does
    not, and the committed merge (3.11) differed from the H200's (3.12) in the last bit."""
    lin = [r for r in rows if r["op"] == "linear"]
    summary = {}
    anchors = {"qkv", "gate_up", "down", "lm_head"}
    for m in sorted({r["M"] for r in lin}):
        ratios = [r["speedup_vs_bf16"] for r in lin if r["M"] == m and r["name"] in anchors]
        if ratios:
            summary[f"linear_M{m}_geomean_vs_bf16"] = math.exp(math.fsum(map(math.log, ratios)) / len(ratios))
        summary[f"linear_M{m}_min_vs_bf16"] = min(r["speedup_vs_bf16"] for r in lin if r["M"] == m)
    for r in rows:
        if r["op"] == "quantize" and "seconds" in r:
            summary["quantize_60GB_seconds"] = r["seconds"]
    for r in rows:
        if r["op"] == "moe":
            summary[f"moe_{r['name']}_T{r['M']}_us"] = r["ours_us"]
    return summary


if __name__ == "__main__":
    raise SystemExit(main())
