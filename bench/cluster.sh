# A cluster on this machine for the scale benchmarks, sourced by them: `rhosynth serve
# --dev` and WORKERS `rhosynth-worker`s over real sockets (the Kubernetes shape), with
# their logs in "$work". Needs "$bin" (the binaries' folder) and "$work" set.

# Starts a coordinator with scratch and ledger under "$work" (and `serve`'s further
# options, if any, after `$1`) and `$1` workers; sets `port`, `coordinator` (its pid) and
# `pids` (the workers').
start_cluster() {
  local workers=$1
  port=$((20000 + RANDOM % 20000))
  "$bin/rhosynth" serve --dev --listen "127.0.0.1:$port" --scratch "$work/scratch-$workers" \
    --ledger "$work/ledger-$workers" "${@:2}" 2> "$work/coordinator-$workers.log" &
  coordinator=$!
  sleep 2
  pids=()
  for w in $(seq "$workers"); do
    "$bin/rhosynth-worker" --coordinator "http://127.0.0.1:$port" --name "w$w" 2> "$work/worker-$workers-$w.log" &
    pids+=($!)
  done
  sleep 2
}

# Stops the cluster `start_cluster` started.
stop_cluster() {
  kill "${pids[@]}" "$coordinator"
  wait "${pids[@]}" "$coordinator" 2>/dev/null || true
}

# Samples the most bytes the scratch folder "$1" holds, every second, into the file "$2"
# until killed; sets `watcher` (its pid).
watch_scratch() {
  (most=0; while sleep 1; do b=$(du -sb "$1" 2>/dev/null | cut -f1); [ "${b:-0}" -gt "$most" ] && most=$b \
    && echo "$most" > "$2"; done) &
  watcher=$!
}

# A process's peak resident memory (VmHWM).
hwm() { awk '/VmHWM/ {printf "%.0f MiB", $2 / 1024}' "/proc/$1/status"; }
