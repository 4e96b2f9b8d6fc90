/*
 * agent_serve.c — serving shards to pullers (see agent.h for the model).
 *
 * GETs arrive on the node's ROUTER.  A shard the store holds is sent at once
 * in SHARD pieces, zero copy (each piece holds a reference on the shard); a
 * shard this node is itself still pulling is deferred and answered when it
 * arrives, and the pieces already here are forwarded as they come
 * (cut-through), which makes a chain of nodes a pipeline of pieces.  Anything
 * else, or a deferred shard whose pull ended without it, gets MISSING.
 *
 * A GET may name, per shard, a base the puller holds (an earlier version of
 * the same tensor) and its element width: when this node holds the base too,
 * the shard goes as a delta against it (fs/common/delta.h) if that is at
 * most delta_max_pct of the shard, else whole.  Deltas are kept (up to
 * delta_cache_bytes, least recently sent first out), so a delta is encoded
 * once however many pullers ask for it, and a delta this node received is
 * sent on as it came (serve_keep_delta()): down a chain only the first node
 * encodes.
 *
 * Encoding is never done here: a GET whose delta is not kept yet waits on
 * an encode job of the codec workers (agent_pool.h; struct penc, several
 * pullers of one delta share the job) and is answered when it is done
 * (serve_on_encoded()).  When a version is sealed here (not pulled), its
 * deltas against the version its receivers will name as their base (the
 * newest here with most bytes matched by the rule of delta_base.h, as the
 * coordinator's pick_base()) are encoded ahead of demand, a few jobs at a
 * time, into the same cache (serve_ahead_sealed(), serve_ahead_pump()): the
 * first GET finds them made, or joins the job making them.  A run stops at
 * delta_cache_bytes of deltas made, and is cancelled when its version goes.
 *
 * A relay forwards a delta it receives to the pullers that named the same
 * base as its pieces arrive (serve_forward_delta()), rebuilding it on the
 * workers meanwhile; the delta's last byte goes only once the rebuild here
 * matched the shard's hash (serve_finish_delta()), so a bad delta reaches no
 * puller whole from a relay that caught it: they get MISSING and ask again.
 *
 * Calls agent_pool.c only; what it needs of the pulls (is a shard being
 * pulled here?) it asks through agent_serve.find_want, set by agent_start().
 * Runs on the agent thread only.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "agent_i.h"
#include "delta_base.h"

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
 * Send bytes [@pos, @pos+@len) of a shard of @total bytes as one SHARD piece,
 * or with @base, of its delta against @base, @total bytes long.  With @sh,
 * zero copy (the piece holds a reference on the shard); with @pm, zero copy
 * too: the payload of the piece just received (exactly those bytes, passed
 * on by reference: proto_payload_send()); else @data is copied (a shard
 * still arriving here, forwarded before it is complete, or a delta).
 */
static int send_piece(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
		      const hwfs_hash_t *hash, const hwfs_hash_t *base, uint64_t pos, uint64_t len,
		      uint64_t total, struct shard *sh, const void *data,
		      const struct proto_msg *pm)
{
	json_t *f = json_pack("{s:I, s:o, s:I, s:I, s:I}", "req", (json_int_t)req, "hash",
			      hwfs_hash_json(hash), "size", (json_int_t)len, "offset", (json_int_t)pos,
			      "total", (json_int_t)total);
	struct sent_ref *ref = NULL;
	char *hdr = NULL;
	size_t hlen;
	zmq_msg_t m;
	int r = -ENOMEM;

	if (f && base) {
		json_object_set_new(f, "enc", json_string(PROTO_ENC_DELTA));
		json_object_set_new(f, "base", hwfs_hash_json(base));
	}
	if (!f || proto_encode(P_SHARD, f, len, &hdr, &hlen) < 0)
		goto out;
	if (zmq_send(a->router, ident, ident_len, ZMQ_SNDMORE) < 0 ||
	    zmq_send(a->router, hdr, hlen, ZMQ_SNDMORE) < 0) {
		r = -errno;
		goto out;
	}
	if (pm) {
		r = proto_payload_send(pm, a->router, 0);
		if (r < 0) {
			zmq_send(a->router, "", 0, 0); /* end the message: the receiver drops it */
			goto out;
		}
	} else if (sh) {
		ref = malloc(sizeof(*ref));
		if (!ref || zmq_msg_init_data(&m, (void *)(store_shard_data(a->o.st, sh) + pos), len,
					      sent_free, ref) < 0) {
			free(ref);
			zmq_send(a->router, "", 0, 0); /* end the message: the receiver drops it */
			goto out;
		}
		store_ref(a->o.st, sh);
		*ref = (struct sent_ref){a->o.st, sh};
		if (zmq_msg_send(&m, a->router, 0) < 0) {
			r = -errno;
			zmq_msg_close(&m);
			goto out;
		}
	} else if (zmq_send(a->router, data, len, 0) < 0) {
		r = -errno;
		goto out;
	}
	__atomic_add_fetch(&a->wire_tx, len, __ATOMIC_RELAXED);
	if (!base)
		__atomic_add_fetch(&a->tx, len, __ATOMIC_RELAXED);
	r = 0;
out:
	free(hdr);
	json_decref(f);
	return r;
}

/*
 * Tell the puller @ident that this node does not have shard @h, with why
 * (@err): ENOENT (not here, or not any more), EAGAIN (what was forwarded of
 * it was dropped here: ask again).
 */
static void send_missing(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
			 const hwfs_hash_t *h, int err)
{
	json_t *mf = json_pack("{s:I, s:o, s:i}", "req", (json_int_t)req, "hash", hwfs_hash_json(h),
			       "errno", err);

	proto_send(a->router, ident, ident_len, P_MISSING, mf, NULL, 0);
	json_decref(mf);
}

/*
 * send_range() - send bytes [@from, @to) of a shard of @total bytes (or,
 * with @base, of its delta against @base, @total bytes long) to puller
 * @ident, in pieces of at most piece_bytes (send_piece()): zero copy from
 * @sh, else copied from @data, which holds all @total bytes.  Stops at the
 * first piece that cannot be sent.  Returns the offset reached: @to when all
 * of it went.
 */
static uint64_t send_range(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
			   const hwfs_hash_t *hash, const hwfs_hash_t *base, uint64_t from,
			   uint64_t to, uint64_t total, struct shard *sh, const uint8_t *data)
{
	while (from < to) {
		uint64_t len = HWFS_MIN(hwfs_tun.piece_bytes, to - from);

		if (send_piece(a, ident, ident_len, req, hash, base, from, len, total, sh,
			       data ? data + from : NULL, NULL) < 0)
			break;
		from += len;
	}
	return from;
}

/* Send shard @sh from byte @pos on, in pieces, whole. */
static void send_whole(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
		       struct shard *sh, uint64_t pos)
{
	send_range(a, ident, ident_len, req, &sh->hash, NULL, pos, sh->size, sh->size, sh, NULL);
}

/* ------------------------------------------------------------ deltas kept */

static size_t dentry_cost(const struct dentry *e)
{
	return sizeof(*e) + e->len;
}

/* The bucket of (@base, @hash, @width) in a table of @n buckets (a power of two). */
static size_t dbucket(const hwfs_hash_t *base, const hwfs_hash_t *hash, unsigned width, size_t n)
{
	uint64_t x, y;

	memcpy(&x, hash->b, sizeof(x));
	memcpy(&y, base->b, sizeof(y));
	return (size_t)((x ^ (y * 0x9e3779b97f4a7c15ull) ^ width) & (n - 1));
}

/* Take @e out of the recency list. */
static void dlist_unlink(struct dcache *c, struct dentry *e)
{
	if (e->newer)
		e->newer->older = e->older;
	else
		c->newest = e->older;
	if (e->older)
		e->older->newer = e->newer;
	else
		c->oldest = e->newer;
	e->newer = e->older = NULL;
}

/* Put @e at the newest end of the recency list. */
static void dlist_push(struct dcache *c, struct dentry *e)
{
	e->older = c->newest;
	e->newer = NULL;
	if (c->newest)
		c->newest->newer = e;
	c->newest = e;
	if (!c->oldest)
		c->oldest = e;
}

/* Remove and free the least recently sent entry. */
static void dcache_evict(struct dcache *c)
{
	struct dentry *e = c->oldest, **pp;

	dlist_unlink(c, e);
	pp = &c->bucket[dbucket(&e->base, &e->hash, e->width, c->n_bucket)];
	while (*pp != e)
		pp = &(*pp)->chain;
	*pp = e->chain;
	c->n--;
	c->bytes -= dentry_cost(e);
	free(e->enc);
	free(e);
}

/* The kept delta of @hash against @base shuffled by @width (or its "not worth it"), or NULL. */
static struct dentry *dcache_find(struct dcache *c, const hwfs_hash_t *base,
				  const hwfs_hash_t *hash, unsigned width)
{
	if (!c->n_bucket)
		return NULL;
	for (struct dentry *e = c->bucket[dbucket(base, hash, width, c->n_bucket)]; e; e = e->chain)
		if (e->width == width && !hwfs_hash_cmp(&e->hash, hash) &&
		    !hwfs_hash_cmp(&e->base, base))
			return e;
	return NULL;
}

/* @e was sent (or found) just now: it becomes the newest. */
static void dcache_touch(struct dcache *c, struct dentry *e)
{
	dlist_unlink(c, e);
	dlist_push(c, e);
}

/*
 * dcache_put() - keep @enc (@len bytes, malloc'd, owned from here; NULL with
 * @len 0 for "not worth it") as the delta of @hash against @base, making
 * room first: the least recently sent entries go until the new one fits in
 * delta_cache_bytes and DCACHE_MAX_ENTRIES (a single entry larger than that
 * is still kept until the next one arrives, so the caller can send it).
 * Returns the entry, or NULL (out of memory: @enc is freed).
 */
static struct dentry *dcache_put(struct dcache *c, const hwfs_hash_t *base,
				 const hwfs_hash_t *hash, unsigned width, uint8_t *enc, size_t len)
{
	struct dentry *e = dcache_find(c, base, hash, width);
	size_t b;

	if (e) { /* kept already (another puller's request got there first) */
		free(enc);
		dcache_touch(c, e);
		return e;
	}
	if (!c->n_bucket) {
		c->bucket = calloc(DCACHE_MAX_ENTRIES, sizeof(*c->bucket));
		if (!c->bucket) {
			free(enc);
			return NULL;
		}
		c->n_bucket = DCACHE_MAX_ENTRIES;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		free(enc);
		return NULL;
	}
	*e = (struct dentry){.base = *base, .hash = *hash, .width = width, .enc = enc, .len = len};
	while (c->oldest && (c->bytes + dentry_cost(e) > hwfs_tun.delta_cache_bytes ||
			     c->n >= DCACHE_MAX_ENTRIES))
		dcache_evict(c);
	b = dbucket(base, hash, width, c->n_bucket);
	e->chain = c->bucket[b];
	c->bucket[b] = e;
	dlist_push(c, e);
	c->n++;
	c->bytes += dentry_cost(e);
	return e;
}

void serve_keep_delta(struct agent *a, const hwfs_hash_t *base, const hwfs_hash_t *hash,
		      unsigned width, uint8_t *enc, size_t len)
{
	dcache_put(&a->serve.dcache, base, hash, width, enc, len);
}

/* A request (@ident, @req) for shard @hash, as a waiter or a deferred GET; NULL without memory. */
static struct deferred *deferred_new(const void *ident, size_t ident_len, uint64_t req,
				     const hwfs_hash_t *hash, const hwfs_hash_t *base, unsigned width)
{
	struct deferred *d;

	if (ident_len > sizeof(d->ident) || !(d = calloc(1, sizeof(*d))))
		return NULL;
	memcpy(d->ident, ident, ident_len);
	d->ident_len = ident_len;
	d->req = req;
	d->hash = *hash;
	d->base = *base;
	d->width = width;
	return d;
}

/* Send the kept delta @e of @sh (against @base) to puller @ident, in pieces, and count it. */
static void send_delta(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
		       struct shard *sh, const hwfs_hash_t *base, struct dentry *e)
{
	if (send_range(a, ident, ident_len, req, &sh->hash, base, 0, e->len, e->len, NULL,
		       e->enc) == e->len) { /* all of it went */
		__atomic_add_fetch(&a->ds.sent, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&a->tx, sh->size, __ATOMIC_RELAXED);
		if (e->ahead) {
			__atomic_add_fetch(&a->ds.ahead_hits, 1, __ATOMIC_RELAXED);
			e->ahead = 0;
		}
	}
}

/* The encode of @hash against @base by @width pullers wait for (or that runs ahead), or NULL. */
static struct penc *penc_find(struct agent *a, const hwfs_hash_t *base, const hwfs_hash_t *hash,
			      unsigned width)
{
	for (struct penc *pe = a->serve.pencs; pe; pe = pe->next)
		if (pe->job->width == width && !hwfs_hash_cmp(&pe->job->hash, hash) &&
		    !hwfs_hash_cmp(&pe->job->base, base))
			return pe;
	return NULL;
}

/*
 * encode_submit() - queue an encode of @sh against @bsh (@base, by @width)
 * on the codec workers: a demand job, or with @batch an encode-ahead one.
 * Takes over the caller's reference on @bsh and takes one on @sh.  Returns
 * the pending encode, or NULL (out of memory; @bsh's reference dropped).
 */
static struct penc *encode_submit(struct agent *a, struct shard *sh, struct shard *bsh,
				  const hwfs_hash_t *base, unsigned width, struct ahead *batch)
{
	struct penc *pe = calloc(1, sizeof(*pe));
	struct pool_job *j = calloc(1, sizeof(*j));

	if (!pe || !j) {
		free(pe);
		free(j);
		store_unref(a->o.st, bsh);
		return NULL;
	}
	store_ref(a->o.st, sh);
	*j = (struct pool_job){.kind = POOL_ENCODE, .id = ++a->next_job, .ahead = batch != NULL,
			       .bsh = bsh, .sh = sh, .base = *base, .hash = sh->hash,
			       .width = width, .size = sh->size};
	pe->job = j;
	pe->batch = batch;
	pe->next = a->serve.pencs;
	a->serve.pencs = pe;
	pool_submit(a->pool, j);
	return pe;
}

/*
 * encode_start() - the delta of @sh against @base (width @width) is not
 * kept: have the codec workers make it (or join the job making it) and
 * answer the request (@ident, @req) then (serve_on_encoded()).  Returns 0,
 * or -errno when the shard goes whole now: this node does not hold the
 * base, or it has another length, or ENCODE_WAIT_MAX requests wait on
 * encodes already (a flood of GETs naming bases cannot queue work and
 * memory without bound), or no memory.
 */
static int encode_start(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
			struct shard *sh, const hwfs_hash_t *base, unsigned width)
{
	struct penc *pe;
	struct deferred *d;
	struct shard *bsh;

	if (a->serve.n_waiting >= ENCODE_WAIT_MAX)
		return -EAGAIN;
	pe = penc_find(a, base, &sh->hash, width);
	d = deferred_new(ident, ident_len, req, &sh->hash, base, width);
	if (!d)
		return -ENOMEM;
	if (!pe) {
		bsh = store_get(a->o.st, base);
		if (!bsh || bsh->size != sh->size ||
		    sh->size * hwfs_tun.delta_max_pct / 100 <= DELTA_HDR) {
			if (bsh)
				store_unref(a->o.st, bsh);
			free(d);
			return -ENOENT;
		}
		pe = encode_submit(a, sh, bsh, base, width, NULL);
		if (!pe) {
			free(d);
			return -ENOMEM;
		}
	} else if (pe->job->ahead) { /* made ahead of demand: a puller waits for it now */
		pool_promote(a->pool, pe->job);
	}
	d->next = pe->waiters;
	pe->waiters = d;
	a->serve.n_waiting++;
	return 0;
}

/*
 * serve_shard() - answer a request for @sh: as a delta against @base (width
 * @width) when one is kept, or encoded for it on the codec workers (the
 * answer then comes from serve_on_encoded()), else whole from byte @pos on:
 * deltas are off, there is no base, this node does not hold the base or it
 * has another length, or the delta is not worth it (remembered).  Drops
 * the caller's reference on @sh.
 */
static void serve_shard(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
			struct shard *sh, const hwfs_hash_t *base, unsigned width, uint64_t pos)
{
	int based = hwfs_tun.delta && !hwfs_hash_is_zero(base);

	if (pos == 0 && based && hwfs_hash_cmp(base, &sh->hash)) {
		struct dentry *e = dcache_find(&a->serve.dcache, base, &sh->hash, width);

		if (e) {
			dcache_touch(&a->serve.dcache, e);
			if (e->enc) {
				send_delta(a, ident, ident_len, req, sh, base, e);
				store_unref(a->o.st, sh);
				return;
			}
		} else if (encode_start(a, ident, ident_len, req, sh, base, width) == 0) {
			store_unref(a->o.st, sh);
			return;
		}
	}
	if (based)
		__atomic_add_fetch(&a->ds.whole, 1, __ATOMIC_RELAXED);
	send_whole(a, ident, ident_len, req, sh, pos);
	store_unref(a->o.st, sh);
}

static void ahead_done(struct agent *a, struct ahead *r, const struct pool_job *j);

void serve_on_encoded(struct agent *a, struct pool_job *j)
{
	struct penc **pp = &a->serve.pencs, *pe;
	struct dentry *e = NULL;

	while (*pp && (*pp)->job != j)
		pp = &(*pp)->next;
	pe = *pp;
	if (pe)
		*pp = pe->next;
	if (j->r == 0) {
		e = dcache_put(&a->serve.dcache, &j->base, &j->hash, j->width, j->enc, j->enc_len);
		j->enc = NULL;
		if (e && j->ahead)
			e->ahead = 1;
	} else if (j->r == -E2BIG) { /* not worth it: remember, do not encode it again */
		dcache_put(&a->serve.dcache, &j->base, &j->hash, j->width, NULL, 0);
	}
	while (pe && pe->waiters) {
		struct deferred *d = pe->waiters;
		struct shard *sh = store_get(a->o.st, &d->hash);

		pe->waiters = d->next;
		a->serve.n_waiting--;
		if (!sh) {
			send_missing(a, d->ident, d->ident_len, d->req, &d->hash, ENOENT);
		} else if (e && e->enc) {
			send_delta(a, d->ident, d->ident_len, d->req, sh, &d->base, e);
		} else {
			__atomic_add_fetch(&a->ds.whole, 1, __ATOMIC_RELAXED);
			send_whole(a, d->ident, d->ident_len, d->req, sh, 0);
		}
		if (sh)
			store_unref(a->o.st, sh);
		free(d);
	}
	if (pe && pe->batch)
		ahead_done(a, pe->batch, j);
	free(pe);
	pool_job_free(a->o.st, j);
}

/* ------------------------------------------------------------ encode ahead */

void serve_note_imported(struct agent *a, const char *name)
{
	char *dup = strdup(name);

	if (!dup)
		return;
	if (a->serve.n_imported == IMPORTED_KEEP) {
		free(a->serve.imported[0]);
		memmove(a->serve.imported, a->serve.imported + 1, (IMPORTED_KEEP - 1) * sizeof(char *));
		a->serve.n_imported--;
	}
	a->serve.imported[a->serve.n_imported++] = dup;
}

static int was_imported(struct agent *a, const char *name)
{
	for (size_t i = 0; i < a->serve.n_imported; i++)
		if (!strcmp(a->serve.imported[i], name))
			return 1;
	return 0;
}

/* delta_base_bytes() callback: a shard to encode ahead, unless it equals its base. */
static void ahead_add(void *arg, const struct hwfs_extent *be, const struct hwfs_extent *e,
		      unsigned width)
{
	struct ahead *r = arg;

	if (hwfs_hash_cmp(&be->hash, &e->hash))
		r->items[r->n++] = (struct ahead_item){be->hash, e->hash, width};
}

void serve_ahead_sealed(struct agent *a, const char *name)
{
	struct hwfs_vrec *v = NULL, *best = NULL;
	struct ahead *r = NULL, **tail;
	uint64_t best_bytes = 0;
	size_t seen = 0, total = 0;
	json_t *vers;

	if (!hwfs_tun.delta || !hwfs_tun.delta_ahead || was_imported(a, name) ||
	    a->o.hooks->snapshot(a->o.arg, name, &v) < 0 || v->state != HWFS_V_SEALED)
		goto out;
	/* the base its receivers will name: the coordinator's pick_base() over what is here */
	vers = a->o.hooks->versions(a->o.arg);
	for (size_t i = json_array_size(vers); i-- > 0 && seen < AHEAD_CANDIDATES;) {
		const char *bn = json_string_value(json_object_get(json_array_get(vers, i), "name"));
		struct hwfs_vrec *b = NULL;
		uint64_t bytes;

		if (!bn || !strcmp(bn, name) || a->o.hooks->snapshot(a->o.arg, bn, &b) < 0)
			continue;
		seen++;
		bytes = delta_base_bytes(v, b, NULL, NULL);
		if (bytes > best_bytes) {
			hwfs_vrec_free(best);
			best = b;
			best_bytes = bytes;
		} else {
			hwfs_vrec_free(b);
		}
	}
	json_decref(vers);
	if (!best)
		goto out;
	for (size_t i = 0; i < v->n_files; i++)
		total += v->files[i].n_ext;
	r = calloc(1, sizeof(*r));
	if (!r || !(r->items = calloc(total ? total : 1, sizeof(*r->items))) ||
	    !(r->name = strdup(name)) || !(r->base_name = strdup(best->name)))
		goto out;
	delta_base_bytes(v, best, ahead_add, r);
	if (!r->n) /* every shard is its base's: nothing to encode */
		goto out;
	r->digest = v->digest;
	for (tail = &a->serve.aheads; *tail; tail = &(*tail)->next_run)
		;
	*tail = r;
	LOG_INFO("agent: %s: encoding %zu delta(s) against %s ahead of demand", name, r->n,
		 best->name);
	r = NULL;
	serve_ahead_pump(a);
out:
	if (r) {
		free(r->items);
		free(r->name);
		free(r->base_name);
		free(r);
	}
	hwfs_vrec_free(best);
	hwfs_vrec_free(v);
}

/* Take run @r off the list and free it (its jobs in flight no longer point to it). */
static void ahead_end(struct agent *a, struct ahead *r)
{
	for (struct ahead **pp = &a->serve.aheads; *pp; pp = &(*pp)->next_run)
		if (*pp == r) {
			*pp = r->next_run;
			break;
		}
	for (struct penc *pe = a->serve.pencs; pe; pe = pe->next)
		if (pe->batch == r)
			pe->batch = NULL;
	free(r->items);
	free(r->name);
	free(r->base_name);
	free(r);
}

/* Is @r's version still here, sealed, with the digest it had? */
static int ahead_alive(struct agent *a, const struct ahead *r)
{
	enum hwfs_vstate state;
	hwfs_hash_t digest;

	return a->o.hooks->lookup(a->o.arg, r->name, &state, &digest) == 0 &&
	       state == HWFS_V_SEALED && !hwfs_hash_cmp(&digest, &r->digest);
}

/* An encode job of run @r finished (@j): count it, feed the workers the next. */
static void ahead_done(struct agent *a, struct ahead *r, const struct pool_job *j)
{
	r->inflight--;
	r->done++;
	if (j->r == 0)
		r->enc_bytes += j->enc_len;
	serve_ahead_pump(a);
}

void serve_ahead_pump(struct agent *a)
{
	size_t inflight = 0, cap = a->pool ? pool_threads(a->pool) : 0;

	for (struct ahead *r = a->serve.aheads; r; r = r->next_run)
		inflight += r->inflight;
	for (struct ahead *r = a->serve.aheads, *next; r; r = next) {
		next = r->next_run;
		if (!ahead_alive(a, r)) { /* removed (or replaced): stop, drop what is queued */
			for (struct penc *pe = a->serve.pencs; pe; pe = pe->next)
				if (pe->batch == r && !pe->waiters)
					__atomic_store_n(&pe->job->cancel, 1, __ATOMIC_RELEASE);
			__atomic_add_fetch(&a->ds.ahead_cancelled, 1, __ATOMIC_RELAXED);
			LOG_INFO("agent: %s went: encoding ahead stopped (%zu of %zu deltas made)",
				 r->name, r->done, r->n);
			inflight -= r->inflight;
			ahead_end(a, r);
			continue;
		}
		while (inflight < cap && r->next < r->n) {
			struct ahead_item *it = &r->items[r->next];
			uint64_t mean = r->done ? r->enc_bytes / r->done : 0;
			struct shard *sh, *bsh;

			if (r->enc_bytes + mean > hwfs_tun.delta_cache_bytes) {
				LOG_INFO("agent: %s: delta_cache_bytes of deltas encoded ahead; the "
					 "other %zu are encoded on demand", r->name, r->n - r->next);
				r->next = r->n;
				break;
			}
			r->next++;
			if (dcache_find(&a->serve.dcache, &it->base, &it->hash, it->width) ||
			    penc_find(a, &it->base, &it->hash, it->width))
				continue; /* kept or being made (a shard used twice) */
			sh = store_get(a->o.st, &it->hash);
			bsh = store_get(a->o.st, &it->base);
			if (!sh || !bsh || bsh->size != sh->size ||
			    sh->size * hwfs_tun.delta_max_pct / 100 <= DELTA_HDR) {
				if (sh)
					store_unref(a->o.st, sh);
				if (bsh)
					store_unref(a->o.st, bsh);
				continue;
			}
			if (encode_submit(a, sh, bsh, &it->base, it->width, r)) {
				r->inflight++;
				inflight++;
			}
			store_unref(a->o.st, sh);
		}
		if (r->next >= r->n && !r->inflight) {
			LOG_INFO("agent: %s: %zu delta(s) against %s encoded ahead of demand", r->name,
				 r->done, r->base_name);
			ahead_end(a, r);
		}
	}
}

/*
 * A fetch ended: requests that waited on its shards get the shard if it
 * arrived, else MISSING, so their pullers move on at once.
 */
void serve_flush_deferred(struct agent *a)
{
	for (struct deferred **pp = &a->serve.deferred; *pp;) {
		struct deferred *d = *pp;
		struct shard *sh;

		if (a->serve.find_want(a, &d->hash, NULL)) {
			pp = &d->next;
			continue;
		}
		sh = d->dmode ? NULL : store_get(a->o.st, &d->hash);
		if (sh) {
			serve_shard(a, d->ident, d->ident_len, d->req, sh, &d->base, d->width, 0);
		} else {
			send_missing(a, d->ident, d->ident_len, d->req, &d->hash, ENOENT);
		}
		*pp = d->next;
		free(d);
	}
}

/* Answer requests that waited for @sh to arrive here (the rest, if forwarded in part). */
void serve_arrived(struct agent *a, struct shard *sh)
{
	for (struct deferred **pp = &a->serve.deferred; *pp;) {
		struct deferred *d = *pp;

		if (hwfs_hash_cmp(&d->hash, &sh->hash)) {
			pp = &d->next;
			continue;
		}
		if (d->dmode) { /* (serve_finish_delta() answers these first) */
			send_missing(a, d->ident, d->ident_len, d->req, &d->hash, EAGAIN);
		} else {
			store_ref(a->o.st, sh);
			serve_shard(a, d->ident, d->ident_len, d->req, sh, &d->base, d->width,
				    d->sent);
		}
		*pp = d->next;
		free(d);
	}
}

/*
 * Cut-through: a piece of @w just arrived; pass what waiting pullers have not
 * had yet straight on, before the whole shard is here and verified (they
 * verify it themselves).  This makes a chain a pipeline of pieces, not of
 * shards.  (A shard arriving as a delta: serve_forward_delta().)
 */
void serve_forward(struct agent *a, struct want *w, const struct proto_msg *pm)
{
	const uint8_t *staged = store_stage_data(a->o.st, w->roff);
	uint64_t pm_pos = pm ? w->got - pm->payload_len : 0;

	for (struct deferred *d = a->serve.deferred; d; d = d->next) {
		if (hwfs_hash_cmp(&d->hash, &w->hash) || d->dmode)
			continue;
		/*
		 * A puller that named a base gets the pieces too: this node gets
		 * the shard whole because its own donor found no delta worth
		 * sending against that same base (the planner gave the chain one
		 * base), so cutting through beats waiting to find that again.
		 */
		memset(&d->base, 0, sizeof(d->base));
		/* caught up to the piece that just came: pass its own frame on, no copy */
		if (pm && d->sent == pm_pos &&
		    send_piece(a, d->ident, d->ident_len, d->req, &w->hash, NULL, pm_pos,
			       pm->payload_len, w->size, NULL, NULL, pm) == 0)
			d->sent = w->got;
		if (d->sent < w->got)
			d->sent = send_range(a, d->ident, d->ident_len, d->req, &w->hash, NULL,
					     d->sent, w->got, w->size, NULL, staged);
	}
}

void serve_forward_delta(struct agent *a, struct want *w)
{
	uint64_t limit;

	if (!w->enc || !w->got)
		return;
	limit = HWFS_MIN(w->got, w->enc_total - 1); /* the last byte waits for the check */
	for (struct deferred *d = a->serve.deferred; d; d = d->next) {
		if (hwfs_hash_cmp(&d->hash, &w->hash))
			continue;
		if (!d->dmode) {
			if (d->sent || !hwfs_tun.delta || hwfs_hash_cmp(&d->base, &w->base) ||
			    d->width != w->width)
				continue; /* another base: answered once the shard is here */
			d->dmode = 1;
		}
		if (d->sent < limit)
			d->sent = send_range(a, d->ident, d->ident_len, d->req, &w->hash, &w->base,
					     d->sent, limit, w->enc_total, NULL, w->enc);
	}
}

void serve_finish_delta(struct agent *a, const hwfs_hash_t *h, uint64_t size, const uint8_t *enc,
			size_t len)
{
	for (struct deferred **pp = &a->serve.deferred; *pp;) {
		struct deferred *d = *pp;

		if (hwfs_hash_cmp(&d->hash, h) || !d->dmode) {
			pp = &d->next;
			continue;
		}
		if (send_range(a, d->ident, d->ident_len, d->req, h, &d->base, d->sent, len, len, NULL,
			       enc) == len) {
			__atomic_add_fetch(&a->ds.sent, 1, __ATOMIC_RELAXED);
			__atomic_add_fetch(&a->ds.forwarded, 1, __ATOMIC_RELAXED);
			__atomic_add_fetch(&a->tx, size, __ATOMIC_RELAXED);
		}
		*pp = d->next;
		free(d);
	}
}

void serve_abort_forwarded(struct agent *a, const hwfs_hash_t *h, int delta_only)
{
	for (struct deferred **pp = &a->serve.deferred; *pp;) {
		struct deferred *d = *pp;

		if (hwfs_hash_cmp(&d->hash, h) || d->sent == 0 || (delta_only && !d->dmode)) {
			pp = &d->next;
			continue;
		}
		send_missing(a, d->ident, d->ident_len, d->req, h, EAGAIN);
		*pp = d->next;
		free(d);
	}
}

/*
 * get_base() - entry @i of a GET's optional "bases" and "widths" (the codec
 * checked that each has one entry per hash): into *@base (zero: none) and
 * *@width (1 when absent).
 */
static void get_base(struct proto_msg *m, size_t i, hwfs_hash_t *base, unsigned *width)
{
	const char *hex = json_string_value(json_array_get(json_object_get(m->h, "bases"), i));
	json_t *w = json_array_get(json_object_get(m->h, "widths"), i);

	memset(base, 0, sizeof(*base));
	if (hex)
		hwfs_hash_parse(hex, base);
	*width = w ? (unsigned)json_integer_value(w) : 1;
}

/* A GET on the serving socket. */
void serve_on_get(struct agent *a, const void *ident, size_t ident_len, struct proto_msg *m)
{
	json_t *hashes = json_object_get(m->h, "hashes"), *hj;
	uint64_t req = proto_int(m, "req");
	size_t i;

	__atomic_add_fetch(&a->serve.req_rx, json_array_size(hashes), __ATOMIC_RELAXED);
	json_array_foreach(hashes, i, hj) {
		hwfs_hash_t h, base;
		unsigned width;
		struct shard *sh;
		struct want *w;

		if (hwfs_hash_parse(json_string_value(hj), &h) < 0)
			continue;
		get_base(m, i, &base, &width);
		sh = store_get(a->o.st, &h);
		if (sh) {
			serve_shard(a, ident, ident_len, req, sh, &base, width, 0);
			continue;
		}
		w = a->serve.find_want(a, &h, NULL);
		if (w) {
			struct deferred *d = deferred_new(ident, ident_len, req, &h, &base, width);

			if (d) {
				d->next = a->serve.deferred;
				a->serve.deferred = d;
				if (w->xs && w->got) /* arriving: pass on what is here */
					serve_forward(a, w, NULL);
				else if (w->enc && w->got) /* its delta arriving, or rebuilding */
					serve_forward_delta(a, w);
				continue;
			}
		}
		send_missing(a, ident, ident_len, req, &h, ENOENT);
	}
}

/*
 * agent_stop(), after the thread ended and the codec workers were freed
 * (with their jobs): forget the requests still waiting (no answer), the
 * encodes they waited on, the encode-ahead runs and the deltas kept.
 */
void serve_free(struct agent *a)
{
	while (a->serve.pencs) {
		struct penc *pe = a->serve.pencs;

		a->serve.pencs = pe->next;
		while (pe->waiters) {
			struct deferred *d = pe->waiters;

			pe->waiters = d->next;
			free(d);
		}
		free(pe);
	}
	a->serve.n_waiting = 0;
	while (a->serve.aheads)
		ahead_end(a, a->serve.aheads);
	for (size_t i = 0; i < a->serve.n_imported; i++)
		free(a->serve.imported[i]);
	a->serve.n_imported = 0;
	while (a->serve.deferred) {
		struct deferred *d = a->serve.deferred;

		a->serve.deferred = d->next;
		free(d);
	}
	while (a->serve.dcache.oldest)
		dcache_evict(&a->serve.dcache);
	free(a->serve.dcache.bucket);
	memset(&a->serve.dcache, 0, sizeof(a->serve.dcache));
}
