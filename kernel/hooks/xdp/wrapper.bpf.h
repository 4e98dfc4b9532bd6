/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The XDP hook wrapper: included by syrupd after the policy source, it turns the
 * policy's syr_schedule() into the XDP program an interface's root program tail-calls
 * for this application's ports.
 *
 * Invariants:
 *  - the policy sees only frames the root program matched to this application, with
 *    the L4 header bounds-checked (offset 0 of the input is the UDP/TCP header);
 *  - it is verified with CAP_BPF and CAP_NET_ADMIN only (syrupd/loader.cpp), so it adds
 *    no variable offset to a packet pointer: inputs are read through the helper;
 *  - every decision of the policy is recorded while a recording runs (recording.bpf.h);
 *  - SYR_PASS hands the frame to the stack untouched, SYR_DROP drops it, an index past
 *    the executors (or an executor that is gone) falls back to the stack;
 *  - executor i is the core syr_exec_cpu[i] (redirect through the CPUMAP syr_cpus) or
 *    the AF_XDP socket in slot i of syr_xsks, as syr_executor_kind says.
 */
#ifndef SYRUP_HOOK_XDP_H
#define SYRUP_HOOK_XDP_H

#include "hook_stats.bpf.h"

#include <syrup/xdp_abi.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct syr_xdp_meta);
} syr_xdp_meta SEC(".maps"); /* the root program's, shared */

struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, SYR_MAX_EXECUTORS);
	__type(key, __u32);
	__type(value, struct bpf_cpumap_val);
} syr_cpus SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, SYR_MAX_EXECUTORS);
	__type(key, __u32);
	__type(value, __u32);
} syr_xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SYR_MAX_EXECUTORS);
	__type(key, __u32);
	__type(value, __u32);
} syr_exec_cpu SEC(".maps");

const volatile __u32 syr_executor_kind = SYR_XDP_EXEC_CPU;

/* What a recording keeps of a packet (recording.bpf.h): the input the policy got, from
 * the root program's parse, which is still this CPU's. */
static __always_inline int syr_xdp_rec_input(struct syr_input *in, struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct syr_xdp_meta *m = bpf_map_lookup_elem(&syr_xdp_meta, &zero);
	__u64 frame = bpf_xdp_get_buff_len(ctx);

	if (!m || m->l4_off > 512 || m->l4_off > frame)
		return 0;
	in->len = (__u32)(frame - m->l4_off);
	in->hash = m->hash;
	in->ip_protocol = m->ip_protocol;
	in->l4_off = m->l4_off;
	in->ctx = ctx;
	return 1;
}
#define SYR_REC_INPUT_FROM_CTX(in, ctx) syr_xdp_rec_input(in, ctx)
#include "recording.bpf.h"

/* Counts the answer in its slot and returns it. */
static __always_inline int syr_counted(__u32 slot, int action)
{
	syr_count(slot);
	return action;
}

/* The same for the policy's decision `idx` on `in`, which a running recording keeps. */
#define syr_decided(in, idx, slot, action)                                           \
	({                                                                             \
		__u32 __slot = (slot);                                                 \
		syr_count(__slot);                                                     \
		syr_rec_input(ctx, idx, __slot);                                        \
		(int)(action);                                                         \
	})

/* An XDP program loaded with expected attach type 0, as the root is inside libxdp's
 * dispatcher (an extension must have 0): the kernel lets a program into the root's
 * prog array only if their expected attach types match, and libbpf's "xdp" section would
 * give BPF_XDP. syrupd registers the section (hooks/xdp/xdp.cpp). */
SEC("syrup_xdp")
int syr_xdp(struct xdp_md *ctx)
{
	struct syr_xdp_meta *meta = bpf_map_lookup_elem(&syr_xdp_meta, syr_key(0));

	if (!meta)
		return syr_counted(SYR_STAT_FALLBACK, XDP_PASS);
	__u32 off = meta->l4_off;
	/* The frame's length from the helper, not data_end - data: this program is verified
	 * as unprivileged code, which may neither subtract packet pointers nor add a
	 * variable offset to one; the policy reads through bpf_xdp_load_bytes (syr_read). */
	__u64 frame = bpf_xdp_get_buff_len(ctx);
	if (off > 512 || off > frame)
		return syr_counted(SYR_STAT_FALLBACK, XDP_PASS);

	struct syr_input in = {
		.data = (void *)0,
		.data_end = (void *)0,
		.len = (__u32)(frame - off),
		.hash = meta->hash,
		.ip_protocol = meta->ip_protocol,
		.ctx = ctx,
		.l4_off = off,
	};
	__u32 idx = syr_schedule(SYR_POLICY_ARG(&in));

	if (idx == SYR_DROP)
		return syr_decided(&in, idx, SYR_STAT_DROP, XDP_DROP);
	if (idx == SYR_PASS)
		return syr_decided(&in, idx, SYR_STAT_PASS, XDP_PASS);
	if (idx >= syr_num_executors || idx >= SYR_MAX_EXECUTORS)
		return syr_decided(&in, idx, SYR_STAT_FALLBACK, XDP_PASS);

	/* Two call sites of bpf_redirect_map() that must stay two: merged into one (clang
	 * sinks the common call), the verifier's walk of the mispredicted branch (Spectre
	 * v1, unprivileged code) sees both maps at it and leaves the generic helper with its
	 * indirect call, instead of a direct call to the CPUMAP's redirect: 14 ns per packet
	 * here. The two different no-op instructions after the calls keep clang from sinking
	 * them into one. */
	/* The executor's keys go to meta->slot, which nothing reads after the root's tail
	 * call: a store into a map value is not fenced, one into a fresh stack slot is. */
	long act;
	__u32 *key = &meta->slot;
	*key = idx;
	if (syr_executor_kind == SYR_XDP_EXEC_XSK) {
		act = bpf_redirect_map(&syr_xsks, idx, XDP_PASS);
		asm volatile("%[a] = %[a]" : [a] "+r"(act));
	} else {
		__u32 *cpu = bpf_map_lookup_elem(&syr_exec_cpu, key);
		if (!cpu)
			return syr_decided(&in, idx, SYR_STAT_FALLBACK, XDP_PASS);
		act = bpf_redirect_map(&syr_cpus, *cpu, XDP_PASS);
		asm volatile("%[a] |= 0" : [a] "+r"(act));
	}
	if (act != XDP_REDIRECT)
		return syr_decided(&in, idx, SYR_STAT_FALLBACK, (int)act);
	syr_count_executor(key, idx);
	syr_rec_input(ctx, idx, SYR_STAT_EXECUTOR_BASE + idx);
	return XDP_REDIRECT;
}

char _license[] SEC("license") = "Dual BSD/GPL";

#endif
