#!/usr/bin/env bash
# Fetches a Debian sched_ext kernel (trixie-backports cloud kernel) and its vmlinux.h
# (linux-bpf-dev) for the VM tests, into a cache outside git. Installs nothing: the
# trixie-backports suite is in a private apt configuration used only for `apt-get
# download`, never in the system's sources.
#
# Picks the newest linux-binary-unsigned-*-cloud-amd64 whose BTF passes the scx kfunc
# check (Debian 7.2.12 has 21 uncallable kfuncs). Also takes three modules from
# linux-modules-* (decompressed): virtio_blk and overlay, which the guest needs to mount
# its disk images (the cloud kernel has neither built in, and no 9p at all), and veth for
# the XDP suite. Prints, on
# the last line of stdout,
#   KERNEL=<dir>     (holding vmlinuz, vmlinux.h, kver, modules/*.ko)
# or exits 77 (the ctest SKIP code) with the reason on stderr if nothing can be fetched.
set -uo pipefail
CACHE=${SYRUP_VM_CACHE:-/var/cache/syrup-vm}
HERE=$(cd "$(dirname "$0")" && pwd)
APT=$CACHE/apt
mkdir -p "$APT/lists/partial" "$APT/archives/partial" "$APT/etc" "$CACHE/kernels" || exit 77
skip() { echo "fetch-kernel: SKIP: $*" >&2; exit 77; }

cat > "$APT/etc/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
SRC
APTOPTS=(-o Dir::Etc::sourcelist="$APT/etc/sources.list" -o Dir::Etc::sourceparts=/nonexistent
         -o Dir::State::Lists="$APT/lists" -o Dir::Cache="$APT" -o Dir::Cache::archives="$APT/archives"
         -o Dir::State::status=/var/lib/dpkg/status -o APT::Get::List-Cleanup=0
         -o Acquire::Retries=2 -o Acquire::http::Timeout=20 -o APT::Architecture=amd64)

# Refresh the private index at most once a day.
stamp=$APT/updated
if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440 2>/dev/null)" ]; then
  if apt-get "${APTOPTS[@]}" update -q >"$APT/update.log" 2>&1; then touch "$stamp"; fi
fi

# The guest's modules, decompressed, into $1/modules (once per kernel).
ensure_modules() {
  local dir=$1 kv=$2
  [ -f "$dir/modules/virtio_blk.ko" ] && [ -f "$dir/modules/overlay.ko" ] && [ -f "$dir/modules/veth.ko" ] && return 0
  local tmp; tmp=$(mktemp -d)
  (cd "$tmp" && apt-get "${APTOPTS[@]}" download -q "linux-modules-$kv-cloud-amd64") >&2 2>&1 || {
    rm -rf "$tmp"; echo "fetch-kernel: cannot download linux-modules-$kv-cloud-amd64" >&2; return 1; }
  dpkg -x "$tmp"/*.deb "$tmp/x" || { rm -rf "$tmp"; return 1; }
  mkdir -p "$dir/modules"
  for m in drivers/block/virtio_blk fs/overlayfs/overlay drivers/net/veth; do
    f=$(find "$tmp/x" -path "*/kernel/$m.ko*" | head -1)
    [ -n "$f" ] || { rm -rf "$tmp"; echo "fetch-kernel: $m not in the modules package" >&2; return 1; }
    case $f in *.xz) xz -dc "$f" ;; *.zst) zstd -dc "$f" ;; *) cat "$f" ;; esac > "$dir/modules/$(basename "$m").ko"
  done
  rm -rf "$tmp"
}

pick_cached() {  # newest cached kernel that passed the BTF check
  ls -d "$CACHE"/kernels/*/ok 2>/dev/null | xargs -r -n1 dirname | sort -V | tail -1
}

cands=$(apt-cache "${APTOPTS[@]}" search --names-only '^linux-binary-unsigned-[0-9].*-cloud-amd64$' 2>/dev/null |
        awk '{print $1}' | sed 's/^linux-binary-unsigned-//; s/-cloud-amd64$//' | sort -Vr)
if [ -z "$cands" ]; then
  c=$(pick_cached)
  [ -n "$c" ] && { echo "fetch-kernel: index unavailable, using cached $(basename "$c")" >&2; echo "KERNEL=$c"; exit 0; }
  skip "no trixie-backports index (network to deb.debian.org unavailable?) and nothing cached in $CACHE; see $APT/update.log"
fi

for kv in $cands; do
  dir=$CACHE/kernels/$kv
  if [ -f "$dir/ok" ]; then ensure_modules "$dir" "$kv"; echo "KERNEL=$dir"; exit 0; fi
  [ -f "$dir/bad" ] && { echo "fetch-kernel: $kv: $(cat "$dir/bad"), trying older" >&2; continue; }
  mkdir -p "$dir" && cd "$dir" || continue
  rm -rf deb x && mkdir -p deb x
  kpkg=linux-binary-unsigned-$kv-cloud-amd64
  # linux-bpf-dev's version: the source version of the kernel package.
  srcver=$(apt-cache "${APTOPTS[@]}" show "$kpkg" 2>/dev/null | awk '/^Source:/ {gsub(/[()]/,"",$3); print $3; exit}')
  [ -z "$srcver" ] && srcver=$(apt-cache "${APTOPTS[@]}" show "$kpkg" | awk '/^Version:/ {print $2; exit}')
  echo "fetch-kernel: downloading $kpkg and linux-bpf-dev=$srcver" >&2
  (cd deb && apt-get "${APTOPTS[@]}" download -q "$kpkg" "linux-bpf-dev=$srcver") >&2 || {
    echo "fetch-kernel: download of $kv failed" >&2; continue; }
  for d in deb/*.deb; do dpkg -x "$d" x || continue 2; done
  vmlinuz=$(find x -name 'vmlinuz*' -type f | head -1)
  vmh=$(find x -name vmlinux.h | head -1)
  if [ -z "$vmlinuz" ] || [ -z "$vmh" ]; then echo "no vmlinuz or vmlinux.h in packages" > bad; continue; fi
  cp "$vmlinuz" vmlinuz && cp "$vmh" vmlinux.h


  echo "$kv" > kver
  # BTF gate: the kernel ELF's scx kfuncs must be callable.
  python3 "$HERE/extract-vmlinux.py" vmlinuz vmlinux.elf >/dev/null 2>&1 || true
  if [ -s vmlinux.elf ]; then
    out=$(python3 "$HERE/btf-kfunc-check.py" vmlinux.elf 2>&1); echo "$out" > btf-check.txt
    if ! echo "$out" | grep -q 'broken (aux but no _impl): 0$'; then
      echo "BTF check failed: $(head -1 <<<"$out")" > bad; rm -f vmlinux.elf; continue
    fi
    rm -f vmlinux.elf
  else
    echo "could not extract vmlinux ELF for the BTF check; trusting the package" > btf-check.txt
  fi
  rm -rf x deb
  touch ok
  ensure_modules "$dir" "$kv"
  echo "KERNEL=$dir"
  exit 0
done
c=$(pick_cached)
[ -n "$c" ] && { echo "KERNEL=$c"; exit 0; }
skip "no usable sched_ext kernel could be downloaded (candidates: $(echo $cands))"
