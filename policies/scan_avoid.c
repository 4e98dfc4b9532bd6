/*
 * scan_avoid: avoid executors busy with a long request (a SCAN).
 *
 * scan_map[i] counts the long requests executor i holds (non-zero: busy with one). The
 * policy adds one when it steers a long request there; the application takes one off
 * when it finishes one (an atomic decrement through syr_map_mmap()), and, for a long
 * request no policy counted, marks the executor while it serves it. The policy goes
 * round robin over the executors that are not marked, so it never picks a marked
 * executor while an unmarked one exists and the free ones share the load evenly; if all
 * are marked it goes round robin over all of them.
 *
 * Counting when it steers (request type == long_type, a little-endian __u32 at byte
 * type_offset, as in sita) makes requests steered after a long one avoid its executor at
 * once, not only once the application starts it; counting, not setting a flag, keeps an
 * executor marked until the last long request queued there is done. The price: a
 * request counted here that never reaches the application (the kernel drops it at a
 * full socket buffer; the application rejects it as malformed) must be taken off by the
 * application too, or its executor stays marked for good. examples/rocksdb/kv_server
 * takes it off when it rejects one, and clears the count of an executor that is idle
 * with nothing queued at its socket.
 *
 * A long request never takes the last keep_free unmarked executors: while no more are
 * free it queues behind another long one (round robin over the marked executors), so
 * short requests always find an executor that is not busy with a long one, however many
 * long ones are outstanding (sita's guarantee, without fixing which executors serve
 * long requests). keep_free = 0: long requests avoid marked executors like any other.
 */
#include <syrup/policy.h>

SYR_PARAM(__u32, type_offset, 8);
SYR_PARAM(__u32, long_type, 2);
SYR_PARAM(__u32, keep_free, 0); /* unmarked executors kept for short requests */

SYR_ARRAY(scan_map, __u64, SYR_MAX_EXECUTORS);

/* The executor picked last; the next request starts looking after it. Concurrent runs
 * on other cores may read the same value and pick the same executor: harmless. */
static __u32 last;

static __always_inline int busy(__u32 idx)
{
	__u64 *mark = syr_map_lookup(&scan_map, &idx);

	return mark && *mark;
}

static __always_inline int is_long(struct syr_input *in)
{
	__u32 type;

	return syr_read_u32(in, type_offset, &type) == 0 && type == long_type;
}

static __always_inline __u32 mark_long(__u32 idx)
{
	__u64 *m = syr_map_lookup(&scan_map, &idx);

	if (m)
		__sync_fetch_and_add(m, 1);
	return idx;
}

/* Scans are bpf_loop() callbacks: verified once, not per executor and speculative path.
 * c[3]: the result. */
static long count_free(__u32 k, void *arg)
{
	__u32 *c = arg;

	return c[3] = !busy(k) && ++c[0] > keep_free;
}

/* More than keep_free executors unmarked? */
static __always_inline int more_free_than_kept(__u32 n)
{
	__u32 c[4] = {};

	bpf_loop(n < SYR_MAX_EXECUTORS ? n : SYR_MAX_EXECUTORS, count_free, c, 0);
	return c[3];
}

static long fit_one(__u32 k, void *arg)
{
	__u32 *c = arg, i = c[0] ? (c[1] + k) % c[0] : 0;

	if (busy(i) != c[2])
		return 0;
	c[3] = i;
	return 1;
}

/* The first executor after the one picked last that is unmarked (want_marked = 0) or
 * marked (1): a round robin that skips the others. n if none fits. */
static __always_inline __u32 next_fit(__u32 n, __u32 start, int want_marked)
{
	__u32 c[4] = {n, start, want_marked, n};

	bpf_loop(n < SYR_MAX_EXECUTORS ? n : SYR_MAX_EXECUTORS, fit_one, c, 0);
	return c[3];
}

SYR_POLICY(struct syr_input *in)
{
	__u32 n = syr_num_executors, start = last + 1, i;
	int long_req = is_long(in);

	if (long_req && keep_free && !more_free_than_kept(n)) {
		/* Behind another long request, if there is one. */
		i = next_fit(n, start, 1);
		if (i < n) {
			last = i;
			return mark_long(i);
		}
	}
	i = next_fit(n, start, 0);
	if (i >= n)
		i = start % n; /* all marked: round robin over all */
	last = i;
	return long_req ? mark_long(i) : i;
}
