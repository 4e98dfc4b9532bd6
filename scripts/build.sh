#!/usr/bin/env bash
# Installs what is missing (Debian packages) and builds Syrup into build/. Arguments go to
# CMake's configure step (e.g. -DSYRUP_FAULT_INJECTION=ON, which scripts/test.sh sets).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j "$(nproc)"
