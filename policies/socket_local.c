/*
 * socket_local: the socket-select half of a cross-layer pair (with xdp_classify.c).
 *
 * Socket i is served by a worker on core i. A datagram goes to the socket of the core
 * that processed it (where xdp_classify steered it, so its data is in that core's
 * cache), unless that core's outstanding work, as the XDP policy recorded it in
 * core_work, exceeds max_local_work while another core has less: then to that core's
 * socket.
 */
#include <syrup/policy.h>

SYR_PARAM(__u64, max_local_work, 1000);

SYR_ARRAY(core_work, __u64, SYR_MAX_EXECUTORS);

SYR_POLICY(struct syr_input *in)
{
	__u32 n = syr_num_executors, local = syr_cpu() % n, best = local;
	__u64 *lw = syr_map_lookup(&core_work, &local);

	if (!lw || *lw <= max_local_work)
		return local;
	__u64 best_work = *lw;
	/* The others, from the local core on (so the search starts at an unknown index and
	 * the verifier sees one path per core, not one per candidate it could keep). */
	for (__u32 i = 1; i < SYR_MAX_EXECUTORS && i < n; i++) {
		__u32 k = (local + i) % n;
		__u64 *w = syr_map_lookup(&core_work, &k);
		if (w && *w < best_work) {
			best_work = *w;
			best = k;
		}
	}
	return best;
}
