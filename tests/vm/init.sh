#!/bin/sh
# The VM's /init: mounts, runs the sched_ext checks, powers off.
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev 2>/dev/null
/bin/busybox mount -t bpf bpf /sys/fs/bpf
echo "SYRUP-VM: guest up: $(uname -r), $(grep -c ^processor /proc/cpuinfo) cpus, uptime $(cut -d' ' -f1 /proc/uptime) s, sched_ext state '$(cat /sys/kernel/sched_ext/state 2>/dev/null || echo absent)'"
/bin/scx_guest /bpf/scx_thread_prio.o
echo "SYRUP-VM: kernel log:"; dmesg | grep -i -E 'sched_ext|scx' | tail -8 | sed 's/^/SYRUP-VM:   /'
echo "SYRUP-VM: done at uptime $(cut -d' ' -f1 /proc/uptime) s"
/bin/busybox poweroff -f
