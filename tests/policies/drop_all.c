/* Test policy: drops every input. */
#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	return SYR_DROP;
}
