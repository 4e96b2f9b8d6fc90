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
 * encodes.  Runs on the agent thread only.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "agent_i.h"

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
 * zero copy (the piece holds a reference on the shard); else @data is copied
 * (a shard still arriving here, forwarded before it is complete, or a delta).
 */
static int send_piece(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
		      const hwfs_hash_t *hash, const hwfs_hash_t *base, uint64_t pos, uint64_t len,
		      uint64_t total, struct shard *sh, const void *data)
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
	if (zmq_send(a->serve, ident, ident_len, ZMQ_SNDMORE) < 0 ||
	    zmq_send(a->serve, hdr, hlen, ZMQ_SNDMORE) < 0) {
		r = -errno;
		goto out;
	}
	if (sh) {
		ref = malloc(sizeof(*ref));
		if (!ref || zmq_msg_init_data(&m, (void *)(store_shard_data(a->o.st, sh) + pos), len,
					      sent_free, ref) < 0) {
			free(ref);
			zmq_send(a->serve, "", 0, 0); /* end the message: the receiver drops it */
			goto out;
		}
		store_ref(a->o.st, sh);
		*ref = (struct sent_ref){a->o.st, sh};
		if (zmq_msg_send(&m, a->serve, 0) < 0) {
			r = -errno;
			zmq_msg_close(&m);
			goto out;
		}
	} else if (zmq_send(a->serve, data, len, 0) < 0) {
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

/* Tell the puller @ident that this node does not have (any more) shard @h. */
static void send_missing(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
			 const hwfs_hash_t *h)
{
	json_t *mf = json_pack("{s:I, s:o}", "req", (json_int_t)req, "hash", hwfs_hash_json(h));

	proto_send(a->serve, ident, ident_len, P_MISSING, mf, NULL, 0);
	json_decref(mf);
}

/* Send shard @sh from byte @pos on, in pieces, whole. */
static void send_whole(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
		       struct shard *sh, uint64_t pos)
{
	while (pos < sh->size) {
		uint64_t len = HWFS_MIN(hwfs_tun.piece_bytes, sh->size - pos);

		if (send_piece(a, ident, ident_len, req, &sh->hash, NULL, pos, len, sh->size, sh,
			       NULL) < 0)
			break;
		pos += len;
	}
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
	dcache_put(&a->dcache, base, hash, width, enc, len);
}

/*
 * few_changed() - a cheap look before encoding: do at most half the elements
 * of DELTA_PROBES evenly spaced windows of DELTA_PROBE_BYTES differ between
 * @base and @new_ (@len bytes, elements of @width)?  Most do in a
 * fine-tuning step or an unrelated tensor, whose delta would not be worth
 * sending: those are sent whole without spending the encoding on them.
 */
static int few_changed(const uint8_t *base, const uint8_t *new_, uint64_t len, unsigned width)
{
	uint64_t step = len / DELTA_PROBES, seen = 0, changed = 0;

	if (len <= DELTA_PROBES * DELTA_PROBE_BYTES)
		return 1; /* small: encoding it costs no more than looking */
	for (uint64_t off = 0; off + DELTA_PROBE_BYTES <= len; off += step) {
		uint64_t at = off - off % width;

		changed += delta_count_diff(base + at, new_ + at, DELTA_PROBE_BYTES, width);
		seen += DELTA_PROBE_BYTES / width;
	}
	return changed * 2 <= seen;
}

/*
 * delta_for() - the delta to send for @sh to a puller holding @base (width
 * @width): the one kept, or encoded now and kept.  NULL: send it whole —
 * deltas are off, there is no base, this node does not hold the base or it
 * has another length, or the delta would be larger than delta_max_pct of
 * the shard, or few_changed() says it would be (remembered either way, so
 * it is not looked at again).
 */
static struct dentry *delta_for(struct agent *a, struct shard *sh, const hwfs_hash_t *base,
				unsigned width)
{
	uint64_t cap = sh->size * hwfs_tun.delta_max_pct / 100, t0;
	struct dentry *e;
	struct shard *bsh;
	uint8_t *buf;
	ssize_t n;

	if (!hwfs_tun.delta || hwfs_hash_is_zero(base) || !hwfs_hash_cmp(base, &sh->hash))
		return NULL;
	e = dcache_find(&a->dcache, base, &sh->hash, width);
	if (e) {
		dcache_touch(&a->dcache, e);
		return e->enc ? e : NULL;
	}
	bsh = store_get(a->o.st, base);
	if (!bsh)
		return NULL;
	if (bsh->size != sh->size || cap <= DELTA_HDR) {
		store_unref(a->o.st, bsh);
		return NULL;
	}
	if (!few_changed(store_shard_data(a->o.st, bsh), store_shard_data(a->o.st, sh), sh->size, width)) {
		store_unref(a->o.st, bsh);
		dcache_put(&a->dcache, base, &sh->hash, width, NULL, 0);
		return NULL;
	}
	if (!(buf = malloc(cap))) {
		store_unref(a->o.st, bsh);
		return NULL;
	}
	t0 = delta_cpu_ns();
	n = delta_encode(a->dcx, store_shard_data(a->o.st, bsh), store_shard_data(a->o.st, sh), sh->size,
			 width, buf, cap);
	__atomic_add_fetch(&a->ds.encode_ns, delta_cpu_ns() - t0, __ATOMIC_RELAXED);
	__atomic_add_fetch(&a->ds.encoded, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&a->ds.encode_bytes, sh->size, __ATOMIC_RELAXED);
	store_unref(a->o.st, bsh);
	if (n < 0) {
		free(buf);
		if (n == -E2BIG) /* not worth it: remember, do not encode it again */
			dcache_put(&a->dcache, base, &sh->hash, width, NULL, 0);
		return NULL;
	}
	e = dcache_put(&a->dcache, base, &sh->hash, width, realloc(buf, (size_t)n) ?: buf,
		       (size_t)n);
	return e && e->enc ? e : NULL;
}

/*
 * serve_shard() - answer a request for @sh: as a delta against @base (width
 * @width) when delta_for() has one, else whole from byte @pos on.  Drops
 * the caller's reference on @sh.
 */
static void serve_shard(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
			struct shard *sh, const hwfs_hash_t *base, unsigned width, uint64_t pos)
{
	struct dentry *e = pos == 0 ? delta_for(a, sh, base, width) : NULL;

	if (e) {
		uint64_t off = 0;

		while (off < e->len) {
			uint64_t len = HWFS_MIN(hwfs_tun.piece_bytes, e->len - off);

			if (send_piece(a, ident, ident_len, req, &sh->hash, base, off, len, e->len,
				       NULL, e->enc + off) < 0)
				break;
			off += len;
		}
		if (off == e->len) { /* all of it went */
			__atomic_add_fetch(&a->ds.sent, 1, __ATOMIC_RELAXED);
			__atomic_add_fetch(&a->tx, sh->size, __ATOMIC_RELAXED);
		}
	} else {
		if (!hwfs_hash_is_zero(base) && hwfs_tun.delta)
			__atomic_add_fetch(&a->ds.whole, 1, __ATOMIC_RELAXED);
		send_whole(a, ident, ident_len, req, sh, pos);
	}
	store_unref(a->o.st, sh);
}

/*
 * A fetch ended: requests that waited on its shards get the shard if it
 * arrived, else MISSING, so their pullers move on at once.
 */
void serve_flush_deferred(struct agent *a)
{
	for (struct deferred **pp = &a->deferred; *pp;) {
		struct deferred *d = *pp;
		struct shard *sh;

		if (pull_find_want(a, &d->hash, NULL)) {
			pp = &d->next;
			continue;
		}
		sh = store_get(a->o.st, &d->hash);
		if (sh) {
			serve_shard(a, d->ident, d->ident_len, d->req, sh, &d->base, d->width, 0);
		} else {
			send_missing(a, d->ident, d->ident_len, d->req, &d->hash);
		}
		*pp = d->next;
		free(d);
	}
}

/* Answer requests that waited for @sh to arrive here (the rest, if forwarded in part). */
void serve_arrived(struct agent *a, struct shard *sh)
{
	for (struct deferred **pp = &a->deferred; *pp;) {
		struct deferred *d = *pp;

		if (hwfs_hash_cmp(&d->hash, &sh->hash)) {
			pp = &d->next;
			continue;
		}
		store_ref(a->o.st, sh);
		serve_shard(a, d->ident, d->ident_len, d->req, sh, &d->base, d->width, d->sent);
		*pp = d->next;
		free(d);
	}
}

/*
 * Cut-through: a piece of @w just arrived; pass what waiting pullers have not
 * had yet straight on, before the whole shard is here and verified (they
 * verify it themselves).  This makes a chain a pipeline of pieces, not of
 * shards.  (Only a shard arriving whole is cut through; one arriving as a
 * delta is sent on as that delta once it is rebuilt.)
 */
void serve_forward(struct agent *a, struct want *w)
{
	const uint8_t *staged = store_stage_data(a->o.st, w->roff);

	for (struct deferred *d = a->deferred; d; d = d->next) {
		if (hwfs_hash_cmp(&d->hash, &w->hash))
			continue;
		/*
		 * A puller that named a base gets the pieces too: this node gets
		 * the shard whole because its own donor found no delta worth
		 * sending against that same base (the planner gave the chain one
		 * base), so cutting through beats waiting to find that again.
		 */
		memset(&d->base, 0, sizeof(d->base));
		while (d->sent < w->got) {
			uint64_t len = HWFS_MIN(hwfs_tun.piece_bytes, w->got - d->sent);

			if (send_piece(a, d->ident, d->ident_len, d->req, &w->hash, NULL, d->sent,
				       len, w->size, NULL, staged + d->sent) < 0)
				break;
			d->sent += len;
		}
	}
}

/* A shard that was forwarded in part turned out bad: those pullers must start over. */
void serve_abort_forwarded(struct agent *a, const hwfs_hash_t *h)
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

	__atomic_add_fetch(&a->req_rx, json_array_size(hashes), __ATOMIC_RELAXED);
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
		w = pull_find_want(a, &h, NULL);
		if (w && ident_len <= sizeof(((struct deferred *)0)->ident)) {
			struct deferred *d = calloc(1, sizeof(*d));

			if (d) {
				memcpy(d->ident, ident, ident_len);
				d->ident_len = ident_len;
				d->req = req;
				d->hash = h;
				d->base = base;
				d->width = width;
				d->next = a->deferred;
				a->deferred = d;
				if (w->xs && w->got) /* arriving: pass on what is here */
					serve_forward(a, w);
				continue;
			}
		}
		send_missing(a, ident, ident_len, req, &h);
	}
}

/* agent_stop(), after the thread ended: forget the requests still waiting (no answer). */
void serve_free(struct agent *a)
{
	while (a->deferred) {
		struct deferred *d = a->deferred;

		a->deferred = d->next;
		free(d);
	}
	while (a->dcache.oldest)
		dcache_evict(&a->dcache);
	free(a->dcache.bucket);
	memset(&a->dcache, 0, sizeof(a->dcache));
}
