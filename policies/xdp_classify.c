/*
 * xdp_classify: the XDP half of a cross-layer pair (with socket_local.c).
 *
 * At the XDP hook it reads the request type (a __u32 at type_offset, the first payload
 * byte after the UDP header by default), weighs the request (long_cost for long_type,
 * 1 otherwise), steers it to the core with the least outstanding work and adds the
 * weight to core_work[core]. The application subtracts the weight when it has served the
 * request. The socket-select half reads the same map, by name.
 */
#include <syrup/policy.h>

SYR_PARAM(__u32, type_offset, 8);
SYR_PARAM(__u32, long_type, 2);
SYR_PARAM(__u64, long_cost, 70);

SYR_ARRAY(core_work, __u64, SYR_MAX_EXECUTORS);

SYR_POLICY(struct syr_input *in)
{
	__u32 type = 0, best = 0;
	__u64 best_work = ~0ULL;

	if (syr_read_u32(in, type_offset, &type))
		return SYR_PASS;
	for (__u32 i = 0; i < SYR_MAX_EXECUTORS && i < syr_num_executors; i++) {
		__u32 k = i;
		__u64 *w = syr_map_lookup(&core_work, &k);
		if (w && *w < best_work) {
			best_work = *w;
			best = i;
		}
	}
	__u64 *w = syr_map_lookup(&core_work, &best);
	if (!w)
		return SYR_PASS;
	__sync_fetch_and_add(w, type == long_type ? long_cost : 1);
	return best;
}
