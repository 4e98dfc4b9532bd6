#!/usr/bin/env python3
"""Reads a Syrup recording (docs/recording.md) and prints who decided what: the policy,
the inputs recorded, each executor's share, passes, drops and fallbacks, and what was not
recorded. Standard library only; a starting point for your own analysis.

    syrupctl record 7 --seconds 10 -o run.rec
    python3 read_recording.py run.rec
"""
import struct
import sys
from collections import Counter

HEADER = struct.Struct("<8sIIIIII QQQ 64s64s II")  # struct syr_rec_header, 192 bytes
RECORD = struct.Struct("<IHHQ IIIIII")              # the first 40 bytes of a record
TRAILER = struct.Struct("<QQQQI")                   # at offset 16 of a trailer
SYR_PASS, SYR_DROP = 0xFFFFFFFF, 0xFFFFFFFE
HOOKS = {1: "socket-select", 2: "xdp", 3: "thread", 4: "socket-lookup"}
OUTCOMES = ["pass", "drop", "fallback", "enforced"]
ENDS = {1: "seconds or count reached", 2: "size quota reached", 3: "policy removed", 4: "stopped"}


def read(path):
    """Yields the header as a dict, then (kind, fields) per record."""
    with open(path, "rb") as f:
        data = f.read()
    (magic, version, header_size, hook, n_exec, snap, sample, mono, real, pid, name, app,
     nr_cpus, _) = HEADER.unpack_from(data, 0)
    if magic != b"SYRUPREC":
        raise ValueError(f"{path}: not a Syrup recording")
    yield {"version": version, "hook": HOOKS.get(hook, hook), "executors": n_exec, "snap": snap,
           "sample_every": sample, "policy_id": pid, "policy": name.rstrip(b"\0").decode(),
           "app": app.rstrip(b"\0").decode()}
    off = header_size
    while off + 16 <= len(data):
        size, kind, _flags, ts = struct.unpack_from("<IHHQ", data, off)
        if size < 16 or off + size > len(data):
            break  # cut short: the inputs before are whole
        if kind == 3:
            yield "trailer", dict(zip(("recorded", "not_sampled", "full", "quota", "end"),
                                      TRAILER.unpack_from(data, off + 16)))
        elif kind in (1, 2):
            _, _, _, _, decision, outcome, n, length, cap_len, cpu = RECORD.unpack_from(data, off)
            yield "input", {"ts_ns": ts, "decision": decision, "outcome": outcome, "len": length,
                            "cpu": cpu, "payload": data[off + 120:off + 120 + cap_len]}
        off += size


def main(path):
    records = read(path)
    h = next(records)
    decisions, outcomes, trailer = Counter(), Counter(), None
    for kind, r in records:
        if kind == "trailer":
            trailer = r
            continue
        decisions[r["decision"]] += 1
        outcomes[OUTCOMES[r["outcome"]] if r["outcome"] < 4 else "?"] += 1
    total = sum(decisions.values())
    print(f"policy {h['policy_id']} ({h['policy']}, app {h['app']}) at the {h['hook']} hook, "
          f"{h['executors']} executors: {total} inputs")
    for d in sorted(decisions):
        label = "pass" if d == SYR_PASS else "drop" if d == SYR_DROP else f"executor {d}"
        print(f"  {label}: {decisions[d]} ({100.0 * decisions[d] / total:.1f}%)")
    print("  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    if trailer is None:
        print("no trailer: the recording was cut short")
    else:
        print(f"not recorded: {trailer['not_sampled']} sampled out, {trailer['full']} with the buffer "
              f"full, {trailer['quota']} over the quota or unread; ended: {ENDS.get(trailer['end'], '?')}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: read_recording.py FILE")
    main(sys.argv[1])
