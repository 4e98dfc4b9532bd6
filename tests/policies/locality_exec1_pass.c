/* Test policy: policies/locality.c, changed to leave executor 1 to the kernel (SYR_PASS):
 * its replay over a recording of locality.c moves exactly executor 1's inputs. */
#include <syrup/policy.h>

SYR_ARRAY(exec_core, __u64, SYR_MAX_EXECUTORS);

SYR_POLICY(struct syr_thread *t)
{
	__u64 c = syr_thread_hint(exec_core, t);

	if (t->executor == 1)
		return SYR_PASS;
	if (c > 0 && c - 1 < t->nr_cpus)
		return (__u32)(c - 1);
	return t->prev_cpu < t->nr_cpus ? t->prev_cpu : SYR_PASS;
}
