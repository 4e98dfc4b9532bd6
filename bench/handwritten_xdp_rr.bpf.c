/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * handwritten_xdp_rr: the standalone XDP round robin one would write for one application
 * without Syrup, the baseline syrup_bench compares Syrup's root program + tail call +
 * round_robin policy with (xdp-cost, xdp-pps).
 *
 * It is attached to the interface by itself (no root program, no tail call, no
 * statistics): it parses Ethernet, IPv4 (or IPv6 without extension headers) and UDP the
 * way the root program does for such frames, leaves every frame that is not UDP to
 * `port` to the stack, and sends the application's frames to the cores in turn through
 * a CPUMAP, in the style of the kernel's samples/bpf/xdp_redirect_cpu: a shared counter
 * modulo a load-time constant, the core taken from an array, bpf_redirect_map() on the
 * CPUMAP with XDP_PASS as the fallback.
 *
 * handwritten_xdp_pass does the same parsing and port match and returns XDP_PASS for
 * every frame: the counterpart of Syrup's root + the `pass` policy.
 *
 * syrup_bench sets `port` and `num_cpus` before load and fills cpus_available and cpu_map.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define MAX_CPUS 256

struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32);
	__type(value, struct bpf_cpumap_val);
} cpu_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32);
	__type(value, __u32);
} cpus_available SEC(".maps");

const volatile __u16 port = 9000;
const volatile __u32 num_cpus = 1;

static __u32 next;

/* 1 if the frame is UDP to `port`, with its headers inside the linear data. */
static __always_inline int is_ours(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct udphdr *udp;

	if ((void *)(eth + 1) > end)
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end || ip->ihl < 5 || ip->version != 4)
			return 0;
		if (ip->frag_off & bpf_htons(0x3fff) || ip->protocol != IPPROTO_UDP)
			return 0;
		udp = (void *)ip + ip->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end || ip6->nexthdr != IPPROTO_UDP)
			return 0;
		udp = (void *)(ip6 + 1);
	} else {
		return 0;
	}
	if ((void *)(udp + 1) > end)
		return 0;
	return udp->dest == bpf_htons(port);
}

SEC("xdp")
int handwritten_xdp_rr(struct xdp_md *ctx)
{
	if (!is_ours(ctx))
		return XDP_PASS;
	__u32 idx = __sync_fetch_and_add(&next, 1) % num_cpus;
	__u32 *cpu = bpf_map_lookup_elem(&cpus_available, &idx);
	if (!cpu)
		return XDP_PASS;
	return bpf_redirect_map(&cpu_map, *cpu, XDP_PASS);
}

SEC("xdp")
int handwritten_xdp_pass(struct xdp_md *ctx)
{
	int ours = is_ours(ctx);

	/* Both outcomes are XDP_PASS; the empty asm keeps the compiler from dropping the
	 * parsing whose result nothing else uses. */
	asm volatile("" : : "r"(ours));
	return XDP_PASS;
}

/* The floor of a dispatch: one tail call alone, into a program that returns XDP_PASS.
 * handwritten_tail_direct's index is a constant (the JIT makes a direct jump, as for
 * Syrup's root); handwritten_tail_indirect reads it from memory the verifier cannot
 * see as constant (an indirect jump through this kernel's retpoline). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} tail_progs SEC(".maps");

__u32 tail_index; /* 0, written by nobody; a .bss load is not a constant to the verifier */

SEC("xdp")
int handwritten_tail_target(struct xdp_md *ctx)
{
	return XDP_PASS;
}

SEC("xdp")
int handwritten_tail_direct(struct xdp_md *ctx)
{
	bpf_tail_call_static(ctx, &tail_progs, 0);
	return XDP_ABORTED;
}

SEC("xdp")
int handwritten_tail_indirect(struct xdp_md *ctx)
{
	bpf_tail_call(ctx, &tail_progs, tail_index);
	return XDP_ABORTED;
}

char _license[] SEC("license") = "Dual BSD/GPL";
