/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The thread hook's test wrapper: a BPF_PROG_TYPE_SYSCALL program, as the agent backend
 * runs policies (agent_wrapper.bpf.h), looping over a batch of struct syr_thread inputs
 * (kernel/hooks/test_run.bpf.h). The policy gets a copy on the stack (as the agent's
 * policy gets a map slot, never the map's input itself); its decision, key and slice go
 * to the batch's output slot, raw.
 */
#ifndef SYRUP_HOOK_THREAD_TEST_H
#define SYRUP_HOOK_THREAD_TEST_H

struct syr_test_threads {
	struct syr_thread t[SYR_TEST_BATCH];
};

struct syr_test_thread_out {
	__u64 key;
	__u64 slice_ns;
	__u32 decision;
	__u32 pad;
};

struct syr_test_thread_outs {
	struct syr_test_thread_out o[SYR_TEST_BATCH];
};

SYR_TEST_BATCH_MAPS(struct syr_test_threads, struct syr_test_thread_outs);

static __always_inline long syr_test_thread_one(__u64 i)
{
	struct syr_test_threads *in = syr_test_slot0(&syr_test_in);
	struct syr_test_thread_outs *out = syr_test_slot0(&syr_test_out);

	if (!in || !out || i >= SYR_TEST_BATCH)
		return 1;
	struct syr_thread t = in->t[i];
	__u32 r = syr_schedule(SYR_POLICY_ARG(&t));

	out->o[i].key = t.key;
	out->o[i].slice_ns = t.slice_ns;
	out->o[i].decision = r;
	return 0;
}

SYR_TEST_LOOP_PROGRAM(syr_test_thread, syr_test_thread_one);

#endif
