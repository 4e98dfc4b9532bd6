#!/usr/bin/env bash
# `syrupctl validate`: the shipped example config is valid next to the shipped policies
# (exit 0, summary), and a broken one prints FILE:LINE: KEY: MESSAGE and exits 1.
#   tests/validate_cli_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
ctl=$1/bin/syrupctl
src=$2
dir=$(mktemp -d /tmp/syrup-validate-XXXXXX)
trap 'rm -rf "$dir"' EXIT
# As installed: share/syrup/syrup.example.yaml beside share/syrup/policies/.
cp "$src/packaging/syrup.example.yaml" "$dir/syrup.yaml"
ln -s "$src/policies" "$dir/policies"
out=$("$ctl" validate "$dir/syrup.yaml")
echo "$out"
[ "$(echo "$out" | head -1)" = "$dir/syrup.yaml: valid: 2 tenants, 3 policies" ]
"$ctl" --json validate "$dir/syrup.yaml" | grep '"valid": true' > /dev/null

cat > "$dir/bad.yaml" <<'YAML'
tenants:
  - name: kv
    uid: 1000
    policies:
      - hook: xdp
        policy: policies/round_robin.c
        ifname: eth0
        ports: [9000, 70000]
YAML
set +e
err=$(cd "$dir" && "$ctl" validate bad.yaml 2>&1 >/dev/null)
rc=$?
set -e
echo "$err"
[ $rc -eq 1 ] || { echo "validate_cli_test: exit $rc, expected 1" >&2; exit 1; }
[ "$(echo "$err" | head -1)" = "bad.yaml:8: tenants[0].policies[0].ports: must be a list of ports, each an integer in 1..65535, got 70000" ]
set +e
"$ctl" validate > /dev/null 2>&1
rc=$?
set -e
[ $rc -eq 2 ] || { echo "validate_cli_test: no FILE gave exit $rc, expected 2 (usage)" >&2; exit 1; }
# --max_source_bytes: the limit syrupd is run with applies to the policy files.
big=$(wc -c < "$src/policies/xdp_classify.c")
set +e
err=$("$ctl" validate --max_source_bytes=$((big - 1)) "$dir/syrup.yaml" 2>&1 >/dev/null)
rc=$?
set -e
echo "$err"
[ $rc -eq 1 ] || { echo "validate_cli_test: --max_source_bytes below a policy's size gave exit $rc, expected 1" >&2; exit 1; }
echo "$err" | grep -q "xdp_classify.c is larger than $((big - 1)) bytes (syrupd's --max_source_bytes)" ||
  { echo "validate_cli_test: no diagnostic naming the --max_source_bytes limit" >&2; exit 1; }
most=$(cat "$src"/policies/{xdp_classify,socket_local,fifo}.c | wc -c)
"$ctl" validate --max_source_bytes="$most" "$dir/syrup.yaml" > /dev/null
echo "validate_cli_test: ok"
