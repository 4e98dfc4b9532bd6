#!/bin/sh
# The VM's /init (initramfs: busybox and two modules). Mounts the two disks
# scripts/vm/guest-image.sh made -- vda: toolchain (clang, headers), vdb: this build --
# as one overlay root with a tmpfs on top (writes stay in RAM), and runs the guest
# script inside it. Every line the tests want the host to see starts with "SYRUP-VM".
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
echo "SYRUP-VM: guest up: $(/bin/busybox uname -r), $(/bin/busybox grep -c ^processor /proc/cpuinfo) cpus, uptime $(/bin/busybox cut -d' ' -f1 /proc/uptime) s"
/bin/busybox insmod /virtio_blk.ko && /bin/busybox insmod /overlay.ko || echo "SYRUP-VM: FAIL cannot load the guest's modules"
[ -f /veth.ko ] && { /bin/busybox insmod /veth.ko || echo "SYRUP-VM: cannot load veth.ko"; }
for i in 1 2 3 4 5 6 7 8 9 10; do [ -b /dev/vdb ] && break; /bin/busybox sleep 0.2; done
/bin/busybox mkdir -p /t /p /rw /newroot
/bin/busybox mount -o ro /dev/vda /t && /bin/busybox mount -o ro /dev/vdb /p || echo "SYRUP-VM: FAIL cannot mount the disks"
/bin/busybox mount -t tmpfs -o size=512m tmpfs /rw
/bin/busybox mkdir -p /rw/upper /rw/work
/bin/busybox mount -t overlay overlay -o lowerdir=/p:/t,upperdir=/rw/upper,workdir=/rw/work /newroot ||
  echo "SYRUP-VM: FAIL cannot mount the overlay root"
echo "SYRUP-VM: root mounted at uptime $(/bin/busybox cut -d' ' -f1 /proc/uptime) s"
# @SRC@ and @BUILD@ are the host's source and build directories (tests/vm/run.sh fills
# them in): the guest sees them at the same paths.
/bin/busybox chroot /newroot /bin/busybox env SYRUP_SRC=@SRC@ SYRUP_BUILD=@BUILD@ /bin/busybox sh @SRC@/tests/vm/guest.sh
/bin/busybox poweroff -f
