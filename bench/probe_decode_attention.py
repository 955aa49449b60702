"""How long does one layer's decode attention take, split along the cache or not?

In the e2e step at b045f1b (H200) cuDNN's sdpa, one program a (sequence, key-value head), took
11.3 us a layer at batch 1 and 24 at 16 for the 259-position cache (``bench/decode_attention.py``
says why that is slow). This times, at the e2e's cache and at every e2e batch, for the
Qwen3-30B-A3B (4 key-value heads of 8 query heads), Llama-3-8B (8 of 4) and Qwen3.5-35B-A3B
(2 of 8, heads of 256) layers:

- ``sdpa_cudnn``: the query heads of a key-value head as its rows through
  ``F.scaled_dot_product_attention`` on the cuDNN backend, what the e2e's compiled step ran;
- ``sdpa``: the same, the backend torch picks in eager;
- ``split`` and ``split_<programs>``: ``decode_attention`` with its ``TARGET_PROGRAMS`` (the
  default) and with other targets (1: no split), to check the default against its neighbours;
- ``tile_<keys>k<warps>w<stages>s``: the default target with one tile at every pair count
  (keys a step, warps, stages) in place of ``decode_attention.tile_for``'s choice: wider steps put
  more of the cache in flight a program where the heads alone fill the GPU and nothing is split
  (Llama-3-8B at 32 sequences: 17.3 us at 32 keys, 427f4ad; 15.9 at 64, e7e919e).

Every arm is checked against ``decode_attention.reference`` first, then timed by
``timing.graph_us`` (captured, caches rotated past L2). ``python3 bench/probe_decode_attention.py
OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import functools
import json
import sys

import torch
import torch.nn.functional as F
from flashrt.bench import decode_attention, e2e, timing
from flashrt.bench.decode_attention import Tile
from flashrt.bench.kernels import provenance
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.runtime.errors import OutOfResources

# key-value heads, query heads each, dim
LAYERS = {"qwen3-30b-a3b": (4, 8, 128), "llama3-8b": (8, 4, 128), "qwen3.5-35b-a3b": (2, 8, 256)}
LENGTH = e2e.PROMPT + e2e.GENERATED + e2e.WARM_STEPS
VISIBLE = e2e.PROMPT + e2e.GENERATED // 2  # mid-generation
TARGETS = (1, 66, 264, 528)
TILES = [(keys, warps, stages) for keys in (32, 64, 128) for warps in (4, 8) for stages in (2, 3, 4)]


def _sdpa(query, key, value, visible, scale, backend=None):
    mask = visible[:, None, None, :]
    if backend is None:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


def _with_settings(**settings):
    """``decode_attention`` with some of its module settings (``TARGET_PROGRAMS``, the ``NARROW``
    and ``WIDE`` tiles) changed for the call, then put back."""

    def run(query, key, value, visible, scale):
        defaults = {name: getattr(decode_attention, name) for name in settings}
        for name, setting in settings.items():
            setattr(decode_attention, name, setting)
        try:
            return decode_attention.decode_attention(query, key, value, visible, scale)
        finally:
            for name, setting in defaults.items():
                setattr(decode_attention, name, setting)

    return run


ARMS = (
    {
        "sdpa_cudnn": lambda *a: _sdpa(*a, backend=SDPBackend.CUDNN_ATTENTION),
        "sdpa": _sdpa,
        "split": decode_attention.decode_attention,
    }
    | {f"split_{t}": _with_settings(TARGET_PROGRAMS=t) for t in TARGETS}
    | {f"tile_{k}k{w}w{s}s": _with_settings(NARROW=Tile(k, w, s), WIDE=Tile(k, w, s)) for k, w, s in TILES}
)


def main(out: str) -> None:
    result = provenance() | {"length": LENGTH, "visible": VISIBLE, "rows": []}
    for model, (kv_heads, groups, dim) in LAYERS.items():
        for batch in e2e.BATCHES:
            visible = torch.zeros(batch, LENGTH, dtype=torch.bool, device="cuda")
            visible[:, :VISIBLE] = True
            nbytes = 2 * batch * kv_heads * LENGTH * dim * 2
            copies = [
                (torch.randn(batch, kv_heads, groups, dim, device="cuda", dtype=torch.bfloat16),
                 *torch.randn(2, batch, kv_heads, LENGTH, dim, device="cuda", dtype=torch.bfloat16))
                for _ in range(timing.copies_for(nbytes))
            ]  # fmt: skip
            scale = dim**-0.5
            expected = decode_attention.reference(*copies[0], visible, scale).float()
            row = {"model": model, "batch": batch, "kv_heads": kv_heads, "groups": groups, "dim": dim}
            row["splits"] = decode_attention.split_count(batch * kv_heads, LENGTH, dim)
            for arm, fn in ARMS.items():
                try:
                    got = fn(*copies[0], visible, scale).float()
                    row[f"{arm}_max_err"] = (got - expected).abs().max().item()
                    assert row[f"{arm}_max_err"] < 2e-2, f"{arm} is wrong: {row[f'{arm}_max_err']}"
                    calls = [functools.partial(fn, *c, visible, scale) for c in copies]
                    row[f"{arm}_us"] = timing.graph_us(calls)
                except (RuntimeError, OutOfResources) as exc:  # a backend or tile this GPU cannot run here
                    row[f"{arm}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            result["rows"].append(row)
            base = row.get("sdpa_cudnn_us") or row.get("sdpa_us")
            figures = "  ".join(f"{arm} {row[f'{arm}_us']:6.1f}" for arm in ARMS if f"{arm}_us" in row)
            print(f"{model} batch {batch:2d} ({row['splits']} splits): {figures}  x{base / row['split_us']:.2f}")
            with open(out, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
