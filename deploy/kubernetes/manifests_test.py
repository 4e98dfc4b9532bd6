#!/opt/syrup-venv/bin/python
"""deploy/kubernetes/ checked offline: every manifest against the Kubernetes API schemas
that the pinned kubernetes-validate ships (scripts/requirements-test.txt), strictly (an
unknown field is an error); the kustomization lists them; the DaemonSet runs syrupd as
the README says, with flags this syrupd has. Run by ctest (K8s.ManifestsValidateOffline)
with the syrupd binary as argument; under `unshare -n` when root, so no network is used.
"""
import copy
import glob
import os
import subprocess
import sys

import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
K8S_VERSION = "1.37.0"  # the newest schema kubernetes-validate 1.37.0 ships


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def validate(doc):
    """'' or why the resource does not match the API schema."""
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return ""
    except kubernetes_validate.ValidationError as e:
        return "%s: %s" % ("/".join(str(p) for p in e.path), e.message)


def main():
    syrupd = sys.argv[1]
    manifests = sorted(p for p in glob.glob(os.path.join(HERE, "*.yaml")) if not p.endswith("kustomization.yaml"))
    resources = {}
    for p in manifests:
        for d in docs(p):
            why = validate(d)
            if why:
                fail("%s: %s/%s does not match the Kubernetes %s schema: %s"
                     % (os.path.basename(p), d.get("kind"), d["metadata"]["name"], K8S_VERSION, why))
            resources[(d["kind"], d["metadata"]["name"])] = (os.path.basename(p), d)
    print("%d resources in %d files match the Kubernetes %s schemas" % (len(resources), len(manifests), K8S_VERSION))

    kust = docs(os.path.join(HERE, "kustomization.yaml"))[0]
    listed = set(kust["resources"])
    on_disk = {os.path.basename(p) for p in manifests} - {"example-app.yaml"}
    if listed != on_disk:
        fail("kustomization.yaml lists %s, the directory has %s" % (sorted(listed), sorted(on_disk)))

    _, ds = resources[("DaemonSet", "syrupd")]
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    checks = {
        "privileged": c["securityContext"].get("privileged") is True,
        "hostPID": pod.get("hostPID") is True,
        "readiness on /readyz": c["readinessProbe"]["httpGet"]["path"] == "/readyz",
        "config watched": "--config_watch" in c["args"],
    }
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    host = {n: v["hostPath"]["path"] for n, v in vols.items() if "hostPath" in v}
    checks["bpffs from the host"] = host.get("bpffs") == "/sys/fs/bpf" == mounts.get("bpffs")
    checks["/run/syrup from the host"] = host.get("run-syrup") == "/run/syrup" == mounts.get("run-syrup")
    checks["ConfigMap at /etc/syrup"] = (vols["config"]["configMap"]["name"] == "syrup-config"
                                         and mounts["config"] == "/etc/syrup"
                                         and ("ConfigMap", "syrup-config") in resources)
    cm = resources[("ConfigMap", "syrup-config")][1]
    checks["config file in the ConfigMap"] = "--config=/etc/syrup/syrup.yaml" in c["args"] and "syrup.yaml" in cm["data"]
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        fail("the DaemonSet does not run syrupd as deploy/kubernetes/README.md says: " + ", ".join(bad))

    # Every flag the DaemonSet passes is one this syrupd has.
    helptext = subprocess.run([syrupd, "--help"], capture_output=True, text=True).stdout + \
        subprocess.run([syrupd, "--help"], capture_output=True, text=True).stderr
    for a in c["args"]:
        flag = a.split("=")[0]
        if "  " + flag + "=" not in helptext and "  " + flag + " " not in helptext:
            fail("the DaemonSet passes %s, which syrupd --help does not list" % flag)

    # The check can fail: a field the API does not have, and a wrong type, are refused.
    broken = copy.deepcopy(ds)
    broken["spec"]["template"]["spec"]["hostPid"] = True
    wrong = copy.deepcopy(ds)
    wrong["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "metrics"
    for what, d in (("an unknown field", broken), ("a string for a port number", wrong)):
        if not validate(d):
            fail("a DaemonSet with %s passed the schema check" % what)
    print("the DaemonSet runs syrupd privileged, hostPID, with the host's bpffs and /run/syrup, "
          "the ConfigMap watched, ready on /readyz; broken copies are refused")


if __name__ == "__main__":
    if os.geteuid() == 0 and not os.environ.get("SYRUP_K8S_OFFLINE"):
        # No network at all: the schemas must come from the package.
        os.environ["SYRUP_K8S_OFFLINE"] = "1"
        os.execvp("unshare", ["unshare", "--net", sys.executable] + sys.argv)
    main()
