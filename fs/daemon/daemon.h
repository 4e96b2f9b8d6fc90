/*
 * daemon.h — one hwfs node: the store, the namespace, the FUSE session and
 * the control socket, from mount to unmount.
 */
#ifndef HWFS_DAEMON_H
#define HWFS_DAEMON_H

#include "hwfs_common.h"

struct daemon_opts {
	const char *mountpoint; /* absolute path */
	const char *store;      /* store directory */
	uint64_t capacity;      /* 0: keep / default */
	int preallocate;        /* allocate, touch and lock the whole arena at start-up */
	int pin;                /* --pin: preallocate, then pin the arena for CUDA
				 * (cudaHostRegister), or mlock it when there is no GPU */
	int notify_fd;          /* >= 0: write "ok\n" or "error: ...\n" once mounted, then
				 * close; "note: ...\n" lines may come before either */
	int debug;              /* FUSE debug output */
	const char *join;       /* coordinator endpoint to join, or NULL (single node) */
	const char *node;       /* this node's name (with join) */
	const char *listen;     /* data-plane endpoint (with join) */
	const char *keys;       /* CURVE key directory, or NULL */
	const char *coordinator; /* run a coordinator on this endpoint inside the daemon */
	long ctl_gid;           /* >= 0: this group may run mutating verbs (--ctl-group) */
	const char *http;       /* --http HOST:PORT: /metrics, /healthz, /readyz, or NULL */
	const char *http_hosts; /* --http-host: more names for Host:, comma-separated, or NULL */
};

/* Where a daemon run as root puts its control socket (PID.sock); see make_ctl_dir(). */
#define HWFS_CTL_DIR_ROOT "/run/hwfs"

/**
 * daemon_run() - open the store, mount, serve until unmounted or signalled.
 * Returns 0 after a clean unmount, or -errno if start-up failed (then the
 * reason has been written to notify_fd and logged).
 */
int daemon_run(const struct daemon_opts *o);

#endif /* HWFS_DAEMON_H */
