/* pass: leave every decision to the kernel (its 5-tuple hash at socket select). */
#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	return SYR_PASS;
}
