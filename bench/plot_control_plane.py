#!/usr/bin/python3
"""The control-plane curves of a syrup_bench report (`syrup_bench control-plane --out R`)
as one PNG: per policy count (log scale), list and stats latency and syrupd's CPU per
policy for them, restart after SIGKILL,
deploy p50/p99, syrupd's RSS and descriptors. Usage:
  bench/plot_control_plane.py REPORT.json bench/control_plane.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write the file only
import matplotlib.pyplot as plt


def main(report_path, out_path):
    report = json.load(open(report_path))
    curve = [p for p in report["control-plane"]["curve"] if p["policies"] > 0]
    n = [p["policies"] for p in curve]
    panels = [
        ("list and stats of everything, ms", [("list", "list_ms"), ("stats", "stats_ms")]),
        ("syrupd CPU per list / stats, us per policy", [("list", "list_cpu_us"), ("stats", "stats_cpu_us")]),
        ("restart after SIGKILL (adopts all), ms", [("wall", "restart_ms"), ("on a CPU", "restart_cpu_ms")]),
        ("deploy since the last point, ms", [("p50", "deploy_p50_ms"), ("p99", "deploy_p99_ms")]),
        ("syrupd RSS, MiB", [("RSS", "rss_mib")]),
        ("syrupd open descriptors", [("fds", "fds")]),
    ]
    for p in curve:
        p["rss_mib"] = p["rss_kib"] / 1024
        cpu = p.get("cpu_per_request", {})
        for k in ("list", "stats"):
            p[k + "_cpu_us"] = max(cpu.get(k + "_syrupd_ms", 0) * 1000 / p["policies"], 1e-3)
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for ax, (title, series) in zip(axes, panels):
        for label, key in series:
            if all(key in p for p in curve):  # a report of an older bench may lack one
                ax.plot(n, [p[key] for p in curve], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("policies")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8)
    date = report.get("machine", {}).get("date", "")
    fig.suptitle("Syrup control plane, %s policies per application, %s" %
                 (report["control-plane"]["per_app"], date), fontsize=10)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
