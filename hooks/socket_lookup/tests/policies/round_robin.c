/* round_robin for the socket-lookup hook: executors in turn (the benchmark's policy). */
#include <syrup/policy.h>

static __u32 next;

SYR_POLICY(struct syr_input *in)
{
	return __sync_fetch_and_add(&next, 1) % syr_num_executors;
}
