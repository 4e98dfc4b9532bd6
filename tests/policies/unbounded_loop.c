/* Rejected by the verifier: a loop whose exit depends on packet data it never changes. */
#include <syrup/policy.h>

static volatile __u64 spins;

SYR_POLICY(struct syr_input *in)
{
	__u32 n = 0;

	syr_read_u32(in, 8, &n);
	while (n != 0)
		spins++;
	return 0;
}
