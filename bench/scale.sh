#!/usr/bin/env bash
# Cluster scale (issue #42): a wide table of ROWS rows × 10 columns in FILES CSV files
# (8 unless set), written as a stream (never held in memory), read by a cluster of 1, 2
# and 4 worker processes — `rhosynth serve --dev` and `rhosynth-worker`s over real
# sockets — through one marginals job that partitions it, measures its pairs and samples
# 10^6 synthetic rows. Prints per cluster: partitioning rows/s (the coordinator's
# "partitioning" stage, from its log), the job's wall time, the peak RSS (VmHWM) of the
# coordinator and of each worker, and the most bytes the scratch store held.
#   cargo build --release --bins && bench/scale.sh [ROWS] [WORKERS ...]
# RHOSYNTH_BIN names another folder of binaries (e.g. target/debug for a test-profile
# build); PARTITION_BY=coordinator partitions on the coordinator alone (`[job]
# partition_by`), as before the workers did.
set -euo pipefail
rows=${1:-1000000}
shift || true
[ $# -gt 0 ] && clusters=("$@") || clusters=(1 2 4)
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${RHOSYNTH_BIN:-$here/../target/release}" && pwd)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# Ten columns: six categorical (2 to 12 categories) and four integers on 16 bins, each
# row drawn from a latent class and a chain between neighbours. Benchmark data, not
# private: a fixed seed.
python3 - "$rows" "$work" "${FILES:-8}" "${PARTITION_BY:-workers}" <<'EOF'
import random, sys
rows, work, files, partition_by = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
rng = random.Random(42)
sizes = [2, 12, 16, 5, 16, 8, 3, 16, 7, 16]
kinds = ["integer" if n == 16 else "categorical" for n in sizes]
urls = ", ".join(f'"{work}/wide-{i}.csv"' for i in range(files))
spec = ["[job]", 'dataset_id = "scale"', "partitions = 8", f'partition_by = "{partition_by}"', "", "[input]",
        f"urls = [{urls}]", 'format = "csv"', "", "[schema]"]
for c, (k, n) in enumerate(zip(kinds, sizes)):
    spec += ["", "[[schema.columns]]", f'name = "c{c}"', f'kind = "{k}"']
    spec += ["min = 0", f"max = {10 * n - 1}", f"bins = {n}"] if k == "integer" else \
            ["categories = [" + ", ".join(f'"v{v}"' for v in range(n)) + "]"]
pairs = ", ".join(f'["c{c}", "c{c + 1}"]' for c in range(9))
spec += ["", "[privacy]", "epsilon = 1.0", "delta = 1e-6", "dataset_budget = { epsilon = 100.0, delta = 1e-5 }",
         "", "[generator]", 'name = "marginals"', "", "[generator.marginals]", f"pairs = [{pairs}]",
         "", "[output]", f'url = "{work}/out/{{job_id}}"', "rows = 1000000"]
open(f"{work}/job.toml", "w").write("\n".join(spec) + "\n")
for i in range(files):
    with open(f"{work}/wide-{i}.csv", "w", buffering=1 << 20) as f:
        f.write(",".join(f"c{c}" for c in range(10)) + "\n")
        for _ in range(rows // files + (i < rows % files)):
            z, prev, row = rng.randrange(4), 0, []
            for c, (k, n) in enumerate(zip(kinds, sizes)):
                r = rng.random()
                v = (z + c) % n if r < 0.35 else (prev + 1) % n if r < 0.6 else rng.randrange(n)
                prev = v
                row.append(str(10 * v + rng.randrange(10)) if k == "integer" else f"v{v}")
            f.write(",".join(row) + "\n")
EOF
echo "rows: $rows in ${FILES:-8} files, input: $(du -ch "$work"/wide-*.csv | tail -1 | cut -f1)," \
  "partitioned by the ${PARTITION_BY:-workers}"

source "$here/cluster.sh"
for workers in "${clusters[@]}"; do
  start_cluster "$workers"
  scratch="$work/scratch-$workers"
  # The most the scratch store held, sampled every second while the job runs.
  watch_scratch "$scratch" "$work/scratch-most-$workers"
  start=$(date +%s.%N)
  "$bin/rhosynth" submit "$work/job.toml" --coordinator "http://127.0.0.1:$port" > /dev/null \
    2> "$work/submit-$workers.log" || { tail -5 "$work/submit-$workers.log"; exit 1; }
  end=$(date +%s.%N)
  kill "$watcher"
  # The partitioning stage: from its start to the next stage's; by the workers, its shards
  # read until the last "shard read", then the partitions merged.
  rate=$(grep -E 'job progress stage=|shard read' "$work/coordinator-$workers.log" | python3 -c '
import sys, datetime
t = lambda s: datetime.datetime.fromisoformat(s.split()[0].rstrip("Z")[:26])
lines = [(t(l), l) for l in sys.stdin]
i = next(i for i, (_, l) in enumerate(lines) if "stage=\"partitioning" in l)
j = next(j for j in range(i + 1, len(lines)) if "stage=" in lines[j][1])
whole = (lines[j][0] - lines[i][0]).total_seconds()
read = [when for when, l in lines[i:j] if "shard read" in l]
phases = f" (shards {(read[-1] - lines[i][0]).total_seconds():.1f} s, merges {(lines[j][0] - read[-1]).total_seconds():.1f} s)" if read else ""
print(f"{'"$rows"' / whole:.0f} rows/s{phases}")')
  echo "workers=$workers partitioning=${rate} job=$(python3 -c "print(round($end - $start))")s" \
    "coordinator=$(hwm $coordinator) workers=[$(for p in "${pids[@]}"; do printf '%s ' "$(hwm "$p")"; done)]" \
    "scratch=$(python3 -c "print(f'{$(cat "$work/scratch-most-$workers" 2>/dev/null || echo 0) / 2**20:.0f} MiB')")"
  stop_cluster
done
