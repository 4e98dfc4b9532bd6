/* blue_green: every new connection (or datagram) goes to the executor the application
 * names in bg_active[0]: 0 (blue, the running version) until it writes 1 (green, the new
 * one). Flipping the value moves new connections at once; established ones stay where
 * they are, and blue drains them before it exits. For the socket-lookup hook:
 *
 *   syrupctl deploy --hook socket-lookup --pid PID --protocol tcp --port 8080 blue_green.c
 *   (executors: the process's listeners in fd order; blue first)
 */
#include <syrup/policy.h>

SYR_ARRAY(bg_active, __u32, 1);

SYR_POLICY(struct syr_input *in)
{
	__u32 zero = 0;
	__u32 *active = syr_map_lookup(&bg_active, &zero);

	return active ? *active : 0;
}
