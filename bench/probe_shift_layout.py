"""Does ``ring_layout``'s left-shift placement pay? The ring form as served, in whichever layout the tree has.

``ring_layout`` placed each pair's bits by rotations until session 56 (11 integer-pipe
instructions a word, 205 a one-token step) and now by left shifts that ptxas makes ``IMAD.SHL``
(7 a word, 133 a step, 338 instructions in all against 337; ``bench/probe_pipes.py``). On an
H100 (``h100-probe-shift-layout-9c3aada-658570b.json``) the shifts ran 0.5-0.9% faster in the
geometric mean at 1, 8 and 16 tokens, inside one tree's run-to-run spread. A layout is a
bit permutation inside each word, so this probe has no arms: it times the ring form in the
config the tuning cache serves, for Llama-3-8B's four layers, the LM head and Qwen3-30B's
attention projections at 1, 8 and 16 tokens (``probe_decode_cost.time_ring_arms``, each
checked against the reference; the read-only floor at one token), and runs the same in two trees
on one machine, the commit before the change and after, alternated: their rows compare.

``python3 bench/probe_shift_layout.py OUT.json`` with flashrt importable (``bench/gpu_run.sh``).
"""

from __future__ import annotations

import sys

TOKENS = (1, 8, 16)


def main(path: str) -> None:
    from flashrt.bench.probe_decode_cost import SHAPES as LLAMA_SHAPES
    from flashrt.bench.probe_decode_cost import time_ring_arms
    from flashrt.bench.probe_tma_ring import SHAPES as QWEN_SHAPES

    time_ring_arms(path, lambda config, operands: {}, TOKENS, None, LLAMA_SHAPES | QWEN_SHAPES)


if __name__ == "__main__":
    main(sys.argv[1])
