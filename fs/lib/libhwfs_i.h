/*
 * libhwfs_i.h — what the files of libhwfs (libhwfs.c, libhwfs_map.c,
 * libhwfs_watch.c, libhwfs_gpu.c, libhwfs_dlpack.c) share: the handle, the
 * calling thread's error sentence, the connection helpers and the inside of
 * a map.  Nothing here is exported: the library is built with hidden
 * visibility and exports only include/hwfs.h.
 */
#ifndef HWFS_LIBHWFS_I_H
#define HWFS_LIBHWFS_I_H

#include <stdatomic.h>

#include "hwfs_api.h"
#include "names.h" /* HWFS_NAME_MAX */

/* the mount point hwfs_open() resolves when given none and HWFS_MOUNT is unset */
#define LIB_DEFAULT_MOUNT "/hotweights"
/* the root xattr that names the daemon's control socket */
#define LIB_CONTROL_XATTR "user.hwfs.control"
/* longest error sentence kept per thread */
#define LIB_ERRMSG_MAX 1024
/* longest version name (and file path component) the daemon may send, in bytes */

struct hwfs {
	char *mount; /* absolute, no trailing slash */
};

/**
 * lib_fail() - set the calling thread's error sentence (printf-style) and
 * return @err (a negative errno value), so that `return lib_fail(...)` ends a
 * failing call.
 */
int lib_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** lib_clear_error() - an hwfs_* call starts: the thread's sentence becomes "". */
void lib_clear_error(void);

/**
 * lib_connect() - connect to the control socket of @h's daemon (named by the
 * mount root's xattr, read anew each time: a remount moves it).  Returns the
 * descriptor (close-on-exec), or -ENOTSUP (not an hwfs mount), -ENOENT,
 * -ECONNREFUSED (the daemon is gone), -errno, with the sentence set.
 */
int lib_connect(const struct hwfs *h);

/**
 * lib_exchange() - send @req on @fd and read lines from @rd until one that is
 * not a progress line, which goes to *@res (new reference); progress lines go
 * to @progress when it is not NULL.  Returns 0 (the answer may still be
 * {"ok": false}), -EPIPE (the daemon closed the connection first), -EPROTO (a
 * malformed line), -errno, with the sentence set.
 */
int lib_exchange(int fd, struct ctl_reader *rd, json_t *req, hwfs_progress_fn progress,
		 void *arg, json_t **res);

/**
 * lib_check() - 0 when @res says "ok": true; otherwise set the sentence to
 * the daemon's "error" and return its "errno", negated.  The errno is read
 * from that field only, never guessed from the sentence (which may quote the
 * caller's own version name); an answer whose "errno" is missing or not an
 * integer in 1..CTL_ERRNO_MAX (an old or hostile daemon) gives -EPROTO.
 */
int lib_check(json_t *res);

/**
 * lib_call() - send the JSON object @req (the reference stays the caller's) on
 * a connection of its own, pass progress lines to @progress (may be NULL) and
 * return the final answer in *@res.  Returns 0 (the answer may still be
 * {"ok": false}) or -errno with the sentence set.
 */
int lib_call(struct hwfs *h, json_t *req, hwfs_progress_fn progress, void *arg, json_t **res);

/** A string member of @o, or NULL when absent or not a string. */
const char *lib_jstr(json_t *o, const char *key);

/**
 * lib_valid_name() - may @name be a version name (or one component of a
 * file path) the daemon sends?  1 when it is 1-255 bytes, not "." or "..",
 * with no '/' and no control character (< 0x20, 0x7f), else 0.  The daemon
 * itself never makes another one (fs/ns/ns_tree.c valid_name, which also checks
 * UTF-8): a name that fails here is a daemon that lies, and is refused
 * before it becomes a path.
 */
int lib_valid_name(const char *name);

/* ------------------------------------------------------------ maps */

struct cudart;

/* A range a host map made (stitched mapping or copy) and releases at the real unmap. */
struct lib_region {
	void *p;
	size_t len;
	int heap; /* 1: malloc()ed copy; 0: mmap()ed range */
};

/*
 * A mapped version, host (hwfs_map: libhwfs_map.c) or device (hwfs_map_gpu:
 * libhwfs_gpu.c).  Immutable once made, except for @refs: the caller of
 * hwfs_map*() holds one reference and every DLPack tensor made from it one
 * more (libhwfs_dlpack.c); hwfs_unmap() drops the caller's, and the last one
 * dropped releases everything (lib_map_put).
 */
struct hwfs_map {
	atomic_long refs;
	int fd;         /* the control connection: the lease (or the device map's reference) */
	json_t *reply;  /* the daemon's answer: owns every string handed out */
	const char *version, *digest;
	void *arena;    /* host: the whole arena, PROT_READ, MAP_SHARED (NULL when empty) */
	size_t arena_len;
	struct hwfs_tensor *t;
	size_t n;
	uint64_t *shapes; /* every tensor's shape, one after the other */
	size_t *by_name;  /* tensor indices sorted by name, then index */
	struct lib_region *regions;
	size_t n_regions;
	int device;       /* -1: host memory; else the CUDA device of the buckets */
	struct cudart *rt;/* device maps: the runtime that opened the buckets */
	void **buckets;   /* device maps: every bucket's IPC mapping (NULL: not opened) */
	size_t n_buckets;
};

/**
 * lib_map_new() - a zeroed map holding one reference (the caller's), with no
 * connection (fd -1) and device -1.  NULL when out of memory.
 */
struct hwfs_map *lib_map_new(void);

/**
 * lib_map_request() - the request half of hwfs_map() and hwfs_map_gpu():
 * connect @m's lease connection (m->fd, also rd->fd), send @req and take the
 * daemon's answer into m->reply, with m->version and m->digest pointing into
 * it (not yet checked).  Returns 0, or -errno with the thread's sentence set.
 */
int lib_map_request(struct hwfs *h, struct hwfs_map *m, json_t *req, struct ctl_reader *rd);

/** lib_map_hold() - take one more reference on @m (any thread). */
void lib_map_hold(struct hwfs_map *m);

/**
 * lib_map_put() - drop one reference on @m (any thread; NULL is a no-op); the
 * last one unmaps: host regions and the arena are unmapped, device buckets
 * closed (cudaIpcCloseMemHandle on the map's device), then the connection is
 * closed, which ends the lease.
 */
void lib_map_put(struct hwfs_map *m);

/**
 * lib_gpu_release() - the device part of the real unmap of @m (libhwfs_gpu.c):
 * close every opened bucket on the map's device, free the bucket table and
 * the runtime.  Nothing for a host map.
 */
void lib_gpu_release(struct hwfs_map *m);

/**
 * lib_map_index() - sort the by_name index of @m's m->n tensors (m->by_name
 * allocated for them).  For hwfs_map_find().
 */
void lib_map_index(struct hwfs_map *m);

/**
 * lib_valid_file_path() - is @path a file path inside a version: relative,
 * each component a valid name (lib_valid_name)?  1 or 0.
 */
int lib_valid_file_path(const char *path);

/**
 * lib_parse_hash() - 32 hex digits @hex into @out (16 bytes, as printed).
 * Returns 0 or -EINVAL (NULL or not 32 hex digits).
 */
int lib_parse_hash(const char *hex, uint8_t out[16]);

/** lib_get_u64() - the unsigned integer member @key of @o into *@v.  Returns 0 or -EPROTO. */
int lib_get_u64(json_t *o, const char *key, uint64_t *v);

/**
 * lib_read_shape() - the JSON array @shape (non-negative integers) as @t's
 * shape: t->ndim set, the dimensions stored at *@shape_at (which advances past
 * them) and t->shape pointing there.  For the map and gpumap answers (@answer
 * names it in the sentence).  Returns 0 or -EPROTO with the sentence set.
 */
int lib_read_shape(json_t *shape, struct hwfs_tensor *t, uint64_t **shape_at, const char *answer);

/**
 * lib_watch_open() - hwfs_watch_open() with the request @req already built
 * ({"op": "watch"} or {"op": "engine", ...}); @engine says whether reports
 * are allowed.  Used by hwfs_watch_open() and hwfs_watch_open_gpu().
 */
int lib_watch_open(struct hwfs *h, json_t *req, int engine, char **current,
		   struct hwfs_watch **out);

#endif /* HWFS_LIBHWFS_I_H */
