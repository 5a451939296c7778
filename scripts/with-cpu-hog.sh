#!/usr/bin/env bash
# with-cpu-hog.sh N CMD [ARGS...]: run CMD beside N busy processes (a loaded machine), then stop them.
# The hogs are killed by PID whatever CMD's outcome (trap on EXIT, INT and TERM); the exit code is CMD's.
# `make test-loaded` runs the whole suite this way: slow must never be mistaken for dead.
set -u
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 N CMD [ARGS...]" >&2
  exit 2
fi
n=$1
shift
pids=()
stop_hogs() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null
  done
}
trap stop_hogs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq "$n"); do
  python3 -c "while True: pass" &
  pids+=("$!")
done
echo "with-cpu-hog: $n busy processes (pids ${pids[*]}) beside: $*" >&2
"$@"
