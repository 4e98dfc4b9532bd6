/* Test policy for the sched_ext backend only: FIFO, until the application sets
 * abort_now[0]; then, at its next re-decision in dispatch, it moves from a dispatch
 * queue that does not exist (id 0x5ca0b0e7), a runtime error in the kernel's scheduler,
 * as a buggy policy might make. The kernel ejects the scheduler; syrupd must blame this
 * application alone and restore the others. (Only a kernel function the thread hook
 * allows: scx_bpf_error_bstr() is not, its format reads kernel memory. The agent backend
 * cannot compile it: no scx kfuncs.) */
#include <syrup/policy.h>

SYR_ARRAY(abort_now, __u64, 1);

extern _Bool scx_bpf_dsq_move_to_local(__u64 dsq_id) __weak __ksym;

SYR_POLICY(struct syr_thread *t)
{
	__u32 z = 0;
	__u64 *a = bpf_map_lookup_elem(&abort_now, &z);

	if (a && *a && t->reason == SYR_THREAD_TICK)
		scx_bpf_dsq_move_to_local(0x5ca0b0e7);
	return SYR_PASS;
}
