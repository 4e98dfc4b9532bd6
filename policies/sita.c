/*
 * sita: size interval task assignment. Long requests (request type == long_type) go
 * round robin over executors 0..long_executors-1; every other request round robin over
 * the rest, so short requests never queue behind a long one. Size long_executors to the
 * long requests' share of the work when each executor has a core of its own; one is
 * enough when the executors share the cores.
 *
 * The request type is a little-endian __u32 at byte type_offset of the input (offset 8 is
 * the first payload byte after the UDP header). Inputs too short to carry a type are
 * left to the kernel.
 */
#include <syrup/policy.h>

SYR_PARAM(__u32, type_offset, 8);
SYR_PARAM(__u32, long_type, 2);
SYR_PARAM(__u32, long_executors, 1);

static __u32 next, next_long;

SYR_POLICY(struct syr_input *in)
{
	__u32 type;

	if (syr_read_u32(in, type_offset, &type))
		return SYR_PASS;
	__u32 n = syr_num_executors, n_long = long_executors;

	if (n < 2)
		return 0;
	if (n_long < 1)
		n_long = 1;
	if (n_long > n - 1)
		n_long = n - 1;
	if (type == long_type)
		return __sync_fetch_and_add(&next_long, 1) % n_long;
	return n_long + __sync_fetch_and_add(&next, 1) % (n - n_long);
}
