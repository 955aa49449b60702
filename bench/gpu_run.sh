#!/usr/bin/env bash
# One call on a GPU machine with torch and Triton but no flashrt installed: the GPU test suite,
# then one benchmark. Usage: bench/gpu_run.sh OUTDIR [kernels|e2e|prefill|seats|host] [bench args...]
# (default: kernels), or bench/gpu_run.sh OUTDIR probe NAME [args...]: bench/NAME.py writing
# OUTDIR/NAME.json, killed at PROBE_TIMEOUT_S (default 540; a kernel waiting on an mbarrier that
# never completes hangs the GPU) with what it wrote so far kept.
# SKIP_GPU_TESTS=1 skips the tests (a second benchmark in the same call; not FLASHRT_: the runtime
# rejects FLASHRT_ variables it does not know). GPU_TESTS_K picks tests as pytest's -k: the whole
# GPU suite took 525 s at a49877c, most of a ten-minute call.
# Wheels under .whl/ (what the machine lacks, e.g. flash-linear-attention for Qwen3.5) are put on
# PYTHONPATH first.
# RUN_NAME names a benchmark's result and log under OUTDIR (default: the benchmark's name), so
# two runs of one benchmark in a call keep both.
# Set FLASHRT_COMMIT to the commit sent: a copied tree's git may name another.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: bench/gpu_run.sh OUTDIR [kernels|e2e|prefill|seats|host|probe NAME] [args]}; shift
mkdir -p "$out"
bench=kernels
case "${1:-}" in kernels|e2e|prefill|seats|host|probe) bench=$1; shift ;; esac
site=$(mktemp -d)
mkdir -p "$site/flashrt"
cp "$root"/src/*.py "$site/flashrt/"
for part in kernels runtime operator bench; do ln -s "$root/$part" "$site/flashrt/$part"; done
wheels=
if compgen -G "$root/.whl/*.whl" >/dev/null; then
  wheels="$site/wheels"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$wheels" "$root"/.whl/*.whl
fi
export PYTHONPATH="$site${wheels:+:$wheels}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Kernel choices: the package serves those shipped in kernels/choices/ (the H200's and the H100's,
# committed from earlier calls), so a fresh machine does not spend minutes of its lease re-timing
# every shape (a cold Qwen3-30B batch-1 run took 443 s, 58 s of it attach). They are copied into
# the cache, written under OUTDIR, so that it holds them with the run's new ones, to be committed
# back into kernels/choices/.
if [ -z "${FLASHRT_CACHE_DIR:-}" ]; then
  export FLASHRT_CACHE_DIR="$out/tune"
  mkdir -p "$FLASHRT_CACHE_DIR" && cp "$root"/kernels/choices/*.json "$FLASHRT_CACHE_DIR"/ 2>/dev/null
fi
TUNING_SHAPES_AT_START=$(python3 -c 'import glob, json, sys
print(sum(len(json.load(open(p))) for p in glob.glob(sys.argv[1] + "/tuning-*.json")))' "$FLASHRT_CACHE_DIR")
export TUNING_SHAPES_AT_START
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/nvidia-smi.txt"
# The test files whose tests take the GPU where there is one (the ``device`` fixture, ``ON_GPU``).
# The log is written as the tests run: a call cut at its limit still brings back what ran.
[ "${SKIP_GPU_TESTS:-0}" = 1 ] || (cd "$root" && python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_bench.py \
  ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} 2>&1) | tee "$out/gpu-tests.log"
if [ "$bench" = probe ]; then
  name=${1:?usage: bench/gpu_run.sh OUTDIR probe NAME [args]}; shift
  timeout "${PROBE_TIMEOUT_S:-540}" python3 -m "flashrt.bench.$name" "$out/$name.json" "$@" 2>&1 | tee "$out/$name.log"
else
  name=${RUN_NAME:-$bench}
  python3 -m flashrt.bench "$bench" --out "$out/$name.json" "$@" 2>&1 | tee "$out/$name.log"
fi
