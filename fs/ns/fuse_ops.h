/*
 * fuse_ops.h — the FUSE low-level operations of the hwfs mount.
 *
 * The operations translate kernel requests into namespace calls (ns.h) and
 * answer with one reply each.  Inode numbers handed to the kernel are node
 * pointers (root excepted), kept valid by the lookup counts in ns.c; the
 * generation is the node's unique st_ino, so a reused pointer is never
 * mistaken for an old inode.
 */
#ifndef HWFS_FUSE_OPS_H
#define HWFS_FUSE_OPS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "ns.h"

/** Userdata of the FUSE session. */
struct fsctx {
	struct ns *ns;
	const char *ctl_path;           /* control socket, shown as xattr user.hwfs.control */
	void (*on_init)(void *arg);     /* called once the kernel handshake is done */
	void *arg;
	/*
	 * A rename of a root symlink (@target) onto `current` by process @pid is
	 * a commit (`ln -sfn V current`): called on the FUSE worker before the
	 * namespace is touched, it returns 0 when the rename may flip `current`
	 * (the commit was decided), or -errno to refuse it.  It may wait (engine
	 * barrier, the cluster's two phases) and runs without the namespace
	 * lock.  NULL: the rename flips at once.
	 */
	int (*commit)(void *arg, const char *target, pid_t pid);
	struct readaround *ra;          /* hwfs_readaround_start(); NULL: off */
};

/** The operation table. */
const struct fuse_lowlevel_ops *hwfs_fuse_ops(void);

/** The FUSE inode number of @n. */
fuse_ino_t hwfs_fuse_ino(struct ns *ns, struct node *n);

/*
 * Read-around of small reads of immutable files (fuse_readaround.c): the
 * aligned read_around_kb window around a small read of a sealed file or a
 * tensor is stored into the kernel's page cache (FUSE_NOTIFY_STORE) by a
 * thread of its own.  start: before the session loop (0, or -errno; nothing
 * when the tunable is 0); stop: after it has returned (no worker left in
 * hwfs_readaround_note); note: from the read handler (@ino: @n's inode
 * number in the request), before its reply.
 */
int hwfs_readaround_start(struct fsctx *c, struct fuse_session *se);
void hwfs_readaround_stop(struct fsctx *c);
void hwfs_readaround_note(struct fsctx *c, struct node *n, fuse_ino_t ino, uint64_t off,
			  size_t size);

#endif /* HWFS_FUSE_OPS_H */
