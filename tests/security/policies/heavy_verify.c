#include <syrup/policy.h>

/* Heavy to verify: a bounded loop of 3000 turns, each a few hundred instructions of
 * arithmetic on unknown words, so the verifier (which walks every turn: the counter
 * differs in each) reaches its limit of a million processed instructions, seconds on a
 * 6.18 kernel, then refuses the program. No branch depends on the data: tenant policies
 * are verified as unprivileged code, whose verifier also walks each branch's speculative
 * side and refuses more than 8192 of them pending. */
#define STEP acc = (acc * 2654435761u) ^ (acc >> 7) ^ v;
#define STEP10 STEP STEP STEP STEP STEP STEP STEP STEP STEP STEP
#define STEP100 STEP10 STEP10 STEP10 STEP10 STEP10 STEP10 STEP10 STEP10 STEP10 STEP10

SYR_POLICY(struct syr_input *in)
{
	__u32 acc = 0, v = 0;

	syr_read_u32(in, 0, &v);
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < 3000; i++) {
		STEP100
		acc += i;
	}
	return acc & 1;
}
