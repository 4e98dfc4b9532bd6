/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The thread hook wrapper for the sched_ext backend: included by syrupd after the policy
 * source, it turns the policy's syr_schedule() into the three programs syrupd's root
 * scheduler (thread/scx_root.bpf.c) tail-calls for this application's threads:
 *
 *  - syr_app_select(p, prev_cpu): the wakeup's core, and its direct path (below);
 *  - syr_app_enqueue(p): asks the policy for p's core and key, queues p in the
 *    application's DSQ (by enqueue time), kicks the chosen core if idle (SYR_PASS: any
 *    idle core p may use), or preempts a thread of the same application running with a
 *    worse key;
 *  - syr_app_dispatch(cpu, prev): asks the policy again about prev (if it is still
 *    runnable and ours) and every queued thread of the application (the oldest
 *    SYR_SCX_MAX_SCAN), with the hints as they are NOW, and runs on `cpu` the lowest key
 *    among those bound to `cpu` or to no core (ties: prev, then the lower tid). A thread
 *    that waited longer than syr_scx_starve_ns goes first regardless of its key (the
 *    kernel's watchdog would otherwise eject the whole scheduler, every application's
 *    policy with it). Threads bound to other cores get those cores kicked. If nothing
 *    here is for `cpu`, it hands the round back to the root, which tries the next
 *    application.
 *
 * Program association: the three programs are referenced by two (never attached)
 * struct_ops maps, so the kernel cannot associate them with one struct_ops instance and
 * their scx kfunc calls resolve to the root scheduler, the one that tail-calls them
 * (kernel/sched/ext: scx_prog_sched() falls back to scx_root for unassociated programs).
 *
 * syrupd sets syr_scx_slot (its slot), syr_scx_starve_ns, and reuses the root's
 * syr_scx_* maps before load. syr_stats counts every policy answer, re-decisions at
 * dispatch included; while a recording runs (recording.bpf.h) every answer is recorded
 * too, with the thread as the policy was handed it.
 */
#ifndef SYRUP_HOOK_THREAD_SCX_H
#define SYRUP_HOOK_THREAD_SCX_H

#include "hook_stats.bpf.h"
#include "recording.bpf.h"
#include "thread/scx_common.h"

const volatile __u32 syr_scx_slot = 0;
const volatile __u64 syr_scx_starve_ns = 1000000000ULL;
const volatile __u32 syr_scx_direct_on = 1; /* the direct path of wakeups (below); SYRUP_SCX_DIRECT=0 */

static __always_inline __u32 syr_scx_nr_cpus(void)
{
	__u32 n = scx_bpf_nr_cpu_ids();

	return n > SYR_SCX_MAX_CPUS ? SYR_SCX_MAX_CPUS : n;
}

/* Recording: the thread as the policy is handed it, kept per core in a map while a
 * recording runs (not on the stack: dispatch's stack is the scarce one, and a decision
 * pays nothing for it while no recording runs), for syr_scx_rec_decided. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct syr_thread);
	__uint(max_entries, 1);
} syr_scx_rec_in SEC(".maps");

/* A copy of `t` if a recording runs, else NULL: the one lookup and branch a decision
 * pays for recordings while none runs. */
static __always_inline struct syr_thread *syr_scx_rec_before(const struct syr_thread *t)
{
	struct syr_thread *in;

	if (!syr_rec_active())
		return (void *)0;
	in = bpf_map_lookup_elem(&syr_scx_rec_in, (const void *)&syr_rec_key);
	if (in)
		*in = *t;
	return in;
}

/* Records the policy's answer `asked` for `before`, as it left the thread (`after`), and
 * what the wrapper made of it (`core`: SYR_PASS for a fallback), counted as syr_stats
 * counts it. */
static __always_inline void syr_scx_rec_decided(const struct syr_thread *before, const struct syr_thread *after,
						 __u32 asked, __u32 core)
{
	struct syr_rec_ctl *rc = syr_rec_active();
	__u32 slot = asked == SYR_PASS ? SYR_STAT_PASS
		     : core == SYR_PASS ? SYR_STAT_FALLBACK
					: SYR_STAT_EXECUTOR_BASE + core;

	if (rc)
		syr_rec_thread(rc, before, after, asked, slot);
}

/* The policy's answer for p now: a core < nr_cpus or SYR_PASS; key and slice out. */
static __always_inline __u32 syr_scx_decide(struct task_struct *p, __u32 reason, __u64 now, _Bool running,
					    __u64 *key, __u64 *slice)
{
	__u32 tid = p->pid;
	struct syr_scx_task *tt = syr_scx_task_of(p);
	__u32 *exec = bpf_map_lookup_elem(&syrup_threads, &tid);
	struct syr_thread t = {}, *rec_before;
	__u32 core, asked;

	t.tid = tid;
	t.tgid = p->tgid;
	t.executor = exec ? *exec : SYR_NO_EXECUTOR;
	t.prev_cpu = scx_bpf_task_cpu(p);
	t.nr_cpus = syr_scx_nr_cpus();
	t.reason = reason;
	t.now_ns = now;
	t.runnable_ns = now;
	if (tt) {
		t.runnable_ns = tt->runnable_ns;
		t.run_ns = tt->run_ns;
		if (running && tt->running_since && now > tt->running_since)
			t.run_ns += now - tt->running_since;
		if (running && tt->oncore_since && now > tt->oncore_since)
			t.oncore_ns = now - tt->oncore_since;
	}
	t.key = t.runnable_ns;
	t.slice_ns = SYR_SCX_SLICE_NS;
	rec_before = syr_scx_rec_before(&t);
	core = asked = syr_schedule(SYR_POLICY_ARG(&t));
	if (core == SYR_PASS) {
		syr_count(SYR_STAT_PASS);
	} else if (core >= t.nr_cpus || !bpf_cpumask_test_cpu(core, p->cpus_ptr)) {
		/* Past the cores, or one the thread may not run on: it would wait forever. */
		syr_count(SYR_STAT_FALLBACK);
		core = SYR_PASS;
	} else {
		syr_count(SYR_STAT_EXECUTOR_BASE + core);
	}
	if (rec_before)
		syr_scx_rec_decided(rec_before, &t, asked, core);
	if (t.slice_ns == 0 || t.slice_ns > SYR_SCX_MAX_SLICE_NS)
		t.slice_ns = SYR_SCX_SLICE_NS;
	if (tt) {
		tt->key = t.key;
		tt->core = core;
	}
	if (running) {
		/* A running thread's key is also its core's, for preemption (running_key). */
		struct syr_scx_cpu *c = syr_scx_cpu_state(t.prev_cpu);

		if (c && c->tid == tid)
			c->key = t.key;
	}
	*key = t.key;
	*slice = t.slice_ns;
	return core;
}

/* The key of the thread of this application running on `cpu`, or 0 if none is. */
static __always_inline __u64 syr_scx_running_key(__u32 cpu)
{
	struct syr_scx_cpu *c = syr_scx_cpu_state(cpu);

	if (!c || !c->tid || c->slot != syr_scx_slot)
		return 0;
	return c->key;
}

struct syr_victim {
	const struct cpumask *mask;
	__u64 worst;
	__u32 n;
	int cpu;
};

/* Whether a thread of this application runs on `cpu`. */
static __always_inline int syr_scx_ours_on(__u32 cpu)
{
	struct syr_scx_cpu *c = syr_scx_cpu_state(cpu);

	return c && c->tid && c->slot == syr_scx_slot;
}

/* bpf_loop callback: of the cores p may use that run a thread of this application, the
 * one whose thread had the worst key at its policy's last answer. That key is stale --
 * a running thread's run time grows, its hints change -- so it only picks which core to
 * ask again, not whether: the kick makes that core's dispatch ask the policy about its
 * running thread and the queued ones with today's numbers, and the running thread keeps
 * the core if its key is still the lowest (no context switch). */
static long syr_find_victim(__u32 c, struct syr_victim *v)
{
	__u64 k;

	if (c >= v->n)
		return 1;
	if (!syr_scx_ours_on(c) || !bpf_cpumask_test_cpu(c, v->mask))
		return 0;
	k = syr_scx_running_key(c);
	if (v->cpu < 0 || k > v->worst) {
		v->worst = k;
		v->cpu = (int)c;
	}
	return 0;
}

static long syr_kick_one(__u32 c, __u64 *mask)
{
	if (!*mask)
		return 1;
	if (*mask & (1ULL << (c & 63))) {
		scx_bpf_kick_cpu((int)c, SYR_SCX_KICK_IDLE);
		*mask &= ~(1ULL << (c & 63));
	}
	return 0;
}

/* Runs `p` soon on `core`, where it was just queued: if a thread of this application
 * runs there, its dispatch asks the policy again about both (syr_find_victim says why the
 * running thread's last key cannot decide it here), else the core is woken if idle. */
static __always_inline void syr_scx_kick_for(__u32 core)
{
	if (syr_scx_ours_on(core))
		scx_bpf_kick_cpu(core, SYR_SCX_KICK_PREEMPT);
	else
		scx_bpf_kick_cpu(core, SYR_SCX_KICK_IDLE);
}

/* The direct path of a wakeup on a busy core. select_cpu (syr_app_select below) already
 * sent the thread to an idle core if it could; here it was queued on a core that is
 * busy -- the waker's, which is about to sleep (a synchronous wakeup), or the only one it
 * may use. With no sibling of the application queued there is nothing for the ordering
 * key to decide, so the policy's answer is final: the thread goes straight into that
 * core's local DSQ and runs as soon as the core is free, without a dispatch round (the
 * root's pick of an application, the DSQ walk, a second policy call) -- which is what a
 * wakeup costs in the fair class, against about 1.6x that without it
 * (bench/thread/README.md, ping-pong on one core). Not when the policy wants another
 * core, nor when a thread already waits in that local DSQ (queued behind it, the thread
 * would skip the root's fairness between applications). Wakeups only: a re-queued
 * thread may be inside a migrate-disabled section. Returns 1 if `p` was inserted. */
static __always_inline int syr_scx_direct(struct task_struct *p, __u32 core, __u64 key, __u64 slice,
					  __u64 enq_flags)
{
	__s32 c = scx_bpf_task_cpu(p);

	if (!(enq_flags & SYR_SCX_ENQ_WAKEUP) || c < 0 || c >= SYR_SCX_MAX_CPUS ||
	    (core != SYR_PASS && core != (__u32)c) || !bpf_cpumask_test_cpu((__u32)c, p->cpus_ptr))
		return 0;
	if (scx_bpf_dsq_nr_queued(SYR_SCX_APP_DSQ(syr_scx_slot)) > 0 ||
	    scx_bpf_dsq_nr_queued(SYR_SCX_DSQ_LOCAL_ON | (__u32)c) > 0)
		return 0;
	/* A sibling running there may be ahead of p by today's numbers (inside a critical
	 * section, say), which only a dispatch round asks the policy: a thread in the local
	 * DSQ runs before dispatch is called. Unless that sibling is the waker, here on this
	 * core, handing it over (it is about to sleep: a pipe, a request passed on). */
	if (syr_scx_ours_on((__u32)c) && !(c == (__s32)bpf_get_smp_processor_id() &&
					   (__u32)(bpf_get_current_pid_tgid() >> 32) == (__u32)p->tgid))
		return 0;
	scx_bpf_dsq_insert(p, SYR_SCX_DSQ_LOCAL, slice, enq_flags);
	/* No idle kick of the core we run on: it reschedules anyway, and a kick of one's own
	 * core (its rq locked here) is deferred to an irq_work, a self-interrupt per wakeup. */
	if (syr_scx_running_key((__u32)c) > key)
		scx_bpf_kick_cpu(c, SYR_SCX_KICK_PREEMPT);
	else if (c != (__s32)bpf_get_smp_processor_id())
		scx_bpf_kick_cpu(c, SYR_SCX_KICK_IDLE);
	return 1;
}

SEC("struct_ops/syr_app_enqueue")
void BPF_PROG(syr_app_enqueue, struct task_struct *p, __u64 enq_flags)
{
	__u64 now = bpf_ktime_get_ns(), key, slice;
	__u32 reason = (enq_flags & SYR_SCX_ENQ_WAKEUP) ? SYR_THREAD_WAKEUP : SYR_THREAD_PREEMPTED;
	__u32 core = syr_scx_decide(p, reason, now, 0, &key, &slice);
	struct syr_victim v = {};
	int idle;

	if (syr_scx_direct_on && syr_scx_direct(p, core, key, slice, enq_flags))
		return;
	scx_bpf_dsq_insert_vtime(p, SYR_SCX_APP_DSQ(syr_scx_slot), slice, now, enq_flags);
	if (core != SYR_PASS) {
		syr_scx_kick_for(core);
		return;
	}
	idle = scx_bpf_pick_idle_cpu(p->cpus_ptr, 0);
	if (idle >= 0) {
		scx_bpf_kick_cpu(idle, SYR_SCX_KICK_IDLE);
		return;
	}
	/* No idle core: have a core running a thread of this application decide again. */
	v.mask = p->cpus_ptr;
	v.n = syr_scx_nr_cpus();
	v.cpu = -1;
	bpf_loop(SYR_SCX_MAX_CPUS, syr_find_victim, &v, 0);
	if (v.cpu >= 0)
		scx_bpf_kick_cpu(v.cpu, SYR_SCX_KICK_PREEMPT);
}

/* The wakeup's core (the root's select_cpu tail-calls it): the policy's answer for the
 * waking thread, honoured at once when it can be -- the chosen core (or, for SYR_PASS,
 * a synchronous waker's core, else the kernel's default pick) is idle and no sibling of the application is queued (with one queued, the keys decide who
 * runs first: that is enqueue's and dispatch's job). The thread then goes straight into
 * that core's local DSQ. Otherwise the thread is queued on that core (enqueue, and its
 * direct path above); prev_cpu when a sibling is queued or the direct path is off. */
SEC("struct_ops/syr_app_select")
__s32 BPF_PROG(syr_app_select, struct task_struct *p, __s32 prev_cpu, __u64 wake_flags)
{
	__u64 now = bpf_ktime_get_ns(), key, slice;
	__u32 core;
	_Bool idle = 0;
	__s32 cpu;

	struct syr_scx_task *tt;

	if (!syr_scx_direct_on || scx_bpf_dsq_peek(SYR_SCX_APP_DSQ(syr_scx_slot)))
		return prev_cpu;
	/* The policy sees this wakeup's times (runnable() sets the same moments later). */
	tt = syr_scx_task_of(p);
	if (tt) {
		tt->runnable_ns = now;
		tt->run_ns = 0;
	}
	core = syr_scx_decide(p, SYR_THREAD_WAKEUP, now, 0, &key, &slice);
	if (core == SYR_PASS) {
		/* A thread of the application waking a sibling synchronously (it sleeps next:
		 * a pipe, a request handed to a worker) hands it its core, as long as nothing
		 * waits there: the sibling runs the moment the waker sleeps, on a warm cache,
		 * with no idle core to wake (the kernel's default pick would prefer the
		 * wakee's previous core whenever it is idle; bench/thread/README.md). */
		cpu = (__s32)bpf_get_smp_processor_id();
		if ((wake_flags & SYR_SCX_WAKE_SYNC) && (__u32)(bpf_get_current_pid_tgid() >> 32) == (__u32)p->tgid &&
		    cpu < SYR_SCX_MAX_CPUS && bpf_cpumask_test_cpu((__u32)cpu, p->cpus_ptr) &&
		    scx_bpf_dsq_nr_queued(SYR_SCX_DSQ_LOCAL_ON | (__u32)cpu) == 0)
			return cpu;
		cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &idle);
	} else {
		cpu = (__s32)core;
		idle = scx_bpf_test_and_clear_cpu_idle(cpu);
	}
	if (!idle)
		return cpu;
	scx_bpf_dsq_insert(p, SYR_SCX_DSQ_LOCAL, slice, 0);
	return cpu;
}

/* One dispatch's running choice. Kept in a map value, not on the stack: the verifier
 * then sees the same state at every turn of the DSQ loop and verifies it once. */
struct syr_scx_pick {
	__u64 best_key, best_slice, starve_t, starve_slice, kick;
	__u32 best_tid, starve_tid, scanned, best_prev;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct syr_scx_pick);
	__uint(max_entries, 1);
} syr_scx_pick SEC(".maps");

SEC("struct_ops/syr_app_dispatch")
void BPF_PROG(syr_app_dispatch, __s32 cpu, struct task_struct *prev)
{
	__u64 now = bpf_ktime_get_ns(), dsq = SYR_SCX_APP_DSQ(syr_scx_slot), key, slice, kick;
	__u32 z = 0, core;
	struct syr_scx_pick *k = bpf_map_lookup_elem(&syr_scx_pick, &z);
	struct syr_scx_round *r;
	struct task_struct *p;
	_Bool moved = 0;

	if (!k)
		return;
	k->best_key = ~0ULL;
	k->best_slice = SYR_SCX_SLICE_NS;
	k->starve_t = ~0ULL;
	k->starve_slice = SYR_SCX_SLICE_NS;
	k->kick = 0;
	k->best_tid = 0;
	k->starve_tid = 0;
	k->scanned = 0;
	k->best_prev = 0;

	if (prev && (prev->scx.flags & SYR_SCX_TASK_QUEUED) && syr_scx_slot_of(prev) == syr_scx_slot) {
		core = syr_scx_decide(prev, SYR_THREAD_PREEMPTED, now, 1, &key, &slice);
		if (core == SYR_PASS || core == (__u32)cpu) {
			k->best_key = key;
			k->best_slice = slice;
			k->best_tid = prev->pid;
			k->best_prev = 1;
		} else if (core < SYR_SCX_MAX_CPUS) {
			k->kick |= 1ULL << core;
		}
	}

	bpf_for_each(scx_dsq, p, dsq, 0) {
		__u32 tid = p->pid;
		__u64 since = p->scx.dsq_vtime;

		if (++k->scanned > SYR_SCX_MAX_SCAN)
			break;
		core = syr_scx_decide(p, SYR_THREAD_TICK, now, 0, &key, &slice);
		if (core != SYR_PASS && core != (__u32)cpu) {
			if (core < SYR_SCX_MAX_CPUS)
				k->kick |= 1ULL << core;
			continue;
		}
		if (!bpf_cpumask_test_cpu((__u32)cpu, p->cpus_ptr))
			continue;
		if (syr_scx_starve_ns && now > since && now - since > syr_scx_starve_ns && since < k->starve_t) {
			k->starve_t = since;
			k->starve_tid = tid;
			k->starve_slice = slice;
		}
		if (key < k->best_key || (key == k->best_key && !k->best_prev && tid < k->best_tid)) {
			k->best_key = key;
			k->best_slice = slice;
			k->best_tid = tid;
			k->best_prev = 0;
		}
	}
	if (k->starve_tid) {
		k->best_tid = k->starve_tid;
		k->best_slice = k->starve_slice;
		k->best_prev = 0;
	}

	if (k->best_prev && prev) {
		scx_bpf_task_set_slice(prev, k->best_slice);
		moved = 1;
	} else if (k->best_tid) {
		bpf_for_each(scx_dsq, p, dsq, 0) {
			if ((__u32)p->pid != k->best_tid)
				continue;
			scx_bpf_dsq_move_set_slice(&___it, k->best_slice);
			moved = scx_bpf_dsq_move(&___it, p, SYR_SCX_DSQ_LOCAL, 0);
			break;
		}
	}
	kick = k->kick & ~(1ULL << ((__u32)cpu & 63));
	if (kick)
		bpf_loop(SYR_SCX_MAX_CPUS, syr_kick_one, &kick, 0);
	if (moved)
		return;
	/* Nothing of ours for this core: let the root try the next application. */
	r = bpf_map_lookup_elem(&syr_scx_round, &z);
	if (r)
		r->resume = 1;
	bpf_tail_call(ctx, &syr_scx_disp, SYR_SCX_RESUME);
	if (r)
		r->resume = 0;
}

struct sched_ext_ops {
	__s32 (*select_cpu)(struct task_struct *p, __s32 prev_cpu, __u64 wake_flags);
	void (*enqueue)(struct task_struct *p, __u64 enq_flags);
	void (*dispatch)(__s32 cpu, struct task_struct *prev);
	char name[128];
};

/* Never attached: they only carry the programs (two, so that the programs stay
 * unassociated; see above). */
SEC(".struct_ops.link")
struct sched_ext_ops syr_app_ops = {
	.select_cpu = (void *)syr_app_select,
	.enqueue = (void *)syr_app_enqueue,
	.dispatch = (void *)syr_app_dispatch,
	.name = "syrup_app",
};

SEC(".struct_ops.link")
struct sched_ext_ops syr_app_ops2 = {
	.select_cpu = (void *)syr_app_select,
	.enqueue = (void *)syr_app_enqueue,
	.dispatch = (void *)syr_app_dispatch,
	.name = "syrup_app2",
};

char _license[] SEC("license") = "GPL";

#endif
