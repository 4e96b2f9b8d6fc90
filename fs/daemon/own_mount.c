/*
 * own_mount.c — rename() through the daemon's own mount, made
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
 * commit makes such a call on every node, in the critical path (the flip of
 * `current`; docs/benchmarks.md, "Commit latency").
 *
 * The child runs only raw system calls (close_range or close, rename,
 * exit_group): no sanitizer's interceptor, no malloc, no lock.
 *
 * Under ThreadSanitizer the child is a plain fork(): its runtime intercepts
 * clone() as a fork, and with CLONE_VM the child's half of that bookkeeping
 * lands in the daemon's own state (the daemon then dies at its next
 * pthread_create, "starting new threads after multi-threaded fork").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "own_mount.h"

static int fuse_fd = -1; /* set once before the threads that call below start */

void own_mount_set_fd(int fd)
{
	__atomic_store_n(&fuse_fd, fd, __ATOMIC_RELEASE);
}

#if defined(__SANITIZE_THREAD__) /* GCC */
#define OWN_MOUNT_FORK 1
#elif defined(__has_feature) /* clang */
#if __has_feature(thread_sanitizer)
#define OWN_MOUNT_FORK 1
#endif
#endif
#ifndef OWN_MOUNT_FORK
#define OWN_MOUNT_FORK 0
#endif

/* The child's stack (bytes): it makes three system calls. */
#define CHILD_STACK 16384

struct child_call {
	const char *from, *to;
};

/* @r (a raw system call's result) as an exit status: 0 or an errno below 256. */
__attribute__((no_sanitize_address, no_sanitize_thread))
static long child_status(long r)
{
	return r < 0 ? (errno > 0 && errno < 256 ? errno : EIO) : 0;
}

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
	r = child_status(syscall(SYS_rename, c->from, c->to));
	syscall(SYS_exit_group, r);
	return (int)r; /* not reached */
}

/* Run @c in a child without the FUSE descriptor; returns 0 or -(its exit status): an errno. */
static int in_child(const struct child_call *c)
{
	int fd = __atomic_load_n(&fuse_fd, __ATOMIC_ACQUIRE), st, r;
	char stack[CHILD_STACK] __attribute__((aligned(64)));
	sigset_t all, old;
	pid_t pid;

	if (fd < 0) /* no session (unit tests): the call itself, here */
		return rename(c->from, c->to) < 0 ? -errno : 0;
	/* no signal handler may run in the child, on our memory */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (OWN_MOUNT_FORK) {
		pid = fork();
		if (pid == 0)
			child_main((void *)c); /* does not return */
	} else { /* CLONE_VFORK: this thread resumes once the child has exited */
		pid = clone(child_main, stack + sizeof(stack), CLONE_VM | CLONE_VFORK | SIGCHLD,
			    (void *)c);
	}
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
	struct child_call c = {.from = from, .to = to};
	int r = in_child(&c);

	if (r < 0)
		errno = -r;
	return r;
}

int own_mount_is_child(pid_t pid)
{
	char path[64], buf[512], *p;
	int fd, ppid = 0;
	ssize_t n;

	if (pid <= 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* "pid (comm) state ppid ...": comm may hold spaces and parentheses */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %*c %d", &ppid) != 1)
		return 0;
	return ppid == (int)getpid();
}
