"""``flashrt demo``: NVFP4 linears seated into a small generated model, on any machine.

Until the vLLM demo lands (issue 4), this is the most complete path that runs everywhere: a
Llama-style model with random weights built by transformers from a small config (no download),
``flashrt.runtime.attach`` seats every projection and the LM head (Triton kernels on a GPU, the
plain-torch reference elsewhere), greedy generation on both, and the seat table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flashrt.runtime import SeatProfile, attach


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


def main(tokens: int = 24) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"[1/4] building a Llama-style model with random weights on {device}", flush=True)
    model = _model(device)
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), device=device)
    with torch.no_grad():
        base_logits = model(prompt).logits[0, -1].float()
        base_tokens = model.generate(prompt, max_new_tokens=tokens, do_sample=False)[0, 16:].tolist()
    print("[2/4] attaching: NVFP4 seats for every projection and the LM head", flush=True)
    handle = attach(model, SeatProfile(min_params=0))
    print(f"[3/4] greedy generation of {tokens} tokens through the NVFP4 linear op", flush=True)
    with torch.no_grad():
        ours_logits = model(prompt).logits[0, -1].float()
        ours_tokens = model.generate(prompt, max_new_tokens=tokens, do_sample=False)[0, 16:].tolist()
    print("[4/4] seats\n", flush=True)
    print(handle.table())
    summary = handle.summary()
    cosine = F.cosine_similarity(base_logits, ours_logits, dim=0).item()
    agree = sum(a == b for a, b in zip(base_tokens, ours_tokens, strict=True))
    before, after = summary["weight_bytes_before"] / 2**20, summary["weight_bytes_after"] / 2**20
    print(f"\nattach {handle.attach_seconds:.2f} s; seated weights {before:.1f} MiB -> {after:.1f} MiB")
    print(f"seam calls {summary['calls']}, fallbacks {summary['fallbacks']}, refused {len(summary['refused'])}")
    print(f"first-step logits cosine against bf16: {cosine:.4f}; greedy tokens equal to bf16's: {agree}/{tokens}")
    print("random weights have no trained structure: each seat holds its parity column against bf16, and the")
    print("errors of every seated layer compound at the logits; token agreement on random logits means little.")
    return 0
