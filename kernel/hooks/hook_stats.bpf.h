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

/*
 * syr_keys[i] == i: the keys of the wrappers' map lookups, in read-only data instead of
 * on the stack. Tenant programs are loaded without CAP_PERFMON, so the verifier follows
 * every store into a stack slot not written before on that path with a speculation
 * barrier (Spectre v4; an lfence on x86-64), and a key on the stack is such a store per
 * lookup: 2 to 4 lfences per decision, most of what the wrappers cost over a
 * hand-written program (bench/README.md). A key read from a frozen map costs a load.
 * Keys that depend on the policy's answer (the executor's) share one stack slot.
 */
#define SYR_KEYS4(n) (n), (n) + 1, (n) + 2, (n) + 3
#define SYR_KEYS16(n) SYR_KEYS4(n), SYR_KEYS4((n) + 4), SYR_KEYS4((n) + 8), SYR_KEYS4((n) + 12)
#define SYR_KEYS64(n) SYR_KEYS16(n), SYR_KEYS16((n) + 16), SYR_KEYS16((n) + 32), SYR_KEYS16((n) + 48)
#define SYR_KEYS256(n) SYR_KEYS64(n), SYR_KEYS64((n) + 64), SYR_KEYS64((n) + 128), SYR_KEYS64((n) + 192)
_Static_assert(SYR_STAT_SLOTS == 259, "syr_keys covers every stats slot");
static const __u32 syr_keys[SYR_STAT_SLOTS] = {SYR_KEYS256(0), 256, 257, 258};
#undef SYR_KEYS4
#undef SYR_KEYS16
#undef SYR_KEYS64
#undef SYR_KEYS256

/* A pointer to the key i, a constant. A variable index stays on the stack: pointer
 * arithmetic into syr_keys is refused for unprivileged code when the index is a constant
 * on one path to it and not on another, as a policy's answer can be. */
#define syr_key(i) (&syr_keys[(i)])

/* Counts one decision in `slot`. A constant slot's key comes from syr_keys; any other
 * from the stack. */
static __always_inline void syr_count(__u32 slot)
{
	__u64 *c;

	if (__builtin_constant_p(slot)) {
		c = bpf_map_lookup_elem(&syr_stats, syr_key(slot));
	} else {
		__u32 key = slot;

		c = bpf_map_lookup_elem(&syr_stats, &key);
	}
	if (c)
		*c += 1;
}

/* Counts a decision enforced with executor idx, its key written into *key: where the
 * wrapper already put idx's own key (a stack slot, which the verifier then fences only
 * at its first store: one barrier per decision, not one per key; or a map value). */
static __always_inline void syr_count_executor(__u32 *key, __u32 idx)
{
	*key = SYR_STAT_EXECUTOR_BASE + idx;
	__u64 *c = bpf_map_lookup_elem(&syr_stats, key);

	if (c)
		*c += 1;
}

#endif /* SYRUP_HOOK_STATS_H */
