#!/usr/bin/env bash
# One call on a GPU machine with torch and Triton but no flashrt installed: the GPU test suite,
# then the benchmark. Usage: bench/gpu_run.sh OUTDIR [bench args...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: bench/gpu_run.sh OUTDIR [bench args]}; shift
site=$(mktemp -d)
mkdir -p "$site/flashrt"
cp "$root"/src/*.py "$site/flashrt/"
for part in kernels runtime operator bench; do ln -s "$root/$part" "$site/flashrt/$part"; done
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/nvidia-smi.txt"
(cd "$root" && python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py 2>&1 | tail -40) | tee "$out/gpu-tests.log"
python3 -m flashrt.bench kernels --out "$out/h200-kernels.json" "$@" 2>&1 | tee "$out/bench.log"
