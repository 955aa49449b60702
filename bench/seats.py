"""``python -m flashrt.bench seats``: attach to a Qwen3-30B-A3B-shaped model on the GPU.

Random weights built by transformers from the real config (no download), fewer layers than
48 so that the run fits one call (stated in the result). Reports per-kind seats, attach time,
weight memory before and after, first-step logits cosine against bf16, and greedy decode speed
through ``generate()`` for both arms (host time included, as design.md warns).

Random Gaussian weights give expert banks a parity near 0.987 against bf16 (two chained NVFP4
GEMMs and a gate); the run uses a floor of 0.98 so that the banks are seated, and says so.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from flashrt.bench.e2e import build
from flashrt.bench.kernels import provenance
from flashrt.runtime import SeatProfile, attach


def _decode_tok_s(model, prompt, tokens: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    torch.cuda.synchronize()
    assert out.shape[1] == prompt.shape[1] + tokens
    return prompt.shape[0] * tokens / (time.perf_counter() - start)


def _arm(model, prompt, profile: SeatProfile, tokens: int, host_logits: torch.Tensor) -> tuple[dict, object]:
    """Attach with ``profile``, measure, and return the figures with the handle (still attached)."""
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    handle = attach(model, profile)
    peak = torch.cuda.max_memory_allocated()
    largest = max(s.spec.params * 2 for s in handle.seats)
    long_prompt = prompt.repeat(1, 8)  # 256 rows: above the MoE band
    with torch.no_grad():
        seated_logits = model(prompt).logits[:, -1].float()
        model(long_prompt)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            model(long_prompt)
        torch.cuda.synchronize()
    prefill_ms = (time.perf_counter() - start) / 3 * 1e3
    _decode_tok_s(model, prompt, 4)
    figures = {
        "retain_host_experts": profile.retain_host_experts,
        "attach_seconds": handle.attach_seconds,
        "model_bytes_before_attach": model_bytes,
        "largest_seat_bf16_bytes": largest,
        "attach_peak_bytes": peak,
        "attach_peak_within_model_plus_largest_layer": peak <= model_bytes + largest,
        "first_step_logits_cosine": float(F.cosine_similarity(seated_logits, host_logits, dim=-1).min()),
        "prefill_256_ms": prefill_ms,
        "decode_tok_s": _decode_tok_s(model, prompt, tokens),
        "device_bytes_after_attach": torch.cuda.memory_allocated(),
    }
    return figures, handle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt.bench seats")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("flashrt bench seats needs a CUDA GPU: this machine has none.")
        return 2
    result = provenance() | {"model": "Qwen3-30B-A3B-shaped, random weights", "layers": args.layers}
    model = build("qwen3-30b-a3b", args.layers)
    torch.manual_seed(0)
    prompt = torch.randint(0, 151936, (1, 32), device="cuda")
    with torch.no_grad():
        host_logits = model(prompt).logits[:, -1].float()
        model(prompt.repeat(1, 8))
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            model(prompt.repeat(1, 8))
        torch.cuda.synchronize()
    result["bf16_prefill_256_ms"] = (time.perf_counter() - start) / 3 * 1e3
    _decode_tok_s(model, prompt, 4)  # warm-up
    result["bf16_decode_tok_s"] = _decode_tok_s(model, prompt, args.tokens)
    result["bf16_device_bytes"] = torch.cuda.memory_allocated()
    result["parity_floor"] = 0.98
    result["arms"] = []
    for retain in (True, False):
        figures, handle = _arm(
            model, prompt, SeatProfile(parity_floor=0.98, retain_host_experts=retain), args.tokens, host_logits
        )
        summary = handle.summary()
        kinds = {}
        for s in handle.seats:
            k = kinds.setdefault(
                s.kind, {"seated": 0, "refused": 0, "bytes_before": 0, "bytes_after": 0, "min_parity": 1.0}
            )
            k["seated" if s.state == "seated" else "refused"] += 1
            if s.state == "seated":
                k["bytes_before"] += s.bytes_before
                k["bytes_after"] += s.bytes_after
                k["min_parity"] = min(k["min_parity"], s.parity)
        figures["kinds"] = kinds
        figures["summary"] = {k: v for k, v in summary.items() if k != "refused"} | {"refused": len(summary["refused"])}
        figures["notes"] = handle.notes
        print(handle.table())
        handle.detach()
        with torch.no_grad():
            figures["detach_restores_logits"] = bool(torch.equal(model(prompt).logits[:, -1].float(), host_logits))
        result["arms"].append(figures)
        print(json.dumps({k: v for k, v in figures.items() if k not in ("kinds", "notes")}, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "arms"}, indent=1))
    gpu = result["device"].lower().replace("nvidia ", "").replace(" ", "-")
    out = Path(args.out or Path(__file__).resolve().parent / "results" / f"{gpu}-seats.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
