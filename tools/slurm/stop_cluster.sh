#!/bin/bash
# Stops the test cluster that tools/slurm/start_cluster.sh STATE_DIR started (munged stays).
set -uo pipefail
dir=${1:?usage: stop_cluster.sh STATE_DIR}
for daemon in slurmd slurmctld; do
  pidfile=$dir/$daemon.pid
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || continue
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$pidfile"
done
