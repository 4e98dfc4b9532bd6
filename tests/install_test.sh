#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then build a consumer against it twice:
# with find_package(syrup) and with pkg-config. Both must build and run.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
prefix=$(mktemp -d /tmp/syrup-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/syrupd bin/syrupctl include/syrup/syrup.h include/syrup/policy.h include/syrup/abi.h \
         share/syrup/kernel/include/syrup/policy.h share/syrup/kernel/hooks/socket_select.bpf.h \
         share/syrup/policies/round_robin.c; do
  [ -e "$prefix/$f" ] || { echo "install_test: $f was not installed" >&2; exit 1; }
done
libdir=$(dirname "$(find "$prefix" -name 'libsyrup.so' | head -1)")
cmake -S "$src/install_consumer" -B "$prefix/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-build" >/dev/null
LD_LIBRARY_PATH=$libdir "$prefix/consumer-build/consumer"
PKG_CONFIG_PATH=$libdir/pkgconfig cc "$src/install_consumer/consumer.c" -o "$prefix/consumer-pc" \
  $(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs syrup)
LD_LIBRARY_PATH=$libdir "$prefix/consumer-pc"
echo "install_test: find_package(syrup) and pkg-config syrup both work"
