/* Refused before load: calls a tracing helper. */
#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	bpf_printk("seen");
	return SYR_PASS;
}
