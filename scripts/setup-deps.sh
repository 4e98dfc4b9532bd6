#!/usr/bin/env bash
# Installs everything Syrup needs to build, run and test on Debian 12 (bookworm), as root,
# non-interactively. Idempotent: packages already present are left alone.
# Suites are always named: libbpf 1.4 comes from bookworm-backports, the rest from bookworm.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if [ "$(id -u)" -ne 0 ]; then
  echo "setup-deps: must run as root (apt-get install)" >&2
  exit 1
fi

BOOKWORM_PKGS=(
  build-essential cmake ninja-build pkg-config git
  clang-19 llvm-19 lld-19 libclang-rt-19-dev
  libelf-dev zlib1g-dev
  libxdp-dev xdp-tools bpftool
  libyaml-cpp-dev libgflags-dev libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libssl-dev libcpp-httplib-dev libsystemd-dev
  iproute2 procps ethtool
  qemu-system-x86 busybox-static cpio zstd python3 e2fsprogs xz-utils
  librocksdb-dev python3-matplotlib python3-venv
  nginx-light  # syrup_servers_tests runs its own nginx through a reload (docs/servers.md)
  dpkg-dev lintian  # scripts/package.sh: dpkg-shlibdeps for the packages' dependencies, lintian checks them
)
BACKPORTS_PKGS=(libbpf-dev libbpf1)

backports_list=/etc/apt/sources.list.d/syrup-bookworm-backports.list
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "deb http://deb.debian.org/debian bookworm-backports main" > "$backports_list"
  need_update=1
fi

missing=()
for p in "${BOOKWORM_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
libbpf_ver=$(dpkg-query -W -f='${Version}' libbpf-dev 2>/dev/null || true)
need_libbpf=0
if [ -z "$libbpf_ver" ] || dpkg --compare-versions "$libbpf_ver" lt 1:1.4; then need_libbpf=1; fi

# PyPI packages of the tests (scripts/requirements-test.txt, pinned) in a venv of their
# own; after the Debian packages (python3-venv). Skipped when the venv has them already.
venv=/opt/syrup-venv
requirements="$(dirname "$0")/requirements-test.txt"
install_pypi() {
  if [ -x "$venv/bin/python" ] && "$venv/bin/pip" freeze 2>/dev/null | sort | \
       diff -q - <(grep -v '^#' "$requirements" | sort) >/dev/null; then
    return 0
  fi
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --timeout 30 --retries 3 -r "$requirements"
}

if [ ${#missing[@]} -eq 0 ] && [ $need_libbpf -eq 0 ]; then
  install_pypi
  echo "setup-deps: all packages present"
  exit 0
fi

# Third-party sources on some images are unreachable; an index that fails to download
# must not stop the install of Debian's own packages.
# Every download is bounded (an unreachable mirror must not hold a CI job until its limit).
APT_NET=(-o Acquire::Retries=3 -o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30)
apt-get update "${APT_NET[@]}" || echo "setup-deps: apt-get update reported errors (continuing)" >&2
if [ $need_libbpf -eq 1 ]; then
  apt-get install -y -q "${APT_NET[@]}" -t bookworm-backports "${BACKPORTS_PKGS[@]}"
fi
if [ ${#missing[@]} -gt 0 ]; then
  apt-get install -y -q "${APT_NET[@]}" -t bookworm "${missing[@]}"
fi
install_pypi
echo "setup-deps: done"
