/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The socket-lookup hook wrapper: included by syrupd after the policy source, it turns
 * the policy's syr_schedule() into an SK_LOOKUP program that syrupd attaches to a
 * network namespace (one bpf_link per policy).
 *
 * Invariants:
 *  - a lookup outside the policy's claim (protocol, local port range, local address, set
 *    by syrupd before load as read-only data) returns SK_PASS untouched and is not
 *    counted: several policies share a namespace, each sees only its own claim;
 *  - the only way to refuse a connection or datagram is the policy returning SYR_DROP; an
 *    index past the executors, or a slot whose socket has closed, leaves the lookup to
 *    the kernel (SYR_STAT_FALLBACK), as SYR_PASS does;
 *  - every decision on the claim is counted in syr_stats (abi.h's slot layout), and
 *    recorded while a recording runs (recording.bpf.h);
 *  - executors are the application's sockets in syr_executors (a SOCKMAP), slot i =
 *    executor i, filled by syrupd before the link is made.
 */
#ifndef SYRUP_HOOK_SOCKET_LOOKUP_WRAPPER_H
#define SYRUP_HOOK_SOCKET_LOOKUP_WRAPPER_H

#include "hook_stats.bpf.h"

/* What a recording keeps of a lookup besides hash and protocol (recording.bpf.h). */
#define SYR_REC_HOOK_CONTEXT(e, in) syr_sl_rec_context(&(e)->packet, syr_lookup_ctx(in))
#define syr_sl_rec_context(p, c)                                                     \
	do {                                                                           \
		(p)->family = (c)->family;                                             \
		(p)->local_port = (__u16)(c)->local_port;                              \
		(p)->remote_port = bpf_ntohs((c)->remote_port);                        \
		if ((c)->family == 2 /* AF_INET */) {                                  \
			(p)->local_ip[0] = (c)->local_ip4;                             \
			(p)->remote_ip[0] = (c)->remote_ip4;                           \
		} else {                                                               \
			(p)->local_ip[0] = (c)->local_ip6[0];                          \
			(p)->local_ip[1] = (c)->local_ip6[1];                          \
			(p)->local_ip[2] = (c)->local_ip6[2];                          \
			(p)->local_ip[3] = (c)->local_ip6[3];                          \
			(p)->remote_ip[0] = (c)->remote_ip6[0];                        \
			(p)->remote_ip[1] = (c)->remote_ip6[1];                        \
			(p)->remote_ip[2] = (c)->remote_ip6[2];                        \
			(p)->remote_ip[3] = (c)->remote_ip6[3];                        \
		}                                                                      \
	} while (0)

/* The claim, set by syrupd (hooks/socket_lookup). family 0: any local address. */
const volatile __u32 syr_sl_protocol = 0;
const volatile __u32 syr_sl_port_lo = 1;
const volatile __u32 syr_sl_port_hi = 0;
const volatile __u32 syr_sl_family = 0;
const volatile __u32 syr_sl_addr0 = 0, syr_sl_addr1 = 0, syr_sl_addr2 = 0, syr_sl_addr3 = 0;

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SYR_MAX_EXECUTORS);
} syr_executors SEC(".maps");

static __always_inline int syr_sl_claimed(const struct bpf_sk_lookup *c)
{
	if (c->protocol != syr_sl_protocol || c->local_port < syr_sl_port_lo || c->local_port > syr_sl_port_hi)
		return 0;
	if (syr_sl_family == 0)
		return 1;
	if (c->family != syr_sl_family)
		return 0;
	if (syr_sl_family == 2 /* AF_INET */)
		return c->local_ip4 == syr_sl_addr0;
	return c->local_ip6[0] == syr_sl_addr0 && c->local_ip6[1] == syr_sl_addr1 &&
	       c->local_ip6[2] == syr_sl_addr2 && c->local_ip6[3] == syr_sl_addr3;
}

/* murmur3's finalizer over the 4-tuple: the same for every packet of a flow. */
static __always_inline __u32 syr_sl_hash(const struct bpf_sk_lookup *c)
{
	__u32 h = c->remote_ip4 ^ c->local_ip4 ^ c->remote_ip6[0] ^ c->remote_ip6[1] ^ c->remote_ip6[2] ^
		  c->remote_ip6[3] ^ c->local_ip6[3];

	h ^= ((__u32)c->remote_port << 16) | (c->local_port & 0xffff);
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

#define SYR_REC_INPUT_FROM_CTX(in, ctx)                                              \
	({                                                                             \
		struct bpf_sk_lookup *__c = (ctx);                                     \
		(in)->hash = syr_sl_hash(__c);                                         \
		(in)->ip_protocol = __c->protocol;                                     \
		(in)->ctx = __c;                                                       \
		1;                                                                     \
	})
#include "recording.bpf.h"

SEC("sk_lookup")
int syr_socket_lookup(struct bpf_sk_lookup *c)
{
	struct bpf_sock *sk;
	__u32 idx;
	long err;

	if (!syr_sl_claimed(c))
		return SK_PASS;
	struct syr_input in = {
		.hash = syr_sl_hash(c),
		.ip_protocol = c->protocol,
		.ctx = c,
	};
	idx = syr_schedule(SYR_POLICY_ARG(&in));
	if (idx == SYR_DROP) {
		syr_count(SYR_STAT_DROP);
		syr_rec_input(c, idx, SYR_STAT_DROP);
		return SK_DROP;
	}
	if (idx == SYR_PASS) {
		syr_count(SYR_STAT_PASS);
		syr_rec_input(c, idx, SYR_STAT_PASS);
		return SK_PASS;
	}
	__u32 key = idx;

	sk = idx < syr_num_executors && idx < SYR_MAX_EXECUTORS ? bpf_map_lookup_elem(&syr_executors, &key) : 0;
	if (!sk) {
		syr_count(SYR_STAT_FALLBACK);
		syr_rec_input(c, idx, SYR_STAT_FALLBACK);
		return SK_PASS; /* the kernel's own lookup */
	}
	err = bpf_sk_assign(c, sk, 0);
	bpf_sk_release(sk);
	if (err)
		syr_count(SYR_STAT_FALLBACK);
	else
		syr_count_executor(&key, idx);
	syr_rec_input(c, idx, err ? SYR_STAT_FALLBACK : SYR_STAT_EXECUTOR_BASE + idx);
	return SK_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";

#endif
