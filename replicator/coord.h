/*
 * coord.h — the replication coordinator (`hwfs coord`).
 *
 * One ROUTER socket; every node's DEALER connects with its node name as
 * routing id.  The coordinator keeps the have-table (which node holds which
 * version), the manifests of the versions it has been told about, and the
 * committed version; it plans who pulls from whom and runs the two-phase
 * commit.  It moves no shard bytes itself.
 */
#ifndef HWFS_COORD_H
#define HWFS_COORD_H

#include <jansson.h>

#include "hwfs_common.h"

struct coord_opts {
	const char *listen;   /* tcp://HOST:PORT */
	const char *state;    /* directory for the committed version, or NULL */
	const char *keys;     /* key directory (keys.h): CURVE on, unknown keys refused */
	/*
	 * Broadcast fan-out: receivers sit in a tree rooted at the announcer in
	 * join order, each pulling from its parent.  1 = chain (the default),
	 * K = tree:K, 0 = star (everyone pulls from the announcer).
	 */
	unsigned fanout;
	int notify_fd;        /* >= 0: "ok\n" or "error: ...\n" once listening, then closed */
	char *bound;          /* out, or NULL: the endpoint bound (tcp://HOST:PORT for HOST:*) */
	size_t bound_len;
	/*
	 * Embedded in a node's daemon: stop when *stop becomes non-zero, and
	 * leave signals to the host.  NULL: a process of its own, stopped by
	 * SIGINT/SIGTERM.  Another thread writes it while coord_run() reads it:
	 * coord_run() reads it with __atomic_load_n(), and the writer must use
	 * __atomic_store_n(stop, 1, __ATOMIC_RELEASE) (volatile is not enough;
	 * it stays in the type only so existing callers compile).
	 */
	volatile int *stop;
	/*
	 * The cluster's status for an observer (the HTTP endpoint of `hwfs coord
	 * --http`), or NULL: called on the coordinator's thread every
	 * COORD_STATUS_MS and after each change of a commit, with the "cluster"
	 * object of `hwfs status --cluster --json` plus its history ("commits",
	 * "recent_versions"), borrowed for the call.  It must not block.
	 */
	void (*status)(void *arg, json_t *cluster);
	void *status_arg;
};

#define COORD_STATUS_MS 500

/** Serve until stopped. Returns 0, or -errno when it could not start. */
int coord_run(const struct coord_opts *o);

#endif /* HWFS_COORD_H */
