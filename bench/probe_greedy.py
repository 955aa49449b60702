"""What the step's greedy selection costs each arm: ``e2e.greedy`` compiled, against torch's eager
``argmax``, in one process, alternating.

At afb0251 (``h200-e2e-qwen3-afb0251-b1.json``) Qwen3-30B's bf16 step at batch 1 took 3.57 ms
against 3.86 at dbf4235, though the eager argmax it no longer runs took 8.4 us of it; its kernels
waited 58 us a step for their launches against 318. This probe measures both selections in the
same process and on the same machine, each arm's decode step as ``e2e.measure`` times it.

``python3 bench/probe_greedy.py OUT.json [model] [batch]`` with flashrt importable (``bench/gpu_run.sh``).

H200 at 3e935d0 (``h200-probe-greedy-3e935d0.json``), Qwen3-30B at batch 1: the bf16 step 3.648 ms
with the compiled selection, 3.946 with eager argmax, 3.648 again; the seated step 2.092 with
eager argmax, 2.081 with the compiled selection. The eager argmax held the bf16 graph up 0.30 ms.
"""

import json
import sys

import torch
from flashrt.bench import e2e
from flashrt.bench.kernels import provenance
from flashrt.runtime import attach


def eager_argmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1, keepdim=True)


def main(path: str, name: str = "qwen3-30b-a3b", batch: int = 1) -> None:
    result = {**provenance(), "model": name, "batch": batch, "rows": []}
    model, moe, prompt = e2e.probe_model(name, batch)

    def arm(label: str, order: tuple[str, ...]) -> None:
        for select in order:
            fn = e2e.select_program(True) if select == "compiled greedy" else eager_argmax
            figures = e2e.measure(model, True, prompt, select=fn)
            row = {"arm": label, "select": select, "step_ms": figures["step_ms"]}
            result["rows"].append(row)
            print(f"{name} {label:6s} batch {batch}: {select:15s} step {figures['step_ms']:.3f} ms", flush=True)
            with open(path, "w") as f:
                json.dump(result, f, indent=1)

    e2e._pdl_for("bf16", "seated")
    arm("bf16", ("compiled greedy", "eager argmax", "compiled greedy"))
    attach(model, e2e.run_profile(moe))
    e2e._pdl_for("seated", "seated")
    arm("seated", ("eager argmax", "compiled greedy"))


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3], *(int(b) for b in sys.argv[3:4]))
