"""``python -m flashrt.bench plot-e2e [RESULT] [PNG]``: decode speedup against batch, one line a
model, from an e2e result (default ``bench/results/h200-e2e.json`` to ``docs/img/decode-speedup.png``).
The title names the device and the commit the figures came from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEFAULT_RESULT = ROOT / "results" / "h200-e2e.json"
DEFAULT_PNG = ROOT.parent / "docs" / "img" / "decode-speedup.png"


def series(result: dict) -> dict[str, tuple[list[int], list[float]]]:
    """Per model, (batches, ours/bf16 decode tokens/s) in batch order."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in sorted(result["rows"], key=lambda r: (r["model"], r["batch"])):
        batches, speedups = out.setdefault(f"{row['model']} ({row['layers']} layers)", ([], []))
        batches.append(row["batch"])
        speedups.append(row["ours_tok_s"] / row["bf16_tok_s"])
    return out


def plot(result_path: Path = DEFAULT_RESULT, png: Path = DEFAULT_PNG) -> dict[str, tuple[list[int], list[float]]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = json.loads(result_path.read_text())
    lines = series(result)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for label, (batches, speedups) in lines.items():
        ax.plot(batches, speedups, marker="o", label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({b for batches, _ in lines.values() for b in batches}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("batch (sequences decoding together)")
    ax.set_ylabel("decode tokens/s, NVFP4 seats / bf16")
    ax.set_title(f"{result['device']}, torch {result['torch']}, commit {result['commit'][:7]}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    result = Path(argv[0]) if argv else DEFAULT_RESULT
    png = Path(argv[1]) if len(argv) > 1 else DEFAULT_PNG
    for label, (batches, speedups) in plot(result, png).items():
        print(f"{label}: " + ", ".join(f"{b}: x{s:.2f}" for b, s in zip(batches, speedups, strict=True)))
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
