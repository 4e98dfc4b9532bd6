#include <syrup/policy.h>

/* Heavy to verify: nested bounded loops that branch on two unknown words, so the
 * verifier finds no state to prune and walks paths until its limit of a million
 * instructions (about 4 s on a 6.18 kernel, then it refuses the program). */
SYR_POLICY(struct syr_input *in)
{
	__u32 acc = 0, v = 0, w = 0;

	syr_read_u32(in, 0, &v);
	syr_read_u32(in, 4, &w);
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < 60; i++) {
#pragma clang loop unroll(disable)
		for (__u32 j = 0; j < 60; j++) {
			if ((v >> (j & 31)) & 1)
				acc += i ^ j;
			if ((w >> (i & 31)) & 1)
				acc ^= j;
		}
	}
	return acc & 1;
}
