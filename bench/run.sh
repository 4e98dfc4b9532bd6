#!/bin/sh
# Builds syrup_bench (and the syrupd it starts) if needed, then runs it from the source
# tree, so results land in bench/results/latest.json. Arguments go to syrup_bench:
#   bench/run.sh                    every benchmark
#   bench/run.sh decision --rounds 9
# BUILD_DIR overrides the build directory (default: build/). Needs root to run.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja
fi
cmake --build "$build" --target syrup_bench
cd "$root"
if [ "$(id -u)" -ne 0 ]; then
  exec sudo "$build/bin/syrup_bench" "$@"
fi
exec "$build/bin/syrup_bench" "$@"
