/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The socket-lookup hook's part of <syrup/policy.h> (syrupd names it in
 * SYR_HOOK_POLICY_INPUT): what a policy at this hook sees.
 *
 * The input is a new TCP connection (its SYN) or a UDP datagram for which the kernel is
 * about to look up a local socket. It carries no payload: struct syr_input's `len` is 0
 * and `data` NULL, so syr_read() and syr_ptr() always fail. `hash` is a hash of the
 * 4-tuple (both addresses and ports), the same for every packet of one flow, and
 * `ip_protocol` is IPPROTO_TCP or IPPROTO_UDP. The addresses and ports are read with the
 * accessors below, which take the input the policy was given.
 *
 * Invariant: every accessor reads a fixed field of the kernel's struct bpf_sk_lookup (a
 * constant offset the verifier checks); none calls a helper, so the hook's allowlist
 * needs nothing for them.
 */
#ifndef SYRUP_SOCKET_LOOKUP_POLICY_INPUT_H
#define SYRUP_SOCKET_LOOKUP_POLICY_INPUT_H

#define SYR_POLICY_WANTS(fn) SYR_POLICY_WANTS_INPUT(fn)
#define SYR_POLICY_WRONG_HOOK SYR_POLICY_WRONG_HOOK_INPUT

/* No payload: syr_read() finds every offset outside the input before it gets here. */
static __always_inline int syr_hook_read(const struct syr_input *in, __u32 off, void *dst, __u32 len)
{
	return -1;
}

#define syr_lookup_ctx(in) ((const struct bpf_sk_lookup *)(in)->ctx)

/* AF_INET or AF_INET6: the family of the packet (an IPv4 connection to a dual-stack
 * socket is AF_INET). */
static __always_inline __u32 syr_lookup_family(const struct syr_input *in)
{
	return syr_lookup_ctx(in)->family;
}

/* The port the client connected (or sent) to, and the client's port: host byte order. */
static __always_inline __u16 syr_lookup_local_port(const struct syr_input *in)
{
	return (__u16)syr_lookup_ctx(in)->local_port;
}

static __always_inline __u16 syr_lookup_remote_port(const struct syr_input *in)
{
	return bpf_ntohs(syr_lookup_ctx(in)->remote_port);
}

/* IPv4 addresses, network byte order (0 for an IPv6 packet). */
static __always_inline __u32 syr_lookup_local_ip4(const struct syr_input *in)
{
	return syr_lookup_ctx(in)->local_ip4;
}

static __always_inline __u32 syr_lookup_remote_ip4(const struct syr_input *in)
{
	return syr_lookup_ctx(in)->remote_ip4;
}

/* IPv6 addresses into `out`, four words in network byte order (zeros for IPv4). */
static __always_inline void syr_lookup_local_ip6(const struct syr_input *in, __u32 out[4])
{
	const struct bpf_sk_lookup *c = syr_lookup_ctx(in);

	out[0] = c->local_ip6[0];
	out[1] = c->local_ip6[1];
	out[2] = c->local_ip6[2];
	out[3] = c->local_ip6[3];
}

static __always_inline void syr_lookup_remote_ip6(const struct syr_input *in, __u32 out[4])
{
	const struct bpf_sk_lookup *c = syr_lookup_ctx(in);

	out[0] = c->remote_ip6[0];
	out[1] = c->remote_ip6[1];
	out[2] = c->remote_ip6[2];
	out[3] = c->remote_ip6[3];
}

#endif /* SYRUP_SOCKET_LOOKUP_POLICY_INPUT_H */
