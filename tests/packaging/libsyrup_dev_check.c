/* Built by tests/packaging/package_test.py against the installed libsyrup-dev, with
 * `pkg-config --cflags --libs libsyrup` only: deploys the shipped round_robin.c for a UDP
 * group of two sockets through the installed syrupd and checks four datagrams of one
 * flow land two on each socket (the kernel's hash alone would put all four on one). */
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>
#include <syrup/syrup.h>

static int count(int fd)
{
	char buf[16];
	int n = 0;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	while (poll(&p, 1, 200) == 1 && recv(fd, buf, sizeof buf, 0) > 0)
		n++;
	return n;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s POLICY.c\n", argv[0]);
		return 2;
	}
	int fds[2];
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (syr_open_reuseport_group(SOCK_DGRAM, (struct sockaddr *)&a, sizeof(a), fds, 2) < 0) {
		fprintf(stderr, "syr_open_reuseport_group: %s\n", syr_last_error());
		return 1;
	}
	struct syr_deploy_opts o = { .sz = sizeof(o), .app = "pkgtest-lib", .fds = fds, .n_fds = 2 };
	int id = syr_deploy_policy(argv[1], SYR_HOOK_SOCKET_SELECT, &o);
	if (id < 0) {
		fprintf(stderr, "syr_deploy_policy: %s\n", syr_last_error());
		return 1;
	}
	int c = socket(AF_INET, SOCK_DGRAM, 0);
	for (int i = 0; i < 4; i++)
		sendto(c, "x", 1, 0, (struct sockaddr *)&a, sizeof(a));
	int n0 = count(fds[0]), n1 = count(fds[1]);
	printf("policy %d via %s: socket 0 got %d, socket 1 got %d\n", id, syr_socket_path(), n0, n1);
	if (syr_remove_policy(id) < 0)
		fprintf(stderr, "syr_remove_policy: %s\n", syr_last_error());
	return n0 == 2 && n1 == 2 ? 0 : 1;
}
