"""``python -m flashrt.bench breakdown [RESULT ...]``: where a profiled e2e decode step goes, by
kind of kernel in both arms, and what decode ratio the seated kernels can carry it to while the
rest of the step stays as it ran (default: the committed tables' runs, ``plot_e2e.COMMITTED``,
each model, depth and batch from the first listed run that profiled it).

The seats replace the projections and the expert banks; the attention, the router, the norms,
the cache writes and the greedy selection run the same kernels in both arms. So the step's ratio
is held by that shared rest: with bf16's step ``B``, the seated step ``S``, bf16's seated kernels
``b`` and ours ``s``, the ratio can reach ``B / (S - s + b / r)`` were ours faster than bf16's by
the format's byte ratio ``r`` (NVFP4 at 4.5 bits a weight against 16: 3.55x, as
``weight_bytes_bf16 / weight_bytes_ours`` of the seated layers), and ``B / (S - s)`` were they
free. A target ``R`` needs the rest cut by ``(R S - B) / (R - 1)`` in both arms at today's
seated kernels, ``(R (S - s + b / r) - B) / (R - 1)`` at the byte ratio. The kernel times are the
profile's (``e2e._kernel_breakdown``, graph replays under the profiler); the steps are the row's
unprofiled replays, whose ratio the tables quote."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# A kernel's kind by its name's start; the first kind that matches. The projections are the seated
# arm's own GEMMs (its split-K sum and the wgmma form's activation permute among them); cuBLAS runs
# bf16's projections and, in both arms, the GEMMs no seat takes (Qwen3.5's shared-expert gate, the
# router's logits before 5c0f2a9), so ``analysis`` gives bf16's projections its cuBLAS time less
# the seated arm's, and leaves the seated arm's under cuBLAS in both.
KINDS = (
    ("projections", ("nvfp4_", "splitk_reduce_kernel", "permute_steps_kernel")),
    ("experts", ("moe_",)),
    (
        "cuBLAS",
        (
            "nvjet_",
            "void cutlass::",
            "void cublasLt::",
            "void gemmk1_kernel",
            "void dot_kernel",
            "void reduce_1Block_kernel",
        ),
    ),
    (
        "attention",
        (
            "decode_attention_kernel",
            "merge_splits_kernel",
            "cudnn_generated_",
            "fused_recurrent_gated_delta_rule",
            "causal_conv1d_update_kernel",
            "void at::native::(anonymous namespace)::conv_depthwise2d",
        ),
    ),
    ("routing", ("router_", "void at::native::bitonicSortKVInPlace", "void at::native::sbtopk::")),
    ("compiled", ("triton_",)),  # torch.compile's: norms, rotary, cache writes, activations, greedy
)
# Every kind a breakdown has: the named ones, the kernels no name matched (with those past the
# profile's 25 longest) and the time no kernel ran.
COLUMNS = (*(name for name, _ in KINDS), "other", "idle")
SEATED = ("projections", "experts")
# Issue 7's decode targets on the H200 (the dense model at 1 and 8, the MoE ones at 1-8 and 16).
DENSE_TARGETS = {1: 2.5, 8: 2.2}
MOE_TARGETS = {1: 2.5, 2: 2.5, 4: 2.5, 8: 2.5, 16: 1.8}
DENSE = ("llama3-8b",)


def kind(kernel: str) -> str:
    """The kind of the kernel named ``kernel`` (``KINDS``), or ``other``."""
    return next((name for name, starts in KINDS if kernel.startswith(starts)), "other")


def profiled(row: dict) -> bool:
    """Whether ``row`` carries both arms' step profiles with each kernel's overlapped time (runs
    from fb627dc on; earlier profiles summed kernels as if they ran alone)."""
    profiles = [row.get(arm) or [] for arm in ("bf16_kernels", "ours_kernels")]
    return all(
        any(k["kernel"] == "all" for k in profile)
        and all("overlapped_us_per_step" in k for k in profile if k["kernel"] != "all")
        for profile in profiles
    )


def by_kind(profile: list[dict]) -> dict[str, float]:
    """One arm's profile (``e2e._kernel_breakdown``: its 25 longest kernels and ``all``) as us a
    step by ``COLUMNS``, each kernel's time less what it overlapped of kernels started before it
    (a PDL launch waiting in its prologue is the kernel it waits on), so that they sum to the
    profiled step (busy plus idle)."""
    total = next(k for k in profile if k["kernel"] == "all")
    kinds = dict.fromkeys(COLUMNS, 0.0)
    for k in profile:
        if k["kernel"] != "all":
            kinds[kind(k["kernel"])] += k["us_per_step"] - k["overlapped_us_per_step"]
    kinds["other"] += total["busy_us_per_step"] - sum(kinds.values())
    kinds["idle"] = total["idle_us_per_step"]
    return kinds


def target(row: dict) -> float | None:
    """Issue 7's decode target for ``row``'s model and batch, None where it sets none."""
    return (DENSE_TARGETS if row["model"] in DENSE else MOE_TARGETS).get(row["batch"])


def _cut_for(ratio: float, bf16_step: float, seated_step: float) -> float:
    """us to take from both arms' step so that ``bf16_step / seated_step`` reaches ``ratio``."""
    return (ratio * seated_step - bf16_step) / (ratio - 1)


def analysis(row: dict) -> dict:
    """``row``'s step by kind in both arms (us a step) and what it allows (module docstring):
    the seated kernels' times and ratio, the rest of each step, the ceilings, and for its
    target the seated kernels' ratio that would reach it with the rest as it ran, and the rest,
    us a step of the seated arm, that would reach it with the seated kernels as they ran and at
    the byte ratio (None where none would: the rest alone is over the target's step, or the cut
    exceeds the rest itself)."""
    bf16, ours = by_kind(row["bf16_kernels"]), by_kind(row["ours_kernels"])
    bf16["projections"], bf16["cuBLAS"] = bf16["cuBLAS"] - ours["cuBLAS"], ours["cuBLAS"]
    seated_bf16 = sum(bf16[k] for k in SEATED)
    seated_ours = sum(ours[k] for k in SEATED)
    bf16_step, seated_step = row["bf16_step_ms"] * 1e3, row["ours_step_ms"] * 1e3
    rest = seated_step - seated_ours
    byte_ratio = row["weight_bytes_bf16"] / row["weight_bytes_ours"]
    at_byte_ratio = rest + seated_bf16 / byte_ratio
    goal = target(row)

    def seated_ratio_for() -> float | None:
        if goal is None:
            return None
        left = bf16_step / goal - rest  # what the seated kernels may take
        return seated_bf16 / left if left > 0 else None

    def rest_for(step: float) -> float | None:
        if goal is None:
            return None
        needed = rest - _cut_for(goal, bf16_step, step)
        return needed if needed > 0 else None

    return {
        "model": row["model"],
        "layers": row["layers"],
        "batch": row["batch"],
        "decode": bf16_step / seated_step,
        "target": goal,
        "bf16_by_kind": bf16,
        "ours_by_kind": ours,
        "seated_bf16_us": seated_bf16,
        "seated_ours_us": seated_ours,
        "seated_ratio": seated_bf16 / seated_ours,
        "seated_ratio_for_target": seated_ratio_for(),
        "rest_bf16_us": bf16_step - seated_bf16,
        "rest_ours_us": rest,
        "byte_ratio": byte_ratio,
        "ceiling_at_byte_ratio": bf16_step / at_byte_ratio,
        "ceiling_seated_free": bf16_step / rest,
        "rest_for_target_us": rest_for(seated_step),
        "rest_for_target_at_byte_ratio_us": rest_for(at_byte_ratio),
    }


def run_rows(run: dict, **tags: str) -> list[dict]:
    """The rows an e2e result ``run`` profiled, each with its run's ``device`` and ``commit`` (and
    ``tags``), as ``table`` reads them."""
    provenance = {"device": run["device"], "commit": run["commit"], **tags}
    return [row | provenance for row in run["rows"] if profiled(row)]


def profiled_rows(paths: list[Path]) -> list[dict]:
    """Each model, depth and batch (``plot_e2e.key``) that a run at ``paths`` profiled, from the
    first such run (``merge.merged_rows``), with its run's ``device``, ``commit`` and ``source``
    (the file's name)."""
    from flashrt.bench import merge, plot_e2e

    results = [{"rows": run_rows(json.loads(path.read_text()), source=path.name)} for path in paths]
    return merge.merged_rows(results, plot_e2e.key)


def _us(value: float | None) -> str:
    return "out of reach" if value is None else f"{value:.0f}"


def table(rows: list[dict]) -> str:
    """The rows' analyses as two Markdown tables: what the ratio can reach, and the step by kind."""
    analyses = [(row, analysis(row)) for row in rows]
    reach = [
        "| device | model, layers | batch | decode | target (H200) | seated kernels, us (bf16 / ours) | their ratio "
        "| their ratio the target needs | the rest, us (bf16 / ours) | ceiling at the byte ratio "
        "| ceiling, seated free | the rest the target needs, us (seated as they ran / at the byte ratio) | run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    kinds = [
        "| device | model, layers | batch | " + " | ".join(COLUMNS) + " |",
        "|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for row, a in analyses:
        head = f"| {_device(row['device'])} | {a['model']}, {a['layers']} | {a['batch']} |"
        goal, seated_needs, rest_needs = "", "", ""
        if a["target"] is not None:
            goal = f"{a['target']:.1f}x"
            seated_needs = (
                "out of reach" if a["seated_ratio_for_target"] is None else f"{a['seated_ratio_for_target']:.2f}x"
            )
            rest_needs = f"{_us(a['rest_for_target_us'])} / {_us(a['rest_for_target_at_byte_ratio_us'])}"
        reach.append(
            f"{head} {a['decode']:.2f}x | {goal} | {a['seated_bf16_us']:.0f} / {a['seated_ours_us']:.0f} "
            f"| {a['seated_ratio']:.2f}x | {seated_needs} | {a['rest_bf16_us']:.0f} / {a['rest_ours_us']:.0f} "
            f"| {a['ceiling_at_byte_ratio']:.2f}x | {a['ceiling_seated_free']:.2f}x | {rest_needs} "
            f"| {row['commit'][:7]} |"
        )
        cells = " | ".join(f"{a['bf16_by_kind'][c]:.0f} / {a['ours_by_kind'][c]:.0f}" for c in COLUMNS)
        kinds.append(f"{head} {cells} |")
    return "\n".join(reach) + "\n\n" + "\n".join(kinds) + "\n"


def _device(name: str) -> str:
    return next((short for short in ("H200", "H100") if short in name), name)


def committed_rows() -> list[dict]:
    """The profiled rows of each committed table's runs (``plot_e2e.COMMITTED``), H200's first."""
    from flashrt.bench import plot_e2e

    return [row for runs, _, _ in plot_e2e.COMMITTED for row in sorted(profiled_rows(runs), key=plot_e2e.key)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rows = [row for path in argv for row in profiled_rows([Path(path)])] if argv else committed_rows()
    if not rows:
        print(
            f"no row of {', '.join(argv)} carries both arms' step profiles with each kernel's overlap "
            "(bf16_kernels, ours_kernels; runs from fb627dc on): run `python -m flashrt.bench e2e` "
            "with --profile-batches naming the batches to profile",
            file=sys.stderr,
        )
        return 2
    print(table(rows), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
