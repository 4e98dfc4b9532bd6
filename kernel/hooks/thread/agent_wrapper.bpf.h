/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The thread hook wrapper for the user-space agent backend: included by syrupd after the
 * policy source, it turns the policy's syr_schedule() into a BPF_PROG_TYPE_SYSCALL
 * program the application's agent runs with BPF_PROG_TEST_RUN.
 *
 * Design: the agent writes a batch of runnable threads into syr_executors (an mmap'ed
 * array of struct syr_thread_slot), runs the program once with ctx = { n }, and reads the
 * decisions back from the same memory: one syscall decides up to SYR_AGENT_BATCH threads.
 * (For the thread hook, syr_executors holds the batch; the executors themselves are the
 * cores.) The policy is the same C function the sched_ext backend calls in the kernel.
 *
 * Invariants:
 *  - every decision is counted in syr_stats: SYR_PASS, a core, or FALLBACK (a core past
 *    nr_cpus, or SYR_DROP, which means nothing for threads): the agent treats FALLBACK as
 *    SYR_PASS;
 *  - while a recording runs, each decision is recorded with the thread as the policy
 *    was handed it (recording.bpf.h);
 *  - slot.core is always either a core < nr_cpus or SYR_PASS.
 */
#ifndef SYRUP_HOOK_THREAD_AGENT_H
#define SYRUP_HOOK_THREAD_AGENT_H

#include "hook_stats.bpf.h"
#include "recording.bpf.h"

#define SYR_AGENT_BATCH 256

struct syr_thread_slot {
	struct syr_thread t;
	__u32 core; /* out: a core < nr_cpus, or SYR_PASS */
	__u32 pad;
};

struct syr_agent_ctx {
	__u32 n; /* slots [0, n) of syr_executors to decide */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct syr_thread_slot);
	__uint(max_entries, SYR_AGENT_BATCH);
} syr_executors SEC(".maps");

static long syr_decide_one(__u32 i, void *unused)
{
	struct syr_thread_slot *s = bpf_map_lookup_elem(&syr_executors, &i);
	struct syr_rec_ctl *rc = syr_rec_active();
	struct syr_thread before;
	__u32 core, slot;

	if (!s)
		return 1;
	if (rc)
		before = s->t;
	core = syr_schedule(SYR_POLICY_ARG(&s->t));
	if (core == SYR_PASS)
		slot = SYR_STAT_PASS;
	else if (core >= s->t.nr_cpus || core >= SYR_MAX_EXECUTORS)
		slot = SYR_STAT_FALLBACK;
	else
		slot = SYR_STAT_EXECUTOR_BASE + core;
	syr_count(slot);
	if (rc)
		syr_rec_thread(rc, &before, &s->t, core, slot);
	s->core = slot == SYR_STAT_FALLBACK ? SYR_PASS : core;
	return 0;
}

SEC("syscall")
int syr_thread_agent(struct syr_agent_ctx *ctx)
{
	__u32 n = ctx->n;

	if (n > SYR_AGENT_BATCH)
		n = SYR_AGENT_BATCH;
	/* Keep the shared maps referenced so every policy object creates (and pins) them. */
	bpf_map_lookup_elem(&syrup_threads, &n);
	bpf_loop(n, syr_decide_one, (void *)0, 0);
	return 0;
}

char _license[] SEC("license") = "Dual BSD/GPL";

#endif
