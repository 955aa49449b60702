"""The MoE block's launches with PDL, end to end: each arm's decode step with the router's kernels
(``router_topk.PDL_LAUNCH``) and the bank's gate_up (``moe_ring_gluon.PDL_GATE_UP``) launched with
PDL and without, in one process, as ``e2e.measure`` times a step.

Why (docs/benchmarks.md, session 44): Qwen3-30B's seated step at batch 1 waited 0.45 us before
each of those three launches, plain ones between PDL ones (afb0251), and a graph pays about 0.5 us
for each change between PDL and plain launches (``bench/probe_launch_gaps.py``). Both switches are
off until this measures them. The last setting of each arm is profiled, for its ``kernel_gaps``.

``python3 bench/probe_pdl_switches.py OUT.json [model] [batch]`` with flashrt importable
(``bench/gpu_run.sh``).
"""

import json
import sys

from flashrt.bench import e2e, router_topk
from flashrt.bench.kernels import provenance
from flashrt.kernels import moe_ring_gluon
from flashrt.runtime import attach

# (arm, router's kernels with PDL, gate_up with PDL); the seated arm's gate_up is ours alone.
SETTINGS = (
    ("bf16", False, False),
    ("bf16", True, False),
    ("seated", False, False),
    ("seated", True, False),
    ("seated", True, True),
)


def main(path: str, name: str = "qwen3-30b-a3b", batch: int = 1) -> None:
    result = {**provenance(), "model": name, "batch": batch, "rows": []}
    model, moe, prompt = e2e.probe_model(name, batch)
    seated = False
    for i, (arm, router_pdl, gate_up_pdl) in enumerate(SETTINGS):
        if arm == "seated" and not seated:
            attach(model, e2e.run_profile(moe))
            seated = True
        e2e._pdl_for(arm, "seated")
        router_topk.PDL_LAUNCH, moe_ring_gluon.PDL_GATE_UP = router_pdl, gate_up_pdl
        last_of_arm = i + 1 == len(SETTINGS) or SETTINGS[i + 1][0] != arm
        figures = e2e.measure(model, True, prompt, profile_kinds=last_of_arm)
        row = {"arm": arm, "router_pdl": router_pdl, "gate_up_pdl": gate_up_pdl, "step_ms": figures["step_ms"]}
        row |= {key: figures[key] for key in ("kernels", "kernel_gaps") if key in figures}
        result["rows"].append(row)
        print(
            f"{name} {arm:6s} batch {batch}: router PDL {router_pdl!s:5s} gate_up PDL {gate_up_pdl!s:5s} "
            f"step {figures['step_ms']:.3f} ms",
            flush=True,
        )
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3], *(int(b) for b in sys.argv[3:4]))
