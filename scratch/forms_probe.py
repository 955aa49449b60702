"""Every linear form's best time against mma_gluon with 8 words a thread, same run (scratch)."""
import json, os, time
import torch
from flashrt.kernels import quantize, linear_mma_gluon as mg
from flashrt.kernels.ops import LINEAR_FORMS, _time_us, linear_candidates

start = time.time()
rows = []
for name, (n, k) in {"gate_up": (28672, 4096), "qkv": (6144, 4096), "down": (4096, 14336)}.items():
    torch.manual_seed(0)
    w = quantize((torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16))
    for m in (2, 4, 8):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        cands = [(c.form, c.params) for c in linear_candidates(m, n, k, (9, 0)) if c.form != "dequant"]
        cands += [("mma_gluon_v8", {"BLOCK_M": 8, "ROW_TILES": t, "WARPS": wp, "WORDS_PER_THREAD": 8})
                  for t in (1, 2) for wp in (4, 8)]
        best = {}
        for form, cfg in cands:
            mod = mg if form == "mma_gluon_v8" else LINEAR_FORMS[form]
            try:
                us = _time_us(lambda: mod.launch(x, w.packed, w.scales, w.global_scale, None, out, cfg, True))
            except Exception as exc:
                continue
            rows.append({"shape": name, "M": m, "form": form, **cfg, "us": us})
            if form not in best or us < best[form][0]:
                best[form] = (us, cfg)
        print(f"{time.time()-start:5.0f}s", name, m, {f: round(b[0], 1) for f, b in sorted(best.items(), key=lambda kv: kv[1][0])}, flush=True)
        json.dump(rows, open(os.path.join(os.environ["OUT"], "forms_probe.json"), "w"), indent=1)
