/* round_robin: executors in turn, whatever the flow. */
#include <syrup/policy.h>

static __u32 next;

SYR_POLICY(struct syr_input *in)
{
	return __sync_fetch_and_add(&next, 1) % syr_num_executors;
}
