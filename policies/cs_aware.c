/* cs_aware.c: critical-section-aware fair scheduling (after eCS). Outside critical
 * sections the application's threads share the cores fairly: the one that has run least
 * since it last woke up goes first, so a busy thread yields to its siblings when its
 * slice ends, and a waking thread takes the core from a sibling that has run longer. A
 * thread inside a critical section marked with syr_cs_enter()/syr_cs_exit() (libsyrup: a
 * store into the mapped syrup_cs array) is not preempted by the application's other
 * threads: it goes first, as long as it has held its core for less than its slice plus
 * `max_extension_ns`, so a thread that never leaves its section cannot hog the core.
 *
 * `use_hint=0` is the same fair policy without the hint: the baseline that shows what
 * the hint itself buys (bench/thread/README.md). */
#include <syrup/policy.h>

SYR_PARAM(__u64, max_extension_ns, 2000000); /* 2 ms past the slice */
SYR_PARAM(__u64, use_hint, 1);
SYR_PARAM(__u64, extension_slice_ns, 500000); /* granted at a time inside a section */

SYR_POLICY(struct syr_thread *t)
{
	if (use_hint && syr_thread_in_cs(t) && t->oncore_ns < t->slice_ns + max_extension_ns) {
		t->key = 0;             /* ahead of every sibling: keep running */
		/* A short slice, so the policy is asked again soon after the section ends
		 * (a whole slice more would outlast it and end the next one). */
		t->slice_ns = extension_slice_ns;
	} else
		t->key = 1 + t->run_ns; /* least run since it woke up goes first */
	return SYR_PASS;
}
