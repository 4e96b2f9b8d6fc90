/*
 * arena.h — the shard arena: one file mapped MAP_SHARED, carved into extents.
 *
 * All shard bytes live in one file in the store directory (normally on tmpfs),
 * mapped once at its full capacity, so a shard is addressed by its offset and
 * the read path is a pointer add.  The mapping survives nothing but the bytes
 * do: the file outlives the daemon, and the index records which ranges hold
 * which shard, so after a restart the daemon re-reserves those ranges.
 *
 * The allocator is byte-granular (ingest splits staging runs at tensor
 * boundaries, which fall anywhere) and first-fit over a sorted free list,
 * coalescing on free.  New allocations start page-aligned.  Backing pages are
 * fallocate()d when a range is handed out, so a full tmpfs gives -ENOSPC at
 * allocation instead of SIGBUS at first touch; whole pages inside a freed run
 * are punched out so freed memory really returns to the system.
 * All functions are thread-safe.
 */
#ifndef HWFS_ARENA_H
#define HWFS_ARENA_H

#include "hwfs_common.h"

struct arena;

/**
 * arena_open() - open or create the arena file @path of @capacity bytes.
 * The file is grown (ftruncate) to @capacity if smaller; a file larger than
 * @capacity keeps its size and the arena's capacity becomes that size (data
 * beyond @capacity may hold shards).  The whole file is mapped read-write
 * MAP_SHARED.  Initially every byte is free; call arena_reserve() for ranges
 * known to hold data.
 * Returns 0 or -errno.
 */
int arena_open(const char *path, uint64_t capacity, struct arena **out);

/** Unmap and close. NULL is a no-op. */
void arena_close(struct arena *a);

/** Start of the mapping; valid until arena_close(). */
uint8_t *arena_base(const struct arena *a);

/** Size of the mapping in bytes. */
uint64_t arena_capacity(const struct arena *a);

/** Bytes currently allocated or reserved. */
uint64_t arena_used(const struct arena *a);

/** File descriptor of the arena file (for pread/pwrite/splice). */
int arena_fd(const struct arena *a);

/**
 * arena_write() - copy @len bytes from @buf to [off, off+len) of an allocated
 * range with pwrite() on the arena file rather than through the mapping.
 * On tmpfs that skips the page fault (and the zeroing of a fallocate()d page
 * on its first touch) that a store through the mapping pays for every fresh
 * page; the bytes are the same page cache pages the mapping shows.  In a
 * preallocated arena (every page present and mapped) it is a memcpy().  What
 * pwrite() does not take (an error, a short write) is copied through the
 * mapping instead, so it cannot fail.
 */
void arena_write(struct arena *a, uint64_t off, const void *buf, size_t len);

/**
 * arena_zero() - set [off, off+len) of an allocated range to zero the way
 * arena_write() writes: with pwrite() of a zero buffer, so zero-filling fresh
 * pages (a gap left by a write past the end, a file extended by ftruncate)
 * costs the zeroing only, not a page fault per page.
 */
void arena_zero(struct arena *a, uint64_t off, uint64_t len);

/**
 * arena_reserve() - mark [off, off+len) as in use (start-up, from the index).
 * Returns 0, -ERANGE if it lies outside the arena, -EEXIST if any byte of it
 * is already in use.
 */
int arena_reserve(struct arena *a, uint64_t off, uint64_t len);

/**
 * arena_alloc() - allocate @len (> 0) bytes, page-aligned start, first fit.
 * Backing memory is fallocate()d. Returns 0, -ENOSPC (no free run large enough
 * or the backing filesystem is full), -EINVAL for len 0.
 */
int arena_alloc(struct arena *a, uint64_t len, uint64_t *off);

/**
 * arena_alloc_unbacked() - like arena_alloc(), without fallocate(): for a
 * caller that fills the whole range with pwrite() on arena_fd() at once
 * (tmpfs then allocates pages without zeroing them first, and a full
 * filesystem is an ENOSPC from pwrite, not a SIGBUS).  Never touch such a
 * range through arena_base() before it has been written.
 */
int arena_alloc_unbacked(struct arena *a, uint64_t len, uint64_t *off);

/**
 * arena_extend() - grow the allocation [off, off+len) in place to @newlen.
 * Succeeds only if [off+len, off+newlen) is entirely free; the new part is
 * fallocate()d. Returns 0 or -ENOSPC (nothing changes then).
 */
int arena_extend(struct arena *a, uint64_t off, uint64_t len, uint64_t newlen);

/**
 * arena_free() - give back [off, off+len) (any sub-range of earlier
 * allocations). Coalesces with neighbours and punches the whole pages inside
 * the merged free run. Freeing a range that is (partly) free already is a
 * bug: it is logged and ignored.
 */
void arena_free(struct arena *a, uint64_t off, uint64_t len);

/**
 * arena_preallocate() - allocate and touch every page of the arena now, lock
 * it in RAM if @lock (best effort: a refused mlock() is logged and
 * arena_locked() then says 0; it is not an error), and keep
 * every page from then on: frees and arena_trim() no longer punch holes and
 * allocation no longer fallocate()s.  Contents are unchanged.  Call it at
 * start-up, before any other thread uses the arena.  Returns 0, -ENOSPC when
 * the filesystem cannot hold the capacity, or -errno.
 */
int arena_preallocate(struct arena *a, int lock);

/** Whether arena_preallocate() has succeeded: every page present and mapped. */
int arena_preallocated(const struct arena *a);

/** Whether arena_preallocate(a, 1) locked the arena (its mlock() was not refused). */
int arena_locked(const struct arena *a);

/**
 * arena_trim() - punch out every whole page of every free run. Start-up calls
 * it after reserving the ranges the index knows, so memory left behind by an
 * earlier run (staging of a killed daemon, unpersisted open versions) returns
 * to the system.
 */
void arena_trim(struct arena *a);

#endif /* HWFS_ARENA_H */
