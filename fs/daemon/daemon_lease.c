/*
 * daemon_lease.c — what a long-lived connection holds and how it ends: a
 * lease (one shard reference per extent of a version, so that `hwfs rm` or
 * gc cannot free bytes still being read; `map` and device loads take them),
 * and the wait for the client to close the connection or its process to exit
 * (a pidfd beside the connection: a child that inherited the socket does not
 * keep a lease alive).  Used by daemon_engine_ops.c and daemon_gpu.c; it
 * calls no other file of the daemon.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon_i.h"

/* ----------------------------------------------------------- leases */

/* Room in @ml for one reference per extent of snapshot @rec (daemon_i.h).  0 or -ENOMEM. */
int daemon_map_lease_init(struct map_lease *ml, const struct hwfs_vrec *rec)
{
	size_t total = 0;

	for (size_t i = 0; i < rec->n_files; i++)
		total += rec->files[i].n_ext;
	ml->n = 0;
	ml->sh = malloc((total ? total : 1) * sizeof(*ml->sh));
	return ml->sh ? 0 : -ENOMEM;
}

/*
 * Take a reference on the shard of every extent of @f into @ml (daemon_i.h):
 * they are ml->sh[n], ... in extent order, n being ml->n before the call.
 * Returns 0, -ENOENT (a shard is gone: the version was removed meanwhile) or
 * -EIO (an extent that is not its whole shard); references taken stay in @ml.
 */
int daemon_map_lease_file(struct daemon *d, const struct hwfs_frec *f, struct map_lease *ml)
{
	for (size_t i = 0; i < f->n_ext; i++) {
		const struct hwfs_extent *e = &f->ext[i];
		struct shard *sh = store_get(d->st, &e->hash);

		if (!sh)
			return -ENOENT;
		ml->sh[ml->n++] = sh;
		if (sh->size != e->len)
			return -EIO;
	}
	return 0;
}

/* Drop every reference @ml holds and free it. */
void daemon_map_lease_drop(struct daemon *d, struct map_lease *ml)
{
	for (size_t i = 0; i < ml->n; i++)
		store_unref(d->st, ml->sh[i]);
	free(ml->sh);
	ml->sh = NULL;
	ml->n = 0;
}

/* ----------------------------------------------------------- the end of a connection */

/*
 * A descriptor that becomes readable when process @pid exits (pidfd_open),
 * so that a connection ends with the process that opened it, not with the
 * last process holding its socket.  Returns the descriptor (close-on-exec),
 * -1 when there is none to have (a kernel before 5.3, a peer in a pid
 * namespace we cannot see: pid 0, no descriptors left): the connection alone
 * tells the end then; or -ESRCH when the process exited already.
 */
int daemon_peer_pidfd(pid_t pid)
{
	int fd = -1;

#ifdef SYS_pidfd_open
	if (pid > 0)
		fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (fd < 0 && pid > 0 && errno == ESRCH)
		return -ESRCH;
#else
	(void)pid;
#endif
	return fd < 0 ? -1 : fd;
}

/*
 * Wait until connection @fd has something to read (data, EOF, reset,
 * shutdown) or the process of @pidfd (-1: none) exited.  Returns 0 (read
 * @fd now: it does not block), -ESRCH (the process exited), -errno.
 */
int daemon_wait_conn(int fd, int pidfd)
{
	struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};

	for (;;) {
		int n = poll(p, 2, -1); /* a negative fd is skipped */

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		return p[1].revents ? -ESRCH : 0;
	}
}

/*
 * Block until the client closes the connection @fd (or shutdown shuts it
 * down) or the process of @pidfd (-1: none) exits, reading and dropping
 * whatever the client sends (a plain read(): descriptors passed with it are
 * discarded by the kernel).  Returns -ESRCH when the process exited, else 0:
 * every other end (EOF, reset, shutdown) is the end.
 */
int daemon_wait_for_close(int fd, int pidfd)
{
	char buf[4096];

	for (;;) {
		ssize_t n;

		if (daemon_wait_conn(fd, pidfd) == -ESRCH)
			return -ESRCH;
		n = read(fd, buf, sizeof(buf));
		if (n > 0 || (n < 0 && errno == EINTR))
			continue;
		return 0;
	}
}
