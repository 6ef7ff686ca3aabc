#!/usr/bin/env bash
# Links between a row and its children (issue #65) on the cohort of cohort.py (not the
# demo simulator: MIMIC's names, charts 3-40 an admission partly following the stay,
# temperature, insurance): PATIENTS training patients (seed SEED) and half as many
# held out (seed SEED + 100), one database job (scale.toml, ε = 4), then `rhosynth eval`
# (links, TSTR of in-hospital death against the same synthetic tables re-joined at random,
# counts, lag-1) and links.py (pandas alone: missing values, stay × charts, comorbidity ×
# mean heart rate). Reports in $OUT.
#   cargo build --release --bins && bench/database/links.sh [PATIENTS] [SEED] [OUT]
set -euo pipefail
patients=${1:-10000}
seed=${2:-1}
out=${3:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${RHOSYNTH_BIN:-$here/../../target/release}" && pwd)/rhosynth
mkdir -p "$out"
python3 "$here/cohort.py" --patients "$patients" --seed "$seed" "$out/train"
python3 "$here/cohort.py" --patients $((patients / 2)) --seed $((seed + 100)) "$out/test"
sed -e "s|COHORT|$out/train|g" -e "s|WORK|$out|g" -e "s|PARTITIONS|8|" "$here/scale.toml" > "$out/job.toml"
start=$(date +%s.%N)
"$bin" run "$out/job.toml" > "$out/manifest.json" 2> "$out/job.log" || { tail -5 "$out/job.log"; exit 1; }
echo "database job: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
release=$(dirname "$(ls -d "$out"/synthetic/*/_manifest.json)")
held_out=()
for t in patients admissions charts; do held_out+=(--test "$t=$out/test/$t.csv"); done
"$bin" eval --spec "$out/job.toml" "${held_out[@]}" --synthetic "$release" --label admissions.hospital_expire_flag=1 \
  --out "$out/eval" 2>&1 > "$out/eval.json" | grep -v ' INFO ' | grep -v '^Report:'
python3 - "$out/eval/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for t in r["tables"]:
    for l in t["links"]:
        print(f"  link {t['name']}: {l['attribute']} × {l['summary']}: held-out {l['held_out']:.3f}, "
              f"train {l['train']:.3f}, synthetic {l['synthetic']:.3f}")
    for l in t["lag1"]:
        print(f"  lag-1 {t['name']}.{l['column']}: held-out {l['held_out']:.3f}, synthetic {l['synthetic']:.3f}")
PY
python3 "$here/links.py" --spec "$out/job.toml" --real "$out/train" --synthetic "$release"
