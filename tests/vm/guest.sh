#!/bin/busybox sh
# Runs inside the sched_ext VM, chrooted into the overlay of this build and the toolchain
# (tests/vm/init.sh), at the host's paths. Runs the test program of the suite the kernel
# command line names (syrup.suite=thread: the sched_ext tests; xdp: the XDP hook beside
# xdp-filter), a real syrupd per suite, policies compiled by clang in the guest, and, if
# asked, the thread benchmarks; the last line is "SYRUP-VM-RESULT: PASS|FAIL".
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /usr/local/bin
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
# /tmp stays the overlay root's (writable, in RAM): a tmpfs over it would hide a source
# or build tree that lives under /tmp, as a fresh clone may.
/bin/busybox mkdir -p /tmp && /bin/busybox chmod 1777 /tmp
/bin/busybox mount -t tmpfs tmpfs /run
# cgroup v2, for the thread policies deployed by cgroup (syrupd finds it in mountinfo).
/bin/busybox mkdir -p /sys/fs/cgroup && /bin/busybox mount -t cgroup2 cgroup2 /sys/fs/cgroup
# bpffs where libxdp keeps its dispatchers' state; /var/run for ip netns.
/bin/busybox mkdir -p /sys/fs/bpf /var && /bin/busybox mount -t bpf bpf /sys/fs/bpf
[ -e /var/run ] || /bin/busybox ln -s /run /var/run
/bin/busybox --install -s /usr/local/bin
# The real ip (veth pairs, ip netns) and ethtool of the guest image over busybox's.
for t in /usr/bin/ip /usr/sbin/ethtool; do [ -x $t ] && /bin/busybox ln -sf $t /usr/local/bin/; done
[ -e /bin/sh ] || /bin/busybox ln -s busybox /bin/sh  # popen(), system()
suite=$(/bin/busybox sed -n 's/.*syrup.suite=\([^ ]*\).*/\1/p' /proc/cmdline)
# The XDP suite runs iproute2's ip (veth pairs, ip netns), which busybox's sh would not:
# it runs its own applet of a name whatever PATH says.
[ "$suite" = xdp ] && [ -x /usr/bin/dash ] && /bin/busybox ln -sf /usr/bin/dash /bin/sh
# libxdp's objects (its dispatcher) for syrupd and xdp-filter alike (tests/vm/run.sh).
objs=$(/bin/busybox sed -n 's/.*syrup.libxdp_objects=\([^ ]*\).*/\1/p' /proc/cmdline)
[ -n "$objs" ] && export LIBXDP_OBJECT_PATH=$objs && echo "SYRUP-VM: LIBXDP_OBJECT_PATH=$objs"
# Loopback, for the cross-layer test's SO_REUSEPORT group on 127.0.0.1.
/bin/busybox ip link set lo up || echo "SYRUP-VM: cannot bring up lo"
S=${SYRUP_SRC:?set by init}
B=${SYRUP_BUILD:?set by init}
export PATH=$B/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
# Emulated cores are ~50x slower than the host's: a syrupd restart takes seconds here.
export SYRUP_TEST_DAEMON_START_S=60
# ... and a compile, at 1 s on the host, took over syrupd's default 60 s when the host was loaded.
export SYRUP_TEST_COMPILE_TIMEOUT_S=300
# ... and a replay of a 2 s recording (1487 inputs) took over syrupd's default 10 s.
export SYRUP_TEST_RUN_MAX_MS=60000
# One compile cache for every syrupd of the run (tests/harness.cpp): each policy source
# and the sched_ext root scheduler compile once per guest run, not once per test suite.
export SYRUP_TEST_CACHE_DIR=/tmp/syrup-vm-cache
/bin/busybox mkdir -p -m 0700 $SYRUP_TEST_CACHE_DIR
cd /tmp
echo "SYRUP-VM: in the guest root at uptime $(cut -d' ' -f1 /proc/uptime) s, sched_ext state '$(cat /sys/kernel/sched_ext/state)'"
t0=$(cut -d' ' -f1 /proc/uptime)
/usr/bin/clang-19 --version | head -1 | sed 's/^/SYRUP-VM: /'
echo "SYRUP-VM: clang --version took $(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{print b-a}') s"
rc=0
case $suite in
  xdp) tests=syrup_xdp_vm_tests; bench=none ;;
  *) tests=syrup_thread_scx_tests; bench=$S/bench/thread/guest-bench.sh ;;
esac
if [ -x $B/bin/$tests ]; then
  filter=$(sed -n 's/.*syrup.filter=\([^ ]*\).*/\1/p' /proc/cmdline)
  { $B/bin/$tests ${filter:+--gtest_filter=$filter}; echo $? > /tmp/tests.rc; } 2>&1 |
    sed 's/^/SYRUP-VM: /'
  [ "$(cat /tmp/tests.rc)" = 0 ] || rc=1
else
  echo "SYRUP-VM: FAIL $B/bin/$tests is not in the guest"; rc=1
fi
if [ -f $bench ] && grep -q bench /proc/cmdline; then
  sh $bench 2>&1 | sed 's/^/SYRUP-VM: /'
fi
echo "SYRUP-VM: kernel log:"; dmesg | grep -i -E 'sched_ext|scx' | tail -12 | sed 's/^/SYRUP-VM:   /'
echo "SYRUP-VM: done at uptime $(cut -d' ' -f1 /proc/uptime) s"
[ $rc = 0 ] && echo "SYRUP-VM-RESULT: PASS" || echo "SYRUP-VM-RESULT: FAIL"
