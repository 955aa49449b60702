"""NVFP4 format, Triton kernels and custom ops against plain-torch references.

On the CPU the Triton kernels run under ``TRITON_INTERPRET=1`` (conftest); on a GPU the same
tests run the compiled kernels, including the PTX decoder the interpreter cannot run.
"""

import functools
from itertools import product

import pytest
import torch
import torch.nn.functional as F
from flashrt.kernels import (
    add_norm_after,
    decode,
    linear_dequant,
    linear_gemv,
    linear_gemv_gluon,
    linear_k_warps_gluon,
    linear_mma,
    linear_mma_gluon,
    linear_mma_ws_gluon,
    linear_w4a4,
    linear_wgmma_gluon,
    linear_wgmma_ws_gluon,
    moe_fused,
    moe_gemv_gluon,
    moe_ring_gluon,
    moe_w4a4,
    norm_scale_after,
    nvfp4,
    ops,
    permute_steps,
    ring_layout,
    tuning,
)
from flashrt.kernels.decode import use_prmt
from flashrt.kernels.nvfp4 import NVFP4Weight
from flashrt.kernels.quantizer import quantize_rows, quantize_triton

ON_GPU = torch.cuda.is_available()


def _prmt(device):
    return use_prmt(torch.cuda.get_device_capability(device) if device.type == "cuda" else None)


def _rel_err_f64(out: torch.Tensor, x: torch.Tensor, w: NVFP4Weight) -> float:
    ref = x.double() @ nvfp4.dequantize(w, torch.float64).t()
    return float((out.double() - ref).norm() / ref.norm())


# -- format ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(64, 768), (33, 2048), (4, 24, 4096), (3, 40, 64)])
def test_quantize_dequantize_round_trip_is_bit_exact(shape):
    q = nvfp4.quantize_reference(torch.randn(*shape, dtype=torch.bfloat16))
    again = nvfp4.quantize_reference(nvfp4.dequantize(q, torch.float32))
    assert torch.equal(again.packed, q.packed)
    assert torch.equal(again.scales.view(torch.uint8), q.scales.view(torch.uint8))
    torch.testing.assert_close(again.global_scale, q.global_scale, rtol=2e-7, atol=0)


def test_the_launchers_grid_arithmetic_is_tritons():
    """``decode.cdiv`` and ``decode.next_power_of_2``, which the launchers call on the host in
    place of Triton's (a slow ``ConstexprFunction`` call there), give Triton's values."""
    import triton
    from flashrt.kernels.decode import cdiv, next_power_of_2

    for n in range(0, 5000):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for b in (1, 2, 3, 16, 64, 132, 256):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)


def test_e2m1_codes_round_to_nearest_even():
    x = torch.tensor([0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, -0.74, -0.0])
    assert nvfp4.e2m1_values(nvfp4.e2m1_codes(x)).tolist() == [
        0.0,
        0.5,
        1.0,
        1.0,
        2.0,
        2.0,
        4.0,
        4.0,
        6.0,
        6.0,
        -0.5,
        0.0,
    ]


def test_dequantized_weight_is_close_to_the_original():
    w = torch.randn(256, 2048, dtype=torch.bfloat16)
    back = nvfp4.dequantize(nvfp4.quantize_reference(w), torch.float32)
    assert F.cosine_similarity(back.flatten(), w.float().flatten(), dim=0) > 0.99


@pytest.mark.parametrize("batched", [False, True])
def test_checkpoint_layouts_round_trip(batched):
    q = nvfp4.quantize_reference(torch.randn(*((3,) if batched else ()), 32, 128, dtype=torch.bfloat16))
    mo = nvfp4.from_modelopt(nvfp4.to_modelopt(q))
    ct = nvfp4.from_compressed_tensors(nvfp4.to_compressed_tensors(q))
    assert set(nvfp4.to_modelopt(q)) == {"weight", "weight_scale", "weight_scale_2"}
    assert set(nvfp4.to_compressed_tensors(q)) == {"weight_packed", "weight_scale", "weight_global_scale"}
    for back in (mo, ct):
        assert torch.equal(back.packed, q.packed)
        assert torch.equal(back.scales.view(torch.uint8), q.scales.view(torch.uint8))
        torch.testing.assert_close(back.global_scale, q.global_scale, rtol=2e-7, atol=0)
    # compressed-tensors divides by its global scale: the dequantized weight must not change.
    torch.testing.assert_close(
        nvfp4.dequantize(ct, torch.float32), nvfp4.dequantize(q, torch.float32), rtol=1e-6, atol=0
    )


@pytest.mark.parametrize(
    "shape", [(40, 64), (3, 40, 64), (17, 48)] + ([(2, 1536, 2048), (4096, 4096)] if ON_GPU else [])
)
def test_quantizer_kernel_matches_reference_bit_for_bit(shape, device):
    """Against the reference run on the CPU and on the kernel's device: the reference's bytes do
    not depend on where it runs (on the GPU, torch divides by a number's reciprocal)."""
    w = torch.randn(*shape, dtype=torch.bfloat16, device=device) * 3
    got = quantize_triton(w)
    for ref in (nvfp4.quantize_reference(w.cpu()), nvfp4.quantize_reference(w)):
        assert torch.equal(got.packed.cpu(), ref.packed.cpu())
        assert torch.equal(got.scales.view(torch.uint8).cpu(), ref.scales.view(torch.uint8).cpu())
        assert torch.equal(got.global_scale.cpu(), ref.global_scale.cpu())


@pytest.mark.parametrize("quantizer", ["reference", "kernel"])
def test_shards_quantized_on_the_whole_weight_s_amax_hold_the_whole_weight_s_bytes(quantizer, device):
    """Tensor-parallel shards (rows, or K in blocks of 16) and the head's slabs, each given the
    whole weight's amax, are byte for byte the matching parts of the whole's quantization; on
    their own amax they are not (the shard without the weight's largest element)."""
    quantize = nvfp4.quantize_reference if quantizer == "reference" else quantize_triton
    w = torch.randn(3, 48, 64, dtype=torch.bfloat16, device=device)
    w[0, 5, 7], w[1, 40, 60], w[2, 2, 50] = 40.0, -30.0, 20.0  # each expert's amax in one shard
    whole = quantize(w)
    amax = nvfp4.absolute_max(w)
    assert torch.equal(amax, w.float().abs().amax(dim=(1, 2))) and nvfp4.absolute_max(w[1]) == amax[1]
    for (r0, r1), (k0, k1) in (((24, 48), (0, 64)), ((0, 48), (0, 32)), ((8, 40), (16, 64))):
        part = quantize(w[:, r0:r1, k0:k1].contiguous(), amax)
        assert torch.equal(part.packed.cpu(), whole.packed[:, r0:r1, k0 // 2 : k1 // 2].cpu())
        scales = whole.scales.view(torch.uint8)[:, r0:r1, k0 // 16 : k1 // 16]
        assert torch.equal(part.scales.view(torch.uint8).cpu(), scales.cpu())
        assert torch.equal(part.global_scale.cpu(), whole.global_scale.cpu())
    alone = quantize(w[:, 24:48].contiguous())
    assert not torch.equal(alone.global_scale.cpu(), whole.global_scale.cpu())
    with pytest.raises(ValueError, match=r"amax: got \(\), need a tensor of shape \(3,\)"):
        quantize(w, amax.amax())


@pytest.mark.parametrize("shape", [(1, 2048), (7, 768), (3, 4096 + 48)])
def test_activation_quantizer_matches_reference_row_by_row(shape, device):
    """Per-token NVFP4 (the W4A4 forms' activations), one launch: every row as the reference
    quantizes that row alone, bit for bit; a zero row gets scale 1 and zero codes."""
    x = torch.randn(*shape, dtype=torch.bfloat16, device=device) * 5
    x[-1] = 0
    ref = nvfp4.quantize_reference(x.cpu().reshape(shape[0], 1, shape[1]))
    got = quantize_rows(x)
    assert torch.equal(got.packed.cpu(), ref.packed[:, 0])
    assert torch.equal(got.scales.view(torch.uint8).cpu(), ref.scales[:, 0].view(torch.uint8))
    assert torch.equal(got.global_scale.cpu(), ref.global_scale)


# -- linear ----------------------------------------------------------------------------------------


# Each form is tested on the token counts it is offered for (the GEMVs: up to 4 tokens); the
# Gluon GEMV needs a compiled GPU (no interpreter), CI checks its decoder in plain torch below.
GLUON_FORMS = {"gemv_gluon": linear_gemv_gluon, "mma_gluon": linear_mma_gluon, "k_warps_gluon": linear_k_warps_gluon}
if ON_GPU and linear_wgmma_gluon.qualifies(torch.cuda.get_device_capability()):
    GLUON_FORMS["wgmma_gluon"] = linear_wgmma_gluon
    GLUON_FORMS["wgmma_ws_gluon"] = linear_wgmma_ws_gluon
LINEAR_FORMS = {"gemv": linear_gemv, "mma": linear_mma, "dequant": linear_dequant} | (GLUON_FORMS if ON_GPU else {})
LINEAR_TOKENS = {
    "gemv": (1, 3),
    "gemv_gluon": (1, 3),
    "mma": (1, 3, 7, 16, 33),
    "mma_gluon": (1, 3, 7, 16, 33),
    "k_warps_gluon": (4, 5, 8, 16),
    "wgmma_gluon": (33, 64, 130),
    "wgmma_ws_gluon": (130, 300),
    "dequant": (64, 100),
}
LINEAR_CONFIGS = {
    "gemv": {"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2},
    "gemv_gluon": {"ROWS": 4, "GROUPS": 2, "WARPS_N": 2, "WARPS_K": 2},
    "mma": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2},
    "mma_gluon": {"BLOCK_M": 16, "ROW_TILES": 2, "WARPS": 4, "STAGES": 3},
    "k_warps_gluon": {"BLOCK_M": 16, "K_WARPS": 2, "ROW_WARPS": 2, "STAGES": 3},
    "wgmma_gluon": {"BLOCK_M": 64, "ROW_TILES": 1, "WARPS": 4, "STAGES": 2, "ASYNC_MMA": 1},
    "wgmma_ws_gluon": {"BLOCK_M": 128, "WARPS": 4, "STAGES": 4},
    "dequant": {"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4},
}
# The K-warps form splits K in whole ring steps a warp: 768 (3 steps) is not offered to it.
LINEAR_KS = {"k_warps_gluon": (2048, 4096)}
LINEAR_CASES = [
    (form, m, k) for form in LINEAR_FORMS for m in LINEAR_TOKENS[form] for k in LINEAR_KS.get(form, (768, 2048, 4096))
]


@pytest.mark.parametrize(("form", "m", "k"), LINEAR_CASES)
def test_linear_kernel_matches_reference(form, m, k, device):
    n = 200 if not ON_GPU else 1000  # not a multiple of any block size
    w = torch.randn(n, k, dtype=torch.bfloat16, device=device)
    q = nvfp4.quantize(w)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    bias = torch.randn(n, dtype=torch.bfloat16, device=device)
    mod = LINEAR_FORMS[form]
    config = LINEAR_CONFIGS[form]
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    mod.launch(x, q.packed, q.scales, q.global_scale, None, out, config, _prmt(device))
    assert not out.isnan().any(), "every output element must be written"
    assert _rel_err_f64(out, x, q) < 1e-2
    assert F.cosine_similarity(out.float().flatten(), F.linear(x, w).float().flatten(), dim=0) >= 0.99
    out_b = torch.full_like(out, float("nan"))
    mod.launch(x, q.packed, q.scales, q.global_scale, bias, out_b, config, _prmt(device))
    # The kernel adds the bias before its one rounding to bf16, ``out`` was rounded without it:
    # where the bias cancels a large product the two differ by half a bf16 ulp of either.
    rounding = 2**-8 * (out.float().abs() + out_b.float().abs())
    assert ((out_b.float() - (out.float() + bias.float())).abs() <= 2e-2 + rounding).all()


RING_LAYOUT_CASES = [
    (form, m)
    for form, mod in LINEAR_FORMS.items()
    if ring_layout.RING in getattr(mod, "LAYOUTS", ())
    for m in LINEAR_TOKENS[form]
]


@pytest.mark.parametrize(("form", "m"), RING_LAYOUT_CASES)
def test_linear_forms_read_the_ring_layout(form, m, device):
    """The forms that read ``ring_layout`` give the reference's product on a weight repacked in
    it, the decode (pairs of K-neighbours, shifts) and the activation order (none gathered,
    or ``permute_steps``' other order) included; every Gluon config of the shape on a GPU."""
    n, k = (200, 2048) if not ON_GPU else (1000, 2048)
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    ring = q.in_layout(ring_layout.RING)
    assert not torch.equal(ring.packed, q.packed)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    mod = LINEAR_FORMS[form]
    configs = mod.configs(m, n, k) if form != "dequant" else [LINEAR_CONFIGS[form]]
    assert configs
    for config in configs:
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
        mod.launch(x, ring.packed, q.scales, q.global_scale, None, out, config | {"LAYOUT": ring_layout.RING}, False)
        assert not out.isnan().any(), config
        assert _rel_err_f64(out, x, q) < 1e-2, config


@pytest.mark.parametrize(("m", "k", "split"), [(3, 2048, 4), (16, 4000, 3), (33, 768, 2)])
def test_split_k_sums_every_split_once(m, k, split, device):
    """Split-K: partials per K range, summed in split order, scaled, biased. K = 4000 with three
    splits: the last split is short and ends in a masked BLOCK_K step."""
    n = 200 if not ON_GPU else 1000
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    bias = torch.randn(n, dtype=torch.bfloat16, device=device)
    config = {**LINEAR_CONFIGS["mma"], "BLOCK_K": 128, "SPLIT_K": split}
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    linear_mma.launch(x, q.packed, q.scales, q.global_scale, bias, out, config, _prmt(device))
    ref = ops.linear_reference(x, q, bias)
    assert not out.isnan().any()
    assert (out.double() - ref.double()).norm() / ref.double().norm() < 1e-2


@pytest.mark.parametrize(("m", "n", "block"), [(300, 1000, 1024), (64, 4096, 512), (40, 2000, 256), (3, 200, 128)])
def test_reduce_splits_sums_in_split_order_in_blocks_that_fill_the_gpu(m, n, block, device):
    """The ordered reduce of every split-K and expert-down form: the largest block that still
    gives ``MIN_PROGRAMS`` programs (small reduces in many small programs), bit for bit the
    partials summed in split order; then scaled and biased; a ragged last block masked."""
    assert linear_mma.reduce_block(m, n) == block
    partials = torch.randn(3, m, n, device=device)
    summed = torch.full((m, n), float("nan"), device=device)
    linear_mma.reduce_splits(partials, None, None, summed)
    assert torch.equal(summed, partials[0] + partials[1] + partials[2])
    scale = torch.rand((), device=device) + 0.5
    bias = torch.randn(n, dtype=torch.bfloat16, device=device)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    linear_mma.reduce_splits(partials, scale, bias, out)
    torch.testing.assert_close(out, (summed * scale + bias.float()).to(torch.bfloat16))


def test_split_ks_offers_powers_of_two_from_the_least_programs_to_one_past_two_an_sm():
    """Splits of K from the first that brings a launch to ``least`` programs (two an SM, or one
    for the ``wgmma`` form) to the one past two an SM, each split two steps or more; where K is
    too short for the first, the largest that fits."""
    sms = linear_mma.SMS
    assert linear_mma.split_ks(128, 4096, 256) == [4, 8]
    assert linear_mma.split_ks(128, 4096, 256, least=sms) == [2, 4, 8], "o_proj's 128 tiles at 128 tokens"
    assert linear_mma.split_ks(192, 4096, 256, least=sms) == [2, 4], "192 tiles already give every SM one"
    assert linear_mma.split_ks(64, 4096, 256, least=sms) == [4, 8], "16 would leave one step a split"
    assert linear_mma.split_ks(300, 4096, 256, least=sms) == [2]
    assert linear_mma.split_ks(64, 2048, 256) == [4], "8 steps split no further than 4"
    assert linear_mma.split_ks(48, 2048, 256, least=sms) == [4], "the expert-sized gate_up at 64 tokens"
    assert linear_mma.split_ks(24, 768, 256) == [], "3 steps do not split in two steps each"


@pytest.mark.skipif(not ON_GPU, reason="Gluon has no interpreter: CI builds it and checks its decoder")
@pytest.mark.parametrize(
    ("m", "k", "split", "stages", "block_m"),
    [
        (1, 768, 2, 3, 1),
        (3, 4096, 3, 4, 4),
        (6, 2048, 1, 3, 2),
        (8, 768, 1, 4, 8),
        (9, 768, 4, 3, 32),
        (20, 2048, 1, 4, 32),
        (17, 2048, 3, 2, 32),
    ],
)
def test_mma_gluon_ring_and_splits_cover_every_step_once(m, k, split, stages, block_m, device):
    """The ring form at step counts that do not divide: 3 steps in 2 splits (2 + 1), 16 in 3
    (6 + 6 + 4), 3 in 4 (the last split has none and adds zeros), fewer steps than stages; and
    token tiles under the MMA's 8 columns: one token, 3 of 4, three tiles of 2; a two-stage ring
    (``WIDE_TILE_STAGES``) over 8 steps in 3 splits."""
    n = 1000
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    bias = torch.randn(n, dtype=torch.bfloat16, device=device)
    config = {**LINEAR_CONFIGS["mma_gluon"], "BLOCK_M": block_m, "STAGES": stages, "SPLIT_K": split}
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, bias, out, config, False)
    ref = ops.linear_reference(x, q, bias)
    assert not out.isnan().any()
    assert (out.double() - ref.double()).norm() / ref.double().norm() < 1e-2


@pytest.mark.skipif(not ON_GPU, reason="compiles for the device it launches on")
def test_compile_ahead_builds_every_candidate_without_launching_one(device):
    """What the adjudicator does before it times a shape's candidates: each candidate's launch
    recorded, none run, then every kernel compiled on a thread pool, so that the launches that
    follow compile nothing and compute what the reference does."""
    from triton import knobs

    m, n, k = 3, 1000, 768
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    configs = [c for c in linear_mma_gluon.configs(m, n, k) if "SPLIT_K" not in c and "CHUNKS" not in c]
    kernel = linear_mma_gluon.nvfp4_linear_mma_gluon_kernel
    kernel.device_caches[torch.cuda.current_device()][0].clear()  # as in a fresh process
    outs = [torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device) for _ in configs]
    launches = [
        functools.partial(linear_mma_gluon.launch, x, q.packed, q.scales, q.global_scale, None, out, cfg, False)
        for cfg, out in zip(configs, outs, strict=True)
    ]
    assert tuning.compile_ahead(launches) == len(configs) > 1
    torch.cuda.synchronize()
    assert all(out.isnan().all() for out in outs), "a recorded launch runs nothing"
    compiled = []
    knobs.runtime.jit_cache_hook = lambda **kw: compiled.append(kw["key"])
    try:
        for launch in launches:
            launch()
    finally:
        knobs.runtime.jit_cache_hook = None
    assert compiled == [], "every kernel was built ahead"
    ref = ops.linear_reference(x, q).double()
    for out in outs:
        assert (out.double() - ref).norm() / ref.norm() < 1e-2


@pytest.mark.skipif(not ON_GPU, reason="compiles for the device it launches on")
def test_compile_ahead_runs_no_kernel_of_a_launch_it_records_even_one_already_compiled(device):
    """A split launch whose ring kernel is not compiled yet and whose reduce is (another
    config's launch compiled it): recorded, neither kernel runs and the output stays poisoned.
    Until session 57 the compiled reduce ran, on partials no kernel had written; in the expert
    bank a compiled grouped gate_up so read an unwritten grouping and faulted on an H100."""
    m, n, k = 1, 1000, 4096
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    split = {**LINEAR_CONFIGS["mma_gluon"], "BLOCK_M": 1, "SPLIT_K": 2}
    warm, cold = split | {"STAGES": 2}, split | {"STAGES": 3}

    def launch(config, out):
        linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, config, False)

    linear_mma_gluon.nvfp4_linear_mma_gluon_kernel.device_caches[torch.cuda.current_device()][0].clear()
    launch(warm, torch.empty(m, n, dtype=torch.bfloat16, device=device))  # the reduce compiled
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    assert tuning.compile_ahead([functools.partial(launch, cold, out)]) == 1, "the cold ring kernel alone"
    torch.cuda.synchronize()
    assert out.isnan().all(), "the compiled reduce ran on unwritten partials"
    launch(cold, out)
    ref = ops.linear_reference(x, q).double()
    assert (out.double() - ref).norm() / ref.norm() < 1e-2


@pytest.mark.skipif(not ON_GPU, reason="adjudicates on the device")
def test_an_expert_bank_adjudicated_at_one_token_after_sixteen_serves_both(tmp_path):
    """Session 57's fault as a process met it: with no choice cached, the bank adjudicated at 16
    tokens (which compiles its grouped gate_ups), then at one (whose grouping launch at 8 pairs
    is a specialization of its own, not yet compiled). Until ed6f0e9 compiling ahead ran the
    compiled gate_ups on the unwritten grouping and lost the CUDA context (an H100, Qwen3-30B).
    Both choices are made and both match the reference. In a process of its own: a lost context
    would take the rest of the suite with it."""
    import json
    import os
    import subprocess
    import sys

    code = """
import torch
from flashrt.kernels import nvfp4, ops, ring_layout
e, n, k, top_k = 16, 512, 1024, 8
gu = nvfp4.quantize(torch.randn(e, 2 * n, k, dtype=torch.bfloat16, device="cuda")).in_layout(ring_layout.RING)
dn = nvfp4.quantize(torch.randn(e, k, n, dtype=torch.bfloat16, device="cuda")).in_layout(ring_layout.RING)
for t in (16, 1):
    # Memory freed with huge ints in it, for the unwritten buffers to be made of: what faulted
    # was a grouping read as it lay.
    junk = [torch.full((128,), 2**30, dtype=torch.int32, device="cuda") for _ in range(256)]
    del junk
    hidden = torch.randn(t, k, dtype=torch.bfloat16, device="cuda")
    w, ids = torch.topk(torch.randn(t, e, device="cuda").softmax(-1), top_k)
    weights = (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)
    out = ops.moe(hidden, gu, dn, ids, weights)
    ref = ops.moe_reference(hidden, gu, dn, ids, weights).double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, (t, err)
    print("served", t, ops.choose_moe(hidden, (gu.packed, gu.scales, gu.global_scale),
          (dn.packed, dn.scales, dn.global_scale), ids, weights, ring_layout.RING).name)
"""
    env = os.environ | {"FLASHRT_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "served 16 " in done.stdout and "served 1 " in done.stdout, done.stdout
    assert set(json.loads(next(tmp_path.glob("tuning-*.json")).read_text())) == {
        f"moe:torch.bfloat16:T{t}:E16:N512:K1024:top8:ring" for t in (1, 16)
    }


@pytest.mark.skipif(not ON_GPU, reason="Gluon has no interpreter: CI builds it and checks its decoder")
@pytest.mark.parametrize(
    ("m", "k", "chunks", "block_m", "tiles", "warps"),
    [
        (1, 2048, 8, 8, 1, 2),
        (1, 4096, 4, 4, 2, 4),
        (1, 1024, 2, 2, 1, 4),
        (2, 2048, 4, 8, 1, 2),
        (3, 4096, 2, 8, 2, 2),
        (4, 1024, 2, 8, 1, 4),
    ],
)
@pytest.mark.parametrize("stages", linear_mma_gluon.CHUNK_STAGES)
def test_mma_gluon_chunks_sum_every_chunk_of_every_row_once(m, k, chunks, block_m, tiles, warps, stages, device):
    """Rows cut in chunks, each chunk against its slice of the activations in a column of its
    own, through a 2- and a 4-stage ring: one step a chunk (2048 in 8), 8 lanes for 8 chunks,
    6 lanes of 8 used (3 tokens in 2), a tile of rows past N (1000)."""
    n = 1000
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    bias = torch.randn(n, dtype=torch.bfloat16, device=device)
    config = {"BLOCK_M": block_m, "ROW_TILES": tiles, "WARPS": warps, "STAGES": stages, "CHUNKS": chunks}
    for b in (None, bias):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
        linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, b, out, config, False)
        ref = ops.linear_reference(x, q, b)
        assert not out.isnan().any()
        assert (out.double() - ref.double()).norm() / ref.double().norm() < 1e-2


@pytest.mark.skipif(not ON_GPU, reason="Gluon has no interpreter: CI builds it and checks its PTX")
@pytest.mark.parametrize(("m", "k"), [(4, 4096), (5, 14336), (8, 2048), (13, 4096), (16, 14336)])
def test_k_warps_gluon_sums_every_warp_s_chunk_of_every_row_once(m, k, device):
    """Every config the K-warps form offers, with and without bias, in both weight layouts: each
    warp's chunk of K against its chunk of the activations, summed across the warps once. 14336
    in 8 chunks is 7 steps a warp (fewer than a 4-stage ring primes ahead: 3 of 7); 2048 in 8 is
    one; N = 1000 leaves the last program's rows past the end; 4, 5 and 13 tokens leave columns empty."""
    n = 1000
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    ring = q.in_layout(ring_layout.RING)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    bias = torch.randn(n, dtype=torch.bfloat16, device=device)
    configs = linear_k_warps_gluon.configs(m, n, k)
    assert {c["K_WARPS"] for c in configs} == set(linear_k_warps_gluon.K_WARPS)
    for config, b, w in product(configs, (None, bias), (q, ring)):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
        linear_k_warps_gluon.launch(x, w.packed, w.scales, w.global_scale, b, out, config | {"LAYOUT": w.layout}, False)
        ref = ops.linear_reference(x, q, b)
        assert not out.isnan().any(), config
        assert (out.double() - ref.double()).norm() / ref.double().norm() < 1e-2, config


def test_k_warps_gluon_refuses_k_that_its_warps_cannot_split_in_whole_steps():
    """K = 768 is 3 ring steps: two warps cannot take whole steps each. The launch says so by
    name before anything runs, and ``configs`` offers nothing there."""
    q = nvfp4.quantize(torch.randn(64, 768, dtype=torch.bfloat16))
    x = torch.randn(8, 768, dtype=torch.bfloat16)
    out = torch.empty(8, 64, dtype=torch.bfloat16)
    config = {"BLOCK_M": 8, "K_WARPS": 2, "ROW_WARPS": 1, "STAGES": 2}
    with pytest.raises(ValueError, match=r"K=768 with K_WARPS=2: each warp's chunk of K must be whole 256-wide steps"):
        linear_k_warps_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, config, False)
    assert linear_k_warps_gluon.configs(8, 64, 768) == []


@pytest.mark.skipif(
    not ON_GPU or "wgmma_gluon" not in GLUON_FORMS, reason="wgmma is sm_90's: CI builds it for sm_90 only"
)
@pytest.mark.parametrize("async_mma", [0, 1])
@pytest.mark.parametrize(
    ("m", "k", "split", "stages", "block_m", "tiles", "warps"),
    [(130, 4096, 3, 2, 128, 1, 8), (64, 768, 2, 2, 64, 2, 8), (100, 2048, 1, 3, 64, 2, 4), (40, 2048, 4, 2, 128, 2, 4)],
)
def test_wgmma_gluon_tiles_and_splits_cover_every_token_and_step(
    m, k, split, stages, block_m, tiles, warps, async_mma, device
):
    """The warpgroup form: a token tile past the batch (130 in tiles of 128), two warpgroups and
    two row tiles, splits that do not divide the steps (16 in 3, 3 in 2, 8 in 4); its MMAs one
    at a time and with the next chunk decoded while one is in flight."""
    n = 1000
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    bias = torch.randn(n, dtype=torch.bfloat16, device=device)
    config = {"BLOCK_M": block_m, "ROW_TILES": tiles, "WARPS": warps, "STAGES": stages, "SPLIT_K": split}
    config["ASYNC_MMA"] = async_mma
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    assert linear_wgmma_gluon.ring_bytes(config) <= linear_wgmma_gluon.RING_BYTES, "a ring configs() would offer"
    linear_wgmma_gluon.launch(x, q.packed, q.scales, q.global_scale, bias, out, config, False)
    ref = ops.linear_reference(x, q, bias)
    assert not out.isnan().any()
    assert (out.double() - ref.double()).norm() / ref.double().norm() < 1e-2


@pytest.mark.skipif(
    not ON_GPU or "wgmma_gluon" not in GLUON_FORMS, reason="wgmma and TMA as sm_90 has them: built there only"
)
@pytest.mark.parametrize("layout", [ring_layout.CHECKPOINT, ring_layout.RING])
@pytest.mark.parametrize(
    ("m", "k", "split", "stages", "block_m", "warps"),
    [
        (130, 4096, 3, 5, 128, 8),
        (64, 768, 2, 3, 64, 8),
        (100, 2048, 1, 8, 64, 4),
        (17, 2048, 4, 4, 128, 4),
        (300, 2048, 2, 3, 256, 8),
        (257, 1024, 1, 3, 256, 4),
    ],
)
def test_warp_specialized_wgmma_covers_every_token_row_and_half_step(
    m, k, split, stages, block_m, warps, layout, device, monkeypatch
):
    """The warp-specialized form (``linear_wgmma_ws_gluon``): a token tile past the
    batch (130 in tiles of 128, 17 in one, 300 and 257 in tiles of 256), a last row tile past N
    (1000 rows), rings that wrap many times and fewer half-steps than stages (768: 3 steps in 2
    splits), splits that do not divide the steps, both weight layouts; bias, the output poisoned
    first. Chained with PDL (``PDL_CHAIN``: the weights of the first stages copied before the
    wait for the permute), every bit the same."""
    n = 1000
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    packed = ring_layout.pack(q.packed) if layout == ring_layout.RING else q.packed
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    bias = torch.randn(n, dtype=torch.bfloat16, device=device)
    config = {"BLOCK_M": block_m, "WARPS": warps, "STAGES": stages, "SPLIT_K": split, "LAYOUT": layout}
    assert linear_wgmma_ws_gluon.ring_bytes(config) <= linear_wgmma_ws_gluon.RING_BYTES
    outs = {}
    for chained in (False, True):
        monkeypatch.setattr(linear_wgmma_ws_gluon, "PDL_CHAIN", chained)
        out = outs[chained] = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
        linear_wgmma_ws_gluon.launch(x, packed, q.scales, q.global_scale, bias, out, config, False)
    ref = ops.linear_reference(x, q, bias)
    assert not outs[False].isnan().any()
    assert (outs[False].double() - ref.double()).norm() / ref.double().norm() < 1e-2
    assert torch.equal(outs[True], outs[False])


def test_warp_specialized_wgmma_launches_its_tiles_and_refuses_what_it_cannot_run(monkeypatch, device):
    """The warp-specialized form's launcher: the grid of 16-WARPS-row and BLOCK_M-token tiles and
    splits, the register cap that leaves the producer's warpgroup its share, the reduce after a
    split, the permute, kernel and reduce chained with PDL only where ``PDL_CHAIN`` asks and the
    kernel is compiled; its configs fit the ring, 256-token tiles among them past 128 tokens, at
    65-2048 tokens only; fp16, a partial step of K and an oversized ring refused by name."""
    calls = []
    monkeypatch.setattr(linear_wgmma_ws_gluon, "nvfp4_linear_wgmma_ws_gluon_kernel", _Recorder(calls, "ws"))
    monkeypatch.setattr(linear_wgmma_ws_gluon, "descriptors", lambda x, words, scales, config: ("w", "s", "x"))
    permuted = []
    monkeypatch.setattr(linear_wgmma_ws_gluon, "permute_steps", lambda x, layout, pdl: permuted.append(pdl) or x)
    reduced = []
    monkeypatch.setattr(linear_wgmma_ws_gluon, "reduce_splits", lambda *args: reduced.append(args[-1]))
    n, k, m = 1000, 2048, 130
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    config = {"BLOCK_M": 128, "WARPS": 8, "STAGES": 5, "SPLIT_K": 3}
    assert linear_wgmma_ws_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, config, False) is out
    ((_, grid, args, kwargs),) = calls
    assert grid == (8, 2, 3) and args[:3] == ("w", "s", "x") and args[6:] == (m, n, k, n)
    assert args[5].dtype == torch.float32 and args[5].shape == (3, m, n), "split: fp32 partials"
    assert kwargs["maxnreg"] == 168 and kwargs["num_warps"] == 8 and len(reduced) == 1
    from flashrt.kernels.decode import interpreted

    committed = linear_wgmma_ws_gluon.PDL_CHAIN and not interpreted()
    assert kwargs["PDL"] == kwargs["launch_pdl"] == permuted[0] == reduced[0] == committed
    monkeypatch.setattr(linear_wgmma_ws_gluon, "PDL_CHAIN", True)
    monkeypatch.setattr("flashrt.kernels.decode.interpreted", lambda: False)
    linear_wgmma_ws_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, config, False)
    assert calls[1][3]["PDL"] and calls[1][3]["launch_pdl"] and permuted[1] and reduced[1], "chained"
    offered = linear_wgmma_ws_gluon.configs(512, 28672, 4096) + linear_wgmma_ws_gluon.configs(2048, 1024, 768)
    assert {c["BLOCK_M"] for c in offered} == {64, 128, 256}
    for c in offered:
        assert c["STAGES"] >= 3 and linear_wgmma_ws_gluon.ring_bytes(c) <= linear_wgmma_ws_gluon.RING_BYTES, c
    assert 256 not in {c["BLOCK_M"] for c in linear_wgmma_ws_gluon.configs(128, 4096, 4096)}, "no tile past the tokens"
    assert linear_wgmma_ws_gluon.configs(64, 4096, 4096) == linear_wgmma_ws_gluon.configs(2049, 4096, 4096) == []
    assert linear_wgmma_ws_gluon.configs(512, 1000, 1000) == [], "K in whole steps"
    with pytest.raises(ValueError, match="x must be bfloat16"):
        linear_wgmma_ws_gluon.launch(x.half(), q.packed, q.scales, q.global_scale, None, out, config, False)
    with pytest.raises(ValueError, match="ring takes"):
        linear_wgmma_ws_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, {**config, "STAGES": 6}, False)
    odd = nvfp4.quantize(torch.randn(n, 2064, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="K must be whole 256-wide steps"):
        wide = torch.randn(m, 2064, dtype=torch.bfloat16, device=device)
        linear_wgmma_ws_gluon.launch(wide, odd.packed, odd.scales, odd.global_scale, None, out, config, False)


class _Recorder:
    """A Gluon kernel's stand-in where none can run: each launch goes to ``calls`` as
    ``(name, grid, args, kwargs)``."""

    def __init__(self, calls: list, name: str = ""):
        self.calls, self.name = calls, name

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, grid, args, kwargs))


def test_ring_launchers_hand_their_kernels_words_tiles_and_splits(monkeypatch, device):
    """What CI can check of the two ring forms without a GPU: what their launcher hands the
    kernel. The weight as int32 words of the same bytes (strides in words), one program a row
    tile, token tile and split, fp32 partials for the reduce, the activations as they are (the
    ring form) or permuted into the decode's K order (the wgmma form); fp16 refused by name."""
    import triton

    calls = []
    monkeypatch.setattr(linear_mma_gluon, "nvfp4_linear_mma_gluon_kernel", _Recorder(calls))
    monkeypatch.setattr(linear_wgmma_gluon, "nvfp4_linear_wgmma_gluon_kernel", _Recorder(calls))
    monkeypatch.setattr(linear_mma, "splitk_reduce_kernel", _Recorder(calls, "reduce"))
    q = nvfp4.quantize(torch.randn(1000, 2048, dtype=torch.bfloat16, device=device))
    x = torch.randn(130, 2048, dtype=torch.bfloat16, device=device)
    forms = (
        (linear_mma_gluon, {"BLOCK_M": 32, "ROW_TILES": 2, "WARPS": 4, "STAGES": 3, "SPLIT_K": 3}, x),
        (linear_wgmma_gluon, {"BLOCK_M": 128, "ROW_TILES": 1, "WARPS": 8, "STAGES": 2, "SPLIT_K": 3, "ASYNC_MMA": 1},
         permute_steps.permute_steps_reference(x)),
    )  # fmt: skip
    for mod, config, handed in forms:
        out = torch.zeros(130, 1000, dtype=torch.bfloat16, device=device)
        mod.launch(x, q.packed, q.scales, q.global_scale, None, out, config, False)
        (_, grid, args, kwargs), (reduce, _, reduce_args, reduce_kwargs) = calls[-2:]
        assert reduce == "reduce" and reduce_args[0] is args[5] and reduce_args[3] is out
        assert reduce_args[1] is q.global_scale and reduce_kwargs["HAS_SCALE"] is True
        rows = 16 * config["ROW_TILES"] * config["WARPS"]
        assert grid == (triton.cdiv(1000, rows), triton.cdiv(130, config["BLOCK_M"]), 3)
        assert torch.equal(args[0], handed)
        assert args[1].dtype == torch.int32 and torch.equal(args[1].view(torch.uint8), q.packed)
        assert torch.equal(args[2].view(torch.uint8), q.scales.view(torch.uint8))
        assert args[5].shape == (3, 130, 1000) and args[5].dtype == torch.float32
        assert args[6] is out and kwargs["FOLD"] is False, "summed by the reduce (FOLD_SPLITS is off)"
        assert args[8:] == (130, 1000, 2048, 2048, 1000, q.packed.stride(0) // 4, q.scales.stride(0) // 4)
        assert kwargs["SPLIT_K"] == 3 and kwargs["num_warps"] == config["WARPS"]
        assert kwargs.get("ASYNC_MMA") == config.get("ASYNC_MMA")
        with pytest.raises(ValueError, match="bfloat16"):
            mod.launch(x.half(), q.packed, q.scales, q.global_scale, None, out, config, False)


def test_folded_splits_hand_their_kernels_zeroed_counters_and_launch_no_reduce(monkeypatch, device):
    """``FOLD_SPLITS``: a split launch of either ring form gets the device's arrival counters,
    zeroed, made once and shared by every launch, and ``FOLD``, and no reduce follows; an
    unsplit one folds nothing. A launch of more tiles than counters, or one captured in a CUDA
    graph before any counters exist, launches its reduce instead (the same sum)."""
    import triton

    calls = []
    monkeypatch.setattr(linear_mma_gluon, "nvfp4_linear_mma_gluon_kernel", _Recorder(calls, "mma"))
    monkeypatch.setattr(linear_wgmma_gluon, "nvfp4_linear_wgmma_gluon_kernel", _Recorder(calls, "wgmma"))
    monkeypatch.setattr(linear_mma, "splitk_reduce_kernel", _Recorder(calls, "reduce"))
    monkeypatch.setattr(linear_wgmma_gluon, "permute_steps", lambda x, layout, pdl: x)
    monkeypatch.setattr(linear_mma_gluon, "FOLD_SPLITS", True)
    monkeypatch.setattr(linear_mma_gluon, "_ARRIVALS", {})
    q = nvfp4.quantize(torch.randn(1000, 2048, dtype=torch.bfloat16, device=device))
    x = torch.randn(130, 2048, dtype=torch.bfloat16, device=device)
    out = torch.zeros(130, 1000, dtype=torch.bfloat16, device=device)
    ring = {"BLOCK_M": 32, "ROW_TILES": 2, "WARPS": 4, "STAGES": 3}
    wgmma = {"BLOCK_M": 128, "ROW_TILES": 1, "WARPS": 8, "STAGES": 2, "ASYNC_MMA": 1}
    counters = []
    for mod, config in ((linear_mma_gluon, ring), (linear_wgmma_gluon, wgmma)):
        calls.clear()
        mod.launch(x, q.packed, q.scales, q.global_scale, None, out, {**config, "SPLIT_K": 3}, False)
        ((_, grid, args, kwargs),) = calls
        tiles = triton.cdiv(1000, 16 * config["ROW_TILES"] * config["WARPS"]) * triton.cdiv(130, config["BLOCK_M"])
        assert grid[0] * grid[1] == tiles and grid[2] == 3 and kwargs["FOLD"] is True
        assert args[5].shape == (3, 130, 1000) and args[6] is out
        assert args[7].dtype == torch.int32 and args[7].numel() >= tiles and not args[7].any()
        counters.append(args[7])
        calls.clear()
        mod.launch(x, q.packed, q.scales, q.global_scale, None, out, config, False)
        ((_, _, args, kwargs),) = calls
        assert args[5] is out and kwargs["FOLD"] is False, "nothing to fold unsplit"
    assert counters[0] is counters[1], "one set a device"

    monkeypatch.setattr(linear_mma_gluon, "ARRIVAL_SLOTS", 4)
    monkeypatch.setattr(linear_mma_gluon, "_ARRIVALS", {})
    calls.clear()
    linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, {**ring, "SPLIT_K": 3}, False)
    assert [c[0] for c in calls] == ["mma", "reduce"] and calls[0][3]["FOLD"] is False, "20 tiles, 4 counters"
    if device.type == "cuda":
        monkeypatch.setattr(linear_mma_gluon, "_ARRIVALS", {})
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        calls.clear()
        linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, {**ring, "SPLIT_K": 3}, False)
        assert [c[0] for c in calls] == ["mma", "reduce"] and not linear_mma_gluon._ARRIVALS


@pytest.mark.skipif(not ON_GPU, reason="Gluon has no interpreter: CI builds it and checks its decoder")
@pytest.mark.parametrize(
    ("form", "m", "k", "split", "config"),
    [
        ("mma_gluon", 8, 4096, 4, {"BLOCK_M": 8, "ROW_TILES": 1, "WARPS": 2, "STAGES": 3}),
        ("mma_gluon", 1, 4096, 2, {"BLOCK_M": 1, "ROW_TILES": 2, "WARPS": 2, "STAGES": 4}),  # M the constant 1
        ("mma_gluon", 3, 2048, 3, {"BLOCK_M": 4, "ROW_TILES": 2, "WARPS": 4, "STAGES": 4}),
        ("wgmma_gluon", 128, 4096, 4, {"BLOCK_M": 64, "ROW_TILES": 1, "WARPS": 4, "STAGES": 2, "ASYNC_MMA": 1}),
        ("wgmma_gluon", 40, 2048, 3, {"BLOCK_M": 32, "ROW_TILES": 2, "WARPS": 8, "STAGES": 2, "ASYNC_MMA": 1}),
    ],
)
def test_folded_splits_give_the_reduce_s_output_bit_for_bit_and_leave_counters_zero(
    form, m, k, split, config, monkeypatch, device
):
    """The last split of each tile sums the tile's partials in split order, as the reduce does:
    every output bit for bit the reduce's, over many launches back to back (a counter left
    non-zero, or a partial read before its split stored it, would show) on fresh activations,
    eagerly and replayed in a CUDA graph; the counters zero after each."""
    mod = GLUON_FORMS.get(form)
    if mod is None:
        pytest.skip(f"{form} does not run on this GPU")
    q = nvfp4.quantize(torch.randn(1000, k, dtype=torch.bfloat16, device=device))
    bias = torch.randn(1000, dtype=torch.bfloat16, device=device)
    xs = [torch.randn(m, k, dtype=torch.bfloat16, device=device) for _ in range(8)]
    config = {**config, "SPLIT_K": split}

    def launch(x, out):
        if out is None:
            return torch.empty(x.shape[0], 1000, dtype=x.dtype, device=x.device)
        return mod.launch(x, q.packed, q.scales, q.global_scale, bias, out, config, False)

    _switch_keeps_every_bit(monkeypatch, linear_mma_gluon, "FOLD_SPLITS", launch, xs, repeats=3)
    counters = linear_mma_gluon._ARRIVALS[device if device.index is not None else torch.device("cuda", 0)]
    assert not counters.any()


def _switch_keeps_every_bit(monkeypatch, owner, switch: str, launch, xs, repeats: int = 1) -> None:
    """With ``owner.switch`` on, ``launch(x, out)`` on each of ``xs`` back to back (``out`` the
    shape of ``launch(x, None)``'s) gives bit for bit what it gives off: eagerly and replayed in a
    CUDA graph, ``repeats`` times each."""

    def run_all(on: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(owner, switch, on)
        outs = [torch.full_like(launch(x, None), float("nan")) for x in xs]
        for x, out in zip(xs, outs, strict=True):
            launch(x, out)
        return outs

    expected = run_all(False)
    for _ in range(repeats):
        for got, want in zip(run_all(True), expected, strict=True):
            assert torch.equal(got, want)
    outs = [torch.full_like(want, float("nan")) for want in expected]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for x, out in zip(xs, outs, strict=True):
            launch(x, out)
    for _ in range(repeats):
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(outs, expected, strict=True):
            assert torch.equal(got, want)


def test_wgmma_form_chains_its_permute_projection_and_reduce_with_pdl(monkeypatch, device):
    """Compiled, the permute lets the projection start early, the projection (told by its
    ``PDL`` constexpr to wait before its activations) and its reduce are launched with PDL; the
    decode ring form is launched with PDL where ``PDL_LAUNCH`` says so or, by default (None),
    where torch.compile launches its kernels so. Interpreted (no ``griddepcontrol`` there) no link is."""
    from torch._inductor import config as inductor

    monkeypatch.setattr(linear_mma_gluon, "PDL_LAUNCH", False)
    calls, permutes = [], []
    monkeypatch.setattr(linear_mma_gluon, "nvfp4_linear_mma_gluon_kernel", _Recorder(calls, "mma"))
    monkeypatch.setattr(linear_wgmma_gluon, "nvfp4_linear_wgmma_gluon_kernel", _Recorder(calls, "wgmma"))
    monkeypatch.setattr(linear_mma, "splitk_reduce_kernel", _Recorder(calls, "reduce"))

    def permute(x, layout, pdl):
        permutes.append(pdl)
        return permute_steps.permute_steps_reference(x, layout)

    monkeypatch.setattr(linear_wgmma_gluon, "permute_steps", permute)
    q = nvfp4.quantize(torch.randn(1000, 2048, dtype=torch.bfloat16, device=device))
    x = torch.randn(130, 2048, dtype=torch.bfloat16, device=device)
    out = torch.zeros(130, 1000, dtype=torch.bfloat16, device=device)
    wgmma = {"BLOCK_M": 128, "ROW_TILES": 1, "WARPS": 8, "STAGES": 2, "SPLIT_K": 3, "ASYNC_MMA": 1}
    for compiled in (True, False):
        monkeypatch.setenv("TRITON_INTERPRET", "0" if compiled else "1")
        calls.clear()
        linear_wgmma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, wgmma, False)
        linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, {**wgmma, "BLOCK_M": 32}, False)
        (name, _, _, kwargs), (reduce, _, _, reduce_kwargs) = calls[:2]
        assert (name, reduce) == ("wgmma", "reduce")
        chained = compiled and linear_wgmma_gluon.PDL_CHAIN
        assert permutes[-1] is chained and kwargs["PDL"] is chained and kwargs["launch_pdl"] is chained
        assert reduce_kwargs["PDL"] is chained and reduce_kwargs["launch_pdl"] is chained
        (name, _, _, kwargs), (_, _, _, reduce_kwargs) = calls[2:]
        assert name == "mma" and kwargs["PDL"] is False and kwargs["launch_pdl"] is False
        assert reduce_kwargs["PDL"] is False and reduce_kwargs["launch_pdl"] is False
        monkeypatch.setattr(linear_mma_gluon, "PDL_LAUNCH", True)
        calls.clear()
        linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, {**wgmma, "BLOCK_M": 32}, False)
        (_, _, _, kwargs), (_, _, _, reduce_kwargs) = calls
        assert kwargs["PDL"] is compiled and kwargs["launch_pdl"] is compiled, "PDL_LAUNCH: the decode form too"
        assert reduce_kwargs["PDL"] is compiled and reduce_kwargs["launch_pdl"] is compiled
        monkeypatch.setattr(linear_mma_gluon, "PDL_LAUNCH", None)  # the default: as torch.compile launches
        for inductor_pdl in (True, False):
            calls.clear()
            with inductor.patch({"triton.enable_pdl": inductor_pdl}):
                decode_config = {**wgmma, "BLOCK_M": 32}
                linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, decode_config, False)
            assert calls[0][3]["launch_pdl"] is (compiled and inductor_pdl), "PDL_LAUNCH=None follows inductor"
    assert linear_wgmma_gluon.PDL_CHAIN, "the chain is what the H200 serves (see PDL_CHAIN)"


@pytest.mark.skipif(not ON_GPU, reason="PDL and Gluon need a compiled GPU")
@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize(
    "config",
    [
        {"BLOCK_M": 1, "ROW_TILES": 1, "WARPS": 2, "STAGES": 3},
        {"BLOCK_M": 1, "ROW_TILES": 2, "WARPS": 2, "STAGES": 4, "SPLIT_K": 2},
        {"BLOCK_M": 4, "ROW_TILES": 1, "WARPS": 4, "STAGES": 4, "CHUNKS": 4},
    ],
)
def test_decode_form_launched_with_pdl_reads_what_the_kernel_before_wrote(
    config, fold, late_writer, same_bits_eager_and_replayed, monkeypatch, device
):
    """``PDL_LAUNCH``: the ring form starts while the kernel before it runs (that kernel lets it,
    then spends 50 us before writing the activations): its weights may load meanwhile, its
    activations only after that kernel is done (``gdc_wait``); eagerly and in a CUDA graph,
    split (summed by the reduce or folded) or not, rows in chunks. Bit for bit the output of the
    launch on the activations written long before."""
    k = 4096
    q = nvfp4.quantize(torch.randn(1000, k, dtype=torch.bfloat16, device=device))
    source = torch.randn(1, k, dtype=torch.bfloat16, device=device)
    x = torch.empty_like(source)
    out = torch.empty(1, 1000, dtype=torch.bfloat16, device=device)
    monkeypatch.setattr(linear_mma_gluon, "FOLD_SPLITS", fold)
    expected = torch.empty_like(out)
    linear_mma_gluon.launch(source, q.packed, q.scales, q.global_scale, None, expected, config, False)
    monkeypatch.setattr(linear_mma_gluon, "PDL_LAUNCH", True)

    def step():
        x.fill_(float("nan"))
        late_writer[(1,)](source, x, 50_000, k, BLOCK=1 << (k - 1).bit_length())
        linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, config, False)

    same_bits_eager_and_replayed(step, out, expected)


@pytest.mark.skipif(
    not ON_GPU or not linear_mma_ws_gluon.qualifies(torch.cuda.get_device_capability()),
    reason="TMA, mbarriers and warp specialization: Hopper and Blackwell",
)
def test_ring_with_tma_slots_covers_the_ends_chunks_splits_and_pdl():
    """``linear_mma_ws_gluon`` where its boxes reach past the operands (TMA fills zeros there), on
    weights in ``ring_layout`` and, at one token, in the checkpoint's (Blackwell's):
    1000 rows in 64- and 128-row tiles, 1-64 tokens (one widened to two rows, 3 in a tile of 4
    and, in chunks, of 8, 17 in one of 16), rows cut in 2 and 4 chunks, K split in 2 and in 3 (4
    steps: uneven), rings deeper than a tile's steps and rings that wrap, 1-3 programs an SM
    (register caps 168, 128 and 80); and 40000 rows, more tiles than the programs, so each takes
    several and its ring runs on across them (split, and chunked); bias, the output poisoned
    first. At 1-3 tokens also launched with PDL while the kernel before it is still writing the
    activations, eagerly and replayed in a CUDA graph: every bit the same. In a process of its
    own under a timeout: a wait on an mbarrier that never completes hangs its GPU context, and
    the suite must still finish."""
    import os
    import subprocess
    import sys

    code = """
import itertools
import torch
from flashrt.kernels import linear_mma_gluon, linear_mma_ws_gluon as form, nvfp4, ops, ring_layout
from flashrt.kernels.tuning import compile_ahead
from late_writer import late_writer

cases = [
    (1, 1000, 2048, {"BLOCK_M": 2}),
    (1, 1000, 4096, {"BLOCK_M": 4, "CHUNKS": 4}),
    (1, 1000, 4096, {"BLOCK_M": 2, "SPLIT_K": 2}),
    (3, 1000, 4096, {"BLOCK_M": 4, "SPLIT_K": 2}),
    (3, 1000, 1024, {"BLOCK_M": 8, "CHUNKS": 2}),
    (17, 1000, 2048, {"BLOCK_M": 16}),
    (64, 1000, 1024, {"BLOCK_M": 64, "SPLIT_K": 3}),
    (1, 40000, 2048, {"BLOCK_M": 2}),
    (3, 40000, 2048, {"BLOCK_M": 8, "CHUNKS": 2}),
    (3, 40000, 2048, {"BLOCK_M": 4, "SPLIT_K": 2}),
]
shapes = [(4, 4, 2), (4, 6, 3), (8, 3, 1)]
runs = []
for m, n, k, tiling in cases:
    w = nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    operands = (w, ring_layout.pack(w.packed), x, bias, ops.linear_reference(x, w, bias).double())
    layouts = (ring_layout.RING, ring_layout.CHECKPOINT) if m == 1 else (ring_layout.RING,)
    for (warps, stages, programs), layout in itertools.product(shapes, layouts):
        config = {**tiling, "WARPS": warps, "STAGES": stages, "PROGRAMS": programs, "LAYOUT": layout}
        if form.fits(config):
            runs.append((m, n, k, config, operands))


def launch(x, config, operands, out, pdl=False):
    w, ring, _, bias, _ = operands
    packed = ring if config["LAYOUT"] == ring_layout.RING else w.packed
    linear_mma_gluon.PDL_LAUNCH = pdl or None
    try:
        form.launch(x, packed, w.scales, w.global_scale, bias, out, config, False)
    finally:
        linear_mma_gluon.PDL_LAUNCH = None


def scratch(m, n):
    return torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)


compile_ahead(
    [lambda r=r, p=p: launch(r[4][2], r[3], r[4], scratch(r[0], r[1]), p) for r in runs for p in (False, r[0] <= 3)]
)
checked = 0
for m, n, k, config, operands in runs:
    x, ref = operands[2], operands[4]
    out = scratch(m, n)
    launch(x, config, operands, out)
    torch.cuda.synchronize()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, (m, n, k, config, err)
    if m <= 3:
        late, chained = torch.empty_like(x), torch.empty_like(out)

        def step():
            late.fill_(float("nan"))
            late_writer[(1,)](x, late, 50_000, m * k, BLOCK=1 << (m * k - 1).bit_length())
            launch(late, config, operands, chained, pdl=True)

        step()
        assert torch.equal(chained, out), ("PDL, eager", m, n, k, config)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        chained.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(chained, out), ("PDL, replayed", m, n, k, config)
    checked += 1
    print("ok", m, n, k, sorted(config.items()), f"{err:.2e}", flush=True)
print("all", checked)
"""
    tests = os.path.dirname(__file__)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "all 37" in done.stdout, done.stdout


def test_the_ring_with_tma_slots_is_offered_only_when_asked_and_launched_on_the_ring_s_tiles(monkeypatch, device):
    """``linear_mma_ws_gluon``, what CI can check without a GPU. Not offered unless ``OFFERED``
    (no GPU has timed it yet); then on compute capability 9 and up, for weights in either layout
    the ring form reads, up to its 128 tokens: the ring form's token tiles (two token rows at
    least), rows in chunks where the tokens leave MMA columns empty, and splits, in each of
    ``SHAPES`` whose rings fit an SM together. The launcher hands the kernel TMA boxes of one
    ring step of one program (rows and tokens in chunks), the weight's layout (the checkpoint's
    unless the config says otherwise), a program a tile of the ring form's, or as many as
    ``PROGRAMS`` an SM where there are more tiles (each then takes every so-many-th; a probe's
    ``PERSISTENT`` 0 keeps a program a tile), the register cap that leaves them, and, split,
    fp32 partials the reduce then sums; fp16, a tile of partial tokens' chunks, chunks with a
    split, weights TMA cannot read and an oversized ring are refused by name."""
    import triton

    monkeypatch.setattr(decode, "interpreted", lambda: False)  # what a compiled GPU is offered

    def offered(m, capability=(9, 0), layout=ring_layout.RING):
        return [c.params for c in ops.linear_candidates(m, 4096, 4096, capability, layout) if c.form == "mma_ws_gluon"]

    assert not linear_mma_ws_gluon.OFFERED and offered(1) == []
    monkeypatch.setattr(linear_mma_ws_gluon, "OFFERED", True)
    one = offered(1)
    assert one == linear_mma_ws_gluon.tile_configs(1, 4096, 4096) and offered(1, (10, 0)) == one
    assert offered(1, (8, 0)) == [] and offered(1, (10, 0), ring_layout.CHECKPOINT) == one, "Blackwell's layout too"
    assert {(c["WARPS"], c["STAGES"], c["PROGRAMS"]) for c in one} == set(linear_mma_ws_gluon.SHAPES)
    assert {(c.get("CHUNKS", 1), c["BLOCK_M"]) for c in one} == {(1, 2), (2, 2), (4, 4), (8, 8)}
    assert {c["BLOCK_M"] for c in offered(16)} == {16} and not any("CHUNKS" in c for c in offered(16))
    assert offered(129) == [] and linear_mma_ws_gluon.tile_configs(1, 4096, 4000) == []
    assert all(linear_mma_ws_gluon.fits(c) for m in (1, 8, 64, 128) for c in offered(m))
    assert {c["PROGRAMS"] for c in offered(64)} < {1, 2, 3}, "64-token rings: three do not fit an SM"

    calls = []
    monkeypatch.setattr(linear_mma_ws_gluon, "nvfp4_linear_mma_ws_gluon_kernel", _Recorder(calls))
    monkeypatch.setattr(linear_mma, "splitk_reduce_kernel", _Recorder(calls, "reduce"))
    q = nvfp4.quantize(torch.randn(1000, 2048, dtype=torch.bfloat16, device=device))
    x = torch.randn(3, 2048, dtype=torch.bfloat16, device=device)
    out = torch.zeros(3, 1000, dtype=torch.bfloat16, device=device)
    chunked = {"BLOCK_M": 8, "CHUNKS": 2, "WARPS": 4, "STAGES": 4, "PROGRAMS": 2}
    linear_mma_ws_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, chunked, False)
    ((_, grid, args, kwargs),) = calls  # one launch: no reduce
    assert grid == (triton.cdiv(2 * 1000, 64),) and args[5] is out  # a program a tile: fewer than the SMs hold
    words, scales, acts = args[:3]
    assert (words.shape, words.block_shape) == ([1000, 2, 128], [32, 2, 32])
    assert (scales.shape, scales.block_shape) == ([1000, 2, 16], [32, 2, 4])
    assert (acts.shape, acts.block_shape) == ([3, 2, 16, 64], [4, 2, 4, 64])
    assert (kwargs["maxnreg"], kwargs["num_warps"], kwargs["CHUNKS"], kwargs["SPLIT_K"]) == (128, 4, 2, 1)
    assert kwargs["LAYOUT"] == ring_layout.CHECKPOINT
    calls.clear()
    split = {"BLOCK_M": 4, "SPLIT_K": 2, "WARPS": 8, "STAGES": 3, "PROGRAMS": 1, "LAYOUT": ring_layout.RING}
    linear_mma_ws_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, split, False)
    (_, grid, args, kwargs), (name, _, reduce_args, _) = calls
    assert grid == (triton.cdiv(1000, 128) * 2,) and args[5].shape == (2, 3, 1000) and args[5].dtype == torch.float32
    assert name == "reduce" and reduce_args[0] is args[5] and reduce_args[3] is out
    assert args[0].block_shape == [128, 1, 32] and kwargs["maxnreg"] == 168 and kwargs["LAYOUT"] == ring_layout.RING
    calls.clear()
    wide = nvfp4.quantize(torch.randn(3000, 2048, dtype=torch.bfloat16, device=device))
    one = torch.randn(1, 2048, dtype=torch.bfloat16, device=device)
    eighths = {"BLOCK_M": 8, "CHUNKS": 8, "WARPS": 4, "STAGES": 4, "PROGRAMS": 2}
    linear_mma_ws_gluon.launch(one, wide.packed, wide.scales, wide.global_scale, None, out[:1, :0], eighths, False)
    linear_mma_ws_gluon.launch(
        one, wide.packed, wide.scales, wide.global_scale, None, out[:1, :0], eighths | {"PERSISTENT": 0}, False
    )
    ((_, persistent, _, _), (_, tiled, _, _)) = calls
    sms = linear_mma_ws_gluon.multiprocessors(one.device)  # an H200's 132 off a GPU
    assert triton.cdiv(8 * 3000, 64) > 2 * sms and persistent == (2 * sms,), "persistent: two programs an SM"
    assert tiled == (triton.cdiv(8 * 3000, 64),), "PERSISTENT 0: a program a tile"
    with pytest.raises(ValueError, match="x must be bfloat16"):
        linear_mma_ws_gluon.launch(x.half(), q.packed, q.scales, q.global_scale, None, out, chunked, False)
    with pytest.raises(ValueError, match=r"BLOCK_M=4, CHUNKS=8.*whole tokens' chunks"):
        linear_mma_ws_gluon.launch(
            x, q.packed, q.scales, q.global_scale, None, out, chunked | {"BLOCK_M": 4, "CHUNKS": 8}, False
        )
    with pytest.raises(ValueError, match=r"CHUNKS=2 with SPLIT_K=2: .*use one of the two"):
        linear_mma_ws_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, chunked | {"SPLIT_K": 2}, False)
    with pytest.raises(ValueError, match="packed must start on 16 bytes"):
        linear_mma_ws_gluon.launch(x, q.packed[:, 4:], q.scales[:, 8:], q.global_scale, None, out, chunked, False)
    with pytest.raises(ValueError, match="its ring takes"):
        linear_mma_ws_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, chunked | {"STAGES": 32}, False)


@pytest.mark.skipif(
    not ON_GPU or "wgmma_gluon" not in GLUON_FORMS, reason="wgmma is sm_90's: CI builds it for sm_90 only"
)
@pytest.mark.parametrize("split", [1, 4])
def test_wgmma_chain_reads_what_the_launch_before_it_wrote(split, monkeypatch, device):
    """Chained with PDL, the projection starts while its permute runs and the reduce while the
    projection does: back to back on fresh activations each time, eagerly and replayed in a CUDA
    graph, every output bit for bit what the unchained launches give (a read ahead of its wait
    would see the last call's permuted activations or partials, in the blocks the allocator
    hands out again)."""
    q = nvfp4.quantize(torch.randn(4096, 14336, dtype=torch.bfloat16, device=device))
    xs = [torch.randn(128, 14336, dtype=torch.bfloat16, device=device) for _ in range(6)]
    config = {"BLOCK_M": 128, "ROW_TILES": 1, "WARPS": 8, "STAGES": 2, "ASYNC_MMA": 1, "SPLIT_K": split}

    def launch(x, out):
        if out is None:
            return torch.empty(x.shape[0], 4096, dtype=x.dtype, device=x.device)
        return linear_wgmma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, config, False)

    _switch_keeps_every_bit(monkeypatch, linear_wgmma_gluon, "PDL_CHAIN", launch, xs)


def test_mma_gluon_offers_two_stage_rings_from_wide_token_tiles(monkeypatch):
    """Unchunked rings of 3 and 4 stages under a 16-token tile (up to 8 tokens), and of 2 as well
    from one (9 tokens on), with and without split-K."""
    monkeypatch.setattr(decode, "interpreted", lambda: False)

    def depths(m, splits):
        return {
            c["STAGES"]
            for c in linear_mma_gluon.configs(m, 4096, 4096)
            if "CHUNKS" not in c and ("SPLIT_K" in c) == splits
        }

    for m in (1, 8):
        assert depths(m, False) == depths(m, True) == set(linear_mma_gluon.UNCHUNKED_STAGES), m
    for m in (9, 16, 64):
        assert depths(m, False) == set(linear_mma_gluon.WIDE_TILE_STAGES) == {2, 3, 4}, m
    assert depths(16, True) == {2, 3, 4}


def test_mma_gluon_chunks_are_offered_to_few_tokens_and_launched_as_rows_and_lanes(monkeypatch, device):
    """Rows cut in chunks (``CHUNKS``): offered where the tokens times the chunks fill at most the
    MMA's 8 columns and every chunk is whole ring steps; launched as ``CHUNKS x N`` rows and
    ``CHUNKS x M`` lanes in one launch (no partials, no reduce), with a chunk's offset in weight
    words and scale words. The product they make, checked in torch: the chunk-diagonal of the
    chunked rows times the chunked tokens is the plain product."""
    import triton

    monkeypatch.setattr(decode, "interpreted", lambda: False)  # what a compiled GPU is offered

    def offered(m, k):
        return {(c["CHUNKS"], c["BLOCK_M"]) for c in linear_mma_gluon.configs(m, 4096, k) if "CHUNKS" in c}

    assert offered(1, 4096) == {(2, 2), (4, 4), (8, 8)}
    assert offered(2, 4096) == {(2, 4), (4, 8)}
    assert offered(3, 4096) == {(2, 8)} and offered(4, 4096) == {(2, 8)} and offered(5, 4096) == set()
    assert offered(1, 1536) == {(2, 2)} and offered(1, 768) == set()
    chunked = [c for c in linear_mma_gluon.configs(1, 4096, 4096) if "CHUNKS" in c]
    assert {c["STAGES"] for c in chunked} == set(linear_mma_gluon.CHUNK_STAGES), "both ring depths"
    calls = []
    monkeypatch.setattr(linear_mma_gluon, "nvfp4_linear_mma_gluon_kernel", _Recorder(calls))
    monkeypatch.setattr(linear_mma, "splitk_reduce_kernel", _Recorder(calls, "reduce"))
    q = nvfp4.quantize(torch.randn(1000, 2048, dtype=torch.bfloat16, device=device))
    x = torch.randn(2, 2048, dtype=torch.bfloat16, device=device)
    out = torch.zeros(2, 1000, dtype=torch.bfloat16, device=device)
    config = {"BLOCK_M": 8, "ROW_TILES": 1, "WARPS": 2, "STAGES": 4, "CHUNKS": 4}
    linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, config, False)
    ((_, grid, args, kwargs),) = calls  # one launch: no reduce
    assert grid == (triton.cdiv(4 * 1000, 32), 1, 1) and args[5] is out
    assert (kwargs["CHUNKS"], kwargs["chunk_words"], kwargs["chunk_scales"]) == (4, 2048 // 4 // 8, 2048 // 4 // 64)
    w, xs = torch.randn(6, 2048, dtype=torch.float64), torch.randn(2, 2048, dtype=torch.float64)
    lanes = xs.reshape(2 * 4, 512) @ w.reshape(6 * 4, 512).T  # [(token, chunk), (row, chunk)]
    diagonal = lanes.reshape(2, 4, 6, 4).diagonal(dim1=1, dim2=3).sum(-1)
    torch.testing.assert_close(diagonal, xs @ w.T)


@pytest.mark.parametrize("layout", [ring_layout.CHECKPOINT, ring_layout.RING])
def test_wgmma_form_permutes_activations_into_the_order_its_decode_makes_pairs(layout):
    """The launcher permutes the activations; the kernel decodes each thread's words (lane t,
    group g, word h) into pairs (q0, q1), of elements q and q + 4 (2q and 2q + 1 in
    ``ring_layout``), and orders them ``[g, h, q1, q0, t]``, element e innermost
    (``_decoded_chunk``). Built that way in torch, the weight times the permuted activations
    must be the plain product."""
    rows, k = 6, 512
    w = torch.randn(rows, k, dtype=torch.float64)
    if layout == ring_layout.RING:  # t, g, h, q1, q0, e: k = 64t + 8(2g + h) + 4q1 + 2q0 + e
        decoded = w.reshape(rows, k // 256, 4, 4, 2, 2, 2, 2).permute(0, 1, 3, 4, 5, 6, 2, 7)
    else:  # t, g, h, e, q1, q0: k = 64t + 8(2g + h) + 4e + 2q1 + q0
        decoded = w.reshape(rows, k // 256, 4, 4, 2, 2, 2, 2).permute(0, 1, 3, 4, 6, 7, 2, 5)
    decoded = decoded.reshape(rows, k)
    x = torch.randn(5, k, dtype=torch.float64)
    permuted = permute_steps.permute_steps_reference(x, layout)
    torch.testing.assert_close(permuted @ decoded.t(), x @ w.t())
    assert not torch.allclose(x @ decoded.t(), x @ w.t()), "the order matters"


@pytest.mark.parametrize("layout", [ring_layout.CHECKPOINT, ring_layout.RING])
@pytest.mark.parametrize(("m", "k"), [(1, 256), (17, 768), (33, 2048)])
def test_permute_steps_moves_every_element_where_the_reference_does(m, k, layout, device):
    """The launch's permutation, rows past a program's 8 and a row stride past K included, is the
    reference's bit for bit (it moves elements, nothing rounds); the rows of ``x`` beyond K are
    left alone."""
    wide = torch.randn(m, k + 16, dtype=torch.bfloat16, device=device)
    x = wide[:, :k]
    before = wide.clone()
    out = permute_steps.permute_steps(x, layout=layout)
    assert torch.equal(out, permute_steps.permute_steps_reference(x.contiguous(), layout))
    assert torch.equal(wide, before)


@pytest.mark.parametrize(("form", "tokens"), [("wgmma_gluon", 128), ("wgmma_ws_gluon", 128)])
def test_wgmma_forms_are_offered_only_on_hopper(monkeypatch, form, tokens):
    monkeypatch.setattr("flashrt.kernels.decode.interpreted", lambda: False)
    offered = {
        major: {c.form for c in ops.linear_candidates(tokens, 4096, 4096, (major, 0))} for major in (8, 9, 10, 12)
    }
    assert form in offered[9] and not any(form in offered[major] for major in (8, 10, 12))
    assert not any(c.form == form for c in ops.linear_candidates(8, 4096, 4096, (9, 0))), "not for decode"


@pytest.mark.parametrize("layout", [ring_layout.CHECKPOINT, ring_layout.RING])
@pytest.mark.parametrize("k", [768, 4000])
def test_the_dequant_form_decodes_the_same_numbers_as_the_reference(k, layout, device):
    """The weight it hands cuBLAS is ``nvfp4.dequantize``'s, bit for bit on a GPU (K not a multiple
    of the tile included), so the form differs from the reference only by the GEMM's rounding;
    from ``ring_layout`` too (undone in registers). Triton's interpreter rounds float32 to bf16
    toward zero, so on the CPU it is within one unit."""
    q = nvfp4.quantize(torch.randn(300, k, dtype=torch.bfloat16, device=device))
    expected = nvfp4.dequantize(q, torch.bfloat16).cpu()
    packed = q.in_layout(layout).packed
    for config in linear_dequant.configs(linear_dequant.MIN_ROWS, 300, k):
        config = config | {"LAYOUT": layout}
        got = linear_dequant.dequantize_triton(packed, q.scales, q.global_scale, torch.bfloat16, config, False).cpu()
        if ON_GPU:
            assert torch.equal(got, expected)
        else:
            torch.testing.assert_close(got, expected, rtol=2**-7, atol=0)
    assert not linear_dequant.configs(linear_dequant.MIN_ROWS - 1, 300, k), "not offered to decode-sized batches"
    spike = linear_dequant.configs(4096, 65536, 4096)
    assert spike and all("SLAB_ROWS" in c for c in spike), "a layer whose whole copy is a memory spike: slabs only"
    fits = linear_dequant.configs(512, 28672, 4096)
    assert fits and not any("SLAB_ROWS" in c for c in fits), "slabs lost to the whole copy wherever it fits"
    assert linear_dequant.NARROW_TILE in linear_dequant.configs(512, 1536, 2048), "an expert-sized weight"
    assert linear_dequant.NARROW_TILE not in fits, "a weight that already makes programs for every SM"


@pytest.mark.parametrize("bias", [False, True])
def test_the_dequant_form_in_slabs_writes_each_slab_into_its_own_columns(bias, device):
    """Slabs of 64 rows through one buffer, the last one ragged (200 = 3 x 64 + 8): every column
    written once, by its own rows, with its own bias."""
    n, k, m = (200, 768, 64) if not ON_GPU else (4100, 2048, 512)
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, dtype=torch.bfloat16, device=device) if bias else None
    config = {**LINEAR_CONFIGS["dequant"], "SLAB_ROWS": 64 if not ON_GPU else 2048}
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    linear_dequant.launch(x, q.packed, q.scales, q.global_scale, b, out, config, _prmt(device))
    assert not out.isnan().any(), "every output column must be written"
    ref = ops.linear_reference(x, q, b)
    assert (out.double() - ref.double()).norm() / ref.double().norm() < 1e-2
    per_column = (out.double() - ref.double()).norm(dim=0) / ref.double().norm(dim=0)
    assert per_column.max() < 2e-2, "a slab landed in another slab's columns"


def test_the_ring_form_reads_activations_only_from_16_byte_rows():
    """cp.async moves 16-byte chunks and Triton builds the ring only for pointers it can prove
    aligned: a misaligned view of the activations is copied (same values), an aligned one is not."""
    base = torch.randn(3, 4096 + 8, dtype=torch.bfloat16)
    aligned = base[:, :4096]
    assert linear_mma_gluon.aligned_activations(aligned) is aligned
    for view in (base[:, 1:4097], base.flatten()[4:].unflatten(0, (1, -1))[:, :4096], base[:, :4096].t().t()):
        got = linear_mma_gluon.aligned_activations(view)
        misaligned = view.data_ptr() % 16 or (view.stride(0) * 2) % 16
        assert (got is not view) == bool(misaligned)
        assert torch.equal(got, view) and got.data_ptr() % 16 == 0 and (got.stride(0) * 2) % 16 == 0


def test_gluon_gemv_bit_placement_decodes_every_e2m1_code():
    """The shifts and masks the Gluon GEMV's PTX is generated from, run in plain torch: every
    code in every nibble position must come out as ``e2m1 * 2**-14`` in fp16, in element order."""
    words = torch.randint(-(2**31), 2**31, (4096,), dtype=torch.int64).to(torch.int32)
    nibbles = torch.stack([(words.to(torch.int64) >> (4 * j)) & 15 for j in range(8)], dim=-1).to(torch.uint8)
    expected = nvfp4.e2m1_values(nibbles).to(torch.float32) * 2.0**-14
    got = linear_gemv_gluon.fp16_bits(words).to(torch.float32)
    assert set(nibbles.unique().tolist()) == set(range(16))
    assert torch.equal(got, expected)


def test_gluon_mma_bit_placement_decodes_every_e2m1_code():
    """The tensor-core form's bf16 bit placement, likewise: ``e2m1 * 2**-126``, subnormal 0.5 included."""
    words = torch.randint(-(2**31), 2**31, (4096,), dtype=torch.int64).to(torch.int32)
    nibbles = torch.stack([(words.to(torch.int64) >> (4 * j)) & 15 for j in range(8)], dim=-1).to(torch.uint8)
    expected = nvfp4.e2m1_values(nibbles).to(torch.float64) * 2.0**-126
    assert torch.equal(linear_mma_gluon.bf16_bits(words).to(torch.float64), expected)
    assert torch.finfo(torch.bfloat16).max > linear_mma_gluon.SCALE_FACTOR * 448
    assert linear_mma_gluon.SCALE_FACTOR * linear_mma_gluon.EPILOGUE_FACTOR == 2.0**126


def _run_ptx(ptx: str, args: dict) -> dict:
    """The few PTX instructions the bit-placement decoders are made of, on uint32 Python ints:
    ``args`` the inputs (``$4``..., 16-bit ones as ints), the outputs (``$0``...) returned."""
    import re

    def bf16(bits: int) -> float:
        return torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float().item()

    def bits16(value: float) -> int:
        return torch.tensor([value]).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF

    regs = dict(args)

    def get(name: str) -> int:
        name = name.strip()
        return int(name, 16) if name.startswith("0x") else int(name) if name.isdigit() else regs[name]

    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):  # split a register into its halves
            halves, src = rest.rsplit(",", 1)
            lo, hi = (h.strip(" {}") for h in halves.split(","))
            regs[lo], regs[hi] = get(src) & 0xFFFF, get(src) >> 16
            continue
        dst, *ops_ = [o.strip() for o in re.split(r",(?![^{]*})", rest)]
        if op == "mov.b32" and ops_[0].startswith("{"):  # pack two halves
            lo, hi = (h.strip(" {}") for h in ops_[0].split(","))
            regs[dst] = get(lo) | get(hi) << 16
        elif op == "mov.b32":
            regs[dst] = get(ops_[0])
        elif op == "and.b32":
            regs[dst] = get(ops_[0]) & get(ops_[1])
        elif op == "or.b32":
            regs[dst] = get(ops_[0]) | get(ops_[1])
        elif op == "shl.b32":
            regs[dst] = (get(ops_[0]) << get(ops_[1])) & 0xFFFFFFFF
        elif op == "shr.b32":
            regs[dst] = get(ops_[0]) >> get(ops_[1])
        elif op == "shf.r.wrap.b32":
            w, n = get(ops_[0]), get(ops_[2]) % 32
            assert ops_[0] == ops_[1], "a rotation shifts a word through itself"
            regs[dst] = ((w >> n) | (w << (32 - n))) & 0xFFFFFFFF
        elif op == "mul.rn.bf16x2":
            a, b = get(ops_[0]), get(ops_[1])
            lo, hi = bits16(bf16(a & 0xFFFF) * bf16(b & 0xFFFF)), bits16(bf16(a >> 16) * bf16(b >> 16))
            regs[dst] = lo | hi << 16
        else:
            raise AssertionError(f"an instruction this emulator does not know: {line}")
    return regs


def test_ring_layout_moves_every_bit_of_a_word_and_back():
    """``pack`` is a permutation of each word's 32 bits (each single bit lands on a single bit, no
    two on the same), and ``unpack`` undoes it bit for bit on any bytes, of a bank too."""
    one_hot = torch.tensor([1 << i for i in range(32)], dtype=torch.int64).to(torch.int32).view(torch.uint8)
    moved = ring_layout.pack(one_hot.reshape(32, 4)).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert sorted(int(w).bit_length() - 1 for w in moved) == list(range(32))
    assert all(int(w) & (int(w) - 1) == 0 for w in moved)
    raw = torch.randint(0, 256, (3, 5, 64), dtype=torch.uint8)
    assert torch.equal(ring_layout.unpack(ring_layout.pack(raw)), raw)
    with pytest.raises(ValueError, match="whole 4-byte words"):
        ring_layout.pack(raw[..., :6])


def test_ring_layout_takes_the_fewest_integer_pipe_instructions_a_word():
    """``ring_layout``'s shifts are one of the layouts ``bench/probe_pipes.layouts`` finds with the
    fewest integer-pipe instructions a word (7: the rotations it had took 11), and its PTX shifts
    right once a word, where ptxas cannot use ``IMAD.SHL``."""
    from flashrt.bench.probe_pipes import layouts

    found = layouts(top=10_000)
    fewest = found[0][0]
    ours = sorted(zip(ring_layout.MAGNITUDE_SHIFT, ring_layout.SIGN_SHIFT, strict=True))
    assert fewest == 7
    assert [sorted(shifts) for integer, _, shifts in found if integer == fewest].count(ours) == 1
    ptx = ring_layout.decode_ptx()
    assert ptx.count("shr.b32") == 1 and ptx.count("shl.b32") == 4 and "shf." not in ptx


def test_ring_decode_ptx_gives_every_code_of_a_word_in_element_order():
    """The PTX the ring forms run on ``ring_layout``'s words, emulated instruction by instruction:
    pair q is elements 2q and 2q + 1, each ``e2m1 * 2**-126`` times the scale (1 here), subnormal
    0.5 included; ``bf16_bits`` (the CPU's copy of the placement) agrees."""
    words = torch.randint(-(2**31), 2**31, (512,), dtype=torch.int64).to(torch.int32)
    nibbles = torch.stack([(words.to(torch.int64) >> (4 * j)) & 15 for j in range(8)], dim=-1).to(torch.uint8)
    assert set(nibbles.unique().tolist()) == set(range(16))
    expected = nvfp4.e2m1_values(nibbles).to(torch.float64) * 2.0**-126
    ring_words = ring_layout.pack(words.view(torch.uint8)).view(torch.int32)
    assert torch.equal(ring_layout.bf16_bits(ring_words).to(torch.float64), expected)
    one = 0x3F80  # bf16 1.0
    for word, want in zip(ring_words.tolist()[:64], expected[:64], strict=True):
        regs = _run_ptx(ring_layout.decode_ptx(), {"$4": word & 0xFFFFFFFF, "$5": one})
        halves = [regs[f"${q}"] >> (16 * h) & 0xFFFF for q in range(4) for h in range(2)]
        got = torch.tensor(halves, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).to(torch.float64)
        assert torch.equal(got, want)


def test_scale_ptx_gives_every_e4m3_scale_times_2_to_the_119():
    """The ring forms' scale conversion, emulated: each of a word's four E4M3 bytes becomes the bf16
    ``scale * 2**119`` exactly, the subnormal scales and 0 included, as the fp32 path it
    replaced gave."""
    values = torch.arange(0, 0x7F, dtype=torch.int64)  # every non-negative E4M3 byte but NaN
    expected = values.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float64) * 2.0**119
    got = []
    for i in range(0, len(values), 4):
        quad = [*values[i : i + 4].tolist(), 0, 0, 0][:4]
        word = quad[0] | quad[1] << 8 | quad[2] << 16 | quad[3] << 24
        regs = _run_ptx(linear_mma_gluon._scales_ptx(), {"$4": word})
        got += [regs[f"${g}"] for g in range(4)][: len(values) - i]
    got = torch.tensor(got, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).to(torch.float64)
    assert torch.equal(got, expected)


def test_a_weight_in_the_ring_layout_computes_what_the_checkpoints_does():
    """On the CPU the ops run the reference, which reads either layout: the same bits out of
    ``linear``, ``moe``, ``dequantize`` and the checkpoint exports; and what cannot be served is
    refused by name."""
    q = nvfp4.quantize(torch.randn(96, 512, dtype=torch.bfloat16))
    ring = q.in_layout(ring_layout.RING)
    assert ring.layout == ring_layout.RING and ring.in_layout(ring_layout.RING) is ring
    x = torch.randn(3, 512, dtype=torch.bfloat16)
    assert torch.equal(ops.linear(x, ring), ops.linear(x, q))
    assert torch.equal(nvfp4.dequantize(ring), nvfp4.dequantize(q))
    assert torch.equal(nvfp4.to_modelopt(ring)["weight"], q.packed)
    assert torch.equal(nvfp4.to_compressed_tensors(ring)["weight_packed"], q.packed)
    assert torch.equal(ring.expert(0).packed, ring.packed[0]) if ring.packed.dim() == 3 else True
    gu, dn = _bank(4, 256, 512, torch.device("cpu"))
    ids, weights = _route(3, 4, 2, torch.device("cpu"))
    hidden = torch.randn(3, 512, dtype=torch.bfloat16)
    gu_ring, dn_ring = gu.in_layout(ring_layout.RING), dn.in_layout(ring_layout.RING)
    assert gu_ring.expert(1).layout == ring_layout.RING
    assert torch.equal(ops.moe(hidden, gu_ring, dn_ring, ids, weights), ops.moe(hidden, gu, dn, ids, weights))
    with pytest.raises(ValueError, match=r"down\.layout"):
        ops.moe(hidden, gu_ring, dn, ids, weights)
    with pytest.raises(ValueError, match=r"w\.layout"):
        ops.linear(x, NVFP4Weight(q.packed, q.scales, q.global_scale, 7))


def test_only_forms_that_read_the_ring_layout_are_offered_for_it(monkeypatch):
    """A weight in ``ring_layout`` is timed and served only by the forms that read it (the ring
    forms, K-warps among them, the ``wgmma`` forms, the dequant), at every row count; on the
    checkpoint's every form as before."""
    monkeypatch.setattr("flashrt.kernels.decode.interpreted", lambda: False)
    for m in (1, 3, 4, 8, 16, 17, 64, 128, 256, 2048):
        ring = {c.form for c in ops.linear_candidates(m, 4096, 4096, (9, 0), ring_layout.RING)}
        checkpoint = {c.form for c in ops.linear_candidates(m, 4096, 4096, (9, 0))}
        assert ring and ring <= {"mma_gluon", "k_warps_gluon", "wgmma_gluon", "wgmma_ws_gluon", "dequant"}, (m, ring)
        assert ("k_warps_gluon" in ring) == (4 <= m <= 16), (m, ring)
        assert ring < checkpoint or m > 128, (m, ring, checkpoint)
    for t in (1, 8, 16):
        ring = ops.moe_candidates(t, 768, 2048, (9, 0), ring_layout.RING)
        assert ring and {c.form for c in ring} == {"ring_gluon"} and all("DOWN_WARPS" in c.params for c in ring)
    candidate = ops.linear_candidates(1, 4096, 4096, (9, 0), ring_layout.RING)[0]
    assert ops.launch_params(candidate, ring_layout.RING)["LAYOUT"] == ring_layout.RING
    assert "LAYOUT" not in ops.launch_params(candidate, ring_layout.CHECKPOINT)


def test_seats_take_the_ring_layout_where_every_row_count_can_read_it(monkeypatch):
    """``for_serving``/``bank_for_serving``: Hopper's layout where it pays (K in whole ring steps;
    a bank whose seat sends it at most the ring form's rows and whose down takes the ring's
    steps), the checkpoint's elsewhere: on a CPU, past the band, for a ragged inter size."""
    q = nvfp4.quantize(torch.randn(64, 512, dtype=torch.bfloat16))
    odd = nvfp4.quantize(torch.randn(64, 272, dtype=torch.bfloat16))
    gu, dn = _bank(4, 256, 512, torch.device("cpu"))
    ragged = _bank(4, 48, 512, torch.device("cpu"))
    assert ops.for_serving(q) is q and ops.bank_for_serving(gu, dn, 16) == (gu, dn), "the CPU keeps the checkpoint's"
    assert ops.moe_band(torch.device("cpu")) == ops.FUSED_MOE_BAND, "no ring: the band moe_fused paid to"
    monkeypatch.setattr(ops, "_ring_layout_serves", lambda device: True)
    assert ops.moe_band(torch.device("cpu")) == moe_ring_gluon.MAX_TOKENS, "the ring: the band is its reach"
    assert ops.for_serving(q).layout == ring_layout.RING and ops.for_serving(odd) is odd
    assert all(w.layout == ring_layout.RING for w in ops.bank_for_serving(gu, dn, moe_ring_gluon.MAX_TOKENS))
    assert ops.bank_for_serving(gu, dn, moe_ring_gluon.MAX_TOKENS + 1) == (gu, dn)
    assert ops.bank_for_serving(*ragged, 16) == ragged


def test_w4a4_reference_costs_little_against_bf16_and_w4a16():
    """The accuracy cost of also quantizing the activations (per token, NVFP4), on Gaussian data."""
    w = torch.randn(512, 2048, dtype=torch.bfloat16)
    x = torch.randn(7, 2048, dtype=torch.bfloat16)
    q = nvfp4.quantize_reference(w)
    w4a4 = linear_w4a4.w4a4_reference(x, q).float().flatten()
    w4a16 = ops.linear_reference(x, q).float().flatten()
    bf16 = F.linear(x.float(), w.float()).flatten()
    assert F.cosine_similarity(w4a4, w4a16, dim=0) >= 0.99
    assert F.cosine_similarity(w4a4, bf16, dim=0) >= 0.98


def test_w4a4_form_is_offered_only_on_fp4_tensor_cores(monkeypatch):
    monkeypatch.setattr("flashrt.kernels.decode.interpreted", lambda: False)
    forms = {major: {c.form for c in ops.linear_candidates(16, 4096, 4096, (major, 0))} for major in (9, 10, 11, 12)}
    assert "w4a4" not in forms[9] and all("w4a4" in forms[major] for major in (10, 11, 12))
    w4a4 = next(c for c in ops.linear_candidates(16, 4096, 4096, (10, 0)) if c.form == "w4a4")
    assert w4a4.precision < min(c.precision for c in ops.linear_candidates(16, 4096, 4096, (9, 0)))


def _w4a4_runs_here(device) -> bool:
    return device.type == "cpu" or linear_w4a4.qualifies(torch.cuda.get_device_capability(device))


# Triton 3.6 on sm_90 stops in TritonGPUAccelerateMatmul on an e2m1 x e2m1 dot_scaled (H200,
# bench/results/h200-gpu-tests.log at 735851c); the forms are not offered below compute 10.
W4A4_HERE = pytest.mark.skipif(
    ON_GPU and not _w4a4_runs_here(torch.device("cuda")), reason="W4A4 forms are offered on compute 10 and up only"
)


@W4A4_HERE
@pytest.mark.parametrize("m", [1, 16, 130])
def test_w4a4_kernel_matches_its_reference(m, device):
    """On a GPU with FP4 tensor cores through ``dot_scaled``; interpreted, on the decoded tiles
    (``decode.dot_nvfp4``). K = 2000: the masked tail of a BLOCK_K step."""
    q = nvfp4.quantize(torch.randn(300, 2000, dtype=torch.bfloat16, device=device))
    x = torch.randn(m, 2000, dtype=torch.bfloat16, device=device)
    out = torch.full((m, 300), float("nan"), dtype=torch.bfloat16, device=device)
    linear_w4a4.launch(x, q.packed, q.scales, q.global_scale, None, out, linear_w4a4.configs(m, 300, 2000)[0], False)
    ref = linear_w4a4.w4a4_reference(x, q)
    assert not out.isnan().any()
    assert ((out.double() - ref.double()).norm() / ref.double().norm()) < 1e-2


@pytest.mark.parametrize("m", [1, 5, 64])
def test_linear_op_dispatches_and_keeps_leading_dims(m, device):
    q = nvfp4.quantize(torch.randn(96, 256, dtype=torch.bfloat16, device=device))
    x = torch.randn(2, m, 256, dtype=torch.bfloat16, device=device)
    out = ops.linear(x, q)
    assert out.shape == (2, m, 96)
    ref = ops.linear_reference(x.reshape(-1, 256), q).reshape(2, m, 96)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


# -- expert bank -----------------------------------------------------------------------------------


def _bank(e, n, k, device):
    return (
        nvfp4.quantize(torch.randn(e, 2 * n, k, dtype=torch.bfloat16, device=device)),
        nvfp4.quantize(torch.randn(e, k, n, dtype=torch.bfloat16, device=device)),
    )


def _tuples(*banks):
    """Banks as the launchers take them: (packed, scales, global_scale) each."""
    return tuple((b.packed, b.scales, b.global_scale) for b in banks)


def _cpu_expert_case(monkeypatch, e, n, k, top_k, t):
    """An expert bank, hidden states and a routing on the CPU, for the launcher tests. The
    grouping is a plain Triton kernel, and compiled it takes CUDA tensors only: on a GPU it runs
    there and its layout comes back to the CPU."""
    if ON_GPU:
        group = moe_fused.group_pairs

        def group_on_gpu(ids, experts, block_m):
            g = group(ids.cuda(), experts, block_m)
            return g._replace(**{field: getattr(g, field).cpu() for field in g._fields[:4]})

        monkeypatch.setattr(moe_fused, "group_pairs", group_on_gpu)
    gu, dn = _bank(e, n, k, "cpu")
    return gu, dn, torch.randn(t, k, dtype=torch.bfloat16), *_route(t, e, top_k, "cpu")


def _route(t, e, top_k, device):
    w, ids = torch.topk(torch.randn(t, e, device=device).softmax(-1), top_k)
    return ids, (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)


@pytest.mark.parametrize("t", [1, 3, 7, 16, 33])
@pytest.mark.parametrize("weight_format", ["nvfp4", "bf16"])
def test_moe_kernel_matches_reference(t, weight_format, device):
    e, n, k, top_k = 8, 48, 768, 2  # N = 48: not a multiple of the 32/64 blocks
    gu, dn = _bank(e, n, k, device)
    hidden = torch.randn(t, k, dtype=torch.bfloat16, device=device)
    ids, weights = _route(t, e, top_k, device)
    # The interpreter pays per program: down tiles of 512 rows there (two a token, the second
    # ragged); with 16-row tiles the down launch took 89 of this test's 105 s at 33 tokens.
    interpreted = {"DOWN_BLOCK_K": 64, "DOWN_BLOCK_N": 512}
    config = moe_fused.configs(t, n, k)[0] | ({"DOWN_BLOCK_K": 256} if ON_GPU else interpreted)
    out = torch.full_like(hidden, float("nan"))
    if weight_format == "nvfp4":
        moe_fused.launch(
            hidden,
            (gu.packed, gu.scales, gu.global_scale),
            (dn.packed, dn.scales, dn.global_scale),
            ids,
            weights,
            out,
            config,
            _prmt(device),
        )
        ref = ops.moe_reference(hidden, gu, dn, ids, weights)
    else:
        w13, w2 = nvfp4.dequantize(gu), nvfp4.dequantize(dn)
        moe_fused.launch(hidden, (w13, None, None), (w2, None, None), ids, weights, out, config, False)
        ref = ops.moe_reference(hidden, gu, dn, ids, weights)
    assert not out.isnan().any()
    rel = (out.double() - ref.double()).norm() / ref.double().norm()
    assert rel < 1e-2


# The decode-size expert forms (empty under the interpreter: Gluon needs a compiled GPU).
DECODE_EXPERT_CASES = [(moe_gemv_gluon, c) for c in moe_gemv_gluon.configs(1, 768, 2048)[::2]]
# The ring form: every 3rd of its walk-down configs at one token (2 gate_up ways x 5 downs, each
# with 4 warp and stage settings: each way, each setting), of its GEMV-down ones (an inter size
# of 48, 2 x 2 ways: each of those), the grouped downs offered at 16 tokens (all 12), and the
# grouped down after a per-pair gate_up at 32 rows, which the launcher takes and no config offers.
_RING_WALK = [c for c in moe_ring_gluon.configs(1, 768, 2048) if "DOWN_SLOTS" not in c]  # slots: their own test
DECODE_EXPERT_CASES += [(moe_ring_gluon, c) for c in _RING_WALK[::3] + moe_ring_gluon.configs(1, 48, 768)[::3]]
_RING_GROUPED_DOWN = [c for c in moe_ring_gluon.configs(16, 768, 2048) if "DOWN_GROUPED" in c]
_RING_GROUPED_DOWN.append({"GROUPED": 0, "WARPS": 2, "STAGES": 3, "DOWN_WARPS": 2, "DOWN_GROUPED": 1})
DECODE_EXPERT_CASES += [(moe_ring_gluon, c) for c in _RING_GROUPED_DOWN]


@pytest.mark.skipif(not ON_GPU, reason="Gluon has no interpreter; CI builds these kernels for every target")
@pytest.mark.parametrize("t", [1, 3, 16, 32, 64])
@pytest.mark.parametrize(("form", "config"), DECODE_EXPERT_CASES)
def test_decode_expert_forms_match_reference(t, form, config, device):
    """N = 48: ragged against every GEMV step of K (32 groups and up) and against the ring's 16-
    to 64-row gate tiles (its rows past N read row N - 1); K = 768, three ring steps; grouped, at
    16 tokens 64 pairs over 16 experts, so runs span tiles and tiles hold padding, at 32 128, 8
    an expert on average, so runs fill tiles and spill, and at 64 (the ring's ``MAX_TOKENS``) 256. The ring
    down walks whole ring steps of N: 512 there, two steps an expert, so its splits of the
    8-step walk at one token (4 and 8) cut through experts. Expert 0's down global scale is 0,
    as a checkpoint's pruned expert may have it: it must add nothing, not a NaN."""
    e, k, top_k = 16, 768, 4
    n = 512 if "DOWN_WARPS" in config else 48
    gu, dn = _bank(e, n, k, device)
    dn.global_scale[0] = 0.0  # a checkpoint's pruned expert: it adds nothing, and no NaN
    hidden = torch.randn(t, k, dtype=torch.bfloat16, device=device)
    ids, weights = _route(t, e, top_k, device)
    out = torch.full_like(hidden, float("nan"))
    gate_up = (gu.packed, gu.scales, gu.global_scale)
    form.launch(hidden, gate_up, (dn.packed, dn.scales, dn.global_scale), ids, weights, out, config, False)
    ref = ops.moe_reference(hidden, gu, dn, ids, weights)
    assert not out.isnan().any()
    assert (out.double() - ref.double()).norm() / ref.double().norm() < 1e-2


def test_expert_launchers_hand_their_kernels_the_pairs_words_and_one_h(monkeypatch):
    """What CI can check of the decode-size expert forms without a GPU: each gate_up launch
    writes one ``h [pairs, N]`` that the same down launch reads, one program a row block and a
    pair or a grouped tile (gate_up) or a row block and a token (down), weights as the bank's
    bytes viewed as int32 words (the ring's scales too: it copies them as words), strides by
    expert and row; grouped, each expert's run holds exactly the pairs routed to it."""
    calls = []

    monkeypatch.setattr(moe_gemv_gluon, "moe_gate_up_gemv_kernel", _Recorder(calls, "gate_up"))
    monkeypatch.setattr(moe_ring_gluon, "moe_gate_up_ring_kernel", _Recorder(calls, "gate_up"))
    monkeypatch.setattr(moe_gemv_gluon, "moe_down_gemv_kernel", _Recorder(calls, "down"))
    e, n, k, top_k, t = 6, 80, 512, 2, 3
    gu, dn, hidden, ids, weights = _cpu_expert_case(monkeypatch, e, n, k, top_k, t)
    banks = _tuples(gu, dn)
    ring = {"WARPS": 2, "STAGES": 3, "DOWN_ROWS": 2, "DOWN_WARPS_K": 2}
    tiles = moe_fused.max_rows(t * top_k, e, moe_ring_gluon.GROUP_TILE) // moe_ring_gluon.GROUP_TILE
    forms = (  # the form, its config, gate rows and down rows a program, programs along the pairs, where h is
        (moe_gemv_gluon, {"ROWS": 4, "GROUPS": 1, "WARPS_N": 4, "WARPS_K": 1}, 16, 16, t * top_k, 5),
        (moe_ring_gluon, ring | {"GROUPED": 0}, 32, 4, t * top_k, 10),
        (moe_ring_gluon, ring | {"GROUPED": 1}, 32, 4, tiles, 10),
    )
    for mod, config, gate_rows, down_rows, programs, at in forms:
        calls.clear()
        out = torch.zeros_like(hidden)
        assert mod.launch(hidden, *banks, ids, weights, out, config, False) is out
        (first, up_grid, up_args, _), (second, down_grid, down_args, down_kwargs) = calls
        assert (first, second) == ("gate_up", "down")
        assert up_grid == (-(-n // gate_rows), programs) and down_grid == (-(-k // down_rows), t)
        h, words, scales = up_args[at], up_args[1], up_args[2]
        assert h.shape == (t * top_k, n) and down_args[0] is h, "down reads the h gate_up wrote"
        assert words.dtype == torch.int32 and torch.equal(words.view(torch.uint8), gu.packed)
        assert torch.equal(scales.view(torch.uint8), gu.scales.view(torch.uint8))
        strides = up_args[-6:-2] if mod is moe_ring_gluon else up_args[-4:]
        assert strides == (*words.stride()[:2], *scales.stride()[:2])
        assert torch.equal(up_args[4], ids.reshape(-1)) and torch.equal(down_args[4], ids.reshape(-1))
        assert up_args[at + 1 : at + 3] == (n, k) and up_args[at + 3 + (mod is moe_ring_gluon)] == top_k
        assert torch.equal(down_args[1].view(torch.uint8), dn.packed) and down_args[6] is out
        assert down_args[7:10] == (k, n, top_k)
        assert down_kwargs["num_warps"] == down_kwargs["WARPS_N"] * down_kwargs["WARPS_K"] == 4
        if config.get("GROUPED"):
            sorted_pairs, offsets, counts = up_args[5:8]
            for expert in range(e):
                run = sorted_pairs[offsets[expert] : offsets[expert] + counts[expert]]
                assert sorted(run.tolist()) == (ids.reshape(-1) == expert).nonzero().flatten().tolist()
    with pytest.raises(ValueError, match="bfloat16"):
        moe_ring_gluon.launch(hidden.half(), *banks, ids, weights, out, forms[1][1], False)


def test_ring_expert_down_walks_each_tokens_experts_on_the_folded_h(monkeypatch):
    """The ring down, what CI can check of it without a GPU: the gate_up folds the routing
    weights and down global scales into the h the down reads (``FOLD_DOWN``); one down program
    a row block of ``16 * DOWN_WARPS``, a token and a split, its walk ``EXPERT_STEPS`` ring
    steps an expert; split, fp32 partials ``[split, T, hidden]`` that ``linear_mma``'s ordered
    reduce sums with no global scale (the fold put them in h). Grouped (``DOWN_GROUPED``): a
    program a row block and tile of the pairs grouped by expert, fp32 partials a pair
    ``[top_k, T, hidden]``, the same reduce; offered from ``DOWN_GROUPED_FROM`` tokens on, after
    the grouped gate_up. An inter size that is not whole ring steps is refused by name, and not
    offered."""
    import triton

    calls = []
    monkeypatch.setattr(moe_ring_gluon, "moe_gate_up_ring_kernel", _Recorder(calls, "gate_up"))
    monkeypatch.setattr(moe_ring_gluon, "moe_down_ring_kernel", _Recorder(calls, "down"))
    monkeypatch.setattr(moe_ring_gluon, "moe_down_grouped_ring_kernel", _Recorder(calls, "down_grouped"))
    monkeypatch.setattr(linear_mma, "splitk_reduce_kernel", _Recorder(calls, "reduce"))
    e, n, k, top_k, t = 6, 512, 512, 3, 5
    gu, dn, hidden, ids, weights = _cpu_expert_case(monkeypatch, e, n, k, top_k, t)
    banks = _tuples(gu, dn)
    for grouped, warps, split in ((0, 1, 1), (1, 2, 4)):
        calls.clear()
        out = torch.zeros_like(hidden)
        config = {"GROUPED": grouped, "WARPS": 2, "STAGES": 4, "DOWN_WARPS": warps, "DOWN_SPLIT": split}
        assert moe_ring_gluon.launch(hidden, *banks, ids, weights, out, config, False) is out
        assert [c[0] for c in calls] == ["gate_up", "down"] + ["reduce"] * (split > 1)
        (_, up_grid, up_args, up_kwargs), (_, down_grid, down_args, down_kwargs) = calls[:2]
        tiles = moe_fused.max_rows(t * top_k, e, moe_ring_gluon.GROUP_TILE) // moe_ring_gluon.GROUP_TILE
        assert up_grid == (triton.cdiv(n, 32), tiles if grouped else t * top_k)
        assert down_grid == (triton.cdiv(k, 16 * warps), t, split)
        assert up_kwargs["FOLD_DOWN"] is True
        assert torch.equal(up_args[8], weights.reshape(-1)) and up_args[9] is dn.global_scale
        h = up_args[10]
        assert h.shape == (t * top_k, n) and h.is_contiguous() and down_args[0] is h
        assert down_args[1].dtype == torch.int32 and torch.equal(down_args[1].view(torch.uint8), dn.packed)
        assert torch.equal(down_args[2].view(torch.uint8), dn.scales.view(torch.uint8))
        assert torch.equal(down_args[3], ids.reshape(-1))
        assert down_args[5:9] == (t, k, n, top_k)
        assert down_args[10:] == (*down_args[1].stride()[:2], *down_args[2].stride()[:2])
        assert down_kwargs["EXPERT_STEPS"] == n // 256 and down_kwargs["TOP_K_POW2"] == 4
        assert (down_kwargs["WARPS"], down_kwargs["STAGES"], down_kwargs["SPLIT_K"]) == (warps, 4, split)
        if split > 1:
            partials = down_args[4]
            assert partials.shape == (split, t, k) and partials.dtype == torch.float32
            _, _, reduce_args, reduce_kwargs = calls[2]
            assert reduce_args[0] is partials and reduce_args[3] is out and reduce_kwargs["HAS_SCALE"] is False
        else:
            assert down_args[4] is out
    calls.clear()
    config = {"GROUPED": 0, "WARPS": 2, "STAGES": 3, "DOWN_WARPS": 2, "DOWN_GROUPED": 1}
    assert moe_ring_gluon.launch(hidden, *banks, ids, weights, out, config, False) is out
    assert [c[0] for c in calls] == ["gate_up", "down_grouped", "reduce"]
    (_, _, up_args, up_kwargs), (_, grid, args, kwargs), (_, _, reduce_args, _) = calls
    assert up_kwargs["FOLD_DOWN"] is True and up_kwargs["BLOCK_M"] == 1 and args[0] is up_args[10]
    assert grid == (triton.cdiv(k, 32), tiles)
    sorted_pairs, offsets, counts = args[3:6]
    for expert in range(e):
        run = sorted_pairs[offsets[expert] : offsets[expert] + counts[expert]]
        assert sorted(run.tolist()) == (ids.reshape(-1) == expert).nonzero().flatten().tolist()
    partials = args[6]
    assert partials.shape == (top_k, t, k) and partials.dtype == torch.float32
    assert args[7:12] == (t, k, n, e, top_k) and (kwargs["BLOCK_M"], kwargs["WARPS"]) == (8, 2)
    assert reduce_args[0] is partials and reduce_args[3] is out and calls[2][3]["HAS_SCALE"] is False
    gu, dn = _bank(e, 48, k, "cpu")
    monkeypatch.setattr(decode, "interpreted", lambda: False)  # what a compiled GPU is offered
    assert not any("DOWN_WARPS" in c for c in moe_ring_gluon.configs(t, 48, k))
    assert all("DOWN_WARPS" in c for c in moe_ring_gluon.configs(t, 512, k)), "the walk won wherever it applies"
    for tokens in (1, 7, 8, 16):
        grouped_downs = [c for c in moe_ring_gluon.configs(tokens, 512, k) if "DOWN_GROUPED" in c]
        assert all(c["GROUPED"] for c in grouped_downs)
        grouped = tokens >= moe_ring_gluon.DOWN_GROUPED_FROM  # gate_up warps x down warps x depths:
        expected = 2 * len(moe_ring_gluon.GROUPED_DOWN_WARPS) * len(moe_ring_gluon.ring_stages(tokens))
        assert len(grouped_downs) == (expected if grouped else 0)
        assert {c["DOWN_WARPS"] for c in grouped_downs} <= set(moe_ring_gluon.GROUPED_DOWN_WARPS)
    with pytest.raises(ValueError, match="inter size"):
        banks = _tuples(gu, dn)
        moe_ring_gluon.launch(hidden, *banks, ids, weights, out, config, False)


def test_ring_expert_forms_offer_past_16_tokens_only_the_ways_that_won_there(monkeypatch):
    """Up to ``TIMED_UPTO`` every way is offered; from there to ``MAX_TOKENS`` the grouped gate_up
    with the grouped down and the per-pair gate_up with the unsplit walk, each with its warps and
    stages (a cold first call compiles each); past ``MAX_TOKENS`` nothing (``moe_fused`` serves)."""
    monkeypatch.setattr(decode, "interpreted", lambda: False)  # what a compiled GPU is offered
    k = 2048
    for n in (768, 512):
        timed = moe_ring_gluon.configs(moe_ring_gluon.TIMED_UPTO, n, k)
        for tokens in (moe_ring_gluon.TIMED_UPTO + 1, moe_ring_gluon.MAX_TOKENS):
            offered = moe_ring_gluon.configs(tokens, n, k)
            ways = {(c["GROUPED"], "DOWN_GROUPED" in c, c.get("DOWN_SPLIT")) for c in offered}
            assert ways == {(1, True, None), (0, False, 1)}
            assert len(offered) == 4 * 2 * len(moe_ring_gluon.ring_stages(tokens)) < len(timed)  # ways x warps x depths
            assert all(c in timed for c in offered), "each one of the ways timed at 16 tokens"
        assert moe_ring_gluon.configs(moe_ring_gluon.MAX_TOKENS + 1, n, k) == []
    gemv_down = moe_ring_gluon.configs(moe_ring_gluon.MAX_TOKENS, 48, 768)
    assert gemv_down == moe_ring_gluon.configs(moe_ring_gluon.TIMED_UPTO, 48, 768), "the GEMV downs as offered"


def test_ring_expert_ways_offer_two_stage_rings_from_wide_token_tiles(monkeypatch):
    """The unchunked ways' depths follow the dense ring form's: 3 and 4 below a 16-token tile, 2
    as well from one (the chunked ways keep ``CHUNK_STAGES``)."""
    monkeypatch.setattr(decode, "interpreted", lambda: False)  # what a compiled GPU is offered
    for tokens, depths in ((1, {3, 4}), (8, {3, 4}), (15, {3, 4}), (16, {2, 3, 4}), (64, {2, 3, 4})):
        offered = moe_ring_gluon.configs(tokens, 768, 2048)
        assert {c["STAGES"] for c in offered if "CHUNKS" not in c} == depths
        assert {c["STAGES"] for c in offered if "CHUNKS" in c} <= set(moe_ring_gluon.CHUNK_STAGES)


def test_ring_expert_chunks_and_slots_are_offered_to_few_tokens_and_launched_without_partials(monkeypatch):
    """The bank's rows cut in chunks, what CI can check without a GPU. Up to ``SLOTS_UPTO``
    tokens: the gate_up per pair with its rows in 1, 2, 4 or 8 chunks of the hidden size
    (``CHUNKS``: ``16 * WARPS / CHUNKS`` gate rows and as many up rows a program, the chunk's
    int32 words and scale words handed over), then the down with a token's experts side by side
    (``DOWN_SLOTS``: ``16 * DOWN_WARPS / SLOTS`` rows a program, ``SLOTS`` the top-k rounded up
    to a power of 2), one launch each, no partials and no reduce. Where they cannot run the
    launcher says which setting and what to use instead."""
    import triton

    calls = []
    monkeypatch.setattr(moe_ring_gluon, "moe_gate_up_ring_kernel", _Recorder(calls, "gate_up"))
    monkeypatch.setattr(moe_ring_gluon, "moe_down_slots_ring_kernel", _Recorder(calls, "slots"))
    monkeypatch.setattr(linear_mma, "splitk_reduce_kernel", _Recorder(calls, "reduce"))
    monkeypatch.setattr(decode, "interpreted", lambda: False)  # what a compiled GPU is offered
    e, n, k, top_k, t = 6, 512, 2048, 3, 2
    for tokens in (1, 4, 8, 9, 16):
        slotted = [c for c in moe_ring_gluon.configs(tokens, n, k) if "DOWN_SLOTS" in c]
        assert len(slotted) == (24 if tokens <= moe_ring_gluon.SLOTS_UPTO else 0)
        assert {c["DOWN_WARPS"] for c in slotted} == (set(moe_ring_gluon.SLOT_DOWN_WARPS) if slotted else set())
        assert {c["STAGES"] for c in slotted} == (set(moe_ring_gluon.CHUNK_STAGES) if slotted else set())
        assert not any("DOWN_STAGES" in c for c in slotted), "the down's ring as deep as the gate_up's"
        assert all(c["CHUNKS"] in moe_ring_gluon.GATE_UP_CHUNKS and not c["GROUPED"] for c in slotted)
    assert {c["CHUNKS"] for c in moe_ring_gluon.configs(1, n, 768) if "DOWN_SLOTS" in c} == {1}, "whole steps only"
    gu, dn, hidden, ids, weights = _cpu_expert_case(monkeypatch, e, n, k, top_k, t)
    banks = _tuples(gu, dn)
    for chunks, warps, down_warps, down in (
        (1, 1, 2, {}),
        (2, 2, 1, {"DOWN_STAGES": 3}),
        (8, 1, 1, {"DOWN_ROW_TILES": 2}),
    ):
        calls.clear()
        out = torch.zeros_like(hidden)
        config = {"GROUPED": 0, "WARPS": warps, "STAGES": 4, "CHUNKS": chunks, "DOWN_WARPS": down_warps}
        config |= {"DOWN_SLOTS": 1} | down
        assert moe_ring_gluon.launch(hidden, *banks, ids, weights, out, config, False) is out
        assert [c[0] for c in calls] == ["gate_up", "slots"], "no partials, no reduce"
        (_, up_grid, up_args, up_kwargs), (_, grid, args, kwargs) = calls
        assert up_grid == (triton.cdiv(n, 16 * warps // chunks), t * top_k)
        chunk_words = k // chunks // 8 if chunks > 1 else 0
        assert up_args[-2:] == (chunk_words, chunk_words // 8) and up_kwargs["CHUNKS"] == chunks
        assert up_kwargs["FOLD_DOWN"] is True and up_kwargs["BLOCK_M"] == 1
        row_tiles, stages = down.get("DOWN_ROW_TILES", 1), down.get("DOWN_STAGES", 4)
        assert grid == (triton.cdiv(k, 16 * row_tiles * down_warps // 4), t) and kwargs["SLOTS"] == 4
        assert args[0] is up_args[10] and args[4] is out and torch.equal(args[3], ids.reshape(-1))
        assert torch.equal(args[1].view(torch.uint8), dn.packed) and args[5:9] == (k, n, top_k, out.stride(0))
        assert args[9:] == (*args[1].stride()[:2], *args[2].stride()[:2])
        assert (kwargs["WARPS"], kwargs["STAGES"], kwargs["num_warps"]) == (down_warps, stages, down_warps)
        assert kwargs["ROW_TILES"] == row_tiles and up_kwargs["STAGES"] == 4, "DOWN_STAGES sets the down's alone"
    slots = {"GROUPED": 0, "WARPS": 1, "STAGES": 4, "DOWN_WARPS": 1, "DOWN_SLOTS": 1}
    with pytest.raises(ValueError, match=r"CHUNKS=4.*GROUPED=0"):
        moe_ring_gluon.launch(hidden, *banks, ids, weights, out, slots | {"GROUPED": 1, "CHUNKS": 4}, False)
    with pytest.raises(ValueError, match=r"CHUNKS=8.*multiple of 2048.*1024"):
        moe_ring_gluon.launch(hidden[:, :1024], *banks, ids, weights, out, slots | {"CHUNKS": 8}, False)
    many = torch.arange(9).repeat(t, 1)
    with pytest.raises(ValueError, match=r"DOWN_SLOTS.*top_k <= 8, got 9.*DOWN_SPLIT"):
        moe_ring_gluon.launch(hidden, *banks, many, weights.repeat(1, 3), out, slots, False)


@pytest.mark.skipif(not ON_GPU, reason="Gluon has no interpreter; CI builds these kernels for every target")
@pytest.mark.parametrize("top_k", [8, 6, 3])
@pytest.mark.parametrize("t", [1, 3, 8])
def test_ring_expert_chunks_and_slots_match_reference(t, top_k, device):
    """Every config with the rows cut in chunks offered at these tokens (32- and 64-row slot
    programs, 2- and 4-stage rings), and 8 chunks and 16-row slot programs, not offered (a Qwen3-30B-shaped hidden
    size of 2048; an inter size of 512, two steps an expert): top-8 fills the down's 8 slots,
    top-6 leaves two that must add nothing, top-3 one of 4. Expert 0's down global scale is 0
    (a pruned expert), the output poisoned first."""
    e, n, k = 16, 512, 2048
    gu, dn = _bank(e, n, k, device)
    dn.global_scale[0] = 0.0
    hidden = torch.randn(t, k, dtype=torch.bfloat16, device=device)
    ids, weights = _route(t, e, top_k, device)
    ref = ops.moe_reference(hidden, gu, dn, ids, weights).double()
    configs = [c for c in moe_ring_gluon.configs(t, n, k) if "DOWN_SLOTS" in c]
    configs += [{"GROUPED": 0, "WARPS": w, "STAGES": 4, "CHUNKS": 8, "DOWN_WARPS": 1, "DOWN_SLOTS": 1} for w in (1, 2)]
    assert len(configs) == 6 * len(moe_ring_gluon.SLOT_DOWN_WARPS) * len(moe_ring_gluon.CHUNK_STAGES) + 2
    for config in configs:
        out = torch.full_like(hidden, float("nan"))
        moe_ring_gluon.launch(hidden, *_tuples(gu, dn), ids, weights, out, config, False)
        assert not out.isnan().any(), config
        assert (out.double() - ref).norm() / ref.norm() < 1e-2, config


def test_ring_expert_down_launched_with_pdl_after_a_gate_up_that_lets_it_start(monkeypatch):
    """``PDL_DOWN``, compiled: the gate_up (launched plainly here, ``PDL_GATE_UP`` off, so it
    starts once the routing is written) lets the kernel after it start once its ring is read
    (``TRIGGER``); the ring down, each way (the walk split, the slots, grouped), and its reduce
    are launched with PDL, told by their ``PDL`` constexpr to wait before reading h: where
    forced, or by default where torch.compile launches its kernels with PDL. Off, or
    interpreted, or before the GEMV down, nothing is."""
    calls = []
    for name in ("moe_gate_up_ring_kernel", "moe_down_ring_kernel", "moe_down_slots_ring_kernel"):
        monkeypatch.setattr(moe_ring_gluon, name, _Recorder(calls, name))
    monkeypatch.setattr(moe_ring_gluon, "moe_down_grouped_ring_kernel", _Recorder(calls, "moe_down_grouped"))
    monkeypatch.setattr(moe_gemv_gluon, "moe_down_gemv_kernel", _Recorder(calls, "moe_down_gemv"))
    monkeypatch.setattr(linear_mma, "splitk_reduce_kernel", _Recorder(calls, "reduce"))
    gu, dn, hidden, ids, weights = _cpu_expert_case(monkeypatch, 6, 512, 512, 3, 5)
    banks = _tuples(gu, dn)
    ring = {"GROUPED": 0, "WARPS": 2, "STAGES": 4, "DOWN_WARPS": 2}
    downs = {
        "moe_down_ring_kernel": ring | {"DOWN_SPLIT": 2},
        "moe_down_slots_ring_kernel": ring | {"DOWN_SLOTS": 1},
        "moe_down_grouped": ring | {"GROUPED": 1, "DOWN_GROUPED": 1},
        "moe_down_gemv": {"GROUPED": 0, "WARPS": 2, "STAGES": 4, "DOWN_ROWS": 2, "DOWN_WARPS_K": 1},
    }
    from torch._inductor import config as inductor

    cases = ((True, False, True), (True, False, False), (False, True, True), (None, True, True), (None, False, True))
    monkeypatch.setattr(moe_ring_gluon, "PDL_GATE_UP", False)
    for on, inductor_pdl, compiled in cases:  # None (the default): as torch.compile launches its kernels
        monkeypatch.setattr(moe_ring_gluon, "PDL_DOWN", on)
        monkeypatch.setattr(decode, "interpreted", lambda compiled=compiled: not compiled)
        for down, config in downs.items():
            calls.clear()
            with inductor.patch({"triton.enable_pdl": inductor_pdl}):
                moe_ring_gluon.launch(hidden, *banks, ids, weights, torch.zeros_like(hidden), config, False)
            launched = {name: kwargs for name, _, _, kwargs in calls}
            chained = (inductor_pdl if on is None else on) and compiled and down != "moe_down_gemv"
            assert launched["moe_gate_up_ring_kernel"]["TRIGGER"] is chained
            assert not launched["moe_gate_up_ring_kernel"].get("launch_pdl"), "the gate_up starts after the routing"
            assert launched[down].get("PDL", False) is chained and launched[down].get("launch_pdl", False) is chained
            if "reduce" in launched:
                assert launched["reduce"]["PDL"] is chained and launched["reduce"]["launch_pdl"] is chained


def test_ring_gate_up_launched_with_pdl_waits_before_it_reads(monkeypatch):
    """``PDL_GATE_UP``: the gate_up launched with PDL and told by its ``PDL`` constexpr to wait
    for the routing before it reads anything, where forced on or, with ``None``, where
    torch.compile launches its kernels with PDL, the default; never interpreted."""
    calls = []
    monkeypatch.setattr(moe_ring_gluon, "moe_gate_up_ring_kernel", _Recorder(calls, "gate_up"))
    monkeypatch.setattr(moe_ring_gluon, "moe_down_slots_ring_kernel", _Recorder(calls, "down"))
    gu, dn, hidden, ids, weights = _cpu_expert_case(monkeypatch, 6, 512, 512, 3, 5)
    config = {"GROUPED": 0, "WARPS": 2, "STAGES": 4, "DOWN_WARPS": 2, "DOWN_SLOTS": 1}
    from torch._inductor import config as inductor

    assert moe_ring_gluon.PDL_GATE_UP is None
    cases = ((False, True, True), (True, False, True), (None, True, True), (True, True, False))
    for on, inductor_pdl, compiled in cases:
        monkeypatch.setattr(moe_ring_gluon, "PDL_GATE_UP", on)
        monkeypatch.setattr(decode, "interpreted", lambda compiled=compiled: not compiled)
        calls.clear()
        with inductor.patch({"triton.enable_pdl": inductor_pdl}):
            moe_ring_gluon.launch(hidden, *_tuples(gu, dn), ids, weights, torch.zeros_like(hidden), config, False)
        gate_up = next(kwargs for name, _, _, kwargs in calls if name == "gate_up")
        waits = (inductor_pdl if on is None else on) and compiled
        assert gate_up["PDL"] is waits and gate_up["launch_pdl"] is waits, (on, inductor_pdl, compiled)


@pytest.mark.skipif(not ON_GPU, reason="PDL and Gluon need a compiled GPU")
@pytest.mark.parametrize(
    "config",
    [
        {"GROUPED": 0, "WARPS": 2, "STAGES": 4, "CHUNKS": 4, "DOWN_WARPS": 2, "DOWN_SLOTS": 1},
        {"GROUPED": 1, "WARPS": 2, "STAGES": 3, "DOWN_WARPS": 2, "DOWN_GROUPED": 1},
    ],
)
def test_ring_gate_up_with_pdl_gives_every_bit_it_gives_without(config, monkeypatch, device):
    """The gate_up launched with PDL (``PDL_GATE_UP``) after the kernel that writes its routing,
    its down launched with PDL too: on fresh hidden states and routings back to back, eagerly
    and replayed in a CUDA graph, bit for bit the output without it."""
    e, n, k, top_k, t = 16, 512, 2048, 8, 4
    gu, dn = _bank(e, n, k, device)
    banks = _tuples(gu, dn)
    cases = [(torch.randn(t, k, dtype=torch.bfloat16, device=device), *_route(t, e, top_k, device)) for _ in range(6)]
    by_hidden = {id(hidden): (ids, weights) for hidden, ids, weights in cases}
    monkeypatch.setattr(moe_ring_gluon, "PDL_DOWN", True)

    def launch(hidden, out):
        if out is None:
            return torch.empty_like(hidden)
        ids, weights = by_hidden[id(hidden)]
        routed = ids.clone()  # written by the kernel just before the gate_up, as the router's are
        return moe_ring_gluon.launch(hidden, *banks, routed, weights, out, config, False)

    _switch_keeps_every_bit(monkeypatch, moe_ring_gluon, "PDL_GATE_UP", launch, [c[0] for c in cases], repeats=2)


@pytest.mark.skipif(not ON_GPU, reason="PDL and Gluon need a compiled GPU")
@pytest.mark.parametrize(
    "config",
    [
        {"GROUPED": 0, "WARPS": 2, "STAGES": 4, "CHUNKS": 2, "DOWN_WARPS": 2, "DOWN_SLOTS": 1},
        {"GROUPED": 0, "WARPS": 2, "STAGES": 3, "DOWN_WARPS": 1, "DOWN_SPLIT": 4},
        {"GROUPED": 1, "WARPS": 2, "STAGES": 3, "DOWN_WARPS": 2, "DOWN_GROUPED": 1},
    ],
)
def test_ring_expert_down_with_pdl_gives_every_bit_it_gives_without(config, monkeypatch, device):
    """The down started while its gate_up ends (``PDL_DOWN``) reads h only after the gate_up is
    done: on fresh hidden states and routings back to back, eagerly and replayed in a CUDA
    graph, bit for bit the output without it, each way of the down."""
    e, n, k, top_k, t = 16, 512, 2048, 8, 4
    gu, dn = _bank(e, n, k, device)
    banks = _tuples(gu, dn)
    cases = [(torch.randn(t, k, dtype=torch.bfloat16, device=device), *_route(t, e, top_k, device)) for _ in range(6)]
    by_hidden = {id(hidden): (ids, weights) for hidden, ids, weights in cases}

    def launch(hidden, out):
        if out is None:
            return torch.empty_like(hidden)
        return moe_ring_gluon.launch(hidden, *banks, *by_hidden[id(hidden)], out, config, False)

    _switch_keeps_every_bit(monkeypatch, moe_ring_gluon, "PDL_DOWN", launch, [c[0] for c in cases], repeats=2)


@pytest.mark.skipif(not ON_GPU, reason="Gluon has no interpreter; CI builds these kernels for every target")
@pytest.mark.parametrize("t", [1, 3, 8, 16])
def test_ring_expert_form_reads_banks_in_the_ring_layout(t, device):
    """Every way the ring expert form offers at these tokens (per pair or grouped, 1-4 chunks;
    the walk, its splits, the slots, the grouped down), on both banks repacked in
    ``ring_layout``; expert 0's down global scale 0, the output poisoned first."""
    e, n, k, top_k = 16, 512, 1024, 8
    gu, dn = _bank(e, n, k, device)
    dn.global_scale[0] = 0.0
    hidden = torch.randn(t, k, dtype=torch.bfloat16, device=device)
    ids, weights = _route(t, e, top_k, device)
    ref = ops.moe_reference(hidden, gu, dn, ids, weights).double()
    banks = _tuples(gu.in_layout(ring_layout.RING), dn.in_layout(ring_layout.RING))
    configs = moe_ring_gluon.configs(t, n, k)
    ways = {tuple(sorted(set(c) - {"WARPS", "STAGES"})) for c in configs}
    chosen = [next(c for c in configs if tuple(sorted(set(c) - {"WARPS", "STAGES"})) == way) for way in ways]
    for config in chosen + configs[1::5]:
        out = torch.full_like(hidden, float("nan"))
        moe_ring_gluon.launch(hidden, *banks, ids, weights, out, config | {"LAYOUT": ring_layout.RING}, False)
        assert not out.isnan().any(), config
        assert (out.double() - ref).norm() / ref.norm() < 1e-2, config


@W4A4_HERE
@pytest.mark.parametrize("t", [1, 5, 33])
def test_moe_w4a4_form_matches_its_reference_stage_by_stage(t, device):
    """FP4 x FP4 expert bank, each stage on its own input: gate_up against the reference's
    ``h``, then down + reduce on the kernel's own ``h`` (composed, quantizing ``h`` amplifies
    one-ulp differences: see the module). N = 48 and K = 752: both GEMMs take masked tails."""
    e, n, k, top_k = 8, 48, 752, 2
    gu, dn = _bank(e, n, k, device)
    hidden = torch.randn(t, k, dtype=torch.bfloat16, device=device)
    ids, weights = _route(t, e, top_k, device)
    config = moe_w4a4.configs(t, n, k)[-1]
    grouping = moe_fused.group_pairs(ids, e, config["BLOCK_M"])
    h = moe_w4a4.launch_gate_up(hidden, (gu.packed, gu.scales, gu.global_scale), top_k, grouping, config)
    h_pairs = h[grouping.pair_rows.long()].reshape(t, top_k, n)
    h_ref = moe_w4a4.gate_up_reference(hidden, gu, ids)
    assert (h_pairs.double() - h_ref.double()).norm() / h_ref.double().norm() < 1e-2
    out = torch.full_like(hidden, float("nan"))
    moe_w4a4.launch_down(h, (dn.packed, dn.scales, dn.global_scale), weights, grouping, out, config)
    ref = moe_w4a4.down_reference(h_pairs, dn, ids, weights)
    assert not out.isnan().any()
    assert (out.double() - ref).norm() / ref.norm() < 1e-2


def test_moe_w4a4_reference_costs_little_against_w4a16_and_bf16():
    """Whole-bank accuracy cost of NVFP4 activations (both GEMMs), on Gaussian data at a real
    bank's widths; the kernels match this arithmetic stage by stage (above)."""
    e, n, k, top_k, t = 8, 768, 2048, 2, 4
    w13, w2 = torch.randn(e, 2 * n, k, dtype=torch.bfloat16), torch.randn(e, k, n, dtype=torch.bfloat16)
    gu, dn = nvfp4.quantize_reference(w13), nvfp4.quantize_reference(w2)
    hidden = torch.randn(t, k, dtype=torch.bfloat16)
    ids, weights = _route(t, e, top_k, torch.device("cpu"))
    w4a4 = moe_w4a4.moe_w4a4_reference(hidden, gu, dn, ids, weights).double().flatten()
    w4a16 = ops.moe_reference(hidden, gu, dn, ids, weights).double().flatten()
    bf16 = torch.zeros(t, k, dtype=torch.float64)
    for token, slot in product(range(t), range(top_k)):
        expert, weight = ids[token, slot], weights[token, slot].double()
        y = hidden[token].double() @ w13[expert].double().t()
        bf16[token] += weight * ((F.silu(y[:n]) * y[n:]) @ w2[expert].double().t())
    bf16 = bf16.flatten()
    assert F.cosine_similarity(w4a4, w4a16, dim=0) >= 0.98
    assert F.cosine_similarity(w4a4, bf16, dim=0) >= 0.97


def test_w4a4_expert_bank_is_offered_only_on_fp4_tensor_cores(monkeypatch):
    monkeypatch.setattr("flashrt.kernels.decode.interpreted", lambda: False)
    forms = {major: {c.form for c in ops.moe_candidates(8, 768, 2048, (major, 0))} for major in (9, 10, 12)}
    assert "w4a4" not in forms[9] and "w4a4" in forms[10] and "w4a4" in forms[12]
    try:
        ops.pin_activations("nvfp4")
        assert {c.form for c in ops.moe_candidates(8, 768, 2048, (10, 0))} == {"w4a4"}
        assert "w4a4" not in {c.form for c in ops.moe_candidates(8, 768, 2048, (9, 0))}
        ops.pin_activations("bf16")
        assert "w4a4" not in {c.form for c in ops.moe_candidates(8, 768, 2048, (12, 0))}
    finally:
        ops.pin_activations("auto")


def test_moe_op_routes_to_few_experts_of_many(device):
    gu, dn = _bank(64, 32, 256, device)
    hidden = torch.randn(4, 256, dtype=torch.bfloat16, device=device)
    ids, weights = _route(4, 64, 8, device)
    out = ops.moe(hidden, gu, dn, ids, weights)
    ref = ops.moe_reference(hidden, gu, dn, ids, weights)
    assert (out.double() - ref.double()).norm() / ref.double().norm() < 1e-2


# -- custom ops ------------------------------------------------------------------------------------


def test_ops_trace_as_single_nodes_under_torch_compile_fullgraph():
    q = nvfp4.quantize_reference(torch.randn(64, 128, dtype=torch.bfloat16))
    gu, dn = _bank(4, 16, 128, torch.device("cpu"))
    ids, weights = _route(3, 4, 2, torch.device("cpu"))

    def step(x):
        h = ops.linear(x, q, None)
        return ops.moe(h[:, :128] if h.shape[1] >= 128 else torch.cat([h, h], dim=1), gu, dn, ids, weights)

    x = torch.randn(3, 128, dtype=torch.bfloat16)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), step(x))


# test_schema runs the op under SchemaCheckMode, whose CPU float8 arithmetic is missing in
# torch ("mul_cpu_reduced_float not implemented for Float8_e4m3fn"): the fake-tensor and
# dispatch checks are the ones that guard tracing.
OPCHECK_UTILS = ("test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("layout", [ring_layout.CHECKPOINT, ring_layout.RING])
def test_custom_ops_pass_opcheck(layout):
    q = nvfp4.quantize_reference(torch.randn(32, 64, dtype=torch.bfloat16)).in_layout(layout)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    torch.library.opcheck(
        torch.ops.flashrt.nvfp4_linear, (x, q.packed, q.scales, q.global_scale, None, layout), test_utils=OPCHECK_UTILS
    )
    gu, dn = (w.in_layout(layout) for w in _bank(4, 16, 64, torch.device("cpu")))
    ids, weights = _route(3, 4, 2, torch.device("cpu"))
    torch.library.opcheck(
        torch.ops.flashrt.nvfp4_moe,
        (x[:3], gu.packed, gu.scales, gu.global_scale, dn.packed, dn.scales, dn.global_scale, ids, weights, layout),
        test_utils=OPCHECK_UTILS,
    )


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA device")
def test_ops_record_into_a_cuda_graph():
    q = nvfp4.quantize(torch.randn(512, 1024, dtype=torch.bfloat16, device="cuda"))
    gu, dn = _bank(16, 64, 1024, torch.device("cuda"))
    x = torch.randn(4, 1024, dtype=torch.bfloat16, device="cuda")
    ids, weights = _route(4, 16, 4, torch.device("cuda"))
    eager = ops.moe(x, gu, dn, ids, weights), ops.linear(x, q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.moe(x, gu, dn, ids, weights), ops.linear(x, q)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured, strict=True):
        torch.testing.assert_close(a, b)


# -- bad input -------------------------------------------------------------------------------------


def test_bad_inputs_name_the_tensor_and_the_fix():
    q = nvfp4.quantize_reference(torch.randn(32, 64, dtype=torch.bfloat16))
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    cases = [
        (lambda: ops.linear(x.float(), q), "x: got dtype torch.float32"),
        (lambda: ops.linear(x[:, :48], q), "x: got 48 features"),
        (
            lambda: ops.linear(x, NVFP4Weight(q.packed.float(), q.scales, q.global_scale)),
            "w.packed: got dtype torch.float32",
        ),
        (
            lambda: ops.linear(x, NVFP4Weight(q.packed, q.scales[:, :2].contiguous(), q.global_scale)),
            "w.scales: got shape (32, 2)",
        ),
        (lambda: nvfp4.quantize_reference(torch.randn(8, 40)), "K = 40 is not a multiple of 16"),
        (lambda: nvfp4.quantize_reference(torch.randn(8, 32, dtype=torch.float64)), "weight: got dtype torch.float64"),
        (lambda: nvfp4.quantize_reference(torch.randn(32)), "weight: got rank 1"),
        (lambda: ops.linear(x, q, torch.randn(7, dtype=torch.bfloat16)), "bias: got shape (7,)"),
    ]
    gu, dn = _bank(4, 16, 64, torch.device("cpu"))
    _, dn_other = _bank(4, 32, 64, torch.device("cpu"))
    ids, weights = _route(2, 4, 2, torch.device("cpu"))
    cases += [
        (lambda: ops.moe(x, gu, dn_other, ids, weights), "down: got shape (4, 64, 32), need (4, 64, 16)"),
        (lambda: ops.moe(x, gu, dn, ids.float(), weights), "topk_ids: got torch.float32"),
        (lambda: ops.moe(x, gu, dn, ids, weights[:1]), "topk_weights: got"),
        (lambda: ops.moe(x[None], gu, dn, ids, weights), "hidden: got rank 3"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            call()


def test_the_block_holding_the_amax_gets_a_finite_scale():
    """amax / 6 / (amax / 2688) can land an ulp above 448, where a float8 cast gives NaN."""
    hits = 0
    for _ in range(200):
        w = torch.randn(1, 4, 32) * torch.rand(()) * 10
        q = nvfp4.quantize_reference(w)
        assert not q.scales.float().isnan().any()
        hits += int((w.abs().amax() / 6 / q.global_scale[0]).item() > 448)
    assert hits > 0, "no tensor exercised the rounding above 448"


# -- the SiLU-and-mul epilogue ---------------------------------------------------------------------


def _silu_mul_launches(m: int, k: int) -> list[tuple[object, dict]]:
    """One config of each tile shape the ring forms offer at ``m`` tokens (chunks, token tile,
    split, warps; a compile each), weight layouts in turn: the chunked forms (1-4 tokens), the
    unsplit and split tiles, and the K-warps form (4-16)."""
    shape_keys = ("CHUNKS", "BLOCK_M", "SPLIT_K", "ROW_TILES", "WARPS", "K_WARPS", "ROW_WARPS")
    launches, seen = [], set()
    for mod in (linear_mma_gluon, linear_k_warps_gluon):
        for config in mod.configs(m, 1000, k):
            key = (mod.__name__, *(config.get(name) for name in shape_keys))
            if key not in seen:
                seen.add(key)
                launches.append((mod, config | {"LAYOUT": mod.LAYOUTS[len(launches) % len(mod.LAYOUTS)]}))
    return launches


@pytest.mark.skipif(not ON_GPU, reason="Gluon has no interpreter: CI builds the epilogue for every target")
@pytest.mark.parametrize(("m", "k"), [(1, 2048), (3, 768), (4, 4096), (8, 2048), (13, 768), (16, 4096)])
def test_silu_mul_epilogue_matches_the_reference_in_every_ring_config(m, k, device):
    """A gate-and-up projection of 1000 rows (500 features, no tile's multiple) read in gate and
    up pairs, its SiLU-and-mul taken in the epilogue, against the float32 reference, in each tile
    shape the ring forms offer at ``m`` tokens: chunks, unsplit and split tiles (summed by the
    reduce), K across warps; the output's columns past 500 and rows past ``m`` untouched."""
    n = 1000
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    weights = {0: q, 1: q.in_layout(ring_layout.RING)}
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    ref = ops.linear_silu_mul_reference(x, q)
    launches = _silu_mul_launches(m, k)
    assert launches
    for mod, config in launches:
        w = weights[config["LAYOUT"]]
        wide = torch.full((m + 1, n // 2 + 8), float("nan"), dtype=torch.bfloat16, device=device)
        out = wide[:m, : n // 2]
        mod.launch(x, w.packed, w.scales, w.global_scale, None, out, config | {"SILU_MUL": True}, False)
        assert not out.isnan().any(), config
        assert wide[m:].isnan().all() and wide[:, n // 2 :].isnan().all(), config
        assert (out.double() - ref.double()).norm() / ref.double().norm() < 1e-2, config


@pytest.mark.skipif(not ON_GPU, reason="adjudicates on the device")
@pytest.mark.parametrize("m", [1, 8, 64])
def test_linear_silu_mul_serves_the_projection_s_choice_with_the_activation(m, device):
    """``linear_silu_mul`` on the adjudicator's choice for the projection: fused where the form
    has the epilogue, the projection and then ``silu_mul`` where it has not (64 tokens: the
    wgmma forms), the same figures either way."""
    w = ops.for_serving(nvfp4.quantize(torch.randn(2048, 2048, dtype=torch.bfloat16, device=device)))
    x = torch.randn(m, 2048, dtype=torch.bfloat16, device=device)
    out = ops.linear_silu_mul(x, w)
    ref = ops.linear_silu_mul_reference(x, w)
    assert out.shape == (m, 1024)
    assert (out.double() - ref.double()).norm() / ref.double().norm() < 1e-2


def test_linear_silu_mul_is_the_reference_off_the_gpu_and_refuses_odd_rows():
    """Off a GPU the op is its reference: the projection's float32 product, then vLLM's
    ``SiluAndMul`` (gate rows first). Odd rows and the wrong K are refused by name."""
    q = nvfp4.quantize(torch.randn(64, 768, dtype=torch.bfloat16))
    x = torch.randn(2, 3, 768, dtype=torch.bfloat16)
    out = ops.linear_silu_mul(x, q)
    y = x.float() @ nvfp4.dequantize(q, torch.float32).t()
    expected = (F.silu(y[..., :32]) * y[..., 32:]).to(torch.bfloat16)
    assert out.shape == (2, 3, 32) and torch.equal(out, expected)
    with pytest.raises(ValueError, match="even"):
        ops.linear_silu_mul(x, nvfp4.quantize(torch.randn(63, 768, dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match="K = 768"):
        ops.linear_silu_mul(torch.randn(2, 512, dtype=torch.bfloat16), q)


def test_silu_mul_launches_pair_the_rows_sum_splits_in_the_reduce_and_take_no_bias(monkeypatch, device):
    """What a SiLU-and-mul launch hands its kernels: ``SILU_MUL``, fp32 partials as wide as the
    weight for a split launch (its output is half as wide), the reduce told to pair them, never
    folded even where ``FOLD_SPLITS``; a bias, odd rows or an output not half as wide refused by
    name."""
    calls = []
    monkeypatch.setattr(linear_mma_gluon, "nvfp4_linear_mma_gluon_kernel", _Recorder(calls, "mma"))
    monkeypatch.setattr(linear_k_warps_gluon, "nvfp4_linear_k_warps_gluon_kernel", _Recorder(calls, "k_warps"))
    monkeypatch.setattr(linear_mma, "splitk_reduce_kernel", _Recorder(calls, "reduce"))
    monkeypatch.setattr(linear_mma_gluon, "FOLD_SPLITS", True)
    q = nvfp4.quantize(torch.randn(1000, 2048, dtype=torch.bfloat16, device=device))
    x = torch.randn(8, 2048, dtype=torch.bfloat16, device=device)
    out = torch.zeros(8, 500, dtype=torch.bfloat16, device=device)
    split = {"BLOCK_M": 8, "ROW_TILES": 1, "WARPS": 4, "STAGES": 3, "SPLIT_K": 2, "SILU_MUL": True}
    linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, split, False)
    (kernel, _, args, kwargs), (reduce, grid, reduce_args, reduce_kwargs) = calls
    assert (kernel, reduce) == ("mma", "reduce") and kwargs["SILU_MUL"] is True and kwargs["FOLD"] is False
    assert args[5].shape == (2, 8, 1000) and reduce_args[0] is args[5] and reduce_args[3] is out
    assert reduce_kwargs["SILU_MUL"] is True and grid[0] == 8
    calls.clear()
    k_warps = {"BLOCK_M": 8, "K_WARPS": 4, "ROW_WARPS": 1, "STAGES": 2, "SILU_MUL": True}
    linear_k_warps_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, k_warps, False)
    ((kernel, _, args, kwargs),) = calls
    assert kernel == "k_warps" and kwargs["SILU_MUL"] is True and args[5] is out
    for bad_bias, bad_out, match in (
        (torch.zeros(1000, dtype=torch.bfloat16, device=device), out, "bias"),
        (None, torch.zeros(8, 1000, dtype=torch.bfloat16, device=device), "500"),
    ):
        with pytest.raises(ValueError, match=match):
            linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, bad_bias, bad_out, split, False)
    odd = nvfp4.quantize(torch.randn(999, 2048, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="even"):
        linear_k_warps_gluon.launch(x, odd.packed, odd.scales, odd.global_scale, None, out, k_warps, False)


# -- the residual add and RMSNorm epilogues --------------------------------------------------------


def _unsplit(launches: list[tuple[object, dict]]) -> list[tuple[object, dict]]:
    return [(mod, config) for mod, config in launches if config.get("SPLIT_K", 1) == 1]


def _relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.skipif(not ON_GPU, reason="Gluon has no interpreter: CI builds the epilogues for every target")
@pytest.mark.parametrize(("m", "k"), [(1, 2048), (2, 768), (3, 768), (4, 4096), (8, 2048), (13, 768), (16, 4096)])
def test_add_norm_epilogue_matches_the_reference_in_every_unsplit_ring_config(m, k, device):
    """A projection of 1008 rows (no tile's multiple) with the residual add, the norm's weight
    and the sums of squares in its epilogue, against the float32 reference, in each unsplit tile
    shape the ring forms offer at ``m`` tokens; a bias too; the sums buffer past the ``[m, 1008 /
    group]`` it holds untouched."""
    n = 1008
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    weights = {0: q, 1: q.in_layout(ring_layout.RING)}
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    residual = torch.randn(m, n, dtype=torch.bfloat16, device=device) * 4
    norm_weight = torch.rand(n, dtype=torch.bfloat16, device=device) + 0.5
    bias = torch.randn(n, dtype=torch.bfloat16, device=device)
    group = linear_mma_gluon.norm_group(m)
    held = m * (n // group)
    launches = _unsplit(_silu_mul_launches(m, k))
    assert launches
    for (mod, config), with_bias in zip(launches, [False, True] * len(launches), strict=False):
        w = weights[config["LAYOUT"]]
        b = bias if with_bias else None
        h_ref, weighted_ref, sumsq_ref = ops.linear_add_norm_reference(x, q, residual, norm_weight, b)
        out, weighted = (torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device) for _ in range(2))
        sumsq = torch.full((ops.sumsq_numel(m, n),), float("nan"), dtype=torch.float32, device=device)
        epilogue = linear_mma_gluon.AddNorm(residual, norm_weight, weighted, sumsq, group)
        mod.launch(x, w.packed, w.scales, w.global_scale, b, out, config, False, add_norm=epilogue)
        for got, ref in ((out, h_ref), (weighted, weighted_ref), (sumsq[:held], sumsq_ref[:held])):
            assert not got.isnan().any() and _relative(got, ref) < 1e-2, config
        assert sumsq[held:].isnan().all(), config


@pytest.mark.skipif(not ON_GPU, reason="Gluon has no interpreter: CI builds the epilogues for every target")
@pytest.mark.parametrize(("m", "silu_mul_after"), [(1, False), (1, True), (3, True), (8, False), (8, True), (16, True)])
def test_norm_scale_epilogue_matches_the_reference_in_every_unsplit_ring_config(m, silu_mul_after, device):
    """A projection of 1000 rows fed by a norm over 2048 features: each token's scale from the
    sums of squares (``ops.add_norm``'s, of a residual stream a token at its own magnitude) in
    the epilogue, before the bias or the SiLU-and-mul, against the float32 reference, in each
    unsplit tile shape the ring forms offer at ``m`` tokens; rows past ``m`` untouched."""
    n, k, eps = 1000, 2048, 1e-5
    q = nvfp4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device))
    weights = {0: q, 1: q.in_layout(ring_layout.RING)}
    stream = torch.randn(m, k, device=device) * torch.logspace(-2, 2, m, device=device)[:, None]
    norm_weight = torch.rand(k, dtype=torch.bfloat16, device=device) + 0.5
    _, x, sumsq = ops.add_norm(stream, torch.zeros_like(stream, dtype=torch.bfloat16), norm_weight, torch.bfloat16)
    bias = None if silu_mul_after else torch.randn(n, dtype=torch.bfloat16, device=device)
    ref = ops.linear_normed_reference(x, q, sumsq, eps, bias, silu_mul_after)
    width = n // 2 if silu_mul_after else n
    for mod, config in _unsplit(_silu_mul_launches(m, k)):
        w = weights[config["LAYOUT"]]
        wide = torch.full((m + 1, width), float("nan"), dtype=torch.bfloat16, device=device)
        out = wide[:m]
        epilogue = linear_mma_gluon.NormScale(sumsq, linear_mma_gluon.norm_group(m), eps)
        params = config | {"SILU_MUL": silu_mul_after}
        mod.launch(x, w.packed, w.scales, w.global_scale, bias, out, params, False, norm_scale=epilogue)
        assert not out.isnan().any() and wide[m:].isnan().all(), config
        assert _relative(out, ref) < 1e-2, config


@pytest.mark.skipif(not ON_GPU, reason="adjudicates on the device")
@pytest.mark.parametrize("m", [1, 2, 8, 64])
def test_linear_add_norm_and_linear_normed_serve_the_projections_choices(m, device):
    """An o projection, the residual add and RMSNorm, and a gate-and-up projection after them,
    through the ops on the adjudicator's choices (fused where the form has the epilogue, the
    projection and then torch where it has not: 64 tokens), against the unfused chain as vLLM
    runs it: o, ``fused_add_rms_norm`` in float32, gate_up, ``SiluAndMul``."""
    o = ops.for_serving(nvfp4.quantize(torch.randn(2048, 4096, dtype=torch.bfloat16, device=device)))
    gate_up = ops.for_serving(nvfp4.quantize(torch.randn(4096, 2048, dtype=torch.bfloat16, device=device)))
    x = torch.randn(m, 4096, dtype=torch.bfloat16, device=device)
    residual = torch.randn(m, 2048, dtype=torch.bfloat16, device=device) * 8
    norm_weight = torch.rand(2048, dtype=torch.bfloat16, device=device) + 0.5
    h, weighted, sumsq = ops.linear_add_norm(x, o, residual, norm_weight)
    out = ops.linear_normed(weighted, gate_up, sumsq, 1e-6, silu_mul_after=True)
    stream = ops.linear(x, o).float() + residual.float()
    normed = (stream * torch.rsqrt(stream.square().mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * norm_weight
    ref = ops.silu_mul(ops.linear(normed, gate_up))
    assert out.shape == (m, 1024) and _relative(h, stream) < 1e-2
    assert _relative(out, ref) < 2e-2


def test_add_norm_and_linear_normed_are_the_norm_split_in_two_off_the_gpu():
    """Off a GPU the ops are their references, and the two halves are the unfused chain: the
    residual stream ``residual + x W^T``, then RMSNorm with its weight and the next projection
    (or its SiLU-and-mul) on it; the same for every token count's group (1, 2, 3 and 33: groups
    of 4, 8 and 16 features)."""
    for m in (1, 2, 3, 33):
        o = nvfp4.quantize(torch.randn(128, 512, dtype=torch.bfloat16))
        up = nvfp4.quantize(torch.randn(96, 128, dtype=torch.bfloat16))
        x = torch.randn(2, m, 512, dtype=torch.bfloat16)
        residual = torch.randn(2, m, 128, dtype=torch.bfloat16) * 3
        norm_weight = torch.rand(128, dtype=torch.bfloat16) + 0.5
        h, weighted, sumsq = ops.linear_add_norm(x, o, residual, norm_weight)
        stream = x.float() @ nvfp4.dequantize(o, torch.float32).t() + residual.float()
        assert h.shape == (2, m, 128) and torch.equal(h, stream.to(torch.bfloat16))
        assert sumsq.shape == (ops.sumsq_numel(2 * m, 128),)
        hf = h.float()
        normed = hf * torch.rsqrt(hf.square().mean(-1, keepdim=True) + 1e-5) * norm_weight.float()
        product = normed @ nvfp4.dequantize(up, torch.float32).t()
        got = ops.linear_normed(weighted, up, sumsq, 1e-5)
        assert got.shape == (2, m, 96) and _relative(got, product) < 1e-2
        silu = ops.linear_normed(weighted, up, sumsq, 1e-5, silu_mul_after=True)
        assert silu.shape == (2, m, 48) and _relative(silu, F.silu(product[..., :48]) * product[..., 48:]) < 1e-2


def test_add_norm_and_linear_normed_refuse_what_they_cannot_take_by_name():
    o = nvfp4.quantize(torch.randn(128, 512, dtype=torch.bfloat16))
    x = torch.randn(3, 512, dtype=torch.bfloat16)
    residual = torch.randn(3, 128, dtype=torch.bfloat16)
    norm_weight = torch.ones(128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="residual"):
        ops.linear_add_norm(x, o, residual[:2], norm_weight)
    with pytest.raises(ValueError, match="residual"):
        ops.linear_add_norm(x, o, residual.float(), norm_weight)
    with pytest.raises(ValueError, match="norm_weight"):
        ops.linear_add_norm(x, o, residual, norm_weight[:64])
    with pytest.raises(ValueError, match="groups of 16"):
        ops.linear_add_norm(
            x, nvfp4.quantize(torch.randn(120, 512, dtype=torch.bfloat16)), residual[:, :120], norm_weight[:120]
        )
    _, weighted, sumsq = ops.linear_add_norm(x, o, residual, norm_weight)
    up = nvfp4.quantize(torch.randn(96, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="sumsq"):
        ops.linear_normed(weighted[:2], up, sumsq, 1e-5)
    with pytest.raises(ValueError, match="sumsq"):
        ops.linear_normed(weighted, up, sumsq.double(), 1e-5)
    with pytest.raises(ValueError, match="SiLU-and-mul"):
        ops.linear_normed(weighted, up, sumsq, 1e-5, torch.zeros(96, dtype=torch.bfloat16), silu_mul_after=True)


def test_norm_launches_hand_their_kernels_the_norm_s_operands_unsplit(monkeypatch, device):
    """What a norm launch hands its kernels: ``AddNorm``'s residual, weight, weighted output and
    sums buffer with ``ADD_NORM`` and the group, ``NormScale``'s sums and eps with
    ``NORM_SCALE``; unused operands (``out``, eps 0) otherwise. A split config, programs that
    split a group, operands not laid out as the output, or both norms at once refused by name."""
    calls = []
    monkeypatch.setattr(linear_mma_gluon, "nvfp4_linear_mma_gluon_kernel", _Recorder(calls, "mma"))
    monkeypatch.setattr(linear_k_warps_gluon, "nvfp4_linear_k_warps_gluon_kernel", _Recorder(calls, "k_warps"))
    q = nvfp4.quantize(torch.randn(1024, 2048, dtype=torch.bfloat16, device=device))
    x = torch.randn(8, 2048, dtype=torch.bfloat16, device=device)
    out, residual, weighted = (torch.zeros(8, 1024, dtype=torch.bfloat16, device=device) for _ in range(3))
    norm_weight = torch.ones(1024, dtype=torch.bfloat16, device=device)
    sumsq = torch.zeros(ops.sumsq_numel(8, 1024), dtype=torch.float32, device=device)
    add = linear_mma_gluon.AddNorm(residual, norm_weight, weighted, sumsq, 16)
    scale = linear_mma_gluon.NormScale(sumsq, 16, 1e-6)
    tile = {"BLOCK_M": 8, "ROW_TILES": 1, "WARPS": 2, "STAGES": 3}
    k_warps = {"BLOCK_M": 8, "K_WARPS": 4, "ROW_WARPS": 1, "STAGES": 2}
    linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, tile, False, add_norm=add)
    linear_k_warps_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, k_warps, False, norm_scale=scale)
    linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, tile, False)
    (_, _, _, added), (_, _, _, scaled), (_, _, _, plain) = calls
    assert added["residual_ptr"] is residual and added["norm_weight_ptr"] is norm_weight
    assert added["weighted_ptr"] is weighted and added["sumsq_ptr"] is sumsq
    assert (added["ADD_NORM"], added["NORM_SCALE"], added["NORM_GROUP"]) == (True, False, 16)
    assert scaled["sumsq_ptr"] is sumsq and scaled["eps"] == pytest.approx(1e-6)
    assert (scaled["ADD_NORM"], scaled["NORM_SCALE"]) == (False, True) and scaled["residual_ptr"] is out
    assert "ADD_NORM" not in plain and plain["sumsq_ptr"] is out and plain["eps"] == 0.0
    chunked = {"BLOCK_M": 8, "ROW_TILES": 1, "WARPS": 2, "STAGES": 2, "CHUNKS": 8}
    coarse = linear_mma_gluon.AddNorm(residual, norm_weight, weighted, sumsq, 8)
    for config, kwargs, match in (
        (tile | {"SPLIT_K": 2}, {"add_norm": add}, "SPLIT_K"),
        (chunked, {"add_norm": coarse}, "group"),
        (tile, {"add_norm": linear_mma_gluon.AddNorm(residual[:4], norm_weight, weighted, sumsq, 16)}, "residual"),
        (tile, {"add_norm": linear_mma_gluon.AddNorm(residual, norm_weight[:8], weighted, sumsq, 16)}, "weight"),
        (tile, {"add_norm": add, "norm_scale": scale}, "not both"),
    ):
        with pytest.raises(ValueError, match=match):
            linear_mma_gluon.launch(x, q.packed, q.scales, q.global_scale, None, out, config, False, **kwargs)


@pytest.mark.parametrize(("m", "n"), [(1, 4096), (2, 1008), (3, 5120)])
def test_the_add_and_norm_after_a_projection_computed_apart_is_the_epilogue_s_arithmetic(m, n, device):
    """``add_norm_after``, what a projection without the epilogue runs after it: the stream in
    place of the projection, the weighted stream, and the sums of squares at the front of the
    buffer in the group its token count takes (4, 8, 16), against ``ops.add_norm``'s float32
    arithmetic; past the sums the buffer untouched."""
    group = linear_mma_gluon.norm_group(m)
    y = torch.randn(m, n, device=device).to(torch.bfloat16)
    residual = (torch.randn(m, n, device=device) * 4).to(torch.bfloat16)
    norm_weight = (torch.rand(n, device=device) + 0.5).to(torch.bfloat16)
    h_ref, weighted_ref, sumsq_ref = ops.add_norm(y.float(), residual, norm_weight, torch.bfloat16)
    stream, weighted = y.clone(), torch.full_like(y, float("nan"))
    sumsq = torch.full((ops.sumsq_numel(m, n),), float("nan"), device=device)
    add_norm_after.launch(stream, residual, norm_weight, weighted, sumsq, group)
    held = m * (n // group)
    for got, ref in ((stream, h_ref), (weighted, weighted_ref)):  # the interpreter rounds to bf16 its own way
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=1e-2)
    own = stream.float().square().view(m, n // group, group).sum(-1).flatten()  # of the stream as it rounded it
    torch.testing.assert_close(sumsq[:held], own, rtol=1e-5, atol=1e-4)
    assert _relative(sumsq[:held], sumsq_ref[:held]) < 1e-2
    assert sumsq[held:].isnan().all()


@pytest.mark.parametrize(("m", "silu_mul", "with_bias"), [(1, False, True), (2, True, False), (3, False, False)])
def test_the_norm_scale_after_a_projection_computed_apart_is_the_epilogue_s_arithmetic(m, silu_mul, with_bias, device):
    """``norm_scale_after``: each token's scale from the sums over 2048 features (tokens at
    magnitudes 100 apart), then the bias or the SiLU-and-mul (gate columns first, as the
    projection computes them unfused), against ``ops.norm_scale`` and the float32 reference."""
    n, k, eps = 1000, 2048, 1e-5
    stream = torch.randn(m, k, device=device) * torch.logspace(-2, 2, m, device=device)[:, None]
    _, _, sumsq = ops.add_norm(stream, torch.zeros(m, k, device=device), torch.ones(k, device=device), torch.bfloat16)
    y = torch.randn(m, n, device=device).to(torch.bfloat16)
    bias = torch.randn(n, device=device).to(torch.bfloat16) if with_bias else None
    out = torch.full((m, n // 2 if silu_mul else n), float("nan"), dtype=torch.bfloat16, device=device)
    norm_scale_after.launch(y, sumsq, k, eps, bias, out, linear_mma_gluon.norm_group(m), silu_mul)
    ref = norm_scale_after.reference(y, ops.norm_scale(sumsq, m, k, eps), bias, silu_mul)
    torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=1e-2)
