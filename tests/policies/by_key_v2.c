/* Test policy: the same mapping as by_key.c, written differently (a different program),
 * so swapping between the two must never move a datagram to another socket. */
#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	__u32 *key = syr_ptr(in, 12, sizeof(__u32));

	if (!key)
		return SYR_PASS;
	return *key - (*key / syr_num_executors) * syr_num_executors;
}
