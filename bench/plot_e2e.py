"""``python -m flashrt.bench plot-e2e [RESULT ...] [PNG]``: decode speedup against batch, one line a
model, from e2e results (default ``DEFAULT_RESULTS`` to ``docs/img/decode-speedup.png``). A model
and batch measured in several results is drawn from the first that has it; the title names the
device and the commits the figures came from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEFAULT_RESULTS = [  # every arm with vLLM's merged projections, torch.compile's PDL from 0d80628 on
    ROOT / "results" / "h200-e2e-llama-e8c5967-b1-32.json",  # e8c5967: Llama-3-8B shape, 1-32
    ROOT / "results" / "h200-e2e-qwen3-e8c5967-b4.json",  # Qwen3-30B-A3B shape, 4
    ROOT / "results" / "h200-e2e-qwen3-2b124ad-b8.json",  # 2b124ad: 8 (profiled)
    ROOT / "results" / "h200-e2e-qwen3-51ae3f9-b1b8.json",  # 51ae3f9: 1 (and 8, drawn from 2b124ad)
    ROOT / "results" / "h200-e2e-qwen3-416ab12-b16-band64.json",  # 416ab12: 16 (the band of 64)
    ROOT / "results" / "h200-e2e-qwen3-ef53668-b32-band64.json",  # ef53668: 32 (its band sweep void)
    ROOT / "results" / "h200-e2e-qwen35-merged.json",  # Qwen3.5-35B-A3B shape, batch 1 (d63d0e4, cut at the limit)
]
DEFAULT_PNG = ROOT.parent / "docs" / "img" / "decode-speedup.png"


def merged_rows(results: list[dict]) -> list[dict]:
    """The rows of ``results``, each (model, batch) once: from the first result that has it."""
    seen, rows = set(), []
    for result in results:
        for row in result["rows"]:
            if (row["model"], row["batch"]) not in seen:
                seen.add((row["model"], row["batch"]))
                rows.append(row)
    return rows


def series(rows: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """Per model, (batches, ours/bf16 decode tokens/s) in batch order."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in sorted(rows, key=lambda r: (r["model"], r["batch"])):
        batches, speedups = out.setdefault(f"{row['model']} ({row['layers']} layers)", ([], []))
        batches.append(row["batch"])
        speedups.append(row["ours_tok_s"] / row["bf16_tok_s"])
    return out


def plot(result_paths: list[Path] | None = None, png: Path = DEFAULT_PNG) -> dict[str, tuple[list[int], list[float]]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [json.loads(path.read_text()) for path in result_paths or DEFAULT_RESULTS]
    lines = series(merged_rows(results))
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for label, (batches, speedups) in lines.items():
        ax.plot(batches, speedups, marker="o", label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({b for batches, _ in lines.values() for b in batches}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("batch (sequences decoding together)")
    ax.set_ylabel("decode tokens/s, NVFP4 seats / bf16")
    commits = ", ".join(dict.fromkeys(r["commit"][:7] for r in results))
    ax.set_title(f"{results[0]['device']}, torch {results[0]['torch']}\ncommits {commits}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    results = [Path(a) for a in argv if not a.endswith(".png")] or None
    png = next((Path(a) for a in argv if a.endswith(".png")), DEFAULT_PNG)
    for label, (batches, speedups) in plot(results, png).items():
        print(f"{label}: " + ", ".join(f"{b}: x{s:.2f}" for b, s in zip(batches, speedups, strict=True)))
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
