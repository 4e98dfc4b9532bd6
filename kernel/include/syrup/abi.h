/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Constants shared by the BPF side (policies, hook wrappers) and user space
 * (syrupd, libsyrup). Plain C, no kernel or libc includes, so both sides can use it.
 * Changing a value here changes the policy ABI: see docs/policy-abi.md.
 */
#ifndef SYRUP_ABI_H
#define SYRUP_ABI_H

/* Special return values of a policy; any other value is an executor index. */
#define SYR_PASS 0xffffffffU /* let the kernel choose, as if no policy were attached */
#define SYR_DROP 0xfffffffeU /* drop the input (only when the policy says so) */

/* Most executors one policy can be deployed with. */
#define SYR_MAX_EXECUTORS 256

/*
 * Slots of the per-policy statistics map (`syr_stats`, a per-CPU array of __u64):
 * decisions that returned SYR_PASS, SYR_DROP, an index that could not be honoured
 * (past the executors or a missing socket: the kernel's choice was used), and then one
 * slot per executor for decisions that were enforced.
 */
#define SYR_STAT_PASS 0
#define SYR_STAT_DROP 1
#define SYR_STAT_FALLBACK 2
#define SYR_STAT_EXECUTOR_BASE 3
#define SYR_STAT_SLOTS (SYR_STAT_EXECUTOR_BASE + SYR_MAX_EXECUTORS)

/* Names the hook wrappers give their system objects; user maps may not start with "syr_". */
#define SYR_SYSTEM_PREFIX "syr_"
#define SYR_EXECUTORS_MAP "syr_executors"
#define SYR_STATS_MAP "syr_stats"
#define SYR_NUM_EXECUTORS_VAR "syr_num_executors"

#endif /* SYRUP_ABI_H */
