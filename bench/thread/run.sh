#!/usr/bin/env bash
# The thread hook's benchmarks (bench/thread/README.md). As root:
#   bench/thread/run.sh [BUILD_DIR]          host: the user-space agent backend
#   bench/thread/run.sh [BUILD_DIR] --vm     also the sched_ext VM (ping-pong under
#                                            sched_ext fifo vs the guest's default
#                                            scheduler, same guest, same run)
# Results: stdout, and JSON lines in BUILD_DIR/bench-thread.jsonl.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
VM=0
[ "${2:-}" = --vm ] && VM=1
BIN=$BUILD/bin
OUT=$BUILD/bench-thread.jsonl
: > "$OUT"
[ "$(id -u)" = 0 ] || { echo "run as root"; exit 1; }
D=$(mktemp -d /tmp/syrup-thread-bench.XXXXXX)
trap 'kill $SYRUPD 2>/dev/null; wait 2>/dev/null; rm -rf "$D"' EXIT

echo "== host: $(uname -r), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); thread policies run in the user-space agent"
"$BIN/syrupd" --socket "$D/s.sock" --bpffs_root /sys/fs/bpf/syrup-thread-bench --cache_dir "$D/cache" \
  --on_exit=remove --log_level=info 2> "$D/syrupd.log" &
SYRUPD=$!
for i in $(seq 200); do "$BIN/syrupctl" --socket "$D/s.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
export SYRUP_SOCKET=$D/s.sock
run() { "$BIN/syrup_thread_bench" "$@" | tee /dev/stderr | sed -n 's/^RESULT //p' >> "$OUT"; } 2>&1
for rep in 1 2 3; do
  run pingpong --rounds 50000
  run pingpong --rounds 50000 --policy "$SRC/policies/fifo.c"
done
run cs --threads 4 --seconds 5
run cs --threads 4 --seconds 5 --policy "$SRC/policies/cs_aware.c"
run cs --threads 4 --seconds 5 --policy "$SRC/policies/fifo.c"
kill $SYRUPD; wait $SYRUPD 2>/dev/null
echo "-- the agent's own view (syrupd log): per policy deployed above"
grep -o 'syrup-agent: tgid.*' "$D/syrupd.log"

if [ $VM = 1 ]; then
  echo "== sched_ext guest (qemu TCG, 2 vCPUs; compare only within the guest)"
  bash "$SRC/tests/vm/run.sh" "$BUILD" --bench --filter '-*' > "$D/vm.log" 2>&1
  grep -a 'SYRUP-VM: BENCH' "$D/vm.log" | sed 's/^SYRUP-VM: BENCH //' | grep -v '^run[12] RESULT\|^RESULT' 
  grep -a 'SYRUP-VM: BENCH' "$D/vm.log" | sed -n 's/.*RESULT //p' | sed 's/^{/{"where":"sched_ext guest",/' >> "$OUT"
  python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
g = [r for r in rows if r.get("where") == "sched_ext guest" and r["bench"] == "pingpong"]
none = [r["usec_per_roundtrip"] for r in g if r["policy"] == "none"]
fifo = [r["usec_per_roundtrip"] for r in g if r["policy"] == "fifo.c"]
if none and fifo:
    a, b = sum(none) / len(none), sum(fifo) / len(fifo)
    print(f"ping-pong in the guest: default scheduler {a:.1f} us/roundtrip, sched_ext fifo {b:.1f} us/roundtrip: "
          f"ratio fifo/default {b / a:.2f} (runs: {none} vs {fifo})")
PY
fi
