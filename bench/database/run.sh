#!/usr/bin/env bash
# A database job against its two baselines on the simulated MIMIC-shaped cohort: simulate a
# training cohort and a held-out one, run examples/mimic-database.toml, the independent-
# tables and flattened baselines at the same ε (baselines.py), and evaluate all three
# against the held-out cohort twice: `rhosynth eval` (reports in $OUT/eval-<name>/) and
# evaluate.py, a separate pandas/scikit-learn check with its own features (per-table
# fidelity, integrity, child counts, cross-table marginals, times, lag-1, TSTR). Prints
# both; evaluate.py's figures also in $OUT/figures.json.
#   cargo build --release --bins && bench/database/run.sh [PATIENTS] [OUT]
set -euo pipefail
patients=${1:-10000}
out=${2:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
# The binaries' folder (RHOSYNTH_BIN, relative to where this is run) made absolute: the
# script changes into $OUT.
bin=$(cd "${RHOSYNTH_BIN:-$here/../../target/release}" && pwd)/rhosynth
mkdir -p "$out"
cd "$out"
"$bin" simulate --relational --patients "$patients" --seed 7 train > /dev/null
"$bin" simulate --relational --patients $((patients / 2)) --seed 8 test > /dev/null
sed -e "s|./rhosynth-out/database/input|$out/train|" -e "s|./rhosynth-out/ledger|$out/ledger|" \
    -e "s|./rhosynth-out/database/synthetic|$out/database|" "$here/../../examples/mimic-database.toml" > job.toml
start=$(date +%s.%N)
"$bin" run job.toml 2> database.log > /dev/null
echo "database job: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
python3 "$here/baselines.py" specs --spec job.toml --train train --out baselines
for job in independent-patients independent-admissions independent-vitals flattened; do
  "$bin" run "baselines/$job.toml" 2> "baselines/$job.log" > /dev/null
done
python3 "$here/baselines.py" join --spec job.toml --out baselines
python3 "$here/evaluate.py" --spec job.toml --train train --test test --json figures.json \
  database=database independent=baselines/independent-joined flattened=baselines/flattened-joined
held_out=(--test patients=test/patients.csv --test admissions=test/admissions.csv --test vitals=test/vitals.csv)
for name in database independent flattened; do
  case $name in
    database) synthetic=(--synthetic database) ;;
    *) synthetic=(); for t in patients admissions vitals; do synthetic+=(--synthetic "$t=baselines/$name-joined/$t.csv"); done ;;
  esac
  echo "rhosynth eval, $name:"
  "$bin" eval --spec job.toml "${held_out[@]}" "${synthetic[@]}" --label admissions.outcome=died \
    --out "eval-$name" 2>&1 > "eval-$name.json" | grep -v ' INFO ' | grep -v '^Report:'
done
