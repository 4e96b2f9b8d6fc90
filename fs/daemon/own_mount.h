/*
 * own_mount.h — a daemon's own calls through its own FUSE mount, made safe
 * against SIGKILL.
 *
 * The daemon seals a publish, flips `current` and seals a replicated version
 * by calling rename() on its own mount, so that the kernel's dentry
 * caches and inotify watchers see the change as they would from any process.
 * Made from one of its own threads, such a call can never end if the daemon
 * is killed with SIGKILL after one of its FUSE workers read the request and
 * before it answered: the calling thread then waits uninterruptibly for the
 * answer, the process can never finish dying, so the /dev/fuse descriptor is
 * never closed and the connection never aborted (a zombie whose mount hangs
 * every process that touches it, seen in test_kill9_during_publish).
 *
 * So the call is made by a short-lived child process instead, which first
 * closes every descriptor it inherited (the session's /dev/fuse descriptor
 * and the per-worker clones of the multi-threaded loop among them): when the
 * daemon dies, its descriptors close with it, the kernel aborts the connection, and the
 * child's call fails with ENOTCONN.  Thread-safe; the child makes only raw
 * system calls (close_range or close, rename, exit_group).
 */
#ifndef HWFS_OWN_MOUNT_H
#define HWFS_OWN_MOUNT_H

#include <sys/types.h>

/**
 * own_mount_set_fd() - the FUSE session's /dev/fuse descriptor of this
 * process (-1: none; the calls below are then made directly).  Set once,
 * after the session is mounted and before any thread calls below.
 */
void own_mount_set_fd(int fd);

/** rename(@from, @to) through the mount.  Returns 0 or -errno (errno is set too). */
int own_mount_rename(const char *from, const char *to);

/**
 * own_mount_is_child() - is process @pid a child of this process (one of the
 * children above, making its call through the mount)?  1 or 0; a process
 * that is gone, or whose parent cannot be read, is not.
 */
int own_mount_is_child(pid_t pid);

#endif /* HWFS_OWN_MOUNT_H */
