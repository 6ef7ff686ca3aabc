#!/usr/bin/env bash
# `rhosynth audit` for every generator that runs on the demo's simulated ICU cohort: M
# canaries (default 1000), the job exactly as its spec configures it, and the ε lower bound
# its release proves at 95% confidence beside the claimed ε. Prints one table row per
# generator; a bound above its claim exits non-zero.
#   cargo build --release --bins && bench/audit/demo.sh [M] [PATIENTS] [pairs|nearest|loss]
# `loss` (white-box) audits the generators trained by DP-SGD only. With
# RHOSYNTH_SMOLLM2_GGUF naming SmolLM2-135M-Instruct's GGUF, DP-2Stage and HARMONIC (its
# reference: another simulated cohort, public) run too: minutes each on 2 cores.
# ONLY="name …" runs those generators alone. Each audit writes under a fresh temporary
# directory (its report and its own ledger).
# PATE runs with 40 teachers (partitions), the others with the demo's 4 partitions.
set -euo pipefail
canaries=${1:-1000}
patients=${2:-400}
score=${3:-pairs}
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$root/target/release/rhosynth
[ -x "$bin" ] || { echo "build first: cargo build --release --bins" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" simulate "$work/icu.csv" --patients "$patients" 2> /dev/null

# The demo spec with another [generator] section (TOML up to [output]) and output lines.
variant() { # name generator-section [output-lines] [partitions]
  python3 - "$root/examples/demo.toml" "$work/$1.toml" "$2" "${3:-}" "${4:-4}" <<'PY'
import sys
src, dst, generator, output, partitions = sys.argv[1:]
text = open(src).read().replace("partitions = 4\n", f"partitions = {partitions}\n")
head, rest = text.split("[generator]", 1)
tail = rest[rest.index("[output]"):]
open(dst, "w").write(f"{head}{generator}\n\n{tail}{output}\n")
PY
  echo "$work/$1.toml"
}

findiff="findiff=$(variant findiff $'[generator]\nname = "findiff"\n\n[generator.findiff]\nmax_rows_per_unit = 8\n\n[generator.findiff.run]\nepochs = 5')"
# The sequence example as docs/audit.md measured it: DP-SGD alone at ε = 2, temperature
# 0.8 (stage 1 reads a release of this dataset, which an audit's fresh ledger refuses).
sed -e '/^reference = /d' -e '/^pretrain_steps = /d' -e 's/^epsilon = 1.0/epsilon = 2.0/' \
  -e 's/^temperature = 1.0/temperature = 0.8/' "$root/examples/icu-sequence.toml" > "$work/sequence.toml"
sequence="sequence=$work/sequence.toml"
if [ "$score" = loss ]; then
  specs=("$findiff" "$sequence")
else
  specs=(
    "marginals=$root/examples/demo.toml"
    "aim=$(variant aim $'[generator]\nname = "aim"\n\n[generator.aim]\nmax_rows_per_unit = 8')"
    "$findiff"
    "pate=$(variant pate $'[generator]\nname = "pate"\n\n[generator.pate]\nsigma = 40.0\nqueries_per_iteration = 16\nmax_iterations = 4' 'rows = 5000' 40)"
    "$sequence"
    "direct=$root/examples/icu-direct.toml"
  )
fi
if [ -n "${RHOSYNTH_SMOLLM2_GGUF:-}" ]; then
  "$bin" simulate "$work/public.csv" --patients "$patients" --seed 7 2> /dev/null
  # The first block with LoRA adapters (as the Adult examples), 8 rows a unit, one pass;
  # HARMONIC 2 (an example is 3 rows of text: with 8, a round took 23 min on 2 cores).
  lm=$'blocks = 1\nlora = { rank = 8, alpha = 16.0, targets = ["qkv", "output", "up", "down"] }\nmax_rows_per_unit = 8\npseudo_rows = 2000\npseudo_batch = 16'
  run=$'epochs = 1.0\nbatch_size = 256.0\nmicro_batch = 32'
  model="checkpoint = \"$RHOSYNTH_SMOLLM2_GGUF\""
  specs+=(
    "dp2stage=$(variant dp2stage $'[generator]\nname = "dp2stage"\n\n[generator.dp2stage]\n'"$model"$'\n'"$lm"$'\n\n[generator.dp2stage.run]\n'"$run" 'rows = 2000')"
    "harmonic=$(variant harmonic $'[generator]\nname = "harmonic"\n\n[generator.harmonic]\n'"$model"$'\nreference = "'"$work/public.csv"$'"\nneighbours = 2\n'"${lm/max_rows_per_unit = 8/max_rows_per_unit = 2}"$'\n\n[generator.harmonic.run]\n'"$run" 'rows = 2000')"
  )
fi
printf '| generator | claimed ε | canaries (in) | right guesses | ε lower bound | seconds |\n| --- | --- | --- | --- | --- | --- |\n'
status=0
for entry in "${specs[@]}"; do
  name=${entry%%=*} spec=${entry#*=}
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
  if ! "$bin" audit "$spec" --canaries "$canaries" --data "$work/icu.csv" --score "$score" --out "$work/audits" \
      > "$work/$name.json" 2> "$work/$name.log"; then
    status=1
  fi
  python3 - "$name" "$work/$name.json" "$work/$name.log" <<'PY'
import json, sys
name, path, log = sys.argv[1:]
lines = open(path).read().strip().splitlines()
if not lines:
    print(f"| {name} | failed: {open(log).read().strip().splitlines()[-1]} | | | | |")
    sys.exit()
r = json.loads(lines[-1])
print(f"| {name} | {r['claimed_epsilon']:.3f} | {r['canaries']} ({r['included']}) | {r['correct']} of {r['guesses']} "
      f"| {r['epsilon_lower_bound']:.3f} | {r['seconds']:.0f} |")
PY
done
exit $status
