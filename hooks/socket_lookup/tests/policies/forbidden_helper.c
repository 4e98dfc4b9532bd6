/* Calls a helper outside the socket-lookup hook's allowlist (the current task's pid). */
#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	return (__u32)bpf_get_current_pid_tgid() % syr_num_executors;
}
