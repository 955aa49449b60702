"""mma_gluon with 8 words a thread (32-byte steps) against 4, decode token counts (scratch)."""
import itertools, json, os, sys
import torch
from flashrt.kernels import quantize, linear_mma_gluon as mg
from flashrt.kernels.ops import _time_us, linear_reference

shapes = {"gate_up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096)}
rows = []
for name, (n, k) in shapes.items():
    torch.manual_seed(0)
    w = quantize((torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16))
    for m in (2, 4, 8, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = linear_reference(x, w).float()
        best = {}
        for bm, tiles, warps, v in itertools.product((8, 16), (1, 2), (4, 8), (4, 8)):
            if bm > 8 and m <= 8 and bm != 16:
                continue
            cfg = {"BLOCK_M": bm, "ROW_TILES": tiles, "WARPS": warps, "WORDS_PER_THREAD": v}
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            try:
                mg.launch(x, w.packed, w.scales, w.global_scale, None, out, cfg, True)
                torch.cuda.synchronize()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                us = _time_us(lambda: mg.launch(x, w.packed, w.scales, w.global_scale, None, out, cfg, True))
            except Exception as exc:
                print(name, m, cfg, "FAILED", repr(exc)[:300], flush=True)
                continue
            rows.append({"shape": name, "M": m, **cfg, "us": us, "rel_err": err})
            if v not in best or us < best[v][0]:
                best[v] = (us, cfg, err)
        print(name, m, {v: (round(b[0], 1), b[1], f"{b[2]:.1e}") for v, b in sorted(best.items())}, flush=True)
json.dump(rows, open(os.path.join(os.environ["OUT"], "v8_probe.json"), "w"), indent=1)
