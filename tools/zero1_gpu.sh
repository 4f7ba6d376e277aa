#!/bin/sh
# ZeRO-1 on N GPUs of one node (issue 17): the NCCL collectives and the sharded CUDA
# trainer against the whole one (gpu_tests), the collectives' bus bandwidth, and the
# 0.6B-shape GRPO step with train.shard-optimizer = false and true: per-rank memory of the
# master weights and optimizer state, the train phase's pool peak and its time.
#
#   tools/zero1_gpu.sh [N=2] [BUILD=build]
set -e
N=${1:-2}
BUILD=${2:-build}
MPIRUN="mpirun --oversubscribe -np $N"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
$MPIRUN "$BUILD/tests/gpu_tests" --gtest_filter='Zero1Gpu.*'
$MPIRUN "$BUILD/bench_allreduce" --repeat 10
for shard in false true; do
  $MPIRUN "$BUILD/tandem" inputs/qwen3-0.6b-shape.deck --run.name=zero1-np$N-$shard \
    --train.shard-optimizer=$shard > /dev/null
  echo "== $N GPUs, train.shard-optimizer = $shard (rank 0; steps 2-4)"
  "$BUILD/tandem" inspect runs/zero1-np$N-$shard/run.h5 --csv --last 3 --metrics \
    time/train,time/optimizer_step,train_tokens_per_s,memory/master_weights/device_peak,memory/optimizer/device_peak,memory/phase/train/device_pool_peak,memory/device_peak
done
