#!/usr/bin/env bash
# Builds the disks a sched_ext test guest boots with, so the guest runs this build's
# syrupd, syrupctl, libsyrup and tests, and compiles policies with the host's clang --
# all at the same paths as on the host (the guest's root is an overlay of the two disks).
#
#   guest-image.sh OUTDIR FILE_OR_DIR...
#
# - toolchain disk (cached in $SYRUP_VM_CACHE, keyed by the package versions it holds):
#   clang-19 with its shared libraries and resource headers, the kernel/libbpf UAPI
#   headers policies include, and busybox;
# - project disk (built per run, small): each FILE_OR_DIR given (absolute paths; a
#   directory is taken whole) and the shared-library closure (ldd) of every ELF among them.
# Both are ext4 images made with mke2fs -d (no root mount needed). Prints
#   TOOLCHAIN=<image>
#   PROJECT=<image>
# Why disks and not 9p or one big initramfs: Debian's cloud kernel has no 9p; an
# initramfs holding clang (~270 MB) is unpacked into RAM at every boot, a disk is read on
# demand.
set -euo pipefail
CACHE=${SYRUP_VM_CACHE:-/var/cache/syrup-vm}
OUT=$1
shift
mkdir -p "$OUT" "$CACHE"

# Copies path $1 (file, symlink or directory) into stage dir $2 at the same path.
put() {
  local src=$1 stage=$2
  mkdir -p "$stage$(dirname "$src")"
  cp -a "$src" "$stage$(dirname "$src")/" 2>/dev/null || cp -aL "$src" "$stage$src"
}

is_elf() { [ "$(head -c 4 "$1" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; }

# The shared-library closure of ELF file $1, into stage $2 (content at the path ldd prints).
put_libs() {
  local f=$1 stage=$2 lib
  { ldd "$f" 2>/dev/null || true; } | awk '/=>/ && $3 ~ /^\// {print $3; next} $1 ~ /^\// {print $1}' | while read -r lib; do
    [ -e "$stage$lib" ] && continue
    mkdir -p "$stage$(dirname "$lib")"
    cp -L "$lib" "$stage$lib"
  done
}

# ext4 image of stage $1 into $2, sized to fit.
mkimage() {
  local stage=$1 img=$2 kb
  kb=$(du -sk "$stage" | cut -f1)
  kb=$(( kb * 12 / 10 + 16384 ))
  rm -f "$img.tmp"
  mke2fs -q -F -t ext4 -O ^has_journal -L syrup -d "$stage" "$img.tmp" "${kb}k"
  mv "$img.tmp" "$img"
}

# ---- toolchain (cached) ------------------------------------------------------------
CLANG=$(readlink -f "$(command -v clang-19)")
key=$( { "$CLANG" --version; dpkg-query -W -f='${Package} ${Version}\n' clang-19 libbpf-dev linux-libc-dev \
         busybox-static 2>/dev/null; cat "$0"; } | sha256sum | cut -c1-16)
TC=$CACHE/toolchain-$key.ext4
if [ ! -f "$TC" ]; then
  st=$(mktemp -d)
  put "$CLANG" "$st"
  mkdir -p "$st/usr/bin"
  ln -sf "$CLANG" "$st/usr/bin/clang-19"
  put_libs "$CLANG" "$st"
  put "$(dirname "$CLANG")/../lib/clang" "$st"
  for d in /usr/include/linux /usr/include/asm-generic /usr/include/bpf /usr/include/x86_64-linux-gnu/asm; do
    put "$d" "$st"
  done
  mkdir -p "$st/bin"
  cp "$(command -v busybox)" "$st/bin/busybox"
  mkimage "$st" "$TC"
  rm -rf "$st"
  echo "guest-image: built toolchain disk $TC ($(du -h "$TC" | cut -f1))" >&2
fi

# ---- project (per run) ---------------------------------------------------------------
st=$(mktemp -d)
for p in "$@"; do
  put "$p" "$st"
  if [ -d "$p" ]; then
    find "$p" -type f -perm -u+x | while read -r f; do
      if is_elf "$f"; then put_libs "$f" "$st"; fi
    done
  elif is_elf "$p"; then
    put_libs "$p" "$st"
  fi
done
PJ=$OUT/project.ext4
mkimage "$st" "$PJ"
rm -rf "$st"
echo "TOOLCHAIN=$TC"
echo "PROJECT=$PJ"
