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
 * Other modules never touch the arena's allocator or the index directly for
 * shard bytes and version rows: received shards go through the staging calls
 * (store_stage_*), versions through store_put_version() and friends, which
 * take the index lock themselves.  The shard table has its own internal lock.
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

/** What a store's filesystem and the machine can hold, for store_capacity_verdict(). */
struct store_room {
	uint64_t fs_bytes;  /* size of the filesystem holding the store (statvfs) */
	int in_memory;      /* that filesystem is tmpfs or ramfs: the arena is memory */
	uint64_t mem_free;  /* MemAvailable + SwapFree (/proc/meminfo) */
	uint64_t resident;  /* bytes the arena file already occupies (st_blocks) */
};

/**
 * store_capacity_verdict() - judge an asked-for arena @capacity against
 * @room (decision, docs/cli.md "mount"): larger than the filesystem is
 * -EFBIG (it could never be filled: ENOSPC first), with the sentence in
 * @msg; in memory and growing past the free RAM and swap
 * (@capacity - resident > mem_free) is 1, a warning in @msg (the arena is
 * sparse: it may never be filled, and tmpfs may be larger than RAM); else 0.
 */
int store_capacity_verdict(uint64_t capacity, const struct store_room *room, char *msg,
			   size_t len);

/**
 * store_check_capacity() - store_capacity_verdict() for a store in @dir (it
 * must exist), with the room measured now.  0, 1 or -EFBIG as that; -errno
 * when @dir cannot be measured.
 */
int store_check_capacity(const char *dir, uint64_t capacity, char *msg, size_t len);

/** Close everything and release the lock. NULL is a no-op. */
void store_close(struct store *s);

struct arena *store_arena(struct store *s);
const char *store_dir(const struct store *s);

/*
 * Versions in the index.  Each call takes the index lock for its own
 * transaction; they return 0 or the index's -errno (see index.h).
 */
/** Every persisted version (see index_load()) and the committed name (or NULL). */
int store_load_versions(struct store *s, struct hwfs_vrec ***vs, size_t *n, char **current);
/** Persist sealed version @v with the arena locations of its shards. */
int store_put_version(struct store *s, const struct hwfs_vrec *v,
		      const struct hwfs_shardloc *locs, size_t n_locs);
/** Forget version @name (and the shard rows nothing else references). */
int store_delete_version(struct store *s, const char *name);
/** Record the state of version @name. */
int store_set_state(struct store *s, const char *name, enum hwfs_vstate st);
/** Record @name as the committed version (NULL: none). */
int store_set_current(struct store *s, const char *name);
/**
 * store_meta_get() - a small named value kept with the index (*@val
 * malloc'd).  Returns 0, -ENOENT when unset, or -EIO.
 */
int store_meta_get(struct store *s, const char *key, char **val);
/** Set (or, with @val NULL, delete) a named value. Returns 0 or -EIO. */
int store_meta_set(struct store *s, const char *key, const char *val);

/*
 * Staging: arena ranges that become shards once their bytes are in and
 * hashed (ingest's file staging, the replicator's received pieces).
 */
/**
 * store_stage_alloc() - a range of @len bytes.  @unbacked: the caller fills
 * all of it with store_stage_write() at once, so no page is allocated (or
 * zeroed) before its bytes arrive.  Returns 0 or -ENOSPC/-errno.
 */
int store_stage_alloc(struct store *s, uint64_t len, int unbacked, uint64_t *off);
/** Grow the staged range [@off, @off+@len) in place to @newlen. Returns 0 or -ENOSPC. */
int store_stage_extend(struct store *s, uint64_t off, uint64_t len, uint64_t newlen);
/** Give a staging range back (bytes that did not become a shard). */
void store_stage_free(struct store *s, uint64_t off, uint64_t len);
/**
 * store_stage_write() - copy @len bytes into the arena at @off, inside a
 * staged range: pwrite on the arena file (no faults on the mapping, no
 * zero-filled pages), or a plain copy when the arena is preallocated.
 * Returns 0 or -errno (-ENOSPC when the arena's filesystem is full).
 */
int store_stage_write(struct store *s, uint64_t off, const void *buf, size_t len);
/**
 * store_intern_staged() - intern the staged range [@off, @off+@len) whose
 * bytes hash to @h (see store_intern()); when the shard existed already the
 * staged range is given back.  Returns the shard with one reference for the
 * caller, or NULL (-ENOMEM; the range is given back too).
 */
struct shard *store_intern_staged(struct store *s, const hwfs_hash_t *h, uint64_t off,
				  uint64_t len);

/** Read-only pointer to staged bytes at arena offset @off (those written already). */
static inline const uint8_t *store_stage_data(struct store *s, uint64_t off)
{
	return arena_base(store_arena(s)) + off;
}

/**
 * store_stage_dest() - where to write the staged range at @off in place (a
 * shard rebuilt straight into it, no copy), or NULL when the arena is not
 * preallocated: its pages may not be backed yet, and a write through the
 * mapping could then fault on a full filesystem (use store_stage_write()).
 */
static inline uint8_t *store_stage_dest(struct store *s, uint64_t off)
{
	struct arena *a = store_arena(s);

	return arena_preallocated(a) ? arena_base(a) + off : NULL;
}

/** Free bytes of the arena: how much more staging can take now. */
uint64_t store_stage_room(struct store *s);

/** Pointer to the first byte of @sh in the arena. */
static inline const uint8_t *store_shard_data(struct store *s, const struct shard *sh)
{
	return arena_base(store_arena(s)) + sh->off;
}

/** Find a shard by hash (no reference taken). NULL if absent.  The daemon asks
 * with store_get(); this is how the unit tests look without changing a count. */
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
/** The shard bytes held, read without the table lock (a relaxed atomic: /metrics). */
uint64_t store_used_bytes(const struct store *s);

#endif /* HWFS_STORE_H */
