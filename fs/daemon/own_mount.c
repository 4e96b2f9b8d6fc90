/*
 * own_mount.c — rename() and symlink() through the daemon's own mount, made
 * by a child process that holds no descriptor at all, so none of the
 * session's /dev/fuse descriptors (own_mount.h says why).  fork() costs little here: the arena is a shared file mapping, whose
 * page tables the kernel does not copy.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "own_mount.h"

static int fuse_fd = -1; /* set once before the threads that call below start */

void own_mount_set_fd(int fd)
{
	__atomic_store_n(&fuse_fd, fd, __ATOMIC_RELEASE);
}

enum { OP_RENAME, OP_SYMLINK };

/* Run @op(@a, @b) in a child without the FUSE descriptor; returns 0 or -errno. */
static int in_child(int op, const char *a, const char *b)
{
	int fd = __atomic_load_n(&fuse_fd, __ATOMIC_ACQUIRE), st, r;
	pid_t pid;

	if (fd < 0) {
		r = op == OP_RENAME ? rename(a, b) : symlink(a, b);
		return r < 0 ? -errno : 0;
	}
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		/*
		 * Hold no /dev/fuse descriptor: not the session's, nor the
		 * per-worker clones of the multi-threaded loop (clone_fd).  The
		 * child needs no descriptor at all, so it closes every one.
		 */
		if (syscall(SYS_close_range, 3U, ~0U, 0U) < 0)
			for (int i = 3; i < 65536; i++)
				close(i);
		r = op == OP_RENAME ? rename(a, b) : symlink(a, b);
		_exit(r < 0 ? (errno > 0 && errno < 256 ? errno : EIO) : 0);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	if (!WIFEXITED(st))
		return -EINTR; /* killed: the call may or may not have happened */
	return -WEXITSTATUS(st);
}

int own_mount_rename(const char *from, const char *to)
{
	int r = in_child(OP_RENAME, from, to);

	if (r < 0)
		errno = -r;
	return r;
}

int own_mount_symlink(const char *target, const char *path)
{
	int r = in_child(OP_SYMLINK, target, path);

	if (r < 0)
		errno = -r;
	return r;
}
