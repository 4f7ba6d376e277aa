#!/usr/bin/env bash
# Checkpoints at the disk's rate, measured on a GPU machine (tools/PERFORMANCE.md,
# "Checkpoints: large writes, off the step's critical path"):
#   1. the disk's own rate: dd of 4 GiB with oflag=direct on the rested disk, then dd of
#      a checkpoint's size (6822 MiB) three times back to back: the peer of each write in 2,
#      since a drive's sustained rate sinks after some GB written in a row;
#   2. the write path alone, after REST seconds (60) for the drive to recover: three
#      0.6B-sized checkpoints back to back;
#   3. what the step waits for: the 0.6B-shape deck, a checkpoint every 2 of 4 steps, with
#      the optimizer state on the device and on disk (its msync now on the writer's thread).
# Prints each part's figures, then a summary table. About 5 minutes on one H200.
#
#   source .gpu/env.sh && tools/checkpoint_rate.sh [DIR]    # DIR: the disk under test, /tmp
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/tmp}
rest=${REST:-60}
runs=$dir/runs
for tool in tandem bench_checkpoint dd; do
  command -v "$tool" > /dev/null || { echo "checkpoint_rate.sh: $tool is not on PATH (source .gpu/env.sh)" >&2; exit 2; }
done
mkdir -p "$runs"

# A figure in GB/s from "<number> <unit>/s".
gb_per_s() { awk -v n="$1" -v unit="$2" 'BEGIN { f = unit ~ /^GB/ ? 1 : unit ~ /^MB/ ? 1e-3 : unit ~ /^kB/ ? 1e-6 : 0; printf "%.2f", n * f }'; }

# dd's rate in GB/s: disk_rate MIB (dd's own line goes to stderr)
disk_rate() {
  local line number unit
  line=$(dd if=/dev/zero of="$dir/checkpoint_rate.dd" bs=1M count="$1" oflag=direct 2>&1 | tail -1)
  rm -f "$dir/checkpoint_rate.dd"
  echo "$line" >&2
  read -r number unit <<< "$(awk '{ print $(NF-1), $NF }' <<< "$line")"
  gb_per_s "$number" "$unit"
}

echo "== the disk: dd 4 GiB, oflag=direct ($dir)"
dd_rate=$(disk_rate 4096)
echo "== the disk under a checkpoint's load: dd 6822 MiB, oflag=direct, three times back to back"
dd_rates=""
for _ in 1 2 3; do dd_rates+="$(disk_rate 6822) "; done
echo "(resting $rest s)"
sleep "$rest"

echo "== the write path alone: bench_checkpoint --mib 6822 --repeat 3 --dir $dir"
bench=$(bench_checkpoint --mib 6822 --repeat 3 --dir "$dir")
echo "$bench"
bench_rates=$(awk '/^checkpoint [0-9]+:/ { printf "%s ", $(NF-1) }' <<< "$bench")

# A run of the 0.6B-shape deck, then its checkpoint metrics: name, extra keys, metrics.
run() {
  local name=$1 extra=$2 metrics=$3
  rm -rf "${runs:?}/$name"
  echo "== tandem inputs/qwen3-0.6b-shape.deck --run.steps=4 --run.checkpoint-every=2 $extra --run.name=$name"
  local start=$SECONDS
  # shellcheck disable=SC2086  # $extra is a list of options
  if ! tandem inputs/qwen3-0.6b-shape.deck --run.steps=4 --run.checkpoint-every=2 --run.output-dir="$runs" \
      --run.name="$name" $extra > "$runs/$name.out" 2>&1; then
    tail -30 "$runs/$name.out"
    exit 1
  fi
  echo "($((SECONDS - start)) s)"
  tandem inspect "$runs/$name/run.h5" --csv --metrics "$metrics" | tee "$runs/$name.csv"
}
metrics=time/checkpoint,checkpoint/write_seconds,time/train
run ckpt "" "$metrics,time/step"
run ckpt-disk "--optimizer.state=disk --optimizer.state-path=$dir" "$metrics,checkpoint/state_msync_seconds,time/step"

# One run's rows: the step, what it waited for a checkpoint, its train phase, and the
# write and msync times recorded there (those of a checkpoint that ended at that step).
checkpoint_rows() {
  awk -F, -v name="$1" '
    function seconds(i) { return i == 0 || $i == "" || $i == "nan" ? "-" : sprintf("%.2f s", $i) }
    NR == 1 { for (i = 1; i <= NF; ++i) column[$i] = i; next }
    { printf "%-10s %4s  %15s  %10s  %8s  %8s\n", name, $1, seconds(column["time/checkpoint"]), seconds(column["time/train"]),
             seconds(column["checkpoint/write_seconds"]), seconds(column["checkpoint/state_msync_seconds"]) }' "$runs/$1.csv"
}

echo
echo "== summary"
echo "disk, dd oflag=direct:            $dd_rate GB/s"
echo "disk, dd 6822 MiB x 3:           ${dd_rates}GB/s"
echo -n "bench_checkpoint, writes 1 2 3:   ${bench_rates}GB/s; of dd 4 GiB:"
for rate in $bench_rates; do awk -v r="$rate" -v d="$dd_rate" 'BEGIN { printf " %.2f", (d > 0 ? r / d : 0) }'; done
echo -n "; of dd's write 1 2 3:"
paste -d' ' <(tr ' ' '\n' <<< "$bench_rates") <(tr ' ' '\n' <<< "$dd_rates") |
  awk 'NF == 2 { printf " %.2f", ($2 > 0 ? $1 / $2 : 0) }'
echo
printf "%-10s %4s  %15s  %10s  %8s  %8s\n" run step time/checkpoint time/train write msync
checkpoint_rows ckpt
checkpoint_rows ckpt-disk
