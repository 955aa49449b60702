"""How long does a Qwen3.5 gated-delta-rule layer's decode step take, transformers' torch code
against the kernels a serving engine runs?

The batch-1 kernel profile at 2dc168a has the captured e2e step running transformers' torch
loop for the rule in both arms, 200 us of the seated arm's 799 over 6 layers, and torch's
update of the convolution (``bench/gated_delta.py``). This times one layer of the
Qwen3.5-35B-A3B shape (16 key heads repeated to 32 value heads of 128, a 2 MB fp32 state a
sequence; a 4-wide convolution over 8192 channels) at every e2e batch, each arm compiled as the
e2e compiles it:

- the rule: ``torch_loop`` (transformers' code, its new state copied into the cache as
  transformers does), ``fla`` (flash-linear-attention's launcher, its new state copied so) and
  ``in_place`` (``gated_delta.gated_delta_rule_step``, the state advanced where it lies);
- the convolution: ``conv_torch`` (transformers' update) and ``conv_fla``
  (``gated_delta.conv1d_step``).

Every arm is checked against transformers' code first (output and state), then timed by
``timing.graph_us`` (captured, the states rotated past L2). ``python3 bench/probe_gated_delta.py
OUT.json`` with flashrt and flash-linear-attention importable (``bench/gpu_run.sh``).
"""

from __future__ import annotations

import functools
import inspect
import json
import sys

import torch
from flashrt.bench import e2e, gated_delta, timing
from flashrt.bench.kernels import provenance

_CONFIG = e2e.MODELS["qwen3.5-35b-a3b"](0)  # the e2e's layer: key and value heads of the same size
KEY_HEADS, VALUE_HEADS = _CONFIG.linear_num_key_heads, _CONFIG.linear_num_value_heads
DIM, WIDTH = _CONFIG.linear_key_head_dim, _CONFIG.linear_conv_kernel_dim
assert _CONFIG.linear_value_head_dim == DIM
CHANNELS = 2 * KEY_HEADS * DIM + VALUE_HEADS * DIM
RULE_ARMS, CONV_ARMS = ("torch_loop", "fla", "in_place"), ("conv_torch", "conv_fla")


def _transformers():
    """transformers' own torch code for the rule and the convolution's update."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modeling

    return inspect.unwrap(getattr(modeling, gated_delta.RULE)), inspect.unwrap(getattr(modeling, gated_delta.CONV))


def inputs(batch: int, device: torch.device, seed: int = 0) -> dict:
    """One layer's decode inputs as transformers hands them over: bf16 queries and keys repeated
    to the value heads, fp32 decays, bf16 betas, the fp32 state; the convolution's token
    ``[B, D, 1]``, its bf16 state and weight."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    return {
        "query": randn(batch, 1, VALUE_HEADS, DIM),
        "key": randn(batch, 1, VALUE_HEADS, DIM),
        "value": randn(batch, 1, VALUE_HEADS, DIM),
        "g": -torch.rand(batch, 1, VALUE_HEADS, generator=gen, device=device),
        "beta": torch.rand(batch, 1, VALUE_HEADS, generator=gen, device=device).to(torch.bfloat16),
        "state": randn(batch, VALUE_HEADS, DIM, DIM, dtype=torch.float32) * 0.1,
        "x": randn(batch, CHANNELS, 1),
        "conv_state": randn(batch, CHANNELS, WIDTH),
        "weight": randn(CHANNELS, WIDTH) * 0.5,
    }


def arms(compiled: bool = True) -> dict:
    """Each arm as ``fn(inputs) -> output``, advancing the inputs' states in place as the e2e's
    cache is advanced; compiled with inductor where ``compiled``."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    loop, conv = _transformers()

    def copied(rule, i):
        """A rule that returns a new state, copied into the cache as transformers does."""
        out, state = rule(
            i["query"], i["key"], i["value"], g=i["g"], beta=i["beta"], initial_state=i["state"],
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        i["state"].copy_(state)
        return out

    def torch_loop(i):
        return copied(loop, i)

    def fla(i):
        return copied(fused_recurrent_gated_delta_rule, i)

    def in_place(i):
        return gated_delta.gated_delta_rule_step(i["query"], i["key"], i["value"], i["g"], i["beta"], i["state"])

    def conv_torch(i):
        return conv(i["x"], i["conv_state"], i["weight"], None, "silu")

    def conv_fla(i):
        return gated_delta.conv1d_step(i["x"].transpose(1, 2), i["conv_state"], i["weight"], "silu").transpose(1, 2)

    found = {"torch_loop": torch_loop, "fla": fla, "in_place": in_place, "conv_torch": conv_torch, "conv_fla": conv_fla}
    if compiled:
        found = {name: torch.compile(fn, dynamic=False, fullgraph=name != "fla") for name, fn in found.items()}
    return found


def errors(found: dict, batch: int, device: torch.device) -> dict[str, float]:
    """Each arm's largest difference from transformers' code, over its output and its state,
    relative to the largest entry of each (bf16 outputs differ by an ulp where transformers
    rounds between its steps)."""
    expected = {}
    for arm, name in (("torch_loop", "state"), ("conv_torch", "conv_state")):
        i = inputs(batch, device)
        with torch.no_grad():
            expected[arm] = (found[arm](i).float(), i[name].float())
    worst = {}
    for arm, fn in found.items():
        reference, name = ("torch_loop", "state") if arm in RULE_ARMS else ("conv_torch", "conv_state")
        i = inputs(batch, device)
        with torch.no_grad():
            got = (fn(i).float(), i[name].float())
        pairs = zip(got, expected[reference], strict=True)
        worst[arm] = max(((g - e).abs().max() / e.abs().max()).item() for g, e in pairs)
    return worst


def main(out: str) -> None:
    device = torch.device("cuda")
    e2e.compile_as_runs_do(inductor_pdl=True)
    found = arms()
    result = provenance() | {"kernels": gated_delta.kernels(), "rows": []}
    for batch in e2e.BATCHES:
        row = {"batch": batch, "state_bytes": batch * VALUE_HEADS * DIM * DIM * 4}
        for arm, err in errors(found, batch, device).items():
            row[f"{arm}_rel_err"] = err
            assert err < 1e-2, f"{arm} at batch {batch}: {err}"
        copies = [inputs(batch, device, seed) for seed in range(timing.copies_for(row["state_bytes"]))]
        with torch.no_grad():
            for arm, fn in found.items():
                row[f"{arm}_us"] = timing.graph_us([functools.partial(fn, i) for i in copies])
        result["rows"].append(row)
        print(f"batch {batch:2d}: " + "  ".join(f"{arm} {row[f'{arm}_us']:6.1f}" for arm in found))
        with open(out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
