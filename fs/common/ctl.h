/*
 * ctl.h — the local control channel between the `hwfs` command and its daemon.
 *
 * A unix stream socket (path published by the mount as the root xattr
 * `user.hwfs.control`; docs/cli.md, "Permissions", says where it lives and
 * who may do what: the daemon checks every connection's SO_PEERCRED).  Each
 * connection carries one request and its answer, all as JSON objects, one
 * per line:
 *   request   {"op": "seal", "version": "v1", ...}
 *   progress  {"progress": {"done": N, "total": M}}     (zero or more)
 *   answer    {"ok": true, ...}  or  {"ok": false, "error": "one line", "errno": N}
 * Every error answer carries "errno", a positive errno number of this machine
 * (docs/libhwfs.md, "Errors", has what each means); clients act on it, never
 * on the sentence.
 * Lines are limited to CTL_MAX_LINE bytes; a longer or malformed line is an
 * error, never a crash.  The daemon reads requests with the much smaller
 * CTL_MAX_REQUEST: it reads a request before it knows who may run the verb,
 * so any local user could otherwise make it buffer CTL_MAX_LINE per
 * connection.
 */
#ifndef HWFS_CTL_H
#define HWFS_CTL_H

#include <jansson.h>
#include <sys/types.h>

#include "hwfs_common.h"

#define CTL_MAX_LINE (256u << 20)
/* the longest request the daemon reads: an op, a version name and a path fit many times */
#define CTL_MAX_REQUEST (64u << 10)

/* The largest "errno" an error answer may carry (the kernel's own limit). */
#define CTL_ERRNO_MAX 4095

/**
 * ctl_errno() - the "errno" member of error answer @res when it is an integer
 * in 1..CTL_ERRNO_MAX, else 0: the answer came over a socket, so anything
 * else in that field (missing, a string, a float, negative, huge) is treated
 * as no errno at all.
 */
int ctl_errno(json_t *res);

/**
 * Listen on @path (replacing a stale socket) and give the socket file @mode
 * explicitly, whatever the umask.  Returns the fd or -errno (nothing is left
 * at @path then).
 */
int ctl_listen(const char *path, mode_t mode);

/** Who is at the other end of a control connection (the kernel's word, at connect). */
struct ctl_peer {
	pid_t pid;
	uid_t uid;
	gid_t gid;       /* primary group */
	gid_t *groups;   /* supplementary groups (SO_PEERGROUPS) */
	size_t n_groups;
};

/** Fill @p from SO_PEERCRED and SO_PEERGROUPS of @fd. Returns 0 or -errno. */
int ctl_peer(int fd, struct ctl_peer *p);
/** Free what ctl_peer() allocated. */
void ctl_peer_free(struct ctl_peer *p);
/** Is @gid the peer's primary or one of its supplementary groups? */
int ctl_peer_in_group(const struct ctl_peer *p, gid_t gid);
/** Connect to @path. Returns the fd or -errno. */
int ctl_connect(const char *path);
/**
 * Send @msg as one line (does not steal the reference); on a non-blocking
 * @fd, wait for room.  Returns 0 or -errno.
 */
int ctl_send(int fd, json_t *msg);
/**
 * ctl_send_fd() - like ctl_send(), and pass descriptor @passfd (>= 0) with the
 * line (SCM_RIGHTS on its first byte; the caller keeps its own copy).
 * Returns 0 or -errno.
 */
int ctl_send_fd(int fd, json_t *msg, int passfd);
/** A buffered line reader over one connection. */
struct ctl_reader {
	int fd;
	char *buf;
	size_t len, cap;
	size_t max; /* longest line accepted: CTL_MAX_LINE unless set after ctl_reader_init() */
	int accept_fds; /* 0 (the default): every descriptor received is closed at once;
			 * 1: keep the first one for ctl_take_fd() (libhwfs's map only) */
	int passed_fd; /* first descriptor received with SCM_RIGHTS, or -1 (ctl_take_fd) */
};

/**
 * Start reading @fd, accepting lines up to CTL_MAX_LINE bytes (see rd->max)
 * and no descriptors (see rd->accept_fds: a peer must not make us hold its
 * files open).
 */
void ctl_reader_init(struct ctl_reader *rd, int fd);
/** Free the buffer and close an untaken passed descriptor (rd->fd stays open). */
void ctl_reader_free(struct ctl_reader *rd);
/**
 * ctl_take_fd() - the descriptor that arrived with SCM_RIGHTS while reading
 * (close-on-exec), now the caller's; -1 when none did.  Only with
 * rd->accept_fds set, and only the first one is kept; any other descriptor is
 * closed as it arrives.
 */
int ctl_take_fd(struct ctl_reader *rd);
/**
 * Receive one line into *@msg (new reference). Returns 0, -EPIPE at EOF,
 * -EMSGSIZE (longer than rd->max: nothing more is read), -EBADMSG (not a JSON
 * object; a last line cut short by EOF is this once, then -EPIPE), -errno.
 */
int ctl_recv(struct ctl_reader *rd, json_t **msg);
/**
 * ctl_reader_has_line() - does @rd hold a whole line already, so that
 * ctl_recv() returns without reading?  Returns 1 or 0.  A caller that polls
 * rd->fd must ask this first: a line already read is not readable on the fd.
 */
int ctl_reader_has_line(const struct ctl_reader *rd);
/**
 * ctl_reader_fill() - one read (which blocks only if nothing is waiting) into
 * @rd's buffer, for a caller that polls rd->fd and must not block until a
 * whole line came.  Returns the number of bytes read (> 0), 0 at EOF,
 * -EMSGSIZE (the buffer holds rd->max bytes without a newline), -errno.
 */
ssize_t ctl_reader_fill(struct ctl_reader *rd);

#endif /* HWFS_CTL_H */
