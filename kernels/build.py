"""Ahead-of-time builds of every kernel in every configuration the adjudicator can pick.

Triton compiles to a cubin for a GPU it does not have (``GPUTarget``), with the ptxas it ships,
so a machine without a GPU proves that nothing offered on sm_90, sm_100, sm_110 or sm_120 fails
to build. ``builds()`` enumerates (kernel, signature, constexprs). All of them, 4532 a target
and 4758 for sm_90 (``Build.targets``: the ``wgmma`` forms are sm_90's; the ring forms and the
dequant each twice, for the checkpoint's layout and ``ring_layout``'s, the ring forms' split
launches twice more, summed by a reduce or folded, the decode ring forms with each of their
epilogues, and they and the ring expert downs with PDL and without), take hours of one CPU core
for the four targets (at c866faf 341 took 34 minutes; at 6b01d1d, on sm_100, the 64 builds of
``linear_mma`` were 266 s of 592); CI builds ``pairwise(builds())`` instead, 203 a target and
228 for sm_90 (a warp-specialized kernel's register cap is one of the settings covered).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations, product

from flashrt.kernels import (
    add_norm_after,
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
    permute_steps,
    quantizer,
)

TARGETS = (90, 100, 110, 120)
_ALIGNED_INTS = {
    "stride_xsm",
    "stride_hsm",
    "stride_ym",
    "stride_pm",
    "stride_sm",
    "stride_wsn",
    "N",
    "K",
    "stride_xm",
    "stride_om",
    "stride_on",
    "stride_wn",
    "stride_sn",
    "stride_hm",
    "stride_we",
    "stride_se",
    "numel",
    "chunk_words",
}
# Token counts whose configs span every BLOCK_M a form can choose.
_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 512, 2048)

_LINEAR_SIG = {
    "x_ptr": "*bf16",
    "packed_ptr": "*u8",
    "scales_ptr": "*u8",
    "global_scale_ptr": "*fp32",
    "bias_ptr": "*bf16",
    "out_ptr": "*bf16",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "stride_xm": "i32",
    "stride_om": "i32",
    "stride_wn": "i32",
    "stride_sn": "i32",
}
_MMA_SIG = {
    **{k: v for k, v in _LINEAR_SIG.items() if k.startswith(("x_", "packed", "scales", "global", "bias", "out"))},
    **{"M": "i32", "N": "i32", "K": "i32", "K_SPLIT": "i32"},
    **{k: v for k, v in _LINEAR_SIG.items() if k.startswith("stride")},
}
_SPLITK_REDUCE_SIG = {
    "part_ptr": "*fp32",
    "global_scale_ptr": "*fp32",
    "bias_ptr": "*bf16",
    "out_ptr": "*bf16",
    "M": "i32",
    "N": "i32",
    "stride_om": "i32",
}
# The Gluon forms read the weight as int32 words.
_GEMV_GLUON_SIG = {name if name != "packed_ptr" else "words_ptr": kind for name, kind in _LINEAR_SIG.items()}
_GEMV_GLUON_SIG["words_ptr"] = "*i32"
# The ring forms also take where a folded split-K launch stores its sum and its tiles' counters.
_RING_SIG = {
    **{k: v for k, v in _GEMV_GLUON_SIG.items() if k.endswith("_ptr")},
    **{"folded_ptr": "*bf16", "arrivals_ptr": "*i32"},
    **{k: v for k, v in _GEMV_GLUON_SIG.items() if not k.endswith("_ptr")},
}
# The decode ring forms also take a residual add and RMSNorm's operands (``linear_mma_gluon.AddNorm``).
_NORM_SIG = {
    **{f"{name}_ptr": "*bf16" for name in ("residual", "norm_weight", "weighted")},
    "sumsq_ptr": "*fp32",
    "eps": "fp32",
}
_MMA_GLUON_SIG = {**_RING_SIG, "chunk_words": "i32", "chunk_scales": "i32", **_NORM_SIG}
_K_WARPS_SIG = {**_GEMV_GLUON_SIG, "chunk_words": "i32", "chunk_scales": "i32", **_NORM_SIG}
# A decode ring form's epilogues: plain, the SiLU-and-mul, a residual add and norm, the norm's
# scale, and the scale before the SiLU-and-mul (a gate-and-up projection fed by a norm).
_EPILOGUES = (
    {"SILU_MUL": False},
    {"SILU_MUL": True},
    {"SILU_MUL": False, "ADD_NORM": True},
    {"SILU_MUL": False, "NORM_SCALE": True},
    {"SILU_MUL": True, "NORM_SCALE": True},
)


def _epilogues(cfg: dict, m: int, fold: bool = False) -> Iterator[dict]:
    """The epilogues a decode ring config builds with: a norm only unsplit (``norm_operands``),
    with the group its launches at ``m`` tokens take; a folded split never with the SiLU-and-mul."""
    for epilogue in _EPILOGUES:
        norm = epilogue.get("ADD_NORM") or epilogue.get("NORM_SCALE")
        if (norm and cfg.get("SPLIT_K", 1) > 1) or (fold and epilogue["SILU_MUL"]):
            continue
        group = linear_mma_gluon.norm_group(m) if norm else 16
        yield {"ADD_NORM": False, "NORM_SCALE": False} | epilogue | {"NORM_GROUP": group}


_W4A4_SIG = {
    "xq_ptr": "*u8",
    "xs_ptr": "*u8",
    "xg_ptr": "*fp32",
    "wq_ptr": "*u8",
    "ws_ptr": "*u8",
    "wg_ptr": "*fp32",
    "bias_ptr": "*bf16",
    "out_ptr": "*bf16",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "stride_xm": "i32",
    "stride_xsm": "i32",
    "stride_wn": "i32",
    "stride_wsn": "i32",
    "stride_om": "i32",
}
_GATE_UP_SIG = {
    "x_ptr": "*bf16",
    "packed_ptr": "*u8",
    "scales_ptr": "*u8",
    "global_scale_ptr": "*fp32",
    "sorted_pairs_ptr": "*i32",
    "expert_offsets_ptr": "*i32",
    "expert_counts_ptr": "*i32",
    "h_ptr": "*bf16",
    "N": "i32",
    "K": "i32",
    "E": "i32",
    "TOP_K": "i32",
    "stride_xm": "i32",
    "stride_hm": "i32",
    "stride_wn": "i32",
    "stride_sn": "i32",
}
_DOWN_SIG = {
    "h_ptr": "*bf16",
    "packed_ptr": "*u8",
    "scales_ptr": "*u8",
    "global_scale_ptr": "*fp32",
    "topk_ids_ptr": "*i64",
    "topk_weights_ptr": "*bf16",
    "pair_rows_ptr": "*i32",
    "out_ptr": "*bf16",
    "N": "i32",
    "K": "i32",
    "TOP_K": "i32",
    "stride_hm": "i32",
    "stride_om": "i32",
    "stride_wn": "i32",
    "stride_sn": "i32",
}
_MOE_GEMV_COMMON = {
    "stride_we": "i32",
    "stride_wn": "i32",
    "stride_se": "i32",
    "stride_sn": "i32",
}
_MOE_GATE_UP_GEMV_SIG = {
    "hidden_ptr": "*bf16",
    "words_ptr": "*i32",
    "scales_ptr": "*u8",
    "global_scale_ptr": "*fp32",
    "topk_ids_ptr": "*i64",
    "h_ptr": "*bf16",
    "N": "i32",
    "K": "i32",
    "TOP_K": "i32",
    "stride_xm": "i32",
    "stride_hm": "i32",
} | _MOE_GEMV_COMMON
_MOE_GATE_UP_RING_SIG = (
    {
        "hidden_ptr": "*bf16",
        "words_ptr": "*i32",
        "scales_ptr": "*i32",  # scale bytes copied as words
        "global_scale_ptr": "*fp32",
        "topk_ids_ptr": "*i64",
        "sorted_pairs_ptr": "*i32",
        "expert_offsets_ptr": "*i32",
        "expert_counts_ptr": "*i32",
        "topk_weights_ptr": "*bf16",
        "down_global_scale_ptr": "*fp32",
        "h_ptr": "*bf16",
        "N": "i32",
        "K": "i32",
        "E": "i32",
        "TOP_K": "i32",
        "stride_xm": "i32",
        "stride_hm": "i32",
    }
    | _MOE_GEMV_COMMON
    | {"chunk_words": "i32", "chunk_scales": "i32"}
)
_MOE_DOWN_RING_SIG = {
    "h_ptr": "*bf16",
    "words_ptr": "*i32",
    "scales_ptr": "*i32",
    "topk_ids_ptr": "*i64",
    "out_ptr": "*bf16",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "TOP_K": "i32",
    "stride_om": "i32",
} | _MOE_GEMV_COMMON
_MOE_DOWN_SLOTS_RING_SIG = {
    "h_ptr": "*bf16",
    "words_ptr": "*i32",
    "scales_ptr": "*i32",
    "topk_ids_ptr": "*i64",
    "out_ptr": "*bf16",
    "N": "i32",
    "K": "i32",
    "TOP_K": "i32",
    "stride_om": "i32",
} | _MOE_GEMV_COMMON
_MOE_DOWN_GROUPED_RING_SIG = {
    "h_ptr": "*bf16",
    "words_ptr": "*i32",
    "scales_ptr": "*i32",
    "sorted_pairs_ptr": "*i32",
    "expert_offsets_ptr": "*i32",
    "expert_counts_ptr": "*i32",
    "partials_ptr": "*fp32",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "E": "i32",
    "TOP_K": "i32",
} | _MOE_GEMV_COMMON
_MOE_DOWN_GEMV_SIG = {
    "h_ptr": "*bf16",
    "words_ptr": "*i32",
    "scales_ptr": "*u8",
    "global_scale_ptr": "*fp32",
    "topk_ids_ptr": "*i64",
    "topk_weights_ptr": "*bf16",
    "out_ptr": "*bf16",
    "N": "i32",
    "K": "i32",
    "TOP_K": "i32",
    "stride_hm": "i32",
    "stride_om": "i32",
} | _MOE_GEMV_COMMON
_GROUP_SIG = {
    "topk_ids_ptr": "*i64",
    "expert_offsets_ptr": "*i32",
    "expert_counts_ptr": "*i32",
    "sorted_pairs_ptr": "*i32",
    "pair_rows_ptr": "*i32",
    "P": "i32",
    "E": "i32",
}
_QUANT_SIG = {
    "w_ptr": "*bf16",
    "amax_ptr": "*fp32",
    "packed_ptr": "*u8",
    "scales_ptr": "*u8",
    "global_scale_ptr": "*fp32",
    "N": "i32",
    "K": "i32",
}


_QUANT_ROWS_SIG = {
    "x_ptr": "*bf16",
    "packed_ptr": "*u8",
    "scales_ptr": "*u8",
    "global_scale_ptr": "*fp32",
    "K": "i32",
    "stride_xm": "i32",
    "stride_pm": "i32",
    "stride_sm": "i32",
}
_MOE_GATE_UP_W4A4_SIG = {
    "xq_ptr": "*u8",
    "xs_ptr": "*u8",
    "xg_ptr": "*fp32",
    "packed_ptr": "*u8",
    "scales_ptr": "*u8",
    "global_scale_ptr": "*fp32",
    "sorted_pairs_ptr": "*i32",
    "expert_offsets_ptr": "*i32",
    "expert_counts_ptr": "*i32",
    "h_ptr": "*bf16",
    "N": "i32",
    "K": "i32",
    "E": "i32",
    "TOP_K": "i32",
    "stride_xm": "i32",
    "stride_xsm": "i32",
    "stride_hm": "i32",
    "stride_wn": "i32",
    "stride_sn": "i32",
}
_MOE_DOWN_W4A4_SIG = {
    "hq_ptr": "*u8",
    "hs_ptr": "*u8",
    "hg_ptr": "*fp32",
    "packed_ptr": "*u8",
    "scales_ptr": "*u8",
    "global_scale_ptr": "*fp32",
    "sorted_pairs_ptr": "*i32",
    "topk_weights_ptr": "*bf16",
    "expert_offsets_ptr": "*i32",
    "expert_counts_ptr": "*i32",
    "y_ptr": "*fp32",
    "N": "i32",
    "K": "i32",
    "E": "i32",
    "stride_hm": "i32",
    "stride_hsm": "i32",
    "stride_ym": "i32",
    "stride_wn": "i32",
    "stride_sn": "i32",
}
_MOE_REDUCE_SIG = {
    "y_ptr": "*fp32",
    "pair_rows_ptr": "*i32",
    "out_ptr": "*bf16",
    "K": "i32",
    "TOP_K": "i32",
    "stride_ym": "i32",
    "stride_om": "i32",
}
# The benchmark's decode attention (``bench/decode_attention.py``), which both e2e arms run.
_ATTENTION_SIG = {
    **{f"{name}_ptr": "*bf16" for name in ("q", "k", "v")},
    "visible_ptr": "*i1",
    **{f"{name}_ptr": "*fp32" for name in ("partial", "max", "sum")},
    **{name: "i32" for name in ("KV_HEADS", "G", "L", "D")},
    "scale": "fp32",
    **{f"stride_{name}": "i32" for name in ("qb", "qh", "qg", "kb", "kh", "kl", "vb", "vh", "vl", "mb", "ml")},
}
_MERGE_SIG = {
    **{f"{name}_ptr": "*fp32" for name in ("partial", "max", "sum")},
    "out_ptr": "*bf16",
    **{name: "i32" for name in ("G", "D", "SPLITS")},
}
_ADD_NORM_SIG = {
    **{f"{name}_ptr": "*bf16" for name in ("y", "residual", "weight", "weighted")},
    "sumsq_ptr": "*fp32",
    **{name: "i32" for name in ("N", "stride_ym", "stride_rm")},
}
_NORM_SCALE_SIG = {
    "y_ptr": "*bf16",
    "sumsq_ptr": "*fp32",
    "bias_ptr": "*bf16",
    "out_ptr": "*bf16",
    "N": "i32",
    "K": "i32",
    "eps": "fp32",
    "stride_ym": "i32",
    "stride_om": "i32",
}
_PERMUTE_SIG = {"x_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "stride_xm": "i32", "stride_om": "i32"}
_DEQUANT_SIG = {
    "packed_ptr": "*u8",
    "scales_ptr": "*u8",
    "global_scale_ptr": "*fp32",
    "out_ptr": "*bf16",
    "N": "i32",
    "K": "i32",
    "stride_wn": "i32",
    "stride_sn": "i32",
    "stride_on": "i32",
}


@dataclass(frozen=True)
class Build:
    name: str
    fn: object
    signature: dict
    constexprs: dict
    num_warps: int
    num_stages: int
    targets: tuple = TARGETS  # a kernel for one generation's instructions (wgmma: sm_90) lists it
    maxnreg: int | None = None  # a warp-specialized kernel's register cap at launch (``registers``)


def _with_constexprs(sig: dict, consts: dict) -> dict:
    return {**sig, **{k: "constexpr" for k in consts}}


def _split_build(sig: dict, consts: dict, split: int) -> tuple[dict, dict]:
    """A split-K form's signature and constexprs: every split count compiles alike, so 2 stands
    for any, and a split launch writes fp32 partials."""
    consts = consts | {"SPLIT_K": min(split, 2)}
    sig = _with_constexprs(sig, consts)
    if consts["SPLIT_K"] > 1:
        sig["out_ptr"] = "*fp32"
    return sig, consts


def _folds(cfg: dict) -> tuple[bool, ...]:
    """A ring form's split launch sums its partials in a reduce launch or folded into itself
    (``linear_mma_gluon.FOLD_SPLITS``): both build; an unsplit one has nothing to fold."""
    return (False, True) if cfg.get("SPLIT_K", 1) > 1 else (False,)


@functools.cache
def _ws_signature(form, block_m: int, warps: int, chunks: int = 1) -> dict:
    """A warp-specialized form's (``linear_wgmma_ws_gluon``, ``linear_mma_ws_gluon``) arguments
    as a launch passes them: its three TMA descriptors typed as Triton specializes them (block
    shape and shared layout, from the form's ``descriptors`` over unallocated host tensors of
    Llama's gate_up at 512 tokens), then the pointers and sizes. Only the tile and the chunks
    shape them, so once a tile (``builds()`` is walked by every build check)."""
    import torch
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl

    x, words = torch.empty(512, 4096, dtype=torch.bfloat16), torch.empty(28672, 512, dtype=torch.int32)
    config = {"BLOCK_M": block_m, "WARPS": warps, "CHUNKS": chunks}
    descs = form.descriptors(x, words, torch.empty(28672, 64, dtype=torch.int32), config)
    names = ("words_desc", "scales_desc", "x_desc")
    sig = {
        name: native_specialize_impl(CUDABackend, d, False, True, True)[0] for name, d in zip(names, descs, strict=True)
    }
    sig |= {"global_scale_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16"}
    return sig | {"M": "i32", "N": "i32", "K": "i32", "stride_om": "i32"}


def _one_token(m: int) -> dict:
    """A launch at one token as Triton compiles it: an integer argument equal to 1 becomes the
    constant 1, on which ``.to()`` and the like do not exist. The ring forms' builds at one token
    take ``M`` so (their folded splits once failed to build on the H200 there and nowhere else)."""
    return {"M": 1} if m == 1 else {}


def builds() -> Iterator[Build]:
    seen = set()

    def unique(b: Build) -> Iterator[Build]:
        key = (b.name, tuple(sorted(b.constexprs.items())), b.num_warps, b.num_stages, b.maxnreg)
        if key not in seen:
            seen.add(key)
            yield b

    for m in _TOKENS:
        for form, mod, fn in (
            ("gemv", linear_gemv, linear_gemv.nvfp4_linear_gemv_kernel),
            ("mma", linear_mma, linear_mma.nvfp4_linear_mma_kernel),
        ):
            for cfg, even_k in product(mod.configs(m, 4096, 4096), (True, False)):
                consts = {"HAS_BIAS": False, "USE_PRMT": True, "EVEN_K": even_k}
                consts |= {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if k in cfg}
                if form == "mma":
                    sig, consts = _split_build(_MMA_SIG, consts | {"INTERPRETED": False}, cfg.get("SPLIT_K", 1))
                else:
                    sig = _with_constexprs(_LINEAR_SIG, consts)
                yield from unique(Build(f"linear_{form}", fn, sig, consts, cfg["num_warps"], cfg["num_stages"]))
        for cfg, even_k in product(linear_gemv_gluon.configs(m, 4096, 4096), (True, False)):
            consts = {"HAS_BIAS": False, "X_FP16": False, "EVEN_K": even_k} | cfg
            fn = linear_gemv_gluon.nvfp4_linear_gemv_gluon_kernel
            sig = _with_constexprs(_GEMV_GLUON_SIG, consts)
            warps = cfg["WARPS_N"] * cfg["WARPS_K"]
            yield from unique(Build("linear_gemv_gluon", fn, sig, consts, warps, 1))
        for cfg, layout in product(linear_mma_gluon.configs(m, 4096, 4096), linear_mma_gluon.LAYOUTS):
            for fold, pdl in product(_folds(cfg), (False, True)):
                for epilogue in _epilogues(cfg, m, fold):
                    consts = {"HAS_BIAS": False, "CHUNKS": 1, "LAYOUT": layout, "FOLD": fold, "PDL": pdl} | cfg
                    consts |= epilogue | _one_token(m)
                    sig, consts = _split_build(_MMA_GLUON_SIG, consts, cfg.get("SPLIT_K", 1))
                    fn = linear_mma_gluon.nvfp4_linear_mma_gluon_kernel
                    yield from unique(Build("linear_mma_gluon", fn, sig, consts, cfg["WARPS"], 1))
        for cfg, layout, pdl in product(
            linear_k_warps_gluon.configs(m, 4096, 4096), linear_k_warps_gluon.LAYOUTS, (False, True)
        ):
            for epilogue in _epilogues(cfg, m):
                consts = {"HAS_BIAS": False, "LAYOUT": layout, "PDL": pdl} | epilogue | cfg
                fn = linear_k_warps_gluon.nvfp4_linear_k_warps_gluon_kernel
                warps = cfg["K_WARPS"] * cfg["ROW_WARPS"]
                yield from unique(
                    Build("linear_k_warps_gluon", fn, _with_constexprs(_K_WARPS_SIG, consts), consts, warps, 1)
                )
        for cfg, layout in product(linear_wgmma_gluon.configs(m, 4096, 4096), linear_wgmma_gluon.LAYOUTS):
            for fold in _folds(cfg):
                sig, consts = _split_build(
                    _RING_SIG,
                    {"HAS_BIAS": False, "LAYOUT": layout, "PDL": linear_wgmma_gluon.PDL_CHAIN, "FOLD": fold}
                    | cfg
                    | _one_token(m),
                    cfg.get("SPLIT_K", 1),
                )
                fn = linear_wgmma_gluon.nvfp4_linear_wgmma_gluon_kernel
                yield from unique(Build("linear_wgmma_gluon", fn, sig, consts, cfg["WARPS"], 1, (90,)))
        ws_settings = product(
            linear_wgmma_ws_gluon.configs(m, 4096, 4096), linear_wgmma_ws_gluon.LAYOUTS, (False, True)
        )
        for cfg, layout, pdl in ws_settings:  # PDL both ways: its chain is a probe (``PDL_CHAIN``)
            tile = {k: cfg[k] for k in ("BLOCK_M", "WARPS", "STAGES")}
            consts = {"HAS_BIAS": False, "LAYOUT": layout, "PDL": pdl} | tile
            signature = _ws_signature(linear_wgmma_ws_gluon, cfg["BLOCK_M"], cfg["WARPS"])  # _split_build copies it
            sig, consts = _split_build(signature, consts, cfg.get("SPLIT_K", 1))
            fn, cap = linear_wgmma_ws_gluon.nvfp4_linear_wgmma_ws_gluon_kernel, linear_wgmma_ws_gluon.registers(cfg)
            yield from unique(Build("linear_wgmma_ws_gluon", fn, sig, consts, cfg["WARPS"], 1, (90,), cap))
        for cfg, layout, pdl in product(
            linear_mma_ws_gluon.tile_configs(m, 4096, 4096), linear_mma_ws_gluon.LAYOUTS, (False, True)
        ):
            tile = {k: cfg[k] for k in ("BLOCK_M", "WARPS", "STAGES")} | {"CHUNKS": cfg.get("CHUNKS", 1)}
            consts = {"HAS_BIAS": False, "LAYOUT": layout, "PDL": pdl} | tile | _one_token(m)
            signature = _ws_signature(linear_mma_ws_gluon, cfg["BLOCK_M"], cfg["WARPS"], tile["CHUNKS"])
            sig, consts = _split_build(signature, consts, cfg.get("SPLIT_K", 1))
            fn, cap = linear_mma_ws_gluon.nvfp4_linear_mma_ws_gluon_kernel, linear_mma_ws_gluon.registers(cfg)
            yield from unique(Build("linear_mma_ws_gluon", fn, sig, consts, cfg["WARPS"], 1, maxnreg=cap))
    for layout, pdl in product(linear_wgmma_gluon.LAYOUTS, (False, True)):
        consts = {"ROWS": permute_steps.ROWS, "V": permute_steps.V, "LAYOUT": layout, "PDL": pdl}
        fn = permute_steps.permute_steps_kernel
        yield from unique(Build("permute_steps", fn, _with_constexprs(_PERMUTE_SIG, consts), consts, 4, 1, (90,)))
    for t in _TOKENS:
        for cfg in moe_fused.configs(t, 768, 2048):
            for weight_bf16, even_k in product((False, True), (True, False)):
                consts = {"WEIGHT_BF16": weight_bf16, "USE_PRMT": True, "EVEN_K": even_k, "INTERPRETED": False}
                consts |= {"E_POW2": 128} | {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
                sig = _with_constexprs(_GATE_UP_SIG, consts)
                fn = moe_fused.moe_gate_up_kernel
                yield from unique(Build("moe_gate_up", fn, sig, consts, cfg["num_warps"], cfg["num_stages"]))
                consts = {"WEIGHT_BF16": weight_bf16, "USE_PRMT": True, "EVEN_K": even_k}
                consts |= {"BLOCK_N": cfg["DOWN_BLOCK_N"], "BLOCK_K": cfg["DOWN_BLOCK_K"]}
                sig = _with_constexprs(_DOWN_SIG, consts)
                yield from unique(Build("moe_down", moe_fused.moe_down_kernel, sig, consts, cfg["down_num_warps"], 1))
            consts = {"E_POW2": 128, "BLOCK_PAIRS": moe_fused.GROUP_PAIRS, "BLOCK_M": cfg["BLOCK_M"]}
            yield from unique(
                Build(
                    "moe_group",
                    moe_fused.moe_group_kernel,
                    _with_constexprs(_GROUP_SIG, consts),
                    consts,
                    moe_fused.GROUP_WARPS,
                    1,
                )
            )
    for (has_scale, has_bias, silu_mul), block, pdl in product(
        ((True, False, False), (True, True, False), (False, False, False), (True, False, True)),
        linear_mma.REDUCE_BLOCKS,
        (False, True),
    ):
        consts = {"SPLIT_K": 4, "HAS_SCALE": has_scale, "HAS_BIAS": has_bias, "BLOCK": block, "PDL": pdl}
        consts |= {"SILU_MUL": silu_mul}
        fn = linear_mma.splitk_reduce_kernel
        yield from unique(Build("splitk_reduce", fn, _with_constexprs(_SPLITK_REDUCE_SIG, consts), consts, 4, 1))
    for group in (
        4,
        8,
        16,
    ):  # the norm's halves after a projection without the epilogue (``linear_mma_gluon.norm_group``)
        consts = {"GROUP": group, "BLOCK": add_norm_after.BLOCK}
        fn = add_norm_after.add_norm_kernel
        yield from unique(Build("add_norm_after", fn, _with_constexprs(_ADD_NORM_SIG, consts), consts, 4, 1))
        for has_bias, silu_mul in ((False, False), (True, False), (False, True)):
            consts = {"GROUP": group, "HAS_BIAS": has_bias, "SILU_MUL": silu_mul, "BLOCK": norm_scale_after.BLOCK}
            consts |= {"GROUPS_BLOCK": norm_scale_after.GROUPS_BLOCK}
            fn = norm_scale_after.norm_scale_kernel
            sig = _with_constexprs(_NORM_SCALE_SIG, consts)
            yield from unique(Build("norm_scale_after", fn, sig, consts, 4, 1))
    dequants = linear_dequant.configs(linear_dequant.MIN_ROWS, 4096, 4096)
    for cfg, even_k, layout in product(dequants, (True, False), linear_dequant.LAYOUTS):
        consts = {"USE_PRMT": True, "EVEN_K": even_k, "LAYOUT": layout} | {k: cfg[k] for k in ("BLOCK_N", "BLOCK_K")}
        fn = linear_dequant.nvfp4_dequant_kernel
        yield from unique(Build("dequant", fn, _with_constexprs(_DEQUANT_SIG, consts), consts, cfg["num_warps"], 1))
    for cfg, even_k in product(linear_w4a4.configs(1, 4096, 4096), (True, False)):
        consts = {"HAS_BIAS": False, "EVEN_K": even_k, "INTERPRETED": False}
        consts |= {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
        fn = linear_w4a4.nvfp4_linear_w4a4_kernel
        sig = _with_constexprs(_W4A4_SIG, consts)
        yield from unique(Build("linear_w4a4", fn, sig, consts, cfg["num_warps"], cfg["num_stages"]))
    for t in _TOKENS:
        for cfg, even_k in product(moe_gemv_gluon.configs(t, 768, 2048), (True, False)):
            warps = cfg["WARPS_N"] * cfg["WARPS_K"]
            consts = {"X_FP16": False, "EVEN_K": even_k} | cfg
            fn = moe_gemv_gluon.moe_gate_up_gemv_kernel
            sig = _with_constexprs(_MOE_GATE_UP_GEMV_SIG, consts)
            yield from unique(Build("moe_gate_up_gemv", fn, sig, consts, warps, 1))
            consts = {"EVEN_K": even_k} | cfg
            fn = moe_gemv_gluon.moe_down_gemv_kernel
            yield from unique(
                Build("moe_down_gemv", fn, _with_constexprs(_MOE_DOWN_GEMV_SIG, consts), consts, warps, 1)
            )
    for t in _TOKENS:
        ring = moe_ring_gluon.configs(t, 768, 2048) + moe_ring_gluon.configs(t, 48, 2048)  # walk, GEMV downs
        for cfg, layout in product(ring, moe_ring_gluon.LAYOUTS):
            block_m = moe_ring_gluon.GROUP_TILE if cfg["GROUPED"] else 1
            ring_down = "DOWN_WARPS" in cfg
            if layout and not ring_down:
                continue  # the GEMV down reads the checkpoint's layout
            consts = {"BLOCK_M": block_m, "E_POW2": 128, "WARPS": cfg["WARPS"], "STAGES": cfg["STAGES"]}
            consts |= {"FOLD_DOWN": ring_down, "CHUNKS": cfg.get("CHUNKS", 1), "LAYOUT": layout}
            for pdl in (False, True) if ring_down else (False,):  # the gate_up lets a PDL ring down start
                for waits in (False, True):  # launched with PDL itself (PDL_GATE_UP)
                    gate_up = consts | {"TRIGGER": pdl, "PDL": waits}
                    fn = moe_ring_gluon.moe_gate_up_ring_kernel
                    sig = _with_constexprs(_MOE_GATE_UP_RING_SIG, gate_up)
                    yield from unique(Build("moe_gate_up_ring", fn, sig, gate_up, cfg["WARPS"], 1))
                stages = moe_ring_gluon.down_stages(cfg)
                if "DOWN_SLOTS" in cfg:
                    down = {"SLOTS": 8, "WARPS": cfg["DOWN_WARPS"], "STAGES": stages, "LAYOUT": layout}
                    down |= {"PDL": pdl, "ROW_TILES": cfg.get("DOWN_ROW_TILES", 1)}
                    fn = moe_ring_gluon.moe_down_slots_ring_kernel
                    sig = _with_constexprs(_MOE_DOWN_SLOTS_RING_SIG, down)
                    yield from unique(Build("moe_down_slots_ring", fn, sig, down, cfg["DOWN_WARPS"], 1))
                elif "DOWN_GROUPED" in cfg:
                    down = {"BLOCK_M": moe_ring_gluon.GROUP_TILE, "E_POW2": 128, "WARPS": cfg["DOWN_WARPS"]}
                    down |= {"STAGES": stages, "LAYOUT": layout, "PDL": pdl}
                    fn = moe_ring_gluon.moe_down_grouped_ring_kernel
                    sig = _with_constexprs(_MOE_DOWN_GROUPED_RING_SIG, down)
                    yield from unique(Build("moe_down_grouped_ring", fn, sig, down, cfg["DOWN_WARPS"], 1))
                elif ring_down:
                    down = {
                        "TOP_K_POW2": 8,
                        "EXPERT_STEPS": 768 // linear_mma_gluon.BLOCK_K,
                        "WARPS": cfg["DOWN_WARPS"],
                    }
                    down |= {"STAGES": stages, "LAYOUT": layout, "PDL": pdl}
                    sig, down = _split_build(_MOE_DOWN_RING_SIG, down, cfg["DOWN_SPLIT"])
                    fn = moe_ring_gluon.moe_down_ring_kernel
                    yield from unique(Build("moe_down_ring", fn, sig, down, cfg["DOWN_WARPS"], 1))
    for t in _TOKENS:
        for cfg, even_k in product(moe_w4a4.configs(t, 768, 2048), (True, False)):
            common = {"EVEN_K": even_k, "INTERPRETED": False, "E_POW2": 128, "BLOCK_M": cfg["BLOCK_M"]}
            consts = common | {"BLOCK_N": cfg["BLOCK_N"], "BLOCK_K": cfg["BLOCK_K"]}
            fn = moe_w4a4.moe_gate_up_w4a4_kernel
            sig = _with_constexprs(_MOE_GATE_UP_W4A4_SIG, consts)
            yield from unique(Build("moe_gate_up_w4a4", fn, sig, consts, cfg["num_warps"], cfg["num_stages"]))
            consts = common | {"BLOCK_N": cfg["DOWN_BLOCK_N"], "BLOCK_K": cfg["DOWN_BLOCK_K"]}
            fn = moe_w4a4.moe_down_w4a4_kernel
            sig = _with_constexprs(_MOE_DOWN_W4A4_SIG, consts)
            yield from unique(Build("moe_down_w4a4", fn, sig, consts, cfg["num_warps"], cfg["num_stages"]))
    consts = {"BLOCK": moe_w4a4.REDUCE_BLOCK}
    fn = moe_w4a4.moe_reduce_kernel
    yield from unique(Build("moe_reduce", fn, _with_constexprs(_MOE_REDUCE_SIG, consts), consts, 4, 1))
    consts = {"BLOCK_GROUPS": quantizer.ROW_GROUPS}
    fn = quantizer.quantize_rows_kernel
    yield from unique(Build("quantize_rows", fn, _with_constexprs(_QUANT_ROWS_SIG, consts), consts, 4, 1))
    consts = {"BLOCK_ROWS": 16, "BLOCK_GROUPS": 16}
    yield from unique(Build("quantize", quantizer.quantize_kernel, _with_constexprs(_QUANT_SIG, consts), consts, 4, 1))
    consts = {"BLOCK": quantizer.AMAX_BLOCK}
    yield from unique(
        Build(
            "amax",
            quantizer.amax_kernel,
            {"w_ptr": "*bf16", "amax_ptr": "*fp32", "numel": "i32", "BLOCK": "constexpr"},
            consts,
            8,
            1,
        )
    )
    yield from _attention_builds()


def _attention_builds() -> Iterator[Build]:
    """The benchmark's decode attention at each of its tiles and the e2e's head sizes (128; 256,
    Qwen3.5's, on the narrow tile), split (partials for the merge) or whole (the output itself,
    bf16), with PDL as both e2e arms launch it, and its merge."""
    from flashrt.bench import decode_attention

    narrow, wide = decode_attention.NARROW, decode_attention.WIDE
    for (tile, dim), whole in product(
        ((narrow, 128), (narrow, 256), (wide, decode_attention.WIDE_MAX_DIM)), (False, True)
    ):
        consts = {"SPLIT_L": 2 * tile.keys, "BLOCK_L": tile.keys, "G_POW2": 16, "D_POW2": dim, "UPCAST": False}
        consts |= {"WHOLE": whole, "PDL": True}
        outputs = {f"{name}_ptr": "*bf16" for name in ("partial", "max", "sum")} if whole else {}
        sig = _with_constexprs(_ATTENTION_SIG | outputs, consts)
        fn = decode_attention.decode_attention_kernel
        yield Build("decode_attention", fn, sig, consts, tile.warps, tile.stages)
    consts = {"SPLITS_POW2": 16, "D_POW2": 256, "PDL": True}
    fn = decode_attention.merge_splits_kernel
    yield Build("merge_splits", fn, _with_constexprs(_MERGE_SIG, consts), consts, 4, 1)


def _settings(b: Build) -> set[tuple]:
    """Each single setting of a build and each two of them together."""
    single = [*sorted(b.constexprs.items()), ("num_warps", b.num_warps), ("num_stages", b.num_stages)]
    single += [("maxnreg", b.maxnreg)] if b.maxnreg else []
    return {(s,) for s in single} | set(combinations(single, 2))


def pairwise(all_builds: Iterator[Build]) -> list[Build]:
    """A pairwise covering of each kernel's builds: any two settings that some build of a kernel
    combines (``BLOCK_M=128`` with ``num_warps=8``, ``EVEN_K=False`` with ``SPLIT_K=2``) are
    combined in a chosen build, picked greedily, in ``builds()`` order on ties. A compile
    failure that takes one setting, or two together, is caught; one that takes three is not."""
    by_kernel: dict[str, list[tuple[Build, set[tuple]]]] = {}
    for b in all_builds:
        by_kernel.setdefault(b.name, []).append((b, _settings(b)))
    chosen = []
    for group in by_kernel.values():
        uncovered = set().union(*(settings for _, settings in group))
        while uncovered:
            best, settings = max(group, key=lambda entry: len(entry[1] & uncovered))
            chosen.append(best)
            uncovered -= settings
    return chosen


def compile_for(build: Build, arch: int, **options):
    """The compiled kernel (``.asm['cubin']``, ``.asm['ptx']``) for ``sm_<arch>``; ``options``
    Triton's besides the build's own (``ir_override``: from an edited PTX, as a probe launches it)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    # What a launch on real shapes specializes: pointers and every integer argument divisible by
    # 16 (strides, N and K of real layers); without it loads would not vectorize as they do.
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, (name, kind) in enumerate(build.signature.items())
        if kind != "constexpr" and (kind.startswith("*") or name in _ALIGNED_INTS)
    }
    source = GluonASTSource if isinstance(build.fn, GluonJITFunction) else triton.compiler.ASTSource
    src = source(fn=build.fn, signature=build.signature, constexprs=build.constexprs, attrs=aligned)
    return triton.compile(
        src,
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": build.num_warps, "num_stages": build.num_stages}
        | ({"maxnreg": build.maxnreg} if build.maxnreg else {})
        | options,
    )


_BUILDS: list[Build] = []  # what forked build workers index into


def _build_one(job: tuple[int, int]) -> str | None:
    """Compile build ``index`` for ``sm_<arch>``; the failure in one line, or None."""
    index, arch = job
    b = _BUILDS[index]
    try:
        if not compile_for(b, arch).asm["cubin"]:
            raise RuntimeError("empty cubin")
    except Exception as exc:
        return f"sm_{arch} {b.name} {b.constexprs} warps={b.num_warps}: {type(exc).__name__}: {str(exc)[-400:]}"
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m flashrt.kernels.build [--pairwise] [--gluon] [ARCH ...]``: build everything (or
    the pairwise covering; or only the Gluon kernels, whose API moves between Triton releases) on
    every core (ptxas is single-threaded), print the Triton it builds with and each failure."""
    import multiprocessing
    import os
    import sys

    import triton
    from triton.experimental.gluon._runtime import GluonJITFunction

    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter does not compile")
        return 2
    args = list(argv if argv is not None else sys.argv[1:])
    flags = {"--pairwise", "--gluon"}
    archs = [int(a) for a in args if a not in flags] or list(TARGETS)
    _BUILDS[:] = pairwise(builds()) if "--pairwise" in args else list(builds())
    if "--gluon" in args:
        _BUILDS[:] = [b for b in _BUILDS if isinstance(b.fn, GluonJITFunction)]
    print(f"triton {triton.__version__} ({os.path.dirname(triton.__file__)})", flush=True)
    failures = 0
    with multiprocessing.get_context("fork").Pool(os.cpu_count() or 1) as pool:
        for arch in archs:
            jobs = [(i, arch) for i, b in enumerate(_BUILDS) if arch in b.targets]
            errors = [e for e in pool.map(_build_one, jobs) if e]
            failures += len(errors)
            for error in errors:
                print(error)
            print(f"sm_{arch}: {len(jobs)} builds")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
