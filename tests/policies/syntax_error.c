#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	return 0   /* missing semicolon on line 5 */
}
