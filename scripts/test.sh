#!/usr/bin/env bash
# The whole test suite, as root: installs what is missing, builds, runs every test
# (unit tests, and integration tests against the running kernel with a private syrupd).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "test.sh: run as root (the integration tests load BPF programs)" >&2
  exit 1
fi
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 300 "$@"
