#!/usr/bin/env bash
# The main job says what each policy does; this checks every claim against the demo's
# own output (scripts/demo.sh on an existing build, without the RocksDB sweep).
#   tests/demo_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (syrupd loads BPF programs)"; exit 77; }
out=$(bash "$src/scripts/demo.sh" --no-build --build-dir "$build" --no-rocksdb 2>&1); rc=$?
echo "$out"
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }
[ $rc = 0 ] || { echo "FAIL: demo.sh exited $rc"; exit 1; }
# The table of one section: lines "worker total short long" after its === header.
table() { awk -v s="=== $1" 'index($0, s) == 1 {on = 1; next} /^=== / {on = 0} on && $1 ~ /^[0-9]+$/ && NF == 4' <<<"$out"; }
col() { table "$1" | awk -v c="$2" '{print $c}' | tr '\n' ' '; }
pass_totals=$(col pass: 2)
check "pass: one worker gets all 1000 (totals: $pass_totals)" \
  '[ "$(table pass: | awk "\$2 == 1000" | wc -l)" = 1 ]'
rr_totals=$(col round_robin: 2)
check "round_robin: every worker gets 250 (totals: $rr_totals)" \
  '[ "$(table round_robin: | awk "\$2 == 250" | wc -l)" = 4 ]'
sita_rows=$(table sita: | tr '\n' ';')
check "sita: worker 0 gets every long request and nothing else ($sita_rows)" \
  '[ "$(table sita: | awk "\$1 == 0 {print \$3, \$4}")" = "0 20" ] && [ "$(table sita: | awk "\$1 != 0 {l += \$4} END {print l + 0}")" = 0 ]'
scan_rows=$(table scan_avoid: | tr '\n' ';')
check "scan_avoid: the marked worker 0 gets nothing, workers 1-3 share the 1000 evenly ($scan_rows)" \
  '[ "$(table scan_avoid: | awk "\$1 == 0 {print \$2}")" = 0 ] && [ "$(table scan_avoid: | awk "\$1 != 0 && \$2 >= 300 && \$2 <= 367" | wc -l)" = 3 ]'
check "each run received every request" '[ "$(grep -c "1000 of 1000 requests received" <<<"$out")" = 4 ]'
lookup=$(awk '/^=== socket-lookup:/ {on = 1; next} /^=== / {on = 0} on && $1 ~ /^471[0-9][0-9]$/' <<<"$out")
check "socket-lookup: each of the ten ports answered, by blue and green in turn, 5 each ($(tr '\n' ';' <<<"$lookup"))" \
  '[ "$(grep -c " blue:47001$" <<<"$lookup")" = 5 ] && [ "$(grep -c " green:47002$" <<<"$lookup")" = 5 ] &&
   [ "$(awk "NR > 1 && \$2 == prev {same++} {prev = \$2} END {print same + 0}" <<<"$lookup")" = 0 ]'
check "the buggy policy's verifier reason reaches the application" \
  'grep -A4 "=== a policy with a bug" <<<"$out" | grep -qi "verifier"'
exit $fail
