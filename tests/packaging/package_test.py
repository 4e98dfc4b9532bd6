#!/usr/bin/env python3
"""The Debian packages end to end, on this machine's root file system (a test machine).

scripts/package.sh packages the suite's built tree; dpkg -i installs syrupd, libsyrup0
and libsyrup-dev; the installed /usr/sbin/syrupd runs with the unit's own command line
(packaged defaults: /etc/syrup/syrup.yaml, /run/syrup/syrupd.sock, /sys/fs/bpf/syrup),
after a check that no installed path is writable by an unprivileged user (uid 62001);
the installed syrupctl deploys the shipped round_robin.c for a UDP SO_REUSEPORT group and
datagrams of one flow spread over its sockets; a program built with
`pkg-config --cflags --libs libsyrup` deploys through the library; syrupd stops (its
policies' pins stay, as with the unit), and dpkg --purge must leave no file of the
packages, no /etc/syrup, /var/lib/syrup, /run/syrup, pin or group behind.

Refuses (skip, exit 77) to touch a machine where a package of the same name is installed,
or where the paths purge removes exist already: they would be someone else's. Whatever
happens, the packages it installed are purged and its syrupd stopped before it exits.
  package_test.py BUILD_DIR SOURCE_DIR
"""
import grp
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

PACKAGES = ["libsyrup-dev", "syrupd", "libsyrup0"]  # purge order: dependents first
PURGED_PATHS = ["/etc/syrup", "/var/lib/syrup", "/run/syrup", "/sys/fs/bpf/syrup"]
UNIT = "/lib/systemd/system/syrupd.service"
POLICY = "/usr/share/syrup/policies/round_robin.c"
ADMIN_GROUP = "syrup-admin"
SKIP = 77
UNPRIVILEGED_UID = 62001  # the security tests' attacker (tests/security)


class Failure(Exception):
    pass


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def must(cmd, what, **kw):
    r = run(cmd, **kw)
    if r.returncode != 0:
        raise Failure(f"{what} failed ({shlex.join(cmd)}):\n{r.stdout}{r.stderr}")
    return r.stdout


def installed(pkg):
    r = run(["dpkg-query", "-W", "-f=${db:Status-Status}", pkg])
    return r.returncode == 0 and r.stdout not in ("", "not-installed")


def group_exists(name):
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def why_not():
    """Why this machine cannot run the test, or None."""
    if os.geteuid() != 0:
        return "needs root (dpkg -i, syrupd)"
    for tool in ["dpkg", "dpkg-query", "dpkg-shlibdeps", "cpack", "pkg-config", "cc"]:
        if not shutil.which(tool):
            return f"{tool} is not installed (bash scripts/setup-deps.sh)"
    for pkg in PACKAGES:
        if installed(pkg):
            return f"package {pkg} is installed already (not by this test): not touching it"
    for p in PURGED_PATHS + ["/usr/sbin/syrupd", "/usr/bin/syrupctl", UNIT]:
        if os.path.lexists(p):
            return f"{p} exists (another syrupd's): purging the packages would remove it"
    return None


def start_syrupd(log):
    """The installed syrupd with the unit's ExecStart, as systemd would run it."""
    with open(UNIT) as f:
        line = next(l for l in f if l.startswith("ExecStart="))
    argv = shlex.split(line[len("ExecStart="):])
    if argv[0] != "/usr/sbin/syrupd":
        raise Failure(f"the unit starts {argv[0]}, not /usr/sbin/syrupd")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    for _ in range(100):
        if proc.poll() is not None:
            raise Failure(f"{shlex.join(argv)} exited with {proc.returncode}")
        if run(["/usr/bin/syrupctl", "ping"]).returncode == 0:
            return proc
        time.sleep(0.1)
    raise Failure("the installed syrupd did not answer syrupctl ping within 10 s")


def stop(proc):
    if proc and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def udp_group(n):
    """n SO_REUSEPORT UDP sockets on a loopback port no other socket held a moment ago (a
    port-0 bind with SO_REUSEPORT could join another group of root's)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
        s.settimeout(0.2)
        socks.append(s)
    return port, socks


def received(socks):
    counts = []
    for s in socks:
        n = 0
        try:
            while s.recv(16):
                n += 1
        except socket.timeout:
            pass
        counts.append(n)
    return counts


def check_installed(group_before):
    conffiles = must(["dpkg-query", "-W", "-f=${Conffiles}", "syrupd"], "dpkg-query")
    if "/etc/syrup/syrup.yaml" not in conffiles:
        raise Failure(f"/etc/syrup/syrup.yaml is not a conffile of syrupd: {conffiles!r}")
    if not group_before and not group_exists(ADMIN_GROUP):
        raise Failure(f"the config names admin_group {ADMIN_GROUP} but the install did not create it")
    for f in ["/usr/sbin/syrupd", "/usr/sbin/syrup-agent", "/usr/bin/syrupctl", UNIT, POLICY,
              "/usr/share/syrup/kernel/include/syrup/policy.h", "/usr/include/syrup/syrup.h"]:
        if not os.path.exists(f):
            raise Failure(f"{f} was not installed")
    if shutil.which("systemd-analyze"):
        r = run(["systemd-analyze", "verify", "--man=no", "--recursive-errors=no", UNIT])
        if r.returncode != 0 or "syrupd.service" in r.stdout + r.stderr:
            raise Failure(f"systemd-analyze verify {UNIT}:\n{r.stdout}{r.stderr}")
    if not os.path.isdir("/run/systemd/system"):
        r = run(["pgrep", "-x", "syrupd", "-a"])
        running = [l for l in r.stdout.splitlines() if l.split()[1:2] == ["/usr/sbin/syrupd"]]
        if running:
            raise Failure(f"installing started syrupd on a machine without systemd: {running}")


def writable_by_user(debs, uid):
    """What of the packages' files and directories (and of what postinst made) user `uid`
    may write: a tenant who could edit the config, a policy or a binary would own root."""
    paths = {"/var/lib/syrup"}
    for deb in debs:
        for line in must(["dpkg-deb", "-c", deb], "dpkg-deb -c").splitlines():
            if not line.startswith("l"):
                paths.add(line.split(None, 5)[5].lstrip(".").rstrip("/") or "/")
    paths = sorted(p for p in paths if os.path.lexists(p))
    r = run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sh", "-c",
             'for p; do [ -w "$p" ] && echo "$p"; done; true', "sh"] + paths)
    if r.returncode != 0:
        raise Failure(f"checking as uid {uid}: {r.stderr}")
    return r.stdout.split()


def deploy_and_send():
    """syrupctl deploys round_robin.c for this process's group; 8 datagrams of one flow."""
    port, socks = udp_group(4)
    out = must(["/usr/bin/syrupctl", "deploy", "--pid", str(os.getpid()), "--port", str(port),
                "--protocol", "udp", "--app", f"pkgtest-{os.getpid()}", POLICY], "syrupctl deploy")
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(8):
        client.sendto(b"%d" % i, ("127.0.0.1", port))
    counts = received(socks)
    client.close()
    print(f"package_test: {out.strip()}; 8 datagrams of one flow -> {counts}")
    if counts != [2, 2, 2, 2]:
        raise Failure(f"round_robin.c should give each of the 4 sockets 2 datagrams, got {counts}")
    return socks


def build_against_dev(tmp, src):
    flags = must(["pkg-config", "--cflags", "--libs", "libsyrup"], "pkg-config libsyrup").split()
    prog = os.path.join(tmp, "libsyrup_dev_check")
    must(["cc", "-Wall", "-Werror", os.path.join(src, "tests/packaging/libsyrup_dev_check.c"),
          "-o", prog] + flags, "building against libsyrup-dev")
    print("package_test: " + must([prog, POLICY], "the program built against libsyrup-dev").strip())


def leftovers(debs, group_before):
    """Files of the packages, and paths purge owns, still on the machine."""
    left = [p for p in PURGED_PATHS if os.path.lexists(p)]
    for deb in debs:
        for line in must(["dpkg-deb", "-c", deb], "dpkg-deb -c").splitlines():
            path = line.split(None, 5)[5].split(" -> ")[0].lstrip(".")
            if line.startswith("-") or line.startswith("l"):
                if os.path.lexists(path):
                    left.append(path)
    left += [p for p in PACKAGES if installed(p)]
    if not group_before and group_exists(ADMIN_GROUP):
        left.append(f"group {ADMIN_GROUP}")
    return left


def purge():
    present = [p for p in PACKAGES if installed(p)]
    if present:
        return run(["dpkg", "--purge"] + present)
    return None


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    reason = why_not()
    if reason:
        print(f"SKIP: {reason}", file=sys.stderr)
        return SKIP
    group_before = group_exists(ADMIN_GROUP)
    cache_before = os.path.lexists("/var/cache/syrup")
    tmp = tempfile.mkdtemp(prefix="syrup-pkgtest-")
    syrupd = None
    socks = []
    log = open(os.path.join(tmp, "syrupd.log"), "w+")
    t0 = time.monotonic()
    try:
        r = run([os.path.join(src, "scripts/package.sh"), "-b", build, "-o", os.path.join(tmp, "debs")])
        sys.stdout.write(r.stderr)  # lintian's warnings, for the log
        if r.returncode != 0:
            raise Failure(f"scripts/package.sh failed:\n{r.stdout}")
        out = r.stdout
        debs = sorted(l for l in out.splitlines() if l.endswith(".deb"))
        if len(debs) != 3:
            raise Failure(f"expected 3 packages, package.sh made {debs}")
        print(f"package_test: built {[os.path.basename(d) for d in debs]} in {time.monotonic() - t0:.0f} s")
        must(["dpkg", "-i"] + debs, "dpkg -i")
        check_installed(group_before)
        writable = writable_by_user(debs, UNPRIVILEGED_UID)
        if writable:
            raise Failure(f"uid {UNPRIVILEGED_UID} may write installed paths: {writable}")
        syrupd = start_syrupd(log)
        socks = deploy_and_send()
        if not os.listdir("/sys/fs/bpf/syrup"):
            raise Failure("no pins under /sys/fs/bpf/syrup with a policy deployed")
        build_against_dev(tmp, src)
        stop(syrupd)  # the unit's default --on_exit=keep: the pins stay for purge to remove
        for s in socks:
            s.close()
        socks = []
        r = purge()
        if r.returncode != 0:
            raise Failure(f"dpkg --purge failed:\n{r.stdout}{r.stderr}")
        left = leftovers(debs, group_before)
        if os.path.lexists("/var/cache/syrup") != cache_before:
            left.append("/var/cache/syrup (created by the install, not removed)")
        if left:
            raise Failure(f"left after dpkg --purge: {left}")
        print(f"package_test: installed, deployed, built against libsyrup-dev and purged clean "
              f"in {time.monotonic() - t0:.0f} s")
        return 0
    except Failure as e:
        print(f"package_test: {e}", file=sys.stderr)
        log.seek(0)
        print("syrupd's log:\n" + log.read()[-4000:], file=sys.stderr)
        return 1
    finally:
        stop(syrupd)
        for s in socks:
            s.close()
        purge()
        if not group_before and group_exists(ADMIN_GROUP):
            run(["groupdel", ADMIN_GROUP])
        # What purge removes when it runs; left by a purge that failed.
        for p in PURGED_PATHS:
            if os.path.lexists(p):
                shutil.rmtree(p, ignore_errors=True)
        if not cache_before:
            shutil.rmtree("/var/cache/syrup", ignore_errors=True)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
