/* Test policy: requests with an even key (u32 at input offset 12) to executor 0, the
 * rest to the stack. */
#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	__u32 key;

	if (syr_read_u32(in, 12, &key))
		return SYR_PASS;
	return key % 2 == 0 ? 0 : SYR_PASS;
}
