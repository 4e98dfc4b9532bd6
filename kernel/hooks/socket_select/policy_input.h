/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The socket-select hook's part of <syrup/policy.h>: a policy matches a datagram or a
 * connection's first packet (struct syr_input, offset 0 the L4 header); syr_ptr() reads
 * the linear bytes directly, syr_read() any byte.
 */
#define SYR_POLICY_WANTS(fn) SYR_POLICY_WANTS_INPUT(fn)
#define SYR_POLICY_WRONG_HOOK SYR_POLICY_WRONG_HOOK_INPUT

static __always_inline int syr_hook_read(const struct syr_input *in, __u32 off, void *dst, __u32 len)
{
	/* In sk_reuseport programs this helper reads relative to the L4 header and
	 * handles non-linear data. */
	return bpf_skb_load_bytes(in->ctx, off, dst, len) ? -1 : 0;
}
