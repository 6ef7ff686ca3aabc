#!/usr/bin/env bash
# The sequence generator at MIMIC scale: a simulated cohort (default 10^5 patients, about
# 2.7·10^6 rows) partitioned by patient and trained for a fixed number of DP-SGD rounds by
# 1, 2 and 4 worker processes — `rhosynth serve --dev` and `rhosynth-worker`s over real
# sockets, the Kubernetes shape on one machine. Prints rounds/s and the peak RSS (VmHWM)
# of the coordinator and of each worker.
#   cargo build --release --bins && bench/sequence_scale.sh [PATIENTS] [ROUNDS] [PARTITIONS]
# RHOSYNTH_BIN names another folder of binaries (e.g. target/debug for a test-profile
# build).
set -euo pipefail
patients=${1:-100000}
rounds=${2:-20}
partitions=${3:-8}
bin=$(cd "${RHOSYNTH_BIN:-$(dirname "$0")/../target/release}" && pwd)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
"$bin/rhosynth" simulate --patients "$patients" "$work/cohort.csv"
echo "rows: $(($(wc -l < "$work/cohort.csv") - 1))"
# A fixed number of rounds: epochs = rounds · q with q = batch / N (N̂ ≈ N).
epochs=$(python3 -c "print($rounds * 256 / $patients)")
sed -e "s|./rhosynth-out/demo/input/icu_vitals.csv|$work/cohort.csv|" \
    -e "s|^partitions = 4|partitions = $partitions|" \
    -e "s|^epochs = 12|epochs = $epochs|" \
    -e "s|^ledger = \"./rhosynth-out/ledger\"|ledger = \"$work/ledger\"|" \
    -e "s|^url = \"./rhosynth-out/icu-sequence\"|url = \"$work/out/{job_id}\"\nunits = 100|" \
    -e '/^\[evaluation\]/,$d' -e '/^reference = /d' -e '/^pretrain_steps = /d' \
    "$(dirname "$0")/../examples/icu-sequence.toml" > "$work/job.toml"

source "$(dirname "$0")/cluster.sh"
for workers in 1 2 4; do
  start_cluster "$workers"
  start=$(date +%s.%N)
  "$bin/rhosynth" submit "$work/job.toml" --coordinator "http://127.0.0.1:$port" > /dev/null 2> "$work/submit-$workers.log"
  end=$(date +%s.%N)
  # Rounds per second between the first and the last progress line of the run.
  rate=$(grep -o '[0-9T:.-]*Z .*DP-SGD progress round=[0-9]*' "$work/coordinator-$workers.log" | python3 -c '
import sys, datetime
lines = [l.split() for l in sys.stdin]
t = lambda s: datetime.datetime.fromisoformat(s.rstrip("Z")[:26])
(a, b) = (lines[0], lines[-1])
r = lambda l: int(l[-1].split("=")[1])
print(f"{(r(b) - r(a)) / (t(b[0]) - t(a[0])).total_seconds():.2f}")')
  echo "workers=$workers job=$(python3 -c "print(round($end - $start))")s rounds/s=$rate coordinator=$(hwm $coordinator)" \
    "workers=[$(for p in "${pids[@]}"; do printf '%s ' "$(hwm "$p")"; done)]"
  stop_cluster
done
