/* get_first.c: threads handling short requests (GETs) run before threads on long ones
 * (SCANs). An executor is on a long request while it is marked in `scan_map`: the map
 * scan_avoid.c, a socket-select policy, marks when it steers a SCAN to an executor, so
 * deployed together by one application (maps are shared by name) the thread policy knows
 * the request type of a thread before the thread wakes, as in the Syrup talk's
 * cross-layer pair (there scan_map counts the long requests an executor holds; an
 * application on its own may just set and clear it through the mapped array). Among
 * threads of one class, first come first served. Cores: `core` if set (< nr_cpus), else any core.
 * Short threads get a short slice (`short_slice_us`, 0: the backend's default): on the
 * user-space agent that is what lets a thread woken for a GET preempt one on a SCAN at
 * once (EEVDF runs a waking thread with a shorter slice first), as the sched_ext
 * backend's preemption kick does; on sched_ext a short thread is re-decided that often. */
#include <syrup/policy.h>

SYR_PARAM(__u32, core, 0xffffffff); /* one core for all, or any */
SYR_PARAM(__u64, short_slice_us, 100); /* slice of threads on short requests */

SYR_ARRAY(scan_map, __u64, SYR_MAX_EXECUTORS);

SYR_POLICY(struct syr_thread *t)
{
	__u64 is_long = syr_thread_hint(scan_map, t);

	/* Short before long; FIFO within a class (runnable_ns < 2^62 for centuries). */
	t->key = (is_long ? (1ULL << 62) : 0) + t->runnable_ns;
	if (!is_long && short_slice_us)
		t->slice_ns = short_slice_us * 1000;
	return core < t->nr_cpus ? core : SYR_PASS;
}
