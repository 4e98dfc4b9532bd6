/* SPDX-License-Identifier: GPL-2.0 */
/*
 * syrupd's sched_ext root scheduler: ONE partial-mode scheduler (SCX_OPS_SWITCH_PARTIAL)
 * for every application with a thread policy. Only threads switched to SCHED_EXT -- the
 * registered threads of scheduled processes -- run in it; everything else stays in the
 * fair class, which the kernel runs ahead of SCHED_EXT, so a bad policy can only hurt
 * its own application's threads.
 *
 * Design:
 *  - Each scheduled process has a slot (syr_scx_procs: tgid -> slot) with its own DSQ,
 *    SYR_SCX_APP_DSQ(slot), ordered by enqueue time, and three programs compiled from its
 *    policy (scx_wrapper.bpf.h): select_cpu, enqueue and dispatch, in the prog arrays
 *    syr_scx_sel, syr_scx_enq and syr_scx_disp at index slot. The root tail-calls them. Deploying, replacing or
 *    removing one application's policy is a prog-array update plus syr_scx_procs: the
 *    scheduler stays attached and the other applications are not touched.
 *  - select_cpu(p) and enqueue(p) of a wakeup with no sibling queued: the direct path --
 *    the policy's answer is final (no key to compare), the thread goes straight into its
 *    core's local DSQ, no dispatch round (scx_wrapper.bpf.h).
 *  - enqueue(p): the application's enqueue (policy: core and key; queued in the app's
 *    DSQ; an idle core kicked, or a worse thread of the app preempted). Threads of no
 *    slot, or whose program is gone, wait FIFO in SYR_SCX_FALLBACK_DSQ.
 *  - dispatch(cpu, prev): the root picks, among the applications with a runnable thread
 *    (queued, or prev), the one with the lowest virtual time -- the run time its threads
 *    got, so applications share the cores equally whatever their policies do inside
 *    (an application idle for a while is brought up to the others, minus 20 ms: no
 *    long burst) -- and tail-calls its dispatch, which asks the policy again about every
 *    queued thread of the app (and prev) -- so a hint written since they were queued
 *    counts -- and moves the lowest key to this core. If the app has nothing for this
 *    core it marks itself tried and tail-calls the root back
 *    (syr_scx_disp[SYR_SCX_RESUME]), which tries the next application.
 *  - runnable/running/stopping/disable keep per-thread times (syr_scx_tasks) and what
 *    runs where (syr_scx_cpus) for the policies' runnable_ns/run_ns and preemption.
 *  - syr_root_on_exit (a tracepoint, not a struct_ops member): an exiting thread of a
 *    scheduled process leaves its application's registrations at once (syr_scx_threads).
 *  - exit(): the kernel's reason for ejecting the scheduler (stall, runtime error,
 *    sysrq...) into syr_scx_exit, with the last application program run on the core
 *    that failed, for syrupd to blame, report and re-attach without the culprit.
 *
 * Invariant: every path ends with the task in a DSQ or run (no task is lost): a failed
 * tail call (empty slot) falls through to the fallback FIFO.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <syrup/abi.h>

#include "thread/scx_common.h"

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, SYR_SCX_MAX_APPS);
} syr_scx_enq SEC(".maps");

/* slot -> the application's select_cpu program (the wakeup's core, see below). A prog
 * array of its own: a tail call may only go to programs of the same struct_ops member. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, SYR_SCX_MAX_APPS);
} syr_scx_sel SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct syr_scx_conf);
	__uint(max_entries, 1);
} syr_scx_conf SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct syr_scx_exit_rec);
	__uint(max_entries, 1);
} syr_scx_exit SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct syr_scx_app);
	__uint(max_entries, SYR_SCX_MAX_APPS);
} syr_scx_apps SEC(".maps");

/* slot -> the application's syrup_threads (its registrations; policy.h's definition),
 * for syr_root_on_exit below. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, SYR_SCX_MAX_APPS);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_HASH);
		__type(key, __u32);
		__type(value, __u32);
		__uint(max_entries, 4096);
	});
} syr_scx_threads SEC(".maps");

/* How far an application's virtual time may lag the one last served: the credit an
 * application that was idle (or new) brings back, so it cannot take a core for long. */
#define SYR_SCX_VTIME_LAG 20000000ULL

/* An application's virtual time, not lagging the last served one by more than the above. */
static __always_inline __u64 syr_app_vtime(__u32 slot, __u64 floor)
{
	struct syr_scx_app *a = bpf_map_lookup_elem(&syr_scx_apps, &slot);

	if (!a)
		return ~0ULL;
	if (a->vtime + SYR_SCX_VTIME_LAG < floor)
		a->vtime = floor - SYR_SCX_VTIME_LAG;
	return a->vtime;
}

enum scx_exit_kind { SYR_SCX_EXIT_ERROR = 1024 };

struct scx_exit_info {
	enum scx_exit_kind kind;
	int exit_cpu;
	long long exit_code;
	const char *reason;
	unsigned long *bt;
	__u32 bt_len;
	char *msg;
} __attribute__((preserve_access_index));

static __always_inline void syr_note_slot(__u32 slot)
{
	struct syr_scx_cpu *c = syr_scx_cpu_state(bpf_get_smp_processor_id());

	if (c)
		c->last_slot = slot;
}

static __always_inline void syr_kick_for(struct task_struct *p)
{
	int c = scx_bpf_pick_idle_cpu(p->cpus_ptr, 0);

	if (c >= 0)
		scx_bpf_kick_cpu(c, SYR_SCX_KICK_IDLE);
}

/* The wakeup's core: the application's select_cpu program (scx_wrapper.bpf.h) asks its
 * policy and, when the answer can be honoured at once (the core, or for SYR_PASS the
 * kernel's default pick, is idle, and no sibling is queued whose key would have to be
 * compared), inserts the thread straight into that core's local DSQ: no enqueue, no
 * dispatch round. Otherwise it returns the core the thread should be queued on. */
SEC("struct_ops/syr_root_select_cpu")
__s32 BPF_PROG(syr_root_select_cpu, struct task_struct *p, __s32 prev_cpu, __u64 wake_flags)
{
	__u32 slot = syr_scx_slot_of(p);

	if (slot < SYR_SCX_MAX_APPS) {
		syr_note_slot(slot);
		bpf_tail_call(ctx, &syr_scx_sel, slot);
	}
	return prev_cpu;
}

SEC("struct_ops/syr_root_enqueue")
void BPF_PROG(syr_root_enqueue, struct task_struct *p, __u64 enq_flags)
{
	__u32 slot = syr_scx_slot_of(p);

	if (slot < SYR_SCX_MAX_APPS) {
		syr_note_slot(slot);
		bpf_tail_call(ctx, &syr_scx_enq, slot);
	}
	/* No policy for this thread (or its program was just removed): FIFO. */
	scx_bpf_dsq_insert_vtime(p, SYR_SCX_FALLBACK_DSQ, SYR_SCX_SLICE_NS, bpf_ktime_get_ns(), enq_flags);
	syr_kick_for(p);
}

/* Charges the time `p` ran since it started running (or was last charged) to it and to
 * its application. Called at stopping() and at every dispatch with p as prev: a thread
 * that keeps its core when its slice ends is never stopped, yet must be charged. */
static __always_inline void syr_charge(struct task_struct *p)
{
	struct syr_scx_task *t = syr_scx_task_of(p);
	struct syr_scx_app *a;
	__u32 slot;
	__u64 now = bpf_ktime_get_ns(), ran;

	if (!t || !t->running_since || now < t->running_since)
		return;
	ran = now - t->running_since;
	t->running_since = now;
	t->run_ns += ran;
	slot = syr_scx_slot_of(p);
	a = slot < SYR_SCX_MAX_APPS ? bpf_map_lookup_elem(&syr_scx_apps, &slot) : 0;
	if (a)
		__sync_fetch_and_add(&a->vtime, ran);
}

struct syr_pick {
	__u64 active, floor, best_v;
	__u32 prev_slot;
	int best;
};

/* bpf_loop callback: the application with a runnable thread and the lowest vtime. */
static long syr_pick_app(__u32 s, struct syr_pick *k)
{
	__u64 v;

	if (s >= SYR_SCX_MAX_APPS || !(k->active & (1ULL << s)))
		return 0;
	if (s != k->prev_slot && !scx_bpf_dsq_peek(SYR_SCX_APP_DSQ(s)))
		return 0;
	v = syr_app_vtime(s, k->floor);
	if (v < k->best_v) {
		k->best_v = v;
		k->best = (int)s;
	}
	return 0;
}

SEC("struct_ops/syr_root_dispatch")
void BPF_PROG(syr_root_dispatch, __s32 cpu, struct task_struct *prev)
{
	__u32 z = 0;
	struct syr_scx_round *r = bpf_map_lookup_elem(&syr_scx_round, &z);
	struct syr_scx_conf *conf = bpf_map_lookup_elem(&syr_scx_conf, &z);
	struct syr_pick k = { .best_v = ~0ULL, .prev_slot = SYR_SCX_NO_SLOT, .best = -1 };

	if (!r || !conf)
		return;
	if (!r->resume) {
		r->tried = 0; /* a new round */
		if (prev)
			syr_charge(prev);
	}
	r->resume = 0;
	k.active = conf->active & ~r->tried;
	k.floor = conf->min_vtime;
	if (prev && (prev->scx.flags & SYR_SCX_TASK_QUEUED))
		k.prev_slot = syr_scx_slot_of(prev);
	if (k.active && !(k.active & (k.active - 1))) {
		/* One application left to ask (the common case: one scheduled process): its
		 * slot without the loop over all 64. */
		__u64 a = k.active;
		int s = 0;

		if (!(a & 0xffffffffULL)) { s += 32; a >>= 32; }
		if (!(a & 0xffffULL)) { s += 16; a >>= 16; }
		if (!(a & 0xffULL)) { s += 8; a >>= 8; }
		if (!(a & 0xfULL)) { s += 4; a >>= 4; }
		if (!(a & 0x3ULL)) { s += 2; a >>= 2; }
		if (!(a & 0x1ULL)) { s += 1; }
		syr_pick_app((__u32)s, &k);
	} else if (k.active) {
		bpf_loop(SYR_SCX_MAX_APPS, syr_pick_app, &k, 0);
	}
	/* Threads of no application (their policy was just removed) first: they are few
	 * and short-lived (syrupd switches them back to the fair class). */
	if (scx_bpf_dsq_move_to_local(SYR_SCX_FALLBACK_DSQ))
		return;
	if (k.best >= 0 && k.best < SYR_SCX_MAX_APPS) {
		if (k.best_v > conf->min_vtime)
			conf->min_vtime = k.best_v;
		r->tried |= 1ULL << k.best;
		syr_note_slot((__u32)k.best);
		bpf_tail_call(ctx, &syr_scx_disp, (__u32)k.best);
	}
	/* Nothing (else) to do: prev, if still runnable, keeps the core. */
}

SEC("struct_ops/syr_root_runnable")
void BPF_PROG(syr_root_runnable, struct task_struct *p, __u64 enq_flags)
{
	struct syr_scx_task *t = bpf_task_storage_get(&syr_scx_tasks, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);

	if (!t)
		return;
	if (!t->runnable_ns)
		t->core = SYR_PASS; /* a new entry (zeroed by the kernel) */
	t->runnable_ns = bpf_ktime_get_ns();
	t->run_ns = 0;
}

SEC("struct_ops/syr_root_running")
void BPF_PROG(syr_root_running, struct task_struct *p)
{
	struct syr_scx_task *t = syr_scx_task_of(p);
	struct syr_scx_cpu *c = syr_scx_cpu_state(bpf_get_smp_processor_id());

	if (t)
		t->running_since = t->oncore_since = bpf_ktime_get_ns();
	if (c) {
		c->tid = p->pid;
		c->slot = syr_scx_slot_of(p);
		c->key = t ? t->key : 0;
	}
}

SEC("struct_ops/syr_root_stopping")
void BPF_PROG(syr_root_stopping, struct task_struct *p, _Bool runnable)
{
	__u32 tid = p->pid;
	struct syr_scx_cpu *c = syr_scx_cpu_state(bpf_get_smp_processor_id());

	syr_charge(p);
	if (c && c->tid == tid)
		c->tid = 0;
}

SEC("struct_ops/syr_root_disable")
void BPF_PROG(syr_root_disable, struct task_struct *p)
{
	bpf_task_storage_delete(&syr_scx_tasks, p);
}

/* A scheduled process's thread that exits leaves its application's syrup_threads here,
 * while its tid is still its own: syrupd's scan comes later, and by then a new thread
 * (of this process or another: pid_max is 32768 on small machines) may have been given
 * the same tid -- and would inherit the registration and be switched to SCHED_EXT. A
 * tracepoint beside the struct_ops, attached and pinned with it (exit_link). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(syr_root_on_exit, struct task_struct *p)
{
	__u32 slot = syr_scx_slot_of(p), tid = p->pid;
	void *threads;

	if (slot >= SYR_SCX_MAX_APPS)
		return 0;
	threads = bpf_map_lookup_elem(&syr_scx_threads, &slot);
	if (threads)
		bpf_map_delete_elem(threads, &tid);
	return 0;
}

static long syr_make_dsq(__u32 i, void *unused)
{
	scx_bpf_create_dsq(SYR_SCX_APP_DSQ(i), -1);
	return 0;
}

SEC("struct_ops.s/syr_root_init")
__s32 BPF_PROG(syr_root_init)
{
	bpf_loop(SYR_SCX_MAX_APPS, syr_make_dsq, (void *)0, 0);
	return scx_bpf_create_dsq(SYR_SCX_FALLBACK_DSQ, -1);
}

SEC("struct_ops/syr_root_exit")
void BPF_PROG(syr_root_exit, struct scx_exit_info *ei)
{
	__u32 z = 0, cpu, n;
	struct syr_scx_exit_rec *r = bpf_map_lookup_elem(&syr_scx_exit, &z);
	struct syr_scx_cpu *c;

	if (!r)
		return;
	r->kind = ei->kind;
	r->exit_cpu = ei->exit_cpu;
	r->exit_code = ei->exit_code;
	r->blamed_slot = SYR_SCX_NO_SLOT;
	cpu = (__u32)ei->exit_cpu;
	c = cpu < SYR_SCX_MAX_CPUS ? bpf_map_lookup_elem(&syr_scx_cpus, &cpu) : 0;
	if (c)
		r->blamed_slot = c->last_slot;
	bpf_probe_read_kernel_str(r->reason, sizeof(r->reason), ei->reason);
	bpf_probe_read_kernel_str(r->msg, sizeof(r->msg), ei->msg);
	n = ei->bt_len;
	if (n > SYR_SCX_EXIT_BT)
		n = SYR_SCX_EXIT_BT;
	r->bt_len = bpf_probe_read_kernel(r->bt, n * sizeof(__u64), ei->bt) ? 0 : n;
	__sync_fetch_and_add(&r->seq, 1);
}

struct sched_ext_ops {
	__s32 (*select_cpu)(struct task_struct *p, __s32 prev_cpu, __u64 wake_flags);
	void (*enqueue)(struct task_struct *p, __u64 enq_flags);
	void (*dispatch)(__s32 cpu, struct task_struct *prev);
	void (*runnable)(struct task_struct *p, __u64 enq_flags);
	void (*running)(struct task_struct *p);
	void (*stopping)(struct task_struct *p, _Bool runnable);
	void (*disable)(struct task_struct *p);
	__s32 (*init)(void);
	void (*exit)(struct scx_exit_info *ei);
	__u64 flags;
	__u32 timeout_ms;
	char name[128];
};

/* timeout_ms is set by syrupd before load (--scx_timeout_ms). */
SEC(".struct_ops.link")
struct sched_ext_ops syr_root_ops = {
	.select_cpu = (void *)syr_root_select_cpu,
	.enqueue = (void *)syr_root_enqueue,
	.dispatch = (void *)syr_root_dispatch,
	.runnable = (void *)syr_root_runnable,
	.running = (void *)syr_root_running,
	.stopping = (void *)syr_root_stopping,
	.disable = (void *)syr_root_disable,
	.init = (void *)syr_root_init,
	.exit = (void *)syr_root_exit,
	.flags = SYR_SCX_OPS_SWITCH_PARTIAL,
	.timeout_ms = 30000,
	.name = "syrup",
};

char _license[] SEC("license") = "GPL";
