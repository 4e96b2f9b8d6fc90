/*
 * agent.c — the node side of replication (see agent.h for the model).
 *
 * Everything below runs on the agent thread, except agent_sealed(),
 * agent_call() and agent_counters(), which only touch the queues under
 * a->mu and the atomic counters.  The loop polls the coordinator socket, the
 * serving ROUTER, one DEALER per donor and the wake-up pipe; each pass also
 * refills the request windows, sends the heartbeat (HELLO, once a second) and
 * fails over from silent donors.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zmq.h>

#include "agent.h"
#include "keys.h"
#include "manifest.h"
#include "proto.h"
#include "tunables.h"

#define WINDOW_BYTES (256ull << 20) /* bytes in flight per version being pulled */
#define BATCH_BYTES (64ull << 20)   /* bytes asked for in one GET */
#define PIECE_BYTES (4ull << 20)    /* a shard travels in pieces of this size */
#define MISSING_RETRY_S 0.2         /* a donor that lacks a shard may not have its plan yet */
#define MISSING_TRIES 5
/* donor silence and the pause before going round the donors again: hwfs_tun (tunables.h) */
#define HELLO_EVERY_S 1.0
#define COORD_SILENCE_S 3.5 /* no answer to heartbeats for this long: unreachable */

enum want_state { W_QUEUED, W_INFLIGHT, W_HELD };

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
	/* arriving in pieces, in order, from one donor */
	uint64_t got;       /* bytes received */
	uint64_t roff;      /* its arena range (unbacked, filled with pwrite) */
	XXH3_state_t *xs;   /* running hash, NULL when nothing is arriving */
	const void *from;   /* the peer the pieces come from */
};

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
	uint64_t bytes_needed, bytes_held, inflight;
	uint64_t total;   /* distinct shard bytes of the version */
	double last_rx, last_report;
	int ring_warned; /* "every donor failed once" logged for this fetch */
	/* waiting for space: the store could not take the next shard */
	int space_wait;
	double space_retry_at, space_backoff; /* next retry; its period (0: never waited) */
	uint64_t space_free;                  /* free arena bytes when it stopped */
	struct fetch *next;
};

struct deferred {
	uint8_t ident[256];
	size_t ident_len;
	uint64_t req;
	hwfs_hash_t hash;
	uint64_t sent; /* bytes of it forwarded already while it was arriving */
	struct deferred *next;
};

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

struct call {
	uint64_t id;
	json_t *req;
	json_t *res;
	int done;
	pthread_cond_t cv;
	struct call *next;
};

struct agent {
	char *node, *listen, *coordinator, *mountpoint;
	struct ns *ns;
	struct store *st;
	int (*flip_current)(void *arg, const char *version, char *err, size_t errlen);
	void *arg;

	void *ctx, *coord, *serve;
	struct keys *keys;
	struct peer *peers;
	pthread_t thread;
	int running, stop;
	int pipe[2];

	pthread_mutex_t mu; /* guards sealed_q, calls */
	char **sealed_q;
	size_t n_sealed;
	struct call *calls_new, *calls_wait;
	uint64_t next_req;

	struct fetch *fetches;
	struct deferred *deferred;
	char *pending_commit; /* committed version to flip to once it is here */
	/*
	 * The last cluster decision (committed version, epoch) this node applied:
	 * a different one in a PONG/WELCOME is a commit it missed (it was away,
	 * or its flip failed) and it flips; the same one is left alone, so a
	 * `commit --local` override stands until the cluster commits again.
	 */
	char *applied;
	uint64_t applied_epoch, pending_epoch;
	int flip_failing; /* the last flip to the cluster's version failed (logged once) */
	double last_hello;
	int64_t last_coord_ns; /* atomic: monotonic ns of the last coordinator message */
	int coord_send_failing; /* the last send to the coordinator failed (warned once) */
	char session[33];      /* this incarnation, so the coordinator notices a restart */
	uint64_t rx, tx; /* atomic */
	uint64_t req_rx; /* atomic: shard requests received (hashes in GETs) */
	uint64_t import_seq;
	json_t *pulls;      /* under mu: the fetches as agent_pulls() reports them */
	double last_pulls;  /* when the agent thread last rebuilt it */
};

static double now_s(void)
{
	return hwfs_mono_s();
}

static void wake(struct agent *a)
{
	char c = 1;

	if (write(a->pipe[1], &c, 1) < 0 && errno != EAGAIN)
		LOG_WARN("agent: wake-up pipe: %s", strerror(errno));
}

/* ------------------------------------------------------------- sending */

static void send_coord(struct agent *a, enum proto_type t, json_t *fields, const void *payload,
		       size_t len)
{
	int r = proto_send(a->coord, NULL, 0, t, fields, payload, len);

	if (r < 0 && !a->coord_send_failing)
		LOG_WARN("agent: sending %s to the coordinator: %s (messages are dropped until it is "
			 "reachable; HELLO resynchronises then)", proto_type_name(t),
			 r == -EAGAIN ? "no connection" : strerror(-r));
	a->coord_send_failing = r < 0;
	json_decref(fields);
}

/*
 * Back off reconnects (a refused or dead peer is not hammered), and never
 * block on a send: a DEALER with no live connection (peer gone, CURVE
 * handshake refused) blocks zmq_send() for ever, which would freeze this
 * thread and, through agent_stop(), the unmount.  A send that cannot be
 * queued now fails with EAGAIN instead; what it carried is re-sent by the
 * protocol (heartbeat HELLO, a GET's donor silence, a commit's deadline).
 */
static void set_backoff(void *sock)
{
	int ivl = 100, max = 2000, linger = 0, sndtimeo = 0;

	zmq_setsockopt(sock, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl));
	zmq_setsockopt(sock, ZMQ_RECONNECT_IVL_MAX, &max, sizeof(max));
	zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_setsockopt(sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof(sndtimeo));
}

/* The donor connection to @addr, or NULL if none was opened yet. */
static struct peer *peer_find(struct agent *a, const char *addr)
{
	for (struct peer *p = a->peers; p; p = p->next)
		if (!strcmp(p->addr, addr))
			return p;
	return NULL;
}

static struct peer *peer_get(struct agent *a, const char *addr, const char *key)
{
	struct peer *p = peer_find(a, addr);

	if (p)
		return p;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->addr = strdup(addr);
	p->sock = zmq_socket(a->ctx, ZMQ_DEALER);
	if (p->sock)
		set_backoff(p->sock);
	if (!p->addr || !p->sock ||
	    zmq_setsockopt(p->sock, ZMQ_ROUTING_ID, a->node, strlen(a->node)) < 0 ||
	    (a->keys && keys_client(a->keys, p->sock, key) < 0) || zmq_connect(p->sock, addr) < 0) {
		LOG_ERR("agent: cannot connect to donor %s: %s", addr, zmq_strerror(errno));
		if (p->sock)
			zmq_close(p->sock);
		free(p->addr);
		free(p);
		return NULL;
	}
	p->next = a->peers;
	a->peers = p;
	return p;
}

struct sent_ref {
	struct store *st;
	struct shard *sh;
};

static void sent_free(void *data, void *hint)
{
	struct sent_ref *r = hint;

	store_unref(r->st, r->sh);
	free(r);
}

/*
 * Send bytes [@pos, @pos+@len) of a shard of @total bytes as one SHARD piece.
 * With @sh, zero copy (the piece holds a reference on the shard); else @data
 * is copied (a shard still arriving here, forwarded before it is complete).
 */
static int send_piece(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
		      const hwfs_hash_t *hash, uint64_t pos, uint64_t len, uint64_t total,
		      struct shard *sh, const void *data)
{
	json_t *f = json_pack("{s:I, s:o, s:I, s:I, s:I}", "req", (json_int_t)req, "hash",
			      proto_hash_json(hash), "size", (json_int_t)len, "offset", (json_int_t)pos,
			      "total", (json_int_t)total);
	struct sent_ref *ref = NULL;
	char *hdr = NULL;
	size_t hlen;
	zmq_msg_t m;
	int r = -ENOMEM;

	if (!f || proto_encode(P_SHARD, f, len, &hdr, &hlen) < 0)
		goto out;
	if (zmq_send(a->serve, ident, ident_len, ZMQ_SNDMORE) < 0 ||
	    zmq_send(a->serve, hdr, hlen, ZMQ_SNDMORE) < 0) {
		r = -errno;
		goto out;
	}
	if (sh) {
		ref = malloc(sizeof(*ref));
		if (!ref || zmq_msg_init_data(&m, (void *)(store_shard_data(a->st, sh) + pos), len,
					      sent_free, ref) < 0) {
			free(ref);
			zmq_send(a->serve, "", 0, 0); /* end the message: the receiver drops it */
			goto out;
		}
		store_ref(a->st, sh);
		*ref = (struct sent_ref){a->st, sh};
		if (zmq_msg_send(&m, a->serve, 0) < 0) {
			r = -errno;
			zmq_msg_close(&m);
			goto out;
		}
	} else if (zmq_send(a->serve, data, len, 0) < 0) {
		r = -errno;
		goto out;
	}
	__atomic_add_fetch(&a->tx, len, __ATOMIC_RELAXED);
	r = 0;
out:
	free(hdr);
	json_decref(f);
	return r;
}

/* Tell the puller @ident that this node does not have (any more) shard @h. */
static void send_missing(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
			 const hwfs_hash_t *h)
{
	json_t *mf = json_pack("{s:I, s:o}", "req", (json_int_t)req, "hash", proto_hash_json(h));

	proto_send(a->serve, ident, ident_len, P_MISSING, mf, NULL, 0);
	json_decref(mf);
}

/* Send shard @sh from byte @pos on, in pieces; drops the caller's reference. */
static void send_shard_from(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
			    struct shard *sh, uint64_t pos)
{
	while (pos < sh->size) {
		uint64_t len = HWFS_MIN(PIECE_BYTES, sh->size - pos);

		if (send_piece(a, ident, ident_len, req, &sh->hash, pos, len, sh->size, sh, NULL) < 0)
			break;
		pos += len;
	}
	store_unref(a->st, sh);
}

static void send_shard(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
		       struct shard *sh)
{
	send_shard_from(a, ident, ident_len, req, sh, 0);
}

/* ------------------------------------------------------------- fetches */

static struct want *find_want(struct agent *a, const hwfs_hash_t *h, struct fetch **fp)
{
	for (struct fetch *f = a->fetches; f; f = f->next)
		for (size_t i = 0; i < f->n; i++)
			if (!hwfs_hash_cmp(&f->w[i].hash, h)) {
				if (fp)
					*fp = f;
				return &f->w[i];
			}
	return NULL;
}

/* Forget a shard that was arriving in pieces (its range goes back). */
static void drop_partial(struct agent *a, struct want *w)
{
	if (!w->xs)
		return;
	XXH3_freeState(w->xs);
	w->xs = NULL;
	arena_free(store_arena(a->st), w->roff, w->size);
	w->got = 0;
	w->from = NULL;
}

static void fetch_free(struct agent *a, struct fetch *f)
{
	for (size_t i = 0; i < f->n; i++) {
		drop_partial(a, &f->w[i]);
		if (f->w[i].sh)
			store_unref(a->st, f->w[i].sh);
	}
	for (size_t i = 0; i < f->n_donors; i++) {
		free(f->donors[i]);
		free(f->donor_names[i]);
		free(f->donor_keys[i]);
	}
	free(f->donors);
	free(f->donor_names);
	free(f->donor_keys);
	free(f->w);
	hwfs_vrec_free(f->rec);
	free(f->name);
	free(f);
}

/*
 * A fetch ended: requests that waited on its shards get the shard if it
 * arrived, else MISSING, so their pullers move on at once.
 */
static void flush_deferred(struct agent *a)
{
	for (struct deferred **pp = &a->deferred; *pp;) {
		struct deferred *d = *pp;
		struct shard *sh;

		if (find_want(a, &d->hash, NULL)) {
			pp = &d->next;
			continue;
		}
		sh = store_get(a->st, &d->hash);
		if (sh) {
			send_shard(a, d->ident, d->ident_len, d->req, sh);
		} else {
			send_missing(a, d->ident, d->ident_len, d->req, &d->hash);
		}
		*pp = d->next;
		free(d);
	}
}

static void fetch_unlink(struct agent *a, struct fetch *f)
{
	struct fetch **pp = &a->fetches;

	while (*pp && *pp != f)
		pp = &(*pp)->next;
	if (*pp)
		*pp = f->next;
}

/* HAVE: progress of @name here; @bad_donor names a node that sent a corrupt shard, or NULL. */
static void send_have(struct agent *a, const char *name, const hwfs_hash_t *digest, int complete,
		      uint64_t held, uint64_t needed, const char *bad_donor)
{
	json_t *h = json_pack("{s:s, s:o, s:b, s:I, s:I}", "version", name, "digest",
			      proto_hash_json(digest), "complete", complete, "bytes_held", (json_int_t)held,
			      "bytes_needed", (json_int_t)needed);

	if (bad_donor)
		json_object_set_new(h, "bad_donor", json_string(bad_donor));
	send_coord(a, P_HAVE, h, NULL, 0);
}

/* Free bytes of the store's arena. */
static uint64_t arena_free_bytes(struct agent *a)
{
	struct arena *ar = store_arena(a->st);
	uint64_t cap = arena_capacity(ar), used = arena_used(ar);

	return cap > used ? cap - used : 0;
}

/* Why @f is not moving, as a sentence for status ("" when it is). */
static void fetch_waiting(struct agent *a, const struct fetch *f, char *buf, size_t len)
{
	char need[32], free_[32];

	buf[0] = '\0';
	if (!f->space_wait)
		return;
	snprintf(buf, len, "waiting for space: need %s, free %s",
		 hwfs_fmt_size(f->bytes_needed - f->bytes_held, need, sizeof(need)),
		 hwfs_fmt_size(arena_free_bytes(a), free_, sizeof(free_)));
}

/* HAVE for a fetch in progress (with why it waits, if it does). */
static void report_progress(struct agent *a, struct fetch *f, const char *bad_donor)
{
	json_t *h = json_pack("{s:s, s:o, s:b, s:I, s:I}", "version", f->name, "digest",
			      proto_hash_json(&f->digest), "complete", 0, "bytes_held",
			      (json_int_t)(f->total - f->bytes_needed + f->bytes_held), "bytes_needed",
			      (json_int_t)(f->bytes_needed - f->bytes_held));
	char why[128];

	fetch_waiting(a, f, why, sizeof(why));
	if (h && bad_donor)
		json_object_set_new(h, "bad_donor", json_string(bad_donor));
	if (h && *why)
		json_object_set_new(h, "waiting", json_string(why));
	send_coord(a, P_HAVE, h, NULL, 0);
}

/*
 * publish_pulls() - rebuild the snapshot agent_pulls() hands to other
 * threads: one entry per version being pulled.  A failed allocation keeps
 * the previous snapshot.
 */
static void publish_pulls(struct agent *a)
{
	json_t *arr = json_array();

	for (struct fetch *f = a->fetches; arr && f; f = f->next) {
		char why[128];
		json_t *e = json_pack("{s:s, s:I, s:I}", "version", f->name, "bytes_held",
				      (json_int_t)(f->total - f->bytes_needed + f->bytes_held),
				      "bytes_total", (json_int_t)f->total);

		fetch_waiting(a, f, why, sizeof(why));
		if (e && *why) {
			json_object_set_new(e, "waiting", json_string(why));
			json_object_set_new(e, "need_bytes",
					    json_integer((json_int_t)(f->bytes_needed - f->bytes_held)));
			json_object_set_new(e, "free_bytes", json_integer((json_int_t)arena_free_bytes(a)));
		}
		if (e)
			json_array_append_new(arr, e);
	}
	if (!arr)
		return;
	pthread_mutex_lock(&a->mu);
	json_decref(a->pulls);
	a->pulls = arr;
	pthread_mutex_unlock(&a->mu);
	a->last_pulls = now_s();
}

/*
 * fetch_wait_space() - the store cannot take the next shard of @f: stop
 * asking (what is in flight is dropped, partial shards are freed) and retry
 * after space_retry_ms, doubling up to space_retry_max_ms, or at once when
 * the arena's free bytes grow (rm, gc, another version leaving).  Status
 * and HAVE say why it waits.
 */
static void fetch_wait_space(struct agent *a, struct fetch *f)
{
	char why[128];

	for (size_t i = 0; i < f->n; i++) {
		drop_partial(a, &f->w[i]);
		if (f->w[i].state == W_INFLIGHT)
			f->w[i].state = W_QUEUED;
	}
	f->inflight = 0;
	f->space_backoff = f->space_backoff > 0
				   ? HWFS_MIN(f->space_backoff * 2, hwfs_tun.space_retry_max_ms / 1000.0)
				   : hwfs_tun.space_retry_ms / 1000.0;
	f->space_retry_at = now_s() + f->space_backoff;
	f->space_free = arena_free_bytes(a);
	if (!f->space_wait) {
		f->space_wait = 1;
		fetch_waiting(a, f, why, sizeof(why));
		LOG_WARN("agent: %s is %s; retrying every %.1f s or more (space_retry_ms), and at once "
			 "when space is freed here (hwfs rm, hwfs gc)", f->name, why, f->space_backoff);
	}
	report_progress(a, f, NULL);
	publish_pulls(a);
}

/*
 * flip_to() - point current at the cluster's committed @version (nothing to
 * do when it does already).  Returns 0 or the -errno of the flip, logged once
 * until a flip succeeds again (it is retried on every heartbeat answer).
 */
static int flip_to(struct agent *a, const char *version)
{
	char err[256];
	char *cur = ns_current(a->ns);
	int same = cur && !strcmp(cur, version), r = 0;

	free(cur);
	if (same)
		goto out;
	r = a->flip_current(a->arg, version, err, sizeof(err));
	if (r < 0 && !a->flip_failing)
		LOG_ERR("agent: cannot flip current to %s, committed by the cluster: %s (retried "
			"on every heartbeat; logged once)", version, err);
	else if (r == 0)
		LOG_INFO("agent: current -> %s (committed by the cluster)", version);
out:
	a->flip_failing = r < 0;
	return r;
}

/* Remember the cluster decision (@version, @epoch) as applied here. */
static void set_applied(struct agent *a, const char *version, uint64_t epoch)
{
	char *v = strdup(version);

	if (!v)
		return; /* retried on the next heartbeat answer */
	free(a->applied);
	a->applied = v;
	a->applied_epoch = epoch;
}

/*
 * learn_commit() - the coordinator's last decision (@committed, @epoch) from
 * a WELCOME or PONG.  A decision this node has not applied yet is applied:
 * flip now if the version is here complete, else once it arrives
 * (pending_commit).  A flip that fails is retried on the next answer.
 */
static void learn_commit(struct agent *a, const char *committed, uint64_t epoch)
{
	struct version *v;
	int have;

	if (!committed ||
	    (a->applied && !strcmp(a->applied, committed) && a->applied_epoch == epoch))
		return;
	ns_rdlock(a->ns);
	v = ns_version(a->ns, committed);
	have = v && v->state == HWFS_V_SEALED;
	ns_unlock(a->ns);
	if (!have) {
		if (!a->pending_commit || strcmp(a->pending_commit, committed)) {
			free(a->pending_commit);
			a->pending_commit = strdup(committed);
			a->pending_epoch = epoch;
			LOG_INFO("agent: the cluster committed %s; flipping once it is here", committed);
		}
		return;
	}
	if (flip_to(a, committed) == 0) {
		set_applied(a, committed, epoch);
		free(a->pending_commit);
		a->pending_commit = NULL;
	}
}

/* Every shard is here: build the version and rename it in through the mount. */
static void materialize(struct agent *a, struct fetch *f)
{
	char hidden[128], from[4096], to[4096];
	struct version *v;
	int r, ok = 0;

	snprintf(hidden, sizeof(hidden), NS_HIDDEN_PREFIX "repl-%d-%llu", (int)getpid(),
		 (unsigned long long)++a->import_seq);
	r = ns_import(a->ns, hidden, f->rec);
	if (r < 0) {
		LOG_ERR("agent: cannot build %s: %s", f->name, strerror(-r));
		goto out;
	}
	snprintf(from, sizeof(from), "%s/versions/%s", a->mountpoint, hidden);
	snprintf(to, sizeof(to), "%s/versions/%s", a->mountpoint, f->name);
	if (rename(from, to) < 0) {
		LOG_ERR("agent: cannot seal %s: %s", f->name, strerror(errno));
		ns_remove_version(a->ns, hidden);
		goto out;
	}
	ns_rdlock(a->ns);
	v = ns_version(a->ns, f->name);
	ok = v && !hwfs_hash_cmp(&v->digest, &f->digest);
	ns_unlock(a->ns);
	if (!ok) {
		LOG_ERR("agent: %s arrived with a digest that does not match its manifest; removed",
			f->name);
		ns_remove_version(a->ns, f->name);
		goto out;
	}
	LOG_INFO("agent: %s complete (%llu bytes received)", f->name,
		 (unsigned long long)f->bytes_held);
out:
	if (ok)
		send_have(a, f->name, &f->digest, 1, f->total, 0, NULL);
	else
		report_progress(a, f, NULL);
	if (ok && a->pending_commit && !strcmp(a->pending_commit, f->name) &&
	    flip_to(a, f->name) == 0) {
		set_applied(a, f->name, a->pending_epoch);
		free(a->pending_commit);
		a->pending_commit = NULL;
	}
	fetch_unlink(a, f);
	fetch_free(a, f);
	flush_deferred(a);
}

static void fetch_fail(struct agent *a, struct fetch *f, const char *why)
{
	LOG_ERR("agent: giving up on %s: %s", f->name, why);
	report_progress(a, f, NULL);
	fetch_unlink(a, f);
	fetch_free(a, f);
	flush_deferred(a);
}

static int fetch_complete(const struct fetch *f)
{
	for (size_t i = 0; i < f->n; i++)
		if (f->w[i].state != W_HELD)
			return 0;
	return 1;
}

/*
 * donor_failed() - donor @d of @f failed (@why): back it off, doubling its
 * pause up to donor_backoff_max_ms.  Logged when the back-off starts and
 * when it reaches its cap, not on every failure.
 */
static void donor_failed(struct agent *a, struct fetch *f, size_t d, const char *why)
{
	struct peer *p = d < f->n_donors ? peer_find(a, f->donors[d]) : NULL;
	double base = hwfs_tun.donor_backoff_ms / 1000.0, cap = hwfs_tun.donor_backoff_max_ms / 1000.0;
	double prev;

	if (!p)
		return;
	prev = p->backoff;
	p->backoff = prev > 0 ? HWFS_MIN(prev * 2, cap) : HWFS_MIN(base, cap);
	p->until = now_s() + p->backoff;
	if (prev == 0 || (p->backoff >= cap && prev < cap))
		LOG_WARN("agent: donor %s (%s) %s: not asked again for %.1f s%s", f->donor_names[d],
			 p->addr, why, p->backoff,
			 prev == 0 ? " (doubling while it fails, donor_backoff_ms/_max_ms)"
				   : " (the cap, until it sends a good shard)");
}

/* Donor @peer sent a good shard: its back-off ends. */
static void donor_ok(struct agent *a, const void *peer)
{
	for (struct peer *p = a->peers; p; p = p->next)
		if (p->sock == peer && p->backoff > 0) {
			LOG_INFO("agent: donor %s sends good shards again", p->addr);
			p->backoff = p->until = 0;
		}
}

/* Is donor @d of @f backing off at @now? */
static int donor_off(struct agent *a, struct fetch *f, size_t d, double now)
{
	struct peer *p = peer_find(a, f->donors[d]);

	return p && p->until > now;
}

/* Give up on @w's current donor: the next one round the ring. */
static void next_donor(struct agent *a, struct fetch *f, struct want *w)
{
	drop_partial(a, w);
	w->tries++;
	w->donor = f->n_donors ? (w->donor + 1) % f->n_donors : 0;
	w->misses = 0;
	w->state = W_QUEUED;
}

static int set_donors(struct agent *a, struct fetch *f, json_t *donors, int stripe)
{
	size_t i, n = json_array_size(donors);
	json_t *d;

	for (i = 0; i < f->n_donors; i++) {
		free(f->donors[i]);
		free(f->donor_names[i]);
		free(f->donor_keys[i]);
	}
	free(f->donors);
	free(f->donor_names);
	free(f->donor_keys);
	f->donors = calloc(n ? n : 1, sizeof(char *));
	f->donor_names = calloc(n ? n : 1, sizeof(char *));
	f->donor_keys = calloc(n ? n : 1, sizeof(char *));
	f->n_donors = 0;
	if (!f->donors || !f->donor_names || !f->donor_keys)
		return -ENOMEM;
	json_array_foreach(donors, i, d) {
		const char *key = json_string_value(json_object_get(d, "key"));

		f->donors[i] = strdup(json_string_value(json_object_get(d, "addr")));
		f->donor_names[i] = strdup(json_string_value(json_object_get(d, "node")));
		f->donor_keys[i] = key ? strdup(key) : NULL;
		f->n_donors++;
	}
	/*
	 * striped: shard k from donor k mod n; a failure moves on round the
	 * ring.  Requests in flight to the old donors are asked again (a late
	 * answer to them is ignored).
	 */
	f->stripe = stripe && f->n_donors > 1;
	for (size_t k = 0; k < f->n; k++) {
		if (f->w[k].state == W_INFLIGHT)
			f->w[k].state = W_QUEUED;
		drop_partial(a, &f->w[k]);
		f->w[k].donor = f->stripe ? k % f->n_donors : 0;
		f->w[k].tries = 0;
		f->w[k].misses = 0;
	}
	f->inflight = 0;
	return 0;
}

static void on_plan(struct agent *a, struct proto_msg *m)
{
	const char *name = proto_str(m, "version");
	struct hwfs_vrec *rec = NULL;
	struct fetch *f;
	struct version *v;
	hwfs_hash_t digest, *hs = NULL;
	char err[256];
	size_t total = 0, n = 0;
	int have;

	if (proto_hash(m, "digest", &digest) < 0)
		return;
	ns_rdlock(a->ns);
	v = ns_version(a->ns, name);
	have = v && v->state == HWFS_V_SEALED && !hwfs_hash_cmp(&v->digest, &digest);
	ns_unlock(a->ns);
	if (have) {
		send_have(a, name, &digest, 1, 0, 0, NULL);
		return;
	}
	if (v) {
		LOG_ERR("agent: plan for %s, but a different %s exists here; ignored", name, name);
		return;
	}
	for (f = a->fetches; f; f = f->next)
		if (!strcmp(f->name, name)) { /* a new plan: new donors */
			set_donors(a, f, json_object_get(m->h, "donors"), proto_bool(m, "stripe"));
			return;
		}
	if (manifest_parse(m->payload, m->payload_len, &rec, err, sizeof(err)) < 0) {
		LOG_ERR("agent: bad manifest for %s: %s", name, err);
		return;
	}
	if (hwfs_hash_cmp(&rec->digest, &digest) || strcmp(rec->name, name)) {
		LOG_ERR("agent: manifest for %s does not match its digest or name", name);
		hwfs_vrec_free(rec);
		return;
	}
	f = calloc(1, sizeof(*f));
	for (size_t i = 0; i < rec->n_files; i++)
		total += rec->files[i].n_ext;
	hs = malloc((total ? total : 1) * sizeof(*hs));
	if (!f || !hs)
		goto oom;
	f->name = strdup(name);
	f->digest = digest;
	f->rec = rec;
	rec = NULL;
	/* distinct shards, in manifest order of first use */
	f->w = calloc(total ? total : 1, sizeof(*f->w));
	if (!f->name || !f->w)
		goto oom;
	for (size_t i = 0; i < f->rec->n_files; i++)
		for (size_t j = 0; j < f->rec->files[i].n_ext; j++) {
			const struct hwfs_extent *e = &f->rec->files[i].ext[j];

			size_t lo = 0, hi = n;

			while (lo < hi) { /* sorted insert into the set of seen hashes */
				size_t mid = lo + (hi - lo) / 2;
				int c = hwfs_hash_cmp(&hs[mid], &e->hash);

				if (c == 0)
					break;
				if (c < 0)
					lo = mid + 1;
				else
					hi = mid;
			}
			if (lo < hi)
				continue; /* seen */
			memmove(hs + lo + 1, hs + lo, (n - lo) * sizeof(*hs));
			hs[lo] = e->hash;
			n++;
			f->w[f->n].hash = e->hash;
			f->w[f->n].size = e->len;
			f->total += e->len;
			f->w[f->n].sh = store_get(a->st, &e->hash);
			if (f->w[f->n].sh) {
				f->w[f->n].state = W_HELD;
			} else {
				f->w[f->n].state = W_QUEUED;
				f->bytes_needed += e->len;
			}
			f->n++;
		}
	free(hs);
	hs = NULL;
	if (set_donors(a, f, json_object_get(m->h, "donors"), proto_bool(m, "stripe")) < 0)
		goto oom;
	f->last_rx = now_s();
	f->next = a->fetches;
	a->fetches = f;
	LOG_INFO("agent: pulling %s: %llu bytes missing of %zu shards, from %s", name,
		 (unsigned long long)f->bytes_needed, f->n, f->n_donors ? f->donors[0] : "nobody");
	if (fetch_complete(f))
		materialize(a, f);
	return;
oom:
	free(hs);
	hwfs_vrec_free(rec);
	if (f)
		fetch_free(a, f);
	LOG_ERR("agent: out of memory planning %s", name);
}

/*
 * unsend() - a GET to donor @d of @f could not be sent: the shards it asked
 * for (marked in flight just now, not yet counted in f->inflight) go to
 * their next donor, asked no sooner than the donor back-off.
 */
static void unsend(struct agent *a, struct fetch *f, size_t d, double now)
{
	donor_failed(a, f, d, "cannot be reached");
	for (size_t i = 0; i < f->n; i++) {
		struct want *w = &f->w[i];

		if (w->state == W_INFLIGHT && w->donor == d && !w->xs && w->not_before <= now &&
		    w->sent_at == now) {
			next_donor(a, f, w);
			w->not_before = now + hwfs_tun.donor_backoff_ms / 1000.0;
		}
	}
}

/*
 * prefer_donors() - a queued shard whose donor is backing off goes to the
 * next donor round the ring that is not (if any: else it waits for the
 * first back-off to end).
 */
static void prefer_donors(struct agent *a, struct fetch *f, double now)
{
	char *off;

	if (f->n_donors < 2 || !(off = calloc(f->n_donors, 1)))
		return;
	for (size_t d = 0; d < f->n_donors; d++)
		off[d] = (char)donor_off(a, f, d, now);
	for (size_t i = 0; i < f->n; i++) {
		struct want *w = &f->w[i];

		if (w->state != W_QUEUED || !off[w->donor])
			continue;
		for (size_t k = 1; k < f->n_donors; k++) {
			size_t d = (w->donor + k) % f->n_donors;

			if (!off[d]) {
				w->donor = d;
				w->misses = 0;
				break;
			}
		}
	}
	free(off);
}

/* Keep each fetch's window full: GET batches from each want's donor. */
static void pump(struct agent *a)
{
	double now = now_s();

	if (now - a->last_pulls >= 0.25)
		publish_pulls(a);
	for (struct fetch *f = a->fetches, *next; f; f = next) {
		next = f->next;
		if (f->space_wait) {
			uint64_t free_now = arena_free_bytes(a);
			char fb[32];

			if (now < f->space_retry_at && free_now <= f->space_free) {
				if (now - f->last_report >= 0.5) {
					report_progress(a, f, NULL);
					f->last_report = now;
				}
				continue;
			}
			LOG_INFO("agent: %s: retrying (%s free%s)", f->name,
				 hwfs_fmt_size(free_now, fb, sizeof(fb)),
				 free_now > f->space_free ? ", space was freed here" : "");
			f->space_wait = 0;
		}
		if (f->inflight && now - f->last_rx > hwfs_tun.donor_silence_ms / 1000.0) {
			for (size_t d = 0; d < f->n_donors; d++)
				for (size_t i = 0; i < f->n; i++)
					if (f->w[i].state == W_INFLIGHT && f->w[i].donor == d) {
						donor_failed(a, f, d, "is silent");
						break;
					}
			for (size_t i = 0; i < f->n; i++)
				if (f->w[i].state == W_INFLIGHT)
					next_donor(a, f, &f->w[i]);
			f->inflight = 0;
			f->last_rx = now;
			LOG_WARN("agent: no shard of %s for %.1f s (donor_silence_ms): asking the next "
				 "donor", f->name, hwfs_tun.donor_silence_ms / 1000.0);
		}
		/*
		 * Every donor of a shard failed once: not a reason to give up (a
		 * busy machine makes donors look silent, a dead donor may come
		 * back).  Start round the ring again after a pause (once: the
		 * pause used to be renewed on every pass, so the shard was never
		 * asked for again); the coordinator re-plans if a donor died or
		 * came back.
		 */
		for (size_t i = 0; i < f->n; i++)
			if (f->w[i].state == W_QUEUED && f->w[i].tries >= f->n_donors) {
				if (!f->ring_warned)
					LOG_WARN("agent: every donor of a shard of %s failed once; "
						 "going round them again after %.1f s", f->name,
						 hwfs_tun.donor_backoff_ms / 1000.0);
				f->ring_warned = 1;
				f->w[i].tries = 0;
				f->w[i].not_before = now + hwfs_tun.donor_backoff_ms / 1000.0;
			}
		prefer_donors(a, f, now);
		for (size_t d = 0; d < f->n_donors && f->inflight < WINDOW_BYTES; d++) {
			json_t *hashes = json_array();

			if (donor_off(a, f, d, now)) {
				json_decref(hashes);
				continue;
			}
			uint64_t batch = 0;
			struct peer *p;

			for (size_t i = 0; i < f->n && f->inflight + batch < WINDOW_BYTES &&
					   batch < BATCH_BYTES && json_array_size(hashes) < PROTO_MAX_GET;
			     i++) {
				struct want *w = &f->w[i];

				if (w->state != W_QUEUED || w->donor != d || w->not_before > now)
					continue;
				json_array_append_new(hashes, proto_hash_json(&w->hash));
				w->state = W_INFLIGHT;
				w->sent_at = now;
				batch += w->size;
			}
			p = json_array_size(hashes) ? peer_get(a, f->donors[d], f->donor_keys[d]) : NULL;
			if (p) {
				json_t *g = json_pack("{s:I, s:O}", "req", (json_int_t)++a->next_req,
						      "hashes", hashes);
				int r = proto_send(p->sock, NULL, 0, P_GET, g, NULL, 0);

				json_decref(g);
				if (r < 0) {
					/*
					 * Nothing went out (no connection to the donor): nothing
					 * is in flight.  Ask again after a pause, the next donor
					 * first.
					 */
					LOG_WARN("agent: GET to %s: %s; asking the next donor", f->donors[d],
						 r == -EAGAIN ? "no connection" : strerror(-r));
					unsend(a, f, d, now);
				} else {
					f->inflight += batch;
					if (f->inflight == batch)
						f->last_rx = now;
				}
			} else if (json_array_size(hashes)) {
				unsend(a, f, d, now);
			}
			json_decref(hashes);
		}
		if (now - f->last_report >= 0.5) { /* progress for status --cluster */
			report_progress(a, f, NULL);
			f->last_report = now;
		}
	}
}

/* Answer requests that waited for @sh to arrive here (the rest, if forwarded in part). */
static void serve_deferred(struct agent *a, struct shard *sh)
{
	for (struct deferred **pp = &a->deferred; *pp;) {
		struct deferred *d = *pp;

		if (hwfs_hash_cmp(&d->hash, &sh->hash)) {
			pp = &d->next;
			continue;
		}
		store_ref(a->st, sh);
		send_shard_from(a, d->ident, d->ident_len, d->req, sh, d->sent);
		*pp = d->next;
		free(d);
	}
}

/*
 * Cut-through: a piece of @w just arrived; pass what waiting pullers have not
 * had yet straight on, before the whole shard is here and verified (they
 * verify it themselves).  This makes a chain a pipeline of pieces, not of
 * shards.
 */
static void forward_pieces(struct agent *a, struct want *w)
{
	const uint8_t *base = arena_base(store_arena(a->st)) + w->roff;

	for (struct deferred *d = a->deferred; d; d = d->next) {
		if (hwfs_hash_cmp(&d->hash, &w->hash))
			continue;
		while (d->sent < w->got) {
			uint64_t len = HWFS_MIN(PIECE_BYTES, w->got - d->sent);

			if (send_piece(a, d->ident, d->ident_len, d->req, &w->hash, d->sent, len,
				       w->size, NULL, base + d->sent) < 0)
				break;
			d->sent += len;
		}
	}
}

/* A shard that was forwarded in part turned out bad: those pullers must start over. */
static void abort_forwarded(struct agent *a, const hwfs_hash_t *h)
{
	for (struct deferred **pp = &a->deferred; *pp;) {
		struct deferred *d = *pp;

		if (hwfs_hash_cmp(&d->hash, h) || d->sent == 0) {
			pp = &d->next;
			continue;
		}
		send_missing(a, d->ident, d->ident_len, d->req, h);
		*pp = d->next;
		free(d);
	}
}

/*
 * Put received bytes into their (unbacked) arena range with pwrite: tmpfs
 * allocates the pages without zeroing them first and nothing faults on our
 * mapping — a third of a receiver's CPU time otherwise.  A preallocated arena
 * has every page present and mapped already, and a plain copy is cheaper
 * than going through the page cache.
 */
static int write_arena(struct agent *a, uint64_t off, const void *buf, size_t len)
{
	struct arena *ar = store_arena(a->st);
	size_t done = 0;

	if (arena_preallocated(ar)) {
		memcpy(arena_base(ar) + off, buf, len);
		return 0;
	}
	while (done < len) {
		ssize_t n = pwrite(arena_fd(ar), (const char *)buf + done, len - done,
				   (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			LOG_ERR("agent: writing a shard into the arena: %s",
				n < 0 ? strerror(errno) : "short write");
			return n < 0 ? -errno : -EIO;
		}
		done += (size_t)n;
	}
	return 0;
}

/*
 * A SHARD piece.  Pieces of one shard come in order from one donor; the first
 * (offset 0) takes an unbacked arena range, each is pwritten there and added
 * to a running hash, and the last one checks the hash and interns the shard.
 */
static void on_shard(struct agent *a, struct proto_msg *m, const char *from, const void *peer)
{
	struct fetch *f = NULL;
	struct want *w;
	hwfs_hash_t h;
	uint64_t pos = proto_int(m, "offset"), len = m->payload_len;
	uint64_t total = json_object_get(m->h, "total") ? proto_int(m, "total") : len;
	struct shard *sh;
	XXH128_canonical_t c;
	int adopted;

	if (proto_hash(m, "hash", &h) < 0)
		return;
	w = find_want(a, &h, &f);
	if (!w || w->state != W_INFLIGHT)
		return; /* late duplicate, or a shard we stopped asking for */
	f->last_rx = now_s();
	if (total != w->size || pos + len > total || len == 0) {
		LOG_ERR("agent: malformed piece from %s for %s; asking another donor", from, f->name);
		f->inflight -= HWFS_MIN(f->inflight, w->size);
		donor_failed(a, f, w->donor, "sent a malformed piece");
		next_donor(a, f, w);
		return;
	}
	if (pos == 0) { /* (re)start */
		drop_partial(a, w);
		w->xs = XXH3_createState();
		if (!w->xs || arena_alloc_unbacked(store_arena(a->st), w->size, &w->roff) < 0) {
			if (w->xs)
				XXH3_freeState(w->xs);
			w->xs = NULL;
			fetch_wait_space(a, f);
			return;
		}
		XXH3_128bits_reset(w->xs);
		w->from = peer;
	} else if (!w->xs || w->from != peer || pos != w->got) {
		return; /* a stray piece (an old donor's, or out of order): ignore */
	}
	if (write_arena(a, w->roff + pos, m->payload, len) < 0) {
		fetch_wait_space(a, f); /* frees every partial shard */
		return;
	}
	XXH3_128bits_update(w->xs, m->payload, len);
	w->got += len;
	__atomic_add_fetch(&a->rx, len, __ATOMIC_RELAXED);
	if (w->got < w->size) {
		forward_pieces(a, w);
		return;
	}
	/* the last piece: is it the shard that was asked for? */
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(w->xs));
	XXH3_freeState(w->xs);
	w->xs = NULL;
	f->inflight -= HWFS_MIN(f->inflight, w->size);
	if (memcmp(c.digest, h.b, HWFS_HASH_LEN)) {
		LOG_ERR("agent: bad shard from %s for %s (hash mismatch); asking another donor", from,
			f->name);
		report_progress(a, f, f->donor_names[w->donor]);
		arena_free(store_arena(a->st), w->roff, w->size);
		w->got = 0;
		abort_forwarded(a, &h);
		donor_failed(a, f, w->donor, "sent a shard that does not match its hash");
		next_donor(a, f, w);
		return;
	}
	sh = store_intern(a->st, &h, w->roff, w->size, &adopted);
	if (!adopted)
		arena_free(store_arena(a->st), w->roff, w->size);
	w->got = 0;
	if (!sh) {
		fetch_fail(a, f, "out of memory");
		return;
	}
	w->sh = sh;
	w->state = W_HELD;
	donor_ok(a, peer);
	f->bytes_held += w->size;
	f->space_backoff = 0; /* it fits again: a later shortage starts the back-off afresh */
	serve_deferred(a, sh);
	if (fetch_complete(f))
		materialize(a, f);
}

static void on_missing(struct agent *a, struct proto_msg *m)
{
	struct fetch *f = NULL;
	struct want *w;
	hwfs_hash_t h;

	if (proto_hash(m, "hash", &h) < 0 || !(w = find_want(a, &h, &f)) || w->state != W_INFLIGHT)
		return;
	f->inflight -= HWFS_MIN(f->inflight, w->size);
	w->state = W_QUEUED;
	drop_partial(a, w);
	if (++w->misses >= MISSING_TRIES) {
		donor_failed(a, f, w->donor, "does not have a shard it was planned to have");
		next_donor(a, f, w);
	} else
		w->not_before = now_s() + MISSING_RETRY_S;
}

/* A GET on the serving socket. */
static void on_get(struct agent *a, const void *ident, size_t ident_len, struct proto_msg *m)
{
	json_t *hashes = json_object_get(m->h, "hashes"), *hj;
	uint64_t req = proto_int(m, "req");
	size_t i;

	__atomic_add_fetch(&a->req_rx, json_array_size(hashes), __ATOMIC_RELAXED);
	json_array_foreach(hashes, i, hj) {
		hwfs_hash_t h;
		struct shard *sh;
		struct want *w;

		if (hwfs_hash_parse(json_string_value(hj), &h) < 0)
			continue;
		sh = store_get(a->st, &h);
		if (sh) {
			send_shard(a, ident, ident_len, req, sh);
			continue;
		}
		w = find_want(a, &h, NULL);
		if (w && ident_len <= sizeof(((struct deferred *)0)->ident)) {
			struct deferred *d = calloc(1, sizeof(*d));

			if (d) {
				memcpy(d->ident, ident, ident_len);
				d->ident_len = ident_len;
				d->req = req;
				d->hash = h;
				d->next = a->deferred;
				a->deferred = d;
				if (w->xs && w->got) /* arriving: pass on what is here */
					forward_pieces(a, w);
				continue;
			}
		}
		send_missing(a, ident, ident_len, req, &h);
	}
}

/* ------------------------------------------------------------- coordinator */

static void announce(struct agent *a, const char *name)
{
	struct hwfs_vrec *rec = NULL;
	char *js = NULL;
	size_t len;

	if (!strncmp(name, NS_HIDDEN_PREFIX, strlen(NS_HIDDEN_PREFIX)))
		return;
	if (ns_snapshot(a->ns, name, &rec) < 0 || rec->state != HWFS_V_SEALED ||
	    manifest_build(rec, &js, &len) < 0)
		goto out;
	send_coord(a, P_ANNOUNCE, json_pack("{s:s, s:o}", "version", name, "digest",
					    proto_hash_json(&rec->digest)),
		   js, len);
out:
	free(js);
	hwfs_vrec_free(rec);
}

static void hello(struct agent *a)
{
	json_t *vers = json_array();
	char **names = NULL, *cur = ns_current(a->ns);
	size_t n = 0;

	ns_list(a->ns, &names, &n);
	ns_rdlock(a->ns);
	for (size_t i = 0; i < n; i++) {
		struct version *v = ns_version(a->ns, names[i]);

		if (v && v->state == HWFS_V_SEALED)
			json_array_append_new(vers, json_pack("{s:s, s:o, s:b}", "name", v->name,
							      "digest", proto_hash_json(&v->digest),
							      "complete", 1));
		free(names[i]);
	}
	ns_unlock(a->ns);
	free(names);
	json_t *h = json_pack("{s:s, s:s, s:o, s:o}", "node", a->node, "listen", a->listen,
			      "versions", vers, "current", cur ? json_string(cur) : json_null());

	json_object_set_new(h, "session", json_string(a->session));
	if (a->keys) /* pullers reach our data socket with it */
		json_object_set_new(h, "key", json_string(keys_public(a->keys)));
	send_coord(a, P_HELLO, h, NULL, 0);
	free(cur);
	a->last_hello = now_s();
}

static void on_welcome(struct agent *a, struct proto_msg *m)
{
	char **names = NULL;
	size_t n = 0;

	LOG_INFO("agent: joined %s as %s", a->coordinator, a->node);
	/* a (re)started coordinator learns our versions from their manifests */
	ns_list(a->ns, &names, &n);
	for (size_t i = 0; i < n; i++) {
		announce(a, names[i]);
		free(names[i]);
	}
	free(names);
	learn_commit(a, proto_str(m, "committed"), proto_int(m, "epoch"));
}

static void on_prepare(struct agent *a, struct proto_msg *m)
{
	const char *name = proto_str(m, "version");
	hwfs_hash_t digest;
	char err[256] = "";
	struct version *v;
	int r;

	ns_rdlock(a->ns);
	r = ns_check_committable(a->ns, name, err, sizeof(err));
	v = ns_version(a->ns, name);
	if (r == 0 && (proto_hash(m, "digest", &digest) < 0 || hwfs_hash_cmp(&v->digest, &digest))) {
		r = -EINVAL;
		snprintf(err, sizeof(err), "%s here differs from the cluster's", name);
	}
	ns_unlock(a->ns);
	send_coord(a, P_READY,
		   json_pack("{s:I, s:s, s:b, s:s}", "txid", (json_int_t)proto_int(m, "txid"),
			     "version", name, "ok", r == 0, "reason", r == 0 ? "ready" : err),
		   NULL, 0);
}

static void on_commit(struct agent *a, struct proto_msg *m)
{
	const char *name = proto_str(m, "version");
	char err[256] = "flipped";
	int r = a->flip_current(a->arg, name, err, sizeof(err));

	if (r == 0) {
		free(a->pending_commit);
		a->pending_commit = NULL;
		if (json_object_get(m->h, "epoch"))
			set_applied(a, name, proto_int(m, "epoch"));
	}
	send_coord(a, P_ACK,
		   json_pack("{s:I, s:s, s:b, s:s}", "txid", (json_int_t)proto_int(m, "txid"),
			     "version", name, "ok", r == 0, "reason", err),
		   NULL, 0);
}

static void on_result(struct agent *a, struct proto_msg *m)
{
	uint64_t id = proto_int(m, "req");

	pthread_mutex_lock(&a->mu);
	for (struct call **pp = &a->calls_wait; *pp; pp = &(*pp)->next) {
		struct call *c = *pp;

		if (c->id != id)
			continue;
		c->res = json_deep_copy(m->h);
		json_object_del(c->res, "v");
		json_object_del(c->res, "t");
		json_object_del(c->res, "req");
		c->done = 1;
		*pp = c->next;
		pthread_cond_signal(&c->cv);
		break;
	}
	pthread_mutex_unlock(&a->mu);
}

/* Queued work from other threads: seal announcements and calls. */
static void drain_queues(struct agent *a)
{
	char buf[64];
	char **sealed;
	size_t n;
	struct call *calls;

	while (read(a->pipe[0], buf, sizeof(buf)) > 0)
		;
	pthread_mutex_lock(&a->mu);
	sealed = a->sealed_q;
	n = a->n_sealed;
	a->sealed_q = NULL;
	a->n_sealed = 0;
	calls = a->calls_new;
	a->calls_new = NULL;
	for (struct call *c = calls; c; c = c->next) {
		const char *op = json_string_value(json_object_get(c->req, "op"));

		c->id = ++a->next_req;
		if (op && !strcmp(op, "commit"))
			send_coord(a, P_COMMIT_REQ,
				   json_pack("{s:I, s:O, s:i}", "req", (json_int_t)c->id, "version",
					     json_object_get(c->req, "version"), "deadline_ms", 10000),
				   NULL, 0);
		else
			send_coord(a, P_STATUS_REQ, json_pack("{s:I}", "req", (json_int_t)c->id), NULL,
				   0);
	}
	while (calls) {
		struct call *c = calls;

		calls = c->next;
		c->next = a->calls_wait;
		a->calls_wait = c;
	}
	pthread_mutex_unlock(&a->mu);
	for (size_t i = 0; i < n; i++) {
		announce(a, sealed[i]);
		free(sealed[i]);
	}
	free(sealed);
}

/* ------------------------------------------------------------- the loop */

static void handle(struct agent *a, void *sock, int is_router, const char *what)
{
	for (int k = 0; k < 256; k++) {
		uint8_t ident[256];
		size_t ident_len = sizeof(ident);
		struct proto_msg m;
		char err[256];
		int r = proto_recv(sock, is_router ? ident : NULL, is_router ? &ident_len : NULL, 1,
				   &m, err, sizeof(err));

		if (r == -EAGAIN)
			return;
		if (r < 0) {
			if (r == -EBADMSG)
				LOG_WARN("agent: malformed message from %s dropped: %s", what, err);
			else
				return;
			continue;
		}
		if (sock == a->coord)
			__atomic_store_n(&a->last_coord_ns, (int64_t)(now_s() * 1e9), __ATOMIC_RELAXED);
		switch (m.type) {
		case P_PONG:
			learn_commit(a, proto_str(&m, "committed"), proto_int(&m, "epoch"));
			break;
		case P_WELCOME:
			on_welcome(a, &m);
			break;
		case P_PLAN:
			on_plan(a, &m);
			break;
		case P_PREPARE:
			on_prepare(a, &m);
			break;
		case P_COMMIT:
			on_commit(a, &m);
			break;
		case P_ABORT:
			LOG_INFO("agent: commit of %s aborted: %s", proto_str(&m, "version"),
				 proto_str(&m, "reason"));
			break;
		case P_COMMIT_RES:
		case P_STATUS_RES:
			on_result(a, &m);
			break;
		case P_GET:
			if (is_router)
				on_get(a, ident, ident_len, &m);
			break;
		case P_SHARD:
			on_shard(a, &m, what, sock);
			break;
		case P_MISSING:
			on_missing(a, &m);
			break;
		default:
			LOG_WARN("agent: unexpected %s from %s", proto_type_name(m.type), what);
		}
		proto_msg_clear(&m);
		/* a long burst of pieces must not starve the heartbeat */
		if (now_s() - a->last_hello >= HELLO_EVERY_S)
			hello(a);
	}
}

static void *agent_main(void *arg)
{
	struct agent *a = arg;

	hello(a);
	while (!__atomic_load_n(&a->stop, __ATOMIC_RELAXED)) {
		size_t np = 0, i = 0;
		struct peer *p;
		zmq_pollitem_t *items;

		for (p = a->peers; p; p = p->next)
			np++;
		items = calloc(3 + np, sizeof(*items));
		if (!items)
			break;
		items[0] = (zmq_pollitem_t){a->coord, 0, ZMQ_POLLIN, 0};
		items[1] = (zmq_pollitem_t){a->serve, 0, ZMQ_POLLIN, 0};
		items[2] = (zmq_pollitem_t){NULL, a->pipe[0], ZMQ_POLLIN, 0};
		for (p = a->peers, i = 3; p; p = p->next, i++)
			items[i] = (zmq_pollitem_t){p->sock, 0, ZMQ_POLLIN, 0};
		if (zmq_poll(items, (int)(3 + np), 100) < 0 && errno != EINTR) {
			free(items);
			break;
		}
		free(items);
		drain_queues(a);
		handle(a, a->coord, 0, "the coordinator");
		handle(a, a->serve, 1, "a puller");
		for (p = a->peers; p; p = p->next)
			handle(a, p->sock, 0, p->addr);
		pump(a);
		if (now_s() - a->last_hello >= HELLO_EVERY_S)
			hello(a);
	}
	return NULL;
}

int agent_start(const struct agent_opts *o, struct agent **out)
{
	struct agent *a = calloc(1, sizeof(*a));
	int linger = 0, r = -ENOMEM;

	if (!a)
		return -ENOMEM;
	a->pipe[0] = a->pipe[1] = -1;
	pthread_mutex_init(&a->mu, NULL);
	a->node = strdup(o->node);
	a->listen = strdup(o->listen);
	a->coordinator = strdup(o->coordinator);
	a->mountpoint = strdup(o->mountpoint);
	a->ns = o->ns;
	a->st = o->st;
	a->flip_current = o->flip_current;
	a->arg = o->arg;
	if (!a->node || !a->listen || !a->coordinator || !a->mountpoint)
		goto fail;
	{
		hwfs_hash_t h;
		struct {
			pid_t pid;
			int64_t t;
			void *p;
		} seed = {getpid(), hwfs_now_ns(), a};

		hwfs_hash_buf(&seed, sizeof(seed), &h);
		hwfs_hash_hex(&h, a->session);
	}
	if (pipe2(a->pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		r = -errno;
		goto fail;
	}
	a->ctx = zmq_ctx_new();
	a->coord = a->ctx ? zmq_socket(a->ctx, ZMQ_DEALER) : NULL;
	a->serve = a->ctx ? zmq_socket(a->ctx, ZMQ_ROUTER) : NULL;
	if (!a->coord || !a->serve) {
		r = -EIO;
		goto fail;
	}
	set_backoff(a->coord);
	zmq_setsockopt(a->serve, ZMQ_LINGER, &linger, sizeof(linger));
	if (o->keys) {
		r = keys_load(o->keys, &a->keys);
		if (r == 0 && !keys_coordinator(a->keys)) {
			LOG_ERR("agent: %s/coordinator.pub is missing", o->keys);
			r = -ENOENT;
		}
		if (r == 0)
			r = keys_start_zap(a->keys, a->ctx);
		if (r == 0)
			r = keys_server(a->keys, a->serve);
		if (r == 0)
			r = keys_client(a->keys, a->coord, keys_coordinator(a->keys));
		if (r < 0)
			goto fail;
	}
	if (zmq_setsockopt(a->coord, ZMQ_ROUTING_ID, a->node, strlen(a->node)) < 0 ||
	    zmq_connect(a->coord, a->coordinator) < 0) {
		r = -errno;
		LOG_ERR("agent: coordinator %s: %s", a->coordinator, zmq_strerror(errno));
		goto fail;
	}
	if (zmq_bind(a->serve, a->listen) < 0) {
		r = -errno;
		LOG_ERR("agent: cannot listen on %s: %s", a->listen, zmq_strerror(errno));
		goto fail;
	}
	{ /* a :* port: tell the coordinator (and status) the one bound */
		char ep[256];
		size_t len = sizeof(ep);
		char *dup;

		if (zmq_getsockopt(a->serve, ZMQ_LAST_ENDPOINT, ep, &len) == 0 && (dup = strdup(ep))) {
			free(a->listen);
			a->listen = dup;
		}
	}
	if (pthread_create(&a->thread, NULL, agent_main, a) != 0) {
		r = -EAGAIN;
		goto fail;
	}
	a->running = 1;
	*out = a;
	return 0;
fail:
	agent_stop(a);
	return r;
}

void agent_stop(struct agent *a)
{
	if (!a)
		return;
	if (a->running) {
		__atomic_store_n(&a->stop, 1, __ATOMIC_RELAXED);
		wake(a);
		pthread_join(a->thread, NULL);
	}
	while (a->fetches) {
		struct fetch *f = a->fetches;

		a->fetches = f->next;
		fetch_free(a, f);
	}
	while (a->deferred) {
		struct deferred *d = a->deferred;

		a->deferred = d->next;
		free(d);
	}
	while (a->peers) {
		struct peer *p = a->peers;

		a->peers = p->next;
		zmq_close(p->sock); /* LINGER 0: set_backoff() */
		free(p->addr);
		free(p);
	}
	if (a->coord)
		zmq_close(a->coord);
	if (a->serve)
		zmq_close(a->serve);
	keys_free(a->keys);
	if (a->ctx)
		zmq_ctx_term(a->ctx);
	pthread_mutex_lock(&a->mu);
	for (size_t i = 0; i < a->n_sealed; i++)
		free(a->sealed_q[i]);
	free(a->sealed_q);
	/* callers still waiting time out on their own */
	pthread_mutex_unlock(&a->mu);
	if (a->pipe[0] >= 0)
		close(a->pipe[0]);
	if (a->pipe[1] >= 0)
		close(a->pipe[1]);
	free(a->pending_commit);
	free(a->applied);
	json_decref(a->pulls);
	free(a->node);
	free(a->listen);
	free(a->coordinator);
	free(a->mountpoint);
	pthread_mutex_destroy(&a->mu);
	free(a);
}

void agent_sealed(void *agent, const char *name)
{
	struct agent *a = agent;
	char **q;

	pthread_mutex_lock(&a->mu);
	q = realloc(a->sealed_q, (a->n_sealed + 1) * sizeof(*q));
	if (q) {
		a->sealed_q = q;
		q[a->n_sealed] = strdup(name);
		if (q[a->n_sealed])
			a->n_sealed++;
	}
	pthread_mutex_unlock(&a->mu);
	wake(a);
}

int agent_call(struct agent *a, json_t *req, json_t **res, int timeout_ms)
{
	struct call c = {.req = req};
	struct timespec dl;
	int r = 0;

	/* the coordinator answers every heartbeat: silence means it is unreachable */
	if (now_s() - __atomic_load_n(&a->last_coord_ns, __ATOMIC_RELAXED) / 1e9 > COORD_SILENCE_S)
		return -EHOSTUNREACH;
	pthread_cond_init(&c.cv, NULL);
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (dl.tv_nsec >= 1000000000) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&a->mu);
	c.next = a->calls_new;
	a->calls_new = &c;
	pthread_mutex_unlock(&a->mu);
	wake(a);
	pthread_mutex_lock(&a->mu);
	while (!c.done && r == 0) {
		struct timespec slice;

		/* wake twice a second to notice a coordinator that went away */
		clock_gettime(CLOCK_REALTIME, &slice);
		slice.tv_nsec += 500000000;
		if (slice.tv_nsec >= 1000000000) {
			slice.tv_sec++;
			slice.tv_nsec -= 1000000000;
		}
		if (slice.tv_sec > dl.tv_sec || (slice.tv_sec == dl.tv_sec && slice.tv_nsec > dl.tv_nsec))
			slice = dl;
		if (pthread_cond_timedwait(&c.cv, &a->mu, &slice) == ETIMEDOUT && !c.done) {
			if (slice.tv_sec == dl.tv_sec && slice.tv_nsec == dl.tv_nsec)
				r = -ETIMEDOUT;
			else if (now_s() - __atomic_load_n(&a->last_coord_ns, __ATOMIC_RELAXED) / 1e9 >
				 COORD_SILENCE_S)
				r = -ECONNRESET;
		}
	}
	if (!c.done) { /* take it back from whichever list holds it */
		for (struct call **lists[] = {&a->calls_new, &a->calls_wait}, ***l = lists;
		     l < lists + 2; l++)
			for (struct call **pp = *l; *pp; pp = &(*pp)->next)
				if (*pp == &c) {
					*pp = c.next;
					break;
				}
	}
	pthread_mutex_unlock(&a->mu);
	pthread_cond_destroy(&c.cv);
	if (!c.done)
		return r ? r : -ETIMEDOUT;
	*res = c.res;
	return c.res ? 0 : -ENOMEM;
}

const char *agent_endpoint(const struct agent *a)
{
	return a->listen;
}

json_t *agent_pulls(struct agent *a)
{
	json_t *r;

	pthread_mutex_lock(&a->mu);
	r = a->pulls ? json_deep_copy(a->pulls) : json_array();
	pthread_mutex_unlock(&a->mu);
	return r;
}

void agent_counters(struct agent *a, uint64_t *received, uint64_t *sent, uint64_t *requests)
{
	*received = __atomic_load_n(&a->rx, __ATOMIC_RELAXED);
	*sent = __atomic_load_n(&a->tx, __ATOMIC_RELAXED);
	*requests = __atomic_load_n(&a->req_rx, __ATOMIC_RELAXED);
}
