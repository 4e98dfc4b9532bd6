/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * What the XDP root program (kernel/hooks/xdp/root.bpf.c) and the XDP policy wrapper
 * (kernel/hooks/xdp/wrapper.bpf.h) share, and what syrupd writes into their maps.
 * See docs/policy-abi.md ("The XDP hook").
 */
#ifndef SYRUP_XDP_ABI_H
#define SYRUP_XDP_ABI_H

#include <syrup/abi.h>

/* Applications (prog-array slots) one interface's root program can dispatch to. */
#define SYR_XDP_MAX_APPS 1024
/* syr_xdp_ports is an array indexed by (protocol, destination port): an array lookup
 * costs about half of a hash lookup on the per-packet path (bench/README.md). Its value
 * is the owning application's prog-array slot plus one; 0 means unclaimed. */
#define SYR_XDP_PORT_SLOTS (2 * 65536)
#define SYR_XDP_PORT_INDEX(is_tcp, port) ((is_tcp) ? 65536u + (port) : (__u32)(port))

/* What the root program parsed, handed to the policy through a per-CPU scratch map
 * (a tail call keeps the CPU and the context, not the registers). */
struct syr_xdp_meta {
	__u32 l4_off;      /* offset of the UDP/TCP header from the start of the frame */
	__u32 ip_protocol;
	__u32 hash;        /* a flow hash of addresses and ports */
	__u32 slot;
};

/* Executors of an XDP policy: cores (redirect through a CPUMAP) or AF_XDP sockets. */
#define SYR_XDP_EXEC_CPU 0
#define SYR_XDP_EXEC_XSK 1

/* Slots of the root program's per-CPU statistics (syr_xdp_root_stats). */
#define SYR_XDP_ROOT_UNCLAIMED 0  /* parsed fine, no application owns the port: passed */
#define SYR_XDP_ROOT_NOT_L4 1     /* not IPv4/IPv6 UDP/TCP (ARP, ICMP, ...): passed */
#define SYR_XDP_ROOT_FRAGMENT 2   /* IP fragment: passed to the stack for reassembly */
#define SYR_XDP_ROOT_MALFORMED 3  /* truncated or inconsistent headers: passed */
#define SYR_XDP_ROOT_DISPATCHED 4 /* handed to an application's policy */
#define SYR_XDP_ROOT_NO_POLICY 5  /* the slot was empty (tail call failed): passed */
#define SYR_XDP_ROOT_SLOTS 6

#define SYR_XDP_META_MAP "syr_xdp_meta"
#define SYR_XDP_CPUS_MAP "syr_cpus"
#define SYR_XDP_XSKS_MAP "syr_xsks"
#define SYR_XDP_EXEC_CPU_MAP "syr_exec_cpu"
#define SYR_XDP_KIND_VAR "syr_executor_kind"

#endif /* SYRUP_XDP_ABI_H */
