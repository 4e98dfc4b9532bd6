/* Test policy: steers each flow to an executor by its hash (segments of one TCP
 * connection stay in order on one core) and counts what it steered in seen[0] and its
 * bytes in seen[1]. */
#include <syrup/policy.h>

SYR_ARRAY(seen, __u64, 2);

static __always_inline void add(__u32 k, __u64 v)
{
	__u64 *c = syr_map_lookup(&seen, &k);

	if (c)
		__sync_fetch_and_add(c, v);
}

SYR_POLICY(struct syr_input *in)
{
	add(0, 1);
	add(1, in->len);
	return in->hash % syr_num_executors;
}
