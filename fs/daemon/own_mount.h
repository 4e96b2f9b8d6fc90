/*
 * own_mount.h — a daemon's own calls through its own FUSE mount, made safe
 * against SIGKILL.
 *
 * The daemon seals a publish, flips `current` and seals a replicated version
 * by calling rename()/symlink() on its own mount, so that the kernel's dentry
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
 * child's call fails with ENOTCONN.  Thread-safe; the child calls only
 * async-signal-safe functions (close_range or close, rename, symlink, _exit).
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

/**
 * own_mount_set_bare_dev() - the device of the mountpoint directory before
 * the mount (stat() of it, made before mounting).  own_mount_flip() then
 * refuses (-ESHUTDOWN) a flip whose symlink landed there: the mount was
 * taken away from outside (umount(2)) before the daemon knew it stops.
 */
void own_mount_set_bare_dev(dev_t dev);

/** rename(@from, @to) through the mount.  Returns 0 or -errno (errno is set too). */
int own_mount_rename(const char *from, const char *to);

/**
 * own_mount_flip() - symlink(@target, @tmp) then rename(@tmp, @path), both
 * through the mount and in one child (a flip of `current` costs one child,
 * not two).  Between the two, *@stopping (read atomically) set means the
 * daemon is shutting down, and a symlink that landed on the bare mountpoint's
 * device means the mount is gone: the rename is not made (-ESHUTDOWN).  When the
 * rename is not made, @tmp is unlinked.  Returns 0 or -errno (errno is set
 * too), with *@step 1 when the symlink failed, 2 when the rename did, 0
 * otherwise.
 */
int own_mount_flip(const char *target, const char *tmp, const char *path, const int *stopping,
		   int *step);

/**
 * own_mount_is_child() - is process @pid a child of this process (one of the
 * children above, making its call through the mount)?  1 or 0; a process
 * that is gone, or whose parent cannot be read, is not.
 */
int own_mount_is_child(pid_t pid);

#endif /* HWFS_OWN_MOUNT_H */
