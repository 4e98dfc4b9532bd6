#!/usr/bin/env bash
# The main job: installs what is missing, builds, starts syrupd, deploys policies for an
# example application and shows what each one did. Run as root.
#
#   scripts/demo.sh [--no-build] [--build-dir DIR] [--no-rocksdb]
# --no-build and --build-dir run an existing build (tests/demo_test.sh checks what each
# section claims on this script's own output that way); --no-rocksdb skips the minute
# of the RocksDB sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
build=1 builddir=build rocksdb=1
while [ $# -gt 0 ]; do
  case $1 in
    --no-build) build=0 ;;
    --build-dir) builddir=$2; shift ;;
    --no-rocksdb) rocksdb=0 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$(id -u)" -ne 0 ]; then
  echo "demo.sh: run as root (syrupd loads BPF programs)" >&2
  exit 1
fi
[ $build = 1 ] && bash scripts/build.sh

# A private syrupd, so the demo never disturbs one that is already serving.
run=$(mktemp -d /tmp/syrup-demo.XXXXXX)
export SYRUP_SOCKET=$run/syrupd.sock
bin=$builddir/bin
"$bin/syrupd" --socket "$SYRUP_SOCKET" --bpffs_root "/sys/fs/bpf/syrup-demo-$$" \
  --cache_dir /var/cache/syrup --state_file "$run/state.json" --on_exit=remove 2> "$run/syrupd.log" &
syrupd_pid=$!
trap 'kill "$syrupd_pid" 2>/dev/null; wait "$syrupd_pid" 2>/dev/null || true; rm -rf "$run"' EXIT
for _ in $(seq 100); do "$bin/syrupctl" ping >/dev/null 2>&1 && break; sleep 0.05; done
"$bin/syrupctl" ping

section() { printf '\n=== %s\n' "$*"; }

section "pass: the kernel's 5-tuple hash puts one client's flow on one worker"
"$bin/reuseport_demo" --requests 1000 policies/pass.c

section "round_robin: the same flow spread evenly over the workers"
"$bin/reuseport_demo" --requests 1000 policies/round_robin.c

section "sita: every long request (1 in 50) to worker 0, short ones round robin over the rest"
"$bin/reuseport_demo" --requests 1000 --linger 2 policies/sita.c &
demo=$!
sleep 1
"$bin/syrupctl" list
"$bin/syrupctl" stats
wait "$demo"

section "scan_avoid: the application marks worker 0 busy with one mmap'ed store; it gets nothing, the others share the rest"
"$bin/reuseport_demo" --requests 1000 --busy policies/scan_avoid.c

section "socket-lookup: ten ports (47100-47109) served in turn by two sockets bound to other ports (47001, 47002)"
# One process, two listeners (examples/socket_lookup/two_listeners.py); syrupctl deploys
# round_robin.c on them for 127.0.0.1's ports 47100-47109: each connection lands on the
# next listener, whatever port it was made to.
coproc lookup_srv { exec /usr/bin/python3 examples/socket_lookup/two_listeners.py serve 47001 47002; }
read -r _ <&"${lookup_srv[0]}"
"$bin/syrupctl" deploy --hook socket-lookup --pid "$lookup_srv_PID" --protocol tcp --port 47100 \
  --port_end 47109 --address 127.0.0.1 --app lookup_demo policies/round_robin.c
/usr/bin/python3 examples/socket_lookup/two_listeners.py ask 47100 47109
"$bin/syrupctl" list | grep -E "^ *ID|socket-lookup" || true
eval "exec ${lookup_srv[1]}>&-"
wait "$lookup_srv_PID" 2>/dev/null || true

section "a policy with a bug: the verifier's reason comes back to the application"
printf '#include <syrup/policy.h>\nSYR_POLICY(struct syr_input *in)\n{\n\treturn *(__u32 *)(in->data + 8);\n}\n' > "$run/bad.c"
"$bin/reuseport_demo" "$run/bad.c" 2>&1 | head -4 || true
rm -f "$run/bad.c"

if [ $rocksdb = 1 ]; then
  section "RocksDB over UDP: kv_server deploys each policy itself; open-loop kv_loadgen, 50 flows, 99.5% GET / 0.5% SCAN"
  # examples/rocksdb/kv_server (16 workers, one SO_REUSEPORT socket each, each worker paced
  # to 0.055 of CPU 1: the talk's core per worker, emulated) serves a
  # RocksDB it creates on first use; kv_loadgen (Poisson arrivals, 50 client flows, on
  # CPU 0) sweeps three loads per policy. The full study is bench/rocksdb/run.sh.
  echo "(about a minute: loads the database on first use, calibrates a SCAN to ~70 GETs, then 4 policies x 3 loads)"
  /usr/bin/python3 bench/rocksdb/rocksdb_bench.py --demo --socket "$SYRUP_SOCKET" \
    --db /var/tmp/syrup-kv-db --out bench/results/rocksdb
fi

section "syrupd's log"
cat "$run/syrupd.log"
