/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Events the thread hook's tracer (thread_tracer.bpf.c) sends the user-space agent
 * through its ring buffer. Plain C, shared by BPF and user space. */
#ifndef SYRUP_THREAD_EVENTS_H
#define SYRUP_THREAD_EVENTS_H

enum syr_tev_type {
	SYR_TEV_WAKEUP = 1,     /* tid became runnable on cpu */
	SYR_TEV_NEW = 2,        /* tid was created and is runnable */
	SYR_TEV_SWITCH_IN = 3,  /* tid started running on cpu */
	SYR_TEV_SWITCH_OUT = 4, /* tid stopped running; arg = prev_state (0: still runnable) */
	SYR_TEV_EXIT = 5,       /* tid exited */
};

struct syr_tev {
	unsigned long long ts; /* bpf_ktime_get_ns */
	unsigned int type;
	unsigned int tid;
	unsigned int cpu;
	unsigned int arg;
};

/* Slots of the tracer's counters array. */
enum {
	SYR_TCNT_EVENTS = 0,
	SYR_TCNT_DROPPED = 1,        /* ring buffer full */
	SYR_TCNT_PREEMPT = 2,        /* a registered thread was switched out while runnable */
	SYR_TCNT_PREEMPT_IN_CS = 3,  /* ... while inside a critical section (syrup_cs) */
	SYR_TCNT_NR = 4,
};

#endif
