/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * What syrupd's sched_ext root scheduler (thread/scx_root.bpf.c) and each application's
 * thread policy program (scx_wrapper.bpf.h) share: kernel types, kfuncs, constants and
 * the maps the root creates and every application program reuses (syrupd passes their
 * fds with bpf_map__reuse_fd before load).
 *
 * No vmlinux.h: the few kernel types touched are declared here with CO-RE relocations
 * (libbpf matches struct_ops members and fields by name), so both compile with syrupd's
 * ordinary policy flags against any kernel with sched_ext (checked on Debian 7.3).
 *
 * Layout of the scheduler (see thread/scx_root.bpf.c for the full design):
 *  - one DSQ per application slot, SYR_SCX_APP_DSQ(slot), ordered by enqueue time;
 *  - syr_scx_procs: scheduled process (tgid) -> slot; written by syrupd;
 *  - syr_scx_cgroups: a policy's cgroup (id) -> slot and uid, for a policy deployed by
 *    cgroup; written by syrupd;
 *  - syr_scx_enq / syr_scx_disp: prog arrays, slot -> that application's enqueue and
 *    dispatch programs; syr_scx_disp[SYR_SCX_RESUME] is the root's own dispatch, which an
 *    application's dispatch tail-calls when it has nothing for this core.
 */
#ifndef SYRUP_THREAD_SCX_COMMON_H
#define SYRUP_THREAD_SCX_COMMON_H

#include <bpf/bpf_tracing.h>

#define SYR_SCX_MAX_APPS 64     /* slots: scheduled processes, at most */
#define SYR_SCX_MAX_CPUS 64
#define SYR_SCX_RESUME SYR_SCX_MAX_APPS
#define SYR_SCX_FALLBACK_DSQ 0x5000ULL
#define SYR_SCX_APP_DSQ(s) (0x5100ULL + (s))
#define SYR_SCX_SLICE_NS 3000000ULL
#define SYR_SCX_MAX_SLICE_NS 100000000ULL
#define SYR_SCX_MAX_SCAN 64 /* queued threads one dispatch re-decides, oldest first */
#define SYR_SCX_NO_SLOT 0xffffffffU
#define SYR_SCX_EXIT_BT 32 /* backtrace entries kept of an exit */

#define syr_barrier_var(v) asm volatile("" : "+r"(v))

/* Kernel constants (include/linux/sched/ext.h, kernel/sched/ext_internal.h). */
#define SYR_SCX_DSQ_LOCAL 0x8000000000000002ULL
#define SYR_SCX_DSQ_LOCAL_ON 0xc000000000000000ULL /* | cpu: that core's local DSQ */
#define SYR_SCX_ENQ_WAKEUP 1ULL
#define SYR_SCX_WAKE_SYNC 0x10ULL /* WF_SYNC: the waker is about to sleep */
#define SYR_SCX_KICK_IDLE 1ULL
#define SYR_SCX_KICK_PREEMPT 2ULL
#define SYR_SCX_TASK_QUEUED 1U
#define SYR_SCX_OPS_SWITCH_PARTIAL 8ULL

/* Complete (not a forward declaration): libbpf matches kfunc prototypes by kind. */
struct cpumask {
	unsigned long bits[1];
} __attribute__((preserve_access_index));

struct sched_ext_entity {
	__u32 flags;
	__u64 dsq_vtime;
} __attribute__((preserve_access_index));

/* A task's cgroup v2 (task_cgroup.bpf.h) and user, for policies deployed by cgroup
 * (syr_scx_slot_of). */
#include "thread/task_cgroup.bpf.h"

typedef struct {
	__u32 val;
} syr_kuid_t;

struct cred {
	syr_kuid_t euid;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	const struct cpumask *cpus_ptr;
	struct sched_ext_entity scx;
	struct css_set *cgroups;
	const struct cred *cred;
} __attribute__((preserve_access_index));

struct bpf_iter_scx_dsq {
	__u64 __opaque[6];
} __attribute__((aligned(8)));

extern void scx_bpf_dsq_insert(struct task_struct *p, __u64 dsq_id, __u64 slice, __u64 enq_flags) __weak __ksym;
extern __s32 scx_bpf_select_cpu_dfl(struct task_struct *p, __s32 prev_cpu, __u64 wake_flags,
				    _Bool *is_idle) __weak __ksym;
extern void scx_bpf_dsq_insert_vtime(struct task_struct *p, __u64 dsq_id, __u64 slice, __u64 vtime,
				     __u64 enq_flags) __weak __ksym;
extern _Bool scx_bpf_dsq_move_to_local(__u64 dsq_id) __weak __ksym;
extern __s32 scx_bpf_dsq_nr_queued(__u64 dsq_id) __weak __ksym;
extern int scx_bpf_create_dsq(__u64 dsq_id, int node) __weak __ksym;
extern int scx_bpf_task_cpu(const struct task_struct *p) __weak __ksym;
extern __u32 scx_bpf_nr_cpu_ids(void) __weak __ksym;
extern void scx_bpf_kick_cpu(int cpu, __u64 flags) __weak __ksym;
extern struct task_struct *scx_bpf_dsq_peek(__u64 dsq_id) __weak __ksym;
extern _Bool scx_bpf_task_set_slice(struct task_struct *p, __u64 slice) __weak __ksym;
extern int scx_bpf_pick_idle_cpu(const struct cpumask *cpus_allowed, __u64 flags) __weak __ksym;
extern int bpf_iter_scx_dsq_new(struct bpf_iter_scx_dsq *it, __u64 dsq_id, __u64 flags) __weak __ksym;
extern struct task_struct *bpf_iter_scx_dsq_next(struct bpf_iter_scx_dsq *it) __weak __ksym;
extern void bpf_iter_scx_dsq_destroy(struct bpf_iter_scx_dsq *it) __weak __ksym;
extern _Bool scx_bpf_dsq_move(struct bpf_iter_scx_dsq *it__iter, struct task_struct *p, __u64 dsq_id,
			      __u64 enq_flags) __weak __ksym;
extern void scx_bpf_dsq_move_set_slice(struct bpf_iter_scx_dsq *it__iter, __u64 slice) __weak __ksym;
extern _Bool scx_bpf_test_and_clear_cpu_idle(__s32 cpu) __weak __ksym;
extern _Bool bpf_cpumask_test_cpu(__u32 cpu, const struct cpumask *cpumask) __weak __ksym;

/* Per SCHED_EXT thread, kept by the root (runnable/running/stopping/disable). */
struct syr_scx_task {
	__u64 runnable_ns;   /* when it last woke up */
	__u64 running_since; /* when it last started running */
	__u64 run_ns;        /* run time since it last woke up */
	__u64 key;           /* the policy's last answer */
	__u32 core;          /* ditto: a core or SYR_PASS */
	__u32 pad;
	__u64 oncore_since;  /* when it last got a core (running()); charging leaves it */
};

/* What runs on each core now (the root's running/stopping), for preemption. */
struct syr_scx_cpu {
	__u32 tid;  /* 0: nothing of ours */
	__u32 slot; /* its application slot, or SYR_SCX_NO_SLOT */
	__u32 last_slot; /* the last application program run on this core (ejection blame) */
	__u32 pad;
	__u64 key;  /* the running thread's key (its policy's last answer), for preemption */
};

/* Per-core state of one dispatch round (root -> app -> root ...). */
struct syr_scx_round {
	__u32 resume; /* set by an application's dispatch that tail-calls the root back */
	__u32 pad;
	__u64 tried;  /* slots already asked in this round */
};

/* Root configuration, written by syrupd. */
struct syr_scx_conf {
	__u64 active;   /* bit per slot in use */
	__u64 min_vtime; /* virtual time of the application last given a core */
};

/* Per application slot: its virtual time, the run time its threads got (applications
 * share the cores equally: the root runs the one with the lowest). */
struct syr_scx_app {
	__u64 vtime;
};

/* Why the kernel ejected the scheduler (the root's exit()). */
struct syr_scx_exit_rec {
	__s32 kind;
	__s32 exit_cpu;
	__s64 exit_code;
	__u32 blamed_slot; /* last application program run on exit_cpu, or SYR_SCX_NO_SLOT */
	__u32 seq;         /* incremented by each exit() */
	char reason[128];
	char msg[256];
	/* The kernel's backtrace of the exit (scx_exit_info.bt), innermost first: for a
	 * runtime error raised inside an application's program it holds a return address in
	 * that program's JIT image, which names the culprit exactly (blamed_slot is read at
	 * exit() time, after other programs may have run on the core). */
	__u32 bt_len;
	__u32 pad;
	__u64 bt[SYR_SCX_EXIT_BT];
};

/* Task-local storage, not a hash by tid: every scheduling event of a thread reads or
 * writes its entry (runnable, running, stopping, each policy decision), and a task's own
 * storage is found from the task in one step, with no hashing and no bound on the number
 * of threads; the kernel frees it with the task. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct syr_scx_task);
} syr_scx_tasks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct syr_scx_cpu);
	__uint(max_entries, SYR_SCX_MAX_CPUS);
} syr_scx_cpus SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct syr_scx_round);
	__uint(max_entries, 1);
} syr_scx_round SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);   /* tgid */
	__type(value, __u32); /* slot */
	__uint(max_entries, SYR_SCX_MAX_APPS);
} syr_scx_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, SYR_SCX_MAX_APPS + 1);
} syr_scx_disp SEC(".maps");

/* A policy deployed by cgroup (written by syrupd): the cgroup's id -> its slot and the
 * uid whose threads in it the policy schedules (the owner's). */
struct syr_scx_cg {
	__u32 slot;
	__u32 uid;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64); /* cgroup v2 id (its directory's inode number) */
	__type(value, struct syr_scx_cg);
	__uint(max_entries, SYR_SCX_MAX_APPS);
} syr_scx_cgroups SEC(".maps");

/* p's application slot: its process's (syr_scx_procs), else its cgroup's if a policy was
 * deployed by that cgroup and p is its user's. Decided at every event, not remembered: a
 * process forked in the cgroup, or moved in, belongs to the policy from its first event,
 * one moved out leaves it (and waits in the fallback FIFO until syrupd restores it); a
 * SCHED_EXT thread of another user in the cgroup is never the policy's. */
static __always_inline __u32 syr_scx_slot_of(const struct task_struct *p)
{
	__u32 tgid = p->tgid;
	__u32 *s = bpf_map_lookup_elem(&syr_scx_procs, &tgid);
	struct syr_scx_cg *cg;
	__u64 cgid;

	if (s)
		return *s;
	/* Only threads of cgroup policies (and strays) get here: a process's own policy
	 * costs no more than before. */
	cgid = SYR_TASK_CGROUP_ID(p);
	cg = bpf_map_lookup_elem(&syr_scx_cgroups, &cgid);
	if (!cg || p->cred->euid.val != cg->uid)
		return SYR_SCX_NO_SLOT;
	return cg->slot;
}

/* p's entry in syr_scx_tasks, or 0 if it has none (created by the root's runnable()). */
static __always_inline struct syr_scx_task *syr_scx_task_of(struct task_struct *p)
{
	return bpf_task_storage_get(&syr_scx_tasks, p, 0, 0);
}

static __always_inline struct syr_scx_cpu *syr_scx_cpu_state(__s32 cpu)
{
	__u32 c = (__u32)cpu;

	return bpf_map_lookup_elem(&syr_scx_cpus, &c);
}

#endif
