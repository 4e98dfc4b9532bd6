/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The socket-lookup hook's test wrapper: sk_lookup programs have no test run, so the
 * policy runs in a BPF_PROG_TYPE_SYSCALL program whose context is a struct bpf_sk_lookup
 * (the uapi layout the hook's accessors read) and the flow hash. The policy's in->ctx
 * points to a copy on the stack, laid out as the kernel's context, so every accessor
 * reads the field it reads at the hook. The decision is the return value, raw.
 */
#ifndef SYRUP_HOOK_SOCKET_LOOKUP_TEST_H
#define SYRUP_HOOK_SOCKET_LOOKUP_TEST_H

struct syr_test_lookup {
	struct bpf_sk_lookup sk;
	__u32 hash;
	__u32 pad;
};

SEC("syscall")
int syr_test_socket_lookup(struct syr_test_lookup *ctx)
{
	struct bpf_sk_lookup c = ctx->sk;
	struct syr_input in = {
		.hash = ctx->hash,
		.ip_protocol = c.protocol,
		.ctx = &c,
	};

	return syr_schedule(SYR_POLICY_ARG(&in));
}

char _license[] SEC("license") = "Dual BSD/GPL";

#endif
