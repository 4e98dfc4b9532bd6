/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The thread hook wrapper for the sched_ext backend: included after the policy source,
 * it turns the policy's syr_schedule() into a partial-mode sched_ext scheduler
 * (SCX_OPS_SWITCH_PARTIAL): only threads switched to SCHED_EXT -- the registered threads
 * of the application -- run in it; every other thread stays in the fair class, so a bad
 * policy can only hurt its own application.
 *
 * The same policy source as the agent backend: on enqueue the wrapper fills a struct
 * syr_thread from the task, calls the policy, and inserts the task into the chosen
 * core's DSQ (or the shared DSQ for SYR_PASS) ordered by the policy's key (vtime DSQs:
 * lowest key first). dispatch() on a core drains its own DSQ first, then the shared one.
 *
 * No vmlinux.h: the few kernel types it touches are declared with CO-RE relocations
 * (libbpf matches struct_ops members by name), so it compiles with syrupd's ordinary
 * policy flags against any kernel with sched_ext.
 *
 * Exit: when the kernel ejects the scheduler (watchdog stall, runtime error), exit()
 * records the kind, the reason and the message in syr_exit_info for syrupd to report.
 * Current scope: one application's policy per scheduler (syrupd's per-application
 * dispatch through one root scheduler is not done yet; see hooks/thread.h).
 */
#ifndef SYRUP_HOOK_THREAD_SCX_H
#define SYRUP_HOOK_THREAD_SCX_H

#include <bpf/bpf_tracing.h>

#define SYR_SCX_SHARED_DSQ 0x5000ULL
#define SYR_SCX_CORE_DSQ(c) (0x5100ULL + (c))
#define SYR_SCX_MAX_CPUS 64
#define SYR_SCX_SLICE_NS 3000000ULL
#define SYR_SCX_OPS_SWITCH_PARTIAL 8ULL
#define SYR_SCX_ENQ_WAKEUP 1ULL
#define SYR_SCX_KICK_IDLE 1ULL

struct sched_ext_entity {
	__u32 flags;
	__u64 dsq_vtime;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct sched_ext_entity scx;
} __attribute__((preserve_access_index));

#define SYR_SCX_TASK_QUEUED 1

enum scx_exit_kind { SYR_SCX_EXIT_ERROR = 1024 };

struct scx_exit_info {
	enum scx_exit_kind kind;
	int exit_cpu;
	long long exit_code;
	__u64 flags;
	const char *reason;
	unsigned long *bt;
	__u32 bt_len;
	char *msg;
	char *dump;
} __attribute__((preserve_access_index));

extern void scx_bpf_dsq_insert_vtime(struct task_struct *p, __u64 dsq_id, __u64 slice, __u64 vtime,
				     __u64 enq_flags) __weak __ksym;
extern _Bool scx_bpf_dsq_move_to_local(__u64 dsq_id) __weak __ksym;
extern int scx_bpf_create_dsq(__u64 dsq_id, int node) __weak __ksym;
extern int scx_bpf_task_cpu(const struct task_struct *p) __weak __ksym;
extern __u32 scx_bpf_nr_cpu_ids(void) __weak __ksym;
extern void scx_bpf_kick_cpu(int cpu, __u64 flags) __weak __ksym;
extern struct task_struct *scx_bpf_dsq_peek(__u64 dsq_id) __weak __ksym;
extern _Bool scx_bpf_task_set_slice(struct task_struct *p, __u64 slice) __weak __ksym;

struct syr_exit_rec {
	__s32 kind;
	__s32 pad;
	__s64 exit_code;
	char reason[128];
	char msg[256];
};

/* syr_executors: per tid, when it became runnable (for runnable_ns and run_ns). */
struct syr_task_times {
	__u64 runnable_ns;
	__u64 running_since;
	__u64 run_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct syr_task_times);
	__uint(max_entries, 4096);
} syr_executors SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SYR_STAT_SLOTS);
} syr_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct syr_exit_rec);
	__uint(max_entries, 1);
} syr_exit_info SEC(".maps");

static __always_inline void syr_count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&syr_stats, &slot);

	if (c)
		*c += 1;
}

SEC("struct_ops/syr_select_cpu")
__s32 BPF_PROG(syr_select_cpu, struct task_struct *p, __s32 prev_cpu, __u64 wake_flags)
{
	return prev_cpu; /* the core is the policy's choice, made in enqueue */
}

/* Asks the policy about `p`: the DSQ it goes to and its key. 0, or -1 if untracked. */
static __always_inline int syr_scx_decide(struct task_struct *p, __u32 reason, __u64 *dsq, __u64 *key,
					  __u64 *slice, __u32 *core_out)
{
	__u32 tid = p->pid;
	__u64 now = bpf_ktime_get_ns();
	struct syr_task_times *tt = bpf_map_lookup_elem(&syr_executors, &tid);
	struct syr_task_times fresh = { .runnable_ns = now };
	__u32 *exec = bpf_map_lookup_elem(&syrup_threads, &tid);
	struct syr_thread t = {};
	__u32 core;

	if (!tt) {
		bpf_map_update_elem(&syr_executors, &tid, &fresh, BPF_ANY);
		tt = bpf_map_lookup_elem(&syr_executors, &tid);
		if (!tt)
			return -1;
	}
	if (reason == SYR_THREAD_WAKEUP) {
		tt->runnable_ns = now;
		tt->run_ns = 0;
	}
	t.tid = tid;
	t.tgid = p->tgid;
	t.executor = exec ? *exec : SYR_NO_EXECUTOR;
	t.prev_cpu = scx_bpf_task_cpu(p);
	t.nr_cpus = scx_bpf_nr_cpu_ids();
	if (t.nr_cpus > SYR_SCX_MAX_CPUS)
		t.nr_cpus = SYR_SCX_MAX_CPUS;
	t.reason = reason;
	t.now_ns = now;
	t.runnable_ns = tt->runnable_ns;
	t.run_ns = tt->run_ns;
	t.key = tt->runnable_ns;
	t.slice_ns = SYR_SCX_SLICE_NS;
	core = syr_schedule(&t);
	if (t.slice_ns == 0 || t.slice_ns > 100000000ULL)
		t.slice_ns = SYR_SCX_SLICE_NS;
	if (core == SYR_PASS || core >= t.nr_cpus) {
		*dsq = SYR_SCX_SHARED_DSQ;
		*core_out = core == SYR_PASS ? SYR_PASS : SYR_DROP; /* DROP marks a fallback */
		core = t.prev_cpu;
	} else {
		*dsq = SYR_SCX_CORE_DSQ(core);
		*core_out = core;
	}
	*key = t.key;
	*slice = t.slice_ns;
	return (int)core;
}

SEC("struct_ops/syr_enqueue")
void BPF_PROG(syr_enqueue, struct task_struct *p, __u64 enq_flags)
{
	__u64 dsq, key, slice;
	__u32 c;
	int kick = syr_scx_decide(p, (enq_flags & SYR_SCX_ENQ_WAKEUP) ? SYR_THREAD_WAKEUP : SYR_THREAD_PREEMPTED,
				  &dsq, &key, &slice, &c);

	if (kick < 0) {
		scx_bpf_dsq_insert_vtime(p, SYR_SCX_SHARED_DSQ, SYR_SCX_SLICE_NS, bpf_ktime_get_ns(), enq_flags);
		return;
	}
	if (c == SYR_PASS)
		syr_count(SYR_STAT_PASS);
	else if (c == SYR_DROP)
		syr_count(SYR_STAT_FALLBACK);
	else
		syr_count(SYR_STAT_EXECUTOR_BASE + c);
	scx_bpf_dsq_insert_vtime(p, dsq, slice, key, enq_flags);
	scx_bpf_kick_cpu(kick, SYR_SCX_KICK_IDLE);
}

/* The lowest key waiting for `cpu` (its own DSQ, then the shared one), or ~0. */
static __always_inline __u64 syr_scx_head_key(__s32 cpu)
{
	struct task_struct *h = (__u32)cpu < SYR_SCX_MAX_CPUS ? scx_bpf_dsq_peek(SYR_SCX_CORE_DSQ(cpu)) : 0;
	struct task_struct *s = scx_bpf_dsq_peek(SYR_SCX_SHARED_DSQ);
	__u64 k = ~0ULL;

	if (h)
		k = h->scx.dsq_vtime;
	if (s && s->scx.dsq_vtime < k)
		k = s->scx.dsq_vtime;
	return k;
}

SEC("struct_ops/syr_dispatch")
void BPF_PROG(syr_dispatch, __s32 cpu, struct task_struct *prev)
{
	/* prev's slice ended and it is still runnable: it is not queued yet, so ask the
	 * policy now and keep it running if it still comes first (e.g. the marked thread,
	 * or a thread inside a critical section under cs_aware). */
	if (prev && (prev->scx.flags & SYR_SCX_TASK_QUEUED)) {
		__u64 dsq, key, slice;
		__u32 c;
		int r = syr_scx_decide(prev, SYR_THREAD_PREEMPTED, &dsq, &key, &slice, &c);

		if (r >= 0 && (dsq == SYR_SCX_SHARED_DSQ || dsq == SYR_SCX_CORE_DSQ(cpu)) &&
		    key < syr_scx_head_key(cpu)) {
			scx_bpf_task_set_slice(prev, slice);
			return;
		}
	}
	if ((__u32)cpu < SYR_SCX_MAX_CPUS && scx_bpf_dsq_move_to_local(SYR_SCX_CORE_DSQ(cpu)))
		return;
	scx_bpf_dsq_move_to_local(SYR_SCX_SHARED_DSQ);
}

SEC("struct_ops/syr_running")
void BPF_PROG(syr_running, struct task_struct *p)
{
	__u32 tid = p->pid;
	struct syr_task_times *tt = bpf_map_lookup_elem(&syr_executors, &tid);

	if (tt)
		tt->running_since = bpf_ktime_get_ns();
}

SEC("struct_ops/syr_stopping")
void BPF_PROG(syr_stopping, struct task_struct *p, _Bool runnable)
{
	__u32 tid = p->pid;
	struct syr_task_times *tt = bpf_map_lookup_elem(&syr_executors, &tid);

	if (tt && tt->running_since)
		tt->run_ns += bpf_ktime_get_ns() - tt->running_since;
}

static long syr_make_dsq(__u32 i, void *unused)
{
	scx_bpf_create_dsq(SYR_SCX_CORE_DSQ(i), -1);
	return 0;
}

SEC("struct_ops.s/syr_init")
__s32 BPF_PROG(syr_init)
{
	__u32 n = scx_bpf_nr_cpu_ids();

	if (n > SYR_SCX_MAX_CPUS)
		n = SYR_SCX_MAX_CPUS;
	bpf_loop(n, syr_make_dsq, (void *)0, 0);
	return scx_bpf_create_dsq(SYR_SCX_SHARED_DSQ, -1);
}

SEC("struct_ops/syr_exit")
void BPF_PROG(syr_exit, struct scx_exit_info *ei)
{
	__u32 z = 0;
	struct syr_exit_rec *r = bpf_map_lookup_elem(&syr_exit_info, &z);

	if (!r)
		return;
	r->kind = ei->kind;
	r->exit_code = ei->exit_code;
	bpf_probe_read_kernel_str(r->reason, sizeof(r->reason), ei->reason);
	bpf_probe_read_kernel_str(r->msg, sizeof(r->msg), ei->msg);
}

struct sched_ext_ops {
	__s32 (*select_cpu)(struct task_struct *p, __s32 prev_cpu, __u64 wake_flags);
	void (*enqueue)(struct task_struct *p, __u64 enq_flags);
	void (*dispatch)(__s32 cpu, struct task_struct *prev);
	void (*running)(struct task_struct *p);
	void (*stopping)(struct task_struct *p, _Bool runnable);
	__s32 (*init)(void);
	void (*exit)(struct scx_exit_info *ei);
	__u64 flags;
	__u32 timeout_ms;
	char name[128];
};

SEC(".struct_ops.link")
struct sched_ext_ops syr_thread_ops = {
	.select_cpu = (void *)syr_select_cpu,
	.enqueue = (void *)syr_enqueue,
	.dispatch = (void *)syr_dispatch,
	.running = (void *)syr_running,
	.stopping = (void *)syr_stopping,
	.init = (void *)syr_init,
	.exit = (void *)syr_exit,
	.flags = SYR_SCX_OPS_SWITCH_PARTIAL,
	.timeout_ms = 3000,
	.name = "syrup_thread",
};

char _license[] SEC("license") = "GPL";

#endif
