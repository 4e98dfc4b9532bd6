/* get_first.c: threads handling short requests (GETs) run before threads on long ones
 * (SCANs). The application, or a network policy of the same application (socket select,
 * XDP), marks an executor in the shared `long_req` map when it hands it a long request
 * and clears it when done: a plain store through the mapped array. Among threads of one
 * class, first come first served. Cores: `core` if set (< nr_cpus), else any core. */
#include <syrup/policy.h>

SYR_PARAM(__u32, core, 0xffffffff); /* one core for all, or any */

SYR_ARRAY(long_req, __u64, SYR_MAX_EXECUTORS);

SYR_POLICY(struct syr_thread *t)
{
	__u64 is_long = syr_thread_hint(long_req, t);

	/* Short before long; FIFO within a class (runnable_ns < 2^62 for centuries). */
	t->key = (is_long ? (1ULL << 62) : 0) + t->runnable_ns;
	return core < t->nr_cpus ? core : SYR_PASS;
}
