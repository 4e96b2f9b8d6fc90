/*
 * own_mount.c — rename() and symlink() through the daemon's own mount, made
 * by a child process that holds no descriptor at all, so none of the
 * session's /dev/fuse descriptors (own_mount.h says why).
 *
 * The child is made the way posix_spawn() makes one: clone() with CLONE_VM
 * and CLONE_VFORK, on a small stack of the calling thread, with every signal
 * blocked.  It shares the daemon's memory (no page table is copied, nothing is
 * torn down at its exit) and only the calling thread waits while it runs; it
 * has its own descriptor table, which it empties before the call.  A fork()
 * of the daemon cost 0.5-1 ms per call here (its heap, thread stacks and
 * sqlite's pages are copied on write and torn down at exit), and a cluster
 * commit makes two such calls per node, on every node, in the critical path
 * (docs/benchmarks.md, "Commit latency").
 *
 * The child runs only raw system calls (close_range or close, rename or
 * symlink, exit_group): no sanitizer's interceptor, no malloc, no lock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
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

/* The child's stack (bytes): it makes four system calls. */
#define CHILD_STACK 16384

struct child_call {
	int op;
	const char *a, *b;
};

/*
 * The child: close every inherited descriptor (not the session's /dev/fuse
 * descriptor only, nor only the per-worker clones of the multi-threaded loop:
 * it needs none), make the call, exit with its errno.  Raw system calls only:
 * it runs in the daemon's memory, on the calling thread's TLS, and a libc or
 * sanitizer wrapper could take a lock another thread holds.
 */
__attribute__((no_sanitize_address, no_sanitize_thread, noinline))
static int child_main(void *arg)
{
	const struct child_call *c = arg;
	long r;

	if (syscall(SYS_close_range, 3U, ~0U, 0U) < 0)
		for (long i = 3; i < 65536; i++)
			syscall(SYS_close, i);
	r = c->op == OP_RENAME ? syscall(SYS_rename, c->a, c->b)
			       : syscall(SYS_symlink, c->a, c->b);
	r = r < 0 ? (errno > 0 && errno < 256 ? errno : EIO) : 0;
	syscall(SYS_exit_group, r);
	return (int)r; /* not reached */
}

/* Run @op(@a, @b) in a child without the FUSE descriptor; returns 0 or -errno. */
static int in_child(int op, const char *a, const char *b)
{
	int fd = __atomic_load_n(&fuse_fd, __ATOMIC_ACQUIRE), st, r;
	struct child_call c = {op, a, b};
	char stack[CHILD_STACK] __attribute__((aligned(64)));
	sigset_t all, old;
	pid_t pid;

	if (fd < 0) {
		r = op == OP_RENAME ? rename(a, b) : symlink(a, b);
		return r < 0 ? -errno : 0;
	}
	/* no signal handler may run in the child, on our memory */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	/* CLONE_VFORK: this thread resumes once the child has exited */
	pid = clone(child_main, stack + sizeof(stack), CLONE_VM | CLONE_VFORK | SIGCHLD, &c);
	r = pid < 0 ? -errno : 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r < 0)
		return r;
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
