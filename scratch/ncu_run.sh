#!/usr/bin/env bash
# Nsight Compute on one launch of each decode form (scratch, not committed).
set -u
site=$(mktemp -d); mkdir -p $site/flashrt; cp src/*.py $site/flashrt/
for p in kernels runtime operator bench; do ln -s $PWD/$p $site/flashrt/$p; done
export PYTHONPATH=$site PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}" | tee $OUT/ncu.txt
python3 scratch/ncu_probe.py 2>&1 | tee -a $OUT/ncu.txt   # warms Triton's cache
[ -z "$NCU" ] && exit 0
for k in nvfp4_linear_gemv_gluon_kernel nvfp4_linear_mma_gluon_kernel nvfp4_linear_mma_kernel; do
  timeout 100 $NCU --kernel-name $k --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --section Occupancy --section LaunchStats \
    python3 scratch/ncu_probe.py > $OUT/ncu_$k.txt 2>&1
  echo "$k rc=$?" | tee -a $OUT/ncu.txt
done
