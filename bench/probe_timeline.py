"""Where a decode projection's fixed cost goes: the clocks of every program of one call.

The ring form's one-token time fits ``t0 + bytes / B`` with t0 about 4 us, twice what a kernel
that only reads the bytes pays, and PDL between calls does not hide it (docs/benchmarks.md,
"Where the one-token gap sits" and session 41). This probe reads it off the programs themselves:
the served kernel's PTX, edited (``ir_override``) so that thread 0 of each program records
``%globaltimer`` at entry and exit (the GPU's nanosecond clock: when programs start and end across
SMs), ``%clock64`` at entry, when its first ring step has landed (the first ``cp.async.wait_group``
it passes) and at exit (its SM's cycles: ramp, body), and ``%smid``, into the bias pointer a
bias-free launch never reads. The edit adds a compare and a move after each wait, so the edited
kernel is timed beside the served one (the perturbation), and both must write the same bits.

Each timeline is one call after an L2 flush, as the adjudicator times a call. Summarized per
call: the spread of program starts, each program's ramp (entry to first data) and body (first
data to exit) at the SM clock the run measured, the programs each SM ran, and how long the kernel
runs after half its programs have ended (its tail). A split launch's reduce is not in the
timeline (the kernel alone is).

``python3 bench/probe_timeline.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).

H200 at 4f2ba29 (``h200-probe-timeline-4f2ba29.json``, docs/benchmarks.md, session 44): where a
launch fits the GPU every program starts within 0.13 us; a program waits 1.3-2.0 us (median) for
its first ring step, behind every program's first requests; the last end about 1 us after the
median one; the span 0.8-1.7 us under the served time (the launch). The edit's registers put
gate_up's 1792 programs in two waves (the served kernel's 68 registers fit them in one), so its
timeline is the edited kernel's only.
"""

import collections
import functools
import itertools
import json
import os
import re
import statistics
import sys
import tempfile

import torch
from flashrt.bench.kernels import provenance
from flashrt.bench.probe_ring_depth import name
from flashrt.bench.probe_warps import tuned
from flashrt.kernels import linear_mma_gluon, nvfp4, ops, ring_layout

# (layer, N, K, tokens): Llama-3-8B's projections and Qwen3-30B's attention ones, at one token
# (the fixed cost's regime) and Llama's two largest at 8 (batch 8's).
CASES = (
    ("llama_qkv", 6144, 4096, 1),
    ("llama_o", 4096, 4096, 1),
    ("llama_gate_up", 28672, 4096, 1),
    ("llama_down", 4096, 14336, 1),
    ("qwen3_qkv", 5120, 2048, 1),
    ("qwen3_o", 2048, 4096, 1),
    ("llama_qkv", 6144, 4096, 8),
    ("llama_gate_up", 28672, 4096, 8),
)
CALLS = 3
BIAS_ARG = 4  # launch_ring's fifth argument: the bias pointer, unread where HAS_BIAS is False
FIELDS = ("global_in", "global_out", "clock_in", "clock_first", "clock_out", "sm")

_DECLS = "\t.reg .b64 \t%rdtl<8>;\n\t.reg .b32 \t%rtl<8>;\n\t.reg .pred \t%ptl<2>;"
_ENTER = "\tmov.u64 \t%rdtl0, %globaltimer;\n\tmov.u64 \t%rdtl1, %clock64;\n\tmov.u64 \t%rdtl2, 0;"
_FIRST = "\tsetp.eq.u64 \t%ptl1, %rdtl2, 0;\n\t@%ptl1 mov.u64 \t%rdtl2, %clock64;"
_LEAVE = """\tmov.u64 \t%rdtl3, %clock64;
\tmov.u64 \t%rdtl4, %globaltimer;
\tmov.u32 \t%rtl0, %tid.x;
\tsetp.ne.s32 \t%ptl0, %rtl0, 0;
\t@%ptl0 bra \t$L__timeline_{n};
\tmov.u32 \t%rtl1, %nctaid.x;
\tmov.u32 \t%rtl2, %nctaid.y;
\tmov.u32 \t%rtl3, %ctaid.z;
\tmov.u32 \t%rtl4, %ctaid.y;
\tmad.lo.s32 \t%rtl3, %rtl3, %rtl2, %rtl4;
\tmov.u32 \t%rtl4, %ctaid.x;
\tmad.lo.s32 \t%rtl3, %rtl3, %rtl1, %rtl4;
\tmul.wide.u32 \t%rdtl5, %rtl3, 48;
\tld.param.u64 \t%rdtl6, [{param}];
\tcvta.to.global.u64 \t%rdtl6, %rdtl6;
\tadd.s64 \t%rdtl6, %rdtl6, %rdtl5;
\tst.global.u64 \t[%rdtl6], %rdtl0;
\tst.global.u64 \t[%rdtl6+8], %rdtl4;
\tst.global.u64 \t[%rdtl6+16], %rdtl1;
\tst.global.u64 \t[%rdtl6+24], %rdtl2;
\tst.global.u64 \t[%rdtl6+32], %rdtl3;
\tmov.u32 \t%rtl5, %smid;
\tcvt.u64.u32 \t%rdtl7, %rtl5;
\tst.global.u64 \t[%rdtl6+40], %rdtl7;
$L__timeline_{n}:"""


def with_timeline(ptx: str, param: str) -> str:
    """``ptx`` recording each program's clocks, 48 bytes a program (``FIELDS``), at the global
    address in kernel parameter ``param``, indexed by the program's linear id."""
    lines = ptx.splitlines()
    entry = next(i for i, line in enumerate(lines) if ".entry" in line)
    body = next(i for i in range(entry, len(lines)) if lines[i].strip() == "{")
    first = next(
        i
        for i in range(body + 1, len(lines))
        if lines[i].strip() and not lines[i].strip().startswith((".", "//", "$", "{"))
    )
    out, rets = [*lines[:first], _DECLS, _ENTER], 0
    for line in lines[first:]:
        if line.strip() == "ret;":
            out.append(_LEAVE.format(n=rets, param=param))
            rets += 1
        out.append(line)
        if line.strip().startswith("cp.async.wait_group"):
            out.append(_FIRST)
    if not rets:
        raise ValueError("no ret; in the kernel's PTX")
    return "\n".join(out) + "\n"


def bias_param(ptx: str) -> str:
    """The name of the kernel's fifth parameter (``BIAS_ARG``) in its PTX."""
    params = re.findall(r"\.param \.u64 \.ptr \.global \.align \d+ (\w+_param_\d+)", ptx)
    return params[BIAS_ARG]


class Recorded:
    """The ring kernel as ``launch_ring`` calls it; with ``ptx_path`` set, launched from that PTX
    with ``buffer`` for its bias pointer. Keeps the last launch's compiled kernel and grid."""

    def __init__(self, kernel):
        self.kernel, self.ptx_path, self.buffer, self.compiled, self.grid = kernel, None, None, None, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if self.ptx_path is not None:
                args = list(args)
                args[BIAS_ARG] = self.buffer
                kwargs = kwargs | {"ir_override": self.ptx_path}
            self.compiled, self.grid = self.kernel[grid](*args, **kwargs), grid
            return self.compiled

        return launch


def _quantile(ordered: list, q: float):
    """The value a fraction ``q`` of the way along ``ordered`` (sorted), 1 the last."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(records: torch.Tensor) -> dict:
    """A call's timeline in microseconds (``records``: int64 ``[programs, 6]``, ``FIELDS``)."""
    g_in, g_out, c_in, c_first, c_out, sm = (records[:, i].tolist() for i in range(6))
    t0 = min(g_in)
    starts = sorted((g - t0) / 1e3 for g in g_in)
    ends = sorted((g - t0) / 1e3 for g in g_out)
    long = [(co - ci) / (go - gi) for ci, co, gi, go in zip(c_in, c_out, g_in, g_out, strict=True) if go - gi > 2000]
    ghz = statistics.median(long) if long else None
    per_sm = collections.Counter(sm)

    def us(cycles: list[int]) -> dict:
        ordered = sorted(cycles)
        at = {"p10": 0.1, "p50": 0.5, "p90": 0.9, "max": 1.0}
        return {key: _quantile(ordered, q) / ghz / 1e3 if ghz else None for key, q in at.items()}

    return {
        "programs": len(g_in),
        "span_us": ends[-1],
        "starts_us": {"p50": _quantile(starts, 0.5), "p90": _quantile(starts, 0.9)},
        "ends_us": {"first": ends[0], "p50": _quantile(ends, 0.5), "last": ends[-1]},
        "tail_us": ends[-1] - _quantile(ends, 0.5),
        "sm_ghz": ghz,
        "ramp_us": us([f - i for f, i in zip(c_first, c_in, strict=True)]),
        "body_us": us([o - f for o, f in zip(c_out, c_first, strict=True)]),
        "program_us": us([o - i for o, i in zip(c_out, c_in, strict=True)]),
        "sms": len(per_sm),
        "programs_per_sm": {"min": min(per_sm.values()), "max": max(per_sm.values())},
        "globaltimer_step_ns": min((1e3 * (b - a) for a, b in itertools.pairwise(starts) if b > a), default=None),
    }


def main(path: str) -> None:
    result = {**provenance(), "rows": []}
    kernel = Recorded(linear_mma_gluon.nvfp4_linear_mma_gluon_kernel)
    linear_mma_gluon.nvfp4_linear_mma_gluon_kernel = kernel
    scratch = tempfile.mkdtemp()
    l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    flush = torch.zeros(l2_bytes * 3 // 8, dtype=torch.int32, device="cuda")  # 1.5x the L2, as ops._time_us
    torch.manual_seed(0)
    for layer, n, k, m in CASES:
        choice = tuned(m, n, k)
        if choice is None or choice[0] != "mma_gluon":
            print(f"{layer} M={m}: served by {choice}, not the ring form: skipped", flush=True)
            continue
        w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        ring = ring_layout.pack(w.packed)
        config = {**choice[1], "LAYOUT": ring_layout.RING}
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        run = functools.partial(linear_mma_gluon.launch, x, ring, w.scales, w.global_scale, None, out, config, False)
        kernel.ptx_path = None
        run()
        served = out.clone()
        ptx = kernel.compiled.asm["ptx"]
        edited = os.path.join(scratch, f"{layer}-{m}.ptx")
        with open(edited, "w") as f:
            f.write(with_timeline(ptx, bias_param(ptx)))
        programs = kernel.grid[0] * kernel.grid[1] * kernel.grid[2]
        row = {"layer": layer, "N": n, "K": k, "M": m, "config": name(choice[1]), "grid": list(kernel.grid)}
        row["served_us"] = ops._time_us(run)
        kernel.buffer = torch.zeros(programs, len(FIELDS), dtype=torch.int64, device="cuda")
        kernel.ptx_path = edited
        out.fill_(float("nan"))
        run()
        row["same_bits"] = bool(torch.equal(out, served))
        row["recorded_us"] = ops._time_us(run)
        row["calls"] = []
        for _ in range(CALLS):
            kernel.buffer.zero_()
            torch.sum(flush, 0)
            torch.cuda.synchronize()
            run()
            torch.cuda.synchronize()
            row["calls"].append(summary(kernel.buffer.cpu()))
        kernel.ptx_path = None
        result["rows"].append(row)
        last = row["calls"][-1]
        print(
            f"{layer:14s} M={m:2d} served {row['served_us']:6.2f} us recorded {row['recorded_us']:6.2f} "
            f"same {row['same_bits']}  {last['programs']} programs on {last['sms']} SMs, span {last['span_us']:.2f}, "
            f"starts p90 {last['starts_us']['p90']:.2f}, ramp p50 {last['ramp_us']['p50']}, "
            f"body p50 {last['body_us']['p50']}, tail {last['tail_us']:.2f} us",
            flush=True,
        )
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
