#!/usr/bin/env bash
# The sched_ext VM test: boots a Debian sched_ext kernel under qemu TCG with this build's
# syrupd, libsyrup and tests on a disk (scripts/vm/guest-image.sh), and runs the thread
# hook's sched_ext test suite (hooks/thread/hooks/thread/tests/thread_scx_test.cpp) inside it: a real syrupd that
# detects sched_ext, owns the root scheduler and compiles policies with clang in the
# guest. Exit: 0 PASS, 1 FAIL, 77 SKIP (ctest SKIP_RETURN_CODE) with the reason.
#   tests/vm/run.sh BUILD_DIR [--suite thread|xdp] [--bench] [--filter GTEST_FILTER]
#                   [--libxdp-dispatcher 1.5.5|debian]
#   --suite: the guest's test program: thread (default) syrup_thread_scx_tests; xdp
#            syrup_xdp_vm_tests, Syrup's XDP root beside xdp-filter in libxdp's dispatcher
#            (the kernel's BPF trampolines)
#   --libxdp-dispatcher (xdp suite): 1.5.5 (default) the guest's libxdp (Debian 12's
#            1.3.1) and xdp-filter use a dispatcher object with libxdp 1.5.5's slots
#            (scripts/libxdp-dispatcher.py, through LIBXDP_OBJECT_PATH); debian: Debian's
#            own, whose slots the kernel does not let Syrup's root replace
#   --bench: also run the thread benchmarks in the guest (bench/thread/guest-bench.sh)
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
shift || true
BENCH=0
FILTER=
SUITE=thread
DISPATCHER=1.5.5
while [ $# -gt 0 ]; do
  case $1 in
    --bench) BENCH=1 ;;
    --suite) SUITE=$2; shift ;;
    --filter) FILTER=$2; shift ;;
    --libxdp-dispatcher) DISPATCHER=$2; shift ;;
  esac
  shift
done
# A hard wall-clock bound on the whole run, from here to qemu's exit, retries and the
# wait for another VM test included (SYRUP_VM_TIMEOUT s; ctest's TIMEOUT for the entry
# is a little above it, so the run reports why it stopped): the XDP suite takes ~80 s
# on a quiet host, the thread suite ~3.5 min (5.5 min on a host at load 10, with the
# kernel download and the toolchain disk of a fresh machine); with --bench 20 minutes.
case $SUITE in xdp) TMO=240 ;; *) TMO=480 ;; esac
[ $BENCH = 1 ] && TMO=1200
TMO=${SYRUP_VM_TIMEOUT:-$TMO}
deadline=$(( $(date +%s) + TMO ))
left() { echo $(( deadline - $(date +%s) )); }
skip() { echo "SKIP: $*"; exit 77; }
# One VM at a time per build tree (two ctest runs at once would each get half the
# emulated cores), each run in its own directory; the last run's console is also at
# $BUILD/vm/console.log.
mkdir -p "$BUILD/vm"
exec 9>"$BUILD/vm/.lock"
if ! flock -n 9; then
  echo "another VM test of this build tree is running: waiting for it"
  flock -w "$(left)" 9 || { echo "FAIL: the other VM test did not finish within $TMO s"; exit 1; }
fi
OUT=$BUILD/vm/run
rm -rf "$OUT" && mkdir -p "$OUT"
trap 'cp -f "$OUT/console.log" "$BUILD/vm/console.log" 2>/dev/null' EXIT

for tool in qemu-system-x86_64 busybox cpio gzip mke2fs xz; do
  command -v $tool >/dev/null || skip "$tool is not installed (scripts/setup-deps.sh installs it)"
done
[ "$(id -u)" = 0 ] || skip "needs root (apt-get download into /var/cache/syrup-vm)"
kline=$(timeout "$(left)" bash "$SRC/scripts/vm/fetch-kernel.sh" | tail -1); rc=${PIPESTATUS[0]}
[ $rc = 77 ] && skip "no sched_ext kernel could be fetched (see above)"
[ $rc = 124 ] && { echo "FAIL: fetching the kernel took over $TMO s"; exit 1; }
KDIR=${kline#KERNEL=}
[ -f "$KDIR/vmlinuz" ] || skip "fetch-kernel.sh gave no kernel ($kline)"
[ -f "$KDIR/modules/virtio_blk.ko" ] || skip "no guest modules in $KDIR/modules (fetch-kernel.sh)"
echo "kernel: $(cat "$KDIR/kver") ($KDIR), BTF check: $(head -1 "$KDIR/btf-check.txt" 2>/dev/null)"
case $SUITE in
  thread) TESTS=syrup_thread_scx_tests ;;
  xdp) TESTS=syrup_xdp_vm_tests ;;
  *) echo "FAIL: unknown suite '$SUITE' (thread, xdp)"; exit 1 ;;
esac
for b in syrupd syrupctl $TESTS; do
  [ -x "$BUILD/bin/$b" ] || { echo "FAIL: $BUILD/bin/$b is missing (build first)"; exit 1; }
done

t0=$(date +%s.%N)
files=("$BUILD/bin/syrupd" "$BUILD/bin/syrupctl" "$BUILD/bin/$TESTS" "$BUILD"/lib/libsyrup.so*
       "$SRC/kernel" "$SRC/policies" "$SRC/tests/policies" "$SRC/tests/vm/guest.sh")
[ -x "$BUILD/bin/syrup-agent" ] && files+=("$BUILD/bin/syrup-agent")
LIBXDP_OBJS=
if [ $SUITE = xdp ] && [ "$DISPATCHER" = 1.5.5 ]; then
  # libxdp reads every BPF object (its dispatcher, xdp-filter's) from LIBXDP_OBJECT_PATH
  # alone when it is set: the patched dispatcher beside links to Debian's other objects.
  LIBXDP_OBJS=${SYRUP_VM_CACHE:-/var/cache/syrup-vm}/libxdp-1.5.5-objects
  mkdir -p "$LIBXDP_OBJS" && ln -sf /usr/lib/x86_64-linux-gnu/bpf/*.o "$LIBXDP_OBJS/" && rm -f "$LIBXDP_OBJS/xdp-dispatcher.o" &&
    python3 "$SRC/scripts/libxdp-dispatcher.py" /usr/lib/x86_64-linux-gnu/bpf/xdp-dispatcher.o \
      "$LIBXDP_OBJS/xdp-dispatcher.o" || { echo "FAIL: no libxdp 1.5.5 dispatcher object (above)"; exit 1; }
  files+=("$LIBXDP_OBJS")
fi
if [ $BENCH = 1 ]; then
  files+=("$SRC/bench/thread")
  for b in syrup_thread_bench scx_floor.bpf.o; do [ -e "$BUILD/bin/$b" ] && files+=("$BUILD/bin/$b"); done
fi
imgs=$(timeout "$(left)" bash "$SRC/scripts/vm/guest-image.sh" "$OUT" "${files[@]}") || { echo "FAIL: guest images (or over $TMO s)"; exit 1; }
TC=$(sed -n 's/^TOOLCHAIN=//p' <<<"$imgs")
PJ=$(sed -n 's/^PROJECT=//p' <<<"$imgs")

R=$OUT/initramfs
rm -rf "$R" && mkdir -p "$R"/{bin,proc,sys,dev}
cp "$(command -v busybox)" "$R/bin/busybox" && ln -s busybox "$R/bin/sh"
cp "$KDIR/modules/virtio_blk.ko" "$KDIR/modules/overlay.ko" "$R/"
[ -f "$KDIR/modules/veth.ko" ] && cp "$KDIR/modules/veth.ko" "$R/"  # the XDP suite's veth pairs
sed -e "s|@SRC@|$SRC|g" -e "s|@BUILD@|$BUILD|g" "$SRC/tests/vm/init.sh" > "$R/init" && chmod +x "$R/init"
(cd "$R" && find . | cpio -o -H newc --quiet) | gzip -1 > "$OUT/initramfs.gz"
t1=$(date +%s.%N)

append="console=ttyS0 quiet panic=-1 oops=panic syrup.suite=$SUITE"
[ $BENCH = 1 ] && append+=" syrup.bench"
# SYRUP_VM_BENCH_ONLY=pingpong|cs: only that part of the thread benchmarks.
[ -n "${SYRUP_VM_BENCH_ONLY:-}" ] && append+=" syrup.bench_only=$SYRUP_VM_BENCH_ONLY"
[ -n "$FILTER" ] && append+=" syrup.filter=$FILTER"
[ -n "$LIBXDP_OBJS" ] && append+=" syrup.libxdp_objects=$LIBXDP_OBJS"
# Single-threaded TCG (thread=single): with one host thread per vCPU (the default), the
# guest kernel now and then died of an int3 Oops while patching its own text (static
# keys), at boot and when sched_ext was enabled -- a cross-vCPU self-modifying-code race
# of the emulation, seen about once in 15 boots. One thread for both vCPUs cannot race,
# and costs ~15% here (89 s instead of 78 s for the suite). Should a guest still die
# before /init prints (nothing of ours ran yet), the boot is retried, at most twice; a
# guest that reached /init is never retried: what happens after that is the result.
# Each attempt gets what is left of the bound, and a retry needs a minute of it.
for attempt in 1 2 3; do
  [ "$(left)" -gt 0 ] || { qrc=124; break; }
  timeout --foreground "$(left)" qemu-system-x86_64 -accel tcg,thread=single -cpu max -smp 2 -m 2048 \
    -kernel "$KDIR/vmlinuz" -initrd "$OUT/initramfs.gz" -append "$append" \
    -drive "file=$TC,format=raw,if=virtio,readonly=on" -drive "file=$PJ,format=raw,if=virtio,readonly=on" \
    -nographic -no-reboot -nic none </dev/null > "$OUT/console.log" 2>&1
  qrc=$?
  grep -aq 'SYRUP-VM: guest up' "$OUT/console.log" && break
  cp "$OUT/console.log" "$OUT/console.boot-failure-$attempt.log"
  echo "the guest kernel died before /init (attempt $attempt): $(grep -a -m1 -E 'Oops|panic' "$OUT/console.log")"
  [ "$(left)" -gt 60 ] || break
done
t2=$(date +%s.%N)
grep -a 'SYRUP-VM' "$OUT/console.log" | sed 's/\r$//'
awk -v a="$t0" -v b="$t1" -v c="$t2" -v q=$qrc -v f="$BUILD/vm/console.log" \
  'BEGIN { printf "host: images+initramfs %.1f s, qemu boot+tests %.1f s (exit %d); console: %s\n", b - a, c - b, q, f }'
if grep -aq 'SYRUP-VM-RESULT: PASS' "$OUT/console.log"; then echo PASS; exit 0; fi
if [ $qrc = 124 ]; then echo "FAIL: the VM run did not finish within $TMO s (SYRUP_VM_TIMEOUT)"; else echo FAIL; fi
grep -av 'SYRUP-VM' "$OUT/console.log" | tail -30
exit 1
