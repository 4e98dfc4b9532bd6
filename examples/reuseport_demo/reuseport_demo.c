/*
 * reuseport_demo: the smallest real Syrup application, in plain C.
 *
 * It opens N SO_REUSEPORT UDP sockets on one port (its "workers"), deploys a policy on
 * them with syr_deploy_policy(), sends itself a stream of requests from ONE client
 * socket (one 5-tuple, the kernel hash's worst case) and prints which worker got what.
 * Requests carry a __u32 type (1 = short, 2 = long) and a __u32 key. With --busy it
 * marks worker 0 as busy in the policy's scan_map through the mmap'ed map first (for
 * scan_avoid). With --linger S it keeps the policy deployed S seconds after reporting
 * (so `syrupctl list` / `stats` can look at it). The policy is removed at exit.
 *
 *   reuseport_demo [--workers N] [--requests N] [--long-every K] [--busy] [--linger S] POLICY.c
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <syrup/syrup.h>

#define MAX_WORKERS 64

/*
 * Worker w serves what its socket holds: counts each request (total, short, long) and
 * finishes it at once. A long request that scan_avoid counted into scan_map[w] when it
 * steered it there is taken off again when it is done, as the policy's contract asks of
 * the application (policies/scan_avoid.c); without that every worker would soon look
 * busy and the policy would fall back to round robin over all of them.
 */
static void serve(int fd, int w, long got[3], const struct syr_mapped_array *scan)
{
	uint32_t r[4];

	while (recv(fd, r, sizeof(r), 0) >= 8) {
		got[0]++;
		got[r[0] == 2 ? 2 : 1]++;
		if (r[0] == 2 && scan->base) {
			uint64_t *mark = syr_array_elem(scan, (uint32_t)w);
			uint64_t v = __atomic_load_n(mark, __ATOMIC_RELAXED);

			while (v && !__atomic_compare_exchange_n(mark, &v, v - 1, 0, __ATOMIC_RELAXED,
								 __ATOMIC_RELAXED))
				;
		}
	}
}

static void usage(void)
{
	fprintf(stderr, "usage: reuseport_demo [--workers N] [--requests N] [--long-every K] [--busy] [--linger S] POLICY.c\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int workers = 4, requests = 1000, long_every = 50, busy = 0, linger = 0;
	const char *policy = NULL;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--workers") && i + 1 < argc)
			workers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--requests") && i + 1 < argc)
			requests = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--long-every") && i + 1 < argc)
			long_every = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--linger") && i + 1 < argc)
			linger = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--busy"))
			busy = 1;
		else if (argv[i][0] == '-' || policy)
			usage();
		else
			policy = argv[i];
	}
	if (!policy || workers < 1 || workers > MAX_WORKERS || requests < 1 || long_every < 1)
		usage();

	int fds[MAX_WORKERS], buf = 4 << 20;
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	/* A fresh port of its own; see syr_open_reuseport_group() for why not a plain bind. */
	int err = syr_open_reuseport_group(SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
					   (struct sockaddr *)&addr, sizeof(addr), fds, workers);
	if (err) {
		fprintf(stderr, "reuseport_demo: %s\n", syr_last_error());
		return 1;
	}
	uint16_t port = ntohs(addr.sin_port);
	for (int i = 0; i < workers; i++)
		setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));

	struct syr_deploy_opts opts = { .sz = sizeof(opts), .app = "reuseport_demo",
					.fds = fds, .n_fds = (size_t)workers };
	int id = syr_deploy_policy(policy, SYR_HOOK_SOCKET_SELECT, &opts);
	if (id < 0) {
		fprintf(stderr, "reuseport_demo: deploying %s failed (%s):\n%s\n", policy,
			strerror(-id), syr_last_error());
		return 1;
	}
	printf("deployed %s as policy %d on udp/127.0.0.1:%u with %d workers\n", policy, id,
	       port, workers);

	struct syr_mapped_array scan = { 0 };
	if (busy) {
		int mfd = syr_map_open("scan_map");
		if (mfd < 0 || syr_map_mmap(mfd, &scan)) {
			fprintf(stderr, "reuseport_demo: --busy needs a policy with scan_map: %s\n",
				syr_last_error());
			syr_remove_policy(id);
			return 1;
		}
		syr_hint_set(&scan, 0, 1); /* a plain store: worker 0 is busy with a SCAN */
		printf("marked worker 0 busy in scan_map (mmap'ed store)\n");
	}

	int client = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				   .sin_port = htons(port) };
	long got[MAX_WORKERS][3] = { { 0 } }; /* per worker: total, short, long */
	for (int i = 0; i < requests; i++) {
		uint32_t req[4] = { (i % long_every == 0) ? 2 : 1, (uint32_t)i, 0, 0 };
		if (sendto(client, req, sizeof(req), 0, (struct sockaddr *)&dst, sizeof(dst)) < 0) {
			perror("reuseport_demo: sendto");
			break;
		}
		/* Drain as we go so no socket buffer ever fills. */
		for (int w = 0; w < workers; w++)
			serve(fds[w], w, got[w], &scan);
	}
	usleep(100 * 1000);
	for (int w = 0; w < workers; w++)
		serve(fds[w], w, got[w], &scan);

	printf("%-8s %8s %8s %8s\n", "worker", "total", "short", "long");
	long total = 0;
	for (int w = 0; w < workers; w++) {
		printf("%-8d %8ld %8ld %8ld\n", w, got[w][0], got[w][1], got[w][2]);
		total += got[w][0];
	}
	printf("%ld of %d requests received\n", total, requests);
	fflush(stdout);
	if (linger > 0)
		sleep((unsigned)linger);

	if (scan.base)
		syr_map_munmap(&scan);
	if (syr_remove_policy(id))
		fprintf(stderr, "reuseport_demo: remove: %s\n", syr_last_error());
	close(client);
	for (int w = 0; w < workers; w++)
		close(fds[w]);
	return total == requests ? 0 : 1;
}
