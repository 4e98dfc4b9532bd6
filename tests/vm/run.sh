#!/usr/bin/env bash
# The sched_ext VM test: boots a Debian sched_ext kernel under qemu TCG and runs the
# thread hook's sched_ext backend inside it with the same policy source the host's agent
# backend runs. Exit: 0 PASS, 1 FAIL, 77 SKIP (ctest SKIP_RETURN_CODE) with the reason.
#   tests/vm/run.sh BUILD_DIR
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$SRC/build}
OUT=$BUILD/vm
TMO=${SYRUP_VM_TIMEOUT:-240}
skip() { echo "SKIP: $*"; exit 77; }
mkdir -p "$OUT"

for tool in qemu-system-x86_64 busybox cpio gzip; do
  command -v $tool >/dev/null || skip "$tool is not installed (scripts/setup-deps.sh installs it)"
done
[ "$(id -u)" = 0 ] || skip "needs root (apt-get download into /var/cache/syrup-vm)"
kline=$(bash "$SRC/scripts/vm/fetch-kernel.sh" | tail -1); rc=${PIPESTATUS[0]}
[ $rc = 77 ] && skip "no sched_ext kernel could be fetched (see above)"
KDIR=${kline#KERNEL=}
[ -f "$KDIR/vmlinuz" ] || skip "fetch-kernel.sh gave no kernel ($kline)"
echo "kernel: $(cat "$KDIR/kver") ($KDIR), BTF check: $(head -1 "$KDIR/btf-check.txt" 2>/dev/null)"

t0=$(date +%s.%N)
CLANG=${CLANG:-clang-19}
FLAGS=(-g -O2 -target bpf -mcpu=v3 -D__TARGET_ARCH_x86 -DSYR_HOOK_THREAD -I"$SRC/kernel/include"
       -I"$SRC/kernel/hooks" -I/usr/include/x86_64-linux-gnu -Wall -Wno-unused-function)
R=$OUT/initramfs
rm -rf "$R" && mkdir -p "$R"/{bin,bpf,proc,sys,dev,tmp}
# The policy, unchanged, wrapped as a sched_ext scheduler (what syrupd compiles).
for p in tests/policies/thread_prio.c; do
  b=$(basename $p .c)
  { printf '#include <syrup/policy.h>\n#line 1 "%s"\n' "$p"; cat "$SRC/$p"; echo '#include "thread_scx.bpf.h"'; } > "$OUT/scx_$b.c"
  $CLANG "${FLAGS[@]}" -c "$OUT/scx_$b.c" -o "$R/bpf/scx_$b.o" || { echo "FAIL: $p does not compile for sched_ext"; exit 1; }
done
cc -O2 -Wall -o "$OUT/scx_guest" "$SRC/tests/vm/scx_guest.c" -lbpf -lpthread || { echo "FAIL: guest build"; exit 1; }
cp "$OUT/scx_guest" "$R/bin/"
cp "$(command -v busybox)" "$R/bin/busybox"
for a in sh mount cat echo grep tail sed cut dmesg poweroff uname; do ln -s busybox "$R/bin/$a"; done
ldd "$OUT/scx_guest" | awk '/=>/ {print $3; next} $1 ~ /^\// {print $1}' | while read -r lib; do
  [ -n "$lib" ] && mkdir -p "$R$(dirname "$lib")" && cp -L "$lib" "$R$lib"
done
cp "$SRC/tests/vm/init.sh" "$R/init" && chmod +x "$R/init"
(cd "$R" && find . | cpio -o -H newc --quiet) | gzip -1 > "$OUT/initramfs.gz"
t1=$(date +%s.%N)

timeout --foreground "$TMO" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1024 \
  -kernel "$KDIR/vmlinuz" -initrd "$OUT/initramfs.gz" \
  -append "console=ttyS0 quiet panic=-1 oops=panic" \
  -nographic -no-reboot -nic none </dev/null > "$OUT/console.log" 2>&1
qrc=$?
t2=$(date +%s.%N)
grep 'SYRUP-VM' "$OUT/console.log"
printf 'host: build %.1f s, qemu boot+tests %.1f s (exit %d); console: %s\n' \
  "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" $qrc "$OUT/console.log"
if grep -q 'SYRUP-VM-RESULT: PASS' "$OUT/console.log"; then echo PASS; exit 0; fi
if [ $qrc = 124 ]; then echo "FAIL: the VM did not finish within $TMO s"; else echo FAIL; fi
tail -30 "$OUT/console.log"
exit 1
