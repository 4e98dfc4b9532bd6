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

/* syrupd names the hook's part of this header (kernel/hooks/<hook>/policy_input.h):
 * what a policy at that hook is handed and how its input is read. */
#ifndef SYR_HOOK_POLICY_INPUT
#error "a Syrup policy is compiled by syrupd for one hook (SYR_HOOK_POLICY_INPUT is not defined)"
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
	__u64 oncore_ns;   /* how long it has run since it last got a core; 0 if it is not
			    * running (a bound for how long a policy keeps a thread on its core) */
};

/* The matching function. Use as: SYR_POLICY(struct syr_input *in) { ... } at the
 * socket-select and XDP hooks, SYR_POLICY(struct syr_thread *t) { ... } at the thread
 * hook. A policy whose parameter is not what its hook passes fails to compile with a
 * static assertion that names the hook to deploy it at, before its body is compiled. */
/* The two kinds of matching function a hook's part (policy_input.h) picks from as its
 * SYR_POLICY_WANTS and SYR_POLICY_WRONG_HOOK. */
#define SYR_POLICY_WANTS_INPUT(fn)                                                   \
	(__builtin_types_compatible_p(fn, __u32(struct syr_input *)) ||                \
	 __builtin_types_compatible_p(fn, __u32(const struct syr_input *)))
#define SYR_POLICY_WRONG_HOOK_INPUT                                                  \
	"a packet hook's policy is SYR_POLICY(struct syr_input *in); one that takes "  \
	"struct syr_thread * schedules threads: deploy it with --hook thread"
#define SYR_POLICY_WANTS_THREAD(fn)                                                  \
	(__builtin_types_compatible_p(fn, __u32(struct syr_thread *)))
#define SYR_POLICY_WRONG_HOOK_THREAD                                                 \
	"the thread hook's policy is SYR_POLICY(struct syr_thread *t); one that takes " \
	"struct syr_input * schedules packets: deploy it with --hook socket-select or --hook xdp"
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

/* Bounds: whether [off, off+len) lies inside the input. */
static __always_inline int syr_input_has(const struct syr_input *in, __u32 off, __u32 len)
{
	return off <= in->len && len <= in->len - off;
}

/* The hook's part: SYR_POLICY_WANTS(fn) and SYR_POLICY_WRONG_HOOK (which matching
 * functions fit the hook, and the one error for those that do not), syr_hook_read()
 * (reads of bytes already checked against in->len), and, where the hook has them, its
 * own syr_ptr() and thread helpers (SYR_HOOK_THREAD_HELPERS). */
#include SYR_HOOK_POLICY_INPUT

#ifndef SYR_HOOK_THREAD_HELPERS
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
#endif /* !SYR_HOOK_THREAD_HELPERS */

/* Bounds-checked reads: 0 on success, -1 when [off, off+len) is outside the input. */
static __always_inline int syr_read(const struct syr_input *in, __u32 off, void *dst, __u32 len)
{
	if (!syr_input_has(in, off, len))
		return -1;
	return syr_hook_read(in, off, dst, len);
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

#ifndef syr_ptr
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
