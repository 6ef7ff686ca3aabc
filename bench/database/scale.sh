#!/usr/bin/env bash
# Database scale (issue #63): a relational cohort of PATIENTS patients (cohort.py, written
# as a stream: patients -> admissions (1-8) -> charts (3-40 an admission), a latent
# frailty across the levels) through one database job (scale.toml: caps 6 and 24, ε = 4)
# standalone (`rhosynth run`: coordinator and 2 workers in one process) and on a cluster of
# 1 and 2 worker processes (`rhosynth serve --dev` and `rhosynth-worker`s over real
# sockets). Prints per run: each stage's seconds (from the coordinator's
# log), the job's wall time, seconds per 10^4 patients, the peak RSS (VmHWM) of the
# coordinator and of each worker, the most bytes the scratch store held, and what raking
# did; then the synthetic release's rows per table.
#   cargo build --release --bins && bench/database/scale.sh [PATIENTS] [standalone|WORKERS ...]
# RHOSYNTH_BIN names another folder of binaries; KEEP=DIR keeps the cohort and the
# release there.
set -euo pipefail
patients=${1:-10000}
shift || true
[ $# -gt 0 ] && clusters=("$@") || clusters=(standalone 1 2)
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${RHOSYNTH_BIN:-$here/../../target/release}" && pwd)
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

start=$(date +%s.%N)
python3 "$here/cohort.py" --patients "$patients" --seed 1 "$work/cohort"
echo "patients: $patients ($(($(wc -l < "$work/cohort/admissions.csv") - 1)) admissions," \
  "$(($(wc -l < "$work/cohort/charts.csv") - 1)) charts; $(du -ch "$work"/cohort/*.csv | tail -1 | cut -f1))," \
  "written in $(python3 -c "print(round($(date +%s.%N) - $start))") s"

source "$here/../cluster.sh"
for workers in "${clusters[@]}"; do
  # Four partitions a worker (standalone runs two), and at least one a 12,500 patients, so
  # that a partition's rows fill about one of a worker's passes (docs/database.md).
  [ "$workers" = standalone ] && partitions=8 || partitions=$((4 * workers))
  partitions=$(( patients / 12500 > partitions ? patients / 12500 : partitions ))
  sed -e "s|COHORT|$work/cohort|g" -e "s|WORK|$work/run-$workers|g" -e "s|PARTITIONS|$partitions|" \
    "$here/scale.toml" > "$work/job-$workers.toml"
  if [ "$workers" = standalone ]; then
    # One process: its own scratch under ~/.rhosynth/jobs; peak RSS by /usr/bin/time.
    start=$(date +%s.%N)
    /usr/bin/time -f "%M" -o "$work/rss-standalone" "$bin/rhosynth" run "$work/job-$workers.toml" \
      > "$work/manifest-$workers.json" 2> "$work/coordinator-$workers.log" || { tail -5 "$work/coordinator-$workers.log"; exit 1; }
    end=$(date +%s.%N)
    coordinator_rss="$(awk '{printf "%.0f MiB", $1 / 1024}' "$work/rss-standalone") (the whole run)"
    worker_rss="in the run's process"
  else
    start_cluster "$workers"
    scratch="$work/scratch-$workers"
    watch_scratch "$scratch" "$work/scratch-most-$workers"
    start=$(date +%s.%N)
    "$bin/rhosynth" submit "$work/job-$workers.toml" --coordinator "http://127.0.0.1:$port" > "$work/manifest-$workers.json" \
      2> "$work/submit-$workers.log" || { tail -5 "$work/submit-$workers.log"; exit 1; }
    end=$(date +%s.%N)
    kill "$watcher"
    coordinator_rss=$(hwm "$coordinator")
    worker_rss=$(for p in "${pids[@]}"; do printf '%s ' "$(hwm "$p")"; done)
  fi
  stages=$(python3 "$here/stages.py" < "$work/coordinator-$workers.log")
  wall=$(python3 -c "print(round($end - $start, 1))")
  echo "workers=$workers job=${wall}s per-10^4-patients=$(python3 -c "print(round($wall / $patients * 1e4, 2))")s" \
    "coordinator=$coordinator_rss workers=[$worker_rss]" \
    "scratch=$([ -f "$work/scratch-most-$workers" ] && python3 -c "print(f'{$(cat "$work/scratch-most-$workers") / 2**20:.0f} MiB')" || echo n/a)"
  echo "  $stages" | sed 's/^/  /'
  python3 - "$work/manifest-$workers.json" <<'PY'
import json, sys
m = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("  released: " + ", ".join(f"{t['name']} {t['rows']}" for t in m["tables"]))
PY
  [ "$workers" = standalone ] || stop_cluster
done
