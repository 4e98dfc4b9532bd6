/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The user-space agent's eyes: BPF on the scheduler tracepoints (tp_btf, no trampolines
 * needed) reporting the target process's thread events into a ring buffer. One instance
 * per agent, filtered by the process (target_tgid, set before load) or, for a policy
 * deployed by cgroup, by the task's cgroup v2 (target_cgid: the cgroup's id, its inode
 * number): every thread of every process in that cgroup, those that join it later
 * included. The agent decides which of them it takes (the deploying user's only); the
 * tracer only narrows the stream.
 *
 * It shares the application's syrup_threads and syrup_cs maps (reused from their pins by
 * the agent) to count preemptions of registered threads, and how many of them landed
 * inside a critical section, exactly at the switch; and it drops an exiting thread's
 * registration itself (below).
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "thread/events.h"

#define SYR_MAX_EXECUTORS 256

#include "thread/task_cgroup.bpf.h"

struct task_struct {
	int pid;
	int tgid;
	struct css_set *cgroups;
} __attribute__((preserve_access_index));

const volatile __u32 target_tgid = 0;
const volatile __u64 target_cgid = 0; /* non-zero: filter by cgroup, not by process */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SYR_TCNT_NR);
} counters SEC(".maps");

/* The application's maps (reused from their pins; same definitions as policy.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 4096);
} syrup_threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SYR_MAX_EXECUTORS);
} syrup_cs SEC(".maps");

/* Whether `p` is one of the traced threads: of the process, or in the cgroup (its own
 * cgroup v2, not a descendant: as cgroup.procs lists it). The loads through the task's
 * pointers are BTF-typed; a task whose css_set is being switched reads one of the two. */
static __always_inline int traced(struct task_struct *p)
{
	if (!target_cgid)
		return p->tgid == target_tgid;
	return SYR_TASK_CGROUP_ID(p) == target_cgid;
}

static __always_inline void count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &slot);

	if (c)
		__sync_fetch_and_add(c, 1);
}

static __always_inline void emit(__u32 type, __u32 tid, __u32 arg)
{
	struct syr_tev *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count(SYR_TCNT_DROPPED);
		return;
	}
	e->ts = bpf_ktime_get_ns();
	e->type = type;
	e->tid = tid;
	e->cpu = bpf_get_smp_processor_id();
	e->arg = arg;
	/* Only a thread becoming runnable (or exiting) needs the agent now; switches are
	 * read at its next wakeup or tick. Waking the agent for every switch made it the main
	 * preemptor of the threads it schedules (bench/thread/README.md). */
	/* (FORCE: the ring buffer's default skips the notification while earlier records
	 * are unread, and those would be the unannounced switches.) */
	bpf_ringbuf_submit(e, type == SYR_TEV_SWITCH_IN || type == SYR_TEV_SWITCH_OUT ? BPF_RB_NO_WAKEUP
										     : BPF_RB_FORCE_WAKEUP);
	count(SYR_TCNT_EVENTS);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(syr_on_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	if (traced(prev)) {
		__u32 tid = prev->pid;
		emit(SYR_TEV_SWITCH_OUT, tid, prev_state);
		if (prev_state == 0) {
			__u32 *e = bpf_map_lookup_elem(&syrup_threads, &tid);
			if (e) {
				__u32 idx = *e;
				__u64 *d = bpf_map_lookup_elem(&syrup_cs, &idx);
				count(SYR_TCNT_PREEMPT);
				if (d && *d)
					count(SYR_TCNT_PREEMPT_IN_CS);
			}
		}
	}
	if (traced(next))
		emit(SYR_TEV_SWITCH_IN, next->pid, 0);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(syr_on_wakeup, struct task_struct *p)
{
	if (traced(p))
		emit(SYR_TEV_WAKEUP, p->pid, 0);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(syr_on_wakeup_new, struct task_struct *p)
{
	if (traced(p))
		emit(SYR_TEV_NEW, p->pid, 0);
	return 0;
}

/* A registered thread's entry goes here, at its exit, while its tid is still its own: the
 * agent reads the event later, and by then a new thread of the process may have been
 * given the same tid (pid_max is 32768 on small machines) and registered under it. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(syr_on_exit, struct task_struct *p)
{
	if (traced(p)) {
		__u32 tid = p->pid;
		bpf_map_delete_elem(&syrup_threads, &tid);
		emit(SYR_TEV_EXIT, tid, 0);
	}
	return 0;
}

char _license[] SEC("license") = "GPL";
