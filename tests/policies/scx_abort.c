/* Test policy for the sched_ext backend only: FIFO, until the application sets
 * abort_now[0]; then it raises a runtime error in the kernel's scheduler, as a buggy
 * policy might. The kernel ejects the scheduler; syrupd must blame this application
 * alone and restore the others. (The agent backend cannot compile it: no scx kfuncs.) */
#include <syrup/policy.h>

SYR_ARRAY(abort_now, __u64, 1);

extern void scx_bpf_error_bstr(char *fmt, unsigned long long *data, __u32 data__sz) __weak __ksym;

static char abort_msg[] = "scx_abort.c: the application asked this policy to fail";

SYR_POLICY(struct syr_thread *t)
{
	__u32 z = 0;
	__u64 *a = bpf_map_lookup_elem(&abort_now, &z);
	unsigned long long none[1] = {0};

	if (a && *a)
		scx_bpf_error_bstr(abort_msg, none, sizeof(none));
	return SYR_PASS;
}
