/* Test policy with a 1.2 MB map (for the map-memory quota). */
#include <syrup/policy.h>

SYR_ARRAY(big, __u64, 100000);

SYR_POLICY(struct syr_input *in)
{
	__u32 k = 0;
	__u64 *v = syr_map_lookup(&big, &k);

	return v && *v ? 0 : SYR_PASS;
}
