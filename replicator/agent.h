/*
 * agent.h — the replication agent inside a node's daemon.
 *
 * One thread owns every ZeroMQ socket of the node: a DEALER to the
 * coordinator (routing id = node name), a ROUTER on the node's --listen
 * address that serves shards to other nodes, and a DEALER per donor it pulls
 * from.  Other threads talk to it only through agent_sealed() and
 * agent_call(), which queue work and wake it through a pipe.
 *
 * Pulling: for a planned version the agent requests, in manifest order, the
 * shards the store lacks (the delta) from its first donor, keeping a bounded
 * window in flight; every shard is hash-checked before it is interned; a
 * MISSING answer, a bad shard or a silent donor moves the request to the next
 * donor.  A donor asked for a shard it is itself still receiving answers when
 * the shard arrives, which makes a chain of nodes a pipeline.  When every shard
 * is present the version is built as a hidden open version and renamed into
 * versions/ through the mount — that rename seals it, and inotify watchers see
 * it arrive — then its digest is checked against the manifest.
 */
#ifndef HWFS_AGENT_H
#define HWFS_AGENT_H

#include <jansson.h>

#include "ns.h"

struct agent;

struct agent_opts {
	const char *node;        /* this node's name (routing id) */
	const char *listen;      /* data-plane endpoint, tcp://HOST:PORT */
	const char *coordinator; /* coordinator endpoint */
	const char *mountpoint;
	const char *keys;        /* key directory (keys.h), or NULL: no CURVE */
	struct ns *ns;
	struct store *st;
	/* Flip MOUNT/current to versions/@version through the mount (daemon.c). */
	int (*flip_current)(void *arg, const char *version, char *err, size_t errlen);
	void *arg;
	/*
	 * The engine barrier (docs/engines.md), or NULL: are the node's engines
	 * ready for a commit of @version, asked at PREPARE and again on every
	 * pass of the loop while pending?  Must not block.  Returns 0 (ready),
	 * -EINPROGRESS (ask again; agent_wake() says when something changed) or
	 * another -errno with the reason in @err (READY not ok).  @started_ns
	 * (monotonic) is when the PREPARE arrived.
	 */
	int (*barrier)(void *arg, const char *version, uint64_t started_ns, char *err,
		       size_t errlen);
	/* This node's engines for the HELLO (a new JSON array), or NULL: none sent. */
	json_t *(*engines)(void *arg);
};

/**
 * Start the agent thread. Returns 0 or -errno (e.g. the listen address is
 * taken).  *@out is written with a release store: a thread other than the
 * caller that reads the pointer must load it with __atomic_load_n(...,
 * __ATOMIC_ACQUIRE) to see a started agent.
 */
int agent_start(const struct agent_opts *o, struct agent **out);
/** Stop the thread and close everything. NULL is a no-op. */
void agent_stop(struct agent *a);

/** Seal hook (any thread): announce version @name to the coordinator. */
void agent_sealed(void *agent, const char *name);

/**
 * agent_wake() - (any thread, never blocks) make the agent's loop run a pass
 * now: an engine reported or went away, so a pending barrier is re-checked
 * at once rather than at the next poll timeout, and the coordinator hears
 * the node's engines in an early HELLO.
 */
void agent_wake(void *agent);

/**
 * agent_call() - ask the coordinator (any thread, blocking up to @timeout_ms):
 * {"op":"commit","version":V} (two-phase commit) or {"op":"cluster"} (cluster
 * status). *@res gets the coordinator's answer fields, or an {"ok":false,
 * "error":...} object. Returns 0, -EHOSTUNREACH at once when the coordinator
 * has not answered the heartbeats lately, -ECONNRESET when it stops answering
 * while the call waits (the outcome is then unknown), -ETIMEDOUT, -ENOMEM.
 */
int agent_call(struct agent *a, json_t *req, json_t **res, int timeout_ms);

/**
 * agent_pulls() - the versions this node is pulling, as a new JSON array
 * (any thread; a snapshot at most 0.25 s old): [{"version", "bytes_held",
 * "bytes_total"[, "waiting": "waiting for space: need X, free Y",
 * "need_bytes", "free_bytes"]}].  NULL without memory.
 */
json_t *agent_pulls(struct agent *a);

/**
 * agent_counters() - the replication counters as a new JSON object (any
 * thread): "bytes_received"/"bytes_sent" (shard bytes: a shard that
 * travelled as a delta counts its whole size), "wire_bytes_received"/
 * "wire_bytes_sent" (SHARD payload bytes, what crossed the wire),
 * "requests_received" (each hash of each GET received), "retries" (shard
 * requests moved to another donor), and "delta"
 * {encoded, encode_bytes, encode_cpu_s, decoded, decode_bytes, decode_cpu_s,
 * sent, received, failed, whole} (docs/delta.md).  NULL without memory.
 */
json_t *agent_counters(struct agent *a);
/** Has the coordinator answered the heartbeats lately (coord_silence_ms)?  1 or 0, any thread. */
int agent_coord_reachable(struct agent *a);
/** The data-plane endpoint bound (a :* port resolved); valid until agent_stop(). */
const char *agent_endpoint(const struct agent *a);

#endif /* HWFS_AGENT_H */
