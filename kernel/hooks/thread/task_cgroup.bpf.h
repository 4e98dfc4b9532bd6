/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * A task's cgroup v2 id, for thread policies deployed by cgroup: the tracer of the agent
 * backend (tracer.bpf.c) and the sched_ext root (scx_common.h) read it the same way.
 *
 * The kernel types are CO-RE views of only the fields read; the includer's own
 * `struct task_struct` view must have `struct css_set *cgroups`. The pointers are
 * BTF-typed in both program types (tp_btf, struct_ops), so they are read directly; a
 * task whose css_set is being switched reads one of the two.
 */
#ifndef SYRUP_HOOK_THREAD_TASK_CGROUP_H
#define SYRUP_HOOK_THREAD_TASK_CGROUP_H

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup {
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct css_set {
	struct cgroup *dfl_cgrp;
} __attribute__((preserve_access_index));

/* The id of task `p`'s cgroup on the v2 hierarchy (its inode number, as
 * name_to_handle_at / the cgroup's directory give it). */
#define SYR_TASK_CGROUP_ID(p) ((p)->cgroups->dfl_cgrp->kn->id)

#endif
