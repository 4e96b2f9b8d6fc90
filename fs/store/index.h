/*
 * index.h — the persistent index: one sqlite database (WAL) per store.
 *
 * Only sealed (and damaged) versions are persisted; an open version lives in
 * memory until it is sealed, so a crash can never make a half-written version
 * look sealed.  Sealing is one transaction that writes the version row, its
 * files, extents, tensors and the arena location of every shard it uses.
 * Shard refcounts are not stored: they are derived from the extents at load.
 *
 * Schema (see docs/design.md):
 *   meta(key TEXT PRIMARY KEY, value TEXT)
 *   versions(name TEXT PRIMARY KEY, seq, state, created_ns, sealed_ns, digest BLOB)
 *   files(version, path, kind, mode, uid, gid, mtime_ns, size, target, st_error)
 *   extents(version, path, off, len, hash BLOB)
 *   tensors(version, path, name, dtype, shape TEXT json, off, len, hash BLOB)
 *   shards(hash BLOB PRIMARY KEY, arena_off, size)
 *
 * The index is used by one thread at a time (the daemon serialises callers);
 * the FUSE read path never touches it.
 */
#ifndef HWFS_INDEX_H
#define HWFS_INDEX_H

#include "hwfs_common.h"

struct index;

/** Open or create the database at @path (WAL, synchronous=NORMAL, schema). */
int index_open(const char *path, struct index **out);
/** Close. NULL is a no-op. */
void index_close(struct index *ix);

/** Get a meta value (malloc'd into *val). Returns 0, -ENOENT, or -EIO. */
int index_meta_get(struct index *ix, const char *key, char **val);
/** Set a meta value; @val NULL deletes the key. Returns 0 or -EIO. */
int index_meta_set(struct index *ix, const char *key, const char *val);

/**
 * index_put_version() - persist a sealed version in one transaction.
 * Replaces any earlier rows of the same name.  @locs lists the arena location
 * of every shard the version references (rows are inserted or, when the hash
 * is already present, left as they are).  Returns 0 or -EIO.
 */
int index_put_version(struct index *ix, const struct hwfs_vrec *v,
		      const struct hwfs_shardloc *locs, size_t n_locs);

/** Change the state of a persisted version. Returns 0, -ENOENT or -EIO. */
int index_set_state(struct index *ix, const char *name, enum hwfs_vstate st);

/**
 * index_delete_version() - remove a version and, in the same transaction,
 * every shard row no remaining extent references. Returns 0, -ENOENT, -EIO.
 */
int index_delete_version(struct index *ix, const char *name);

/**
 * index_load() - every persisted version, fully populated (files sorted by
 * path, extents and tensors sorted by off), sorted by seq.
 * *@vs is a malloc'd array of malloc'd records; free each with
 * hwfs_vrec_free() and the array with free(). Returns 0 or -EIO.
 */
int index_load(struct index *ix, struct hwfs_vrec ***vs, size_t *n);

/** Every shard row. *@locs is malloc'd. Returns 0 or -EIO. */
int index_load_shards(struct index *ix, struct hwfs_shardloc **locs, size_t *n);

#endif /* HWFS_INDEX_H */
