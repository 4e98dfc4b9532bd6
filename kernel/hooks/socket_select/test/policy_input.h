/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The socket-select hook's part of <syrup/policy.h> in a test build (test/wrapper.bpf.h,
 * kernel/hooks/test_run.bpf.h): the hook's own part, but reads go through
 * bpf_xdp_load_bytes() past the test frame's padding, since sk_reuseport programs have
 * no test run and the test program is an XDP program. Offsets mean what they mean at the
 * hook: 0 is the L4 header.
 */
#define syr_hook_read syr_hook_read_at_the_hook
#include "../policy_input.h"
#undef syr_hook_read
#define SYR_TEST_PACKETS 1
#include "test_run.bpf.h"

static __always_inline int syr_hook_read(const struct syr_input *in, __u32 off, void *dst, __u32 len)
{
	return bpf_xdp_load_bytes(in->ctx, SYR_TEST_L4_OFF + off, dst, len) ? -1 : 0;
}
