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
 *  - inputs run in batches (one BPF_PROG_TEST_RUN per batch, not per input, so a
 *    replay pays one system call per up to SYR_TEST_BATCH inputs): syrupd fills
 *    syr_test_in, runs, and reads the decisions back (slot i for the batch's input i); inputs run in order and the generator and the policy's maps carry
 *    from one to the next, as one input per run did;
 *  - a packet batch is one map value (struct syr_test_packets): a cursor, the
 *    decisions, and records (struct syr_test_rec, then the bytes, padded to 8) in
 *    SYR_TEST_BLOB bytes; the XDP test program loops over them with bpf_loop(),
 *    copying the next record into its frame:
 *    SYR_TEST_L4_OFF bytes of padding, then the L4 header, trimmed to the input's
 *    length, so offset 0 of the input is the L4 header and the frame ends where the
 *    input does, as at the real hooks;
 *  - the thread and socket-lookup test programs (syscall programs) loop with
 *    bpf_loop() over an array of fixed-size inputs.
 */
#ifndef SYRUP_TEST_RUN_BPF_H
#define SYRUP_TEST_RUN_BPF_H

#define SYR_TEST_L4_OFF 14        /* an Ethernet header's room: the least frame a test run takes */
#define SYR_TEST_INPUT_BYTES 1500 /* of one packet input (syrupd's TestRunLimits::kInputBytes) */
#define SYR_TEST_BATCH 4096       /* inputs of one batch */
#define SYR_TEST_BLOB (256 * 1024) /* bytes of one packet batch */

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

/* The test build's maps of one batch: `in` holds the inputs, `out` what came back. */
#define SYR_TEST_BATCH_MAPS(in_type, out_type)                                       \
	struct {                                                                       \
		__uint(type, BPF_MAP_TYPE_ARRAY);                                      \
		__type(key, __u32);                                                    \
		__type(value, in_type);                                                \
		__uint(max_entries, 1);                                                \
	} syr_test_in SEC(".maps");                                                    \
	struct {                                                                       \
		__uint(type, BPF_MAP_TYPE_ARRAY);                                      \
		__type(key, __u32);                                                    \
		__type(value, out_type);                                               \
		__uint(max_entries, 1);                                                \
	} syr_test_out SEC(".maps")

static __always_inline void *syr_test_slot0(void *map)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(map, &zero);
}

/* One packet input of a batch: this header, then `len` bytes, padded to 8. */
struct syr_test_rec {
	__u32 len; /* bytes from the L4 header on, at most SYR_TEST_INPUT_BYTES */
	__u32 hash;
	__u32 ip_protocol;
	__u32 pad; /* 0: its last byte is copied as the frame's byte SYR_TEST_L4_OFF - 1 */
};

/* A packet batch's cursor, set by syrupd before each batch. */
struct syr_test_meta {
	__u32 n;    /* inputs in the batch */
	__u32 next; /* inputs staged so far; n once all ran */
	__u32 off;  /* the next record's offset in bytes[] */
	__u32 len, hash, ip_protocol; /* the current input's (syr_test_stage()) */
	__u32 pad[2];
};

/* Past the last record's offset, room for a header and the largest masked length, so
 * that offsets and lengths are bounded by masks instead of branches: each branch before
 * the policy is one more state the verifier keeps pending while it walks the policy's
 * loops (least_loaded's reaches the 8192 limit with a few more). */
#define SYR_TEST_LEN_MASK 2047
#define SYR_TEST_SLACK 4096

/* The decisions of a batch whose program returns nothing else (socket-lookup). */
struct syr_test_decisions {
	__u32 decision[SYR_TEST_BATCH];
};

/* A packet batch, one map value: syrupd writes it, the program runs once per input, and
 * syrupd reads the decisions back. */
struct syr_test_packets {
	struct syr_test_meta meta;
	__u32 decision[SYR_TEST_BATCH];
	__u8 bytes[SYR_TEST_BLOB + SYR_TEST_SLACK];
};

#ifdef SYR_TEST_PACKETS /* the packet hooks' test builds (their test/policy_input.h) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct syr_test_packets);
	__uint(max_entries, 1);
} syr_test_in SEC(".maps");

/* Makes the frame the batch's next input: trims or grows it to SYR_TEST_L4_OFF + len
 * (at most 2061 bytes of the test run's 3520, so the helpers cannot fail) and copies the
 * record's bytes in, with the header's last (zero) byte before them, so that the copy is
 * never empty. */
static __always_inline void syr_test_stage(struct xdp_md *ctx, struct syr_test_packets *p)
{
	__u32 off = p->meta.off & (SYR_TEST_BLOB - 1);
	struct syr_test_rec h;

	__builtin_memcpy(&h, &p->bytes[off], sizeof(h));
	__u32 len = h.len & SYR_TEST_LEN_MASK;
	bpf_xdp_adjust_tail(ctx, (int)(SYR_TEST_L4_OFF + len) - (int)bpf_xdp_get_buff_len(ctx));
	bpf_xdp_store_bytes(ctx, SYR_TEST_L4_OFF - 1, &p->bytes[off + sizeof(h) - 1], len + 1);
	p->meta.len = len;
	p->meta.hash = h.hash;
	p->meta.ip_protocol = h.ip_protocol;
	p->meta.off = off + sizeof(h) + ((len + 7) & ~7U);
	p->meta.next++;
}

struct syr_test_packet_loop {
	struct xdp_md *ctx;
	struct syr_test_packets *p;
};

/* The packet hooks' test program: an XDP program, test-run once per batch (a `repeat`
 * above 1 would swap the kernel's XDP dispatcher twice per run, milliseconds under
 * load), looping with bpf_loop() over the batch's inputs: each turn makes the frame the
 * next record's and runs the policy on it. `in` is filled but for data/data_end/l4_off,
 * which the hook sets. */
#define SYR_TEST_PACKET_PROGRAM(name, set_input)                                     \
	static long name##_cb(__u64 i, void *arg)                                      \
	{                                                                              \
		struct syr_test_packet_loop *l = arg;                                  \
		struct xdp_md *ctx = l->ctx;                                           \
		struct syr_test_packets *p = l->p;                                     \
                                                                                       \
		syr_test_stage(ctx, p);                                                \
		/* Read after the helper calls, so no packet pointer is kept on the    \
		 * stack across them (unprivileged code may not overwrite one). */    \
		void *data = (void *)(long)ctx->data;                                  \
		void *end = (void *)(long)ctx->data_end;                               \
		if (data + SYR_TEST_L4_OFF > end)                                      \
			return 1;                                                      \
		struct syr_input in = {                                                \
			.len = p->meta.len,                                            \
			.hash = p->meta.hash,                                          \
			.ip_protocol = p->meta.ip_protocol,                            \
			.ctx = ctx,                                                    \
		};                                                                     \
		set_input(in, data, end);                                              \
		__u32 d = syr_schedule(SYR_POLICY_ARG(&in));                           \
		p->decision[(p->meta.next - 1) & (SYR_TEST_BATCH - 1)] = d;            \
		/* ctx stays live across the policy, so the policy's code does not     \
		 * reuse a stack slot it may have been spilled to. */                 \
		asm volatile("" : : "r"(ctx));                                         \
		return 0;                                                              \
	}                                                                              \
	SEC("xdp")                                                                     \
	int name(struct xdp_md *ctx)                                                   \
	{                                                                              \
		struct syr_test_packets *p = syr_test_slot0(&syr_test_in);             \
		if (!p)                                                                \
			return XDP_ABORTED;                                            \
		struct syr_test_packet_loop l = {ctx, p};                              \
		bpf_loop(p->meta.n & (2 * SYR_TEST_BATCH - 1), name##_cb, &l, 0);      \
		return XDP_PASS;                                                       \
	}                                                                              \
	char _license[] SEC("license") = "Dual BSD/GPL"
#endif /* SYR_TEST_PACKETS */

/* The syscall test programs' context: how many inputs of syr_test_in to run. */
struct syr_test_batch {
	__u32 n;
	__u32 pad;
};

/* A syscall test program over a batch: `one(i)` runs input i; bpf_loop() returns how
 * many ran, which syrupd compares with n. */
#define SYR_TEST_LOOP_PROGRAM(name, one)                                             \
	static long name##_cb(__u64 i, void *unused)                                   \
	{                                                                              \
		return one(i);                                                         \
	}                                                                              \
	SEC("syscall")                                                                 \
	int name(struct syr_test_batch *ctx)                                           \
	{                                                                              \
		__u32 n = ctx->n;                                                      \
                                                                                       \
		if (n > SYR_TEST_BATCH)                                                \
			return -1;                                                     \
		return bpf_loop(n, name##_cb, 0, 0);                                   \
	}                                                                              \
	char _license[] SEC("license") = "Dual BSD/GPL"

#endif
