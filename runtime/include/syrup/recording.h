/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The recording format: what `syrupctl record` writes and `syrupctl replay` reads, one
 * deployed policy's inputs and decisions. docs/recording.md describes it for readers in
 * other languages (examples/recording/read_recording.py).
 *
 * A recording is a file header (struct syr_rec_header) followed by records, each a
 * struct syr_rec_record (whose `type` says which kind) and, for inputs, `cap_len` bytes
 * of payload. Invariants:
 *  - every integer is little-endian; every record starts at an 8-byte aligned offset and
 *    its `size` (a multiple of 8) is the distance to the next one, so a reader skips
 *    records of a type it does not know;
 *  - header_size and record `size` are read from the file, never assumed: a later
 *    version may append fields to either, and readers of version 1 ignore what follows
 *    the fields they know. A change that moves or reinterprets a field raises `version`;
 *  - the last record of a complete recording is a SYR_REC_TRAILER with the counts of
 *    inputs that were not recorded; a file without one was cut short (the recorder was
 *    killed or the disk filled) and holds the inputs up to its last whole record.
 */
#ifndef SYRUP_RECORDING_H
#define SYRUP_RECORDING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SYR_REC_MAGIC "SYRUPREC" /* the 8 bytes of syr_rec_header.magic, no NUL */
#define SYR_REC_VERSION 1
#define SYR_REC_ALIGN 8
#define SYR_REC_NAME_MAX 64 /* policy and application names, NUL-padded */
/* The most payload bytes one record carries (the largest --snap). */
#define SYR_REC_SNAP_MAX 256

/* The file header, at offset 0. */
struct syr_rec_header {
	char magic[8];          /* SYR_REC_MAGIC */
	uint32_t version;       /* SYR_REC_VERSION */
	uint32_t header_size;   /* bytes of this header; the first record starts here */
	uint32_t hook;          /* enum syr_hook (syrup.h): 1 socket-select, 2 xdp, 3 thread,
				 * 4 socket-lookup */
	uint32_t n_executors;   /* the policy's executor count when the recording started */
	uint32_t snap_len;      /* payload bytes asked per input (cap_len <= snap_len) */
	uint32_t sample_every;  /* 1: every input was offered; N: one in N on average */
	uint64_t clock_mono_ns; /* CLOCK_MONOTONIC at the start (the records' clock) */
	uint64_t clock_real_ns; /* CLOCK_REALTIME at the same instant: wall time of a record
				 * is clock_real_ns + (ts_ns - clock_mono_ns) */
	uint64_t policy_id;
	char policy_name[SYR_REC_NAME_MAX]; /* as `syrupctl list` shows it */
	char app[SYR_REC_NAME_MAX];         /* the policy's application */
	uint32_t nr_cpus;       /* cores of the recording machine */
	uint32_t reserved;      /* 0 */
};

/* Kinds of record (syr_rec_record.type). */
#define SYR_REC_INPUT 1   /* a packet hook's input and its decision */
#define SYR_REC_THREAD 2  /* a thread hook's input and its decision */
#define SYR_REC_TRAILER 3 /* the end: counts of what was not recorded */

/* What the hook did with the decision (syr_rec_record.outcome): the slot of syr_stats
 * the decision was counted in (abi.h's SYR_STAT_PASS, _DROP, _FALLBACK), or
 * SYR_REC_ENFORCED when the input went to executor `decision`. */
#define SYR_REC_OUTCOME_PASS 0     /* = SYR_STAT_PASS */
#define SYR_REC_OUTCOME_DROP 1     /* = SYR_STAT_DROP */
#define SYR_REC_OUTCOME_FALLBACK 2 /* = SYR_STAT_FALLBACK: index past the executors, or
				    * its socket/core was gone: the kernel chose */
#define SYR_REC_OUTCOME_ENFORCED 3

/* What a packet hook's policy could read besides the payload (struct syr_input and the
 * socket-lookup accessors). Fields a hook does not have are 0. */
struct syr_rec_packet {
	uint32_t hash;        /* syr_input.hash */
	uint32_t ip_protocol; /* syr_input.ip_protocol: IPPROTO_UDP or IPPROTO_TCP */
	uint32_t l4_off;      /* XDP: offset of the L4 header in the frame */
	uint32_t family;      /* socket-lookup: AF_INET or AF_INET6 */
	uint16_t local_port;  /* socket-lookup: host byte order */
	uint16_t remote_port; /* socket-lookup: host byte order */
	uint32_t reserved;
	uint8_t local_ip[16];  /* socket-lookup: network byte order; IPv4 in bytes 0..3 */
	uint8_t remote_ip[16];
};

/* A thread hook's input: struct syr_thread (<syrup/policy.h>) as the policy was handed
 * it, and the two fields it may set, as it left them. */
struct syr_rec_thread {
	uint32_t tid;
	uint32_t tgid;
	uint32_t executor;
	uint32_t prev_cpu;
	uint32_t nr_cpus;
	uint32_t reason;      /* SYR_THREAD_* */
	uint64_t now_ns;
	uint64_t runnable_ns;
	uint64_t run_ns;
	uint64_t key;         /* in: the preset key */
	uint64_t slice_ns;    /* in: the preset slice */
	uint64_t key_out;     /* out: the key after the policy ran */
	uint64_t slice_out;   /* out: the slice after the policy ran */
};

/* One record. For SYR_REC_INPUT and SYR_REC_THREAD, `cap_len` payload bytes follow
 * (offset 0 of an input, i.e. its L4 header), then zeros up to `size`. */
struct syr_rec_record {
	uint32_t size;        /* bytes of this record, payload and padding included */
	uint16_t type;        /* SYR_REC_* */
	uint16_t flags;       /* 0 */
	uint64_t ts_ns;       /* CLOCK_MONOTONIC at the decision (bpf_ktime_get_ns) */
	union {
		struct {
			uint32_t decision;    /* the policy's return value: an executor index,
					       * SYR_PASS or SYR_DROP (abi.h) */
			uint32_t outcome;     /* SYR_REC_OUTCOME_* */
			uint32_t n_executors; /* the executor count the policy saw */
			uint32_t len;         /* the input's length (syr_input.len); 0 for
					       * socket-lookup and threads */
			uint32_t cap_len;     /* payload bytes that follow: min(len, snap_len) */
			uint32_t cpu;         /* the core that decided */
			union {
				struct syr_rec_packet packet; /* SYR_REC_INPUT */
				struct syr_rec_thread thread; /* SYR_REC_THREAD */
			};
		} in;
		/* SYR_REC_TRAILER: ts_ns is the end of the recording. Inputs the policy
		 * decided while the recording ran = recorded + the three not_recorded. */
		struct {
			uint64_t recorded;          /* records of inputs in the file */
			uint64_t not_sampled;       /* skipped by --sample */
			uint64_t not_recorded_full; /* the kernel's buffer was full */
			uint64_t not_recorded_quota;/* over the size quota, or the reader lagged */
			uint32_t end_reason;        /* SYR_REC_END_* */
			uint32_t reserved;
		} trailer;
	};
};

/* Why a recording ended (trailer.end_reason). */
#define SYR_REC_END_DONE 1     /* its --seconds or --count was reached */
#define SYR_REC_END_QUOTA 2    /* the size quota was reached */
#define SYR_REC_END_REMOVED 3  /* the policy was removed or replaced */
#define SYR_REC_END_STOPPED 4  /* the recorder stopped it (Ctrl-C) */

/* Bytes of a record carrying `cap_len` payload bytes. */
#define SYR_REC_RECORD_SIZE(cap_len) \
	((uint32_t)((sizeof(struct syr_rec_record) + (cap_len) + SYR_REC_ALIGN - 1) & ~(uint32_t)(SYR_REC_ALIGN - 1)))

#ifdef __cplusplus
}
#endif

#endif /* SYRUP_RECORDING_H */
