/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The policy header: the only header a Syrup policy needs. See docs/policy-abi.md.
 *
 * A policy is one matching function from an input to an executor:
 *
 *     #include <syrup/policy.h>
 *
 *     static __u32 next;
 *
 *     SYR_POLICY(struct syr_input *in)
 *     {
 *         return __sync_fetch_and_add(&next, 1) % syr_num_executors;
 *     }
 *
 * It returns an executor index in [0, syr_num_executors), SYR_PASS (the kernel's own
 * choice) or SYR_DROP. syrupd compiles it together with the wrapper of the hook it is
 * deployed at (kernel/hooks/), which turns the index into the hook's action and keeps
 * statistics. Inputs are read through syr_read*() and syr_ptr(), which check bounds, so
 * a policy never needs its own packet bounds checks.
 *
 * Invariants the header keeps:
 *  - every helper is static inline: a policy compiles to exactly one BPF program;
 *  - deploy-time parameters are `const volatile` read-only data (SYR_PARAM), set by syrupd
 *    before load, so the verifier sees them as constants;
 *  - maps declared with SYR_ARRAY/SYR_HASH are shared by name between all policies of one
 *    application and with the application itself (libsyrup's syr_map_open()).
 */
#ifndef SYRUP_POLICY_H
#define SYRUP_POLICY_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <syrup/abi.h>

#if !defined(SYR_HOOK_SOCKET_SELECT) && !defined(SYR_HOOK_XDP) && !defined(SYR_HOOK_THREAD) && \
    !defined(SYR_HOOK_SOCKET_LOOKUP)
#error "a Syrup policy is compiled by syrupd for one hook (SYR_HOOK_* is not defined)"
#endif

/* What a packet-hook policy matches. Offset 0 is the first byte of the L4 header
 * (the UDP or TCP header), as in the Syrup design: for a UDP datagram, the payload
 * starts at offset 8. */
struct syr_input {
	void *data;     /* first byte of the L4 header (NULL at the XDP hook: use syr_read/syr_ptr) */
	void *data_end; /* end of the directly readable (linear) bytes (NULL at the XDP hook) */
	__u32 len;      /* bytes from data to the end of the packet, linear or not */
	__u32 hash;     /* the kernel's flow hash of the 5-tuple */
	__u32 ip_protocol; /* IPPROTO_UDP or IPPROTO_TCP */
	void *ctx;      /* the hook's context; used by syr_read() */
	__u32 l4_off;   /* XDP: offset of the L4 header in the frame (0 elsewhere) */
};

#if defined(SYR_HOOK_SOCKET_LOOKUP)
/* The socket-lookup hook's own accessors (local and remote address and port). */
#include <socket_lookup/policy_input.h>
#endif

/* What a thread-hook policy matches; the thread hook's section below says how. Every
 * hook knows the type, so a thread policy deployed at a packet hook fails with the one
 * error SYR_POLICY gives, not with one error per field it reads. */
#define SYR_NO_EXECUTOR 0xffffffffU

/* Why the policy is asked (t->reason). */
#define SYR_THREAD_WAKEUP 1    /* it woke up (or was just created: SYR_THREAD_NEW) */
#define SYR_THREAD_NEW 2
#define SYR_THREAD_PREEMPTED 3 /* it was running and is still runnable (slice end, preemption) */
#define SYR_THREAD_TICK 4      /* re-decision while it waits (agent: periodic; sched_ext: dispatch) */

struct syr_thread {
	__u32 tid;         /* the thread (kernel tid, as gettid() returns) */
	__u32 tgid;        /* its process */
	__u32 executor;    /* index it registered with syr_thread_register(), or SYR_NO_EXECUTOR */
	__u32 prev_cpu;    /* core it last ran on */
	__u32 nr_cpus;     /* cores the backend schedules on: valid return values are [0, nr_cpus) */
	__u32 reason;      /* SYR_THREAD_* */
	__u64 now_ns;      /* monotonic clock (bpf_ktime_get_ns) at this decision */
	__u64 runnable_ns; /* when it last became runnable (same clock) */
	__u64 run_ns;      /* how long it has run since it last became runnable */
	__u64 key;         /* in/out: ordering key, lower first; preset to runnable_ns (FIFO) */
	__u64 slice_ns;    /* in/out: time slice; preset to the backend's default. sched_ext: the
			    * dispatch slice; agent: the thread's EEVDF slice (a shorter slice
			    * than the running thread's lets a waking thread preempt it) */
};

/* The matching function. Use as: SYR_POLICY(struct syr_input *in) { ... } at the
 * socket-select and XDP hooks, SYR_POLICY(struct syr_thread *t) { ... } at the thread
 * hook. A policy whose parameter is not what its hook passes fails to compile with a
 * static assertion that names the hook to deploy it at, before its body is compiled. */
#if defined(SYR_HOOK_THREAD)
#define SYR_POLICY_WANTS(fn)                                                         \
	(__builtin_types_compatible_p(fn, __u32(struct syr_thread *)))
#define SYR_POLICY_WRONG_HOOK                                                        \
	"the thread hook's policy is SYR_POLICY(struct syr_thread *t); one that takes " \
	"struct syr_input * schedules packets: deploy it with --hook socket-select or --hook xdp"
#else
#define SYR_POLICY_WANTS(fn)                                                         \
	(__builtin_types_compatible_p(fn, __u32(struct syr_input *)) ||                \
	 __builtin_types_compatible_p(fn, __u32(const struct syr_input *)))
#define SYR_POLICY_WRONG_HOOK                                                        \
	"a packet hook's policy is SYR_POLICY(struct syr_input *in); one that takes "  \
	"struct syr_thread * schedules threads: deploy it with --hook thread"
#endif
#define SYR_POLICY(...)                                                              \
	typedef __u32 syr_policy_fn(__VA_ARGS__);                                      \
	enum { syr_policy_fits_the_hook = SYR_POLICY_WANTS(syr_policy_fn) };           \
	_Static_assert(syr_policy_fits_the_hook, SYR_POLICY_WRONG_HOOK);               \
	static __always_inline __u32 syr_schedule(__VA_ARGS__)
/* What a hook wrapper passes to syr_schedule(): its argument when the policy fits the
 * hook; otherwise a null pointer, so that the static assertion above is the only
 * diagnostic the user reads (not also a pointer-type warning from inside the wrapper). */
#define SYR_POLICY_ARG(p) __builtin_choose_expr(syr_policy_fits_the_hook, (p), (void *)0)

/* A deploy-time parameter: `SYR_PARAM(__u32, scan_type, 2);` declares a constant that
 * defaults to 2 and that `syrupctl deploy --params scan_type=3` (or syr_deploy_opts.params)
 * overrides. A value that does not fit the type is refused at deploy. */
#define SYR_PARAM(type, name, dflt) const volatile type name = (dflt)

/* Number of executors the policy was deployed with (always at least 1). */
const volatile __u32 syr_num_executors = 1;

/* Maps. Arrays are mmap'able so the application writes hints with a plain store. */
#define SYR_ARRAY(name, value_type, entries)                                         \
	struct {                                                                       \
		__uint(type, BPF_MAP_TYPE_ARRAY);                                      \
		__uint(map_flags, BPF_F_MMAPABLE);                                     \
		__type(key, __u32);                                                    \
		__type(value, value_type);                                             \
		__uint(max_entries, entries);                                          \
	} name SEC(".maps")

#define SYR_HASH(name, key_type, value_type, entries)                                \
	struct {                                                                       \
		__uint(type, BPF_MAP_TYPE_HASH);                                       \
		__type(key, key_type);                                                 \
		__type(value, value_type);                                             \
		__uint(max_entries, entries);                                          \
	} name SEC(".maps")

#define SYR_PERCPU_ARRAY(name, value_type, entries)                                  \
	struct {                                                                       \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                               \
		__type(key, __u32);                                                    \
		__type(value, value_type);                                             \
		__uint(max_entries, entries);                                          \
	} name SEC(".maps")

#if defined(SYR_HOOK_THREAD)
/*
 * ---- The thread hook -------------------------------------------------------------
 *
 * A thread policy matches one runnable thread of the application to a core and gives it
 * an ordering key:
 *
 *     SYR_POLICY(struct syr_thread *t)
 *     {
 *         t->key = prio[t->executor] ? 0 : t->runnable_ns;  // lower key runs first
 *         return SYR_PASS;                                   // any core
 *     }
 *
 * It is called when a thread of the application becomes runnable (wakeup, new thread,
 * preempted or its slice ended) and again while it waits, so a hint written since takes
 * effect without an event: in the user-space agent every re-decision period (5 ms); in
 * sched_ext at every scheduling decision on a core (each queued thread of the
 * application is asked again, with reason SYR_THREAD_TICK). It returns a core in
 * [0, t->nr_cpus) or SYR_PASS (no preference: the thread runs on whichever core frees up
 * first). Among the application's runnable threads bound for one core (or to none), the
 * one with the lowest key runs first; ties go to the thread already running, then to
 * the lower tid. A core past nr_cpus counts as a fallback and is treated as SYR_PASS.
 * Other applications and the rest of the system are never ordered by this key: the
 * agent keeps them in the kernel's normal scheduler, ahead of the application's waiting
 * threads; sched_ext (partial mode) leaves every other thread in the fair class, which
 * the kernel runs ahead of all sched_ext threads, and gives applications with a thread
 * policy equal shares of the cores among themselves. A thread kept waiting longer than
 * the starvation guard (syrupd's SYRUP_SCX_STARVE_MS, 1 s) runs next whatever its key,
 * so one application's policy cannot make the kernel eject the scheduler of all (the
 * agent's waiting threads are SCHED_IDLE: they too get a sliver).
 *
 * The same source compiles unchanged for both backends: sched_ext (syrupd's root
 * scheduler tail-calls the application's enqueue and dispatch programs, which call it)
 * and the user-space agent (syrupd's agent runs it with BPF_PROG_TEST_RUN). Only the
 * fields of struct syr_thread (above, beside struct syr_input) are the contract.
 */

/* Maps every thread policy of an application shares with libsyrup:
 *  - syrup_threads: tid -> executor index (syr_thread_register(), or syrupd for --pid);
 *  - syrup_cs: per executor index, the depth of the critical section it is in
 *    (syr_cs_enter()/syr_cs_exit() in libsyrup, a plain store into the mapped array). */
SYR_HASH(syrup_threads, __u32, __u32, 4096);
SYR_ARRAY(syrup_cs, __u64, SYR_MAX_EXECUTORS);

/* Whether `t` is inside a critical section marked with syr_cs_enter(). */
static __always_inline int syr_thread_in_cs(const struct syr_thread *t)
{
	__u32 e = t->executor;
	__u64 *d;

	if (e >= SYR_MAX_EXECUTORS)
		return 0;
	d = bpf_map_lookup_elem(&syrup_cs, &e);
	return d && *d > 0;
}

/* A __u64 hint of the thread's executor in a mapped SYR_ARRAY (0 if none). */
#define syr_thread_hint(map, t)                                                      \
	({                                                                             \
		__u32 __e = (t)->executor;                                             \
		__u64 *__h = __e == SYR_NO_EXECUTOR ? (void *)0 : bpf_map_lookup_elem(&(map), &__e); \
		__h ? *__h : 0;                                                        \
	})
#else
/* At a packet hook the thread helpers exist only so that a thread policy deployed here
 * by mistake fails with SYR_POLICY's one error; a packet policy that calls them gets an
 * error of its own. */
#define SYR_THREAD_ONLY(what)                                                        \
	({                                                                             \
		_Static_assert(!syr_policy_fits_the_hook,                              \
			       what " is for thread policies (--hook thread)");        \
		0;                                                                     \
	})
#define syr_thread_in_cs(t) SYR_THREAD_ONLY("syr_thread_in_cs()")
#define syr_thread_hint(map, t) SYR_THREAD_ONLY("syr_thread_hint()")
#endif /* SYR_HOOK_THREAD */

/* Bounds-checked reads: 0 on success, -1 when [off, off+len) is outside the input. */
static __always_inline int syr_read(const struct syr_input *in, __u32 off, void *dst, __u32 len)
{
	if (off > in->len || len > in->len - off)
		return -1;
#if defined(SYR_HOOK_SOCKET_SELECT)
	/* In sk_reuseport programs this helper reads relative to the L4 header and
	 * handles non-linear data. */
	return bpf_skb_load_bytes(in->ctx, off, dst, len) ? -1 : 0;
#elif defined(SYR_HOOK_XDP)
	return bpf_xdp_load_bytes(in->ctx, in->l4_off + off, dst, len) ? -1 : 0;
#else
	return -1;
#endif
}

#define SYR_DEFINE_READ(bits)                                                        \
	static __always_inline int syr_read_u##bits(const struct syr_input *in, __u32 off, \
						    __u##bits *v)                      \
	{                                                                              \
		return syr_read(in, off, v, sizeof(*v));                               \
	}
SYR_DEFINE_READ(8)
SYR_DEFINE_READ(16)
SYR_DEFINE_READ(32)
SYR_DEFINE_READ(64)
#undef SYR_DEFINE_READ

#if defined(SYR_HOOK_XDP)
/* At the XDP hook the L4 header lies at an offset the root program parsed, and tenant
 * policies are verified as unprivileged code, which may add only constants to a packet
 * pointer (the verifier's Spectre v1 masking has no bound for packet pointers). So
 * syr_ptr() copies the bytes into a per-CPU scratch area, at the same offset, and points
 * there: reads see the packet, writes change only the copy. */
#define SYR_XDP_SCRATCH_BYTES 512
struct syr_xdp_scratch {
	__u8 bytes[SYR_XDP_SCRATCH_BYTES];
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct syr_xdp_scratch);
} syr_xdp_scratch SEC(".maps");

static __always_inline void *syr_xdp_ptr(const struct syr_input *in, __u32 off, __u32 len)
{
	__u32 zero = 0;
	struct syr_xdp_scratch *s = bpf_map_lookup_elem(&syr_xdp_scratch, &zero);

	if (!s || len > SYR_XDP_SCRATCH_BYTES || off > SYR_XDP_SCRATCH_BYTES - len)
		return (void *)0;
	if (syr_read(in, off, s->bytes + off, len))
		return (void *)0;
	return s->bytes + off;
}

/* A pointer to `len` readable bytes at `off` (a copy, see above), or NULL. `len` must be
 * a constant; off + len at most SYR_XDP_SCRATCH_BYTES. */
#define syr_ptr(in, off, len) syr_xdp_ptr(in, off, len)
#else
/* A pointer to `len` directly readable bytes at `off`, or NULL. Cheaper than syr_read()
 * but only covers the linear part of the packet. `len` must be a constant. */
#define syr_ptr(in, off, len)                                                         \
	({                                                                             \
		void *__p = (in)->data + (off);                                        \
		(__p + (len) > (in)->data_end) ? (void *)0 : __p;                      \
	})
#endif

static __always_inline __u32 syr_random(void) { return bpf_get_prandom_u32(); }
static __always_inline __u32 syr_cpu(void) { return bpf_get_smp_processor_id(); }

/* Map access, named for what it does. */
#define syr_map_lookup(map, key) bpf_map_lookup_elem(map, key)
#define syr_map_update(map, key, value) bpf_map_update_elem(map, key, value, BPF_ANY)

#endif /* SYRUP_POLICY_H */
