/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Recording (`syrupctl record`, `syrupctl trace`): what a hook wrapper adds so that
 * syrupd can capture the inputs its policy sees and the decisions it makes. Included by
 * every wrapper after the policy and its hook's policy_input.h (syr_hook_read()).
 *
 * Design: syr_rec_ctl is one mmap'able array element that syrupd (syrupd/recorder.cpp)
 * switches on for the length of a recording; while it is off a decision pays one inlined
 * array lookup and a branch. While on, each decision (or one in sample_every) reserves a
 * fixed-size event in the policy's ring buffer syr_rec_ring and fills it; syrupd drains
 * the ring (every 5 ms, and when an event wakes it: syr_rec_submit()) and writes the events, trimmed to their payload, as records of the recording
 * format. A full ring loses the event, counted in `full`, never the decision.
 *
 * Invariants:
 *  - struct syr_rec_event is struct syr_rec_record of <syrup/recording.h> followed by
 *    SYR_REC_SNAP_MAX payload bytes (syrupd checks the offsets it relies on);
 *  - the capture never changes what the wrapper does with the input: it reads, it does
 *    not write the packet, and it runs after the decision was enforced;
 *  - the capture body is one subprogram per kind (not inlined at every exit of the
 *    wrapper), so the wrapper grows by a few instructions per exit.
 */
#ifndef SYRUP_HOOK_RECORDING_H
#define SYRUP_HOOK_RECORDING_H

#define SYR_REC_SNAP_MAX 256
#define SYR_REC_RING_BYTES (256 * 1024)
#define SYR_REC_INPUT 1
#define SYR_REC_THREAD 2
#define SYR_REC_OUTCOME_ENFORCED 3

struct syr_rec_ctl {
	__u32 on;           /* syrupd: 1 while a recording runs */
	__u32 sample_every; /* syrupd: 0 or 1 every input, N one in N on average */
	__u32 snap;         /* syrupd: payload bytes per input, at most SYR_REC_SNAP_MAX */
	__u32 pad;
	__u64 not_sampled;  /* the wrapper's: skipped by sample_every */
	__u64 full;         /* the wrapper's: the ring was full */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct syr_rec_ctl);
	__uint(max_entries, 1);
} syr_rec_ctl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SYR_REC_RING_BYTES);
} syr_rec_ring SEC(".maps");

struct syr_rec_event {
	__u32 size;
	__u16 type;
	__u16 flags;
	__u64 ts_ns;
	__u32 decision;
	__u32 outcome;
	__u32 n_executors;
	__u32 len;
	__u32 cap_len;
	__u32 cpu;
	union {
		struct {
			__u32 hash;
			__u32 ip_protocol;
			__u32 l4_off;
			__u32 family;
			__u16 local_port;
			__u16 remote_port;
			__u32 reserved;
			__u32 local_ip[4];
			__u32 remote_ip[4];
		} packet;
		struct {
			/* struct syr_rec_thread of recording.h: the fields of struct syr_thread
			 * that version 1 of the format records (oncore_ns came later). */
			__u32 tid, tgid, executor, prev_cpu, nr_cpus, reason;
			__u64 now_ns, runnable_ns, run_ns, key, slice_ns;
			__u64 key_out;
			__u64 slice_out;
		} thread;
	};
	__u8 payload[SYR_REC_SNAP_MAX];
};

_Static_assert(sizeof(struct syr_rec_event) == 120 + SYR_REC_SNAP_MAX, "struct syr_rec_record changed");

/* The lookup's key, read-only data: a key on the stack would cost a store that the
 * verifier fences (Spectre v4) in every decision of a policy verified as unprivileged. */
const volatile __u32 syr_rec_key = 0;

/* The control element while a recording runs, else NULL. */
static __always_inline struct syr_rec_ctl *syr_rec_active(void)
{
	struct syr_rec_ctl *c = bpf_map_lookup_elem(&syr_rec_ctl, (const void *)&syr_rec_key);

	return c && c->on ? c : (void *)0;
}

/* An event of `type` with its common fields set, or NULL (sampled out, ring full). */
static __always_inline struct syr_rec_event *syr_rec_begin(struct syr_rec_ctl *c, __u16 type, __u32 decision,
							   __u32 slot)
{
	struct syr_rec_event *e;

	if (c->sample_every > 1 && bpf_get_prandom_u32() % c->sample_every) {
		__sync_fetch_and_add(&c->not_sampled, 1);
		return (void *)0;
	}
	e = bpf_ringbuf_reserve(&syr_rec_ring, sizeof(*e), 0);
	if (!e) {
		__sync_fetch_and_add(&c->full, 1);
		return (void *)0;
	}
	e->size = sizeof(*e);
	e->type = type;
	e->flags = 0;
	e->ts_ns = bpf_ktime_get_ns();
	e->decision = decision;
	e->outcome = slot < SYR_REC_OUTCOME_ENFORCED ? slot : SYR_REC_OUTCOME_ENFORCED;
	e->n_executors = syr_num_executors;
	e->len = 0;
	e->cap_len = 0;
	e->cpu = bpf_get_smp_processor_id();
	return e;
}

/* Wakes syrupd (its epoll sees the ring readable) only with the event that carries the
 * ring's producer position past a multiple of a quarter of the ring: the ring cannot
 * fill between two drains without three such wakeups. A wakeup per event (an irq_work
 * and a context switch) would cost more than the event, and syrupd's 5 ms drain alone
 * lets a burst fill the ring. The producer position, not the fill: the fill reads the
 * consumer position, a cache line syrupd writes while it drains (+67 ns a decision
 * measured while recording). */
#define SYR_REC_WAKE_STEP (SYR_REC_RING_BYTES / 4)
static __always_inline void syr_rec_submit(struct syr_rec_event *e)
{
	__u64 pos = bpf_ringbuf_query(&syr_rec_ring, BPF_RB_PROD_POS); /* past this event */
	__u64 used = sizeof(*e) + BPF_RINGBUF_HDR_SZ;                   /* its footprint (8-aligned) */

	bpf_ringbuf_submit(e, pos / SYR_REC_WAKE_STEP != (pos - used) / SYR_REC_WAKE_STEP ? BPF_RB_FORCE_WAKEUP
											 : BPF_RB_NO_WAKEUP);
}

/* The hook's own context fields of a packet input (socket-lookup's addresses), set by
 * its wrapper before including this header. */
#ifndef SYR_REC_INPUT_FROM_CTX
#define SYR_REC_INPUT_FROM_CTX(in, ctx) 0 /* a hook without packet inputs */
#endif
#ifndef SYR_REC_HOOK_CONTEXT
#define SYR_REC_HOOK_CONTEXT(e, in) ((void)0)
#endif

/* The packet input again, from the hook's context (SYR_REC_INPUT_FROM_CTX, set by the
 * wrapper); false if it cannot be had. */
static __noinline void syr_rec_input_event(struct syr_rec_ctl *c, void *ctx, __u32 decision, __u32 slot)
{
	struct syr_input input = {}, *in = &input;
	struct syr_rec_event *e;
	__u32 n;

	if (!SYR_REC_INPUT_FROM_CTX(in, ctx))
		return;
	e = syr_rec_begin(c, SYR_REC_INPUT, decision, slot);
	if (!e)
		return;
	__builtin_memset(&e->packet, 0, sizeof(e->thread));
	e->packet.hash = in->hash;
	e->packet.ip_protocol = in->ip_protocol;
	e->packet.l4_off = in->l4_off;
	SYR_REC_HOOK_CONTEXT(e, in);
	e->len = in->len;
	n = in->len < c->snap ? in->len : c->snap;
	if (n > SYR_REC_SNAP_MAX)
		n = SYR_REC_SNAP_MAX;
	if (n > 0 && syr_hook_read(in, 0, e->payload, n) == 0)
		e->cap_len = n;
	syr_rec_submit(e);
}

/* After a packet hook counted its decision in `slot`: records it if a recording runs.
 * Only the context goes to the capture, which builds the input again: passing the
 * wrapper's struct syr_input (or keeping its fields for a copy) would make the compiler
 * keep it on the stack in every decision, and each pointer stored there costs a barrier
 * the verifier adds for unprivileged code (Spectre v4): +17 to +33 ns while off. */
#define syr_rec_input(ctx, decision, slot)                                           \
	do {                                                                           \
		struct syr_rec_ctl *__rc = syr_rec_active();                           \
		if (__rc)                                                              \
			syr_rec_input_event(__rc, ctx, decision, slot);                \
	} while (0)

/* A thread decision: `before` is the thread as the policy was handed it, `after` as it
 * left it. */
static __noinline void syr_rec_thread(struct syr_rec_ctl *c, const struct syr_thread *before,
				      const struct syr_thread *after, __u32 decision, __u32 slot)
{
	struct syr_rec_event *e = syr_rec_begin(c, SYR_REC_THREAD, decision, slot);

	if (!e)
		return;
	e->thread.tid = before->tid;
	e->thread.tgid = before->tgid;
	e->thread.executor = before->executor;
	e->thread.prev_cpu = before->prev_cpu;
	e->thread.nr_cpus = before->nr_cpus;
	e->thread.reason = before->reason;
	e->thread.now_ns = before->now_ns;
	e->thread.runnable_ns = before->runnable_ns;
	e->thread.run_ns = before->run_ns;
	e->thread.key = before->key;
	e->thread.slice_ns = before->slice_ns;
	e->thread.key_out = after->key;
	e->thread.slice_out = after->slice_ns;
	syr_rec_submit(e);
}

#endif /* SYRUP_HOOK_RECORDING_H */
