/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * handwritten_rr: the round robin one would write by hand for an SO_REUSEPORT group
 * without Syrup, the baseline syrup_bench compares Syrup's round_robin policy with.
 *
 * Same scheduling as policies/round_robin.c (a shared counter modulo a load-time
 * constant), but none of Syrup's wrapper: no bounds check on the index and no
 * statistics. syrup_bench loads it with libbpf, sets num_socks before load, fills socks
 * with the group's sockets and attaches it with SO_ATTACH_REUSEPORT_EBPF.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 256);
} socks SEC(".maps");

const volatile __u32 num_socks = 1;

static __u32 next;

SEC("sk_reuseport")
int handwritten_rr(struct sk_reuseport_md *md)
{
	__u32 idx = __sync_fetch_and_add(&next, 1) % num_socks;

	bpf_sk_select_reuseport(md, &socks, &idx, 0); /* on failure the kernel hashes */
	return SK_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
