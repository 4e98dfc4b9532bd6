/*
 * sita: size interval task assignment. Long requests (request type == long_type) all go
 * to executor 0; every other request goes round robin over executors 1..n-1, so short
 * requests never queue behind a long one.
 *
 * The request type is a little-endian __u32 at byte type_offset of the input (offset 8 is
 * the first payload byte after the UDP header). Inputs too short to carry a type are
 * left to the kernel.
 */
#include <syrup/policy.h>

SYR_PARAM(__u32, type_offset, 8);
SYR_PARAM(__u32, long_type, 2);

static __u32 next;

SYR_POLICY(struct syr_input *in)
{
	__u32 type;

	if (syr_read_u32(in, type_offset, &type))
		return SYR_PASS;
	if (syr_num_executors < 2)
		return 0;
	if (type == long_type)
		return 0;
	return 1 + __sync_fetch_and_add(&next, 1) % (syr_num_executors - 1);
}
