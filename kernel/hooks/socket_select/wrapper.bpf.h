/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The socket-select hook wrapper: included by syrupd after the policy source, it turns
 * the policy's syr_schedule() into an SK_REUSEPORT program attached to the
 * application's SO_REUSEPORT group.
 *
 * Invariants:
 *  - the only way to drop an input is the policy returning SYR_DROP; an index past the
 *    executors, or a slot whose socket is gone, falls back to the kernel's hash choice;
 *  - every decision is counted in syr_stats (see abi.h for the slot layout);
 *  - executors are the application's sockets in syr_executors, slot i = executor i,
 *    filled by syrupd before the program is attached.
 */
#ifndef SYRUP_HOOK_SOCKET_SELECT_H
#define SYRUP_HOOK_SOCKET_SELECT_H

#include "hook_stats.bpf.h"

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
		return SK_DROP;
	}
	if (idx == SYR_PASS) {
		syr_count(SYR_STAT_PASS);
		return SK_PASS;
	}
	__u32 key = idx;

	if (idx >= syr_num_executors || idx >= SYR_MAX_EXECUTORS ||
	    bpf_sk_select_reuseport(md, &syr_executors, &key, 0) != 0) {
		syr_count(SYR_STAT_FALLBACK);
		return SK_PASS; /* nothing selected: the kernel hashes */
	}
	syr_count_executor(&key, idx);
	return SK_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";

#endif
