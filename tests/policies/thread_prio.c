/* Test policy: threads whose executor is marked in `high` run first; all on `core`
 * (or any core when core is past the cores). */
#include <syrup/policy.h>

SYR_PARAM(__u32, core, 0xffffffff);
SYR_ARRAY(high, __u64, SYR_MAX_EXECUTORS);

SYR_POLICY(struct syr_thread *t)
{
	t->key = syr_thread_hint(high, t) ? 0 : 1 + t->runnable_ns;
	return core < t->nr_cpus ? core : SYR_PASS;
}
