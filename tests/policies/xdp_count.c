/* Test policy: counts what it sees in seen[0] and its bytes in seen[1], and adds up the
 * __u32 at L4 offset 12 (the test datagrams' key) read both ways: through syr_ptr() in
 * seen[2], through syr_read_u32() in seen[3]. Passes it all. */
#include <syrup/policy.h>

SYR_ARRAY(seen, __u64, 4);

static __always_inline void add(__u32 k, __u64 v)
{
	__u64 *c = syr_map_lookup(&seen, &k);

	if (c)
		__sync_fetch_and_add(c, v);
}

SYR_POLICY(struct syr_input *in)
{
	__u32 *key = syr_ptr(in, 12, sizeof(__u32));
	__u32 k;

	add(0, 1);
	add(1, in->len);
	if (key)
		add(2, *key);
	if (syr_read_u32(in, 12, &k) == 0)
		add(3, k);
	return SYR_PASS;
}
