#!/usr/bin/env bash
# The systemd unit: `cmake --install` puts it in <prefix>/lib/systemd/system, it is
# Type=notify and syrupd calls sd_notify, and `systemd-analyze verify` accepts it.
# SKIPs (77) without systemd-analyze.
#   tests/systemd_unit_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
if ! command -v systemd-analyze > /dev/null; then
  echo "SKIP: systemd-analyze is not installed (package systemd)" >&2
  exit 77
fi
prefix=$(mktemp -d /tmp/syrup-unit-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > /dev/null
unit=$prefix/lib/systemd/system/syrupd.service
[ -f "$unit" ] || { echo "systemd_unit_test: $unit was not installed" >&2; exit 1; }
grep -q '^ExecStart=.*/syrupd --config /etc/syrup/syrup.yaml$' "$unit" ||
  { echo "systemd_unit_test: unexpected ExecStart in $unit" >&2; exit 1; }
# syrupd says READY=1 itself (sd_notify) once adoption and the config are done; a unit of
# another type would let systemd start the units after it before that.
grep -qx 'Type=notify' "$unit" ||
  { echo "systemd_unit_test: $unit is not Type=notify" >&2; exit 1; }
if grep -q '^NotifyAccess=' "$unit"; then
  echo "systemd_unit_test: NotifyAccess= set in $unit: only syrupd itself (the default, main) may say it is ready" >&2
  exit 1
fi
# Type=notify without sd_notify in the binary would time out every start.
# grep reads all of nm's output: with -q it could exit first, and under pipefail nm's SIGPIPE
# would read as a missing symbol.
if ! nm -D --undefined-only "$build/bin/syrupd" | grep -w sd_notifyf > /dev/null; then
  echo "systemd_unit_test: $build/bin/syrupd does not call sd_notifyf" >&2
  exit 1
fi
# The unit names the configured sbindir and bindir (default /usr/local/sbin, /usr/local/bin)
# and verify checks that its commands exist: point them at this build tree's binaries.
sbindir=$(sed -n 's|^ExecStart=\(.*\)/syrupd .*|\1|p' "$unit")
bindir=$(sed -n 's|^ExecReload=\(.*\)/syrupctl .*|\1|p' "$unit")
mkdir -p "$prefix/verify"
sed "s|$sbindir/syrupd |$build/bin/syrupd |; s|$bindir/syrupctl |$build/bin/syrupctl |" "$unit" > "$prefix/verify/syrupd.service"
if ! out=$(systemd-analyze verify --man=no --recursive-errors=no "$prefix/verify/syrupd.service" 2>&1); then
  echo "systemd_unit_test: systemd-analyze verify failed:" >&2
  echo "$out" >&2
  exit 1
fi
# verify also reports problems it does not fail on: none may name our unit.
if echo "$out" | grep -i 'syrupd.service'; then
  echo "systemd_unit_test: systemd-analyze verify complained about the unit (above)" >&2
  exit 1
fi
echo "systemd_unit_test: $unit installed and verified${out:+ (other output: $out)}"
