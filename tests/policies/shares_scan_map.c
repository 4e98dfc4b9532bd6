/* Test policy: declares the same scan_map as policies/scan_avoid.c and follows it:
 * the lowest unmarked executor. */
#include <syrup/policy.h>

SYR_ARRAY(scan_map, __u64, SYR_MAX_EXECUTORS);

SYR_POLICY(struct syr_input *in)
{
	for (__u32 i = 0; i < SYR_MAX_EXECUTORS && i < syr_num_executors; i++) {
		__u32 key = i;
		__u64 *busy = syr_map_lookup(&scan_map, &key);
		if (busy && *busy == 0)
			return i;
	}
	return SYR_PASS;
}
