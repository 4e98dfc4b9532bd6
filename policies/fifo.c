/* fifo.c: ghOSt's FIFO. Threads run in the order they became runnable, each until it
 * blocks (or the backend's slice ends), on whichever core frees up first. */
#include <syrup/policy.h>

SYR_POLICY(struct syr_thread *t)
{
	t->key = t->runnable_ns; /* the preset, spelled out: first come, first served */
	return SYR_PASS;
}
