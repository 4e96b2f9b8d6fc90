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
 * Locking: ns->lock (rwlock) guards the tree shape, names, version states and
 * node lifetimes; lookups take it shared, changes exclusive.  Nodes are freed
 * only under the exclusive lock, once detached and forgotten by the kernel
 * (nlookup == 0) and closed (nopen == 0); a detached node's shards are given
 * back as soon as it is closed.  A regular file of an open version also has
 * its own mutex (node->mu) for its writer.  A sealed file's extents never
 * change, so reads of sealed data take no lock at all.
 *
 * Fields marked (ro) may be read by other modules while they hold a reference
 * (lookup or open); only the namespace's own files change them.
 *
 * Code layout: ns.c (core: nodes, references, life cycle), ns_version.c
 * (versions: load, import, seal, remove, current, records), ns_tensors.c
 * (the tensors/ view), ns_tp.c (the tp/ resharding views), ns_tree.c (tree changes through FUSE), ns_io.c (file
 * data); they share the private ns_i.h.
 */
#ifndef HWFS_NS_H
#define HWFS_NS_H

#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>

#include "ingest.h"
#include "store.h"

enum ntype {
	NT_ROOT,
	NT_VERSIONS,
	NT_VROOT,
	NT_DIR,
	NT_REG,
	NT_LNK,
	NT_TDIR,
	NT_TENSOR,
	NT_RLNK,
	NT_TPFILE, /* a file of the tp/ view (ns_tp.c) */
};

struct tp_file;

struct version;

struct node {
	uint64_t ino;      /* (ro) st_ino, unique for the life of the daemon */
	enum ntype type;   /* (ro) */
	struct node *parent;
	char *name;
	struct version *ver; /* (ro) owning version, NT_VROOT and below */
	uint64_t nlookup;  /* kernel references (__atomic; taken under the ns lock,
			    * dropped under the exclusive lock) */
	uint32_t nopen;    /* open file handles (__atomic; same rule: ns_open) */
	int detached;      /* set under the exclusive lock; read atomically without it */
	uint32_t mode; /* full st_mode */
	uint32_t uid, gid;
	int64_t mtime_ns, ctime_ns;

	struct node **kids; /* directories: sorted by name */
	size_t nkids, capkids;

	pthread_mutex_t mu;        /* NT_REG: guards w and data while the version is open */
	struct writer *w;          /* NT_REG of an open version, while written */
	struct ingest_result data; /* NT_REG when not being written; NT_TENSOR: its bytes */

	char *target;                 /* NT_LNK, NT_RLNK */
	const struct hwfs_trec *tensor; /* NT_TENSOR: metadata (owned by the file node) */
	struct node *tfile;           /* NT_TENSOR: the file it comes from (pinned) */
	uint32_t pins;                /* NT_REG: tensor nodes pointing at it */
	int write_error; /* NT_REG (under mu): errno of a write or truncation that failed
			  * for a writer of an open version; 0 when none since the file
			  * was created or last truncated to 0.  ns_seal refuses it. */
	struct node *orph_prev, *orph_next; /* detached but alive (see ns.c) */
	struct tp_file *tp; /* NT_TPFILE: its layout (owned; pins its source files) */
	char *why; /* NT_TDIR of tp/: why this TP size cannot be served (lookup: EINVAL, not listed) */
	int by_number; /* (ro) NT_TDIR of tp/: children sorted by number (ns_name_cmp) */
};

struct version_error {
	char *file;
	char *error;
};

struct version {
	char *name;
	enum hwfs_vstate state;
	uint64_t seq;
	int64_t created_ns, sealed_ns;
	hwfs_hash_t digest;
	struct node *root;
	int sealing; /* seal in progress: no more changes */
	int rm_hinted; /* a removal inside was refused and "use hwfs rm" logged (lock held) */
	/* figures, valid once sealed */
	uint64_t bytes, files, tensors;
	size_t n_errors;
	struct version_error *errors;
	struct version *next_dead; /* removed versions (see ns_version_drop) */
};

struct ns;

/** Build the namespace of @st from its index (versions, current). */
int ns_create(struct store *st, struct ns **out);
/** Free everything (the kernel must be gone). */
void ns_destroy(struct ns *ns);

struct store *ns_store(struct ns *ns);
struct node *ns_root(struct ns *ns);

void ns_rdlock(struct ns *ns);
void ns_wrlock(struct ns *ns);
void ns_unlock(struct ns *ns);

/** Child @name of @dir or NULL (lock held). Hidden versions are found by name. */
struct node *ns_child(struct node *dir, const char *name);
/**
 * ns_listed() - whether readdir of @dir shows its child @k (lock held).  Left
 * out but found by name: staging versions (`versions/.hwfs-*`), the TP sizes
 * that cannot be served, and a sealed version's computed `tp/` (so that `cp -r`,
 * `rsync -a` and `du` of a version see the checkpoint and its `tensors/`, not
 * the resharding views).
 */
int ns_listed(const struct node *dir, const struct node *k);

/** Kernel reference accounting (lookup count) — take/drop, drop frees. */
void ns_lookup_ref(struct node *n);
void ns_forget(struct ns *ns, struct node *n, uint64_t nlookup);
/**
 * Open-handle accounting.  ns_open() takes a reference unless @n was removed
 * (-ENOENT), race-free against removal.  ns_open_ref() takes one
 * unconditionally: only for a caller that holds the namespace lock or the
 * only path to a node it just made.  ns_release() drops one; the last close of
 * a detached node gives its data back (exactly once, see ns.c).
 */
int ns_open(struct ns *ns, struct node *n);
void ns_open_ref(struct node *n);
void ns_release(struct ns *ns, struct node *n);

/** Version by name (lock held), or NULL. */
struct version *ns_version(struct ns *ns, const char *name);
/** Is @n inside a version that may be modified (open and not sealing)? */
int ns_writable(const struct node *n);

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
 * tensors/.  A version holding a file whose write or truncation failed (see
 * node.write_error) is refused with -EIO unless @flags has NS_SEAL_FORCE; then
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
 * (unknown), -EBUSY (open), -EIO (damaged), with a sentence in @err.
 */
int ns_check_committable(struct ns *ns, const char *name, char *err, size_t errlen);

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
 * need a writable version (-EROFS otherwise) and serialise on n->mu; reads of
 * sealed files take no lock.
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

/** Live figures of a version (for open ones: walks the tree). Lock held. */
void ns_version_usage(struct ns *ns, struct version *v, uint64_t *bytes, uint64_t *files);

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

/** Fill st from @n (lock held or reference held). */
void ns_stat(struct ns *ns, struct node *n, struct stat *st);

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

/** Allocate an inode number. */
uint64_t ns_next_ino(struct ns *ns);

/** Prefix of hidden versions (staging of `hwfs publish`): not listed by readdir. */
#define NS_HIDDEN_PREFIX ".hwfs-"

/** Whether version name @name has the hidden (reserved) prefix. */
static inline int ns_hidden_name(const char *name)
{
	return !strncmp(name, NS_HIDDEN_PREFIX, sizeof(NS_HIDDEN_PREFIX) - 1);
}

#endif /* HWFS_NS_H */
