/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The socket-select hook wrapper: included by syrupd after the policy source, it turns
 * the policy's syr_schedule() into an SK_REUSEPORT program attached to the
 * application's SO_REUSEPORT group.
 *
 * Invariants:
 *  - the only way to drop an input is the policy returning SYR_DROP; an index past the
 *    executors, or a slot whose socket is gone, falls back to the kernel's hash choice;
 *  - every decision is counted in syr_stats (see abi.h for the slot layout), and
 *    recorded after it is enforced while a recording runs (recording.bpf.h);
 *  - executors are the application's sockets in syr_executors, slot i = executor i,
 *    filled by syrupd before the program is attached.
 */
#ifndef SYRUP_HOOK_SOCKET_SELECT_H
#define SYRUP_HOOK_SOCKET_SELECT_H

#include "hook_stats.bpf.h"

/* What a recording keeps of a datagram (recording.bpf.h): the fields the policy got. */
#define SYR_REC_INPUT_FROM_CTX(in, ctx)                                              \
	({                                                                             \
		struct sk_reuseport_md *__md = (ctx);                                  \
		(in)->len = __md->len;                                                 \
		(in)->hash = __md->hash;                                               \
		(in)->ip_protocol = __md->ip_protocol;                                 \
		(in)->ctx = __md;                                                      \
		1;                                                                     \
	})
#include "recording.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SYR_MAX_EXECUTORS);
} syr_executors SEC(".maps");

SEC("sk_reuseport")
int syr_socket_select(struct sk_reuseport_md *md)
{
	struct syr_input in = {
		.data = md->data,
		.data_end = md->data_end,
		.len = md->len,
		.hash = md->hash,
		.ip_protocol = md->ip_protocol,
		.ctx = md,
	};
	__u32 idx = syr_schedule(SYR_POLICY_ARG(&in));

	if (idx == SYR_DROP) {
		syr_count(SYR_STAT_DROP);
		syr_rec_input(md, idx, SYR_STAT_DROP);
		return SK_DROP;
	}
	if (idx == SYR_PASS) {
		syr_count(SYR_STAT_PASS);
		syr_rec_input(md, idx, SYR_STAT_PASS);
		return SK_PASS;
	}
	__u32 key = idx;

	if (idx >= syr_num_executors || idx >= SYR_MAX_EXECUTORS ||
	    bpf_sk_select_reuseport(md, &syr_executors, &key, 0) != 0) {
		syr_count(SYR_STAT_FALLBACK);
		syr_rec_input(md, idx, SYR_STAT_FALLBACK);
		return SK_PASS; /* nothing selected: the kernel hashes */
	}
	syr_count_executor(&key, idx);
	syr_rec_input(md, idx, SYR_STAT_EXECUTOR_BASE + idx);
	return SK_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";

#endif
