/*
 * store.h — the shard store: arena + index + the in-memory shard table.
 *
 * A store directory holds `arena` (the shard bytes), `index.db` (sqlite) and
 * `lock` (flock'd by the one daemon that owns the store).  The store keeps a
 * hash table hash -> shard {arena offset, size, refcount}.  Refcounts count
 * references from live file extents in memory (sealed, open and removed-but-
 * still-read versions alike); they are rebuilt at start-up from the persisted
 * versions, never stored.  A shard whose count drops to zero gives its arena
 * range back at once.
 *
 * store_intern() is the dedup point: bytes that ingest has just written into
 * a staging range of the arena either become a new shard in place (no copy)
 * or, when the hash is known already, are dropped in favour of the existing
 * shard.
 *
 * The index is not thread-safe; callers hold store_index_lock() around any
 * index_* call.  The shard table has its own internal lock.
 */
#ifndef HWFS_STORE_H
#define HWFS_STORE_H

#include <pthread.h>

#include "arena.h"
#include "hwfs_common.h"
#include "index.h"

struct store;

/** One content-addressed shard. Fields are read-only outside store.c. */
struct shard {
	hwfs_hash_t hash;
	uint64_t off;  /* in the arena */
	uint64_t size;
	uint32_t refs; /* guarded by the store's table lock */
	struct shard *next;
};

/**
 * store_open() - lock and open the store in directory @dir (created if
 * missing).  @capacity: arena size for a new store, or 0 to keep the existing
 * size (a new store then gets 3/4 of the filesystem holding @dir).  Loads the
 * shard rows and reserves their arena ranges.  Returns 0, -EBUSY when another
 * live process holds the store (its pid is logged), or -errno.
 */
int store_open(const char *dir, uint64_t capacity, struct store **out);

/** Close everything and release the lock. NULL is a no-op. */
void store_close(struct store *s);

struct arena *store_arena(struct store *s);
struct index *store_index(struct store *s);
/** The mutex to hold around every index_* call. */
pthread_mutex_t *store_index_lock(struct store *s);
const char *store_dir(const struct store *s);

/** Pointer to the first byte of @sh in the arena. */
static inline const uint8_t *store_shard_data(struct store *s, const struct shard *sh)
{
	return arena_base(store_arena(s)) + sh->off;
}

/** Find a shard by hash (no reference taken). NULL if absent. */
struct shard *store_lookup(struct store *s, const hwfs_hash_t *h);

/**
 * store_intern() - make the @len bytes at arena offset @off (hash @h) a shard.
 * If a shard with @h exists, takes a reference on it and sets *@adopted = 0:
 * the caller still owns [off, off+len) and must free or reuse it.  Otherwise
 * a new shard takes over that range (*@adopted = 1).  Returns the shard with
 * one reference for the caller, or NULL on -ENOMEM.
 */
struct shard *store_intern(struct store *s, const hwfs_hash_t *h, uint64_t off, uint64_t len,
			   int *adopted);

/**
 * store_add_loaded() - start-up: a shard row from the index whose range
 * has been reserved. Returns the shard with zero references, or NULL.
 */
struct shard *store_add_loaded(struct store *s, const struct hwfs_shardloc *loc);

/** Find a shard by hash and take a reference on it, atomically. NULL if absent. */
struct shard *store_get(struct store *s, const hwfs_hash_t *h);

/** Take a reference. */
void store_ref(struct store *s, struct shard *sh);
/** Drop a reference; at zero the shard is forgotten and its range freed. */
void store_unref(struct store *s, struct shard *sh);

/** Start-up: free every loaded shard nobody referenced. Returns how many. */
size_t store_drop_unreferenced(struct store *s);

/** Sum of the sizes of distinct shards held, and their number. */
void store_usage(struct store *s, uint64_t *bytes, uint64_t *count);

#endif /* HWFS_STORE_H */
