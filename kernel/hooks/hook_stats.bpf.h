/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The decision counters every hook wrapper keeps: syr_stats, one per-CPU __u64 per slot
 * (the slot layout is in abi.h: SYR_STAT_*, then one per executor). syrupd sums the CPUs
 * for `syrupctl stats` and the metrics. Per-CPU, so counting needs no atomic and costs
 * a lookup and an add.
 */
#ifndef SYRUP_HOOK_STATS_H
#define SYRUP_HOOK_STATS_H

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SYR_STAT_SLOTS);
} syr_stats SEC(".maps");

static __always_inline void syr_count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&syr_stats, &slot);

	if (c)
		*c += 1;
}

#endif /* SYRUP_HOOK_STATS_H */
