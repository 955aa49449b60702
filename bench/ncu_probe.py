"""One kernel config launched five times, for Nsight Compute: ``python3 bench/ncu_probe.py CASE``
with flashrt importable (``bench/gpu_run.sh`` makes it so), CASE one of qkv1, o1, gate_up1, down1,
gate_up8 (Llama-3-8B's layers as served), moe1, moe8, ring8, gate_up512, gate_up512_ws. Random
weights, fixed seed; what each CASE runs is spelled out below.

gate_up512 is Llama's gate_up at 512 tokens as served (the committed choice: the ``wgmma`` form,
ring layout, until 59aeccb; the warp-specialized form's 256-token tile since,
``h200-ncu-gate_up512_ws256-064291d.txt``), then cuBLAS bf16 on the same shape, five times each,
so that one profile holds both: the form runs it in 252 us against cuBLAS's 154 (``h200-probe-large-m-a1cc4fb.json``),
about 450 against 780 TFLOPS, and whether its steps wait on L2 (the activations, 3.6 bytes
from L2 a weight byte at 128 rows and tokens), on the ring's two stages or on the decode is what
chooses between wider programs, a deeper ring and warp specialization. For example
``ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
--section LaunchStats --section Occupancy -k regex:"wgmma|nvjet|gemm" --launch-skip 4 -c 2
python3 bench/ncu_probe.py gate_up512``: the last of the form's launches, then cuBLAS's first.
gate_up512_ws runs the warp-specialized form (``linear_wgmma_ws_gluon``) there
instead, 128 rows and tokens and 5 stages, its kernel named ``..._wgmma_ws_gluon_kernel``."""

import sys

import torch
from flashrt.bench.probe_warps import committed
from flashrt.kernels import (
    linear_wgmma_ws_gluon,
    moe_gemv_gluon,
    moe_ring_gluon,
    nvfp4,
    ops,
    ring_layout,
)

# Llama-3-8B's projections as a seat serves them on Hopper: ring_layout, the committed choice.
ONE_LAYER = {
    "qkv1": (6144, 4096, 1),
    "o1": (4096, 4096, 1),
    "gate_up1": (28672, 4096, 1),
    "down1": (4096, 14336, 1),
    "gate_up8": (28672, 4096, 8),
}


def committed_or_exit(key: str) -> tuple[str, dict]:
    """The committed choice under ``key``, not the adjudicator's: under the profiler a stale cache
    entry would be timed again and the profile would catch its candidates (fd9e9fb)."""
    choice = committed(key)
    if choice is None:
        sys.exit(f"no committed choice for {key} in kernels/choices: run the kernel benchmark first")
    return choice


case = sys.argv[1]
dev = "cuda"
torch.manual_seed(0)
if case in ("gate_up512", "gate_up512_ws"):
    n, k, m = 28672, 4096, 512
    if case == "gate_up512_ws":
        launch, config = linear_wgmma_ws_gluon.launch, {"BLOCK_M": 128, "WARPS": 8, "STAGES": 5}
    else:
        key = f"linear:torch.bfloat16:M{m}:N{n}:K{k}:ring"
        choice = committed_or_exit(key)
        launch, config = ops.LINEAR_FORMS[choice[0]].launch, choice[1]
    w = nvfp4.quantize(torch.randn(n, k, device=dev, dtype=torch.bfloat16))
    ring, dense = ring_layout.pack(w.packed), nvfp4.dequantize(w, torch.bfloat16)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        launch(x, ring, w.scales, w.global_scale, None, out, config | {"LAYOUT": ring_layout.RING}, True)
    for _ in range(5):
        torch.nn.functional.linear(x, dense)
elif case in ONE_LAYER:
    n, k, m = ONE_LAYER[case]
    key = f"linear:torch.bfloat16:M{m}:N{n}:K{k}:ring"
    choice = committed_or_exit(key)
    w = nvfp4.quantize(torch.randn(n, k, device=dev, dtype=torch.bfloat16))
    ring = ring_layout.pack(w.packed)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        ops.LINEAR_FORMS[choice[0]].launch(
            x, ring, w.scales, w.global_scale, None, out, choice[1] | {"LAYOUT": ring_layout.RING}, True
        )
else:
    t = {"moe1": 1, "moe8": 8, "ring8": 8}[case]
    e, n, k, top = 128, 768, 2048, 8
    gu = nvfp4.quantize(torch.randn(e, 2 * n, k, device=dev, dtype=torch.bfloat16))
    dn = nvfp4.quantize(torch.randn(e, k, n, device=dev, dtype=torch.bfloat16))
    if case == "ring8":  # the ring expert form as a seat serves it on Hopper: ring_layout, the committed config
        gu, dn = ops.bank_for_serving(gu, dn, moe_ring_gluon.MAX_TOKENS)
    gu, dn = (gu.packed, gu.scales, gu.global_scale), (dn.packed, dn.scales, dn.global_scale)
    hidden = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(e, device=dev)[:top] for _ in range(t)])
    wts = torch.softmax(torch.randn(t, top, device=dev), -1).to(torch.bfloat16)
    out = torch.empty(t, k, device=dev, dtype=torch.bfloat16)
    if case == "ring8":
        key = "moe:torch.bfloat16:T8:E128:N768:K2048:top8:ring"
        choice = committed_or_exit(key)
        config = choice[1] | {"LAYOUT": ring_layout.RING}
        for _ in range(5):
            moe_ring_gluon.launch(hidden, gu, dn, ids, wts, out, config, False)
    else:
        cfg = {"ROWS": 2 if t == 1 else 4, "GROUPS": 1, "WARPS_N": 2, "WARPS_K": 2}
        for _ in range(5):
            moe_gemv_gluon.launch(hidden, gu, dn, ids, wts, out, cfg, True)
torch.cuda.synchronize()
print("ok", case)
