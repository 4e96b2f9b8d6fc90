/*
 * devload.h — device shadow-load: a sealed version copied from the arena into
 * device memory, in a few large buffers ("buckets"), exported to engine
 * processes with CUDA IPC handles (docs/gpu.md, "Device shadow-load").
 *
 * Three parts:
 *  - the plan (devload_plan()): pure arithmetic, no CUDA, unit-tested: which
 *    bucket and offset each tensor gets, how large each bucket is, and whether
 *    the whole fits in the share of the device's free memory a load may take;
 *  - the table of loads (struct devloads): one entry per (version, device),
 *    its state (loading, loaded, failed), its buckets and tensor layout, the
 *    number of gpumap connections holding it, and the flags "removed" (the
 *    version was removed with `hwfs rm`; the device copy stays until
 *    unloaded) and "unloading" (unloaded while mapped: freed when the last
 *    map goes).  Device memory is freed only when unloaded and unmapped;
 *  - the copy (devloads_run()): on the calling thread, SetDevice, MemGetInfo,
 *    the plan, one cudaMalloc per bucket, every contiguous arena piece of
 *    every tensor copied with MemcpyAsync on its bucket's stream
 *    (gpu_streams non-blocking streams), all streams synchronised, one IPC
 *    handle per bucket.  Any CUDA failure frees what was allocated.
 *
 * Locking: one mutex guards the table and every entry's state; a condition
 * variable wakes those waiting for a load to finish.  The mutex is never
 * held across a CUDA call that copies, and nothing else is taken under it,
 * so callers may hold their own locks (the engines registry's) around the
 * non-blocking calls (devloads_ready(), devloads_begin()).
 */
#ifndef HWFS_DEVLOAD_H
#define HWFS_DEVLOAD_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "hwfs_common.h"

struct cudart;

/* Alignment of every tensor in its bucket (bytes). */
#define DEVLOAD_ALIGN 256
/* The smallest bucket the plan makes (a larger gpu_bucket_bytes permitting). */
#define DEVLOAD_MIN_BUCKET (16ull << 20)
/* Longest failure reason kept for a load. */
#define DEVLOAD_REASON_MAX 512

/** The plan of one load (devload_plan()); free with devload_plan_free(). */
struct devload_plan {
	size_t n_buckets;
	uint64_t *bucket_bytes; /* bytes of each bucket: the end of its last tensor */
	int *bucket_stream;     /* the stream (0..streams-1) each bucket's copies go on */
	int *t_bucket;          /* per tensor: its bucket, 0..n_buckets-1 (0 for an empty one) */
	uint64_t *t_offset;     /* per tensor: its offset in the bucket (DEVLOAD_ALIGN-aligned;
				 * 0 for an empty one) */
	uint64_t bucket_cap;    /* the bucket size chosen (a bigger tensor has its own) */
	uint64_t need;          /* device bytes needed: the sum of the buckets (UINT64_MAX:
				 * more than fits in 64 bits) */
	uint64_t allowed;       /* what the load may take: pct% of the free bytes */
};

/**
 * devload_plan() - pack @n tensors of lengths @lens (in file then offset
 * order) into buckets.  The bucket size is clamp(@pct% of @free_bytes / 64,
 * DEVLOAD_MIN_BUCKET, @max_bucket) (@max_bucket wins when it is the smaller);
 * tensors go in order, each at the next DEVLOAD_ALIGN-aligned offset of the
 * current bucket, a new bucket starting when one would pass the size; a
 * tensor larger than the size gets a bucket of its own, exactly its length.
 * An empty tensor takes no room: it is at bucket 0, offset 0.  There is
 * always at least one bucket: a version without a byte of tensor data (only
 * empty tensors, or none) gets one of DEVLOAD_ALIGN bytes, so that every
 * tensor's bucket is a valid index.  Buckets go round-robin to @streams
 * streams.  Returns 0, -EINVAL (@pct not
 * 1..100, @streams < 1, @max_bucket 0), -ENOMEM (out of memory, or the
 * buckets need more than @pct% of @free_bytes: @out->need and @out->allowed
 * say by how much; nothing else of @out is set then) or -EOVERFLOW (the
 * lengths add up past 64 bits: @out->need is UINT64_MAX).
 */
int devload_plan(const uint64_t *lens, size_t n, uint64_t free_bytes, unsigned pct, int streams,
		 uint64_t max_bucket, struct devload_plan *out);

/** Free what devload_plan() allocated in @p (not @p); a zeroed plan is fine. */
void devload_plan_free(struct devload_plan *p);

/* ------------------------------------------------------------------ loads */

struct devloads;
struct devload;

/** One contiguous range of the arena that holds (part of) a tensor. */
struct devload_piece {
	uint64_t arena_off;
	uint64_t len;
};

/*
 * What to copy: the arena's mapping, the tensors (file then offset order)
 * with their lengths and pieces (tensor i's are pieces[piece_at[i]] up to
 * pieces[piece_at[i + 1]], in order; piece_at has n_tensors + 1 entries), and
 * the layout gpumap replies, one object per tensor (name, file, dtype,
 * shape, len, hash) to which the copy adds "bucket" and "offset".
 */
struct devload_src {
	const uint8_t *arena_base;
	size_t n_tensors;
	const uint64_t *lens;
	const size_t *piece_at;
	const struct devload_piece *pieces;
	json_t *tensors; /* borrowed: the load keeps its own reference */
	hwfs_hash_t digest;
	int pinned;      /* the arena is registered with CUDA ("source": "pinned") */
};

/**
 * devload_tensor_pieces() - the arena pieces of tensor @t of regular file @f
 * (its extents sorted by offset and covering the file; extent i lies at
 * arena offset @ext_at[i]), appended to @pieces from *@np on, one per extent
 * the tensor crosses (none for an empty tensor).  *@e0 is the first extent
 * that may hold the tensor: start at 0 for a file and pass it back for the
 * next tensor (tensors in offset order).  Never writes @pieces[@cap] or
 * beyond.  Returns 0, -EIO (the tensor is not inside the file, or the
 * extents leave a hole) or -E2BIG (more than @cap pieces: the file's tensors
 * overlap, since tensors that do not overlap need at most one piece per
 * tensor plus one per extent).
 */
int devload_tensor_pieces(const struct hwfs_frec *f, const uint64_t *ext_at,
			  const struct hwfs_trec *t, size_t *e0, struct devload_piece *pieces,
			  size_t cap, size_t *np);

/** Progress of a copy: @done of @total bytes. */
typedef void (*devload_progress_fn)(void *arg, uint64_t done, uint64_t total);

/**
 * devloads_create() - an empty table for runtime @rt (NULL: this node has no
 * GPU; every load is refused then by its caller).  Returns 0 or -ENOMEM.
 */
int devloads_create(struct cudart *rt, struct devloads **out);

/**
 * devloads_destroy() - at shutdown, after devloads_stop() and
 * devloads_drain() (no copy runs any more): free every load's device memory,
 * mapped or not (the processes that mapped it lose it when the daemon exits
 * anyway), and the table.  NULL is a no-op.
 */
void devloads_destroy(struct devloads *dl);

/** Shutdown begins: running copies stop at their next tensor, no new load or worker starts. */
void devloads_stop(struct devloads *dl);

/**
 * devloads_worker_enter() - a thread that will use the table (and whatever its
 * caller shares with it) starts; devloads_drain() waits for it to leave.
 * Returns 0, or -ESHUTDOWN once devloads_stop() was called (do not start it).
 */
int devloads_worker_enter(struct devloads *dl);
/** The thread of devloads_worker_enter() is done with everything it used. */
void devloads_worker_exit(struct devloads *dl);
/** Wait until every worker left (call devloads_stop() first). */
void devloads_drain(struct devloads *dl);
/**
 * devloads_drain_for() - devloads_drain(), waiting at most @ms milliseconds.
 * Returns 0 (every worker left) or -ETIMEDOUT (the number still running in
 * *@left).
 */
int devloads_drain_for(struct devloads *dl, unsigned ms, unsigned *left);

/**
 * devloads_begin() - start a load of @version (its seq @seq on this node) on
 * device @gpu: a new entry in state "loading", returned in *@out for
 * devloads_run() or devloads_fail() (one of them must follow).  @autoload:
 * the commit barrier asks for it (devloads_unload_auto() may unload it),
 * else a manual `hwfs load` (never unloaded but by `hwfs unload`).  When an
 * entry of (@version, @gpu) exists already, nothing is made and the answer
 * says what it is: -EALREADY (loaded, the same version: see devloads_wait()
 * for its figures), -EINPROGRESS (being loaded: devloads_wait()), -EEXIST
 * (it holds another version of that name, or one removed since: unload it
 * first); a manual begin makes that same version's entry manual.  A failed
 * entry is replaced.  Returns 0, those, -ESHUTDOWN (stopping) or -ENOMEM.
 */
int devloads_begin(struct devloads *dl, const char *version, uint64_t seq, int gpu, int autoload,
		   struct devload **out);

/**
 * devloads_run() - copy @src into the device of entry @l (from
 * devloads_begin()), on the calling thread, calling @progress (may be NULL)
 * now and then with the bytes handed to the copy engines.  On success the
 * entry is "loaded" and *@summary (when not NULL) is {"bytes", "tensors",
 * "buckets", "seconds", "source"} for load's reply; on failure it is
 * "failed" with the reason in @err (also kept for status) and its device
 * memory is freed.  Wakes devloads_wait().  The caller must not use @l
 * afterwards (once loaded it may be unloaded by anyone).  Returns 0,
 * -ENOMEM (does not fit, with the figures in @err, or cudaMalloc failed),
 * -EIO (a CUDA call failed, or @src is inconsistent), -ESHUTDOWN.
 */
int devloads_run(struct devloads *dl, struct devload *l, const struct devload_src *src,
		 unsigned pct, int streams, uint64_t max_bucket, devload_progress_fn progress,
		 void *arg, json_t **summary, char *err, size_t errlen);

/**
 * devloads_fail() - entry @l (from devloads_begin()) could not even start
 * (its source was not readable): it becomes "failed" with @reason.  Wakes
 * devloads_wait().  The caller must not use @l afterwards.
 */
void devloads_fail(struct devloads *dl, struct devload *l, const char *reason);

/**
 * devloads_wait() - wait until the load of (@version, @gpu) is no longer
 * loading.  Returns 0 (loaded; *@summary as devloads_run() gives it, when
 * not NULL), -ECANCELED (failed: the reason in @err) or -ENOENT (it went).
 */
int devloads_wait(struct devloads *dl, const char *version, int gpu, json_t **summary,
		  char *err, size_t errlen);

/**
 * devloads_ready() - the commit barrier's question: is @version (seq @seq)
 * resident on device @gpu, for the barrier that began at @started_ns
 * (CLOCK_MONOTONIC, hwfs_mono_ns())?  Returns 0 (loaded), -EINPROGRESS
 * (loading), -ECANCELED with the reason in @err (the load failed at or
 * after @started_ns: every question of this barrier gets the same answer;
 * or the device holds another version of that name), -ENOENT (no load:
 * start one).  A failure from before @started_ns (a manual load's, an
 * earlier commit's) is stale: the entry is dropped and -ENOENT returned, so
 * that this barrier loads again.
 */
int devloads_ready(struct devloads *dl, const char *version, uint64_t seq, int gpu,
		   uint64_t started_ns, char *err, size_t errlen);

/**
 * devloads_map() - gpumap: take one reference on the loaded entry of
 * (@version, @gpu) and build the reply's {"ok", "version", "digest", "gpu",
 * "buckets", "tensors"} in *@reply.  *@ref is given back to devloads_unmap()
 * when the connection ends.  Returns 0, -ENOENT (not loaded, or still
 * loading) or -ENOMEM.
 */
int devloads_map(struct devloads *dl, const char *version, int gpu, json_t **reply,
		 struct devload **ref);

/** Drop the reference @ref of devloads_map(); frees the device memory if unloaded meanwhile. */
void devloads_unmap(struct devloads *dl, struct devload *ref);

/**
 * devloads_unload() - unload @version from device @gpu (-1: every device):
 * loaded and failed entries go; device memory still mapped (gpumap) is freed
 * when its last map ends.  *@freed is the bytes freed now, *@pending the
 * number of maps still holding memory.  Returns 0, -ENOENT (not loaded
 * there) or -EBUSY (being loaded: wait for it).
 */
int devloads_unload(struct devloads *dl, const char *version, int gpu, uint64_t *freed,
		    uint64_t *pending);

/**
 * devloads_unload_auto() - `current` now names @keep (NULL: nothing): unload
 * every load the commit barrier made (devloads_begin() with @autoload) of a
 * version other than @keep (or of @keep removed since), on every device, as
 * devloads_unload() does: loaded and failed ones go, one still mapped is
 * freed when its last map ends, one still loading stays (the next flip
 * unloads it).  *@freed is the bytes freed now.  Returns how many went or
 * are going.
 */
size_t devloads_unload_auto(struct devloads *dl, const char *keep, uint64_t *freed);

/** `hwfs rm` removed @version: its loads stay, shown as "removed". */
void devloads_removed(struct devloads *dl, const char *version);

/**
 * devloads_json() - status "loads": a new array of {"version", "gpu",
 * "bytes", "tensors", "buckets", "state", "maps", "removed", "auto"} (and
 * "reason" when failed), NULL without memory.
 */
json_t *devloads_json(struct devloads *dl);

#endif /* HWFS_DEVLOAD_H */
