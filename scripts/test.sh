#!/usr/bin/env bash
# The whole test suite, as root: installs what is missing, builds, runs every test
# (unit tests, and integration tests against the running kernel with a private syrupd).
# Extra arguments go to ctest (e.g. -R Thread).
#
# Bounded: every ctest entry has a TIMEOUT of its own (--timeout below is only the default
# of an entry without one), and the whole test run is stopped after SYRUP_SUITE_LIMIT_S
# (default 2700 s, over twice the suite's budget) so that a CI job always ends with a
# report. At the end it prints the slowest tests, so a log shows where the time went.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "test.sh: run as root (the integration tests load BPF programs)" >&2
  exit 1
fi
# With the deploy's fault points compiled in, so the rollback of every step is tested
# (syrupd/deploy_txn.h; they act only on SYRUP_FAULT_STEP in syrupd's own environment).
start=$(date +%s)
bash scripts/build.sh -DSYRUP_FAULT_INJECTION=ON
built=$(date +%s)
cd build
deadline=$((built + ${SYRUP_SUITE_LIMIT_S:-2700}))
logs=()
rc=0
# One ctest run; its log (LastTest.log) is kept under the given name for the summary.
# timeout(1) runs ctest in a process group of its own and signals the whole group, the
# test running at the time included.
run_ctest() {
  local name=$1 left r=0
  shift
  left=$((deadline - $(date +%s)))
  [ $left -gt 0 ] || { echo "test.sh: no time left for the $name tests (SYRUP_SUITE_LIMIT_S)" >&2; rc=1; return; }
  rm -f Testing/Temporary/LastTest.log "Testing/Temporary/LastTest-$name.log"  # no earlier run's
  timeout --kill-after=30 "$left" ctest --output-on-failure --timeout 300 "$@" || r=$?
  [ $r -eq 124 ] && echo "test.sh: ctest stopped at the suite's limit (SYRUP_SUITE_LIMIT_S=${SYRUP_SUITE_LIMIT_S:-2700} s)" >&2
  [ $r -eq 0 ] || rc=$r
  [ -f Testing/Temporary/LastTest.log ] && cp Testing/Temporary/LastTest.log "Testing/Temporary/LastTest-$name.log"
  logs+=("Testing/Temporary/LastTest-$name.log")
}
# The fuzzers (label fuzz) first, one per core: each is a CPU-bound 20 s run, and nothing
# timed runs beside them. Then everything else one at a time, as the integration tests
# need (RUN_SERIAL or not).
# With a filter of the caller's (-R ...), either half may select nothing.
none=error
[ $# -gt 0 ] && none=ignore
run_ctest fuzz -j "$(nproc)" -L fuzz --no-tests=ignore "$@"
run_ctest rest -LE fuzz --no-tests=$none "$@"
done_at=$(date +%s)
# ctest's log: "N/M Testing: NAME" ... "Test time =  12.34 sec" per test.
# Only a report: it never changes the exit status (awk, not head, takes the first 15, so
# that no writer of the pipeline dies of SIGPIPE, which pipefail would make the status).
echo "test.sh: the 15 slowest tests (s):"
slowest() {
  local l
  for l in "${logs[@]}"; do if [ -f "$l" ]; then cat "$l"; fi; done |
    awk '/^[0-9]+\/[0-9]+ Testing: / { name = $3 }
         /^Test time = / && name != "" { printf "%9.1f  %s\n", $4, name; name = "" }' |
    sort -rn | awk 'NR <= 15'
}
slowest || true
echo "test.sh: build $((built - start)) s, tests $((done_at - built)) s"
exit $rc
