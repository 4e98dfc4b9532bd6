#include <syrup/policy.h>

/* A policy with a map of a million entries, for the map dump test (its owner fills it). */
SYR_HASH(big, __u32, __u64, 1000000);

SYR_POLICY(struct syr_input *in)
{
	return SYR_PASS;
}
