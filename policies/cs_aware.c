/* cs_aware.c: critical-section-aware fair scheduling (after eCS). Outside critical
 * sections the application's threads share the cores fairly: the one that has run least
 * since it last woke up goes first, so a busy thread yields to its siblings when its
 * slice ends (or at the agent's next re-decision). A thread inside a critical section
 * marked with syr_cs_enter()/syr_cs_exit() (libsyrup: a store into the mapped syrup_cs
 * array) is not preempted by the application's other threads: it goes first, as long as
 * it has run less than its slice plus `max_extension_ns` since it woke up, so a thread
 * that never leaves its section cannot hog the core. */
#include <syrup/policy.h>

SYR_PARAM(__u64, max_extension_ns, 2000000); /* 2 ms past the slice */

SYR_POLICY(struct syr_thread *t)
{
	if (syr_thread_in_cs(t) && t->run_ns < t->slice_ns + max_extension_ns)
		t->key = 0;             /* ahead of every sibling: keep running */
	else
		t->key = 1 + t->run_ns; /* least run since it woke up goes first */
	return SYR_PASS;
}
