#!/usr/bin/env bash
# The first step's costs at the 0.6B shape (issue 16 item 4), on the GPU machine with the
# packed binaries on PATH (`source .gpu/env.sh`): three fresh 2-step jobs through
# tools/first_step.py, then one table of start-up to the end of step 1, each step's
# time/handoff and time/rollout, the start-up handoff inside step 1's time/handoff
# (time/handoff - handoff/seconds), the decode sizes' first-use time (graph captures)
# and the host buffers the handoffs allocated themselves. About a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${FIRST_STEP_DIR:-/tmp/fs}
mkdir -p "$out"
for n in 1 2 3; do
  rm -rf "$out/fs$n"
  python3 tools/first_step.py "$out/fs$n.log" "$out/fs$n/run.h5" -- \
    tandem inputs/qwen3-0.6b-shape.deck --run.steps=2 --run.checkpoint-every=0 --run.restart=never \
    --run.output-dir="$out" --run.name="fs$n" | tee "$out/fs$n.txt"
done
python3 - "$out" <<'PY'
import re, sys
import h5py
out = sys.argv[1]
print("\nrun | start-up to step 1 (s) | step 1 handoff / rollout (s) | step 2 handoff / rollout (s)"
      " | start-up handoff in step 1 (s) | graph set-up step 1 / 2 (s) | offload host allocations")
for n in (1, 2, 3):
    text = open(f"{out}/fs{n}.txt").read()
    first = re.search(r"start-up to the end of step 1 ([0-9.]+)", text).group(1)
    with h5py.File(f"{out}/fs{n}/run.h5", "r") as f:
        m = f["metrics"]
        get = lambda key, i: float(m[key][i]) if key in m else float("nan")
        handoff, rollout = [get("time/handoff", i) for i in (0, 1)], [get("time/rollout", i) for i in (0, 1)]
        startup_handoff = handoff[0] - get("handoff/seconds", 0)
        graphs = [get("rollout/graph_setup_seconds", i) for i in (0, 1)]
        allocations = get("memory/offload_host_allocations", 1)
    print(f"fs{n} | {float(first):.2f} | {handoff[0]:.3f} / {rollout[0]:.3f} | {handoff[1]:.3f} / {rollout[1]:.3f}"
          f" | {startup_handoff:.3f} | {graphs[0]:.3f} / {graphs[1]:.3f} | {allocations:.0f}")
PY
