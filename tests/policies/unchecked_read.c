/* Rejected by the verifier: reads the packet without the bounds-checked helpers. */
#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	return *(__u32 *)(in->data + 8);
}
