/*
 * ctl.h — the local control channel between the `hwfs` command and its daemon.
 *
 * A unix stream socket (path published by the mount as the root xattr
 * `user.hwfs.control`).  Each connection carries one request and its answer,
 * all as JSON objects, one per line:
 *   request   {"op": "seal", "version": "v1", ...}
 *   progress  {"progress": {"done": N, "total": M}}     (zero or more)
 *   answer    {"ok": true, ...}  or  {"ok": false, "error": "one line"}
 * Lines are limited to CTL_MAX_LINE bytes; a longer or malformed line is an
 * error, never a crash.
 */
#ifndef HWFS_CTL_H
#define HWFS_CTL_H

#include <jansson.h>

#include "hwfs_common.h"

#define CTL_MAX_LINE (256u << 20)

/** Listen on @path (replacing a stale socket). Returns the fd or -errno. */
int ctl_listen(const char *path);
/** Connect to @path. Returns the fd or -errno. */
int ctl_connect(const char *path);
/** Send @msg as one line (does not steal the reference). Returns 0 or -errno. */
int ctl_send(int fd, json_t *msg);
/** A buffered line reader over one connection. */
struct ctl_reader {
	int fd;
	char *buf;
	size_t len, cap;
};

/** Start reading @fd. */
void ctl_reader_init(struct ctl_reader *rd, int fd);
/** Free the buffer (the fd stays open). */
void ctl_reader_free(struct ctl_reader *rd);
/**
 * Receive one line into *@msg (new reference). Returns 0, -EPIPE at EOF,
 * -EBADMSG (not a JSON object, or longer than CTL_MAX_LINE), -errno.
 */
int ctl_recv(struct ctl_reader *rd, json_t **msg);

#endif /* HWFS_CTL_H */
