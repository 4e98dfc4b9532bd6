/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The thread hook's test wrapper: a BPF_PROG_TYPE_SYSCALL program, as the agent backend
 * runs policies (agent_wrapper.bpf.h), over one struct syr_thread given as the test
 * run's context. The policy gets a copy on the stack (as the agent's policy gets a map
 * slot, never the context itself); its key and slice go back into the context, which the
 * kernel copies out, and the decision is the return value, raw.
 */
#ifndef SYRUP_HOOK_THREAD_TEST_H
#define SYRUP_HOOK_THREAD_TEST_H

SEC("syscall")
int syr_test_thread(struct syr_thread *ctx)
{
	struct syr_thread t = *ctx;
	__u32 r = syr_schedule(SYR_POLICY_ARG(&t));

	ctx->key = t.key;
	ctx->slice_ns = t.slice_ns;
	return r;
}

char _license[] SEC("license") = "Dual BSD/GPL";

#endif
