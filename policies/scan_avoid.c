/*
 * scan_avoid: avoid executors busy with a long request (a SCAN).
 *
 * The application sets scan_map[i] to non-zero while executor i handles a long request
 * and back to 0 when it is done (a plain store through syr_map_mmap()). The policy goes
 * round robin over the executors that are not marked, so it never picks a marked
 * executor while an unmarked one exists and the free ones share the load evenly; if all
 * are marked it goes round robin over all of them.
 *
 * It also marks the executor it hands a long request (request type == long_type, a
 * little-endian __u32 at byte type_offset, as in sita): requests steered after it then
 * avoid the executor at once, instead of queueing behind the long request until the
 * application starts it and sets the mark itself. The application's clear at the end
 * of the request ends both marks.
 */
#include <syrup/policy.h>

SYR_PARAM(__u32, type_offset, 8);
SYR_PARAM(__u32, long_type, 2);

SYR_ARRAY(scan_map, __u64, SYR_MAX_EXECUTORS);

/* The executor picked last; the next request starts looking after it. Concurrent runs
 * on other cores may read the same value and pick the same executor: harmless. */
static __u32 last;

static __always_inline int busy(__u32 idx)
{
	__u64 *mark = syr_map_lookup(&scan_map, &idx);

	return mark && *mark;
}

static __always_inline __u32 mark_if_long(struct syr_input *in, __u32 idx)
{
	__u32 type;
	__u64 *mark;

	if (syr_read_u32(in, type_offset, &type) == 0 && type == long_type) {
		mark = syr_map_lookup(&scan_map, &idx);
		if (mark)
			*mark = 1;
	}
	return idx;
}

/* The first unmarked executor after the one picked last (a round robin that skips marked
 * executors), or the next one if all are marked. One pass that stops at the first free
 * executor: the verifier sees a path per executor, not one per pattern of marks (counting
 * the free ones first and then picking the k-th made it explore ~n^3 states and reject
 * the policy above ~24 executors). */
SYR_POLICY(struct syr_input *in)
{
	__u32 n = syr_num_executors, start = last + 1;

	for (__u32 k = 0; k < SYR_MAX_EXECUTORS && k < n; k++) {
		__u32 i = (start + k) % n;

		if (!busy(i)) {
			last = i;
			return mark_if_long(in, i);
		}
	}
	start %= n;
	last = start;
	return mark_if_long(in, start);
}
