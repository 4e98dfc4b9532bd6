/* Refused before load: the tracing helper hides in a function that is not inlined. */
#include <syrup/policy.h>

static __attribute__((noinline)) int note(int x)
{
	bpf_printk("seen %d", x);
	return x;
}

SYR_POLICY(struct syr_input *in)
{
	return note(0) ? 0 : SYR_PASS;
}
