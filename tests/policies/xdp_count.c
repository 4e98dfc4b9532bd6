/* Test policy: counts what it sees in seen[0] and its bytes in seen[1]; passes it all. */
#include <syrup/policy.h>

SYR_ARRAY(seen, __u64, 4);

SYR_POLICY(struct syr_input *in)
{
	__u32 k = 0;
	__u64 *c = syr_map_lookup(&seen, &k);

	if (c)
		__sync_fetch_and_add(c, 1);
	k = 1;
	c = syr_map_lookup(&seen, &k);
	if (c)
		__sync_fetch_and_add(c, in->len);
	return SYR_PASS;
}
