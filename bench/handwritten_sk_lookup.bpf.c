/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * handwritten_sk_lookup: the sk_lookup round robin one would write by hand without
 * Syrup, the baseline syrup_bench socket-lookup compares Syrup's round_robin policy at
 * the socket-lookup hook with.
 *
 * Same work as Syrup's wrapper around policies/round_robin.c where it matters to the
 * kernel: the protocol and port range check that lets programs share a namespace, a
 * shared counter modulo a load-time constant, a SOCKMAP lookup and bpf_sk_assign. None
 * of Syrup's statistics, bounds check on the index or 4-tuple hash. syrup_bench sets the
 * constants before load and fills socks with the same listeners.
 *
 * handwritten_sk_lookup_counted is the same program plus the one thing Syrup's wrapper
 * adds on the assigning path: a per-CPU counter per executor (kernel/hooks/
 * hook_stats.bpf.h), so the bench can say what the rest of the difference is.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 256);
} socks SEC(".maps");

const volatile __u32 num_socks = 1;
const volatile __u32 protocol = 6;
const volatile __u32 port_lo = 1, port_hi = 0;

static __u32 next;

SEC("sk_lookup")
int handwritten_sk_lookup(struct bpf_sk_lookup *ctx)
{
	struct bpf_sock *sk;
	__u32 idx;

	if (ctx->protocol != protocol || ctx->local_port < port_lo || ctx->local_port > port_hi)
		return SK_PASS;
	idx = __sync_fetch_and_add(&next, 1) % num_socks;
	sk = bpf_map_lookup_elem(&socks, &idx);
	if (!sk)
		return SK_PASS;
	bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	return SK_PASS;
}

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 259);
} counts SEC(".maps");

SEC("sk_lookup")
int handwritten_sk_lookup_counted(struct bpf_sk_lookup *ctx)
{
	struct bpf_sock *sk;
	__u32 idx, slot;
	__u64 *c;
	long err;

	if (ctx->protocol != protocol || ctx->local_port < port_lo || ctx->local_port > port_hi)
		return SK_PASS;
	idx = __sync_fetch_and_add(&next, 1) % num_socks;
	sk = bpf_map_lookup_elem(&socks, &idx);
	if (!sk)
		return SK_PASS;
	err = bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	slot = err ? 2 : 3 + idx;
	c = bpf_map_lookup_elem(&counts, &slot);
	if (c)
		*c += 1;
	return SK_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
