#!/usr/bin/env bash
# rhosynth's AIM and marginals generators beside private-pgm's AIM, on the same split
# (adult.data to train, adult.test to score) and the same discretisation (the spec's
# declared bins), each scored by the same `rhosynth eval`. Prints, per generator: wall time
# of the fit, mean 2-way TVD over all column pairs, mean 3-way TVD over sampled triples,
# and train-on-synthetic ROC-AUC (logistic regression, gradient-boosted trees).
#   cargo build --release --bins && bench/aim_reference/compare.sh [RUNS]
# The reference is installed in a venv (pinned in requirements.txt; $AIM_REF_VENV, default
# bench/aim_reference/.venv). Its model-size limit is $AIM_REF_MODEL_MB, default 8 MB
# (2^20 cells of 8 bytes, as rhosynth's `max_model_cells` default of 10^6); private-pgm's own
# default, 80, did not finish on 2 cores (two runs: one fit, after round 28 and 34, ran 85
# and 50 minutes without returning). A benchmark, not a test. Every run writes under a
# fresh temporary directory and a ledger of its own.
set -euo pipefail
runs=${1:-1}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$root/target/release
venv=${AIM_REF_VENV:-$here/.venv}
model_mb=${AIM_REF_MODEL_MB:-8}
test_data=$root/../shared/data/adult/adult.test
[ -f "$test_data" ] || { echo "needs ../shared/data/adult (adult.data, adult.test)" >&2; exit 2; }
[ -x "$bin/rhosynth" ] || { echo "build first: cargo build --release --bins" >&2; exit 2; }
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --require-hashes -r "$here/requirements.txt"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"

# seconds of a command, its output to a log
timed() { local log=$1; shift; local t0; t0=$(date +%s.%N); "$@" > "$log" 2>&1; python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')"; }

evaluate() { # spec synthetic report-dir
  "$bin/rhosynth" eval --spec "$1" --test "$test_data" --synthetic "$2" --out "$3" > /dev/null 2>> "$work/eval.log"
}

row() { # name seconds report.json
  python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
name, seconds, path = sys.argv[1:]
r = json.load(open(path))
f, scores = r["fidelity"], {s["model"]: s["roc_auc"] for s in r["utility"]["scores"] if s["trained_on"] == "synthetic"}
print(f"| {name} | {seconds} | {1 - f['pair']:.4f} | {1 - f['triple']:.4f} | "
      f"{scores['logistic regression']:.3f} | {scores['gradient-boosted trees']:.3f} |")
EOF
}

echo "| generator | fit (s) | 2-way TVD | 3-way TVD | ROC-AUC (LR) | ROC-AUC (GBT) |"
echo "| --- | --- | --- | --- | --- | --- |"
for run in $(seq "$runs"); do
  for example in adult-aim adult-marginals; do
    out=$work/$example-$run
    seconds=$(timed "$work/$example-$run.log" "$bin/rhosynth" run "examples/$example.toml" \
      --output "$out/synthetic" --ledger "$out/ledger" --scratch "$out/scratch" --diagnostics "$out/diagnostics")
    evaluate "examples/$example.toml" "$out/synthetic" "$out/report"
    row "rhosynth ${example#adult-}" "$seconds" "$out/report/report.json"
  done
  out=$work/reference-$run
  mkdir -p "$out"
  seconds=$(timed "$out/aim.log" "$venv/bin/python" "$here/aim.py" --spec examples/adult-aim.toml \
    --max-model-mb "$model_mb" --out "$out/synthetic.csv")
  evaluate examples/adult-aim.toml "$out/synthetic.csv" "$out/report"
  row "private-pgm AIM (mbi $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mbi"))'), $model_mb MB)" \
    "$seconds" "$out/report/report.json"
  grep -h '"rho"' "$out/aim.log" | sed 's/^/  reference: /'
  grep -ho 'Zcdp { rho: [0-9.e-]*' "$work/adult-aim-$run.log" | head -1 | sed 's/^/  rhosynth: /' || true
done
