#!/usr/bin/python3
"""rocksdb_bench.py: the Syrup talk's RocksDB evaluation, on this machine.

Design:
- One kv_server process per policy configuration, all started up front (one after the
  other, so only one opens the database for writing at a time) and all idle except the
  one under load: each has its own socket group, port and Syrup application name
  ("kv-<config>"), so their maps never mix. All are pinned to the same server core(s)
  (--server-cpus), use the same calibrated SCAN length, worker count and yield setting.
- kv_loadgen (open loop, Poisson, 50 flows) runs pinned to its own core (--client-cpu).
- 100% load is measured in the same run at the start of every round, on round_robin's
  server: with emulated cores, the rate at which its workers keep their cores busy (from
  its CPU per request); with workers sharing a core, its saturation throughput (offered
  1.4x the calibrated capacity). The round's load points are fractions of it, so every
  policy sees exactly the same offered rates.
- Each round's flows have fixed source ports of their own: one draw of the kernel hash's
  spread over the sockets per round, the same for every policy and load point; round
  robin against the hash is also reported per round, with the draw's imbalance.
- Fairness on a shared, noisy machine: for every round and load point, the policies run
  back to back in a shuffled order with the SAME arrival schedule (same seed); each point
  is repeated --rounds times and the median is reported. During every run the CPU time
  of everything else on the machine is measured (/proc/stat minus the server's, the load
  generator's and syrupd's own); a run where others took more than --max-foreign of a
  core, or where the generator sent late, is repeated (up to --retries) and flagged.
  With emulated cores so is a run at 70% load or more whose server needed more CPU per
  request than the round's capacity probe, so much that its cores were busier than the
  point says by more than --max-drift (the machine ran slower than when 100% was
  measured; near saturation a few points of utilisation move GET p99 by milliseconds).
- Output: one JSON file with every run and the summary, PNG plots (GET and SCAN p99
  against offered load, one line per policy), and a Markdown table on stdout.

Run as root (the servers deploy BPF through syrupd). `bench/rocksdb/run.sh` is the one
command; this script is what it runs.
"""
import argparse
import ctypes
import json
import math
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLK_TCK = os.sysconf("SC_CLK_TCK")

# A configuration: label -> (socket-select policy or None, thread policy or None, params).
CONFIGS = {
    "pass": ("pass.c", None, ""),
    "round_robin": ("round_robin.c", None, ""),
    "scan_avoid": ("scan_avoid.c", None, ""),
    "sita": ("sita.c", None, ""),
    "least_loaded": ("least_loaded.c", None, ""),
    # The thread policy alone (sockets keep the kernel's hash), and the cross-layer pair.
    "get_first": (None, "get_first.c", ""),
    "scan_avoid+get_first": ("scan_avoid.c", "get_first.c", ""),
}
MIX_CONFIGS = {
    99.5: ["pass", "round_robin", "scan_avoid", "sita", "least_loaded"],
    50.0: ["pass", "round_robin", "scan_avoid", "sita", "least_loaded", "get_first",
           "scan_avoid+get_first"],
}
PENDING = "pending the thread hook"


def config_of(label):
    """(socket policy, thread policy, params) of a label: a CONFIGS key, optionally with
    policy parameters after '@' ("scan_avoid+get_first@keep_free=1", several joined by
    ':'), so a parameter setting runs side by side with the shipped defaults."""
    base, _, extra = label.partition("@")
    sock_pol, thr_pol, fixed = CONFIGS[base]
    return sock_pol, thr_pol, ",".join(p for p in (fixed, extra.replace(":", ",")) if p)


def known_config(label):
    return label.partition("@")[0] in CONFIGS


def app_suffix(label):
    """A label as part of an application name ([A-Za-z0-9_.-])."""
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in label)

# The server setting per mix (the same for every policy of a mix; see bench/README.md):
# - 99.5/0.5 (the talk: one worker per core): each worker paced to a share of the server
#   core, emulating a core of its own, so a SCAN occupies only its worker's "core"; what
#   is left is what socket selection decides: GETs queued behind a SCAN on one socket.
#   Pacing alone (not a SCHED_DEADLINE reservation, --core-deadline) since commit 91c204c: a
#   reservation must span every CPU, so the workers ran on the load generator's core too.
#   16 workers of 0.055 CPU (0.88 CPU in all, as 8 x 0.11 before commit 076bc8a): what round
#   robin gains over the kernel's hash is the hash's imbalance over the sockets, which the
#   number of flows per socket sets. 50 flows over 8 sockets give a median draw of 1.60
#   (1.75 or more one draw in three), over 16 sockets 1.92 (86% of draws); the talk's
#   "> 75%" is a statement about such a draw (bench/README.md has both measured).
# - 50/50 (the talk: more threads than cores, thread scheduling decides): the workers share
#   the core, so which runnable worker gets it is the kernel's (or a thread policy's) choice.
# - long_budget: how many executors scan_avoid lets long requests hold at once (its
#   keep_free = workers - budget; "sita": as many as sita's long executors, so both give
#   SCANs the same room; 0: no limit, the talk's scan_avoid). On 50/50 the SCANs are ~97%
#   of the work: without a limit they mark every worker at 80% load and GETs queue behind
#   them, whatever the thread policy does (measured: bench/README.md).
MIX_SETTINGS = {
    99.5: {"workers": 16, "yield_us": 0.0, "core_share": 0.055, "long_budget": "0"},
    50.0: {"workers": 8, "yield_us": 0.0, "core_share": 0.0, "long_budget": "sita"},
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def mix_name(get_pct):
    return f"{get_pct:g}-{100 - get_pct:g}"


def renice(n):
    """In the child before exec. The bench's processes get a high CPU weight, so that other
    work on a shared machine disturbs the measurement less (the same for every policy):
    with the kernel's autogroups (sched_autogroup_enabled) nice only orders the tasks of
    one session, so the child gets a session of its own and that session's autogroup the
    nice value. It also dies with the bench (PR_SET_PDEATHSIG), never left behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        os.setsid()
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(n))
    except OSError:
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, n)
    except OSError:
        pass


# ---- CPU accounting -----------------------------------------------------------------

def machine_busy_s():
    """Busy CPU seconds of the whole machine so far (all cores)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return (sum(v[:8]) - idle) / CLK_TCK


def proc_cpu_s(pid):
    """CPU seconds used so far by a process (all its threads), 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def descendants(pid):
    """Pids of every process below pid."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


# ---- syrupd ---------------------------------------------------------------------------

class Daemon:
    """A private syrupd (own socket, bpffs root and cache), or the one at --socket."""

    def __init__(self, bindir, socket_path=None, nice=0, agent_cpus=""):
        self.bindir = bindir
        self.proc = None
        self.dir = None
        self.bpffs = None
        if socket_path:
            self.socket = socket_path
            return
        self.dir = tempfile.mkdtemp(prefix="syrup-rocksdb-bench-")
        os.chmod(self.dir, 0o755)
        self.socket = os.path.join(self.dir, "syrupd.sock")
        self.bpffs = f"/sys/fs/bpf/syrup-rocksdb-bench-{os.getpid()}"
        self.logf = open(os.path.join(self.dir, "syrupd.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(bindir, "syrupd"), f"--socket={self.socket}",
             f"--bpffs_root={self.bpffs}", f"--cache_dir={self.dir}/cache"]
            + ([f"--agent_cpus={agent_cpus}"] if agent_cpus else []),
            stdout=self.logf, stderr=self.logf, preexec_fn=lambda: renice(nice))
        for _ in range(200):
            if subprocess.run([os.path.join(bindir, "syrupctl"), "--socket", self.socket, "ping"],
                              capture_output=True).returncode == 0:
                return
            if self.proc.poll() is not None:
                raise RuntimeError("syrupd exited at start: " + self.log())
            time.sleep(0.05)
        raise RuntimeError("syrupd did not answer within 10 s")

    def pid(self):
        if self.proc:
            return self.proc.pid
        if not hasattr(self, "_pid"):
            # syrupctl ping: "syrupd (pid N) is serving ..."
            out = subprocess.run([os.path.join(self.bindir, "syrupctl"), "--socket", self.socket, "ping"],
                                 capture_output=True, text=True).stdout
            try:
                self._pid = int(out.split("(pid ", 1)[1].split(")", 1)[0])
            except (IndexError, ValueError):
                self._pid = None
        return self._pid

    def cpu_s(self):
        """CPU seconds of syrupd and everything it started (thread-hook agents)."""
        pid = self.pid()
        if not pid:
            return 0.0
        return proc_cpu_s(pid) + sum(proc_cpu_s(c) for c in descendants(pid))

    def log(self):
        if not self.dir:
            return ""
        with open(os.path.join(self.dir, "syrupd.log")) as f:
            return f.read()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self.bpffs:
            shutil.rmtree(self.bpffs, ignore_errors=True)


# ---- kv_server ------------------------------------------------------------------------

class ThreadHookMissing(Exception):
    pass


class Server:
    def __init__(self, args, label, socket_path, scan_len, yield_keys, workers, tag, core_share=0.0,
                 params=""):
        sock_pol, thr_pol, fixed = config_of(label)
        params = ",".join(p for p in (fixed, params) if p)
        self.label = label
        cmd = [os.path.join(args.bindir, "kv_server"), f"--db={args.db}", f"--keys={args.keys}",
               f"--workers={workers}", f"--scan_len={scan_len}", f"--yield_keys={yield_keys}",
               f"--app=kv{tag}-{app_suffix(label)}", f"--cpus={args.server_cpus}",
               f"--cache_mb={args.cache_mb}", f"--slice_us={args.slice_us}", f"--core_share={core_share}",
               f"--core_hold_us={args.core_hold_us}", f"--core_deadline={str(args.core_deadline).lower()}"]
        if sock_pol:
            cmd.append(f"--policy={os.path.join(args.policies, sock_pol)}")
        if thr_pol:
            cmd.append(f"--thread_policy={os.path.join(args.policies, thr_pol)}")
        if params:
            cmd.append(f"--params={params}")
        env = dict(os.environ, SYRUP_SOCKET=socket_path)
        self.errf = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.errf, env=env, text=True,
                                     preexec_fn=lambda: renice(args.nice))
        line = self._readline(60)
        if not line:
            rc = self.proc.wait(timeout=10)
            self.errf.seek(0)
            err = self.errf.read()
            if rc == 3:
                raise ThreadHookMissing(err.strip().splitlines()[-1] if err.strip() else "")
            raise RuntimeError(f"kv_server ({label}) did not start (status {rc}):\n{err}")
        self.ready = json.loads(line)
        self.port = self.ready["port"]
        self.pid = self.proc.pid

    def _readline(self, timeout):
        end = time.time() + timeout
        while time.time() < end:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r:
                return self.proc.stdout.readline()
            if self.proc.poll() is not None:
                return ""
        return ""

    def stop(self):
        """SIGTERM; returns the server's final counters (and whether the policy was removed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        fin = {}
        for line in out.splitlines():
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("event") == "exit":
                fin = j
        fin["status"] = self.proc.returncode
        return fin


def calibrate(args):
    """Loads the DB if needed and measures GET and SCAN costs on the server core."""
    cals = []
    for _ in range(3):
        out = subprocess.run(
            [os.path.join(args.bindir, "kv_server"), f"--db={args.db}", f"--keys={args.keys}",
             f"--cpus={args.server_cpus}", f"--scan_ratio={args.scan_ratio}", "--calibrate_only",
             f"--cache_mb={args.cache_mb}"],
            capture_output=True, text=True, preexec_fn=lambda: renice(args.nice))
        if out.returncode != 0:
            raise RuntimeError("kv_server --calibrate_only failed:\n" + out.stderr)
        cals.append(json.loads(out.stdout.strip().splitlines()[-1])["calibration"])
    # The median run by scan length: one preempted measurement does not set the size.
    cals.sort(key=lambda c: c["scan_len"])
    return cals[1]


# ---- kv_loadgen -----------------------------------------------------------------------

def run_load(args, server, daemon, rate, get_pct, duration, seed, src_port_base=0):
    """One run of the load generator against one server; adds the CPU accounting.
    src_port_base: the flows' source ports (0: ephemeral, new ones every run)."""
    fd, path = tempfile.mkstemp(prefix="kv-loadgen-", suffix=".json")
    os.close(fd)
    try:
        return _run_load(args, server, daemon, rate, get_pct, duration, seed, src_port_base, path)
    finally:
        # Also when a signal or an error ends the run, so no empty result file is left.
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _run_load(args, server, daemon, rate, get_pct, duration, seed, src_port_base, path):
    cmd = [os.path.join(args.bindir, "kv_loadgen"), f"--port={server.port}", f"--rate={rate:.1f}",
           f"--duration={duration}", f"--warmup={args.warmup}", f"--get_pct={get_pct}",
           f"--flows={args.flows}", f"--keys={args.keys}", f"--cpu={args.client_cpu}",
           f"--seed={seed}", f"--json={path}", f"--src_port_base={src_port_base}",
           f"--idle_sleep_us={args.client_idle_sleep_us}"]
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
        cmd.append(f"--trace={os.path.join(args.trace_dir, f'{server.label}_{rate:.0f}rps_seed{seed}.csv')}")
    busy0, srv0 = machine_busy_s(), proc_cpu_s(server.pid)
    d0 = daemon.cpu_s()
    t0 = time.time()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, preexec_fn=lambda: renice(args.nice))
    try:
        _, _, ru = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()  # interrupted: the generator does not outlive the bench
        proc.wait()
        raise
    wall = time.time() - t0
    err = proc.stderr.read()
    proc.stderr.close()
    busy1, srv1 = machine_busy_s(), proc_cpu_s(server.pid)
    d1 = daemon.cpu_s()
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError):
        raise RuntimeError(f"kv_loadgen failed: {err}")
    gen_cpu = ru.ru_utime + ru.ru_stime
    foreign = (busy1 - busy0) - (srv1 - srv0) - gen_cpu - (d1 - d0)
    # Every answer the server sent, warm-up and tail included (its CPU time covers them).
    answered = sum(res.get("answers_by_worker") or [0])
    res["cpu"] = {
        "wall_s": wall,
        "server_cores": (srv1 - srv0) / wall,
        "server_cpu_s": srv1 - srv0,
        "server_answers": answered,
        "server_cpu_per_request_us": (srv1 - srv0) / answered * 1e6 if answered else None,
        "generator_cores": gen_cpu / wall,
        "syrupd_cores": (d1 - d0) / wall,
        "foreign_cores": max(0.0, foreign) / wall,
    }
    return res


def wait_quiet(args, daemon):
    """Waits (up to --quiet-wait seconds) until the rest of the machine has been using less
    than --max-foreign of a core for half a second: on a shared machine a run is then less
    likely to be disturbed. Our idle servers use nothing; syrupd and its agents are ours."""
    deadline = time.time() + args.quiet_wait
    waited = False
    while True:
        t0, b0, d0 = time.time(), machine_busy_s(), daemon.cpu_s()
        time.sleep(0.5)
        other = (machine_busy_s() - b0 - (daemon.cpu_s() - d0)) / (time.time() - t0)
        if other <= args.max_foreign or time.time() > deadline:
            if waited:
                log(f"    (waited for other work to finish; others now use {other:.2f} cores)")
            return
        if not waited:
            log(f"    others use {other:.2f} cores; waiting up to {args.quiet_wait:.0f} s for quiet")
        waited = True


# Below this load a run's CPU per request is not held against the capacity probe's (taken
# at ~75%): with shorter queues a worker wakes for fewer requests at a time and pays more
# per request, legitimately (1.1-1.4x at 20-60% in the short run of commit 9912852), and GET p99
# there depends less on a few points of utilisation.
DRIFT_FROM_LOAD = 0.7


def effective_load(load, res, probe_cost_us):
    """How busy the emulated cores really were in a run offered `load` of 100%: the load
    scaled by the server's CPU per request against the round's capacity probe (None if
    either is unknown). Every policy serves the same requests on the same schedule, so a
    higher cost means the machine ran slower, not that the policy did more."""
    cost = res["cpu"].get("server_cpu_per_request_us")
    return load * cost / probe_cost_us if cost and probe_cost_us else None


def unhealthy(args, res, load=None, probe_cost_us=None):
    """Why a run does not count as clean ([] if it does)."""
    why = []
    if res["cpu"]["foreign_cores"] > args.max_foreign:
        why.append(f"others used {res['cpu']['foreign_cores']:.2f} cores")
    if res["generator"]["late_sends_pct"] > 1.0:
        why.append(f"late sends {res['generator']['late_sends_pct']:.1f}%")
    eff = effective_load(load, res, probe_cost_us) if load is not None else None
    if args.max_drift and eff is not None and load >= DRIFT_FROM_LOAD and eff - load > args.max_drift:
        why.append(f"the server needed {eff / load:.2f}x the probe's CPU per request: its cores "
                   f"ran at {eff:.0%}, not {load:.0%}")
    return why


def run_until_healthy(args, server, daemon, rate, get_pct, duration, seed, ports, what,
                      load=None, probe_cost_us=None):
    """run_load after the machine is quiet, repeated (same seed, same schedule) up to
    --retries times while the run is not healthy. `load` and `probe_cost_us` (the round's
    CPU per request at its capacity probe) add the drift check. Returns (result, healthy)."""
    for attempt in range(args.retries + 1):
        wait_quiet(args, daemon)
        res = run_load(args, server, daemon, rate, get_pct, duration, seed, ports)
        why = unhealthy(args, res, load, probe_cost_us)
        if not why or attempt == args.retries:
            return res, not why
        log(f"    {what}: noisy run ({'; '.join(why)}), again")


# How a round's 100% load was measured (measure_capacity), as the log says it.
CAPACITY_HOW = {"utilisation": "utilisation of the emulated cores", "saturation": "saturation"}


def utilisation_capacity(workers, core_share, cpu_s, answered):
    """The rate at which `workers` cores of `core_share` CPU each are exactly busy, when
    `answered` requests cost the server `cpu_s` seconds of CPU."""
    if answered <= 0 or cpu_s <= 0:
        raise RuntimeError(f"capacity probe: {answered} requests answered for {cpu_s:.3f} s of CPU")
    return workers * core_share / (cpu_s / answered)


def measure_capacity(args, server, daemon, get_pct, cal, rnd, workers, core_share):
    """100% load for round rnd, with the round's flows. Returns (rate, how, calibration
    estimate, probes).

    Emulated cores (core_share > 0): the rate at which the reference's workers keep their
    cores exactly busy, workers x core_share / (server CPU per request), the CPU per
    request measured at about 75% of that rate (a first probe at a quarter of the
    calibration's estimate finds where that is). This is utilisation, as a machine with a
    core per worker defines it. Not the saturation throughput: overloaded, a worker drains
    its socket 32 datagrams per wake-up and spends ~9 us of CPU per request instead of the
    ~11.5 us it spends at 80% load, so "what it sustains" deeply backlogged is 10-30% above
    what it sustains with short queues, and a load point called 80% of it ran the cores at
    88-103% (the full runs of 2026-11-21 before commit fbfb404: every policy stalled there in some rounds).

    Shared core (core_share 0): the saturation throughput, offered 1.4x the calibrated
    capacity, then offered that, what is achieved. There the SCANs are nearly all the work
    and a request's cost hardly depends on the batch it came in."""
    p = get_pct / 100.0
    per_req_ns = p * (cal["get_ns"] + cal["io_ns"]) + (1 - p) * (cal["scan_ns"] + cal["io_ns"])
    est = 1e9 / per_req_ns
    ports = round_ports(args, rnd)

    if core_share:
        probes, rate = [], 0.25 * est
        for step in range(2):
            res, _ = run_until_healthy(args, server, daemon, rate, get_pct, max(2.0, args.duration),
                                       990 + 10 * step, ports, f"capacity probe at {rate:.0f} req/s")
            cpu_s, answered = res["cpu"]["server_cpu_s"], res["cpu"]["server_answers"]
            cap = utilisation_capacity(workers, core_share, cpu_s, answered)
            probes.append({"offered_rps": rate, "cpu_per_request_us": res["cpu"]["server_cpu_per_request_us"],
                           "capacity_rps": cap})
            rate = 0.75 * cap
        return cap, "utilisation", est, probes

    best = []
    for attempt in range(args.retries + 2):
        wait_quiet(args, daemon)
        res = run_load(args, server, daemon, 1.4 * est, get_pct, max(2.0, args.duration), 999 + attempt, ports)
        if not unhealthy(args, res) or attempt == args.retries + 1:
            best.append(res["throughput_rps"])
        if len(best) >= 2:
            break
    sat = max(best)
    wait_quiet(args, daemon)
    res = run_load(args, server, daemon, sat, get_pct, max(2.0, args.duration), 997, ports)
    return min(sat, res["throughput_rps"]), "saturation", est, []


# ---- the sweep ------------------------------------------------------------------------

def sweep_mix(args, daemon, cal, get_pct, labels, loads, tag):
    scan_len = cal["scan_len"]
    workers = int(per_mix(args.workers, get_pct, "workers"))
    yield_us = per_mix(args.yield_us, get_pct, "yield_us")
    yield_keys = max(1, round(yield_us * 1000 / cal["key_ns"])) if yield_us > 0 else 0
    core_share = per_mix(args.core_share, get_pct, "core_share")
    servers, pending, finals = {}, {}, {}

    n_long = sita_long_executors(cal, get_pct, workers, core_share)
    long_budget = per_mix(args.long_budget, get_pct, "long_budget", long_budget_value)
    keep_free = scan_avoid_keep_free(long_budget, workers, n_long)

    def start(label):
        sock_pol, _, given = config_of(label)
        params = ""
        if sock_pol == "sita.c":
            params = f"long_executors={n_long}"
        elif sock_pol == "scan_avoid.c" and keep_free and "keep_free=" not in given:
            params = f"keep_free={keep_free}"
        return Server(args, label, daemon.socket, scan_len, yield_keys, workers, tag, core_share, params)

    # With deadline-backed core shares every server holds deadline bandwidth while it lives
    # and the kernel admits at most 95% of each CPU: only the server under load may exist,
    # so each run starts its server and stops it after. Otherwise all start up front and stay.
    reserved = core_share > 0 and args.core_deadline

    def use(label, fn):
        if not reserved:
            return fn(servers[label])
        srv = start(label)
        try:
            return fn(srv)
        finally:
            finals[label] = srv.stop()

    try:
        for label in labels:
            try:
                srv = start(label)
                log(f"  {label}: kv_server pid {srv.pid} on port {srv.port}"
                    + (" (started for each run: deadline reservations)" if reserved else ""))
                if reserved:
                    finals[label] = srv.stop()
                    srv = None
                servers[label] = srv
            except ThreadHookMissing as e:
                pending[label] = str(e)
                log(f"  {label}: {PENDING} ({e})")
        ref = "round_robin" if "round_robin" in servers else next(iter(servers))
        runs, capacities, capacity_probes, how = [], [], [], ""
        rng = random.Random(args.seed + int(get_pct * 10))
        for rnd in range(args.rounds):
            # 100% is measured anew for every round, with the round's flows, just before
            # its load points: on a shared machine the server's speed drifts (its CPU per
            # request moved from 11.2 to 12.6 us between two rounds of one run), and a load
            # point is only "80%" of what the machine sustains at the time it runs.
            capacity, how, estimate, probes = use(ref, lambda srv: measure_capacity(
                args, srv, daemon, get_pct, cal, rnd, workers, core_share))
            capacities.append(capacity)
            capacity_probes.append(probes)
            log(f"  round {rnd}: 100% load ({ref}, {CAPACITY_HOW[how]}) {capacity:.0f} req/s"
                + "".join(f"; probe at {p['offered_rps']:.0f} req/s: {p['cpu_per_request_us']:.2f} us "
                          f"of CPU per request" for p in probes)
                + f" (calibration estimate {estimate:.0f})")
            # The CPU per request the round's 100% stands on (emulated cores only).
            probe_cost = probes[-1]["cpu_per_request_us"] if probes else None
            for li, load in enumerate(loads):
                order = list(servers)
                rng.shuffle(order)
                seed = args.seed * 100000 + rnd * 1000 + li
                for label in order:
                    res, ok = use(label, lambda srv: run_until_healthy(
                        args, srv, daemon, load * capacity, get_pct, args.duration, seed,
                        round_ports(args, rnd), f"{label} @ {load:.0%}", load, probe_cost))
                    eff = effective_load(load, res, probe_cost)
                    runs.append({"config": label, "load": load, "round": rnd, "seed": seed,
                                 "src_port_base": round_ports(args, rnd),
                                 "rate": load * capacity, "effective_load": eff, "healthy": ok, "result": res})
                    g, s = res["types"]["get"], res["types"]["scan"]
                    log(f"    round {rnd} {load:4.0%} {label:22s} {res['throughput_rps']:8.0f}/s "
                        f"GET p99 {g['p99_us']:9.1f} us  SCAN p99 {s['p99_us']:9.1f} us  "
                        f"loss {res['loss_pct']:.2f}%" + (f"  cores at {eff:.0%}" if eff is not None else "")
                        + ('' if ok else '  (noisy)'))
    finally:
        for label, srv in servers.items():
            if srv:
                finals[label] = srv.stop()
    for label, fin in finals.items():
        if fin.get("status") != 0 or not fin.get("policy_removed", False):
            log(f"  warning: kv_server {label} exited with status {fin.get('status')}")
        lost = fin.get("stats", {}).get("total", {}).get("scan_marks_cleared", 0)
        if lost:
            # SCANs scan_avoid counted that never reached a worker (dropped at a full
            # buffer): until the worker was next idle, they kept it marked busy.
            log(f"  warning: kv_server {label}: {lost} scan_map count(s) of SCANs that never arrived were cleared")
    return {"mix": mix_name(get_pct), "get_pct": get_pct, "capacity_rps": statistics.median(capacities),
            "capacity_by_round_rps": capacities, "capacity_probes": capacity_probes,
            "capacity_how": how, "capacity_estimate_rps": estimate, "capacity_ref": ref, "workers": workers,
            "flows": args.flows,
            "scan_len": scan_len, "yield_us": yield_us, "yield_keys": yield_keys, "core_share": core_share,
            "core_deadline": reserved,
            "sita_long_executors": n_long, "long_budget": long_budget, "scan_avoid_keep_free": keep_free,
            "loads": loads,
            "configs": labels, "pending": pending, "runs": runs,
            "server_exit": {k: v.get("stats", {}).get("total", {}) for k, v in finals.items()}}


def round_ports(args, rnd):
    """The source ports of a round's 50 flows: the same for every policy and load point of
    the round, as with a fixed set of clients, so the kernel hash's spread of the flows
    over the sockets (random per port set) is one draw per round, not one per run; each
    round draws anew. 0 (--src-port-base 0): ephemeral ports, a new draw every run."""
    if not args.src_port_base:
        return 0
    return args.src_port_base + rnd * args.flows


def mix_target_us(mixres, cal):
    """The GET p99 target of a mix and where it came from: two SCANs' time on one worker's core. A GET that waited
    behind one SCAN (queueing included) meets it, one stuck behind a queue of them does
    not. Measured, not computed: the median over the policies of the SCAN p50 at the
    lowest load point (where SCANs hardly queue), because a worker's core -- emulated or
    shared -- runs a SCAN slower than the calibration's hot loop did. Falls back to the
    calibrated SCAN when nothing was measured."""
    lowest = min(mixres["loads"]) if mixres["loads"] else None
    p50s = [r["result"]["types"]["scan"]["p50_us"] for r in mixres["runs"]
            if r["load"] == lowest and r["result"]["types"]["scan"]["n"] > 0]
    if p50s:
        return 2 * statistics.median(p50s), "two SCANs on a worker, as measured at the lowest load"
    return (2 * (cal["scan_ns"] + cal["io_ns"]) / 1000 / (mixres["core_share"] or 1.0),
            "two SCANs on a worker, as calibrated: no SCAN answered at the lowest load")


def sita_long_executors(cal, get_pct, workers, core_share):
    """sita's executors for SCANs: with a core per worker, the SCANs' share of the work
    (one SCAN costs scan_ns, a GET get_ns); sharing cores, one is enough."""
    if not core_share:
        return 1
    p = get_pct / 100.0
    scan_work = (1 - p) * (cal["scan_ns"] + cal["io_ns"])
    share = scan_work / (scan_work + p * (cal["get_ns"] + cal["io_ns"]))
    return min(workers - 1, max(1, round(workers * share)))


def per_mix(value, get_pct, key, conv=float):
    """A setting given as "V" (every mix), "MIX:V,MIX:V", or None (MIX_SETTINGS)."""
    default = conv(MIX_SETTINGS.get(get_pct, MIX_SETTINGS[99.5])[key])
    if value is None:
        return default
    for part in str(value).split(","):
        if ":" in part:
            m, v = part.split(":", 1)
            if float(m) == get_pct:
                return conv(v)
        else:
            return conv(part)
    return default


def long_budget_value(v):
    """A --long-budget value as per_mix's conv: 'sita' or a count, else ValueError."""
    if v != "sita" and not v.isdigit():
        raise ValueError(v)
    return v


def scan_avoid_keep_free(budget, workers, n_long):
    """scan_avoid's keep_free for a long-request budget ("0": none, "sita", or a count)."""
    held = n_long if budget == "sita" else int(budget)
    return max(0, workers - held) if held > 0 else 0


def median_points(mixres):
    """Per config and load: the median over rounds of each metric."""
    pts = {}
    for run in mixres["runs"]:
        pts.setdefault(run["config"], {}).setdefault(run["load"], []).append(run)
    out = {}
    for label, by_load in pts.items():
        rows = []
        for load in sorted(by_load):
            rs = [r["result"] for r in by_load[load]]
            med = lambda f: statistics.median(f(r) for r in rs)
            rows.append({
                "load": load,
                "offered_rps": med(lambda r: r["offered_rps"]),
                "throughput_rps": med(lambda r: r["throughput_rps"]),
                "get_p50_us": med(lambda r: r["types"]["get"]["p50_us"]),
                "get_p99_us": med(lambda r: r["types"]["get"]["p99_us"]),
                "get_p999_us": med(lambda r: r["types"]["get"]["p999_us"]),
                "scan_p50_us": med(lambda r: r["types"]["scan"]["p50_us"]),
                "scan_p99_us": med(lambda r: r["types"]["scan"]["p99_us"]),
                "loss_pct": med(lambda r: r["loss_pct"]),
                "get_p99_min_us": min(r["types"]["get"]["p99_us"] for r in rs),
                "get_p99_max_us": max(r["types"]["get"]["p99_us"] for r in rs),
                "scan_share_answered": med(lambda r: (r["types"]["scan"]["n"] /
                                                      max(1, r["sent_by_type"]["scan"]))),
                # How unevenly the answers came from the workers: busiest worker's share
                # times the number of workers (1.0 = perfectly even).
                "worker_imbalance": med(lambda r: (max(r["answers_by_worker"]) * mixres["workers"] /
                                                   max(1, sum(r["answers_by_worker"])))
                                        if r["answers_by_worker"] else 0.0),
                "healthy_runs": sum(1 for x in by_load[load] if x["healthy"]),
                "runs": len(rs),
            })
        out[label] = rows
    return out


def throughput_at_target(rows, target_us, max_loss, last_crossing=False):
    """The throughput up to which GET p99 stays under the target (and loss under max_loss):
    the last passing load point, interpolated (log p99, linear load) towards the next,
    failing one. Where the p99 is not monotonic in load (a policy fails at 40% and passes
    at 60% again), the first crossing is the default; last_crossing=True starts from the
    highest passing point instead (the more generous reading, for the policy compared
    against). Returns (rps, reached_end)."""
    ok = [r["get_p99_us"] <= target_us and r["loss_pct"] <= max_loss for r in rows]
    if last_crossing:
        passing = [i for i, o in enumerate(ok) if o]
        i = passing[-1] + 1 if passing else 0
    else:
        i = ok.index(False) if False in ok else len(rows)
    if i == len(rows):
        return rows[-1]["throughput_rps"], True
    if i == 0:
        return 0.0, False
    a, b = rows[i - 1], rows[i]
    la, lb = math.log(max(a["get_p99_us"], 1e-3)), math.log(max(b["get_p99_us"], 1e-3))
    # Failing on loss alone: no latency to interpolate on, keep the passing point.
    frac = 0.0 if b["get_p99_us"] <= target_us or lb <= la else (math.log(target_us) - la) / (lb - la)
    frac = min(max(frac, 0.0), 1.0)
    return a["throughput_rps"] + frac * (b["offered_rps"] - a["throughput_rps"]), False


def at_load(rows, load, key):
    for r in rows:
        if abs(r["load"] - load) < 1e-9:
            return r[key]
    return None


def summarize(mixres, target_us, max_loss):
    med = median_points(mixres)
    summary = {}
    for label in mixres["configs"]:
        if label in mixres["pending"]:
            summary[label] = {"pending": PENDING}
            continue
        rows = med[label]
        thr, end = throughput_at_target(rows, target_us, max_loss)
        summary[label] = {
            "throughput_at_target_rps": thr,
            "throughput_at_target_last_crossing_rps": throughput_at_target(rows, target_us, max_loss, True)[0],
            "target_not_crossed": end,
            # Over the target already at the lowest load run: the throughput at the target
            # is somewhere below that point's, not 0.
            "over_target_at_lowest_load": not end and thr == 0.0,
            "lowest_load_throughput_rps": rows[0]["throughput_rps"] if rows else 0.0,
            "get_p99_at_50_us": at_load(rows, 0.5, "get_p99_us"),
            "get_p99_at_80_us": at_load(rows, 0.8, "get_p99_us"),
            "scan_p99_at_80_us": at_load(rows, 0.8, "scan_p99_us"),
            "throughput_at_80_rps": at_load(rows, 0.8, "throughput_rps"),
            "scan_answered_at_80": at_load(rows, 0.8, "scan_share_answered"),
            "worker_imbalance": statistics.median(r["worker_imbalance"] for r in rows),
            "noisy_points": sum(1 for r in rows if r["healthy_runs"] < r["runs"]),
        }
    base = summary.get("pass", {})
    for label, s in summary.items():
        if "pending" in s or "pending" in base:
            continue
        for k in ("throughput_at_target_rps", "get_p99_at_50_us", "get_p99_at_80_us"):
            if k == "throughput_at_target_rps" and s["over_target_at_lowest_load"]:
                continue  # no number to divide, only a bound
            if s.get(k) is not None and base.get(k):
                s[k.replace("_rps", "").replace("_us", "") + "_vs_pass"] = s[k] / base[k]
    return med, summary


def per_draw(mixres, target_us, max_loss, a="round_robin", b="pass"):
    """a against b (round robin against the kernel hash) in each round on its own. A round's
    flows are one draw of the hash's spread over the sockets, and what round robin gains
    over the hash follows that draw's imbalance (the busiest socket's share x workers: the
    hash saturates that socket first), so the median curves' ratio alone does not show how
    much of it the draw decided. The imbalance is b's, the median over the round's load
    points that lost at most max_loss (past them the busiest socket drops and looks less
    busy). Empty when a round lacks a or b."""
    out = []
    for rnd in sorted({r["round"] for r in mixres["runs"]}):
        one = dict(mixres, runs=[r for r in mixres["runs"] if r["round"] == rnd])
        med = median_points(one)
        if a not in med or b not in med:
            return []
        (ta, a_end), (tb, b_end) = (throughput_at_target(med[x], target_us, max_loss) for x in (a, b))
        # b's more generous reading too, as the table's check takes it (see checks()).
        tb_last = throughput_at_target(med[b], target_us, max_loss, last_crossing=True)[0]
        ok = [r for r in med[b] if r["loss_pct"] <= max_loss] or med[b]
        base = next((r.get("src_port_base") for r in one["runs"]), None)
        # A policy that never crossed the target gives only a lower bound on its
        # throughput there; neither crossing (a round whose points never loaded the cores
        # enough, e.g. the machine ran faster than at its probe) gives no ratio at all.
        both = a_end and b_end
        out.append({"round": rnd, "src_port_base": base,
                    "imbalance": statistics.median(r["worker_imbalance"] for r in ok),
                    f"{a}_rps": ta, f"{b}_rps": tb, f"{b}_last_crossing_rps": tb_last,
                    f"{a}_not_crossed": a_end, f"{b}_not_crossed": b_end,
                    "ratio": ta / tb if tb and not both else None,
                    "ratio_last_crossing": ta / tb_last if tb_last and not both else None})
    return out


def checks(results):
    """The issue's targets, evaluated on this run."""
    out = []
    for mix in results["mixes"]:
        s = mix["summary"]
        target_us = mix["target_us"]
        if mix["get_pct"] == 99.5:
            if "round_robin" in s and "pass" in s and s["pass"].get("throughput_at_target_rps"):
                # Met only if it holds with the hash's more generous (last) crossing too.
                rr, hs = s["round_robin"], s["pass"]
                r = rr["throughput_at_target_rps"] / hs["throughput_at_target_rps"]
                r_last = rr["throughput_at_target_rps"] / hs["throughput_at_target_last_crossing_rps"]
                out.append((f"{mix['mix']}: round_robin throughput at GET p99 <= {target_us:,.0f} us vs pass",
                            f"{r:.2f}x ({r_last:.2f}x against pass's last crossing)", ">= 1.75x both",
                            min(r, r_last) >= 1.75))
            rr80 = s.get("round_robin", {}).get("get_p99_at_80_us")
            for p in ("sita", "scan_avoid"):
                v = s.get(p, {}).get("get_p99_at_80_us")
                if rr80 and v:
                    out.append((f"{mix['mix']}: {p} GET p99 at 80% load, cut vs round_robin",
                                f"{rr80 / v:.1f}x", ">= 5x", rr80 / v >= 5))
        if mix["get_pct"] == 50.0:
            pair = "scan_avoid+get_first"
            if pair in mix["pending"]:
                out.append((f"{mix['mix']}: {pair} lowest GET p99 at 80% load", PENDING, "lowest", None))
            elif pair in s:
                v = s[pair]["get_p99_at_80_us"]
                others = [x["get_p99_at_80_us"] for k, x in s.items() if k != pair and "pending" not in x]
                starve = (s[pair].get("scan_answered_at_80") or 0) < 0.99
                out.append((f"{mix['mix']}: {pair} lowest GET p99 at 80% load, SCANs answered",
                            f"{v:.0f} us vs best other {min(others):.0f} us",
                            "lowest, >= 99% SCANs answered", v <= min(others) and not starve))
    return out


# ---- output ---------------------------------------------------------------------------

def fmt_us(v):
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def markdown(results):
    lines = []
    for mix in results["mixes"]:
        target_us = mix["target_us"]
        by_round = mix.get("capacity_by_round_rps", [])
        lines.append(f"**{mix['mix']} GET/SCAN** — 100% load = {mix['capacity_rps']:,.0f} req/s "
                     f"({capacity_text(mix)}"
                     + (f"; median of the rounds' {', '.join(f'{c:,.0f}' for c in by_round)}"
                        if len(by_round) > 1 else "")
                     + f"), {mix['workers']} workers, "
                     f"SCAN = {mix['scan_len']} keys, "
                     + (f"each worker a core of {mix['core_share']:g} CPU (emulated: "
                        f"{'a deadline reservation' if mix.get('core_deadline') else 'paced'}), " if mix["core_share"] else
                        "workers share one core, ")
                     + (f"SCANs on at most {mix['workers'] - mix['scan_avoid_keep_free']} executor(s) with "
                        f"scan_avoid (keep_free={mix['scan_avoid_keep_free']}) and sita, "
                        if mix.get("scan_avoid_keep_free") else "")
                     + f"GET p99 target {target_us:,.0f} us"
                     + (f" ({mix['target_from']})" if mix.get("target_from") else "") + "\n")
        lines.append("| policy | throughput at target (req/s) | vs pass | GET p99 @50% (us) | vs pass "
                     "| GET p99 @80% (us) | vs pass | SCAN p99 @80% (us) |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for label in mix["configs"]:
            s = mix["summary"][label]
            if "pending" in s:
                lines.append(f"| {label} | {PENDING} | | | | | | |")
                continue
            thr = throughput_at_target_text(s)
            r = lambda k: f"{s[k]:.2f}x" if s.get(k) is not None else "-"
            lines.append(f"| {label} | {thr} | {r('throughput_at_target_vs_pass')} | "
                         f"{fmt_us(s['get_p99_at_50_us'])} | {r('get_p99_at_50_vs_pass')} | "
                         f"{fmt_us(s['get_p99_at_80_us'])} | {r('get_p99_at_80_vs_pass')} | "
                         f"{fmt_us(s['scan_p99_at_80_us'])} |")
        lines.append("")
        if mix.get("draws"):
            lines.append("round_robin vs pass in each round (one draw of the flows' source ports each): " +
                         "; ".join(draw_text(d, mix) for d in mix["draws"]) + "\n")
    return "\n".join(lines)


def throughput_at_target_text(s):
    """'12,345', '12,345+' (never crossed: at least the highest load's throughput) or
    '<2,345' (over the target at the lowest load: below that load's throughput)."""
    if s.get("over_target_at_lowest_load"):
        return f"<{s['lowest_load_throughput_rps']:,.0f}"
    return f"{s['throughput_at_target_rps']:,.0f}" + ("+" if s["target_not_crossed"] else "")


def capacity_text(mix):
    if mix.get("capacity_how") == "utilisation":
        return f"{mix['capacity_ref']}'s workers keep their emulated cores busy"
    return f"what {mix['capacity_ref']} sustains"


def draw_text(d, mix):
    ports = (f"ports {d['src_port_base']}-{d['src_port_base'] + mix['flows'] - 1}, "
             if d.get("src_port_base") else "")
    head = f"round {d['round']} ({ports}hash imbalance {d['imbalance']:.2f}) "
    if d.get("round_robin_not_crossed") and d.get("pass_not_crossed"):
        return head + "- (neither crossed the target)"
    if not d["ratio"]:
        return head + "-"
    bound = ">= " if d.get("round_robin_not_crossed") else ""
    text = f"{bound}{d['ratio']:.2f}x"
    last = d.get("ratio_last_crossing")
    if last and abs(last - d["ratio"]) > 0.005:
        text += f" ({bound}{last:.2f}x against the hash's last crossing)"
    if bound:
        text += " (round robin never crossed the target)"
    return head + text


def small_table(results):
    """The demo's table: per policy at 80% load (or the highest load run)."""
    lines = []
    for mix in results["mixes"]:
        loads = mix["loads"]
        load = 0.8 if 0.8 in loads else loads[-1]
        lines.append(f"{mix['mix']} GET/SCAN mix at {load:.0%} load "
                     f"({load * mix['capacity_rps']:,.0f} req/s offered; 100% = {capacity_text(mix)}):")
        lines.append(f"  {'policy':22s} {'throughput':>12s} {'GET p99':>12s} {'SCAN p99':>12s}"
                     f" {'thr. at target':>15s}")
        for label in mix["configs"]:
            s = mix["summary"][label]
            if "pending" in s:
                lines.append(f"  {label:22s} {PENDING}")
                continue
            row = next(r for r in mix["points"][label] if abs(r["load"] - load) < 1e-9)
            lines.append(f"  {label:22s} {row['throughput_rps']:10,.0f}/s {fmt_us(row['get_p99_us']):>9s} us"
                         f" {fmt_us(row['scan_p99_us']):>9s} us {throughput_at_target_text(s):>13s}/s")
    return "\n".join(lines)


def plot(results, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = []
    for mix in results["mixes"]:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
        for label in mix["configs"]:
            if label not in mix["points"]:
                continue
            rows = mix["points"][label]
            x = [r["offered_rps"] / 1000 for r in rows]
            style = dict(marker="o", markersize=4, label=label)
            axes[0].plot(x, [r["get_p99_us"] for r in rows], **style)
            axes[1].plot(x, [r["scan_p99_us"] for r in rows], **style)
        for ax, what in zip(axes, ("GET", "SCAN")):
            ax.set_yscale("log")
            ax.set_xlabel("offered load (thousand requests/s)")
            ax.set_ylabel(f"{what} p99 latency (us)")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{what} p99, {mix['mix']} GET/SCAN")
        axes[0].axhline(mix["target_us"], color="gray", linestyle="--", linewidth=1,
                        label=f"target {mix['target_us']:,.0f} us")
        axes[0].legend(fontsize=8)
        for label, why in mix["pending"].items():
            axes[0].plot([], [], " ", label=f"{label}: {PENDING}")
        if mix["pending"]:
            axes[0].legend(fontsize=8)
        where = f"on CPU {results['config']['server_cpus']}"
        if mix.get("core_share"):
            where = (f"each a SCHED_DEADLINE core of {mix['core_share']:g} CPU" if mix.get("core_deadline")
                     else f"each paced to a core of {mix['core_share']:g} CPU {where}")
        fig.suptitle(f"RocksDB over UDP: {mix['workers']} workers {where}, "
                     f"load generator on CPU {results['config']['client_cpu']}, 50 flows, open loop")
        fig.tight_layout()
        path = os.path.join(outdir, f"rocksdb_{mix['mix']}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the < 10 minute setting")
    ap.add_argument("--demo", action="store_true", help="the demo's short sweep (99.5/0.5, four policies)")
    ap.add_argument("--socket", help="use this syrupd instead of starting a private one")
    ap.add_argument("--bindir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--policies", default=os.path.join(ROOT, "policies"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "rocksdb"))
    ap.add_argument("--db", default="/var/tmp/syrup-kv-db")
    ap.add_argument("--keys", type=int, default=200000)
    ap.add_argument("--cache_mb", type=int, default=96)
    ap.add_argument("--workers", help="workers per server: N, or MIX:N,... (default 99.5:16,50:8)")
    ap.add_argument("--mixes", default="99.5,50")
    ap.add_argument("--configs", help="comma-separated configurations (" + ", ".join(CONFIGS) + "); "
                    "LABEL@k=v:k2=v2 runs LABEL with those policy parameters, e.g. "
                    "scan_avoid+get_first@keep_free=1")
    ap.add_argument("--loads", help="comma-separated fractions of saturation")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--max-foreign", dest="max_foreign", type=float, default=0.10,
                    help="cores others may use during a run before it is repeated")
    ap.add_argument("--max-drift", dest="max_drift", type=float, default=0.05,
                    help=f"emulated cores, loads >= {DRIFT_FROM_LOAD * 100:.0f}%%: a run whose cores were busier than its "
                         "load point by more than this (its CPU per request against the round's capacity "
                         "probe) is repeated; 0: off")
    ap.add_argument("--quiet-wait", dest="quiet_wait", type=float, default=30,
                    help="seconds to wait, before each run, for other work on the machine to stop")
    ap.add_argument("--flows", type=int, default=50)
    ap.add_argument("--scan-ratio", dest="scan_ratio", type=float, default=70)
    ap.add_argument("--yield-us", dest="yield_us",
                    help="a SCAN yields its core about this often, 0 never: U or MIX:U,... (default 0: never)")
    ap.add_argument("--slice-us", dest="slice_us", type=int, default=0)
    ap.add_argument("--core-share", dest="core_share",
                    help="each worker a core of its own, emulated: paced to this fraction of a CPU "
                         "(--core-deadline adds a SCHED_DEADLINE reservation; 0: off, the workers share "
                         "the server CPUs): F or MIX:F,... (default 99.5:0.055,50:0)")
    ap.add_argument("--long-budget", dest="long_budget",
                    help="executors scan_avoid lets long requests hold at once (keep_free = workers - "
                         "this): N, 'sita' (as many as sita's long executors) or 0 (no limit, the talk's "
                         "policy); B or MIX:B,... (default 99.5:0,50:sita)")
    ap.add_argument("--core-deadline", dest="core_deadline", action="store_true",
                    help="back each emulated core with a SCHED_DEADLINE reservation as before commit 91c204c "
                         "(kv_server --core_deadline): the workers then run on every CPU, the load "
                         "generator's too (default: pacing alone, the workers stay on --server-cpus)")
    ap.add_argument("--core-hold-us", dest="core_hold_us", type=int, default=200,
                    help="with a core share: how far a worker may run ahead of its emulated core before "
                         "it sleeps until the core catches up, us (kv_server --core_hold_us; a huge value "
                         "turns the hold off, as before commit 3ba8a02)")
    ap.add_argument("--nice", type=int, default=-20,
                    help="nice of the servers and the load generator (protects them from other work)")
    ap.add_argument("--server-cpus", dest="server_cpus", default="1")
    ap.add_argument("--client-cpu", dest="client_cpu", type=int, default=0)
    ap.add_argument("--client-idle-sleep-us", dest="client_idle_sleep_us", type=int, default=0,
                    help="kv_loadgen --idle_sleep_us: sleep between sends when the next is this far away "
                         "(0: busy-poll)")
    ap.add_argument("--agent-cpus", dest="agent_cpus", default="",
                    help="syrupd --agent_cpus for the private syrupd: where thread-hook agents run "
                         "(default: anywhere)")
    ap.add_argument("--target-us", dest="target_us", type=float,
                    help="GET p99 target, us (default: twice the SCAN p50 measured at the lowest load)")
    ap.add_argument("--max-loss", dest="max_loss", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--src-port-base", dest="src_port_base", type=int, default=20000,
                    help="round r's flows use source ports base + r x flows ... (0: ephemeral ports, "
                         "new ones every run); below the ephemeral range so nothing else holds them")
    ap.add_argument("--trace-dir", dest="trace_dir",
                    help="keep every run's per-request trace (kv_loadgen --trace) as CSV in this directory")
    args = ap.parse_args()

    loads = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    if args.quick:
        loads = [0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
        args.duration, args.rounds = 2.0, 1
    if args.demo:
        loads = [0.3, 0.5, 0.8]
        args.duration, args.rounds, args.retries, args.mixes = 1.5, 1, 1, "99.5"
        args.quiet_wait = min(args.quiet_wait, 5)
        if not args.configs:
            args.configs = "pass,round_robin,scan_avoid,sita"
    if args.loads:
        loads = [float(x) for x in args.loads.split(",")]
    try:  # the sweep's own parse, once per mix, before the sweep rather than in it
        for m in args.mixes.split(","):
            per_mix(args.long_budget, float(m), "long_budget", long_budget_value)
    except ValueError:
        sys.exit(f"rocksdb_bench: --long-budget: '{args.long_budget}' is not N, sita, or MIX:N / MIX:sita,...")
    if args.configs:
        unknown = [c for c in args.configs.split(",") if not known_config(c)]
        if unknown:
            sys.exit(f"rocksdb_bench: unknown configuration {', '.join(unknown)} (known: {', '.join(CONFIGS)})")
    try:
        import matplotlib  # noqa: F401  (the plots; checked before, not after, the sweep)
    except ImportError:
        sys.exit(f"rocksdb_bench: {sys.executable} has no matplotlib: run bench/rocksdb/run.sh (Debian's "
                 "python3 with python3-matplotlib) or install it")
    if os.geteuid() != 0:
        sys.exit("rocksdb_bench: run as root (the servers deploy BPF programs through syrupd)")
    for b in ("kv_server", "kv_loadgen") + (() if args.socket else ("syrupd", "syrupctl")):
        if not os.access(os.path.join(args.bindir, b), os.X_OK):
            sys.exit(f"rocksdb_bench: {args.bindir}/{b} is missing: build first (bash scripts/build.sh)")
    os.makedirs(args.out, exist_ok=True)

    daemon = None

    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    t_start = time.time()
    try:
        daemon = Daemon(args.bindir, args.socket, args.nice, args.agent_cpus)
        log(f"rocksdb_bench: syrupd at {daemon.socket}; database {args.db} ({args.keys} keys)")
        cal = calibrate(args)
        log(f"  calibration: GET {cal['get_ns'] / 1000:.1f} us + socket work {cal['io_ns'] / 1000:.1f} us; "
            f"SCAN of {cal['scan_len']} keys {cal['scan_ns'] / 1000:.0f} us; ratio {cal['ratio']:.1f}")
        results = {"config": {k: v for k, v in vars(args).items()}, "calibration": cal,
                   "loads": loads, "mixes": [], "machine": {"nproc": os.cpu_count(),
                                                            "kernel": os.uname().release}}
        tag = "demo" if args.demo else ""
        for get_pct in (float(x) for x in args.mixes.split(",")):
            labels = MIX_CONFIGS.get(get_pct, MIX_CONFIGS[99.5])
            if args.configs:
                labels = args.configs.split(",")
            log(f"mix {mix_name(get_pct)}: {', '.join(labels)}")
            mixres = sweep_mix(args, daemon, cal, get_pct, labels, loads, tag)
            if args.target_us:
                mixres["target_us"] = args.target_us
            else:
                mixres["target_us"], mixres["target_from"] = mix_target_us(mixres, cal)
            mixres["points"], mixres["summary"] = summarize(mixres, mixres["target_us"], args.max_loss)
            mixres["draws"] = per_draw(mixres, mixres["target_us"], args.max_loss)
            results["mixes"].append(mixres)
        results["checks"] = [{"what": w, "value": v, "target": t, "met": m}
                             for w, v, t, m in checks(results)]
        results["elapsed_s"] = time.time() - t_start
        name = "demo" if args.demo else ("quick" if args.quick else "full")
        jpath = os.path.join(args.out, f"rocksdb_{name}.json")
        with open(jpath, "w") as f:
            json.dump(results, f, indent=1)
        pngs = plot(results, args.out)
        if args.demo:
            print(small_table(results))
        else:
            print(markdown(results))
            print("targets:")
            for c in results["checks"]:
                state = "pending" if c["met"] is None else ("ok" if c["met"] else "MISSED")
                print(f"  {c['what']}: {c['value']} (target {c['target']}) {state}")
        print(f"results: {jpath}")
        for p in pngs:
            print(f"plot: {p}")
        log(f"rocksdb_bench: done in {results['elapsed_s']:.0f} s")
    finally:
        if daemon:
            daemon.stop()


if __name__ == "__main__":
    main()
