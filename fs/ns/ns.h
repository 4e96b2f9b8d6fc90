/*
 * ns.h — the in-memory namespace: versions, their trees, `current`.
 *
 *   root
 *    |- versions/              NT_VERSIONS
 *    |   |- <v>/               NT_VROOT (one struct version)
 *    |   |   |- a/b.bin        NT_DIR / NT_REG / NT_LNK as written
 *    |   |   |- tensors/NAME   NT_TDIR / NT_TENSOR (sealed versions only)
 *    |   |   '- tp/N/r/...     NT_TDIR / NT_TPFILE (sealed versions only, ns_tp.c)
 *    |- current -> versions/v  NT_RLNK (also any temporary symlink made in root)
 *
 * The namespace is the source of truth for reads: everything the FUSE read
 * path needs (extents, sizes, modes) is in these nodes, so no request ever
 * waits on sqlite.  The index is written only at the transitions: seal,
 * state change, removal, commit.
 *
 * Locking lives inside the namespace: ns->lock (rwlock, private) guards the
 * tree shape, names, version states and node lifetimes; every function here
 * takes it itself, so a caller never holds it.  What a caller needs of a
 * version it gets as a copy (ns_version_state, ns_version_info,
 * ns_check_committable) read under one hold of the lock.  Nodes are freed
 * only once detached, forgotten by the kernel (nlookup == 0) and closed
 * (nopen == 0); a sealed file's extents never change, so reads of sealed data
 * take no lock at all (ns_i.h has the details).
 *
 * Code layout, in call order: each file calls only those after it.
 *   fuse_ops.c    the FUSE operations (fuse_ops.h)
 *   ns_life.c     ns_create, ns_destroy
 *   ns_tree.c     tree changes through FUSE
 *   ns_io.c       file data
 *   ns_version.c  versions: load, import, seal, remove, current, records
 *   ns_tensors.c  the tensors/ view
 *   ns_tp.c       the tp/ resharding views: the rules (tp_rules.def), the build
 *   ns.c          the core: nodes, directories, references, the lock
 *   ns_tp_file.c  the files of the tp/ view: size, reads, end
 * They share the private ns_i.h (the structs); nothing else includes it.
 */
#ifndef HWFS_NS_H
#define HWFS_NS_H

#include <limits.h>
#include <string.h>
#include <sys/stat.h>

#include "ingest.h"
#include "store.h"

/*
 * The namespace and its nodes are opaque: their structs live in the private
 * ns_i.h of fs/ns.  A node pointer handed out here (ns_root, ns_versions_dir,
 * the tree changes' @out) is a handle for the calls below, valid while the
 * caller holds a reference (lookup or open) on it.
 */
struct ns;
struct node;

/** Build the namespace of @st from its index (versions, current). */
int ns_create(struct store *st, struct ns **out);
/** Free everything (the kernel must be gone). */
void ns_destroy(struct ns *ns);

/**
 * The root directory and versions/: fixed for the life of the namespace, so
 * these take no lock and need no reference.
 */
struct node *ns_root(struct ns *ns);
struct node *ns_versions_dir(struct ns *ns);

/**
 * ns_attr() - mode (full st_mode), owner and group of @n, read under the
 * namespace lock (each pointer may be NULL).  @n must stay alive: a fixed
 * node or one the caller holds a reference on.
 */
void ns_attr(struct ns *ns, struct node *n, uint32_t *mode, uint32_t *uid, uint32_t *gid);

/** Kernel reference accounting (lookup count): drop @nlookup, the last drop frees. */
void ns_forget(struct ns *ns, struct node *n, uint64_t nlookup);
/**
 * Open-handle accounting.  ns_open() takes a reference unless @n was removed
 * (-ENOENT), race-free against removal.  ns_open_ref() takes one
 * unconditionally: only for the namespace's own files (which hold its lock)
 * or a caller holding the only path to a node it just made.  ns_release()
 * drops one; the last close of a detached node gives its data back (exactly
 * once, see ns.c).
 */
int ns_open(struct ns *ns, struct node *n);
void ns_open_ref(struct node *n);
void ns_release(struct ns *ns, struct node *n);

/**
 * ns_version_state() - of version @name (hidden ones too), read under one
 * hold of the namespace lock: its state, seq and digest, each where its
 * pointer is not NULL (the digest is meaningful once sealed).  Returns 0 or
 * -ENOENT.
 */
int ns_version_state(struct ns *ns, const char *name, enum hwfs_vstate *state, uint64_t *seq,
		     hwfs_hash_t *digest);

/** A file whose check failed, as `hwfs verify` recorded it (struct ns_vinfo). */
struct ns_vinfo_error {
	char *file;
	char *error;
};

/** What `hwfs status` and `hwfs ls` show of a version: a copy (ns_version_info). */
struct ns_vinfo {
	char *name;
	enum hwfs_vstate state;
	uint64_t seq;
	hwfs_hash_t digest;          /* once sealed */
	uint64_t bytes, files;       /* live figures (open versions: their tree now) */
	uint64_t tensors;            /* once sealed */
	size_t n_errors;
	struct ns_vinfo_error *errors;
};
/**
 * ns_version_info() - a copy of version @name's figures into *@out, taken
 * under one hold of the lock.  Free with ns_vinfo_free().  Returns 0,
 * -ENOENT or -ENOMEM.
 */
int ns_version_info(struct ns *ns, const char *name, struct ns_vinfo *out);
void ns_vinfo_free(struct ns_vinfo *vi);

/**
 * ns_version_readable() - could a caller read all of version @name through
 * the mount: search the root and versions/, list and enter every directory
 * of the version and read every file (symlinks carry no data of their own)?
 * @bits(@arg, mode, uid, gid) gives the rwx bits (0..7) that apply to the
 * caller for a node of that mode and owner.  Runs under the namespace lock.
 * Returns 1, 0, or -ENOENT (no such version).
 */
int ns_version_readable(struct ns *ns, const char *name,
			uint32_t (*bits)(void *arg, uint32_t mode, uint32_t uid, uint32_t gid),
			void *arg);

/*
 * Tree changes.  Each takes the exclusive lock itself, checks permissions of
 * the hwfs model (EROFS for sealed versions, EPERM for the fixed parts) and
 * returns the new node with a kernel reference taken, or -errno.
 */
int ns_mkdir(struct ns *ns, struct node *dir, const char *name, uint32_t mode, uint32_t uid,
	     uint32_t gid, struct node **out);
int ns_create_file(struct ns *ns, struct node *dir, const char *name, uint32_t mode,
		   uint32_t uid, uint32_t gid, struct node **out);
int ns_symlink(struct ns *ns, struct node *dir, const char *name, const char *target,
	       uint32_t uid, uint32_t gid, struct node **out);
int ns_unlink(struct ns *ns, struct node *dir, const char *name, int is_dir);
int ns_rename(struct ns *ns, struct node *sdir, const char *sname, struct node *ddir,
	      const char *dname, unsigned flags);

/** ns_seal() flag: seal even though a write to a file of the version failed. */
#define NS_SEAL_FORCE 1u

/**
 * ns_seal() - seal open version @name, renaming it to @new_name when given.
 * Finishes every file, persists the version in one index transaction, builds
 * tensors/.  A version holding a file whose write or truncation failed (the
 * namespace remembers it per file) is refused with -EIO unless @flags has NS_SEAL_FORCE; then
 * @err (when not NULL) gets a sentence naming the file(s).  Returns 0, -ENOENT,
 * -EEXIST (new name taken), -EROFS (not open), -EBUSY (a seal is running),
 * -EIO (failed writes) or an error from the index.
 */
int ns_seal(struct ns *ns, const char *name, const char *new_name, unsigned flags, char *err,
	    size_t errlen);

/**
 * ns_remove_version() - drop version @name (open or sealed) from the index and
 * the tree. Readers that have its files open keep their bytes until they close.
 * Refused with -EBUSY for the committed version. *@removed_ino gets the ino of
 * the versions directory, to invalidate the kernel's entry.
 */
int ns_remove_version(struct ns *ns, const char *name);

/** The committed version's name (malloc'd) or NULL. */
char *ns_current(struct ns *ns);

/**
 * ns_current_gen() - ns_current(), and in *@gen the number of commits since
 * the namespace was made (every successful flip of `current`, to the same
 * version again too), both read under one hold of the lock.  Returns the name
 * (malloc'd) or NULL.
 */
char *ns_current_gen(struct ns *ns, uint64_t *gen);

/**
 * ns_check_committable() - 0 when @name is sealed and intact, else -ENOENT
 * (unknown or hidden), -EBUSY (open), -EIO (damaged), with a sentence in
 * @err.  Takes the namespace lock; when @digest is not NULL and the version is
 * committable, *@digest gets its digest, read under the same hold.
 */
int ns_check_committable(struct ns *ns, const char *name, hwfs_hash_t *digest, char *err,
			 size_t errlen);

/** Mark a version damaged or sealed again (after verify). Returns 0 or -errno. */
int ns_set_state(struct ns *ns, const char *name, enum hwfs_vstate st);

/**
 * ns_snapshot() - a plain record of a sealed version (files, extents with
 * hashes, tensors) for diff/verify/manifest, or of an open one (extents of
 * finished files only). Free with hwfs_vrec_free(). Returns 0 or -errno.
 */
int ns_snapshot(struct ns *ns, const char *name, struct hwfs_vrec **out);

/** Names of all versions in seq order (hidden ones excluded); free each and the array. */
int ns_list(struct ns *ns, char ***names, size_t *n);

/*
 * File data.  @n must be held open (ns_open_ref).  Writes and truncation
 * need a writable version (-EROFS otherwise) and serialise on the file's own
 * mutex; reads of sealed files take no lock.
 */
/** Write @len bytes at @off. Returns 0 or -errno (-ENOSPC when the arena is full). */
int ns_write(struct ns *ns, struct node *n, uint64_t off, const void *buf, size_t len);
/** Write @len bytes read from @fd at @off straight into the arena. Returns 0 or -errno. */
int ns_write_from_fd(struct ns *ns, struct node *n, uint64_t off, int fd, size_t len);
/** Set the size of a file of an open version. Returns 0 or -errno. */
int ns_truncate(struct ns *ns, struct node *n, uint64_t size);

/**
 * Most iovecs ns_read() hands to @emit: a FUSE reply is one writev() of the
 * reply header plus the data iovecs, and writev() takes at most IOV_MAX.
 */
#define NS_READ_IOV_MAX (IOV_MAX - 1)

/**
 * ns_read() - the bytes of a regular file or tensor at [@off, @off+@len),
 * handed to @emit as at most NS_READ_IOV_MAX iovecs pointing into the arena
 * (arena-adjacent extents merged), or as one iovec over a bounce buffer for
 * files being written and for spans over more separate runs than that.
 * @emit is called at most once, also for 0 bytes, with whatever locks are
 * needed still held; it returns what ns_read returns.  When ns_read fails
 * before calling @emit (-ENOMEM, -ESTALE, -EISDIR) the caller must answer.
 */
int ns_read(struct ns *ns, struct node *n, uint64_t off, size_t len,
	    int (*emit)(void *arg, const struct iovec *iov, int cnt), void *arg);

/** Which attributes ns_setattr changes. */
#define NS_SET_MODE 1
#define NS_SET_UID 2
#define NS_SET_GID 4
#define NS_SET_MTIME 8
/**
 * ns_setattr() - change mode/owner/mtime of a node of an open version
 * (-EROFS for sealed data, -EPERM for root, versions/ and current).
 */
int ns_setattr(struct ns *ns, struct node *n, int what, uint32_t mode, uint32_t uid,
	       uint32_t gid, int64_t mtime_ns);

/* Space held by open files (hwfs status): see ns_held(). */
struct ns_held {
	uint64_t removed_files, removed_bytes; /* of removed versions (or unlinked), still open */
	uint64_t writing_files, writing_bytes; /* being written in open versions */
};
/**
 * ns_held() - what open files hold, into *@h: files (and tensors/ entries)
 * of removed versions or unlinked, still open, whose bytes stay in the store
 * until they are closed; files of open versions being written.  Bytes are
 * the files' sizes (shards a live version shares stay anyway).  Takes the
 * namespace lock.
 */
void ns_held(struct ns *ns, struct ns_held *h);

/**
 * ns_import() - create open version @name from @rec (a manifest that arrived
 * from another node) whose shards are all in the store; renaming it then
 * seals it (see the replicator).  Takes over rec's strings and tensors.
 * Returns 0, -EEXIST, -ENOENT (a shard is missing), -ENOMEM.
 */
int ns_import(struct ns *ns, const char *name, struct hwfs_vrec *rec);

/**
 * ns_set_seal_hook() - call @hook(@arg, name) after every successful seal,
 * with no lock held (the replicator announces new versions through it).
 */
void ns_set_seal_hook(struct ns *ns, void (*hook)(void *arg, const char *name), void *arg);

/**
 * ns_current_target() - what a `current` symlink whose @target is
 * "versions/V", "./versions/V/" or "V" points at: "versions/V" (malloc'd), or
 * NULL when @target names no valid version name (or without memory).
 */
char *ns_current_target(const char *target);
/**
 * ns_set_current_hook() - call @hook(@arg) after a commit made `current` name
 * a version (through the mount: `hwfs commit`, or a manual `ln -s` / `mv -T`
 * onto `current`), once the namespace lock is released.  Hooks of two commits
 * may run in either order: the hook reads what `current` names now
 * (ns_current_gen).  It may run on a FUSE thread and must not block.  Set it
 * before the mount serves requests, clear it (NULL) before the namespace is
 * destroyed.
 */
void ns_set_current_hook(struct ns *ns, void (*hook)(void *arg), void *arg);

/** Prefix of hidden versions (staging of `hwfs publish`): not listed by readdir. */
#define NS_HIDDEN_PREFIX ".hwfs-"

/** Whether version name @name has the hidden (reserved) prefix. */
static inline int ns_hidden_name(const char *name)
{
	return !strncmp(name, NS_HIDDEN_PREFIX, sizeof(NS_HIDDEN_PREFIX) - 1);
}

#endif /* HWFS_NS_H */
