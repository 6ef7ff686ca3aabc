#!/usr/bin/env bash
# AIM on a wide table: COLUMNS columns (default 40; three in four categorical with 2 to 8
# categories, the rest integers on 8 bins) and ROWS rows (default 10^5), drawn from a
# latent class and a chain between neighbouring columns, so that pairs and triples carry
# structure. Runs `rhosynth run` (coordinator and 2 workers in one process) with AIM's
# default workload (`auto`: every triple while their tables fit, as they do here) at ε = 1, and prints the wall time, the peak RSS
# (the process's high-water mark: coordinator, workers and model together), the rounds
# run, the model's size, and the 1-, 2- and 3-way fidelity against a held-out draw.
#   cargo build --release --bins && bench/aim_wide.sh [ROWS] [COLUMNS]
set -euo pipefail
rows=${1:-100000}
columns=${2:-40}
bin=$(cd "$(dirname "$0")/.." && pwd)/target/release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$rows" "$columns" "$work" <<'EOF'
import random, sys
rows, columns, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(11)  # benchmark data, not private
kinds = ["integer" if c % 4 == 3 else "categorical" for c in range(columns)]
sizes = [8 if k == "integer" else 2 + (c * 5) % 7 for c, k in enumerate(kinds)]
spec = ["[job]", 'dataset_id = "wide"', "partitions = 4", "", "[input]",
        f'urls = ["{work}/train.csv"]', 'format = "csv"', "", "[schema]"]
for c, (k, n) in enumerate(zip(kinds, sizes)):
    spec += ["", "[[schema.columns]]", f'name = "c{c}"', f'kind = "{k}"']
    if k == "integer":
        spec += ["min = 0", f"max = {10 * n - 1}", f"bins = {n}"]
    else:
        spec += ["categories = [" + ", ".join(f'"v{v}"' for v in range(n)) + "]"]
spec += ["", "[privacy]", "epsilon = 1.0", "delta = 1e-5", 'accountant = "rdp"',
         f'ledger = "{work}/ledger"', "dataset_budget = { epsilon = 10.0, delta = 1e-5 }",
         "", "[generator]", 'name = "aim"', "", "[output]", f'url = "{work}/out"']
open(f"{work}/job.toml", "w").write("\n".join(spec) + "\n")

def draw():
    z = rng.randrange(5)
    prev, row = 0, []
    for c, (k, n) in enumerate(zip(kinds, sizes)):
        r = rng.random()
        v = (z + c) % n if r < 0.35 else (prev + 1) % n if r < 0.6 else rng.randrange(n)
        prev = v
        row.append(str(10 * v + rng.randrange(10)) if k == "integer" else f"v{v}")
    return ",".join(row)

header = ",".join(f"c{c}" for c in range(columns))
for name, n in [("train", rows), ("test", rows // 5)]:
    with open(f"{work}/{name}.csv", "w") as f:
        f.write(header + "\n")
        for _ in range(n):
            f.write(draw() + "\n")
EOF

/usr/bin/time -v "$bin/rhosynth" run "$work/job.toml" --scratch "$work/scratch" --diagnostics "$work/diagnostics" \
  > /dev/null 2> "$work/run.log" || { tail -20 "$work/run.log"; exit 1; }
"$bin/rhosynth" eval --spec "$work/job.toml" --test "$work/test.csv" --synthetic "$work/out" --out "$work/report" \
  > /dev/null 2> "$work/eval.log"
python3 - "$work" "$rows" "$columns" <<'EOF'
import json, re, sys
work, rows, columns = sys.argv[1:]
log = open(f"{work}/run.log").read()
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log).group(1)) / 1024
wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", log).group(1)
rounds = len(re.findall(r"AIM progress", log))
cells = re.findall(r"model_cells=(\d+)", log)
f = json.load(open(f"{work}/report/report.json"))["fidelity"]
print(f"| {rows} rows × {columns} columns | {wall} | {rss:.0f} MiB | {rounds} | {cells[-1] if cells else '-'} | "
      f"{f['hist']:.3f} | {f['pair']:.3f} | {f['triple']:.3f} |")
EOF
