"""``flashrt demo``: NVFP4 linears seated into a small generated model, on any machine.

Until the vLLM demo lands (issue 4), this is the most complete path that runs everywhere: a
Llama-style model with random weights built by transformers from a small config (no download),
every projection and the LM head quantized to NVFP4 and computed through ``flashrt.kernels.
linear`` (Triton on a GPU, the plain-torch reference elsewhere), greedy generation on both, and a
table of what was seated, the memory it takes and how close its logits stay.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from flashrt.kernels import linear, quantize


def _model(device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval()


def _seat(model: torch.nn.Module) -> list[tuple[str, int, int]]:
    """Swap each nn.Linear's forward for the NVFP4 op; returns (name, bf16 bytes, nvfp4 bytes)."""
    seated = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            packed = quantize(module.weight.detach())
            bias = module.bias

            def forward(x, packed=packed, bias=bias):
                return linear(x, packed, bias)

            module.forward = forward
            seated.append((name, module.weight.numel() * module.weight.element_size(), packed.nbytes))
    return seated


def _kind(name: str) -> str:
    return "lm_head" if name == "lm_head" else name.rsplit(".", 1)[-1]


def main(tokens: int = 24) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"[1/4] building a Llama-style model with random weights on {device}", flush=True)
    model = _model(device)
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), device=device)
    with torch.no_grad():
        base_logits = model(prompt).logits[0, -1].float()
        base_tokens = model.generate(prompt, max_new_tokens=tokens, do_sample=False)[0, 16:].tolist()
    print("[2/4] quantizing every projection and the LM head to NVFP4", flush=True)
    start = time.perf_counter()
    seated = _seat(model)
    seat_s = time.perf_counter() - start
    print(f"[3/4] greedy generation of {tokens} tokens through the NVFP4 linear op", flush=True)
    with torch.no_grad():
        ours_logits = model(prompt).logits[0, -1].float()
        ours_tokens = model.generate(prompt, max_new_tokens=tokens, do_sample=False)[0, 16:].tolist()
    print("[4/4] seats\n", flush=True)
    kinds: dict[str, list[int]] = {}
    for name, before, after in seated:
        k = kinds.setdefault(_kind(name), [0, 0, 0])
        k[0] += 1
        k[1] += before
        k[2] += after
    print(f"{'kind':10s} {'seats':>5s} {'bf16 MiB':>9s} {'nvfp4 MiB':>10s} {'ratio':>6s}")
    for kind, (count, before, after) in kinds.items():
        print(f"{kind:10s} {count:5d} {before / 2**20:9.2f} {after / 2**20:10.2f} {after / before:6.3f}")
    total_before = sum(b for _, b, _ in seated)
    total_after = sum(a for _, _, a in seated)
    cosine = F.cosine_similarity(base_logits, ours_logits, dim=0).item()
    agree = sum(a == b for a, b in zip(base_tokens, ours_tokens, strict=True))
    ratio = total_after / total_before
    print(f"{'all':10s} {len(seated):5d} {total_before / 2**20:9.2f} {total_after / 2**20:10.2f} {ratio:6.3f}")
    print(
        f"\nquantized in {seat_s:.2f} s; first-step logits cosine against bf16: {cosine:.4f}; "
        f"greedy tokens equal to bf16's: {agree}/{tokens}"
    )
    print("random weights carry no signal, so token agreement is a weak check; the cosine is the figure.")
    return 0
