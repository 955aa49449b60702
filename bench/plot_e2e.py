"""``python -m flashrt.bench plot-e2e [RESULT ...] [PNG]``: the e2e runs merged into one result and
drawn, decode speedup against batch, one line a model and depth (default: each of ``COMMITTED``,
the H200's runs to ``bench/results/h200-e2e.json`` and ``docs/img/decode-speedup.png``, the H100's
to ``h100-e2e.json`` and ``decode-speedup-h100.png``). A model, depth and batch measured
in several runs is taken from the first that has it, with that run's commit, date and file; the
merged result keeps the provenance all runs share (device, versions) and lists their commits.
Runs of another device or other versions are not merged: their ratios are not comparable."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flashrt.bench import merge

DEFAULT_RESULTS = [  # every arm with vLLM's merged projections, torch.compile's PDL from 0d80628 on
    # 59198e0: the K-warps form (sessions 62-64) and the H100's later kernels, one batch a run,
    # each profiled (the gate_up by expert pairs it offered was never chosen, and reverted)
    merge.RESULTS / "h200-e2e-llama-59198e0-b8.json",
    merge.RESULTS / "h200-e2e-llama-59198e0-b1.json",
    merge.RESULTS / "h200-e2e-qwen3-59198e0-b8.json",
    merge.RESULTS / "h200-e2e-qwen3-59198e0-b4.json",
    merge.RESULTS / "h200-e2e-qwen3-59198e0-b1.json",
    # c8396f9: every model on session 47's decode-attention tiles (64-key steps from 32 pairs,
    # e2066cb; no merge at one split, f77dad6) and session 49's step; Qwen3.5 at full depth, one
    # batch a run (2ec40d9: c8396f9's code, a test's fix apart)
    merge.RESULTS / "h200-e2e-llama-c8396f9-b1b8.json",  # 8 profiled
    merge.RESULTS / "h200-e2e-qwen3-c8396f9-b1b4b8.json",  # 1 profiled
    merge.RESULTS / "h200-e2e-qwen35-c8396f9-full-b1.json",  # 40 layers, profiled
    merge.RESULTS / "h200-e2e-qwen35-2ec40d9-full-b8.json",  # 40 layers
    # 517058f: Qwen3.5's decode step on flash-linear-attention's fused recurrent and convolution
    # kernels (bench/gated_delta.py; transformers' torch loop before) and its input projections
    # merged as vLLM's in_proj_qkvz and in_proj_ba, both arms
    merge.RESULTS / "h200-e2e-qwen35-517058f-l8-b1b8.json",  # 1 profiled
    merge.RESULTS / "h200-e2e-qwen35-7c5f6d1-l8-b4.json",  # 7c5f6d1: 517058f's code (docs and results apart)
    merge.RESULTS / "h200-e2e-qwen35-7c5f6d1-l8-b16.json",
    merge.RESULTS / "h200-e2e-qwen35-7c5f6d1-l8-b32.json",
    # a040892: 39f02c7's kernels and benchmark again. Llama's 32 in three processes (alone, alone
    # with 7fc3be7's o projection choice, after 4 and 16: 9057-9104 seated tok/s) against
    # 39f02c7's 8492, which none reproduced; Qwen3.5 with the compiled greedy selection and PDL arms
    merge.RESULTS / "h200-e2e-llama-a040892-b4b16b32-profiled.json",  # 32 profiled
    merge.RESULTS / "h200-e2e-qwen35-a040892-l8-b1b8.json",
    # 39f02c7: the bank's gate_up with PDL, and the router's kernels in the seated arm (e2e.PDL_ARMS);
    # Llama-3-8B has neither, so its 4, 16 and 32 measure the compiled greedy selection
    merge.RESULTS / "h200-e2e-qwen3-39f02c7-b1b8.json",  # 1 profiled
    merge.RESULTS / "h200-e2e-qwen3-39f02c7-b4b16b32.json",
    merge.RESULTS / "h200-e2e-llama-39f02c7-b4b16b32.json",
    # afb0251/3e935d0: the step's greedy selection in two passes, compiled (e2e.greedy): torch's eager
    # argmax had cost the bf16 graph 0.30 ms a step at batch 1 (bench/probe_greedy.py)
    merge.RESULTS / "h200-e2e-llama-afb0251-b1.json",  # profiled
    merge.RESULTS / "h200-e2e-qwen3-afb0251-b1.json",  # profiled (its band sweep cut at 32)
    merge.RESULTS / "h200-e2e-llama-3e935d0-b8.json",
    merge.RESULTS / "h200-e2e-qwen3-3e935d0-b8.json",
    # c797099: every choice at 32 rows re-made (the tuning cache at 16f57c4), 2-stage bank rings from 16 rows
    merge.RESULTS / "h200-e2e-llama-c797099-b32.json",
    # 99e436d: the unchunked ring forms offered 2 stages from 16-token tiles (WIDE_TILE_STAGES)
    merge.RESULTS / "h200-e2e-qwen3-99e436d-b8b16.json",  # 8 (cut before the seated 16)
    merge.RESULTS / "h200-e2e-qwen3-99e436d-b16.json",
    merge.RESULTS / "h200-e2e-llama-99e436d-b8.json",
    merge.RESULTS / "h200-e2e-llama-fdf6740-b16.json",  # fdf6740: 99e436d's kernels (a docstring apart)
    # dbf4235: the chunked ring forms (dense and the bank's) offered 2 stages beside 4 (CHUNK_STAGES)
    merge.RESULTS / "h200-e2e-qwen3-dbf4235-b1.json",  # profiled
    merge.RESULTS / "h200-e2e-qwen3-dbf4235-b4.json",
    merge.RESULTS / "h200-e2e-qwen3-dbf4235-b8.json",
    merge.RESULTS / "h200-e2e-llama-dbf4235-b1.json",
    merge.RESULTS / "h200-e2e-llama-dbf4235-b4.json",
    # 5c0f2a9: the MoE router's logits GEMM as vLLM's GateLinear runs it up to 16 tokens, both arms
    merge.RESULTS / "h200-e2e-qwen3-5c0f2a9-b4b16.json",
    merge.RESULTS / "h200-e2e-qwen3-5c0f2a9-b1b4b8.json",  # 1 (profiled; cut before the seated 4 and 8)
    # 6f156f2: the decode attention launched with PDL in the seated arm (then e2e.ATTENTION_PDL)
    merge.RESULTS / "h200-e2e-llama-6f156f2-b1b8.json",
    merge.RESULTS / "h200-e2e-llama-6f156f2-b4.json",
    merge.RESULTS / "h200-e2e-qwen3-6f156f2-b1.json",
    merge.RESULTS / "h200-e2e-qwen3-6f156f2-b4b8.json",
    merge.RESULTS / "h200-e2e-qwen3-6f156f2-b16.json",
    # Llama-3-8B shape: the prefill from 65 tokens on the warp-specialized form (re-tuned at 128 and 1024)
    merge.RESULTS / "h200-e2e-llama-059fae2-b1b8.json",  # 059fae2: 1 and 8 (8 profiled)
    merge.RESULTS / "h200-e2e-llama-059fae2-b4.json",  # 059fae2: 4 (profiled)
    merge.RESULTS / "h200-e2e-llama-e0910ac-b16.json",  # e0910ac: 16 (profiled)
    merge.RESULTS / "h200-e2e-llama-856a2cf-b16b32.json",  # 856a2cf: 32 (static batch)
    merge.RESULTS / "h200-e2e-qwen3-e8c5967-b4.json",  # Qwen3-30B-A3B shape, 4
    merge.RESULTS / "h200-e2e-qwen3-2b124ad-b8.json",  # 2b124ad: 8 (profiled)
    merge.RESULTS / "h200-e2e-qwen3-51ae3f9-b1b8.json",  # 51ae3f9: 1 (and 8, drawn from 2b124ad)
    merge.RESULTS / "h200-e2e-qwen3-416ab12-b16-band64.json",  # 416ab12: 16 (the band of 64)
    merge.RESULTS / "h200-e2e-qwen3-ef53668-b32-band64.json",  # ef53668: 32 (its band sweep void)
    # Qwen3.5-35B-A3B shape, 8 of its 40 layers (the 3:1 pattern), 1-32 with flash-linear-attention's
    # gated delta rule in both arms; the full depth's five batches do not fit one call
    merge.RESULTS / "h200-e2e-qwen35-2dc168a-l8.json",
]
DEFAULT_PNG = Path(__file__).resolve().parents[1] / "docs" / "img" / "decode-speedup.png"
DEFAULT_MERGED = merge.RESULTS / "h200-e2e.json"
# The H100's runs, kept apart from the H200's (issue 7's targets are the H200's): sessions 57-65,
# every H200 call answered by an H100. Llama's batch 1 at 2921505, 4 at dcbcaf7 (the K-warps
# form from 4 tokens), 8 at 4c57cb1 (the K-warps form, session 62) and 16 at a9ec47d, and
# Qwen3-30B's 1 at a9ec47d, 4 at dcbcaf7 and 8 at 68f4cdf come before the runs they replace, so
# those rows are the current code's. Qwen3-30B's 8 is the middle of three processes with the same
# kernels, each with inductor's own draw of its configs (``e2e.INDUCTOR_CONFIGS``): 2.36x, 2.42x
# (68f4cdf, fresh caches on one machine) and 2.48x (b226a69).
H100_RESULTS = [
    merge.RESULTS / "h100-e2e-qwen3-30b-a3b-b8-68f4cdf-autotune2.json",
    merge.RESULTS / "h100-e2e-qwen3-30b-a3b-b8-b226a69-run1.json",
    merge.RESULTS / "h100-e2e-llama-b4-dcbcaf7.json",
    merge.RESULTS / "h100-e2e-qwen3-30b-a3b-b4-dcbcaf7.json",
    merge.RESULTS / "h100-e2e-llama-b1-2921505.json",
    merge.RESULTS / "h100-e2e-llama-b8-4c57cb1.json",
    merge.RESULTS / "h100-e2e-llama-b16-a9ec47d.json",
    merge.RESULTS / "h100-e2e-qwen3-30b-a3b-b1-4-a9ec47d.json",
    merge.RESULTS / "h100-e2e-qwen3-30b-a3b-b8-a9ec47d.json",
    merge.RESULTS / "h100-e2e-llama-d9dac6f.json",
    merge.RESULTS / "h100-e2e-qwen3-30b-a3b-1901c0d.json",
    merge.RESULTS / "h100-e2e-llama-b32-ad5df1c.json",
    merge.RESULTS / "h100-e2e-qwen3-30b-a3b-b32-ad5df1c.json",
    merge.RESULTS / "h100-e2e-qwen3.5-l8-b1-4-8-d68f191.json",
    merge.RESULTS / "h100-e2e-qwen3.5-l8-b16-32-d68f191.json",
    merge.RESULTS / "h100-e2e-qwen3.5-l8-b1-2921505.json",
]
H100_MERGED = merge.RESULTS / "h100-e2e.json"
H100_PNG = DEFAULT_PNG.with_name("decode-speedup-h100.png")
# Each committed table: its runs, their merge, its figure.
COMMITTED = ((DEFAULT_RESULTS, DEFAULT_MERGED, DEFAULT_PNG), (H100_RESULTS, H100_MERGED, H100_PNG))
# What every merged run must share; a row's own commit, date and file go into the row.
SHARED = ("device", "capability", "cuda", "torch", "triton", "transformers", "prompt_tokens", "generated_tokens")
# What may differ between merged runs and goes into each row: what ran Qwen3.5's linear attention
# in both arms (``gated_delta.kernels``), missing before 2026-12-04's runs, the arms
# whose decode attention was launched with PDL (``attention_pdl``), missing before 6f156f2's, then
# their attention and router kernels (``pdl_arms``, ``e2e.PDL_ARMS``), from 2026-12-04's, and up
# to how many tokens the router's logits ran ``router_topk.router_logits`` (missing before 5c0f2a9's),
# and how inductor picked its kernels' configs (``e2e.INDUCTOR_CONFIGS``; missing before session 64's:
# timed at their first call).
TAGS = ("linear_attention_kernels", "attention_pdl", "pdl_arms", "router_logits_max_tokens", "inductor_configs")


def model_figures(run: dict, row: dict) -> dict:
    """What a run measured once for a row's model rather than a batch: its attach (seconds, with
    the adjudication a fresh tuning cache needs) and greedy ``generate()`` at batch 1 (eager, host
    work included) in both arms; None where a run did not record one."""
    model = next((m for m in run.get("models", []) if m["model"] == f"{row['model']}-shaped, random weights"), {})
    generate = model.get("generate_batch1") or {}
    return {
        "attach_seconds": model.get("attach_seconds"),
        "generate_bf16_tok_s": generate.get("bf16_tok_s"),
        "generate_ours_tok_s": generate.get("ours_tok_s"),
    }


def key(row: dict) -> tuple[str, int, int]:
    """One measurement of the table: a model at a depth and a batch (Qwen3.5 is measured at 8 of
    its 40 layers at every batch, and at full depth at the batches one call holds)."""
    return row["model"], row["layers"], row["batch"]


def merged_result(paths: list[Path]) -> dict:
    """The runs at ``paths`` as one result (``merge.merged_result``): a (model, layers, batch) from
    the first run that has it, with its run's ``model_figures``."""
    return merge.merged_result(paths, SHARED, key, TAGS, model_figures)


def series(rows: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """Per model and depth, (batches, ours/bf16 decode tokens/s) in batch order."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in sorted(rows, key=key):
        batches, speedups = out.setdefault(f"{row['model']} ({row['layers']} layers)", ([], []))
        batches.append(row["batch"])
        speedups.append(row["ours_tok_s"] / row["bf16_tok_s"])
    return out


def plot(merged: dict, png: Path = DEFAULT_PNG) -> dict[str, tuple[list[int], list[float]]]:
    """``merged`` (``merged_result``) drawn into ``png``; the lines drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = series(merged["rows"])
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for label, (batches, speedups) in lines.items():
        ax.plot(batches, speedups, marker="o", label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({b for batches, _ in lines.values() for b in batches}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("batch (sequences decoding together)")
    ax.set_ylabel("decode tokens/s, NVFP4 seats / bf16")
    commits = ", ".join(c[:7] for c in merged["commit"])
    ax.set_title(f"{merged['device']}, torch {merged['torch']}\ncommits {commits}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in argv if not a.endswith(".png")]
    png = next((Path(a) for a in argv if a.endswith(".png")), DEFAULT_PNG)
    if paths:
        _draw(merged_result(paths), png)
        return 0
    for runs, merged_path, committed_png in COMMITTED:  # the committed tables, each its runs merged
        merged = merged_result(runs)
        merged_path.write_text(json.dumps(merged, indent=1) + "\n")
        print(f"wrote {merged_path}")
        _draw(merged, committed_png)
    return 0


def _draw(merged: dict, png: Path) -> None:
    for label, (batches, speedups) in plot(merged, png).items():
        print(f"{label}: " + ", ".join(f"{b}: x{s:.2f}" for b, s in zip(batches, speedups, strict=True)))
    print(f"wrote {png}")


if __name__ == "__main__":
    raise SystemExit(main())
