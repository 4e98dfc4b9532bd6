#!/bin/sh
# Runs inside the sched_ext VM (tests/vm/guest.sh, with --bench): the thread benchmarks
# under the guest's default scheduler and under syrupd's sched_ext scheduler, in the same
# guest, one after the other. Prints "BENCH ..." lines (the host's bench/thread/run.sh
# collects them).
B=${SYRUP_BUILD:?set by init}
P=${SYRUP_SRC:?set by init}/policies
ROUNDS=${ROUNDS:-20000}
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
# wakeup: the scheduler's own path only).
for run in 1 2 3; do
  for pol in none $P/fifo.c; do
    arg=; [ $pol != none ] && arg="--policy $pol"
    $B/bin/syrup_thread_bench pingpong $arg --rounds $ROUNDS | sed "s/^/BENCH run$run /"
    $B/bin/syrup_thread_bench pingpong $arg --rounds $ROUNDS --same-core | sed "s/^/BENCH run$run /"
  done
done
# Critical sections: 4 threads on 2 vCPUs, with a 200 us sleep per iteration (servers
# waiting for requests), and without (always runnable).
for sleep in 200 0; do
  for pol in none $P/cs_aware.c $P/fifo.c; do
    arg=; [ $pol != none ] && arg="--policy $pol"
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
for run in 1 2 3; do
  for same in "" --same-core; do
    $B/bin/syrup_thread_bench pingpong --policy $P/fifo.c --rounds $ROUNDS $same |
      sed -e 's/^RESULT {/RESULT {"variant":"no direct path",/' -e "s/^/BENCH run$run /"
  done
done
kill $SYRUPD; wait $SYRUPD 2>/dev/null
