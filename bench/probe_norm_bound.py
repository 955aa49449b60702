"""How much of the seated decode step the kernels between the projections take: the most that
fusing them into the projections could give, measured before anything is built.

At batch 1 on the H100 (d68f191, ``h100-e2e-llama-b1-shipped-d68f191.json``) Llama-3-8B's seated
step ran 2.12 ms, its projections 1.77 of it; between them, per layer, two fused add-and-RMSNorm
kernels (163 us a step in all), the residual add after down (43 us) and the MLP's
SiLU-and-mul (45 us), 55 us of the 251 overlapped by PDL. Fused, the norm's
weight would go into the projection's weight, its per-token scale into the projection's
epilogue and the residual add into the epilogue of the projection before, the activation into
gate_up's epilogue: what each kernel costs the step is the bound of what its fusion can save.

Arms, one process, each ``e2e.measure``'s captured step, the seats attached once:

- ``bf16``: the model before the seats, as the e2e benchmark's bf16 arm runs it: the baseline
  each seated arm's decode ratio is taken against (``bounds``), from the same process;
- ``served``: the model as the e2e benchmark runs it, measured first and last;
- ``no add-norm``: every decoder layer's two norms and two residual adds left out, so each
  projection follows the one before with nothing between but the attention (the model computes
  nothing meaningful then, and no kernel's work depends on the values);
- ``no add-norm, no activation``: the MLP's SiLU-and-mul left out too (down reads gate's half).

Measured at 366ad5d on the H100 (``h100-probe-norm-bound-b{1,8}-366ad5d.json``): the step went
from 2.175 to 2.054 ms without the add-norms and to 2.023 without the activation too at batch 1,
from 2.736 to 2.577 at batch 8: 151 and 159 us, 7.0 and 5.8% of the step, less than the 196 us
the profile's kernel times (less their overlap) promised. If the H200 saves as much (its
profiles give these kernels the H100's times), a fusion that cost the projections nothing would
take Llama from 2.31x to 2.51x at batch 1 and from 1.94x to 2.08x at 8 (issue 7 asks 2.5 and
2.2): not the way to the targets on its own, so it is not built. Session 67's H200 steps
(59198e0: 1.87 and 2.24 ms seated, 4.39 and 4.57 bf16) less the H100's savings would be 2.55x
and 2.20x, at the targets with no margin for what the epilogues cost: what decides it is the
H200's own bound, the ratios this probe prints.

``python3 bench/probe_norm_bound.py OUT.json [model] [batch]`` with flashrt importable
(``bench/gpu_run.sh OUTDIR probe probe_norm_bound``); dense models only (an expert bank's
routing would depend on the values).
"""

import json
import sys
import types

import torch
from flashrt.bench import e2e
from flashrt.bench.kernels import provenance
from flashrt.runtime import attach


def _without_add_norm(layer, hidden_states, **kwargs):
    hidden_states, _ = layer.self_attn(hidden_states=hidden_states, **kwargs)
    return layer.mlp(hidden_states)


def _without_activation(mlp, x):
    gate = mlp.gate_proj(x)
    mlp.up_proj(x)  # its slice of the merged GEMM, taken and dropped: the group then lets go
    return mlp.down_proj(gate)


def leave_out(model: torch.nn.Module, activation: bool) -> None:
    """Every decoder layer without its norms and residual adds, and where ``activation`` its
    MLP without SiLU-and-mul; ``restore`` puts the classes' own forwards back."""
    for layer in model.model.layers:
        layer.forward = types.MethodType(_without_add_norm, layer)
        if activation:
            layer.mlp.forward = types.MethodType(_without_activation, layer.mlp)


def restore(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        for module in (layer, layer.mlp):
            module.__dict__.pop("forward", None)


def bounds(rows: list[dict]) -> dict:
    """The decode ratios against the ``bf16`` arm: as served (the mean of the two ``served``
    arms, which bracket the others in time) and with each left-out arm's kernels free, the most
    a fusion of them could reach."""
    steps = {}
    for row in rows:
        steps.setdefault(row["arm"], []).append(row["step_ms"])
    bf16 = steps.pop("bf16")[0]
    return {arm: bf16 * len(ms) / sum(ms) for arm, ms in steps.items()}


def main(path: str, name: str = "llama3-8b", batch: int = 1) -> None:
    result = {**provenance(), "model": name, "batch": batch, "rows": []}
    model, moe, prompt = e2e.probe_model(name, batch)
    if moe:
        raise SystemExit(f"{name}: has expert banks, whose routing depends on the values; a dense model only")

    def record(label: str, figures: dict) -> None:
        result["rows"].append({"arm": label, "step_ms": figures["step_ms"]})
        print(f"{name} batch {batch}: {label:28s} step {figures['step_ms']:.3f} ms", flush=True)
        result["decode_ratio"] = bounds(result["rows"])
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    e2e._pdl_for("bf16", "seated")
    record("bf16", e2e.measure(model, True, prompt))
    attach(model, e2e.run_profile(moe))
    e2e._pdl_for("seated", "seated")
    arms = (("served", None), ("no add-norm", False), ("no add-norm, no activation", True), ("served", None))
    for label, activation in arms:
        if activation is not None:
            leave_out(model, activation)
        figures = e2e.measure(model, True, prompt)
        restore(model)
        record(label, figures)
    for arm, ratio in result["decode_ratio"].items():
        print(f"{name} batch {batch}: decode {ratio:.2f}x bf16 {arm}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3], *(int(b) for b in sys.argv[3:4]))
