"""Can the dequantize form's pass over the weight hide under the GEMM before it?

At 512-1024 tokens a seated projection decodes its NVFP4 weight to bf16 (0.56 bytes read, 2
written a parameter) and then runs cuBLAS on it (``kernels/linear_dequant.py``). The GEMM is
compute-bound there: Llama-3-8B's gate_up at 512 tokens took 182 us in cuBLAS, of which its 235 MB
of bf16 weight is 56 us at copy bandwidth, so HBM idles about 70% of it. The pass is what Llama's
prefill loses: 1.30x bf16 at 4 sequences of 128 tokens (e8c5967,
``bench/results/h200-e2e-llama-e8c5967-b1-32.json``), about 4.3 ms of copy-bandwidth traffic
over its 32 layers. Decoding the next projection's weight on a second stream while this one's
GEMM runs would hide it, if the two share the SMs well. The arms, on two Llama layers' four
projections (qkv, o, gate_up, down), each timed by the adjudicator's ``ops._time_us`` (one CUDA
graph, an L2 flush before each call, the flushes subtracted):

- ``bf16``: cuBLAS on the decoded weights, kept in bf16 (the baseline);
- ``serial``: ``linear_dequant.launch``, projection after projection (the form as it serves);
- ``overlap``: the first weight decoded, then each GEMM with the next weight decoded beside it
  on a second stream into the other of two buffers (the first decode is not hidden: in a model
  it would run beside the down projection of the layer before);
- ``passes``: the eight decodes alone.

``overlap`` and ``serial`` must give the same bits (same kernels, same inputs).

``python3 bench/probe_dequant_overlap.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

import json
import sys

import torch
from flashrt.bench.kernels import provenance
from flashrt.kernels import linear_dequant, nvfp4, ops

LLAMA_LAYER = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))  # qkv, o, gate_up, down
LAYERS = 2
TOKENS = (512, 1024, 2048)
PASS = {"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4}  # the config the H200's adjudicator chose


def arms(weights, bf16, xs, outs, buffers, side, use_prmt):
    """Each arm's body over the projections in order."""

    def decode(i, buffer):
        w = weights[i]
        n, k = w.shape
        return linear_dequant.dequantize_into(
            w.packed, w.scales, w.global_scale, buffer.view(-1)[: n * k].view(n, k), PASS, use_prmt
        )

    def serial():
        for w, x, out in zip(weights, xs, outs, strict=True):
            linear_dequant.launch(x, w.packed, w.scales, w.global_scale, None, out, PASS, use_prmt)

    def overlap():
        main = torch.cuda.current_stream()
        decoded = decode(0, buffers[0])
        for i, x in enumerate(xs):
            if i + 1 < len(xs):
                side.wait_stream(main)  # the other buffer's last GEMM is done
                with torch.cuda.stream(side):
                    following = decode(i + 1, buffers[(i + 1) % 2])
            torch.mm(x, decoded.t(), out=outs[i])
            if i + 1 < len(xs):
                main.wait_stream(side)
                decoded = following

    def passes():
        for i in range(len(xs)):
            decode(i, buffers[i % 2])

    def gemms():
        for i, x in enumerate(xs):
            torch.mm(x, bf16[i].t(), out=outs[i])

    return {"bf16": gemms, "serial": serial, "overlap": overlap, "passes": passes}


def main(path):
    if not torch.cuda.is_available():
        sys.exit("probe_dequant_overlap needs a CUDA GPU")
    torch.manual_seed(0)
    shapes = list(LLAMA_LAYER) * LAYERS
    weights = [nvfp4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16)) for n, k in shapes]
    bf16 = [nvfp4.dequantize(w, torch.bfloat16) for w in weights]
    largest = max(n * k for n, k in shapes)
    buffers = [torch.empty(largest, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    side = torch.cuda.Stream()
    use_prmt = ops._use_prmt(torch.device("cuda"))
    rows = []
    for m in TOKENS:
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, k in shapes]
        outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for n, _ in shapes]
        bodies = arms(weights, bf16, xs, outs, buffers, side, use_prmt)
        bodies["serial"]()
        serial = [o.clone() for o in outs]
        bodies["overlap"]()
        torch.cuda.synchronize()
        assert all(map(torch.equal, outs, serial)), "the overlapped decode changed a result"
        bodies["bf16"]()
        torch.cuda.synchronize()
        same_as_bf16 = all(map(torch.equal, outs, serial))  # nvfp4.dequantize's numbers, the same GEMM
        times = {name: ops._time_us(body, calls=4, replays=9) for name, body in bodies.items()}
        row = {"M": m, "serial_bits_as_bf16_arm": same_as_bf16, **{f"{name}_us": us for name, us in times.items()}}
        row["serial_ratio"] = times["serial"] / times["bf16"]
        row["overlap_ratio"] = times["overlap"] / times["bf16"]
        rows.append(row)
        print(
            f"M={m:5d}: bf16 {times['bf16']:8.1f}  serial {times['serial']:8.1f} (x{row['serial_ratio']:.3f})"
            f"  overlap {times['overlap']:8.1f} (x{row['overlap_ratio']:.3f})  passes {times['passes']:7.1f} us",
            flush=True,
        )
    with open(path, "w") as f:
        json.dump({**provenance(), "layer": LLAMA_LAYER, "layers": LAYERS, "pass": PASS, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
