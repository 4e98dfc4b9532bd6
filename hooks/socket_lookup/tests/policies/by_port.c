/* by_port: the executor is the local port modulo the executors, so a test knows which
 * socket each port's connections and datagrams must reach. An input with a payload (which
 * this hook never has) is dropped, so a test sees it. */
#include <syrup/policy.h>

SYR_POLICY(struct syr_input *in)
{
	__u8 b;

	if (in->len != 0 || in->data || syr_read_u8(in, 0, &b) == 0)
		return SYR_DROP;
	return syr_lookup_local_port(in) % syr_num_executors;
}
