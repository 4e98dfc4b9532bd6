#!/usr/bin/env bash
# The whole test suite, as root: installs what is missing, builds, runs every test
# (unit tests, and integration tests against the running kernel with a private syrupd).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "test.sh: run as root (the integration tests load BPF programs)" >&2
  exit 1
fi
# With the deploy's fault points compiled in, so the rollback of every step is tested
# (syrupd/deploy_txn.h; they act only on SYRUP_FAULT_STEP in syrupd's own environment).
bash scripts/build.sh -DSYRUP_FAULT_INJECTION=ON
cd build
ctest --output-on-failure --timeout 300 "$@"
