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

#include "hwfs_common.h"
#include "store.h"

struct agent;

/*
 * What the agent asks of its node: the namespace, the mount and the engines
 * live above the replicator (fs/ns, fs/daemon), so the daemon hands the agent
 * these hooks (fs/daemon/daemon_repl.c) and the replicator includes nothing
 * of theirs.  Each is called on the agent thread with agent_opts.arg, must
 * not block for long, and returns 0 or -errno unless it says otherwise.
 */
struct agent_hooks {
	/*
	 * The versions this node holds sealed, in creation order, as a new JSON
	 * array of {"name": N, "digest": 32 hex digits} (the daemon's own hidden
	 * staging versions left out); NULL without memory.
	 */
	json_t *(*versions)(void *arg);
	/* Version @name's state and digest: 0, or -ENOENT when there is none. */
	int (*lookup)(void *arg, const char *name, enum hwfs_vstate *state, hwfs_hash_t *digest);
	/* A record of sealed version @name (free with hwfs_vrec_free()); -ENOENT if none. */
	int (*snapshot)(void *arg, const char *name, struct hwfs_vrec **out);
	/* The version `current` names (malloc'd), or NULL: none. */
	char *(*current)(void *arg);
	/*
	 * May the node flip to @name, the cluster's version with @digest: is it
	 * here sealed, intact and with that digest?  0, or -errno with the
	 * reason in @err.
	 */
	int (*committable)(void *arg, const char *name, const hwfs_hash_t *digest, char *err,
			   size_t errlen);
	/*
	 * Every shard of @rec (a checked manifest) is in the store: build version
	 * rec->name from it and seal it through the mount (inotify watchers see
	 * it arrive), then check its digest against rec->digest; a version that
	 * fails is removed.  Takes over @rec's strings and tensors (the caller
	 * still frees @rec).  0, or -errno with the reason in @err.
	 */
	int (*import)(void *arg, struct hwfs_vrec *rec, char *err, size_t errlen);
	/* Flip current to versions/@version through the mount: 0, or -errno with @err. */
	int (*flip_current)(void *arg, const char *version, char *err, size_t errlen);
	/*
	 * The engine barrier (docs/engines.md), or NULL: are the node's engines
	 * ready for a commit of @version, asked at PREPARE and again on every
	 * pass of the loop while pending?  Must not block.  Returns 0 (ready),
	 * -EINPROGRESS (ask again; agent_wake() says when something changed) or
	 * another -errno with the reason in @err (READY not ok).  @started_ns
	 * (hwfs_mono_ns()) is when the PREPARE arrived.
	 */
	int (*barrier)(void *arg, const char *version, uint64_t started_ns, char *err,
		       size_t errlen);
	/* This node's engines for the HELLO (a new JSON array), or NULL: none sent. */
	json_t *(*engines)(void *arg);
};

struct agent_opts {
	const char *node;        /* this node's name (routing id) */
	const char *listen;      /* data-plane endpoint, tcp://HOST:PORT */
	const char *coordinator; /* coordinator endpoint */
	const char *keys;        /* key directory (keys.h), or NULL: no CURVE */
	struct store *st;
	const struct agent_hooks *hooks; /* every hook but barrier and engines is required */
	void *arg;                       /* the hooks' first argument */
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
 * "error":...} object; any other op (or none) is answered at once, without
 * the coordinator, by {"ok":false, "error":..., "errno":EOPNOTSUPP}.
 * Returns 0, -EHOSTUNREACH at once when the coordinator has not answered the
 * heartbeats lately, -ECONNRESET when it stops answering while the call
 * waits (the outcome is then unknown), -ETIMEDOUT, -ENOMEM.
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
 * thread): "io_threads" (the ZeroMQ I/O threads of its sockets, tunable
 * zmq_io_threads), "cpu" {agent_s, io_s, codec_s, receive_s, forward_s,
 * serve_s} (CPU seconds of the agent thread, the context's ZeroMQ I/O
 * threads and the codec workers, by their thread clocks; of the agent
 * thread's, receiving, forwarding and serving: docs/operations.md,
 * "Replication CPU"), "bytes_received"/"bytes_sent" (shard bytes: a shard that
 * travelled as a delta counts its whole size), "wire_bytes_received"/
 * "wire_bytes_sent" (SHARD payload bytes, what crossed the wire),
 * "requests_received" (each hash of each GET received), "requests_sent"
 * (each hash of each GET sent), "retries" (shard requests moved to another
 * donor), and "delta" {encoded, encode_bytes, encode_cpu_s, decoded,
 * decode_bytes, decode_cpu_s, sent, received, failed, whole, ahead_encoded,
 * ahead_hits, ahead_cancelled, forwarded, asked} (docs/delta.md).  NULL without memory.
 */
json_t *agent_counters(struct agent *a);
/** Has the coordinator answered the heartbeats lately (coord_silence_ms)?  1 or 0, any thread. */
int agent_coord_reachable(struct agent *a);
/** The data-plane endpoint bound (a :* port resolved); valid until agent_stop(). */
const char *agent_endpoint(const struct agent *a);

#endif /* HWFS_AGENT_H */
