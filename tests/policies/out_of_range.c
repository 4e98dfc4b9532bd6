/* Test policy: always returns an index past the executors (must fall back, not drop). */
#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	return syr_num_executors + 7;
}
