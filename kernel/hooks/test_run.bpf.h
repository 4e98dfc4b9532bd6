/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * What every hook's test build (kernel/hooks/<hook>/test/policy_input.h and wrapper.bpf.h)
 * shares: `syrupctl test` and `syrupctl replay` run a policy with BPF_PROG_TEST_RUN in
 * syrupd (syrupd/test_run.cpp), never attached, its maps private to the run.
 *
 * Invariants:
 *  - the policy's random numbers (syr_random(), bpf_get_prandom_u32()) come from a
 *    xorshift64* generator seeded by syrupd (syr_test_seed, read-only data), so a run is
 *    the same on every machine for one seed; syr_cpu() is 0;
 *  - a packet input's metadata (the kernel's flow hash, the protocol) and the decision
 *    travel in syr_test_meta, slot 0, which syrupd writes before and reads after a run;
 *  - a packet test program's frame is SYR_TEST_L4_OFF bytes of padding, then the L4
 *    header: offset 0 of the input is the L4 header, as at the real hooks.
 */
#ifndef SYRUP_TEST_RUN_BPF_H
#define SYRUP_TEST_RUN_BPF_H

#define SYR_TEST_L4_OFF 14 /* an Ethernet header's room: the least frame a test run takes */

struct syr_test_meta {
	__u32 hash;
	__u32 ip_protocol;
	__u32 decision; /* out: what the policy returned */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct syr_test_meta);
	__uint(max_entries, 1);
} syr_test_meta SEC(".maps");

const volatile __u64 syr_test_seed = 1;
static __u64 syr_test_rng;

static __always_inline __u32 syr_test_prandom(void)
{
	__u64 x = syr_test_rng;

	if (!x)
		x = syr_test_seed ? syr_test_seed : 0x9e3779b97f4a7c15ULL;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	syr_test_rng = x;
	return (__u32)((x * 0x2545f4914f6cdd1dULL) >> 32);
}

static __always_inline __u32 syr_test_cpu(void) { return 0; }

/* The policy's own calls, and <syrup/policy.h>'s syr_random()/syr_cpu() defined after
 * this header, reach the generator above instead of the kernel's. */
#define bpf_get_prandom_u32 syr_test_prandom
#define bpf_get_smp_processor_id syr_test_cpu

static __always_inline struct syr_test_meta *syr_test_meta_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&syr_test_meta, &zero);
}

/* The packet hooks' test program: an XDP program, which the kernel test-runs on a frame
 * syrupd builds. `in` is filled but for data/data_end/l4_off, which the hook sets. */
#define SYR_TEST_PACKET_PROGRAM(name, set_input)                                     \
	SEC("xdp")                                                                     \
	int name(struct xdp_md *ctx)                                                   \
	{                                                                              \
		struct syr_test_meta *m = syr_test_meta_get();                         \
		__u64 frame = bpf_xdp_get_buff_len(ctx);                               \
                                                                                       \
		if (!m || frame < SYR_TEST_L4_OFF)                                     \
			return XDP_ABORTED;                                            \
		/* Read after the helper calls, so no packet pointer is kept on the    \
		 * stack across them (unprivileged code may not overwrite one). */    \
		void *data = (void *)(long)ctx->data;                                  \
		void *end = (void *)(long)ctx->data_end;                               \
		if (data + SYR_TEST_L4_OFF > end)                                      \
			return XDP_ABORTED;                                            \
		struct syr_input in = {                                                \
			.len = (__u32)(frame - SYR_TEST_L4_OFF),                       \
			.hash = m->hash,                                               \
			.ip_protocol = m->ip_protocol,                                 \
			.ctx = ctx,                                                    \
		};                                                                     \
		set_input(in, data, end);                                              \
		m->decision = syr_schedule(SYR_POLICY_ARG(&in));                       \
		return XDP_PASS;                                                       \
	}                                                                              \
	char _license[] SEC("license") = "Dual BSD/GPL"

#endif
