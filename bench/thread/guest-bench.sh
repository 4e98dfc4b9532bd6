#!/bin/sh
# Runs inside the sched_ext VM (tests/vm/guest.sh, with --bench): the thread benchmarks
# under the guest's default scheduler and under syrupd's sched_ext scheduler, in the same
# guest, one after the other. Prints "BENCH ..." lines (the host's bench/thread/run.sh
# collects them).
B=${SYRUP_BUILD:?set by init}
P=${SYRUP_SRC:?set by init}/policies
ROUNDS=${ROUNDS:-20000}
# syrup.bench_only=pingpong|cs on the kernel command line (SYRUP_VM_BENCH_ONLY on the host).
ONLY=$(sed -n 's/.*syrup.bench_only=\([^ ]*\).*/\1/p' /proc/cmdline)
want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }
mkdir -p /tmp/bench
$B/bin/syrupd --socket /tmp/bench/syrupd.sock --bpffs_root /sys/fs/bpf/syrup-bench --cache_dir /tmp/bench/cache \
  --on_exit=remove 2> /tmp/bench/syrupd.log &
SYRUPD=$!
for i in $(seq 1 200); do $B/bin/syrupctl --socket /tmp/bench/syrupd.sock ping >/dev/null 2>&1 && break; sleep 0.05; done
export SYRUP_SOCKET=/tmp/bench/syrupd.sock
# Warm the policy cache (clang in the guest is slow): the numbers are not about deploys.
$B/bin/syrup_thread_bench pingpong --policy $P/fifo.c --rounds 100 >/dev/null 2>&1
$B/bin/syrup_thread_bench cs --policy $P/cs_aware.c --seconds 1 >/dev/null 2>&1
# Ping-pong: free to use both vCPUs, then both threads on one vCPU (no cross-vCPU
# wakeup: the scheduler's own path only). "floor": the least sched_ext scheduler
# (scx_floor.bpf.c), loaded by the bench itself while syrupd's root is detached (no
# thread policy deployed between runs): what sched_ext itself costs.
want pingpong && for run in 1 2 3; do
  for pol in none floor $P/fifo.c; do
    arg=; [ $pol = floor ] && arg=--scx-floor; [ $pol != none ] && [ $pol != floor ] && arg="--policy $pol"
    $B/bin/syrup_thread_bench pingpong $arg --rounds $ROUNDS | sed "s/^/BENCH run$run /"
    $B/bin/syrup_thread_bench pingpong $arg --rounds $ROUNDS --same-core | sed "s/^/BENCH run$run /"
  done
done
# Critical sections: 4 threads on 2 vCPUs, with a 200 us sleep per iteration (servers
# waiting for requests), and without (always runnable).
# cs_aware against the same fair policy without its hint (use_hint=0): what the hint
# itself buys; fifo (run to completion) and the default scheduler beside them.
want cs && for sleep in 200 0; do
  for arg in "" "--policy $P/cs_aware.c" "--policy $P/cs_aware.c --param use_hint=0" "--policy $P/fifo.c"; do
    $B/bin/syrup_thread_bench cs $arg --threads 4 --seconds 3 --sleep-us $sleep | sed 's/^/BENCH /'
  done
done
kill $SYRUPD; wait $SYRUPD 2>/dev/null
grep -E 'sched_ext|error' /tmp/bench/syrupd.log | tail -5 | sed 's/^/BENCH syrupd: /'
# The same fifo ping-pong without the wakeup direct path (every wakeup queued in the
# application's DSQ and taken by a dispatch round): what the direct path buys.
SYRUP_SCX_DIRECT=0 $B/bin/syrupd --socket /tmp/bench/syrupd.sock --bpffs_root /sys/fs/bpf/syrup-bench \
  --cache_dir /tmp/bench/cache --on_exit=remove 2> /tmp/bench/syrupd-nodirect.log &
SYRUPD=$!
for i in $(seq 1 200); do $B/bin/syrupctl --socket /tmp/bench/syrupd.sock ping >/dev/null 2>&1 && break; sleep 0.05; done
want pingpong && for run in 1 2 3; do
  for same in "" --same-core; do
    $B/bin/syrup_thread_bench pingpong --policy $P/fifo.c --rounds $ROUNDS $same |
      sed -e 's/^RESULT {/RESULT {"variant":"no direct path",/' -e "s/^/BENCH run$run /"
  done
done
kill $SYRUPD; wait $SYRUPD 2>/dev/null
