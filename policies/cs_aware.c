/* cs_aware.c: critical-section-aware scheduling (after eCS). A thread inside a critical
 * section marked with syr_cs_enter()/syr_cs_exit() (libsyrup: a store into the mapped
 * syrup_cs array) is not preempted by the application's other threads: when its slice
 * ends it goes first again, for at most `max_extension_ns` past its slice; after that it
 * queues FIFO like everyone else, so a thread that never leaves its section cannot hog
 * the core. */
#include <syrup/policy.h>

SYR_PARAM(__u64, max_extension_ns, 2000000); /* 2 ms past the slice */

SYR_POLICY(struct syr_thread *t)
{
	if (syr_thread_in_cs(t) && t->run_ns < t->slice_ns + max_extension_ns)
		t->key = 0; /* ahead of every waiting thread: keep running */
	else
		t->key = t->runnable_ns;
	return SYR_PASS;
}
