/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The XDP hook's part of <syrup/policy.h>: a policy matches a packet (struct syr_input,
 * offset 0 the L4 header), read through bpf_xdp_load_bytes(): the wrapper passes no
 * packet pointer (in->data is NULL).
 */
#define SYR_POLICY_WANTS(fn) SYR_POLICY_WANTS_INPUT(fn)
#define SYR_POLICY_WRONG_HOOK SYR_POLICY_WRONG_HOOK_INPUT

static __always_inline int syr_hook_read(const struct syr_input *in, __u32 off, void *dst, __u32 len)
{
	return bpf_xdp_load_bytes(in->ctx, in->l4_off + off, dst, len) ? -1 : 0;
}

/* At the XDP hook the L4 header lies at an offset the root program parsed, and tenant
 * policies are verified as unprivileged code, which may add only constants to a packet
 * pointer (the verifier's Spectre v1 masking has no bound for packet pointers). So
 * syr_ptr() copies the bytes into a per-CPU scratch area, at the same offset, and points
 * there: reads see the packet, writes change only the copy. */
#define SYR_XDP_SCRATCH_BYTES 512
struct syr_xdp_scratch {
	__u8 bytes[SYR_XDP_SCRATCH_BYTES];
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct syr_xdp_scratch);
} syr_xdp_scratch SEC(".maps");

static __always_inline void *syr_xdp_ptr(const struct syr_input *in, __u32 off, __u32 len)
{
	__u32 zero = 0;
	struct syr_xdp_scratch *s = bpf_map_lookup_elem(&syr_xdp_scratch, &zero);

	if (!s || len > SYR_XDP_SCRATCH_BYTES || off > SYR_XDP_SCRATCH_BYTES - len)
		return (void *)0;
	if (!syr_input_has(in, off, len) || syr_hook_read(in, off, s->bytes + off, len))
		return (void *)0;
	return s->bytes + off;
}

/* A pointer to `len` readable bytes at `off` (a copy, see above), or NULL. `len` must be
 * a constant; off + len at most SYR_XDP_SCRATCH_BYTES. */
#define syr_ptr(in, off, len) syr_xdp_ptr(in, off, len)
