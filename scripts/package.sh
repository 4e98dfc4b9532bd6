#!/usr/bin/env bash
# Builds the Debian packages syrupd, libsyrup0 and libsyrup-dev (packaging/deb.cmake) into
# OUT (default build/packages), then checks them with lintian when it is installed: an
# error fails the script, warnings are printed.
#   scripts/package.sh [-o OUT] [-b BUILD_DIR]
# Without -b: a release tree build-deb/ (prefix /usr, no fault injection, no tests) is
# configured and the four installed targets are built in it. With -b: an already
# configured tree is packaged as it is (the suite's own tree, for tests/packaging); a tree
# built with -DSYRUP_FAULT_INJECTION=ON is for tests only, and said so.
# CPack, not dpkg-buildpackage: it packages a tree that is already built (no second
# build of the whole suite), and runs dpkg-shlibdeps for the library dependencies.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$src/build/packages
build=
while getopts "o:b:" opt; do
  case $opt in
    o) out=$OPTARG ;;
    b) build=$OPTARG ;;
    *) echo "usage: scripts/package.sh [-o OUT] [-b BUILD_DIR]" >&2; exit 2 ;;
  esac
done
for tool in cpack dpkg-shlibdeps; do
  command -v "$tool" >/dev/null || { echo "package.sh: $tool is missing (bash scripts/setup-deps.sh)" >&2; exit 1; }
done

if [ -z "$build" ]; then
  build=$src/build-deb
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
    -DSYRUP_FAULT_INJECTION=OFF -DSYRUP_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null
fi
build=$(cd "$build" && pwd)
[ -f "$build/CPackConfig.cmake" ] || { echo "package.sh: $build is not a configured Syrup tree (no CPackConfig.cmake)" >&2; exit 1; }
if grep -q '^SYRUP_FAULT_INJECTION:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "package.sh: $build has SYRUP_FAULT_INJECTION=ON: these packages are for tests only" >&2
fi
cmake --build "$build" -j "$(nproc)" --target syrup syrupd syrupctl syrup-agent >/dev/null

mkdir -p "$out"
staging=$build/cpack
rm -rf "$staging"
# CPack writes the archives itself, every file root's.
(cd "$build" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$staging" >/dev/null)
debs=("$staging"/*.deb)
cp "${debs[@]}" "$out/"
rm -rf "$staging"
for d in "${debs[@]}"; do echo "$out/$(basename "$d")"; done

if ! command -v lintian >/dev/null; then
  echo "package.sh: lintian is not installed; packages not checked" >&2
  exit 0
fi
report=$(lintian --no-cfg --tag-display-limit 0 "${debs[@]/#$staging/$out}" 2>&1 | grep -v "running with root privileges") || true
[ -z "$report" ] || echo "$report" >&2
if grep -q '^E: ' <<<"$report"; then
  echo "package.sh: lintian reports errors (above)" >&2
  exit 1
fi
