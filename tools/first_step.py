# Runs a tandem command, notes when its first step's line is logged (start-up to step 1),
# then prints the per-step phase times from its run.h5. usage: first_step.py LOG RUN_H5 -- CMD...
import subprocess, sys, time
import h5py
log_path, run_h5 = sys.argv[1], sys.argv[2]
cmd = sys.argv[sys.argv.index("--") + 1:]
start = time.monotonic()
first = None
with open(log_path, "w") as log:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        log.write(line)
        if first is None and ("rl  1/" in line or "sft 1/" in line):
            first = time.monotonic() - start
    rc = p.wait()
total = time.monotonic() - start
print(f"{' '.join(cmd[:2])}: rc {rc}, start-up to the end of step 1 {first}, whole job {total:.2f} s")
with h5py.File(run_h5, "r") as f:
    m = f["metrics"]
    keys = [k for k in ["time/handoff", "time/rollout", "time/train", "time/checkpoint", "handoff/seconds",
                        "checkpoint/write_seconds", "rollout/tokens_per_second", "rollout/graph_setup_seconds",
                        "memory/offload_host_allocations"] if k in m]
    for i, step in enumerate(m["step"][:]):
        print(f"  step {int(step)}: " + ", ".join(f"{k} {m[k][i]:.3f}" for k in keys))
