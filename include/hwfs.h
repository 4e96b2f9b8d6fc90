/*
 * hwfs.h — libhwfs, the client library of hwfs (the one public header).
 *
 * hwfs is a versioned weight filesystem: a node mounts it (normally at
 * /hotweights), trainers write versions into versions/NAME/, and `current`
 * names the version engines should serve.  libhwfs is how a program on that
 * node talks to the node's daemon: list versions, read `current`, map a
 * sealed version zero-copy and look its tensors up by name, watch for
 * versions arriving and `current` changing, and register as an engine that
 * answers the commit barrier (a cluster commit of V waits until every engine
 * registered on every node has shadow-loaded V; see docs/engines.md).
 *
 * Conventions, for every function below:
 *  - Functions that can fail return 0 or a negative errno value (-ENOENT,
 *    -EACCES, ...: the errno a refusal of the daemon carries, never guessed
 *    from its wording; -EPROTO when it carries no valid one: docs/libhwfs.md,
 *    "Errors"); hwfs_errmsg() then gives the
 *    daemon's or the library's one-line sentence for the last failure of the
 *    calling thread.
 *  - Strings and arrays handed out stay owned by the object they came from
 *    and live as long as it does, unless the function says "free with".
 *  - A `struct hwfs` may be shared by threads: every call opens its own
 *    connection to the daemon.  A `struct hwfs_map` is immutable once made;
 *    any thread may read it, one thread unmaps it.  A `struct hwfs_watch` is
 *    read by one thread at a time; hwfs_engine_report() may be called from
 *    another thread at the same time.
 *
 * Link with `pkg-config --libs hwfs` (libhwfs.so.1 or libhwfs.a).
 */
#ifndef HWFS_H
#define HWFS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HWFS_API_VERSION 1

/* ------------------------------------------------------------ the mount */

/** A handle on one mount's daemon (the mount point and its control socket). */
struct hwfs;

/**
 * hwfs_open() - find the daemon of the hwfs mount at @mount (NULL: the
 * environment's HWFS_MOUNT, read with secure_getenv() so that a setuid or
 * setgid program ignores it, else /hotweights).  Nothing stays connected: each
 * later call connects anew.  *@out must be freed with hwfs_close().
 * Returns 0, -ENOTSUP (not an hwfs mount), -ENOENT, -ENOMEM.
 */
int hwfs_open(const char *mount, struct hwfs **out);

/** Free @h (NULL is a no-op).  Maps and watches made from it stay valid. */
void hwfs_close(struct hwfs *h);

/** The mount point @h was opened on (absolute, no trailing slash). */
const char *hwfs_mountpoint(const struct hwfs *h);

/**
 * The calling thread's sentence for its last failed hwfs_* call ("" when none):
 * valid until the thread's next hwfs_* call.
 */
const char *hwfs_errmsg(void);

/** Called for each progress line of a long request (publish): bytes done of total. */
typedef void (*hwfs_progress_fn)(void *arg, uint64_t done, uint64_t total);

/**
 * hwfs_call() - the raw control request: send the JSON object @request (one
 * line, e.g. {"op":"status"}; docs/engines.md and docs/cli.md list the ops),
 * pass progress lines to @progress (may be NULL) and return the final answer
 * in *@reply (a NUL-terminated JSON object, free with free()).  The answer may
 * be {"ok": false, "error": ...}: that is still a return of 0.
 * Returns 0, -ECONNREFUSED (daemon gone), -EPROTO (malformed answer), -errno.
 */
int hwfs_call(struct hwfs *h, const char *request, hwfs_progress_fn progress, void *arg,
	      char **reply);

/* ------------------------------------------------------------ versions */

/** One version as the daemon lists it. */
struct hwfs_version {
	const char *name;
	const char *state;   /* "open", "sealed" or "damaged" */
	uint64_t bytes;      /* logical bytes of its files */
	int is_current;      /* 1 when `current` names it */
};

/**
 * hwfs_versions() - every version of the node, in creation order, into
 * *@out (an array of *@n entries; free with hwfs_versions_free()).
 * Returns 0 or -errno.
 */
int hwfs_versions(struct hwfs *h, struct hwfs_version **out, size_t *n);

/** Free what hwfs_versions() returned (NULL is a no-op). */
void hwfs_versions_free(struct hwfs_version *v, size_t n);

/**
 * hwfs_current() - the version `current` names, into *@out (free with
 * free()); -ENOENT when nothing was committed yet.  Reads the symlink; no
 * daemon round trip.  Returns 0 or -errno.
 */
int hwfs_current(struct hwfs *h, char **out);

/* ------------------------------------------------------------ zero-copy map */

/** A sealed version mapped read-only into this process; holds a lease. */
struct hwfs_map;

/** One tensor of a mapped version. */
struct hwfs_tensor {
	const char *name;      /* tensor name in its safetensors file */
	const char *file;      /* file path inside the version ("model-00001-of-00002.safetensors") */
	const char *dtype;     /* safetensors dtype: "F32", "BF16", "F16", "I64", ... */
	uint32_t ndim;
	const uint64_t *shape; /* ndim entries */
	const void *data;      /* read-only; valid until hwfs_unmap() */
	uint64_t len;          /* bytes */
	uint8_t hash[16];      /* XXH3-128 of the bytes, big-endian as hwfs prints it */
	int copied;            /* 1 when the bytes could not be mapped in place (docs/libhwfs.md) */
};

/**
 * hwfs_map() - map sealed version @version read-only, zero-copy: the daemon
 * passes its arena (read-only) and the version's extents; each tensor's bytes
 * are the arena's own pages (tensors stored in several pieces are stitched
 * with page mappings).  The mapping holds a lease: `hwfs rm` and gc never free
 * shards a live mapping uses; the lease ends at hwfs_unmap() or when the
 * process that mapped exits (a forked child does not keep it).  The lease
 * lasts while the daemon runs: when the daemon stops, the mapping stays
 * readable, but a restarted daemon does not know the lease and may reuse the
 * ranges of a version removed meanwhile, so map again once your watch ends
 * with -EPIPE (docs/engines.md, "How long a lease lasts").  Needs root, the
 * mount's owner or the --ctl-group (the arena holds every version).  *@out
 * must be released with hwfs_unmap().
 * Returns 0, -ENOENT (no such version), -EBUSY (not sealed), -EIO (damaged),
 * -EACCES, -ENOMEM, -errno.
 */
int hwfs_map(struct hwfs *h, const char *version, struct hwfs_map **out);

/** Unmap @m and end its lease (NULL is a no-op); its tensors' pointers die with it. */
void hwfs_unmap(struct hwfs_map *m);

/** The version's name and its manifest digest (32 hex digits). */
const char *hwfs_map_version(const struct hwfs_map *m);
const char *hwfs_map_digest(const struct hwfs_map *m);

/** Number of tensors (over every safetensors file of the version). */
size_t hwfs_map_count(const struct hwfs_map *m);

/** Tensor @i (0 <= i < hwfs_map_count()), in file then offset order. */
const struct hwfs_tensor *hwfs_map_tensor(const struct hwfs_map *m, size_t i);

/**
 * hwfs_map_find() - the tensor named @name, or NULL.  @name may be
 * "FILE:TENSOR" to pick one of several files holding the same name;
 * a bare name finds the first.
 */
const struct hwfs_tensor *hwfs_map_find(const struct hwfs_map *m, const char *name);

/* ------------------------------------------------------------ events and engines */

/** What a watch reports. */
enum hwfs_event_type {
	HWFS_EV_ARRIVED = 1, /* a version was sealed on this node (written, published or replicated) */
	HWFS_EV_CURRENT = 2, /* `current` now names the version (engines: swap now) */
	HWFS_EV_PREPARE = 3, /* engines only: a commit of the version is being prepared */
	HWFS_EV_REMOVED = 4, /* the version was removed */
};

struct hwfs_event {
	enum hwfs_event_type type;
	char version[256];
};

/** A live event stream from the daemon (optionally a registered engine). */
struct hwfs_watch;

/**
 * hwfs_watch_open() - start watching.  With @engine NULL it is a plain
 * watch.  With an @engine name it also registers this process as that engine
 * on the node: the node then answers a cluster commit's PREPARE only once the
 * engine reported the version loaded (or refused it), and the engine stays
 * registered until hwfs_watch_close() or the process exits (a forked child
 * that inherited the socket does not keep it registered).  Registering needs
 * root, the mount's owner or the --ctl-group; a name already registered on
 * the node is -EEXIST.  *@current gets the version `current` names (free with
 * free(); NULL when none) if @current is not NULL.
 * Returns 0 or -errno.
 */
int hwfs_watch_open(struct hwfs *h, const char *engine, char **current, struct hwfs_watch **out);

/** The socket, for poll()/select() (readable: an event may be waiting). */
int hwfs_watch_fd(const struct hwfs_watch *w);

/**
 * hwfs_watch_next() - wait up to @timeout_ms (-1: forever, 0: do not wait)
 * for the next event.  Returns 0 (*@ev filled), -ETIMEDOUT, -EPIPE (the
 * daemon closed the stream: unmounted or stopped), -EPROTO (a malformed
 * event, such as a version name with '/', was dropped: call again), -errno.
 */
int hwfs_watch_next(struct hwfs_watch *w, int timeout_ms, struct hwfs_event *ev);

/** What an engine tells its node (hwfs_engine_report). */
enum hwfs_report {
	HWFS_LOADING = 1,  /* started shadow-loading the version */
	HWFS_LOADED = 2,   /* the version is shadow-loaded: ready to swap */
	HWFS_REFUSED = 3,  /* the version cannot be served: @reason says why */
	HWFS_SWAPPED = 4,  /* now serving the version; @pause_us is the serving pause */
};

/**
 * hwfs_engine_report() - tell the node about @version (an engine watch
 * only).  @reason (REFUSED; may be NULL otherwise) is shown by `hwfs commit`
 * and `hwfs status`.  Returns 0, -EINVAL (not an engine watch), -EPIPE, -errno.
 */
int hwfs_engine_report(struct hwfs_watch *w, enum hwfs_report what, const char *version,
		       const char *reason, uint64_t pause_us);

/**
 * hwfs_engine_report_swap() - report SWAPPED @version with the pause split:
 * @pause_us is what new requests waited in all (as hwfs_engine_report), of
 * which @drain_us waiting for the requests in flight and @swap_us the swap
 * itself (`hwfs status`: last_drain_us, last_swap_us).  Same returns.
 */
int hwfs_engine_report_swap(struct hwfs_watch *w, const char *version, uint64_t pause_us,
			    uint64_t drain_us, uint64_t swap_us);

/** Stop watching, unregistering the engine (NULL is a no-op). */
void hwfs_watch_close(struct hwfs_watch *w);

/* ------------------------------------------------------------ GPU and DLPack (docs/gpu.md) */

/**
 * hwfs_load() - shadow-load sealed version @version into the memory of CUDA
 * device @gpu on this node: the daemon copies every tensor from its arena
 * (pinned when mounted with --pin) with several streams into device buckets
 * sized from the device's free memory, and holds them until hwfs_unload().
 * @progress (may be NULL) gets bytes done of total.  Loading a version that
 * is loaded already returns 0 at once.  Needs root, the mount's owner or the
 * --ctl-group.  Returns 0, -ENODEV (no CUDA runtime or device, or no device
 * @gpu: hwfs_errmsg() says which), -ENOMEM (the version does not fit in the
 * share of free device memory hwfs may use), -ENOENT, -EBUSY, -EIO, -EACCES,
 * -errno.
 */
int hwfs_load(struct hwfs *h, const char *version, int gpu, hwfs_progress_fn progress,
	      void *arg);

/**
 * hwfs_unload() - drop the device copy of @version on device @gpu (-1: on
 * every device).  Device memory is freed at once, or, while processes still
 * have it mapped (hwfs_map_gpu()), when the last of them unmaps or exits.
 * Returns 0, -ENOENT (not loaded), -EBUSY (a load of it is still in
 * progress: unload once it ends), -EACCES, -errno.
 */
int hwfs_unload(struct hwfs *h, const char *version, int gpu);

/**
 * hwfs_map_gpu() - map the device copy of @version on device @gpu (made by
 * hwfs_load()) into this process with CUDA IPC: no byte is copied, every
 * tensor's `data` is a device pointer into the daemon's buckets.  The same
 * struct hwfs_map as hwfs_map() (hwfs_map_device() tells them apart); the
 * daemon does not free the buckets while it lives.  Needs a CUDA runtime in
 * this process (loaded at run time, like the daemon's).
 *
 * @gpu is the daemon's device number; the map is made on the same device as
 * this process numbers it (found by its PCI bus id: CUDA_VISIBLE_DEVICES may
 * differ), which hwfs_map_device() returns.  A calling thread with a CUDA
 * context current gets its current device back; one without is left on the
 * mapped device (no context is made on another GPU).
 *
 * THE MAPPING IS WRITABLE: CUDA IPC maps the buckets read-write, and the
 * DLPack read-only flag is advisory (torch ignores it).  The buckets are the
 * node's one copy, shared by every process mapping the version: an engine
 * that modifies weights in place (quantises, fuses) changes them for every
 * other mapper.  Copy a tensor before modifying it.  (Only the CUDA VMM API,
 * cuMemCreate with read-only access for importers, would enforce it; hwfs
 * does not build that.)  Devices in EXCLUSIVE_PROCESS compute mode cannot be
 * shared this way.
 *
 * Returns 0, -ENOENT (not loaded on that device), -ENODEV (no CUDA runtime
 * or device here, or the device is not visible in this process), -EPROTO (a
 * malformed answer), -EIO (a bucket cannot be opened), -EACCES, -errno.
 */
int hwfs_map_gpu(struct hwfs *h, const char *version, int gpu, struct hwfs_map **out);

/**
 * The CUDA device whose memory @m's tensors point into, in this process's
 * numbering (may differ from the daemon's: hwfs_map_gpu()), or -1 for host
 * memory.
 */
int hwfs_map_device(const struct hwfs_map *m);

/* DLPack's types (dlpack/dlpack.h, from libdlpack-dev): only pointers to them here. */
struct DLManagedTensor;
struct DLManagedTensorVersioned;

/**
 * hwfs_map_dlpack() - tensor @i of @m as a DLPack tensor, without a copy:
 * kDLCPU over the arena mapping (hwfs_map()) or kDLCUDA over the IPC mapping
 * (hwfs_map_gpu()), C-contiguous (strides NULL).  The tensor holds a
 * reference on @m: hwfs_unmap() releases the caller's reference, and the
 * mapping (and its lease) ends when the last DLPack tensor's deleter has run
 * too.  The bytes are read-only: writing through a host tensor faults.
 * *@out is released by calling its deleter (the consumer does that).
 * Returns 0, -ERANGE (no tensor @i), -ENOTSUP (a dtype DLPack cannot express,
 * such as F8_E4M3), -ENOMEM.
 */
int hwfs_map_dlpack(struct hwfs_map *m, size_t i, struct DLManagedTensor **out);

/**
 * hwfs_map_dlpack_versioned() - the same as a DLPack 1.0 tensor
 * (DLManagedTensorVersioned, version 1.0) flagged DLPACK_FLAG_BITMASK_READ_ONLY,
 * so that consumers that honour the flag (numpy >= 2.1) make read-only arrays.
 */
int hwfs_map_dlpack_versioned(struct hwfs_map *m, size_t i,
			      struct DLManagedTensorVersioned **out);

/**
 * hwfs_watch_open_gpu() - hwfs_watch_open() for an engine whose readiness is
 * a device shadow-load: when a commit of V is prepared, the node itself loads
 * V on device @gpu (hwfs_load()) and counts the engine ready once V is
 * resident there, or refused with the reason the load failed.  The engine
 * then maps the loaded version with hwfs_map_gpu() and swaps when `current`
 * arrives.  @gpu -1 is hwfs_watch_open(): the engine reports itself.
 */
int hwfs_watch_open_gpu(struct hwfs *h, const char *engine, int gpu, char **current,
			struct hwfs_watch **out);

#ifdef __cplusplus
}
#endif

#endif /* HWFS_H */
