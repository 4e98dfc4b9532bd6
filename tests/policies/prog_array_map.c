/* Refused before load: declares a map type policies may not have. */
#include <syrup/policy.h>

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u32);
} jumps SEC(".maps");

SYR_POLICY(struct syr_input *in)
{
	return SYR_PASS;
}
