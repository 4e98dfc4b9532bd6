/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The socket-lookup hook's test wrapper: sk_lookup programs have no test run, so the
 * policy runs in a BPF_PROG_TYPE_SYSCALL program looping over a batch of inputs
 * (kernel/hooks/test_run.bpf.h), each a struct bpf_sk_lookup (the uapi layout the hook's
 * accessors read) and the flow hash. The policy's in->ctx points to a copy on the stack,
 * laid out as the kernel's context, so every accessor reads the field it reads at the
 * hook. The decision goes to the batch's output slot, raw.
 */
#ifndef SYRUP_HOOK_SOCKET_LOOKUP_TEST_H
#define SYRUP_HOOK_SOCKET_LOOKUP_TEST_H

struct syr_test_lookup {
	struct bpf_sk_lookup sk;
	__u32 hash;
	__u32 pad;
};

struct syr_test_lookups {
	struct syr_test_lookup l[SYR_TEST_BATCH];
};

SYR_TEST_BATCH_MAPS(struct syr_test_lookups, struct syr_test_decisions);

static __always_inline long syr_test_lookup_one(__u64 i)
{
	struct syr_test_lookups *in = syr_test_slot0(&syr_test_in);
	struct syr_test_decisions *out = syr_test_slot0(&syr_test_out);

	if (!in || !out || i >= SYR_TEST_BATCH)
		return 1;
	struct bpf_sk_lookup c = in->l[i].sk;
	struct syr_input one = {
		.hash = in->l[i].hash,
		.ip_protocol = c.protocol,
		.ctx = &c,
	};

	out->decision[i] = syr_schedule(SYR_POLICY_ARG(&one));
	return 0;
}

SYR_TEST_LOOP_PROGRAM(syr_test_socket_lookup, syr_test_lookup_one);

#endif
