#!/usr/bin/python3
"""replay_plot.py: where sita and round_robin would have sent a RocksDB run's SCANs.

    sudo bench/rocksdb/replay_plot.py [--out bench/rocksdb/reference/replay_scans.png]

Records a short run of the study's server (examples/rocksdb kv_server, the 50/50 mix's
setting: 8 workers, one SO_REUSEPORT socket each, round_robin deployed at the
socket-select hook) with `syrupctl record`, replays the recording through
policies/round_robin.c and policies/sita.c with `syrupctl replay --json`, and plots, per
executor (socket), the GETs and SCANs each policy sent there: the recorded run's own
decisions, and each replay's. Also writes the counts as JSON beside the PNG.

Design: a private syrupd (rocksdb_bench.Daemon), a small database of its own (--keys,
loaded once into a temporary directory) and short SCANs: where a policy sends a request
depends on the request's type and the policy's state, not on what the request costs, so
the run is seconds long. The request type is read from each record's payload (the UDP
header, then kv_proto.h's u32 type: 1 GET, 2 SCAN), the same bytes sita's default
type_offset 8 reads. Replays use the policies' default parameters (sita: SCANs to
executor 0, GETs round robin over the rest). One replay takes at most 16384 inputs: the
recording is bounded to that with --count. Run as root (syrupd, BPF).
"""
import argparse
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "recording"))
import rocksdb_bench  # noqa: E402  (the study's private syrupd)
import read_recording  # noqa: E402  (the documented format's reader)

KV_GET, KV_SCAN = 1, 2
MAX_INPUTS = 16384  # one replay's inputs (syrupctl replay)


def ctl(args, *rest, check=True):
    out = subprocess.run([os.path.join(args.bindir, "syrupctl"), "--socket", args.socket, *rest],
                         capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"syrupctl {' '.join(rest)}: {out.stderr.strip()}")
    return out.stdout


def policy_id(args, app):
    listed = json.loads(ctl(args, "list", "--json"))
    if isinstance(listed, dict):
        listed = listed.get("policies", [])
    for p in listed:
        if p.get("app") == app:
            return p["id"]
    raise RuntimeError(f"no policy of application {app} is listed")


def start_server(args, db, app):
    cmd = [os.path.join(args.bindir, "kv_server"), f"--db={db}", f"--keys={args.keys}",
           f"--workers={args.workers}", f"--scan_len={args.scan_len}", f"--app={app}", "--cache_mb=32",
           f"--policy={os.path.join(ROOT, 'policies', 'round_robin.c')}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, SYRUP_SOCKET=args.socket))
    line = proc.stdout.readline()  # {"event":"ready","port":...} once serving
    if not line:
        raise RuntimeError("kv_server did not start: " + proc.stderr.read())
    return proc, json.loads(line)["port"]


def record_run(args, daemon, rec_path):
    """Records round_robin's decisions over one loadgen run (warm-up and tail included)."""
    db = tempfile.mkdtemp(prefix="syrup-replay-db-")
    server, port = start_server(args, os.path.join(db, "db"), "kv-replay")
    rec = None
    try:
        pid = policy_id(args, "kv-replay")
        before = daemon.log().count(f"recording policy {pid} ")
        rec = subprocess.Popen([os.path.join(args.bindir, "syrupctl"), "--socket", args.socket, "record",
                                str(pid), "--count", str(MAX_INPUTS), "--seconds", "60", "--snap", "16",
                                "-o", rec_path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(200):
            if daemon.log().count(f"recording policy {pid} ") > before:
                break
            time.sleep(0.05)
        out = os.path.join(db, "loadgen.json")
        subprocess.run([os.path.join(args.bindir, "kv_loadgen"), f"--port={port}", f"--rate={args.rate}",
                        f"--duration={args.duration}", "--warmup=0.2", f"--get_pct={args.get_pct}",
                        "--flows=50", f"--keys={args.keys}", f"--seed={args.seed}", f"--json={out}"],
                       check=True, capture_output=True)
        if rec.poll() is None:
            rec.send_signal(signal.SIGINT)  # ends it with a trailer (end_reason "stopped")
        print(rec.communicate(timeout=20)[0].strip())
    finally:
        if rec and rec.poll() is None:
            rec.kill()
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=20)
        subprocess.run(["rm", "-rf", db])


def recorded_inputs(path):
    """The header, [(type, recorded decision)] of the inputs in order, and the trailer."""
    records = read_recording.read(path)
    header = next(records)
    out, trailer = [], {}
    for kind, r in records:
        if kind != "input":
            trailer = r
            continue
        p = r["payload"]
        t = struct.unpack_from("<I", p, 8)[0] if len(p) >= 12 else 0
        out.append((t, r["decision"]))
    return header, out, trailer


def per_executor(types, decisions, n):
    counts = {"GET": [0] * n, "SCAN": [0] * n}
    for t, d in zip(types, decisions):
        if d < n and t in (KV_GET, KV_SCAN):
            counts["GET" if t == KV_GET else "SCAN"][d] += 1
    return counts


def plot(results, n, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6), sharey=True)
    for ax, (name, counts) in zip(axes, results.items()):
        xs = range(n)
        gets, scans = counts["GET"], counts["SCAN"]
        tg, ts = max(1, sum(gets)), max(1, sum(scans))
        ax.bar([x - 0.2 for x in xs], [100.0 * g / tg for g in gets], 0.4, label=f"GETs ({sum(gets)})",
               color="#4c72b0")
        ax.bar([x + 0.2 for x in xs], [100.0 * s / ts for s in scans], 0.4, label=f"SCANs ({sum(scans)})",
               color="#dd8452")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("executor (worker socket)")
        ax.set_xticks(list(xs))
        ax.legend(fontsize=8)
    axes[0].set_ylabel("share of the class sent there (%)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bindir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--out", default=os.path.join(HERE, "reference", "replay_scans.png"))
    ap.add_argument("--recording", help="keep the recording here (default: a temporary file)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--keys", type=int, default=20000)
    ap.add_argument("--scan_len", type=int, default=200, help="keys per SCAN (its cost does not matter here)")
    ap.add_argument("--get_pct", type=float, default=50, help="the study's 50/50 mix")
    ap.add_argument("--rate", type=float, default=2000)
    ap.add_argument("--duration", type=float, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("replay_plot.py: run as root (syrupd loads BPF programs)")
    daemon = rocksdb_bench.Daemon(args.bindir)
    args.socket = daemon.socket
    tmp = tempfile.mkdtemp(prefix="syrup-replay-")
    rec_path = args.recording or os.path.join(tmp, "kv.rec")
    try:
        record_run(args, daemon, rec_path)
        header, inputs, trailer = recorded_inputs(rec_path)
        lost = trailer.get("full", 0) + trailer.get("quota", 0)
        if lost:
            # A stateful policy (round robin's counter) counted the lost inputs live: its
            # replay then moves decisions that did not change.
            print(f"warning: {lost} inputs were not recorded (the machine too busy to drain the ring)")
        types = [t for t, _ in inputs]
        n = header["executors"]
        results = {"recorded: round_robin.c, live": per_executor(types, [d for _, d in inputs], n)}
        summary = {"recording": {"inputs": len(inputs), "executors": n, "policy": header["policy"],
                                 "gets": types.count(KV_GET), "scans": types.count(KV_SCAN),
                                 "not_recorded": lost},
                   "replays": {}}
        for pol in ("round_robin.c", "sita.c"):
            rep = json.loads(ctl(args, "replay", os.path.join(ROOT, "policies", pol), rec_path, "--json"))
            dec = rep["decisions"]
            results[f"replayed: {pol}"] = per_executor(types[:len(dec)], dec, n)
            summary["replays"][pol] = {"inputs": rep["inputs"], "moved": rep["moved"],
                                       "inputs_per_s": round(rep["inputs_per_s"]),
                                       "per_executor": results[f"replayed: {pol}"]}
            print(f"{pol}: {rep['inputs']} inputs replayed, {rep['moved']} decisions moved")
        summary["recorded_per_executor"] = results["recorded: round_robin.c, live"]
        title = (f"A kv_server run ({args.workers} workers, {args.get_pct:g}% GETs, {len(inputs)} requests) "
                 f"recorded under round_robin and replayed (default parameters)")
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        plot(results, n, args.out, title)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            # One line per list of counts.
            f.write(re.sub(r"\[[\d,\s]*\]", lambda m: " ".join(m.group(0).split()), json.dumps(summary, indent=1)))
            f.write("\n")
        print(f"wrote {args.out} and {os.path.splitext(args.out)[0]}.json")
    finally:
        daemon.stop()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
