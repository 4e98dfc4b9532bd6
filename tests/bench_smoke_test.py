#!/usr/bin/python3
"""Every syrup_bench benchmark runs to the end and reports what it measured, on the real
kernel (its own syrupd, sockets on loopback, veth pairs in namespaces of its own), with
settings so small that the whole run takes seconds. No number is judged here: benchmarks
are judged by bench/ runs on a quiet machine. What is checked is behaviour the numbers rest
on: each program decided for every datagram, the round robins (Syrup's and the hand-written
one, whose const volatile socket count the bench sets) spread the datagrams evenly, the XDP
programs returned the verdicts they exist for, and every section of the report is there.
Exits 77 (skip) when not run as root."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

BIN = os.environ.get("SYRUP_BUILD_BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin"))
DATAGRAMS = 2000
XDP_PASS, XDP_REDIRECT = 2, 4
SMALL = ["--datagrams=%d" % DATAGRAMS, "--rounds=1", "--hints=10000", "--syscalls=10000", "--deploys=2",
         "--pps_rounds=1", "--pps_seconds=0.2", "--veth_datagrams=2000", "--xdp_apps=4", "--xdp_repeat=1000", "--xdp_rounds=1",
         "--config_tenants=4", "--config_rounds=1",
         "--cp_max=20", "--cp_samples=1", "--lu_replaces=2", "--lu_gap_us=100", "--replay_inputs=2000"]


class EveryBenchmarkRunsAndReports(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="syrup-bench-smoke-")
        out = os.path.join(cls.tmp.name, "report.json")
        cls.run_ = subprocess.run([os.path.join(BIN, "syrup_bench"), "all", "--out=" + out] + SMALL,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
        cls.report = json.load(open(out)) if os.path.exists(out) else {}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def output(self):
        return "\n--- stdout\n%s\n--- stderr\n%s" % (self.run_.stdout[-3000:], self.run_.stderr[-3000:])

    def test_exits_0_with_every_section(self):
        self.assertEqual(self.run_.returncode, 0, self.output())
        for section in ["decision", "hint", "deploy", "xdp-cost", "xdp-scale", "xdp-pps", "xdp-veth", "socket-lookup", "recording", "replay", "test", "config-swap",
                        "control-plane", "live-upgrade", "machine",
                        "command"]:
            self.assertIn(section, self.report, self.output())

    def test_decision_every_program_decided_and_the_round_robins_spread_evenly(self):
        d = self.report.get("decision", {})
        programs = d.get("programs", {})
        self.assertEqual(sorted(programs), sorted(["pass", "round_robin", "handwritten_rr", "handwritten_rr_alike",
                                                   "scan_avoid", "sita", "least_loaded"]), self.output())
        for name, p in programs.items():
            self.assertEqual(p["run_cnt"], [DATAGRAMS], name)
            self.assertGreater(p["median_ns_per_decision"], 0, name)
        for name in ["round_robin", "handwritten_rr", "handwritten_rr_alike"]:
            got = programs[name]["received_per_socket_last_run"]
            self.assertEqual(len(got), d["sockets"], name)
            total = sum(got)
            self.assertGreaterEqual(total, 0.9 * (DATAGRAMS + d["warmup_datagrams"]), "%s lost datagrams: %s" % (name, got))
            for n in got:  # 1/4 each; one socket with all: the socket count did not reach the program
                self.assertLess(abs(n / total - 1 / len(got)), 0.05, "%s: %s" % (name, got))

    def test_hint_and_deploy_measured_what_they_were_asked_to(self):
        h, dep = self.report.get("hint", {}), self.report.get("deploy", {})
        self.assertGreater(h.get("mmap_ns_per_hint", {}).get("median", 0), 0, self.output())
        self.assertGreater(h.get("syscall_ns_per_update", {}).get("median", 0), 0, self.output())
        self.assertEqual(len(dep.get("cold", {}).get("samples_ms", [])), 2, self.output())
        self.assertEqual(len(dep.get("warm", {}).get("samples_ms", [])), 2, self.output())

    def test_replay_and_test_ran_every_input_and_case(self):
        rp, t = self.report.get("replay", {}), self.report.get("test", {})
        self.assertEqual(rp.get("inputs"), 2000, self.output())
        self.assertTrue(rp.get("same_decisions"), self.output())  # batched and per-input decided alike
        self.assertGreater(rp.get("batched_inputs_per_s", {}).get("median", 0), 0, self.output())
        self.assertGreater(rp.get("per_input_inputs_per_s", {}).get("median", 0), 0, self.output())
        self.assertGreater(t.get("policies", 0), 0, self.output())
        self.assertEqual(len(t.get("warm_s", {}).get("per_round", [])), 1, self.output())

    def test_config_swap_applied_every_change_on_both_daemons(self):
        c = self.report.get("config-swap", {})
        for case in ("watch_ms", "sighup_ms"):
            samples = c.get(case, {}).get("samples", [])
            self.assertEqual(len(samples), 1, self.output())
            self.assertGreater(samples[0], 0, self.output())

    def test_xdp_programs_return_their_verdicts(self):
        progs = self.report.get("xdp-cost", {}).get("programs", {})
        want = {"unclaimed": XDP_PASS, "syr_pass": XDP_PASS, "hw_pass": XDP_PASS,
                "syr_rr": XDP_REDIRECT, "hw_rr": XDP_REDIRECT,
                "tc_none": XDP_PASS, "tc_dir": XDP_PASS, "tc_ind": XDP_PASS}
        for name, verdict in want.items():
            self.assertIn(name, progs, self.output())
            self.assertEqual(progs[name]["retval"], verdict, name)
        # The live pair is measured wherever the kernel runs live-frame test runs; where it
        # refuses them, the report says so (and why) instead.
        live = self.report["xdp-cost"]["live_frames"]
        if live["measured"]:
            self.assertIn("syr_live", progs, self.output())
            self.assertIn("hw_live", progs, self.output())
        else:
            self.assertNotEqual(live["refused"], "", self.output())
            self.assertNotIn("syr_live", progs, self.output())
            print("note: xdp-cost's live pair not measured, the kernel refuses live frames: %s" % live["refused"])
        self.assertEqual(self.report.get("xdp-scale", {}).get("applications_on_B"), 4, self.output())
        curve = self.report["xdp-scale"].get("curve", [])
        self.assertEqual([c["applications"] for c in curve], [1, 4], self.output())
        for c in curve:
            self.assertEqual((c["B_rr"]["retval"], c["hw_rr"]["retval"]), (XDP_REDIRECT, XDP_REDIRECT))
        for phase in ["phase1_control_1_vs_1", "phase2_1_vs_N", "phase3_control_1_vs_1_again"]:
            p = self.report["xdp-scale"][phase]
            self.assertEqual((p["A_rr"]["retval"], p["B_rr"]["retval"]), (XDP_REDIRECT, XDP_REDIRECT), phase)

    def test_xdp_pps_every_case_carried_packets(self):
        cases = self.report.get("xdp-pps", {}).get("cases", {})
        self.assertEqual(sorted(cases), sorted(["none", "hw_pass", "hw_rr", "syr_pass", "syr_rr"]), self.output())
        for name, c in cases.items():
            self.assertGreater(c["median_pps"], 0, name)
        self.assertGreater(cases["syr_rr"]["median_dispatched_pps"], 0, "Syrup's root dispatched nothing")

    def test_xdp_veth_steering_at_default_offloads_delivered_every_datagram(self):
        v = self.report.get("xdp-veth", {})
        self.assertEqual(v.get("peer_tx_checksumming"), "on", self.output())
        for name in ["none", "syr_rr"]:
            b = v["delivered"][name]
            self.assertEqual(b["sent"], 2000, name)
            self.assertEqual(b["received"], b["sent"], name)
            self.assertFalse(b["timed_out"], name)
        self.assertGreater(v["pps"]["median_syr_rr"], 0, self.output())

    def test_recording_measured_all_three_and_accounted_for_every_input(self):
        rec = self.report.get("recording", {})
        progs = rec.get("programs", {})
        self.assertEqual(sorted(progs), ["off", "on", "without"], self.output())
        for name, p in progs.items():
            self.assertGreater(p["median_ns_per_decision"], 0, name)
        t = rec["throughput"]
        self.assertEqual(t["recorded"] + t["lost"], DATAGRAMS, "the trailer must account for every input")
        self.assertGreater(t["recorded"], 0)

    def test_control_plane_every_point_listed_and_adopted_all(self):
        curve = self.report.get("control-plane", {}).get("curve", [])
        # 0 (the baseline), 10, the half and the maximum; each checked by the bench itself:
        # list and stats counted every policy, the restarted syrupd listed them all again.
        self.assertEqual([p["policies"] for p in curve], [0, 10, 20], self.output())
        for p in curve:
            self.assertGreater(p["restart_ms"], 0, p)
            self.assertGreater(p["fds"], 0, p)

    def test_live_upgrade_lost_nothing_and_decided_with_both_policies(self):
        lu = self.report.get("live-upgrade", {})
        for hook in ["socket-select", "socket-lookup", "xdp"]:
            case = lu.get(hook, {})
            self.assertNotIn("error", case, self.output())
            self.assertGreater(case.get("sent", 0), 0, hook)
            self.assertEqual(case["lost"], 0, "%s lost datagrams while its policy was replaced" % hook)
            self.assertEqual(case["replacements"], 2, hook)
        # Round robin spreads over the 4 sockets, the other policy picks socket 0: both ran.
        per = lu["socket-select"]["received_per_executor"]
        self.assertTrue(all(n > 0 for n in per), per)
        self.assertGreater(per[0], max(per[1:]), per)
        self.assertGreater(lu.get("thread-agent", {}).get("replacements", 0), 0, self.output())


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("SKIP: syrup_bench needs root (BPF programs, network namespaces)")
        sys.exit(77)
    unittest.main()
