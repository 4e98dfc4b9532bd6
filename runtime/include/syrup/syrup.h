/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * libsyrup: deploy Syrup policies from an application and talk to their maps.
 *
 * Every call that can fail returns 0 (or a non-negative id/fd) on success and a
 * negative errno on failure; syr_last_error() then returns the full message, including
 * the compiler's diagnostics or the verifier's log. The application needs no capability:
 * syrupd does the privileged work and identifies the caller by its Unix credentials.
 *
 * Thread safety: calls may be made from any thread; the last error is per thread.
 */
#ifndef SYRUP_SYRUP_H
#define SYRUP_SYRUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <syrup/abi.h> /* SYR_PASS, SYR_DROP, SYR_MAX_EXECUTORS */

#ifdef __cplusplus
extern "C" {
#endif

enum syr_hook {
	SYR_HOOK_SOCKET_SELECT = 1, /* SO_REUSEPORT group: datagram/connection -> socket */
	SYR_HOOK_XDP = 2,           /* packet -> core or AF_XDP socket */
	SYR_HOOK_THREAD = 3,        /* thread -> core */
	SYR_HOOK_SOCKET_LOOKUP = 4, /* new connection/datagram for a port range -> socket */
};

/* A deploy-time parameter of the policy (a SYR_PARAM in its source). */
struct syr_param {
	const char *name;
	uint64_t value;
};

/*
 * Options of syr_deploy_policy(). Zero-initialise, set .sz = sizeof(struct
 * syr_deploy_opts), then fill what you need; fields added later keep older callers
 * working.
 */
struct syr_deploy_opts {
	size_t sz;
	/* Application the policy belongs to; policies of one application share maps.
	 * Default: syr_set_app(), else the SYRUP_APP environment variable, else the
	 * program's name. */
	const char *app;
	/* Executors for the socket-select hook: the application's SO_REUSEPORT sockets of
	 * one group, executor i = fds[i]. They are passed to syrupd with the request. */
	const int *fds;
	size_t n_fds;
	/* Instead of fds: take the sockets of process `pid` bound to `port` (root, or the
	 * process's owner, only). Executor order: ascending fd number in that process. */
	int pid;
	uint16_t port;
	/* Values for the policy's SYR_PARAMs. */
	const struct syr_param *params;
	size_t n_params;
	/* XDP: keep the policy after the deploying process exits (default: removed with it).
	 * Socket-select and thread policies end with the process they schedule: persist
	 * there is refused (-EINVAL): their executors close with that process. */
	bool persist;
	/* Name shown for the policy (default: the file name of `path`). */
	const char *name;
	/* XDP: the interface whose packets the policy sees, and the destination ports it
	 * schedules (`port` and/or `ports`). Executors: `cpus` (redirect to those cores),
	 * else `fds` as AF_XDP sockets bound to the interface, else every core. */
	const char *ifname;
	const uint16_t *ports;
	size_t n_ports;
	const int *cpus;
	size_t n_cpus;
	/* "udp" (default) or "tcp": the protocol of `port`/`ports`. */
	const char *protocol;
	/* Socket-select with `pid`: the address of the group's sockets ("127.0.0.1", "::"),
	 * needed when the process has several SO_REUSEPORT groups on `port`. */
	const char *address;
	/* Socket-lookup: the steered ports are [port, port_end] (0: `port` alone); `protocol`
	 * names their protocol, `address` (optional) the local address steered. */
	uint16_t port_end;
};

/* Compiles the policy at `path` for `hook` and deploys it. Returns the policy id (> 0)
 * or a negative errno. Deploying to a socket group that already has a policy of the
 * same application replaces it atomically. */
int syr_deploy_policy(const char *path, enum syr_hook hook, const struct syr_deploy_opts *opts);

/* Same, with the policy's source text in memory; `name` is used in diagnostics. */
int syr_deploy_policy_source(const char *source, size_t len, const char *name,
			     enum syr_hook hook, const struct syr_deploy_opts *opts);

/* Removes a policy; the hook returns to the kernel's default behaviour. */
int syr_remove_policy(int policy_id);

/* The message of the calling thread's last failure ("" if none): syrupd's error, the
 * compiler's diagnostics with file and line, or the tail of the verifier log. */
const char *syr_last_error(void);

/* Sets the default application name for this process. Without it, the default is the
 * application of the process's first successful deploy, else SYRUP_APP, else the
 * program's name. */
int syr_set_app(const char *app);

/* Opens a map of the default application by name. Returns a map fd or -errno. */
int syr_map_open(const char *name);
/* Same, for a named application. */
int syr_map_open_app(const char *app, const char *name);

int syr_map_lookup_elem(int map_fd, const void *key, void *value);
int syr_map_update_elem(int map_fd, const void *key, const void *value, uint64_t flags);

/* The mmap fast path for array maps declared with SYR_ARRAY (BPF_F_MMAPABLE):
 * after syr_map_mmap(), a hint is a plain store to syr_array_elem(). */
struct syr_mapped_array {
	void *base;
	size_t mapped_len;
	uint32_t value_size;
	uint32_t stride; /* bytes between elements (value_size rounded up to 8) */
	uint32_t max_entries;
};

/* Maps the array behind map_fd into *out: 0, or a negative errno with *out zeroed. The
 * mapping outlives map_fd: the caller may close it at once. A negative map_fd (a failed
 * syr_map_open()'s result, passed on unchecked) is returned as it is, syr_last_error()
 * still saying why the open failed. */
int syr_map_mmap(int map_fd, struct syr_mapped_array *out);
void syr_map_munmap(struct syr_mapped_array *arr);

static inline void *syr_array_elem(const struct syr_mapped_array *arr, uint32_t index)
{
	return (char *)arr->base + (size_t)index * arr->stride;
}

/* Stores a 64-bit hint into element `index` of a mapped __u64 array (no syscall). */
static inline void syr_hint_set(const struct syr_mapped_array *arr, uint32_t index, uint64_t value)
{
	__atomic_store_n((uint64_t *)syr_array_elem(arr, index), value, __ATOMIC_RELAXED);
}

static inline uint64_t syr_hint_get(const struct syr_mapped_array *arr, uint32_t index)
{
	return __atomic_load_n((uint64_t *)syr_array_elem(arr, index), __ATOMIC_RELAXED);
}

/*
 * The thread hook. After the application has deployed a thread policy
 * (syr_deploy_policy(..., SYR_HOOK_THREAD, ...)), each thread it wants scheduled by it
 * registers as an executor; the policy sees the index as `t->executor` and uses it to
 * read the application's hints (SYR_ARRAY maps indexed by executor). Threads that do
 * not register keep the kernel's normal scheduling. Registration names the calling
 * thread only, and only threads of the process the policy was deployed for are ever
 * scheduled by it. Register again after the policy was removed and deployed anew.
 */
/* Registers the calling thread as executor `executor_index` (< SYR_MAX_EXECUTORS). The
 * policy may schedule the thread before this call returns: under a policy that keeps it
 * waiting (a FIFO behind always-busy threads, say) its next line runs only when the
 * policy, the starvation guard or the watchdog lets it. A thread that must report back
 * first (a pool starting up) should be registered by another with
 * syr_thread_register_tid(). */
int syr_thread_register(uint32_t executor_index);
/* Registers thread `tid` (its gettid()) of this process as executor `executor_index`,
 * as if it had called syr_thread_register() itself: its syr_cs_enter()/syr_cs_exit()
 * count for that executor from its next call on. -ESRCH if `tid` is not a thread of this
 * process. In a pid namespace of its own (a container), syrupd translates `tid` to the
 * kernel's number, which policies see as syr_thread.tid. */
int syr_thread_register_tid(pid_t tid, uint32_t executor_index);
/* Unregisters the calling thread: it returns to normal scheduling. */
int syr_thread_unregister(void);
/* Unregisters thread `tid` of this process (or one this process registered, even if it
 * has exited): 0 also if it was not registered; -ESRCH for another process's thread. */
int syr_thread_unregister_tid(pid_t tid);
/* Marks the start and end of a critical section of the calling (registered) thread:
 * a store into the mapped syrup_cs map, no syscall. Sections nest. Policies such as
 * cs_aware avoid preempting a thread inside one. No effect if the thread is not
 * registered. Not async-signal-safe: after a registration changed, the next call takes
 * libsyrup's registration lock to find the thread's counter, so a signal handler that
 * interrupted syr_thread_register*() or syr_thread_unregister*() must not call them. */
void syr_cs_enter(void);
void syr_cs_exit(void);

/*
 * Opens the `n` sockets of one SO_REUSEPORT group, the executors of the socket-select
 * hook: each of `type` (SOCK_DGRAM or SOCK_STREAM, SOCK_NONBLOCK/SOCK_CLOEXEC may be
 * or-ed in), SO_REUSEPORT set, bound to `addr` (IPv4 or IPv6); fds[i] is executor i.
 * With port 0 in `addr` the group gets a port no other socket holds, and the port is
 * written back to `addr`. Use it instead of binding port 0 yourself: given port 0 with
 * SO_REUSEPORT set, the kernel may pick a port another SO_REUSEPORT group of the same
 * user already holds, and the socket joins that group, so the two share one policy and
 * each other's traffic. (A program of the same user that binds port 0 with SO_REUSEPORT
 * itself can still land on the group's port, during this call or later; only a fixed
 * port or this call in every program rules that out.) TCP sockets still need listen().
 * Returns 0, or a negative errno with no socket left open and every fds[i] set to -1.
 */
int syr_open_reuseport_group(int type, struct sockaddr *addr, socklen_t addrlen, int *fds,
			     size_t n);

/* Path of the control socket used: SYRUP_SOCKET from the environment, else
 * /run/syrup/syrupd.sock. */
const char *syr_socket_path(void);

#ifdef __cplusplus
}
#endif

#endif /* SYRUP_SYRUP_H */
