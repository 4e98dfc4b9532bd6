/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The XDP root program: one per interface, owned by syrupd. It parses the frame
 * (Ethernet, up to two VLAN tags, IPv4 or IPv6 with extension headers, UDP or TCP),
 * finds the application that claimed (protocol, destination port) in syr_xdp_ports and
 * tail-calls that application's policy through syr_xdp_apps (a direct jump: see
 * dispatch()).
 *
 * Invariants:
 *  - a policy is only ever reached for a frame whose L4 header lies entirely inside the
 *    linear data: every header is bounds-checked here before its fields are read;
 *  - everything else (unclaimed ports, non-IP, fragments, malformed headers, an empty
 *    slot) is passed to the stack untouched and counted;
 *  - the root never drops; only a policy's SYR_DROP drops.
 *
 * Beside other XDP programs (kernels with BPF trampolines), libxdp's dispatcher runs the
 * root as one of up to ten programs, in order of run priority, going on to the next
 * program after the actions its run config lists (libxdp's protocol.org). The root's
 * priority, SYR_XDP_RUN_PRIO, is after firewalls (xdp-filter: 10) and programs at libxdp's
 * default (50): a frame the root steers to a core or an AF_XDP socket, or a policy drops,
 * ends the chain, so what must see every frame runs first. XDP_PASS (unclaimed ports, and
 * a policy's SYR_PASS) chains on: the frame was not Syrup's to take.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include <syrup/xdp_abi.h>

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, SYR_XDP_MAX_APPS);
	__type(key, __u32);
	__type(value, __u32);
} syr_xdp_apps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SYR_XDP_PORT_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} syr_xdp_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct syr_xdp_meta);
} syr_xdp_meta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SYR_XDP_ROOT_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} syr_xdp_root_stats SEC(".maps");

/* libxdp's run config (XDP_RUN_CONFIG(syr_xdp_root) of <xdp/xdp_helpers.h>, spelled out:
 * syrupd compiles this file with the kernel's and libbpf's headers only), read from
 * this object's BTF. */
#define SYR_XDP_RUN_PRIO 200
struct {
	__uint(priority, SYR_XDP_RUN_PRIO);
	__uint(XDP_PASS, 1);
} _syr_xdp_root SEC(".xdp_run_config");

struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

struct ip6_ext {
	__u8 nexthdr;
	__u8 hdrlen;
};

/* Largest L4 offset we parse to; deeper headers are treated as malformed. */
#define MAX_L4_OFF 512

static __always_inline void add(__u32 slot, __u64 n)
{
	__u64 *c = bpf_map_lookup_elem(&syr_xdp_root_stats, &slot);

	if (c)
		*c += n;
}

static __always_inline int count(__u32 slot, int action)
{
	add(slot, 1);
	return action;
}

/*
 * The tail call into the application's slot, one call site per slot with a constant
 * index. The verifier records a constant key per call site and the x86-64 JIT turns
 * such a call into a direct jump it re-patches whenever syrupd changes the slot; an
 * index in a register instead makes an indirect jump, which pays for this kernel's
 * Spectre v2 mitigation (a retpoline): 16 to 20 ns per packet here (bench/README.md).
 * The switch compiles to a tree of compares over all SYR_XDP_MAX_APPS slots, so a
 * packet pays the same ten compares whatever the slot and however many applications
 * the interface has. The kernel allows 1024 such call sites per program
 * (bpf_jit_add_poke_descriptor()), which is why there is no other tail call here.
 */
#define SYR_TC1(n)                                                                    \
	case (n):                                                                     \
		bpf_tail_call_static(ctx, &syr_xdp_apps, (n));                        \
		return;
#define SYR_TC4(n) SYR_TC1(n) SYR_TC1((n) + 1) SYR_TC1((n) + 2) SYR_TC1((n) + 3)
#define SYR_TC16(n) SYR_TC4(n) SYR_TC4((n) + 4) SYR_TC4((n) + 8) SYR_TC4((n) + 12)
#define SYR_TC64(n) SYR_TC16(n) SYR_TC16((n) + 16) SYR_TC16((n) + 32) SYR_TC16((n) + 48)
#define SYR_TC256(n) SYR_TC64(n) SYR_TC64((n) + 64) SYR_TC64((n) + 128) SYR_TC64((n) + 192)
_Static_assert(SYR_XDP_MAX_APPS == 1024, "one constant-index tail call site per slot");

static __always_inline void dispatch(struct xdp_md *ctx, __u32 slot)
{
	switch (slot) {
		SYR_TC256(0)
		SYR_TC256(256)
		SYR_TC256(512)
		SYR_TC256(768)
	}
}

SEC("xdp")
int syr_xdp_root(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u32 off = sizeof(*eth), hash;
	__u16 proto;
	__u8 l4;

	if ((void *)(eth + 1) > end)
		return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
	proto = eth->h_proto;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		struct vlan_hdr *vh = data + off;
		if ((void *)(vh + 1) > end)
			return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
		proto = vh->proto;
		off += sizeof(*vh);
	}

	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + off;
		if ((void *)(ip + 1) > end)
			return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
		if (ip->ihl < 5 || ip->version != 4)
			return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
		if (ip->frag_off & bpf_htons(0x3fff)) /* MF or a fragment offset */
			return count(SYR_XDP_ROOT_FRAGMENT, XDP_PASS);
		l4 = ip->protocol;
		hash = ip->saddr ^ ip->daddr;
		off += ip->ihl * 4;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + off;
		if ((void *)(ip6 + 1) > end)
			return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
		l4 = ip6->nexthdr;
		hash = ip6->saddr.in6_u.u6_addr32[3] ^ ip6->daddr.in6_u.u6_addr32[3];
		off += sizeof(*ip6);
#pragma unroll
		for (int i = 0; i < 6; i++) {
			if (l4 != IPPROTO_HOPOPTS && l4 != IPPROTO_ROUTING && l4 != IPPROTO_DSTOPTS &&
			    l4 != IPPROTO_FRAGMENT && l4 != IPPROTO_AH)
				break;
			if (l4 == IPPROTO_FRAGMENT)
				return count(SYR_XDP_ROOT_FRAGMENT, XDP_PASS);
			if (off > MAX_L4_OFF)
				return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
			struct ip6_ext *ext = data + off;
			if ((void *)(ext + 1) > end)
				return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
			/* The length is in the units of this header's own type. */
			off += l4 == IPPROTO_AH ? (ext->hdrlen + 2) * 4 : (ext->hdrlen + 1) * 8;
			l4 = ext->nexthdr;
		}
	} else {
		return count(SYR_XDP_ROOT_NOT_L4, XDP_PASS);
	}

	if (off > MAX_L4_OFF)
		return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
	__u16 dport;
	if (l4 == IPPROTO_UDP) {
		struct udphdr *udp = data + off;
		if ((void *)(udp + 1) > end)
			return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
		dport = bpf_ntohs(udp->dest);
		hash ^= (__u32)udp->source << 16 | udp->dest;
	} else if (l4 == IPPROTO_TCP) {
		struct tcphdr *tcp = data + off;
		if ((void *)(tcp + 1) > end)
			return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
		if (tcp->doff < 5 || data + off + tcp->doff * 4 > end)
			return count(SYR_XDP_ROOT_MALFORMED, XDP_PASS);
		dport = bpf_ntohs(tcp->dest);
		hash ^= (__u32)tcp->source << 16 | tcp->dest;
	} else {
		return count(SYR_XDP_ROOT_NOT_L4, XDP_PASS);
	}

	__u32 idx = SYR_XDP_PORT_INDEX(l4 == IPPROTO_TCP, dport);
	__u32 *owner = bpf_map_lookup_elem(&syr_xdp_ports, &idx);
	if (!owner || !*owner)
		return count(SYR_XDP_ROOT_UNCLAIMED, XDP_PASS);
	__u32 slot = *owner - 1;
	__u32 zero = 0;
	struct syr_xdp_meta *meta = bpf_map_lookup_elem(&syr_xdp_meta, &zero);
	if (!meta)
		return count(SYR_XDP_ROOT_NO_POLICY, XDP_PASS);
	meta->l4_off = off;
	meta->ip_protocol = l4;
	meta->hash = hash * 0x9e3779b1U;
	meta->slot = slot;
	/* Counted before the call (a successful tail call does not return) and taken back
	 * when the slot turns out empty. One path into dispatch(): a second copy of its
	 * switch would need a second set of call sites, past the kernel's limit. */
	add(SYR_XDP_ROOT_DISPATCHED, 1);
	dispatch(ctx, slot);
	add(SYR_XDP_ROOT_DISPATCHED, -1);
	return count(SYR_XDP_ROOT_NO_POLICY, XDP_PASS);
}

char _license[] SEC("license") = "Dual BSD/GPL";
