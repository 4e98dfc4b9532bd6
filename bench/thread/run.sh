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
run() {
  "$BIN/syrup_thread_bench" "$@" > "$D/out" 2>&1
  grep -v '^RESULT ' "$D/out"
  sed -n 's/^RESULT //p' "$D/out" >> "$OUT"
}
for rep in 1 2 3; do
  run pingpong --rounds 50000
  run pingpong --rounds 50000 --policy "$SRC/policies/fifo.c"
done
for sleep in 200 0; do
  for arg in "" "--policy $SRC/policies/cs_aware.c" "--policy $SRC/policies/cs_aware.c --param use_hint=0" \
             "--policy $SRC/policies/fifo.c"; do
    run cs --threads 4 --seconds 5 --sleep-us $sleep $arg
  done
done
kill $SYRUPD; wait $SYRUPD 2>/dev/null
echo "-- the agent's own view (syrupd log): per policy deployed above"
grep -o 'syrup-agent: tgid.*' "$D/syrupd.log"

if [ $VM = 1 ]; then
  echo "== sched_ext guest (qemu TCG, 2 vCPUs; compare only within the guest)"
  bash "$SRC/tests/vm/run.sh" "$BUILD" --bench --filter '-*' > "$D/vm.log" 2>&1
  grep -a 'SYRUP-VM: BENCH' "$D/vm.log" | sed 's/^SYRUP-VM: BENCH //' | grep -v 'RESULT ' 
  grep -a 'SYRUP-VM: BENCH' "$D/vm.log" | sed -n 's/.*RESULT //p' | sed 's/^{/{"where":"sched_ext guest",/' >> "$OUT"
  python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(rs, key):
    v = [r[key] for r in rs]
    return statistics.median(v) if v else float("nan")
for where, sel in (("host (agent)", lambda r: "where" not in r), ("sched_ext guest", lambda r: r.get("where") == "sched_ext guest")):
    for same in (False, True):
        g = [r for r in rows if sel(r) and r["bench"] == "pingpong" and r.get("same_core", False) == same]
        a = [r for r in g if r["policy"] == "none"]
        b = [r for r in g if r["policy"] == "fifo.c" and "variant" not in r]
        c = [r for r in g if r["policy"] == "fifo.c" and r.get("variant") == "no direct path"]
        if a and b:
            ma, mb = med(a, "usec_per_roundtrip"), med(b, "usec_per_roundtrip")
            extra = ""
            if c:
                mc = med(c, "usec_per_roundtrip")
                extra = f"; fifo without the direct path {mc:.1f}: {mc / ma:.2f}"
            f = [r for r in g if r["policy"] == "scx_floor"]
            if f:
                mf = med(f, "usec_per_roundtrip")
                extra += f"; sched_ext floor {mf:.1f}: floor/kernel {mf / ma:.2f}, fifo/floor {mb / mf:.2f}"
            print(f"ping-pong, {where}{', both threads on one core' if same else ''}: kernel's scheduler {ma:.1f} us/roundtrip, "
                  f"fifo {mb:.1f}: fifo/kernel {mb / ma:.2f}{extra} (medians of {len(a)} and {len(b)} runs)")
    for sleep in (200, 0):
        g = [r for r in rows if sel(r) and r["bench"] == "cs" and r["sleep_us"] == sleep]
        if g:
            print(f"critical sections preempted, {where}, {sleep} us sleeps: " +
                  ", ".join(f"{r['policy']} {r['cs_preempted_pct']:.2f}%" for r in g))
PY
fi
