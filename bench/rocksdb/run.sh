#!/bin/sh
# The RocksDB study in one command: installs and builds what is missing (scripts/build.sh),
# then runs rocksdb_bench.py, which starts a private syrupd, sweeps the policies over the
# load points for both mixes, and writes JSON, PNG plots and a Markdown table.
#   sudo bench/rocksdb/run.sh            # full setting (see bench/README.md for its length)
#   sudo bench/rocksdb/run.sh --quick    # the short setting, under 10 minutes
# Other flags go to rocksdb_bench.py (--help lists them). Results: bench/results/rocksdb/.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" -ne 0 ]; then
  echo "bench/rocksdb/run.sh: run as root (the servers deploy BPF programs through syrupd)" >&2
  exit 1
fi
bash "$root/scripts/build.sh"
cd "$root"
# Debian's python3 (with python3-matplotlib), not whatever python3 comes first in PATH.
exec /usr/bin/python3 bench/rocksdb/rocksdb_bench.py "$@"
