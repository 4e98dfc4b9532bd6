#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then build a consumer against it twice:
# with find_package(syrup) and with pkg-config. Both must build and run. Then the
# README's libsyrup example must build, and (as root) deploy through the installed syrupd.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
prefix=$(mktemp -d /tmp/syrup-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in sbin/syrupd sbin/syrup-agent bin/syrupctl include/syrup/syrup.h include/syrup/policy.h include/syrup/abi.h \
         share/syrup/kernel/include/syrup/policy.h share/syrup/kernel/hooks/socket_select/wrapper.bpf.h \
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

# The README's libsyrup example, as the README shows it, in a program built with
# pkg-config against the installed package; as root it runs against the installed
# syrupd, which compiles with its own installed headers (not the source tree's).
readme=$src/../README.md
example=$(awk '/^## Deploying from an application/ { in_section = 1 }
               in_section && /^```c$/ { in_code = 1; next }
               in_code && /^```$/ { exit }
               in_code' "$readme")
[ -n "$example" ] || { echo "install_test: no C example under '## Deploying from an application' in README.md" >&2; exit 1; }
{
  echo '#include <stdio.h>'
  echo '#include <arpa/inet.h>'
  echo '#include <unistd.h>'
  grep '^#include' <<<"$example"
  echo 'int main(void) {'
  echo 'uint32_t worker = 1;'
  grep -v '^#include' <<<"$example"
  echo 'if (id < 0) return 1;'
  echo 'uint64_t v = 0;'
  echo 'int scan_fd = syr_map_open("scan_map");'
  echo 'int looked = scan_fd < 0 ? scan_fd : syr_map_lookup_elem(scan_fd, &worker, &v);'
  echo 'if (scan_fd >= 0) close(scan_fd);'
  echo 'if (looked || v != 1) {'
  echo '  fprintf(stderr, "scan_map[%u] is %llu, not 1: %s\n", worker, (unsigned long long)v, syr_last_error());'
  echo '  return 1;'
  echo '}'
  echo 'printf("policy %d deployed; scan_map[%u] = %llu through the kernel map\n", id, worker, (unsigned long long)v);'
  echo 'return 0;'
  echo '}'
} > "$prefix/readme_example.c"
PKG_CONFIG_PATH=$libdir/pkgconfig cc -Wall -Werror "$prefix/readme_example.c" -o "$prefix/readme_example" \
  $(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs syrup) ||
  { echo "install_test: the README's libsyrup example does not build (source: $prefix/readme_example.c)" >&2; exit 1; }
if [ "$(id -u)" != 0 ]; then
  echo "install_test: the README example builds; not run (it needs root to start syrupd)"
  exit 0
fi
bpffs=/sys/fs/bpf/syrup-install-$$
syrupd_pid=
cleanup() {
  [ -n "$syrupd_pid" ] && kill "$syrupd_pid" 2>/dev/null && wait "$syrupd_pid" 2>/dev/null
  rm -rf "$bpffs" "$prefix"
}
trap cleanup EXIT
mkdir -p "$prefix/app"
cp "$prefix/share/syrup/policies/scan_avoid.c" "$prefix/app/"
"$prefix/sbin/syrupd" --socket "$prefix/syrupd.sock" --bpffs_root "$bpffs" --cache_dir "$prefix/cache" \
  --state_file "$prefix/syrupd.state.json" --on_exit remove 2> "$prefix/syrupd.log" &
syrupd_pid=$!
for _ in $(seq 100); do
  "$prefix/bin/syrupctl" --socket "$prefix/syrupd.sock" ping >/dev/null 2>&1 && break
  sleep 0.1
done
kernel_dir=$prefix/share/syrup/kernel
grep -q "headers from $kernel_dir" "$prefix/syrupd.log" ||
  { echo "install_test: the installed syrupd does not use its installed headers ($kernel_dir):" >&2; cat "$prefix/syrupd.log" >&2; exit 1; }
(cd "$prefix/app" && SYRUP_SOCKET=$prefix/syrupd.sock LD_LIBRARY_PATH=$libdir "$prefix/readme_example") ||
  { echo "install_test: the README's libsyrup example failed; syrupd's log:" >&2; cat "$prefix/syrupd.log" >&2; exit 1; }
echo "install_test: the README's libsyrup example builds and deploys through the installed syrupd"
