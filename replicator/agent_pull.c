/*
 * agent_pull.c — pulling versions from donors: planning the fetch (see
 * agent.h for the model).
 *
 * A PLAN from the coordinator becomes a fetch: the version's distinct shards
 * in manifest order (wants), the ones the store lacks queued, the donors to
 * ask and, per shard, the base to take a delta against.  pull_pump() keeps a
 * window of GETs in flight per fetch, fails over from silent donors and
 * backs off failing ones (per donor, doubling); a MISSING answer asks again
 * later or the next donor.  A fetch asks only for what this node can keep:
 * the rest of the version must fit in the store's room once what is in
 * flight has landed (fetch_fits()), else it asks for nothing and waits, so
 * a version that does not fit fetches no bytes to drop and takes no room
 * from one that does; a shard that finds no room when it arrives makes its
 * fetch back off (pull_wait_space()).
 * What arrives (SHARD pieces, deltas rebuilt) is agent_recv.c's; the
 * version is built here once every shard is (pull_materialize()), and
 * agent_pull.arrived tells the commit (agent_commit.c) without a call back.
 * This file also holds the sockets' helpers every earlier file uses:
 * agent_send_coord() and agent_set_backoff().
 *
 * Called by agent.c, agent_commit.c and agent_recv.c; calls agent_serve.c and
 * agent_pool.c only.  Runs on the agent thread only.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "agent_i.h"
#include "delta_base.h"
#include "keys.h"
#include "manifest.h"
#include "metrics.h"

/* ------------------------------------------------------------- sockets */

/*
 * The coordinator's DEALER (agent.c opens it) and the donors' (here): sending to
 * the coordinator, and the options every DEALER of the agent gets.
 */
void agent_send_coord(struct agent *a, enum proto_type t, json_t *fields, const void *payload,
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
void agent_set_backoff(void *sock)
{
	int ivl = (int)hwfs_tun.reconnect_ms, max = (int)hwfs_tun.reconnect_max_ms;
	int linger = 0, sndtimeo = 0;

	zmq_setsockopt(sock, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl));
	zmq_setsockopt(sock, ZMQ_RECONNECT_IVL_MAX, &max, sizeof(max));
	zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_setsockopt(sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof(sndtimeo));
}

/* ------------------------------------------------------------- donors */

/* The donor connection to @addr, or NULL if none was opened yet. */
static struct peer *peer_find(struct agent *a, const char *addr)
{
	for (struct peer *p = a->pull.peers; p; p = p->next)
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
		agent_set_backoff(p->sock);
	if (!p->addr || !p->sock ||
	    zmq_setsockopt(p->sock, ZMQ_ROUTING_ID, a->o.node, strlen(a->o.node)) < 0 ||
	    (a->keys && keys_client(a->keys, p->sock, key) < 0) || zmq_connect(p->sock, addr) < 0) {
		LOG_ERR("agent: cannot connect to donor %s: %s", addr, zmq_strerror(errno));
		if (p->sock)
			zmq_close(p->sock);
		free(p->addr);
		free(p);
		return NULL;
	}
	p->next = a->pull.peers;
	a->pull.peers = p;
	return p;
}

/* ------------------------------------------------------------- fetches */

struct want *pull_find_want(struct agent *a, const hwfs_hash_t *h, struct fetch **fp)
{
	for (struct fetch *f = a->pull.fetches; f; f = f->next)
		for (size_t i = 0; i < f->n; i++)
			if (!hwfs_hash_cmp(&f->w[i].hash, h)) {
				if (fp)
					*fp = f;
				return &f->w[i];
			}
	return NULL;
}

/*
 * Forget a shard, or its delta, that was arriving in pieces (its range goes
 * back; the pullers a delta was forwarded to get MISSING).  A want being
 * rebuilt is left to its job (recv_on_rebuilt()).
 */
void pull_drop_partial(struct agent *a, struct want *w)
{
	if (w->state == W_REBUILD)
		return;
	if (w->enc) { /* a delta arriving */
		serve_abort_forwarded(a, &w->hash, 1);
		free(w->enc);
		w->enc = NULL;
		w->enc_total = 0;
	}
	if (w->xs) { /* a whole shard arriving */
		XXH3_freeState(w->xs);
		w->xs = NULL;
		store_stage_free(a->o.st, w->roff, w->size);
	}
	w->got = 0;
	w->from = NULL;
}

/* Free @f's donor lists (endpoints, names, keys); it is left with none. */
static void free_donors(struct fetch *f)
{
	for (size_t i = 0; i < f->n_donors; i++) {
		free(f->donors[i]);
		free(f->donor_names[i]);
		free(f->donor_keys[i]);
	}
	free(f->donors);
	free(f->donor_names);
	free(f->donor_keys);
	f->donors = f->donor_names = f->donor_keys = NULL;
	f->n_donors = 0;
}

static void fetch_free(struct agent *a, struct fetch *f)
{
	for (size_t i = 0; i < f->n; i++) {
		pull_drop_partial(a, &f->w[i]);
		if (f->w[i].sh)
			store_unref(a->o.st, f->w[i].sh);
	}
	free_donors(f);
	free(f->w);
	hwfs_vrec_free(f->rec);
	free(f->name);
	free(f);
}

static void fetch_unlink(struct agent *a, struct fetch *f)
{
	struct fetch **pp = &a->pull.fetches;

	while (*pp && *pp != f)
		pp = &(*pp)->next;
	if (*pp)
		*pp = f->next;
}

/*
 * HAVE: progress of @name here.  @bad_donor names a node that sent a corrupt
 * shard (or NULL), @waiting says why the pull does not move (NULL or "").
 */
void pull_send_have(struct agent *a, const char *name, const hwfs_hash_t *digest, int complete,
		      uint64_t held, uint64_t needed, const char *bad_donor, const char *waiting)
{
	json_t *h = json_pack("{s:s, s:o, s:b, s:I, s:I}", "version", name, "digest",
			      hwfs_hash_json(digest), "complete", complete, "bytes_held", (json_int_t)held,
			      "bytes_needed", (json_int_t)needed);

	if (h && bad_donor)
		json_object_set_new(h, "bad_donor", json_string(bad_donor));
	if (h && waiting && *waiting)
		json_object_set_new(h, "waiting", json_string(waiting));
	agent_send_coord(a, P_HAVE, h, NULL, 0);
}

/* Bytes of @f's distinct shards that are not here yet. */
static uint64_t fetch_missing(const struct fetch *f)
{
	return f->bytes_needed - f->bytes_held;
}

/* Bytes of @f's distinct shards that are here (held before the pull, or pulled since). */
static uint64_t fetch_held(const struct fetch *f)
{
	return f->total - fetch_missing(f);
}

/* Bytes of @f asked for and not answered yet: the sizes of its wants in flight. */
static uint64_t fetch_inflight(const struct fetch *f)
{
	uint64_t n = 0;

	for (size_t i = 0; i < f->n; i++)
		if (f->w[i].state == W_INFLIGHT)
			n += f->w[i].size;
	return n;
}

/* Bytes of @f's shards still to ask for: queued, neither in flight nor here. */
static uint64_t fetch_queued(const struct fetch *f)
{
	uint64_t n = 0;

	for (size_t i = 0; i < f->n; i++)
		if (f->w[i].state == W_QUEUED)
			n += f->w[i].size;
	return n;
}

/*
 * fetch_fits() - can this node keep the rest of @f: does what is still to
 * ask for fit in the store's room once every shard in flight (@inflight:
 * of every fetch) has landed?  A fetch that does not fit asks for nothing,
 * so no byte is fetched only to be dropped, and the room stays for the
 * versions that do fit.
 */
static int fetch_fits(struct agent *a, const struct fetch *f, uint64_t inflight)
{
	uint64_t queued = fetch_queued(f);

	return !queued || queued + inflight <= store_stage_room(a->o.st);
}

/* Why @f is not moving, as a sentence for status ("" when it is). */
static void fetch_waiting(struct agent *a, const struct fetch *f, char *buf, size_t len)
{
	char need[32], free_[32];

	buf[0] = '\0';
	if (!f->space_wait && !f->room_wait)
		return;
	snprintf(buf, len, "waiting for space: need %s, free %s",
		 hwfs_fmt_size(fetch_missing(f), need, sizeof(need)),
		 hwfs_fmt_size(store_stage_room(a->o.st), free_, sizeof(free_)));
}

/* HAVE for a fetch in progress (with why it waits, if it does). */
void pull_report(struct agent *a, struct fetch *f, const char *bad_donor)
{
	char why[128];

	fetch_waiting(a, f, why, sizeof(why));
	pull_send_have(a, f->name, &f->digest, 0, fetch_held(f), fetch_missing(f), bad_donor, why);
}

/*
 * publish_pulls() - rebuild the snapshot agent_pulls() hands to other
 * threads: one entry per version being pulled.  A failed allocation keeps
 * the previous snapshot.
 */
static void publish_pulls(struct agent *a)
{
	json_t *arr = json_array();

	for (struct fetch *f = a->pull.fetches; arr && f; f = f->next) {
		char why[128];
		json_t *e = json_pack("{s:s, s:I, s:I}", "version", f->name, "bytes_held",
				      (json_int_t)fetch_held(f),
				      "bytes_total", (json_int_t)f->total);

		fetch_waiting(a, f, why, sizeof(why));
		if (e && *why) {
			json_object_set_new(e, "waiting", json_string(why));
			json_object_set_new(e, "need_bytes",
					    json_integer((json_int_t)fetch_missing(f)));
			json_object_set_new(e, "free_bytes", json_integer((json_int_t)store_stage_room(a->o.st)));
		}
		if (e)
			json_array_append_new(arr, e);
	}
	if (!arr)
		return;
	pthread_mutex_lock(&a->mu);
	json_decref(a->pull.pulls);
	a->pull.pulls = arr;
	pthread_mutex_unlock(&a->mu);
	a->pull.last_pulls = now_s();
}

/*
 * pull_wait_space() - the store cannot take the next shard of @f: stop
 * asking (what is in flight is dropped, partial shards are freed) and retry
 * after space_retry_ms, doubling up to space_retry_max_ms, or at once when
 * the arena's free bytes grow (rm, gc, another version leaving).  Status
 * and HAVE say why it waits.
 */
void pull_wait_space(struct agent *a, struct fetch *f)
{
	char why[128];

	for (size_t i = 0; i < f->n; i++) {
		pull_drop_partial(a, &f->w[i]);
		if (f->w[i].state == W_INFLIGHT)
			f->w[i].state = W_QUEUED;
	}
	f->space_backoff = f->space_backoff > 0
			       ? HWFS_MIN(f->space_backoff * 2, ms_s(hwfs_tun.space_retry_max_ms))
			       : ms_s(hwfs_tun.space_retry_ms);
	f->space_retry_at = now_s() + f->space_backoff;
	f->space_free = store_stage_room(a->o.st);
	if (!f->space_wait) {
		f->space_wait = 1;
		fetch_waiting(a, f, why, sizeof(why));
		LOG_WARN("agent: %s is %s; retrying every %.1f s or more (space_retry_ms), and at once "
			 "when space is freed here (hwfs rm, hwfs gc)", f->name, why, f->space_backoff);
	}
	pull_report(a, f, NULL);
	publish_pulls(a);
}


void pull_end(struct agent *a, struct fetch *f)
{
	fetch_unlink(a, f);
	fetch_free(a, f);
	serve_flush_deferred(a);
}

void pull_fail(struct agent *a, struct fetch *f, const char *why)
{
	LOG_ERR("agent: giving up on %s: %s", f->name, why);
	pull_report(a, f, NULL);
	pull_end(a, f);
}

int pull_complete(const struct fetch *f)
{
	for (size_t i = 0; i < f->n; i++)
		if (f->w[i].state != W_HELD)
			return 0;
	return 1;
}

/*
 * pull_donor_failed() - donor @d of @f failed (@why): back it off, doubling its
 * pause up to donor_backoff_max_ms.  Logged when the back-off starts and
 * when it reaches its cap, not on every failure.
 */
void pull_donor_failed(struct agent *a, struct fetch *f, size_t d, const char *why)
{
	struct peer *p = d < f->n_donors ? peer_find(a, f->donors[d]) : NULL;
	double base = ms_s(hwfs_tun.donor_backoff_ms), cap = ms_s(hwfs_tun.donor_backoff_max_ms);
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
void pull_donor_ok(struct agent *a, const void *peer)
{
	for (struct peer *p = a->pull.peers; p; p = p->next)
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
void pull_next_donor(struct agent *a, struct fetch *f, struct want *w)
{
	pull_drop_partial(a, w);
	w->tries++;
	__atomic_fetch_add(&a->pull.retries, 1, __ATOMIC_RELAXED);
	w->donor = f->n_donors ? (w->donor + 1) % f->n_donors : 0;
	w->misses = 0;
	w->state = W_QUEUED;
}

static int set_donors(struct agent *a, struct fetch *f, json_t *donors, int stripe)
{
	size_t i, n = json_array_size(donors);
	json_t *d;

	free_donors(f);
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
		pull_drop_partial(a, &f->w[k]);
		f->w[k].donor = f->stripe ? k % f->n_donors : 0;
		f->w[k].tries = 0;
		f->w[k].misses = 0;
	}
	return 0;
}

static int cmp_want_hash(const void *x, const void *y)
{
	return hwfs_hash_cmp(&(*(struct want *const *)x)->hash, &(*(struct want *const *)y)->hash);
}

/*
 * assign_bases() - the plan names version @base (or NULL) as the one to take
 * deltas against (the coordinator picked it from the have-table): give each
 * shard of @f still to fetch its base shard by the rule of delta_base.h,
 * when deltas are on and this node holds @base sealed; else none (asked for
 * whole).  A re-plan calls it again: the bases follow the newest plan
 * (requests in flight were put back in the queue by set_donors()), except
 * those being rebuilt from a delta, which keep theirs.  Shards a delta of
 * which failed stay whole.
 */
static void assign_bases(struct agent *a, struct fetch *f, const char *base)
{
	struct hwfs_vrec *bv = NULL;
	struct delta_bases *idx = NULL;
	struct want **by_hash = NULL;
	size_t mapped = 0;

	for (size_t k = 0; k < f->n; k++) {
		if (f->w[k].state == W_REBUILD)
			continue; /* its delta (against that base) is being rebuilt, and forwarded */
		memset(&f->w[k].base, 0, sizeof(f->w[k].base));
		f->w[k].width = 1;
	}
	if (!base || !hwfs_tun.delta || a->o.hooks->snapshot(a->o.arg, base, &bv) < 0 ||
	    bv->state != HWFS_V_SEALED || delta_bases_new(bv, &idx) < 0 ||
	    !(by_hash = malloc((f->n ? f->n : 1) * sizeof(*by_hash))))
		goto out;
	for (size_t k = 0; k < f->n; k++)
		by_hash[k] = &f->w[k];
	qsort(by_hash, f->n, sizeof(*by_hash), cmp_want_hash);
	for (size_t i = 0; i < f->rec->n_files; i++)
		for (size_t j = 0; j < f->rec->files[i].n_ext; j++) {
			const struct hwfs_extent *e = &f->rec->files[i].ext[j], *be;
			struct want key = {.hash = e->hash}, *kp = &key, **hit;
			unsigned width;

			be = delta_base_of(idx, &f->rec->files[i], e, &width, NULL);
			hit = be ? bsearch(&kp, by_hash, f->n, sizeof(*by_hash), cmp_want_hash) : NULL;
			if (!hit || (*hit)->state == W_HELD || !hwfs_hash_is_zero(&(*hit)->base) ||
			    !hwfs_hash_cmp(&be->hash, &e->hash))
				continue; /* (a shard used twice takes the base of its first use) */
			(*hit)->base = be->hash;
			(*hit)->width = width;
			mapped++;
		}
	LOG_INFO("agent: %s: %zu shard(s) can come as deltas against %s", f->name, mapped, base);
out:
	free(by_hash);
	delta_bases_free(idx);
	hwfs_vrec_free(bv);
}

void pull_on_plan(struct agent *a, struct proto_msg *m)
{
	const char *name = proto_str(m, "version");
	struct hwfs_vrec *rec = NULL;
	struct fetch *f;
	enum hwfs_vstate state;
	hwfs_hash_t digest, here, *hs = NULL;
	char err[256];
	size_t total = 0, n = 0;

	if (proto_hash(m, "digest", &digest) < 0)
		return;
	if (a->o.hooks->lookup(a->o.arg, name, &state, &here) == 0) {
		if (state == HWFS_V_SEALED && !hwfs_hash_cmp(&here, &digest)) {
			pull_send_have(a, name, &digest, 1, 0, 0, NULL, NULL);
			return;
		}
		LOG_ERR("agent: plan for %s, but a different %s exists here; ignored", name, name);
		return;
	}
	for (f = a->pull.fetches; f; f = f->next)
		if (!strcmp(f->name, name)) { /* a new plan: new donors, maybe another base */
			set_donors(a, f, json_object_get(m->h, "donors"), proto_bool(m, "stripe"));
			assign_bases(a, f, proto_str(m, "base"));
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
	f->planned_ns = hwfs_mono_ns();
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
			f->w[f->n].sh = store_get(a->o.st, &e->hash);
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
	assign_bases(a, f, proto_str(m, "base"));
	if (set_donors(a, f, json_object_get(m->h, "donors"), proto_bool(m, "stripe")) < 0)
		goto oom;
	f->last_rx = now_s();
	f->next = a->pull.fetches;
	a->pull.fetches = f;
	LOG_INFO("agent: pulling %s: %llu bytes missing of %zu shards, from %s", name,
		 (unsigned long long)f->bytes_needed, f->n, f->n_donors ? f->donors[0] : "nobody");
	if (pull_complete(f))
		pull_materialize(a, f);
	return;
oom:
	free(hs);
	hwfs_vrec_free(rec);
	if (f)
		fetch_free(a, f);
	LOG_ERR("agent: out of memory planning %s", name);
}

/* Every shard is here: build the version and seal it in through the mount (import hook). */
void pull_materialize(struct agent *a, struct fetch *f)
{
	char err[512] = "";
	int ok;

	serve_note_imported(a, f->name); /* its seal is not this node's to encode ahead */
	ok = a->o.hooks->import(a->o.arg, f->rec, err, sizeof(err)) == 0;

	if (ok) {
		LOG_INFO("agent: %s complete (%llu bytes received)", f->name,
			 (unsigned long long)f->bytes_held);
		hwfs_hist_observe_ns(&hwfs_nm.arrival, hwfs_mono_ns() - f->planned_ns);
		pull_send_have(a, f->name, &f->digest, 1, f->total, 0, NULL, NULL);
		if (a->pull.arrived) /* the commit waiting for it (agent_commit.c) */
			a->pull.arrived(a, f->name);
	} else {
		LOG_ERR("agent: %s", err);
		pull_report(a, f, NULL);
	}
	pull_end(a, f);
}

/*
 * unsend() - a GET to donor @d of @f could not be sent: the shards it asked
 * for (marked in flight just now) go to their next donor, asked no sooner
 * than the donor back-off.
 */
static void unsend(struct agent *a, struct fetch *f, size_t d, double now)
{
	pull_donor_failed(a, f, d, "cannot be reached");
	for (size_t i = 0; i < f->n; i++) {
		struct want *w = &f->w[i];

		if (w->state == W_INFLIGHT && w->donor == d && !w->xs && w->not_before <= now &&
		    w->sent_at == now) {
			pull_next_donor(a, f, w);
			w->not_before = now + ms_s(hwfs_tun.donor_backoff_ms);
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


/*
 * base_held() - about to ask for @w as a delta: is its base still here?  A
 * base removed meanwhile (hwfs rm, gc) makes it asked for whole at once,
 * rather than after a delta made against it travelled for nothing.
 */
static int base_held(struct agent *a, struct want *w)
{
	struct shard *bsh = store_get(a->o.st, &w->base);

	if (bsh)
		store_unref(a->o.st, bsh);
	else
		w->whole = 1;
	return bsh != NULL;
}

/*
 * wait_room() - what is left of @f does not fit here (fetch_fits()): ask
 * for none of it, say so once (status and HAVE say why it waits, need and
 * free), and look again on every pass: the room grows when a version is
 * removed here and when the other pulls' shards have landed.
 */
static void wait_room(struct agent *a, struct fetch *f, double now)
{
	char why[128];

	if (!f->room_wait) {
		f->room_wait = 1;
		fetch_waiting(a, f, why, sizeof(why));
		LOG_WARN("agent: %s does not fit here (%s): asking for none of it until it does "
			 "(hwfs rm, hwfs gc, or the pulls in flight landing)", f->name, why);
		pull_report(a, f, NULL);
		publish_pulls(a);
		f->last_report = now;
	} else if (now - f->last_report >= ms_s(hwfs_tun.progress_ms)) {
		pull_report(a, f, NULL);
		f->last_report = now;
	}
}

/* HAVE for @f when progress_ms passed since the last one (status --cluster shows it). */
static void report_due(struct agent *a, struct fetch *f, double now)
{
	if (now - f->last_report >= ms_s(hwfs_tun.progress_ms)) {
		pull_report(a, f, NULL);
		f->last_report = now;
	}
}

/*
 * space_waiting() - @f stopped because the store could not take a shard
 * (pull_wait_space()): is it still waiting?  It retries once its back-off
 * ended or space was freed here.  Returns 1 (still waiting: ask for nothing)
 * or 0.
 */
static int space_waiting(struct agent *a, struct fetch *f, double now)
{
	uint64_t free_now;
	char fb[32];

	if (!f->space_wait)
		return 0;
	free_now = store_stage_room(a->o.st);
	if (now < f->space_retry_at && free_now <= f->space_free) {
		report_due(a, f, now);
		return 1;
	}
	LOG_INFO("agent: %s: retrying (%s free%s)", f->name, hwfs_fmt_size(free_now, fb, sizeof(fb)),
		 free_now > f->space_free ? ", space was freed here" : "");
	f->space_wait = 0;
	return 0;
}

/*
 * room_waiting() - does what is left of @f not fit here, with @all_inflight
 * bytes of every fetch in flight (wait_room())?  Returns 1 (ask for nothing)
 * or 0, saying once that it fits again.
 */
static int room_waiting(struct agent *a, struct fetch *f, uint64_t all_inflight, double now)
{
	if (!fetch_fits(a, f, all_inflight)) {
		wait_room(a, f, now);
		return 1;
	}
	if (f->room_wait) {
		LOG_INFO("agent: %s fits here now: pulling it", f->name);
		f->room_wait = 0;
		publish_pulls(a);
	}
	return 0;
}

/*
 * fail_silent() - no piece of @f arrived for donor_silence_ms while @inflight
 * bytes were asked for: every donor with a shard in flight is backed off and
 * those shards go to their next donor.  Returns the bytes still in flight.
 */
static uint64_t fail_silent(struct agent *a, struct fetch *f, uint64_t inflight, double now)
{
	if (!inflight || now - f->last_rx <= ms_s(hwfs_tun.donor_silence_ms))
		return inflight;
	for (size_t d = 0; d < f->n_donors; d++)
		for (size_t i = 0; i < f->n; i++)
			if (f->w[i].state == W_INFLIGHT && f->w[i].donor == d) {
				pull_donor_failed(a, f, d, "is silent");
				break;
			}
	for (size_t i = 0; i < f->n; i++)
		if (f->w[i].state == W_INFLIGHT)
			pull_next_donor(a, f, &f->w[i]);
	f->last_rx = now;
	LOG_WARN("agent: no shard of %s for %.1f s (donor_silence_ms): asking the next donor",
		 f->name, ms_s(hwfs_tun.donor_silence_ms));
	return 0;
}

/*
 * ring_again() - every donor of a shard failed once: not a reason to give up
 * (a busy machine makes donors look silent, a dead donor may come back).
 * Start round the ring again after a pause (once: the pause used to be
 * renewed on every pass, so the shard was never asked for again); the
 * coordinator re-plans if a donor died or came back.
 */
static void ring_again(struct fetch *f, double now)
{
	for (size_t i = 0; i < f->n; i++)
		if (f->w[i].state == W_QUEUED && f->w[i].tries >= f->n_donors) {
			if (!f->ring_warned)
				LOG_WARN("agent: every donor of a shard of %s failed once; going round "
					 "them again after %.1f s", f->name,
					 ms_s(hwfs_tun.donor_backoff_ms));
			f->ring_warned = 1;
			f->w[i].tries = 0;
			f->w[i].not_before = now + ms_s(hwfs_tun.donor_backoff_ms);
		}
}

/* One GET being made: its hashes, and per hash the base the puller holds and its width. */
struct get_batch {
	json_t *hashes, *bases, *widths;
	size_t n_based; /* hashes with a base (asked for as deltas) */
	uint64_t bytes; /* shard bytes asked for */
};

/*
 * batch_fill() - the queued shards of @f whose donor is @d (and whose pause
 * ended) into @b, marked in flight, while the window (@inflight of @f) and
 * get_batch_bytes and PROTO_MAX_GET allow.
 */
static void batch_fill(struct agent *a, struct fetch *f, size_t d, struct get_batch *b,
		       uint64_t inflight, double now)
{
	static const hwfs_hash_t none;

	for (size_t i = 0; i < f->n && inflight + b->bytes < hwfs_tun.pull_window_bytes &&
			   b->bytes < hwfs_tun.get_batch_bytes &&
			   json_array_size(b->hashes) < PROTO_MAX_GET;
	     i++) {
		struct want *w = &f->w[i];

		if (w->state != W_QUEUED || w->donor != d || w->not_before > now)
			continue;
		json_array_append_new(b->hashes, hwfs_hash_json(&w->hash));
		if (want_delta(w) && base_held(a, w)) {
			json_array_append_new(b->bases, hwfs_hash_json(&w->base));
			json_array_append_new(b->widths, json_integer(w->width));
			b->n_based++;
		} else {
			json_array_append_new(b->bases, hwfs_hash_json(&none));
			json_array_append_new(b->widths, json_integer(1));
		}
		w->state = W_INFLIGHT;
		w->sent_at = now;
		b->bytes += w->size;
	}
}

/*
 * batch_send() - send GET @b to donor @d of @f.  Returns 0, or -1 when
 * nothing went out (no connection to the donor: nothing is in flight; the
 * shards are asked again after a pause, the next donor first: unsend()).
 */
static int batch_send(struct agent *a, struct fetch *f, size_t d, struct get_batch *b, double now)
{
	struct peer *p = peer_get(a, f->donors[d], f->donor_keys[d]);
	json_t *g;
	int r;

	if (!p) {
		unsend(a, f, d, now);
		return -1;
	}
	g = json_pack("{s:I, s:O}", "req", (json_int_t)++a->next_req, "hashes", b->hashes);
	if (g && b->n_based) {
		json_object_set(g, "bases", b->bases);
		json_object_set(g, "widths", b->widths);
	}
	r = proto_send(p->sock, NULL, 0, P_GET, g, NULL, 0);
	json_decref(g);
	if (r < 0) {
		LOG_WARN("agent: GET to %s: %s; asking the next donor", f->donors[d],
			 r == -EAGAIN ? "no connection" : strerror(-r));
		unsend(a, f, d, now);
		return -1;
	}
	__atomic_add_fetch(&a->pull.req_tx, json_array_size(b->hashes), __ATOMIC_RELAXED);
	__atomic_add_fetch(&a->ds.asked, b->n_based, __ATOMIC_RELAXED);
	return 0;
}

/*
 * ask_donors() - fill @f's request window: one GET batch per donor that is
 * not backing off, while *@inflight (of @f) is below pull_window_bytes; what
 * goes out is added to *@inflight and *@all_inflight (of every fetch).
 */
static void ask_donors(struct agent *a, struct fetch *f, uint64_t *inflight,
		       uint64_t *all_inflight, double now)
{
	for (size_t d = 0; d < f->n_donors && *inflight < hwfs_tun.pull_window_bytes; d++) {
		struct get_batch b = {json_array(), json_array(), json_array(), 0, 0};

		if (!donor_off(a, f, d, now))
			batch_fill(a, f, d, &b, *inflight, now);
		if (json_array_size(b.hashes) && batch_send(a, f, d, &b, now) == 0) {
			*inflight += b.bytes;
			*all_inflight += b.bytes;
			if (*inflight == b.bytes) /* nothing was in flight: the silence clock starts */
				f->last_rx = now;
		}
		json_decref(b.hashes);
		json_decref(b.bases);
		json_decref(b.widths);
	}
}

/*
 * pull_pump() - every pass of the loop, for each fetch: unless it waits for
 * space or room, fail over from silent donors, go round the ring again where
 * every donor failed, move shards off donors that back off, keep the request
 * window full, and report progress.
 */
void pull_pump(struct agent *a)
{
	double now = now_s();
	uint64_t all_inflight = 0; /* of every fetch, kept as GETs go out below */

	for (const struct fetch *g = a->pull.fetches; g; g = g->next)
		all_inflight += fetch_inflight(g);

	if (now - a->pull.last_pulls >= PULLS_SNAPSHOT_S)
		publish_pulls(a);
	for (struct fetch *f = a->pull.fetches, *next; f; f = next) {
		uint64_t inflight;

		next = f->next;
		if (space_waiting(a, f, now) || room_waiting(a, f, all_inflight, now))
			continue;
		inflight = fail_silent(a, f, fetch_inflight(f), now);
		ring_again(f, now);
		prefer_donors(a, f, now);
		ask_donors(a, f, &inflight, &all_inflight, now);
		report_due(a, f, now);
	}
}


void pull_on_missing(struct agent *a, struct proto_msg *m)
{
	struct fetch *f = NULL;
	struct want *w;
	hwfs_hash_t h;

	if (proto_hash(m, "hash", &h) < 0 || !(w = pull_find_want(a, &h, &f)) || w->state != W_INFLIGHT)
		return;
	w->state = W_QUEUED;
	pull_drop_partial(a, w);
	if ((uint64_t)++w->misses >= hwfs_tun.missing_tries) {
		pull_donor_failed(a, f, w->donor, "does not have a shard it was planned to have");
		pull_next_donor(a, f, w);
	} else
		w->not_before = now_s() + ms_s(hwfs_tun.missing_retry_ms);
}

/* agent_stop(), after the thread ended: free every fetch and close every donor socket. */
void pull_free(struct agent *a)
{
	while (a->pull.fetches) {
		struct fetch *f = a->pull.fetches;

		a->pull.fetches = f->next;
		fetch_free(a, f);
	}
	while (a->pull.peers) {
		struct peer *p = a->pull.peers;

		a->pull.peers = p->next;
		zmq_close(p->sock); /* LINGER 0: agent_set_backoff() */
		free(p->addr);
		free(p);
	}
}

