/*
 * scan_avoid: avoid executors busy with a long request (a SCAN).
 *
 * The application sets scan_map[i] to non-zero while executor i handles a long request
 * and back to 0 when it is done (a plain store through syr_map_mmap()). Starting from a
 * rotating position, the policy takes the first executor that is not marked, so it never
 * picks a marked executor while an unmarked one exists; if all are marked it falls back
 * to plain round robin.
 */
#include <syrup/policy.h>

SYR_ARRAY(scan_map, __u64, SYR_MAX_EXECUTORS);

static __u32 next;

SYR_POLICY(struct syr_input *in)
{
	__u32 n = syr_num_executors;
	__u32 start = __sync_fetch_and_add(&next, 1) % n;

	for (__u32 i = 0; i < SYR_MAX_EXECUTORS && i < n; i++) {
		__u32 idx = start + i;
		if (idx >= n)
			idx -= n;
		__u64 *busy = syr_map_lookup(&scan_map, &idx);
		if (!busy)
			return SYR_PASS;
		if (*busy == 0)
			return idx;
	}
	return start;
}
