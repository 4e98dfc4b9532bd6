/* Uses the installed headers (the C API and the policy ABI constants) and library. */
#include <stdio.h>
#include <syrup/syrup.h>

int main(void)
{
	printf("socket=%s pass=%#x max_executors=%d\n", syr_socket_path(), SYR_PASS, SYR_MAX_EXECUTORS);
	return syr_remove_policy(-1) < 0 ? 0 : 1; /* no daemon or no such policy: an error */
}
