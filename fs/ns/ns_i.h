/*
 * ns_i.h — private declarations shared by the files of fs/ns (their order
 * is in ns.h): the structs of the namespace, its nodes and versions, and the
 * helpers the files share.  Nothing outside fs/ns includes it; the public
 * API is ns.h, which has functions only.
 *
 * Helpers that read the tree expect the namespace lock held; those that
 * change it, the exclusive one.
 *
 * Locking: ns->lock (rwlock) guards the tree shape, names, version states and
 * node lifetimes; lookups take it shared, changes exclusive.  Nodes are freed
 * only under the exclusive lock, once detached and forgotten by the kernel
 * (nlookup == 0) and closed (nopen == 0); a detached node's shards are given
 * back as soon as it is closed.  A regular file of an open version also has
 * its own mutex (node->mu) for its writer.  A sealed file's extents never
 * change, so reads of sealed data take no lock at all.  Fields marked fixed
 * never change after the node is made.
 */
#ifndef HWFS_NS_I_H
#define HWFS_NS_I_H

#include <pthread.h>

#include "ns.h"

/* What a node is; every node has one type for its life. */
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
	uint64_t ino;      /* st_ino, unique for the life of the daemon (fixed) */
	enum ntype type;   /* fixed */
	struct node *parent;
	char *name;
	struct version *ver; /* owning version, NT_VROOT and below (fixed) */
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
	int by_number; /* NT_TDIR of tp/: children sorted by number (fixed) */
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

/* The lock: shared for lookups, exclusive for changes (see ns.h). */
void ns_rdlock(struct ns *ns);
void ns_wrlock(struct ns *ns);
void ns_unlock(struct ns *ns);

/** The store under the namespace. */
struct store *ns_store(struct ns *ns);
/** Allocate an inode number. */
uint64_t ns_next_ino(struct ns *ns);

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
/** Take a kernel reference (lookup count) on @n (lock held); ns_forget() drops it. */
void ns_lookup_ref(struct node *n);
/** Version by name (lock held), or NULL. */
struct version *ns_version(struct ns *ns, const char *name);
/** Is @n inside a version that may be modified (open and not sealing)? */
int ns_writable(const struct node *n);
/** Fill st from @n (lock held or reference held). */
void ns_stat(struct ns *ns, struct node *n, struct stat *st);

struct ns {
	struct store *st;
	pthread_rwlock_t lock;
	struct node *root, *versions;
	struct version **vers; /* in seq order */
	size_t nvers, capvers;
	struct version *graveyard; /* removed versions, freed at ns_destroy */
	struct node orphans;       /* list head: detached nodes still referenced */
	void (*seal_hook)(void *arg, const char *name);
	void *seal_hook_arg;
	void (*current_hook)(void *arg);
	void *current_hook_arg;
	/* set by ns_commit_locked() under the exclusive lock, taken by ns_unlock_commit() */
	int commit_hook_due;
	uint64_t commits; /* successful commits (ns_current_gen), under the exclusive lock */
	uint64_t next_ino; /* atomic */
	uint64_t next_seq;
};

/** Whether string @s ends with @suffix. */
static inline int ns_ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);

	return a >= b && !strcmp(s + a - b, suffix);
}

/*
 * Whether the tensors of this file are exposed and listed: decided by content,
 * whatever the file's name (a Hugging Face cache names its blobs by hash).
 * Ingest parsed the bytes strictly: a plausible header length (the header
 * starts with '{', fits the file and the size limit), a valid header, and a
 * data buffer ending exactly at the file's end; anything else leaves no
 * tensors.  Only *.safetensors files that fail report why (build_vrec).
 */
static inline int ns_exposes_tensors(const struct node *n)
{
	return n->data.tensors && !n->data.st_error;
}

/* ns.c: nodes and directories */

/** A new unattached node with a fresh inode number, or NULL (out of memory). */
struct node *ns_node_new(struct ns *ns, enum ntype type, const char *name, uint32_t mode,
		      uint32_t uid, uint32_t gid);
/** Whether nodes of type @t are directories. */
int ns_is_dir_type(enum ntype t);
/** Attach @n to @dir under its name: 0, -EEXIST or -ENOMEM. */
int ns_kid_insert(struct node *dir, struct node *n);
/** Detach @n from @dir (no-op when it is not there). */
void ns_kid_remove(struct node *dir, struct node *n);
/** Free @n (not its children), leaving the orphan list; a pinned file stays. */
void ns_node_free(struct ns *ns, struct node *n);
/** Detach @n and its subtree; free what nothing references, orphan the rest. */
void ns_detach_tree(struct ns *ns, struct node *n);
/** Path of @n relative to its version root, malloc'd (NULL: out of memory). */
char *ns_node_path(const struct node *n);

/* ns.c: a version's nodes with their paths (tensors/ left out), see ns_collect() */
struct nodelist {
	struct node **v;
	char **path;
	size_t n, cap;
};

/** Append the nodes below @n to @l, depth first: 0 or -ENOMEM. */
int ns_collect(struct nodelist *l, struct node *n);
/** Free @l's arrays and paths. */
void ns_nodelist_free(struct nodelist *l);
/** qsort_r() comparison of indexes into @ctx (a nodelist) by path. */
int ns_cmp_idx(const void *a, const void *b, void *ctx);

/* ns_version.c */

/** Free a version struct (not its tree). */
void ns_version_free(struct version *v);
/** ns_check_committable() with the lock held (no digest). */
int ns_check_committable_locked(struct ns *ns, const char *name, char *err, size_t errlen);
/** Live figures of a version (for open ones: walks the tree). Lock held. */
void ns_version_usage(struct version *v, uint64_t *bytes, uint64_t *files);
/** Create version @name with its root under versions/: 0 or -errno. */
int ns_version_new(struct ns *ns, const char *name, enum hwfs_vstate state, uint64_t seq,
		uint32_t mode, uint32_t uid, uint32_t gid, struct version **out);
/** Forget version @v: detach its tree, keep the struct until shutdown. */
void ns_version_drop(struct ns *ns, struct version *v);
/** Start-up: build a version from its index record: 0 or -errno. */
int ns_load_version(struct ns *ns, struct hwfs_vrec *rec);
/** Make (or move) `current` to point at version @name: 0 or -ENOMEM. */
int ns_set_current_node(struct ns *ns, const char *name);
/** Commit the version a new `current` symlink's @target names: 0 or -errno. */
int ns_commit_locked(struct ns *ns, const char *target);
/**
 * ns_unlock_commit() - release the exclusive lock, then, when ns_commit_locked()
 * succeeded under it, call the current hook (outside the lock: the hook may
 * take other locks).
 */
void ns_unlock_commit(struct ns *ns);

/*
 * n->w of a regular file changes only under n->mu, but the read path and
 * stat peek at it without the lock (a sealed file's writer is NULL for
 * good): every store is a release, every unlocked peek an acquire, so the
 * file's data is complete when a peek sees NULL.
 */
static inline struct writer *node_writer(const struct node *n)
{
	return __atomic_load_n(&n->w, __ATOMIC_ACQUIRE);
}

static inline void node_set_writer(struct node *n, struct writer *w)
{
	__atomic_store_n(&n->w, w, __ATOMIC_RELEASE);
}

/** Finish file @n's writer, if any (n->mu held); out of memory sets write_error. */
void ns_node_finish_writer(struct node *n);

/* ns_tensors.c */

/** Add tensors/ to sealed version @v and compute its figures. */
void ns_version_finish_tree(struct ns *ns, struct version *v);

/* ns_tp.c and ns_tp_file.c: a file of the tp/ view */

struct tp_seg {
	uint64_t off;           /* first byte in the view file */
	uint64_t len;           /* bytes in the view file */
	const struct node *src; /* the source file (pinned by the view file) */
	uint64_t src_off;       /* first byte of the first run in the source */
	uint64_t run;           /* bytes per run (== len: contiguous) */
	uint64_t stride;        /* source distance from one run to the next */
};

/* A header, shared by the view files of one size when they hold the same tensors. */
struct tp_head {
	char *buf;
	uint64_t len;
	unsigned refs; /* view files using it (changed under the exclusive lock, or at build) */
};

struct tp_file {
	struct tp_head *head; /* the header (or the text of README) */
	uint64_t head_len;
	struct tp_seg *seg; /* in file order */
	size_t nseg;
	uint64_t size;
	struct node **pins; /* distinct source files, each pinned once */
	size_t npins;
};

/* ns_tp.c */

/** Add tp/ (the resharding views) to sealed version @v, from its files @l in @order. */
void tp_build(struct ns *ns, struct version *v, struct nodelist *l, const size_t *order);

/* ns_tp_file.c */

/** Free a view file's layout (not its pins). */
void tp_file_free(struct tp_file *f);
/** The source files view file @f pins: their count, the array in *@pins. */
size_t tp_pins(const struct tp_file *f, struct node ***pins);
/** Size of view file @n. */
uint64_t tp_size(const struct node *n);
/** Read [off, off+len) of view file @n, like ns_read(). */
int tp_read(struct ns *ns, struct node *n, uint64_t off, size_t len,
	    int (*emit)(void *, const struct iovec *, int), void *arg);

/*
 * ns_touch() - set @n's mtime and ctime to @ns_now after a change of its data.
 * Writes to an open file hold only the file's mutex, not the namespace lock
 * that ns_stat() reads under, so both sides are atomic.
 */
static inline void ns_touch(struct node *n, int64_t ns_now)
{
	__atomic_store_n(&n->mtime_ns, ns_now, __ATOMIC_RELAXED);
	__atomic_store_n(&n->ctime_ns, ns_now, __ATOMIC_RELAXED);
}

#endif /* HWFS_NS_I_H */
