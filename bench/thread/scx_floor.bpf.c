/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The floor of a sched_ext scheduler, for the ping-pong benchmark
 * (syrup_thread_bench pingpong --scx-floor): the least a partial-mode scheduler can do
 * -- a wakeup goes to the kernel's default core, straight into its local DSQ when that
 * core is idle, else into the global FIFO the kernel consumes itself. No maps, no policy,
 * no tail call. What Syrup's root and wrapper cost is measured against this; what this
 * costs against the fair class is sched_ext's own (bench/thread/README.md).
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "thread/scx_common.h"

#define SYR_FLOOR_DSQ_GLOBAL 0x8000000000000001ULL

SEC("struct_ops/floor_select_cpu")
__s32 BPF_PROG(floor_select_cpu, struct task_struct *p, __s32 prev_cpu, __u64 wake_flags)
{
	_Bool idle = 0;
	__s32 cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &idle);

	if (idle)
		scx_bpf_dsq_insert(p, SYR_SCX_DSQ_LOCAL, SYR_SCX_SLICE_NS, 0);
	return cpu;
}

SEC("struct_ops/floor_enqueue")
void BPF_PROG(floor_enqueue, struct task_struct *p, __u64 enq_flags)
{
	scx_bpf_dsq_insert(p, SYR_FLOOR_DSQ_GLOBAL, SYR_SCX_SLICE_NS, enq_flags);
}

struct sched_ext_ops {
	__s32 (*select_cpu)(struct task_struct *p, __s32 prev_cpu, __u64 wake_flags);
	void (*enqueue)(struct task_struct *p, __u64 enq_flags);
	__u64 flags;
	char name[128];
};

SEC(".struct_ops.link")
struct sched_ext_ops floor_ops = {
	.select_cpu = (void *)floor_select_cpu,
	.enqueue = (void *)floor_enqueue,
	.flags = SYR_SCX_OPS_SWITCH_PARTIAL,
	.name = "syrup_floor",
};

char _license[] SEC("license") = "GPL";
