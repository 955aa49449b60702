"""Would grouping the expert bank by expert and running it on the ring pay at 1-16 tokens?

The bank's decode form (``moe_gemv_gluon``) is one GEMV program per (row block, token-expert
pair): each pair reads its expert's rows, so an expert that two tokens route to is read twice,
and the GEMV keeps one step of loads in flight where the dense ring form keeps three. On the
H200 it ran the Qwen3-30B-A3B bank (E=128, top-8, hidden 2048, inter 768) in 19.5/99.7/188 us
at T=1/8/16, 26-33% of copy bandwidth on the routed experts' bytes, against targets of 15/55/90.

This measures, same run, each time from HBM (``ops._time_us``):

- ``bank_us``: the GEMV bank (``moe_gemv_gluon``), the best of its configs, and ``gate_up_us``,
  that config's gate_up launch alone (``launch_down`` replaced by nothing);
- ``ring_gate_up_us`` / ``ring_down_us``: the dense forms the adjudicator picks for the routed
  experts' weights stacked into one matrix (``[U x 2N, K]`` and ``[U x K, N]``, U the experts
  routed to) at T tokens: what a grouped bank reads, once an expert, with every token against
  every routed expert (more MMA columns, the same bytes). A bound on what the grouped ring
  bank could reach, less its grouping and activation launches;
- ``ring_bank_{per_pair,grouped}_{gemv,ring,grouped}_down_us``: ``moe_ring_gluon`` (its gate_up
  on the ring, per pair or grouped by expert; its down the GEMV's, the ring walk over each
  token's experts, or the ring grouped by expert), the best of its configs each way, each
  config checked against the reference first. It runs last, after the JSON of the rest is
  written: a kernel that faults takes only its own figures.

The third (ea7c354; ``h200-probe-moe-ring-staged.json``) timed two staged ways on each way's
best config: the down grouped by expert took the 16-token bank from 106.5 to 100.0 us (now in
the configs from 8 tokens on); the grids pairs first (an expert several tokens route to read
from L2 after the first) gained at most 0.4 us and lost up to 10% grouped (removed).
The second (9a6de5f; ``h200-probe-moe-ring-down.json``) had both downs:
ring down 18.7/67.0/107.3 us, GEMV down 19.5/84.8/142.1, GEMV bank 20.5/100.4/188.1.
The first run (06907eb; ``h200-probe-moe-ring.json``) had the ring gate_up with the GEMV down
only: 19.3/84.7/142.7 us at T=1/8/16 against the GEMV bank's 19.7/100.0/188.1, and the stacked
bound 15.5/53.6/93.1, of which the down is 6.0/19.2/32.4 where the GEMV down took 8.5/44/82.

``python3 bench/probe_moe_ring.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import functools
import json
import sys
from itertools import product

import torch
from flashrt.bench.kernels import _routing, provenance
from flashrt.bench.probe_ring_depth import HIDDEN, INTER, TOP_K, E, qwen3_bank
from flashrt.bench.timing import copy_bandwidth_tbps
from flashrt.kernels import moe_gemv_gluon, moe_ring_gluon, ops
from flashrt.kernels.nvfp4 import NVFP4Weight


def stacked(bank: NVFP4Weight, experts: torch.Tensor) -> NVFP4Weight:
    """The experts' matrices one under the other, as one dense weight (the first global scale:
    times do not depend on the values)."""

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, experts).flatten(0, 1).contiguous()

    return NVFP4Weight(rows(bank.packed), rows(bank.scales), bank.global_scale[0].clone())


def main(path):
    torch.manual_seed(0)
    gu, dn = qwen3_bank()
    per_expert = (gu.nbytes + dn.nbytes) / E
    copy_tbps = copy_bandwidth_tbps()
    banks = (gu.packed, gu.scales, gu.global_scale), (dn.packed, dn.scales, dn.global_scale)
    rows, inputs = [], {}
    for t in (1, 8, 16):
        x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        inputs[t] = x, *_routing(t, E, TOP_K, 0)
        _, ids, weights = inputs[t]
        out = torch.empty_like(x)
        gemv = {
            _name(c.items()): functools.partial(moe_gemv_gluon.launch, x, *banks, ids, weights, out, c, False)
            for c in moe_gemv_gluon.configs(t, INTER, HIDDEN)
        }
        gemv_us = {name: ops._time_us(run) for name, run in gemv.items()}
        best = min(gemv_us, key=gemv_us.get)
        row = {"T": t, "form": f"gemv_gluon[{best}]", "bank_us": gemv_us[best]}
        bank_us = row["bank_us"]
        down, moe_gemv_gluon.launch_down = moe_gemv_gluon.launch_down, lambda *args: args[4]  # out, untouched
        try:
            row["gate_up_us"] = ops._time_us(gemv[best])
        finally:
            moe_gemv_gluon.launch_down = down
        experts = ids.reshape(-1).unique()
        h = torch.randn(t, INTER, device="cuda", dtype=torch.bfloat16)
        for name, bank, act in (("gate_up", gu, x), ("down", dn, h)):
            w = stacked(bank, experts)
            ops.linear(act, w)  # adjudicated outside the timing
            row[f"ring_{name}_us"] = ops._time_us(lambda w=w, act=act: ops.linear(act, w))
            row[f"ring_{name}_form"] = ops.choose_linear(act, w.packed, w.scales, w.global_scale, None).name
        row["routed_experts"] = len(experts)
        row["routed_bytes"] = len(experts) * per_expert
        grouped = row["ring_gate_up_us"] + row["ring_down_us"]
        row["bank_bandwidth_frac"] = row["routed_bytes"] / (bank_us * 1e-6) / (copy_tbps * 1e12)
        row["ring_bandwidth_frac"] = row["routed_bytes"] / (grouped * 1e-6) / (copy_tbps * 1e12)
        rows.append(row)
        print(
            f"T={t:2d} experts {len(experts):3d}: bank {bank_us:6.1f} us"
            f" (gate_up {row.get('gate_up_us', float('nan')):6.1f})"
            f"  stacked ring gate_up {row['ring_gate_up_us']:6.1f} + down {row['ring_down_us']:6.1f} = {grouped:6.1f}"
            f"  bandwidth {row['bank_bandwidth_frac']:.2f} -> {row['ring_bandwidth_frac']:.2f}"
            f"  ({row['ring_gate_up_form']}; {row['ring_down_form']})",
            flush=True,
        )
    shape = {"E": E, "top_k": TOP_K, "hidden": HIDDEN, "inter": INTER}
    result = {**provenance(), "copy_TBps": copy_tbps, "bank": shape}
    write(path, result | {"rows": rows})
    for row in rows:
        x, ids, weights = inputs[row["T"]]
        ref = ops.moe_reference(x, gu, dn, ids, weights)
        row["ring_bank"] = {}

        def measure(config, x=x, ids=ids, weights=weights, ref=ref, row=row):
            out = torch.empty_like(x)
            run = functools.partial(moe_ring_gluon.launch, x, *banks, ids, weights, out, config, False)
            run()
            rel = float((out.double() - ref.double()).norm() / ref.double().norm())
            name = _name(config.items())
            row["ring_bank"][name] = {"rel_err": rel, "us": ops._time_us(run) if rel < 1e-2 else None}
            return row["ring_bank"][name]["us"]

        timed = {}
        for config in moe_ring_gluon.configs(row["T"], INTER, HIDDEN):
            timed[tuple(config.items())] = measure(config)
        for (grouped, way), down in product(((0, "per_pair"), (1, "grouped")), ("gemv", "ring", "grouped")):
            these = {c: us for c, us in timed.items() if us is not None and _way(c) == (grouped, down)}
            key = f"ring_bank_{way}_{down}_down_us"
            best = min(these, key=these.get, default=None)
            row[key] = these.get(best)
            name = _name(best) if best else "none"
            print(f"T={row['T']:2d}: ring bank, {way:8s}, {down} down {row[key] or float('nan'):6.1f} us"
                  f" against the GEMV bank's {row['bank_us']:6.1f} ({name})", flush=True)  # fmt: skip
        write(path, result | {"rows": rows})


def _name(settings) -> str:
    """A config's settings as the JSON names them: ``GROUPED=1,WARPS=2,...`` in its order."""
    return ",".join(f"{k}={v}" for k, v in settings)


def _way(config: tuple) -> tuple[int, str]:
    """A ring config's gate_up (grouped or not) and which down it runs."""
    keys = dict(config)
    return keys["GROUPED"], "grouped" if "DOWN_GROUPED" in keys else "ring" if "DOWN_WARPS" in keys else "gemv"


def write(path, result):
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
