/* Test socket-select policy for the cross-layer thread test: request (u32 type, u32 key)
 * goes to executor key % n; it records in the shared scan_map whether that executor
 * was just handed a long request (type == long_type), which the thread policy get_first
 * reads. */
#include <syrup/policy.h>

SYR_PARAM(__u32, long_type, 2);
SYR_ARRAY(scan_map, __u64, SYR_MAX_EXECUTORS);

SYR_POLICY(struct syr_input *in)
{
	__u32 type, key, idx;
	__u64 *m;

	if (syr_read_u32(in, 8, &type) || syr_read_u32(in, 12, &key))
		return SYR_PASS;
	idx = key % syr_num_executors;
	m = bpf_map_lookup_elem(&scan_map, &idx);
	if (m)
		*m = type == long_type;
	return idx;
}
