/*
 * libhwfs_i.h — what the files of libhwfs (libhwfs.c, libhwfs_map.c,
 * libhwfs_watch.c) share: the handle, the calling thread's error sentence and
 * the connection helpers.  Nothing here is exported: the library is built
 * with hidden visibility and exports only include/hwfs.h.
 */
#ifndef HWFS_LIBHWFS_I_H
#define HWFS_LIBHWFS_I_H

#include "hwfs_api.h"

/* the mount point hwfs_open() resolves when given none and HWFS_MOUNT is unset */
#define LIB_DEFAULT_MOUNT "/hotweights"
/* the root xattr that names the daemon's control socket */
#define LIB_CONTROL_XATTR "user.hwfs.control"
/* longest error sentence kept per thread */
#define LIB_ERRMSG_MAX 1024
/* longest version name (and file path component) the daemon may send, in bytes */
#define LIB_NAME_MAX 255

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
 * the daemon's "error" and return the answer's "errno" (negated) when the
 * daemon gives one.  Only when it does not (an older daemon, a refusal it
 * does not number) is the errno guessed from the wording, which may quote
 * the caller's own version name: -ENOENT for "no such ...", -EACCES for
 * "permission denied", -EBUSY for an open version, -EIO for a damaged one,
 * -EEXIST for a name taken, else -EIO.
 */
int lib_check(json_t *res);

/** A string member of @o, or NULL when absent or not a string. */
const char *lib_jstr(json_t *o, const char *key);

/**
 * lib_valid_name() - may @name be a version name (or one component of a
 * file path) the daemon sends?  1 when it is 1-255 bytes, not "." or "..",
 * with no '/' and no control character (< 0x20, 0x7f), else 0.  The daemon
 * itself never makes another one (fs/ns_tree.c valid_name, which also checks
 * UTF-8): a name that fails here is a daemon that lies, and is refused
 * before it becomes a path.
 */
int lib_valid_name(const char *name);

#endif /* HWFS_LIBHWFS_I_H */
