#!/usr/bin/env bash
# The one-shot device check, run from the bundle `bench/gpu/build.sh` packs, on a GPU node,
# within 10 minutes (CHECK_SECONDS, default 570); prints one JSON summary on stdout,
# progress on stderr, and keeps each part's JSON in CHECK_OUT (default: a private temporary
# folder) as it is done, so that a run cut short still leaves what it measured:
#   check.sh BUNDLE_DIR
# 1. `rhosynth-worker --check-gpu`: device and driver; clipped gradient sums on the GPU against the
#    CPU's (denoiser and transformer, uniform and ragged units); the DP step against the
#    non-private step on the GPU, and the GPU's DP step against the CPU's.
# 2. End to end as the GPU overlay runs: a CPU-only coordinator (it alone draws noise, from
#    its CSPRNG) and one CUDA worker (its models on the GPU), over gRPC:
#    examples/adult-findiff.toml (when the bundle has Adult), then the sequence example on
#    the simulated ICU cohort (its reference release first), each within the time left.
# On a machine without the NVIDIA driver it stops at step 1 with that error (exit 1).
set -euo pipefail
umask 077
bundle=$(cd "${1:?usage: check.sh BUNDLE_DIR}" && pwd)
deadline=$(( $(date +%s) + ${CHECK_SECONDS:-570} ))
work=$(mktemp -d)
out=${CHECK_OUT:-$work/results}
mkdir -p "$out"
pids=()
# Private data (Adult, the cohort, the diagnostics) goes with the run; only the results stay.
# A coordinator that is asked to stop finishes the evaluation it is running: killed after 5 s.
stop() {
  cp "$work"/coordinator-*.log "$work"/worker-*.log "$out/" 2>/dev/null || true
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    sleep 5
    kill -9 "${pids[@]}" 2>/dev/null || true
  fi
  find "$work" -mindepth 1 -maxdepth 1 ! -path "$out" -exec rm -rf {} +
}
trap stop EXIT
cd "$work"
for bin in rhosynth rhosynth-worker; do
  xz -dc "$bundle/$bin.xz" > "$bin" && chmod +x "$bin"
done
# libdevice (exp, log, tanh, erf in kernels), where CubeCL looks for it.
export CUDA_PATH=$bundle/cuda
CHECK_DEADLINE=$(( deadline - 240 )) ./rhosynth-worker --check-gpu > "$out/check.json"

# The cluster shape of the GPU overlay, as the scale benchmarks start it (bench/cluster.sh,
# shipped beside this script): a CPU coordinator and one CUDA worker, over gRPC.
bin=$work
source "$bundle/cluster.sh"
start_cluster 1 --diagnostics "$work/diagnostics"
pids+=("$coordinator")

# Submits a job (its paths made absolute) and writes job-NAME.json: exit, wall time, how
# far its progress went, and from its evaluation report the TSTR ROC-AUCs (a table) or
# each vital's lag-1 and the state-transition divergence (histories).
job() {
  local name=$1 spec=$2 left=$(( deadline - $(date +%s) )) status=0
  sed -e "s|\./rhosynth-out|$work/rhosynth-out|g" -e "s|\.\./shared/data/adult|$work/data/adult|g" "$spec" > "$name.toml"
  if [ "$left" -lt 30 ] || [ -e "$out/timed-out" ] || ! kill -0 "${pids[@]}" 2>/dev/null; then
    echo "{\"job\": \"$name\", \"skipped\": \"no time left, an earlier job still running, or the cluster stopped\"}" \
      > "$out/job-$name.json"
    return
  fi
  echo "$name: up to $left s" >&2
  local start=$(date +%s.%N)
  timeout "$left" ./rhosynth submit "$name.toml" --coordinator "http://127.0.0.1:$port" --progress json \
    > /dev/null 2> "$out/$name.log" || status=$?
  [ "$status" -eq 124 ] && touch "$out/timed-out"
  local end=$(date +%s.%N)
  # The report is written after the job's final status: wait for it, while time is left.
  local id=$(grep -o 'job-[0-9]\{8\}T[0-9]\{6\}-[0-9a-f]*' "$out/$name.log" | head -1)
  while [ "$(date +%s)" -lt "$deadline" ]; do
    [ -z "$id" ] || [ "$status" -ne 0 ] || [ -e "diagnostics/$id/report.json" ] && break
    sleep 1
  done
  python3 - "$name" "$status" "$start" "$end" "diagnostics/$id/report.json" "$out/$name.log" \
    > "$out/job-$name.json" <<'PY' || echo "{\"job\": \"$name\", \"exit\": $status, \"error\": \"reading its report failed\"}" > "$out/job-$name.json"
import json, os, sys
name, status, start, end, report, log = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
out = {"job": name, "exit": status, "seconds": round(end - start, 1), "timed_out": status == 124}
lines = open(log).read().splitlines()
progress = [json.loads(l)["progress"] for l in lines if l.startswith('{"progress"')]
if progress:
    out["last_progress"] = progress[-1]
if status != 0:
    out["log_tail"] = lines[-5:]
if os.path.exists(report):
    report = json.load(open(report))
    utility = report.get("utility") or {}
    if utility:
        out["tstr_roc_auc"] = {f'{s["model"]} trained on {s["trained_on"]}': s["roc_auc"] for s in utility.get("scores", [])}
    longitudinal = report.get("longitudinal") or {}
    if longitudinal:
        out["lag1_synthetic_vs_holdout"] = {d["column"]: [d["lag1_synthetic"], d["lag1_holdout"]] for d in longitudinal.get("dynamics", [])}
        out["state_transition_divergence"] = longitudinal.get("state_transition_divergence")
print(json.dumps(out))
PY
}

cp -r "$bundle/examples" examples
if [ -d "$bundle/data/adult" ]; then
  mkdir -p data/adult && for f in "$bundle"/data/adult/*.xz; do xz -dc "$f" > "data/adult/$(basename "$f" .xz)"; done
  job adult-findiff examples/adult-findiff.toml
else
  echo '{"job": "adult-findiff", "skipped": "the bundle has no Adult (../shared/data was absent where it was built)"}' \
    > "$out/job-adult-findiff.json"
fi
# The sequence example trains on the history copula's release of the simulated cohort
# (`rhosynth demo --patients 3000`'s cohort and held-out cohort, the same seeds).
mkdir -p rhosynth-out/demo/input
./rhosynth simulate --patients 3000 --seed 2026 rhosynth-out/demo/input/icu_vitals.csv > /dev/null
./rhosynth simulate --patients 600 --seed 2027 rhosynth-out/demo/input/icu_vitals_holdout.csv > /dev/null
job sequence-reference examples/icu-sequence-reference.toml
job sequence examples/icu-sequence.toml

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
summary = json.load(open(f"{out}/check.json"))
summary["jobs"] = [json.load(open(f"{out}/job-{n}.json")) for n in ("adult-findiff", "sequence-reference", "sequence")]
summary["cpu_figures"] = {
    "adult-findiff": "3.2-3.5 min end to end on 2 CPU cores; TSTR 0.81-0.83 (logistic regression), 0.75-0.81 (trees) (docs/generators/findiff.md)",
    "sequence": "13.5-15 min end to end on 2 CPU cores, 3,000 simulated patients (docs/generators/sequence.md)",
}
print(json.dumps(summary, indent=2))
PY
