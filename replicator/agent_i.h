/*
 * agent_i.h — private declarations shared by the files of the replication
 * agent: agent.c (the session with the coordinator, the thread, the public
 * API), agent_commit.c (PREPARE/COMMIT/ABORT, the cluster's decision),
 * agent_recv.c (what a pull receives: shards, deltas), agent_pull.c
 * (pulling versions from donors: the fetch, its donors, the version built),
 * agent_serve.c (serving shards to pullers, the deltas kept and encoded
 * ahead) and agent_pool.c (the codec workers), which call each other in that
 * order only.  Nothing outside those files
 * includes it; the public API is agent.h.
 *
 * Everything declared here runs on the agent thread unless its comment says
 * otherwise.
 */
#ifndef HWFS_AGENT_I_H
#define HWFS_AGENT_I_H

#include <pthread.h>
#include <time.h>
#include <xxhash.h>

#include "agent.h"
#include "agent_pool.h"
#include "delta.h"
#include "proto.h"
#include "store.h"
#include "tunables.h"

/*
 * Policy (windows, periods, timeouts) is in the tunables table (tunables.h,
 * hwfs_tun); what is left here is granularity, not policy.
 */
#define LOOP_TICK_MS 100      /* longest poll: how late a timer of the loop may fire */
#define CALL_CHECK_MS 500     /* agent_call() looks at the coordinator's silence this often */
#define PULLS_SNAPSHOT_S 0.25 /* agent_pulls() is at most this old (agent.h) */
#define ENGINES_HELLO_GAP_S 0.05 /* an engine change reaches the coordinator at most this late */
#define HANDLE_BURST 256      /* messages taken from one socket before looking at the others */
#define BADMSG_LOG_GAP_S 10.0 /* at most one "malformed message" line this often (a v1 peer) */
#define DCACHE_MAX_ENTRIES 65536 /* deltas (and "not worth it" marks) kept, whatever their bytes */
#define DELTA_PROBES 64          /* windows worth_encoding() encodes as a sample first */
#define DELTA_PROBE_BYTES 4096   /* bytes of each (a multiple of every element width) */
#define ENCODE_WAIT_MAX 4096     /* requests waiting on encodes; more are answered whole */
#define AHEAD_CANDIDATES 8       /* newest versions here encode-ahead compares (as pick_base()) */
#define IMPORTED_KEEP 8          /* versions pulled here remembered (not encoded ahead) */

/*
 * Where one shard of a version being pulled stands.  W_REBUILD: its whole
 * delta is here and a codec worker rebuilds it (job @job); nothing is asked
 * of a donor for it meanwhile.
 */
enum want_state { W_QUEUED, W_INFLIGHT, W_REBUILD, W_HELD };

/* One distinct shard of a version being pulled (agent_pull.c). */
struct want {
	hwfs_hash_t hash;
	uint64_t size;
	enum want_state state;
	size_t donor;     /* index into the fetch's donors */
	size_t tries;     /* donors given up on for this shard */
	int misses;       /* MISSING answers from the current donor */
	double not_before;
	double sent_at;   /* when it was last asked for */
	struct shard *sh; /* held: one reference, dropped after import */
	/*
	 * Deltas (docs/delta.md): @base is the shard of an earlier version of
	 * the same tensor that this node holds (zero: none), @width its element
	 * width; @whole is set once a delta of it failed (or its base went):
	 * from then on it is asked for whole.
	 */
	hwfs_hash_t base;
	unsigned width;
	int whole;
	/* arriving in pieces, in order, from one donor */
	uint64_t got;       /* bytes received (of the shard, or of its delta) */
	uint64_t roff;      /* its staging range (unbacked, store_stage_write()) */
	XXH3_state_t *xs;   /* running hash, NULL when no whole shard is arriving */
	uint8_t *enc;       /* a delta arriving: its bytes (NULL when none is); in W_REBUILD
			       the job's (borrowed: read-only, to forward it) */
	uint64_t enc_total; /* its length, as the first piece declared */
	const void *from;   /* the peer the pieces come from */
	uint64_t job;       /* W_REBUILD: the id of its rebuild job */
};

/* A version being pulled: its shards, donors and progress (agent_pull.c). */
struct fetch {
	char *name;
	hwfs_hash_t digest;
	struct hwfs_vrec *rec;
	struct want *w;
	size_t n;
	char **donors; /* endpoints, in preference order */
	char **donor_names;
	char **donor_keys; /* CURVE public keys, or NULL entries */
	size_t n_donors;
	int stripe;
	uint64_t bytes_needed; /* shard bytes missing when the pull began */
	uint64_t bytes_held;   /* of those, pulled since */
	uint64_t total;   /* distinct shard bytes of the version */
	double last_rx, last_report;
	uint64_t planned_ns; /* monotonic: the PLAN arrived (hwfs_version_arrival_seconds) */
	int ring_warned; /* "every donor failed once" logged for this fetch */
	/* waiting for space: the store could not take the next shard */
	int space_wait;  /* the store could not take a shard that arrived: back off */
	int room_wait;   /* what is left to ask for does not fit: ask for none of it */
	double space_retry_at, space_backoff; /* next retry; its period (0: never waited) */
	uint64_t space_free;                  /* free arena bytes when it stopped */
	struct fetch *next;
};

/* A GET for a shard still arriving here, answered when it is (agent_serve.c). */
struct deferred {
	uint8_t ident[256];
	size_t ident_len;
	uint64_t req;
	hwfs_hash_t hash;
	hwfs_hash_t base; /* the base the puller holds (zero: none), and its width */
	unsigned width;
	uint64_t sent; /* bytes of it forwarded already while it was arriving */
	/*
	 * @dmode: the delta this node receives (against the same base) is
	 * forwarded to it as it arrives, @sent counting the delta's bytes; the
	 * last byte goes only once this node rebuilt and verified the shard.
	 */
	int dmode;
	struct deferred *next;
};

/*
 * An encoded delta kept to be sent again (agent_serve.c, "encode once"):
 * shard @hash against @base, shuffled by @width; @enc NULL with @len 0
 * records that the delta is not worth sending (larger than delta_max_pct).
 */
struct dentry {
	hwfs_hash_t base, hash;
	unsigned width;
	uint8_t *enc;
	size_t len;
	int ahead; /* encoded ahead of demand and not sent yet */
	struct dentry *chain;      /* next in its hash bucket */
	struct dentry *newer, *older; /* the recency list */
};

/*
 * The deltas kept: a hash table of entries on (hash, base, width) and a
 * recency list, so finding, adding and evicting are O(1).  At most
 * delta_cache_bytes of entries (their bytes and their own size) and
 * DCACHE_MAX_ENTRIES entries; the least recently sent go first.
 */
struct dcache {
	struct dentry **bucket;
	size_t n_bucket, n;
	uint64_t bytes;
	struct dentry *newest, *oldest;
};

/* Delta counters (all atomic), as `hwfs status --json` shows them (replication.delta). */
struct delta_stats {
	uint64_t encoded, encode_bytes, encode_ns;  /* deltas made here, their shard bytes, CPU */
	uint64_t decoded, decode_bytes, decode_ns;  /* deltas rebuilt here */
	uint64_t sent, received;                    /* deltas that crossed the wire */
	uint64_t failed;  /* received deltas that did not rebuild the shard (asked whole again) */
	uint64_t whole;   /* shards asked for with a base but sent whole (not worth it, no base) */
	uint64_t ahead_encoded;  /* deltas encoded ahead of demand (a version sealed here) */
	uint64_t ahead_hits;     /* deltas sent that encode-ahead had made (or was making) */
	uint64_t ahead_cancelled; /* encode-ahead runs given up: their version went */
	uint64_t forwarded; /* deltas sent on cut-through: pieces went before the rebuild here */
	uint64_t asked;     /* shards this node asked a donor for as deltas (a base named) */
};

/*
 * An encode a puller waits for (agent_serve.c): the job in the pool, and
 * the requests answered when it is done.  @batch: the encode-ahead run
 * that submitted it (NULL: a GET did, or its run was cancelled).
 */
struct penc {
	struct pool_job *job;
	struct deferred *waiters;
	struct ahead *batch;
	struct penc *next;
};

/* A shard to encode ahead of demand: its delta against @base, by @width. */
struct ahead_item {
	hwfs_hash_t base, hash;
	unsigned width;
};

/*
 * An encode-ahead run (agent_serve.c): version @name (sealed here with
 * @digest) against the version its receivers hold, shard by shard, at most
 * one job per codec worker in flight.
 */
struct ahead {
	char *name, *base_name;
	hwfs_hash_t digest;
	struct ahead_item *items;
	size_t n, next, inflight, done;
	uint64_t enc_bytes; /* of the deltas made: their mean sizes the next one */
	struct ahead *next_run;
};

/* A DEALER to one donor's serving socket, with its back-off (agent_pull.c). */
struct peer {
	char *addr;
	void *sock;
	/*
	 * Per-donor back-off: after a failure (bad or malformed shard, MISSING
	 * to the end, silence, a GET that could not be sent) the donor is not
	 * asked again before @until; the pause doubles from donor_backoff_ms up
	 * to donor_backoff_max_ms and ends with its next good shard.
	 */
	double backoff, until;
	struct peer *next;
};

/* An agent_call() waiting for the coordinator's answer (agent.c). */
struct call {
	uint64_t id;
	json_t *req;
	const struct agent_req *rq; /* its op's entry of the request table (agent.c) */
	json_t *res;
	int done;
	pthread_cond_t cv;
	struct call *next;
};

/*
 * The commit's state (agent_commit.c): the PREPARE that waits, the decision
 * that waits for its version, the decision applied.  Agent thread only.
 */
struct agent_commit {
	/*
	 * A PREPARE whose READY waits for the engine barrier: its txid, version
	 * (NULL: none pending), the cluster's digest of it (checked again
	 * before READY) and arrival (monotonic ns).  A newer PREPARE replaces
	 * it; an ABORT of its txid forgets it.
	 */
	char *prep_version;
	hwfs_hash_t prep_digest;
	uint64_t prep_txid, prep_started;
	/*
	 * When its wait for the engine barrier began (monotonic ns); 0 while
	 * the version is not here yet: a PREPARE that overtook the version's
	 * replication (a commit right after a publish on another node) waits
	 * for it to arrive, within the coordinator's deadline, then for the
	 * engines.
	 */
	uint64_t prep_barrier_ns;
	/*
	 * The last cluster decision (committed version, epoch) this node applied:
	 * a different one in a PONG/WELCOME is a commit it missed (it was away,
	 * or its flip failed) and it flips; the same one is left alone, so a
	 * `commit --local` override stands until the cluster commits again.
	 * agent.c's HELLO carries it.
	 */
	char *applied;
	uint64_t applied_epoch;
	char *pending_commit;   /* committed version to flip to once it is here */
	uint64_t pending_epoch; /* its decision's epoch */
	int flip_failing; /* the last flip to the cluster's version failed (logged once) */
};

/*
 * The pulls' state (agent_pull.c, agent_recv.c): the versions being pulled
 * and the donor connections.  Agent thread only, except where marked.
 */
struct agent_pull {
	struct fetch *fetches;
	struct peer *peers; /* one DEALER per donor address (agent.c polls them) */
	/*
	 * Set by agent_start(): a version pulled here arrived complete and was
	 * built (agent_commit.c flips to it if the cluster committed it).
	 */
	void (*arrived)(struct agent *a, const char *name);
	json_t *pulls;      /* under mu: the fetches as agent_pulls() reports them */
	double last_pulls;  /* when the agent thread last rebuilt it */
	uint64_t retries;   /* atomic: shard requests moved to another donor (next_donor) */
	uint64_t req_tx;    /* atomic: shard requests sent (hashes in this node's GETs) */
};

/*
 * The serving state (agent_serve.c): requests waiting, encodes in flight,
 * the deltas kept and the encode-ahead runs.  Agent thread only, except
 * where marked.
 */
struct agent_serve {
	struct deferred *deferred; /* GETs for shards still arriving here */
	struct penc *pencs;        /* encodes pullers wait for */
	size_t n_waiting;          /* requests waiting on them */
	struct ahead *aheads;      /* encode-ahead runs, oldest first */
	char *imported[IMPORTED_KEEP]; /* versions pulled here lately (not encoded ahead) */
	size_t n_imported;
	struct dcache dcache;      /* deltas kept to send again */
	/*
	 * Set by agent_start(): the want for shard @h among the pulls (and its
	 * fetch in *@fp), or NULL: pull_find_want() (agent_pull.c), which this
	 * file, after it, does not call.
	 */
	struct want *(*find_want)(struct agent *a, const hwfs_hash_t *h, struct fetch **fp);
	uint64_t req_rx; /* atomic: shard requests received (hashes in GETs) */
};

/*
 * The agent.  Its thread owns every field except: those set in agent_start()
 * before the thread starts and never written again (read by any thread:
 * listen through agent_endpoint(), pipe[1] through wake()), those marked
 * "atomic" (read and written only with __atomic builtins) and those marked
 * "under mu".  What each role keeps is in its own member: @commit, @pull,
 * @serve; the rest is the session with the coordinator, the loop and what
 * every role counts.
 */
struct agent {
	/*
	 * The options agent_start() was given, set before the thread starts:
	 * the strings are the agent's own copies (o.listen is replaced by the
	 * endpoint bound, a :* port resolved); o.keys is NULL once started.
	 */
	struct agent_opts o;

	void *ctx, *coord, *router; /* the coordinator's DEALER, the serving ROUTER */
	struct keys *keys;
	pthread_t thread;
	int running; /* agent_start()/agent_stop() only */
	int stop;    /* atomic: agent_stop() asks the thread to end */
	int pipe[2]; /* the wake-up pipe: set before the thread starts */

	pthread_mutex_t mu; /* guards sealed_q, n_sealed, the call lists and pull.pulls */
	char **sealed_q;
	size_t n_sealed;
	struct call *calls_new, *calls_wait;
	uint64_t next_req; /* agent thread only (also used under mu, by drain_queues()) */

	struct agent_commit commit; /* agent_commit.c */
	struct agent_pull pull;     /* agent_pull.c, agent_recv.c */
	struct agent_serve serve;   /* agent_serve.c */

	double last_hello;
	int engines_changed; /* atomic: set by agent_wake(); look whether the engines changed */
	json_t *hello_engines; /* the engines the last HELLO carried (agent thread only) */
	int64_t last_coord_ns; /* atomic: monotonic ns of the last coordinator message */
	int coord_send_failing; /* the last send to the coordinator failed (warned once) */
	char session[33];      /* this incarnation, so the coordinator notices a restart */
	uint64_t rx, tx; /* atomic: shard bytes received and sent (a delta counts its shard) */
	uint64_t wire_rx, wire_tx; /* atomic: SHARD payload bytes that crossed the wire */
	/*
	 * Atomic: CPU nanoseconds of the agent thread by the work it did
	 * (agent.c measures each handler with its thread's CPU clock, so the
	 * time it sleeps in zmq_poll() counts nowhere): @cpu_recv_ns taking
	 * SHARD pieces in (copy into the arena, hash, intern, rebuilt deltas
	 * interned), @cpu_fwd_ns of it passing them on cut-through
	 * (serve_forward*(): counted here, not in @cpu_recv_ns), @cpu_serve_ns
	 * answering GETs and sending what encodes made.  agent_counters()
	 * reports them beside the threads' own clocks (agent, ZeroMQ I/O,
	 * codec workers): docs/operations.md, "Replication CPU".
	 */
	uint64_t cpu_recv_ns, cpu_fwd_ns, cpu_serve_ns;
	struct delta_stats ds;
	struct pool *pool;     /* the codec workers (agent_pool.h) */
	uint64_t next_job;     /* the last job id given (agent thread) */
	double badmsg_logged; /* when a malformed message was last logged */
	uint64_t badmsg_quiet; /* malformed messages dropped since, not logged */
};

/* Monotonic seconds (the agent's clock for every timer). */
static inline double now_s(void)
{
	return hwfs_mono_s();
}

/* A tunable in milliseconds (hwfs_tun.*_ms), in the seconds of now_s(). */
static inline double ms_s(uint64_t ms)
{
	return (double)ms / 1000.0;
}

/*
 * The files call one way: agent.c -> agent_commit.c -> agent_recv.c ->
 * agent_pull.c -> agent_serve.c -> agent_pool.c; a file calls only files
 * after it.  What a later file needs of an earlier one it gets through a hook
 * agent_start() sets (agent_pull.arrived, agent_serve.find_want).
 */

/* agent_commit.c: PREPARE, COMMIT, ABORT and the cluster's decision */

/** The coordinator's last decision (@committed, @epoch) from a WELCOME or PONG: apply it. */
void commit_learn(struct agent *a, const char *committed, uint64_t epoch);
/** agent_start(): the decision applied before a restart, from the store. */
void commit_load_applied(struct agent *a);
/** Version @name arrived complete (agent_pull.arrived): flip to it if the cluster committed it. */
void commit_arrived(struct agent *a, const char *name);
/** PREPARE: check the version and ask the engine barrier; READY now or later. */
void commit_on_prepare(struct agent *a, struct proto_msg *m);
/** COMMIT: flip, record the decision, ACK. */
void commit_on_commit(struct agent *a, struct proto_msg *m);
/** ABORT: log it (with its errno) and forget the PREPARE it ends. */
void commit_on_abort(struct agent *a, struct proto_msg *m);
/** Every pass of the loop: the PREPARE that waits, if any; READY once it is decided. */
void commit_barrier_check(struct agent *a);
/** @left seconds, or less: until the engine deadline of the PREPARE that waits. */
double commit_wait_left(const struct agent *a, double left);
/** agent_stop(): free the commit's state. */
void commit_free(struct agent *a);

/* agent_recv.c: what a pull receives */

/** A SHARD piece from donor socket @peer (named @from in logs). */
void recv_on_shard(struct agent *a, struct proto_msg *m, const char *from, const void *peer);
/** A rebuild job finished (pool_take_done()): intern the shard, or fall back; frees @j. */
void recv_on_rebuilt(struct agent *a, struct pool_job *j);

/* agent_pull.c: the sockets to the coordinator and donors; pulling versions from donors */

/** Send @t with @fields (consumed) to the coordinator; a failure is logged once. */
void agent_send_coord(struct agent *a, enum proto_type t, json_t *fields, const void *payload,
		      size_t len);
/** Reconnect back-off, no linger, and no blocking send on a DEALER @sock. */
void agent_set_backoff(void *sock);
/** The want for shard @h in any fetch (and its fetch in *@fp), or NULL. */
struct want *pull_find_want(struct agent *a, const hwfs_hash_t *h, struct fetch **fp);
/** PLAN from the coordinator: start pulling a version, or take its new donors. */
void pull_on_plan(struct agent *a, struct proto_msg *m);
/** Forget a shard, or its delta, that was arriving in pieces (its staged range goes back). */
void pull_drop_partial(struct agent *a, struct want *w);
/**
 * pull_send_have() - HAVE: progress of @name here.  @bad_donor names a node
 * that sent a corrupt shard (or NULL), @waiting says why the pull does not
 * move (NULL or "").
 */
void pull_send_have(struct agent *a, const char *name, const hwfs_hash_t *digest, int complete,
		    uint64_t held, uint64_t needed, const char *bad_donor, const char *waiting);
/** HAVE for fetch @f in progress (with why it waits, if it does; @bad_donor or NULL). */
void pull_report(struct agent *a, struct fetch *f, const char *bad_donor);
/** The store cannot take the next shard of @f: stop asking, retry later (see agent_pull.c). */
void pull_wait_space(struct agent *a, struct fetch *f);
/** Is every shard of @f here?  Returns 1 or 0. */
int pull_complete(const struct fetch *f);
/** Every shard of @f is here: build and seal the version (import hook), then end @f. */
void pull_materialize(struct agent *a, struct fetch *f);
/** @f is over (built or given up): free it and answer the requests that waited on it. */
void pull_end(struct agent *a, struct fetch *f);
/** Give up on @f (@why is logged): report it and end it. */
void pull_fail(struct agent *a, struct fetch *f, const char *why);
/** Donor @d of @f failed (@why): back it off, doubling its pause up to donor_backoff_max_ms. */
void pull_donor_failed(struct agent *a, struct fetch *f, size_t d, const char *why);
/** The donor on socket @peer sent a good shard: its back-off ends. */
void pull_donor_ok(struct agent *a, const void *peer);
/** Give up on @w's current donor: the next one round the ring. */
void pull_next_donor(struct agent *a, struct fetch *f, struct want *w);
/** MISSING from a donor: ask it again later, or the next donor. */
void pull_on_missing(struct agent *a, struct proto_msg *m);
/** Keep every fetch's window full, fail over from silent donors, report progress. */
void pull_pump(struct agent *a);
/** agent_stop(): free every fetch and close every donor connection. */
void pull_free(struct agent *a);

/* agent_serve.c: serving shards to pullers */

/** A GET on the serving socket from puller @ident. */
void serve_on_get(struct agent *a, const void *ident, size_t ident_len, struct proto_msg *m);
/** A fetch ended: answer the requests that waited on shards it no longer pulls. */
void serve_flush_deferred(struct agent *a);
/** Shard @sh arrived and was verified: answer the requests that waited for it. */
void serve_arrived(struct agent *a, struct shard *sh);
/**
 * serve_forward() - a piece of @w arrived (@pm, whose payload is @w's last
 * bytes; NULL: none, send what is here): forward what each request waiting
 * for @w lacks (cut-through), @pm's frame by reference to those that had
 * all before it, copies from the staged range otherwise.
 */
void serve_forward(struct agent *a, struct want *w, const struct proto_msg *pm);
/**
 * serve_abort_forwarded() - shard @h arrived bad, or (with @delta_only) the
 * delta of it this node was receiving and forwarding was dropped: requests
 * that had part of it forwarded get MISSING (they ask again).
 */
void serve_abort_forwarded(struct agent *a, const hwfs_hash_t *h, int delta_only);
/**
 * serve_forward_delta() - a piece of @w's delta arrived (or its rebuild
 * started): forward it to requests for @w that named the same base, all
 * but the delta's last byte, which goes only once the shard was rebuilt and
 * verified here (serve_finish_delta()).
 */
void serve_forward_delta(struct agent *a, struct want *w);
/**
 * serve_finish_delta() - shard @h (@size bytes) was rebuilt here from @enc
 * (@len bytes) and verified: the requests it was being forwarded to get the
 * rest of it.
 */
void serve_finish_delta(struct agent *a, const hwfs_hash_t *h, uint64_t size, const uint8_t *enc,
			size_t len);
/** An encode job finished (pool_take_done()): keep the delta, answer its waiters; frees @j. */
void serve_on_encoded(struct agent *a, struct pool_job *j);
/** Version @name was sealed here: encode its deltas ahead of demand (delta_ahead). */
void serve_ahead_sealed(struct agent *a, const char *name);
/** Feed the codec workers from the encode-ahead runs; cancel runs whose version went. */
void serve_ahead_pump(struct agent *a);
/** Version @name is being pulled here (not sealed by a writer here): not encoded ahead. */
void serve_note_imported(struct agent *a, const char *name);
/** agent_stop(): forget the requests still waiting, and the deltas kept. */
void serve_free(struct agent *a);
/**
 * serve_keep_delta() - a delta received from a donor rebuilt shard @hash
 * against @base: keep it (ownership of @enc, malloc'd, @len bytes, passes
 * here) to send as it is to the next puller with that base.  @enc NULL with
 * @len 0: never send @hash as a delta against @base (the base here is
 * damaged: such a delta would not rebuild); it goes whole.
 */
void serve_keep_delta(struct agent *a, const hwfs_hash_t *base, const hwfs_hash_t *hash,
		      unsigned width, uint8_t *enc, size_t len);

/* Is @w to be asked for as a delta (it has a base, no delta of it failed, deltas are on)? */
static inline int want_delta(const struct want *w)
{
	return hwfs_tun.delta && !w->whole && !hwfs_hash_is_zero(&w->base);
}

/* CPU time of the calling thread, in ns (what the delta counters add up). */
static inline uint64_t delta_cpu_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

#endif /* HWFS_AGENT_I_H */
