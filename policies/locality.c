/* locality.c: keep a thread on the core its packets are steered to. The XDP policy of
 * the same application (or the application) writes, per executor, the core its traffic
 * goes to into `exec_core` as core + 1 (0: no steering known); the thread runs there, and
 * otherwise stays where it last ran (cache warmth). FIFO order on each core. */
#include <syrup/policy.h>

SYR_ARRAY(exec_core, __u64, SYR_MAX_EXECUTORS);

SYR_POLICY(struct syr_thread *t)
{
	__u64 c = syr_thread_hint(exec_core, t);

	if (c > 0 && c - 1 < t->nr_cpus)
		return (__u32)(c - 1);
	return t->prev_cpu < t->nr_cpus ? t->prev_cpu : SYR_PASS;
}
