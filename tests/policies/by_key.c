/* Test policy: executor = key % executors, the key being the __u32 at payload offset 4
 * (input offset 12). Deterministic by content, so a test can tell a misrouted datagram. */
#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	__u32 key;

	if (syr_read_u32(in, 12, &key))
		return SYR_PASS;
	return key % syr_num_executors;
}
