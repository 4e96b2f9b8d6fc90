/*
 * coord_i.h — private declarations shared by the files of the coordinator:
 * coord.c (the nodes and the cluster's state: HELLO, ANNOUNCE, HAVE, status,
 * the state directory, the loop and coord_run()), coord_plan.c (who pulls
 * what from whom), coord_commit.c (the two-phase commit) and coord_status.c
 * (what the coordinator shows).  Besides them only planner.c includes it:
 * it runs coord_plan.c on a struct coord of its own, with no sockets, for
 * models of a replication (planner.h).  The public API is coord.h.
 *
 * Everything runs on the coordinator's one thread.
 */
#ifndef HWFS_COORD_I_H
#define HWFS_COORD_I_H

#include "coord.h"
#include "proto.h"
#include "tunables.h"

/* policy (node_dead_ms, node_expiry_s) is in the tunables table; these are not policy */
#define MAX_NODES 1024             /* a memory bound of the have-table (protocol limit) */
#define TICK_MS 100                /* longest poll: how late a deadline or a death is noticed */
#define MIN_COMMIT_DEADLINE_MS 100 /* a COMMIT_REQ.deadline_ms below this is raised to it */
#define MAX_COMMIT_DEADLINE_MS 3600000 /* and one above (the tunable's own bound) cut to it */
#define MAX_NODE_REASON 1024       /* bytes of a node's READY or ACK reason kept (longer: cut) */
#define PICK_BASE_CANDIDATES 8     /* newest held versions pick_base() compares */

struct cnode {
	char *name;
	char *addr;
	char *key; /* its public key, with CURVE (what its pullers are told) */
	char *bound_key; /* with CURVE: the authenticated key it joined with; its name is bound to it */
	double last_seen;
	int was_alive;      /* for noticing deaths */
	int welcome_due;    /* it died: its next HELLO is a rejoin, whatever it sent before */
	char *session;      /* the agent incarnation (HELLO.session): a new one is a rejoin */
	uint64_t bad_shards; /* reported by its pullers */
	uint64_t join_seq;
	json_t *versions; /* name -> {digest, complete, bytes_held, bytes_needed} */
	json_t *plans;    /* name -> {donors: [node names], stripe}: the last PLAN it was sent */
	json_t *engines;  /* its engines as of its last HELLO (checked: proto_hello_engines) */
	uint64_t wire_rx, wire_tx; /* its replication wire bytes, as of its last HELLO */
	char *current;    /* what its `current` names, as of its last HELLO (NULL: none) */
};

struct cversion {
	char *name;
	char digest[HWFS_HASH_HEX];
	void *manifest;
	size_t mlen;
	char *origin;
	uint64_t bytes; /* distinct shard bytes: what a complete holder holds */
	struct hwfs_vrec *rec; /* the manifest parsed, once a plan needed it (pick_base) */
	json_t *affinity;      /* digest of another version -> bytes of this one with a base there */
	double announced;      /* its first ANNOUNCE here (monotonic s) */
	double converge_s;     /* announce -> complete on every live node; < 0: not yet */
};

struct tx {
	int active;
	uint64_t txid;
	char *version;
	char requester[256];
	uint64_t req;
	int phase; /* 1 prepare, 2 commit */
	json_t *pending; /* node names still to answer (at the end: the unknown ones) */
	json_t *nodes;   /* the participants */
	json_t *done;    /* nodes that ACKed the flip */
	json_t *failed;  /* node -> reason: refused READY, or ACKed a failed flip */
	double deadline;
	double started;  /* the COMMIT_REQ (monotonic s) */
	json_t *ready_s; /* node -> seconds from the request to its READY */
	/* where the time went (docs/benchmarks.md, "Commit latency"): */
	double decided_s;   /* request -> the decision recorded and COMMIT sent */
	double record_s;    /* of which recording it (--state: write, fsync, rename) */
	json_t *ack_s;      /* node -> seconds from the request to its ACK */
	json_t *prepare_us; /* node -> its READY's prepare_us (checks, engine barrier) */
	json_t *flip_us;    /* node -> its ACK's flip_us (flip and its record) */
};

struct coord {
	const struct coord_opts *o;
	char endpoint[256]; /* what we listen on; a :* port resolved (ZMQ_LAST_ENDPOINT) */
	void *ctx, *sock;
	struct keys *keys;
	struct cnode *nodes;
	size_t n_nodes;
	uint64_t join_seq;
	struct cversion *vers;
	size_t n_vers;
	char *committed;
	uint64_t epoch; /* commit decisions so far (with --state, across restarts) */
	struct tx tx;
	uint64_t next_txid;
	uint64_t refused;     /* messages dropped from peers that are not joined nodes */
	char warned[64][160]; /* "peer|reason" already logged (refuse()) */
	size_t n_warned;
	json_t *commits;  /* the last COORD_HISTORY commits, oldest first (coord_status.c) */
	double status_at; /* next coord_opts.status call (monotonic s) */
	/*
	 * Where a plan goes: the PLAN's @fields (consumed) for node @to, pulling
	 * @v.  coord.c sends it; planner.c hands it to its caller.
	 */
	void (*plan_out)(struct coord *c, struct cnode *to, struct cversion *v, json_t *fields);
	void *plan_arg; /* the hook's own state (planner.c's) */
};

#define COORD_HISTORY 20 /* commits and versions the status keeps */

/* coord.c: nodes, versions, the state directory */

/** Send @t with @fields (consumed) to node @node; a failure is logged. */
void coord_send(struct coord *c, const char *node, enum proto_type t, json_t *fields,
		const void *payload, size_t len);
/** Has @n been heard from within node_dead_ms?  Returns 1 or 0. */
int coord_alive(const struct cnode *n);
/** The node named @name, or NULL. */
struct cnode *coord_node(struct coord *c, const char *name);
/** The version named @name, or NULL. */
struct cversion *coord_version(struct coord *c, const char *name);
/** Does @n hold @v complete, with the cluster's digest?  Returns 1 or 0. */
int coord_node_has(const struct cnode *n, const struct cversion *v);
/** Record in the have-table what @n holds of @version. */
void coord_set_have(struct cnode *n, const char *version, const char *digest, int complete,
		    json_int_t held, json_int_t needed);
/** Free what @n owns (not @n). */
void coord_cnode_free(struct cnode *n);
/** Free what @v owns (not @v). */
void coord_cversion_free(struct cversion *v);
/** Write the committed version and epoch to the --state directory (if any). */
void coord_save_committed(struct coord *c);

/* coord_plan.c: planning */

/** Plan @v for every alive node that lacks it (a tree of the fan-out under the announcer). */
void plan_all(struct coord *c, struct cversion *v);
/** A node that (re)joined: plan every version it lacks, donors = all holders, striped. */
void plan_for(struct coord *c, struct cnode *to);
/** Forget the versions @n was still pulling: they are re-planned from scratch. */
void plan_forget_pulls(struct coord *c, struct cnode *n);
/**
 * Notice nodes that stopped answering; re-plan only the nodes that pulled from
 * one of them (its orphans), onto the dead node's own live upstream donors.
 */
void plan_deaths(struct coord *c);
/** @holder (re)joined: re-plan every alive node still pulling a version it holds. */
void plan_rejoined(struct coord *c, struct cnode *holder);

/* coord_commit.c: the two-phase commit */

/** COMMIT_REQ from node @from: start a transaction (PREPARE to every alive node). */
void commit_on_req(struct coord *c, const char *from, struct proto_msg *m);
/** READY from a participant; once all are ready the decision is made and sent. */
void commit_on_ready(struct coord *c, const char *from, struct proto_msg *m);
/** ACK of the flip from a participant; the last one answers the requester. */
void commit_on_ack(struct coord *c, const char *from, struct proto_msg *m);
/** The transaction's deadline passed: abort (phase 1) or report who flipped (phase 2). */
void commit_tick(struct coord *c);
/** Free what transaction @tx holds and zero it. */
void commit_tx_free(struct tx *tx);

/* coord_status.c: what the coordinator shows */
/**
 * coord_status_json() - the cluster as `hwfs status --cluster` shows it: the
 * coordinator, the committed version and epoch, every node (alive, seconds
 * since it was last heard, its versions and progress, engines, wire bytes),
 * the last commits (outcome, duration, each node's time to READY) and the
 * newest versions with their convergence time.  A new object, NULL without memory.
 */
json_t *coord_status_json(struct coord *c);
/** Hand the status to coord_opts.status when COORD_STATUS_MS passed (or it was asked). */
void coord_status_tick(struct coord *c);
/**
 * coord_record_commit() - the transaction ends with @outcome (committed,
 * partial, aborted): count it (hwfs_coord_commits_total: aborted is
 * "refused", partial "failed"; hwfs_coord_commit_duration_seconds) and keep
 * it in the history.  Called before the transaction is freed.
 */
void coord_record_commit(struct coord *c, const char *outcome, const char *reason);
/**
 * coord_converge_check() - versions now complete on every live node get their
 * time from the first announce (hwfs_coord_version_converge_seconds, the
 * status's "recent_versions").  Run after each message that may complete one.
 */
void coord_converge_check(struct coord *c);

#endif /* HWFS_COORD_I_H */
