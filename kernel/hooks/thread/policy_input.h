/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The thread hook's part of <syrup/policy.h>, for both backends (sched_ext and the
 * user-space agent): a policy matches a runnable thread (struct syr_thread).
 */
#define SYR_POLICY_WANTS(fn) SYR_POLICY_WANTS_THREAD(fn)
#define SYR_POLICY_WRONG_HOOK SYR_POLICY_WRONG_HOOK_THREAD
#define SYR_HOOK_THREAD_HELPERS 1

/* A thread policy has no packet: syr_read() of a struct syr_input fails. */
static __always_inline int syr_hook_read(const struct syr_input *in, __u32 off, void *dst, __u32 len)
{
	(void)in, (void)off, (void)dst, (void)len;
	return -1;
}
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
