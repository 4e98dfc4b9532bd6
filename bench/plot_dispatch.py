#!/usr/bin/python3
"""Plots the per-packet cost of Syrup's XDP dispatch against the number of applications on
the interface, from the JSON of one `syrup_bench` run that included `xdp-scale` (its
"curve": 1, 10, 100, 1000 applications), beside the hand-written programs measured in the
same rounds. The right panel shows the ratios, with the socket-select and socket-lookup
decision ratios of the same run (benchmarks `decision` and `socket-lookup`, one
application: their programs are attached per group or per claim, so no other application
is on their path) where the JSON has them.

    bench/plot_dispatch.py bench/results/latest.json bench/dispatch.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        run = json.load(f)
    curve = run.get("xdp-scale", {}).get("curve")
    if not curve:
        sys.exit(f"{src}: no xdp-scale curve (run `syrup_bench xdp-scale` or `all`)")
    apps = [p["applications"] for p in curve]

    def ns(name):
        return [p[name]["median_ns"] for p in curve]

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(apps, ns("B_rr"), "o-", label="Syrup: root + tail call + round robin")
    left.plot(apps, ns("hw_rr"), "s--", label="hand-written XDP round robin")
    left.plot(apps, ns("B_unclaimed"), "^-", label="Syrup: root alone (unclaimed port)")
    left.plot(apps, ns("hw_pass"), "v--", label="hand-written XDP pass")
    left.set_xscale("log")
    left.set_xticks(apps, [str(a) for a in apps])
    left.set_xlabel("applications on the interface")
    left.set_ylabel("ns per packet (BPF_PROG_TEST_RUN)")
    left.set_ylim(bottom=0)
    left.set_title("XDP, per packet")
    left.legend(fontsize=8, loc="lower right")
    left.grid(alpha=0.3)

    right.plot(apps, [p["rr_over_hw_rr"] for p in curve], "o-", label="XDP round robin / hand-written")
    right.plot(apps, [p["unclaimed_over_hw_pass"] for p in curve], "^-", label="XDP root alone / hand-written pass")
    rr = run.get("decision", {}).get("round_robin_vs_handwritten", {}).get("median_per_round")
    if rr:
        right.plot([1], [rr], "D", label="socket-select round robin / hand-written (1 app)")
    sl = run.get("socket-lookup", {}).get("ratio_same_caps", {}).get("median")
    if sl:
        right.plot([1], [sl], "P", label="socket-lookup round robin / hand-written (1 app)")
    right.axhline(1.1, color="grey", linestyle=":", label="target 1.1x")
    right.axhline(1.0, color="black", linewidth=0.5)
    right.set_xscale("log")
    right.set_xticks(apps, [str(a) for a in apps])
    right.set_xlabel("applications on the interface")
    right.set_ylabel("Syrup / hand-written (median of per-round ratios)")
    right.set_ylim(0.8, max(1.6, *(p["rr_over_hw_rr"] for p in curve)) + 0.05)
    right.set_title("ratio per decision")
    right.legend(fontsize=8, loc="upper right")
    right.grid(alpha=0.3)

    when = run.get("machine", {}).get("kernel", "")
    fig.suptitle(f"Syrup dispatch cost, {run.get('command', '')} (kernel {when})", fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
