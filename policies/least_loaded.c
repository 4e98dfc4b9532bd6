/*
 * least_loaded: the executor with the shortest queue.
 *
 * The application keeps queue_len[i] = requests waiting at executor i in a mapped array
 * (a store per change). The policy scans the executors from a rotating start and takes
 * the first with the smallest queue, so equal queues share the load.
 */
#include <syrup/policy.h>

SYR_ARRAY(queue_len, __u64, SYR_MAX_EXECUTORS);

static __u32 next;

SYR_POLICY(struct syr_input *in)
{
	__u32 n = syr_num_executors;
	__u32 start = __sync_fetch_and_add(&next, 1) % n;
	__u32 best = start;
	__u64 best_len = ~0ULL;

	for (__u32 i = 0; i < SYR_MAX_EXECUTORS && i < n; i++) {
		__u32 idx = start + i;
		if (idx >= n)
			idx -= n;
		__u64 *q = syr_map_lookup(&queue_len, &idx);
		if (!q)
			return SYR_PASS;
		if (*q < best_len) {
			best_len = *q;
			best = idx;
		}
	}
	return best;
}
