/*
 * agent_recv.c — what a pull receives: SHARD pieces, deltas, and the version
 * built once every shard is here (see agent.h for the model; the fetch and
 * its donors are agent_pull.c's).
 *
 * Pieces of a whole shard are written into a staged arena range and hashed
 * as they arrive, and the last piece's hash decides whether the shard is
 * interned or another donor is asked.  A delta is gathered whole (and
 * forwarded to the pullers waiting for it as it arrives: agent_serve.c),
 * then rebuilt against the base this node holds by a codec worker
 * (agent_pool.h), which checks its hash before anything is staged; the
 * agent interns it when the job comes back (recv_on_rebuilt()), while
 * other shards keep arriving.  When every shard is here the version is
 * built and sealed in through the mount (the import hook,
 * pull_materialize(), agent_pull.c's).
 *
 * What the agent thread spends passing pieces on (cut-through, the last
 * piece once verified) is counted as forwarding (agent.cpu_fwd_ns), the rest
 * of these calls as receiving by agent.c, which measures them.
 *
 * Called by agent.c (recv_on_shard(), recv_on_rebuilt()); calls agent_pull.c,
 * agent_serve.c and agent_pool.c only.  Runs on the agent thread only.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "agent_i.h"
#include "metrics.h"

/*
 * Forwarding is timed only where a request waits (a->serve.deferred): else
 * the serve_*() calls below do nothing, and a leaf counts no forwarding.
 * fwd_start() is the agent thread's CPU clock then (0: none waits);
 * fwd_spent() counts what it spent since as forwarding.
 */
static uint64_t fwd_start(struct agent *a)
{
	return a->serve.deferred ? hwfs_self_cpu_ns() : 0;
}

static void fwd_spent(struct agent *a, uint64_t t0)
{
	if (t0)
		__atomic_add_fetch(&a->cpu_fwd_ns, hwfs_self_cpu_ns() - t0, __ATOMIC_RELAXED);
}

/*
 * shard_arrived() - @w's shard @sh (one reference, kept by @w) is here and
 * verified, from donor socket @peer: count it, answer the requests that
 * waited for it, and build the version if it was the last.
 */
static void shard_arrived(struct agent *a, struct fetch *f, struct want *w, struct shard *sh,
			  const void *peer)
{
	uint64_t t0;

	w->sh = sh;
	w->state = W_HELD;
	pull_donor_ok(a, peer);
	f->bytes_held += w->size;
	f->space_backoff = 0; /* it fits again: a later shortage starts the back-off afresh */
	t0 = fwd_start(a);
	serve_arrived(a, sh);
	fwd_spent(a, t0);
	if (pull_complete(f))
		pull_materialize(a, f);
}

/* The address of donor socket @peer (for the logs), or "a donor". */
static const char *peer_addr(struct agent *a, const void *peer)
{
	for (struct peer *p = a->pull.peers; p; p = p->next)
		if (p->sock == peer)
			return p->addr;
	return "a donor";
}

/*
 * rebuild_start() - the whole delta of @w is here (w->enc): hand it to a
 * codec worker, which rebuilds the shard from the base this node holds,
 * checks its hash and stages it (recv_on_rebuilt() takes it from there).
 * The want waits in W_REBUILD; its delta stays readable (w->enc, now the
 * job's) for the pullers it is forwarded to.  A base that went meanwhile
 * (hwfs rm) makes it ask for the whole shard.
 */
static void rebuild_start(struct agent *a, struct fetch *f, struct want *w)
{
	struct shard *bsh = store_get(a->o.st, &w->base);
	struct pool_job *j;

	if (!bsh || bsh->size != w->size) { /* its base went while the delta travelled */
		if (bsh)
			store_unref(a->o.st, bsh);
		LOG_INFO("agent: the base of a shard of %s is gone here; asking for it whole", f->name);
		pull_drop_partial(a, w);
		w->whole = 1;
		w->state = W_QUEUED;
		return;
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		store_unref(a->o.st, bsh);
		pull_wait_space(a, f);
		return;
	}
	*j = (struct pool_job){.kind = POOL_REBUILD, .id = ++a->next_job, .bsh = bsh,
			       .base = w->base, .hash = w->hash, .width = w->width, .size = w->size,
			       .enc = w->enc, .enc_len = w->enc_total};
	w->state = W_REBUILD;
	w->job = j->id;
	pool_submit(a->pool, j);
}

/* The want rebuilt by job @id (W_REBUILD), and its fetch in *@fp; NULL: it went. */
static struct want *rebuilt_want(struct agent *a, uint64_t id, struct fetch **fp)
{
	for (struct fetch *f = a->pull.fetches; f; f = f->next)
		for (size_t i = 0; i < f->n; i++)
			if (f->w[i].state == W_REBUILD && f->w[i].job == id) {
				*fp = f;
				return &f->w[i];
			}
	return NULL;
}

/*
 * recv_on_rebuilt() - a rebuild job is back.  Its shard matched its hash and
 * is staged: intern it, finish forwarding the delta to the pullers that had
 * it as it arrived, keep it to send on as it is.  Else nothing was staged:
 * a base damaged here makes it ask for the shard whole, and marks that
 * delta "not worth it" (pullers of this node get the shard whole, not a
 * delta made against the damaged base); a delta that does not decode or rebuilds other bytes (corrupt, made against another base)
 * reports the donor as bad and asks the next one for the whole shard; no
 * room waits for space.  The pullers the delta was being forwarded to get
 * MISSING in all those cases (they never had its last byte).  A job whose
 * want went meanwhile (the fetch ended) is dropped, its staged range given
 * back.
 */
void recv_on_rebuilt(struct agent *a, struct pool_job *j)
{
	struct fetch *f = NULL;
	struct want *w = rebuilt_want(a, j->id, &f);
	const void *peer;
	struct shard *sh;
	uint64_t t0;

	if (!w)
		goto out;
	peer = w->from;
	w->enc = NULL; /* the job's */
	w->enc_total = 0;
	w->got = 0;
	w->from = NULL;
	w->job = 0;
	w->state = W_INFLIGHT; /* (as it was before its rebuild: the fallbacks expect it) */
	if (j->r < 0)
		serve_abort_forwarded(a, &w->hash, 1);
	if (j->r == -EBADMSG && j->base_bad) {
		LOG_ERR("agent: the base of a shard of %s is damaged here (hwfs verify will "
			"say which version); asking for the shard whole", f->name);
		/* and never encode a delta against it for a puller: it would not rebuild */
		serve_keep_delta(a, &j->base, &j->hash, j->width, NULL, 0);
		w->whole = 1;
		w->state = W_QUEUED;
		goto out;
	}
	if (j->r == -EBADMSG) {
		LOG_ERR("agent: bad delta from %s for %s (%s); asking for the whole shard",
			peer_addr(a, peer), f->name, j->err);
		__atomic_add_fetch(&a->ds.failed, 1, __ATOMIC_RELAXED);
		pull_report(a, f, f->donor_names[w->donor]);
		pull_donor_failed(a, f, w->donor, "sent a delta that does not rebuild its shard");
		w->whole = 1;
		pull_next_donor(a, f, w);
		goto out;
	}
	if (j->r < 0) { /* -ENOSPC, -ENOMEM */
		w->state = W_QUEUED;
		pull_wait_space(a, f);
		goto out;
	}
	sh = store_intern_staged(a->o.st, &w->hash, j->roff, w->size);
	j->staged = 0; /* given back by store_intern_staged() if it failed */
	if (!sh) {
		serve_abort_forwarded(a, &w->hash, 1);
		pull_fail(a, f, "out of memory");
		goto out;
	}
	__atomic_add_fetch(&a->ds.received, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&a->rx, w->size, __ATOMIC_RELAXED);
	t0 = fwd_start(a);
	serve_finish_delta(a, &w->hash, w->size, j->enc, j->enc_len);
	fwd_spent(a, t0);
	if (j->enc_len <= w->size * hwfs_tun.delta_max_pct / 100) { /* else not worth sending on */
		serve_keep_delta(a, &j->base, &j->hash, j->enc_width, j->enc, j->enc_len);
		j->enc = NULL;
	}
	shard_arrived(a, f, w, sh, peer);
out:
	pool_job_free(a->o.st, j);
}

/*
 * on_delta_piece() - a SHARD piece of a delta for @w.  Refused as malformed
 * (the donor backs off, the next one is asked): a delta @w was not asked
 * for as, or against another base, a total under the codec's header or
 * larger than the shard itself (a delta is never worth more), bytes past the
 * total, an empty piece.  Pieces come in order from one donor into a buffer
 * of the declared total, forwarded on to the pullers waiting for it as they
 * come; the last one starts the shard's rebuild on a codec worker.
 */
static void on_delta_piece(struct agent *a, struct fetch *f, struct want *w, struct proto_msg *m,
			   const char *from, const void *peer)
{
	uint64_t pos = proto_int(m, "offset"), len = m->payload_len;
	uint64_t total = json_object_get(m->h, "total") ? proto_int(m, "total") : len;
	const char *why = NULL;
	hwfs_hash_t base;
	uint64_t t0;

	proto_hash(m, "base", &base);
	if (pos > 0 && (!w->enc || w->from != peer || pos != w->got || total != w->enc_total))
		return; /* a stray piece (an old request's, an old donor's, out of order): ignore */
	if (!want_delta(w))
		why = "a delta that was not asked for";
	else if (hwfs_hash_cmp(&base, &w->base))
		why = "a delta against another base";
	else if (total < DELTA_HDR || total > w->size)
		why = "a delta of an impossible length";
	else if (pos + len > total || len == 0)
		why = "a delta piece outside its delta";
	if (why) {
		LOG_ERR("agent: malformed piece from %s for %s: %s; asking another donor", from,
			f->name, why);
		pull_donor_failed(a, f, w->donor, "sent a malformed piece");
		pull_next_donor(a, f, w);
		return;
	}
	if (pos == 0) { /* (re)start */
		pull_drop_partial(a, w);
		w->enc = malloc(total);
		if (!w->enc) {
			pull_wait_space(a, f);
			return;
		}
		w->enc_total = total;
		w->from = peer;
	}
	memcpy(w->enc + pos, m->payload, len);
	w->got += len;
	t0 = fwd_start(a);
	serve_forward_delta(a, w);
	fwd_spent(a, t0);
	if (w->got == w->enc_total)
		rebuild_start(a, f, w);
}

/*
 * A SHARD piece.  Pieces of one shard come in order from one donor; the first
 * (offset 0) takes an unbacked staging range (store_stage_alloc()), each is
 * written there (store_stage_write(): pwrite, no zero-filled pages) and added
 * to a running hash, and the last one checks the hash and interns the shard
 * (store_intern_staged()).
 */
void recv_on_shard(struct agent *a, struct proto_msg *m, const char *from, const void *peer)
{
	struct fetch *f = NULL;
	struct want *w;
	hwfs_hash_t h;
	uint64_t pos = proto_int(m, "offset"), len = m->payload_len;
	uint64_t total = json_object_get(m->h, "total") ? proto_int(m, "total") : len;
	struct shard *sh;
	XXH128_canonical_t c;
	int r;

	if (proto_hash(m, "hash", &h) < 0)
		return;
	w = pull_find_want(a, &h, &f);
	if (!w || w->state != W_INFLIGHT)
		return; /* late duplicate, or a shard we stopped asking for */
	f->last_rx = now_s();
	if (proto_str(m, "enc")) {
		on_delta_piece(a, f, w, m, from, peer);
		return;
	}
	if (total != w->size || pos + len > total || len == 0) {
		LOG_ERR("agent: malformed piece from %s for %s; asking another donor", from, f->name);
		pull_donor_failed(a, f, w->donor, "sent a malformed piece");
		pull_next_donor(a, f, w);
		return;
	}
	if (pos == 0) { /* (re)start */
		pull_drop_partial(a, w);
		w->xs = XXH3_createState();
		if (!w->xs || store_stage_alloc(a->o.st, w->size, 1, &w->roff) < 0) {
			if (w->xs)
				XXH3_freeState(w->xs);
			w->xs = NULL;
			pull_wait_space(a, f);
			return;
		}
		XXH3_128bits_reset(w->xs);
		w->from = peer;
	} else if (!w->xs || w->from != peer || pos != w->got) {
		return; /* a stray piece (an old donor's, or out of order): ignore */
	}
	r = store_stage_write(a->o.st, w->roff + pos, m->payload, len);
	if (r < 0) {
		LOG_ERR("agent: writing a shard into the arena: %s", strerror(-r));
		pull_wait_space(a, f); /* frees every partial shard */
		return;
	}
	XXH3_128bits_update(w->xs, m->payload, len);
	w->got += len;
	__atomic_add_fetch(&a->rx, len, __ATOMIC_RELAXED);
	if (w->got < w->size) {
		uint64_t t0 = fwd_start(a);

		serve_forward(a, w, m);
		fwd_spent(a, t0);
		return;
	}
	/* the last piece: is it the shard that was asked for? */
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(w->xs));
	XXH3_freeState(w->xs);
	w->xs = NULL;
	if (memcmp(c.digest, h.b, HWFS_HASH_LEN)) {
		LOG_ERR("agent: bad shard from %s for %s (hash mismatch); asking another donor", from,
			f->name);
		pull_report(a, f, f->donor_names[w->donor]);
		store_stage_free(a->o.st, w->roff, w->size);
		w->got = 0;
		serve_abort_forwarded(a, &h, 0);
		pull_donor_failed(a, f, w->donor, "sent a shard that does not match its hash");
		pull_next_donor(a, f, w);
		return;
	}
	sh = store_intern_staged(a->o.st, &h, w->roff, w->size);
	w->got = 0;
	if (!sh) {
		pull_fail(a, f, "out of memory");
		return;
	}
	shard_arrived(a, f, w, sh, peer);
}
