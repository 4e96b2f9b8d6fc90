/*
 * daemon_diff.c — `hwfs diff A B --elements`: how far apart two versions are
 * element by element, and what moving A -> B with element-level deltas
 * (fs/common/delta.h, docs/delta.md) would cost.
 *
 * A tensor of B is matched to the tensor of A with the same file path and
 * tensor name, the same dtype and the same byte length: the rule the
 * replicator uses to pick a delta's base.  For a matched tensor the daemon
 * counts the elements (of the codec's width for the dtype, delta_width())
 * that differ, reading both versions' bytes from the arena; an unmatched one
 * (new, or its dtype or length changed) counts every element as changed.
 *
 * "Delta bytes" are what a receiver holding A would be sent, shard by shard,
 * with the replicator's choice of base (delta_base_of(), the rule above, and
 * for shards outside tensors the extent at the same offset with the same
 * length in the file of the same path): nothing for a shard whose hash A has
 * already (anywhere); when it has a base in A, the size of delta_encode()
 * against it at hwfs_tun.delta_level, or the whole shard when the delta would
 * exceed hwfs_tun.delta_max_pct of it; the whole shard otherwise.  The total
 * counts each distinct shard of B once, as the receiver fetches it once.
 *
 * It runs on the calling control connection's thread and can take seconds
 * on a big model: it works from snapshots of the two versions (the namespace
 * lock is held only while they are taken) and holds a store reference on
 * each shard while it reads it, so a version removed meanwhile makes it fail
 * ("a shard left the store") instead of reading freed bytes.  It stops
 * when the daemon shuts down.
 *
 * Anyone who may read both versions may ask, so the work is bounded
 * (struct diffs, docs/security.md): a result is kept per pair of version
 * digests (diff_cache of them, least recently used dropped first), and a
 * request for a pair being computed waits for that computation instead of
 * starting its own; a computation needs a slot of the daemon's diff_threads
 * and its estimated memory (diff_cost()) out of diff_mem_bytes, waiting at
 * most diff_queue_ms for them (then EBUSY; more than all of diff_mem_bytes:
 * ENOMEM at once); and one uid may have at most diff_per_uid computations
 * running or waiting (more: EBUSY at once).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon_i.h"
#include "delta.h"
#include "delta_base.h"
#include "names.h"
#include "tunables.h"

/* A tensor of A, found by (file path, tensor name). */
struct tref {
	const struct hwfs_frec *f;
	const struct hwfs_trec *t;
};

/* One comparison of A and B. */
struct ediff {
	struct daemon *d;
	const struct hwfs_vrec *va, *vb;
	hwfs_hash_t *ha, *hb; /* distinct shard hashes of A and of B, sorted */
	size_t na, nb;
	uint8_t *counted; /* per hb[]: already in the total */
	struct tref *ta;  /* A's tensors sorted by (path, name) */
	size_t nta;
	struct delta_bases *bases; /* A indexed for delta_base_of() */
	struct delta_ctx *cx;
	uint8_t *enc; /* delta_encode()'s output, grown to the largest cap */
	size_t enc_cap;
	/* totals */
	uint64_t elements, changed, bytes, delta_bytes, other_bytes, other_delta;
	uint64_t tensors, tensors_changed;
	char err[512]; /* what failed, when a step returns < 0 */
};

/* qsort/bsearch comparator over hwfs_hash_t. */
static int cmp_hash(const void *a, const void *b)
{
	return hwfs_hash_cmp(a, b);
}

/* The distinct shard hashes of snapshot @v, sorted (daemon_i.h). */
hwfs_hash_t *daemon_vrec_distinct_shards(const struct hwfs_vrec *v, size_t *n)
{
	size_t total = 0, k = 0;
	hwfs_hash_t *h;

	for (size_t i = 0; i < v->n_files; i++)
		total += v->files[i].n_ext;
	h = malloc((total ? total : 1) * sizeof(*h));
	if (!h)
		return NULL;
	for (size_t i = 0; i < v->n_files; i++)
		for (size_t j = 0; j < v->files[i].n_ext; j++)
			h[k++] = v->files[i].ext[j].hash;
	qsort(h, k, sizeof(*h), cmp_hash);
	*n = 0;
	for (size_t i = 0; i < k; i++)
		if (i == 0 || hwfs_hash_cmp(&h[i], &h[*n - 1]))
			h[(*n)++] = h[i];
	return h;
}

/* qsort/bsearch comparator over struct tref: file path, then tensor name. */
static int cmp_tref(const void *a, const void *b)
{
	const struct tref *x = a, *y = b;
	int c = strcmp(x->f->path, y->f->path);

	return c ? c : strcmp(x->t->name, y->t->name);
}

/*
 * The tensor of A in the file of @fb's path with @tb's name, dtype and
 * length (the base the replicator would pick), or NULL.
 */
static const struct tref *match_tensor(const struct ediff *e, const struct hwfs_frec *fb,
				       const struct hwfs_trec *tb)
{
	struct hwfs_frec kf = {.path = fb->path};
	struct hwfs_trec kt = {.name = tb->name};
	struct tref key = {&kf, &kt};
	const struct tref *m = bsearch(&key, e->ta, e->nta, sizeof(*e->ta), cmp_tref);

	if (!m || strcmp(m->t->dtype, tb->dtype) || m->t->len != tb->len)
		return NULL;
	return m;
}

/* Index of the extent of @f that holds file offset @x, or -1 when none does. */
static ssize_t ext_find(const struct hwfs_frec *f, uint64_t x)
{
	size_t lo = 0, hi = f->n_ext;

	while (lo < hi) { /* first extent that starts after x */
		size_t mid = lo + (hi - lo) / 2;

		if (f->ext[mid].off <= x)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0 || x - f->ext[lo - 1].off >= f->ext[lo - 1].len)
		return -1;
	return (ssize_t)(lo - 1);
}

/* The bytes of one tensor, read shard by shard (one store reference held). */
struct span {
	struct store *st;
	const struct hwfs_frec *f;
	uint64_t base;    /* the tensor's offset in the file */
	ssize_t ei;       /* the extent whose shard is held */
	struct shard *sh; /* that shard, referenced; NULL before the first read */
};

/*
 * span_at() - a pointer to the tensor's byte at @pos (*@p) and how many
 * bytes follow it in the same shard (*@avail), taking a reference on that
 * shard and dropping the one held before.  Returns 0, -EIO when no extent
 * covers the byte or the store's shard has another length, -ESTALE when the
 * shard is no longer in the store (its version was removed).
 */
static int span_at(struct span *s, uint64_t pos, const uint8_t **p, uint64_t *avail)
{
	uint64_t x = s->base + pos;
	const struct hwfs_extent *e = s->sh ? &s->f->ext[s->ei] : NULL;

	if (!e || x < e->off || x - e->off >= e->len) {
		ssize_t i = ext_find(s->f, x);
		struct shard *sh;

		if (i < 0)
			return -EIO;
		sh = store_get(s->st, &s->f->ext[i].hash);
		if (!sh)
			return -ESTALE;
		if (sh->size != s->f->ext[i].len) {
			store_unref(s->st, sh);
			return -EIO;
		}
		if (s->sh)
			store_unref(s->st, s->sh);
		s->sh = sh;
		s->ei = i;
		e = &s->f->ext[i];
	}
	*p = store_shard_data(s->st, s->sh) + (x - e->off);
	*avail = e->off + e->len - x;
	return 0;
}

/* Drop the reference @s holds. */
static void span_done(struct span *s)
{
	if (s->sh)
		store_unref(s->st, s->sh);
	s->sh = NULL;
}

/* The daemon is shutting down: stop comparing. */
static int stopping(const struct ediff *e)
{
	return __atomic_load_n(&e->d->stopping, __ATOMIC_ACQUIRE);
}

/*
 * count_changed() - how many elements of width @w differ between tensor
 * @ta of file @fa (A) and @tb of file @fb (B), of equal length, into
 * *@changed.  Runs that are the same bytes of the same shard are skipped; an
 * element cut by a shard boundary is compared byte by byte.  Returns 0, or
 * what span_at() returns, or -ESHUTDOWN.
 */
static int count_changed(struct ediff *e, const struct hwfs_frec *fa, const struct hwfs_trec *ta,
			 const struct hwfs_frec *fb, const struct hwfs_trec *tb, unsigned w,
			 uint64_t *changed)
{
	struct span sa = {e->d->st, fa, ta->off, -1, NULL}, sb = {e->d->st, fb, tb->off, -1, NULL};
	uint64_t pos = 0, len = tb->len, n = 0;
	int r = 0;

	while (pos < len) {
		const uint8_t *pa, *pb;
		uint64_t avail_a, avail_b, run;

		if (stopping(e)) {
			r = -ESHUTDOWN;
			goto out;
		}
		if ((r = span_at(&sa, pos, &pa, &avail_a)) < 0 ||
		    (r = span_at(&sb, pos, &pb, &avail_b)) < 0)
			goto out;
		run = HWFS_MIN(HWFS_MIN(avail_a, avail_b), len - pos);
		if (pos + run < len)
			run -= run % w; /* whole elements; a trailing partial one only at the end */
		if (run) {
			if (pa != pb) /* the same shard at the same place: the same bytes */
				n += delta_count_diff(pa, pb, run, w);
			pos += run;
			continue;
		}
		/* one element across a shard boundary: gather its bytes */
		uint8_t xa[8], xb[8];
		uint64_t el = HWFS_MIN((uint64_t)w, len - pos);

		for (uint64_t i = 0; i < el; i++) {
			if ((r = span_at(&sa, pos + i, &pa, &avail_a)) < 0 ||
			    (r = span_at(&sb, pos + i, &pb, &avail_b)) < 0)
				goto out;
			xa[i] = *pa;
			xb[i] = *pb;
		}
		n += memcmp(xa, xb, el) != 0;
		pos += el;
	}
	*changed = n;
out:
	span_done(&sa);
	span_done(&sb);
	return r;
}

/*
 * encoded_size() - the size of the delta of B's shard @eb against A's shard
 * @ea, both @eb->len bytes, shuffled by @w, into *@cost; the whole shard when
 * the delta would be larger than delta_max_pct of it (as the replicator
 * decides).  Returns 0, -ESTALE (a shard left the store), -EIO, -ENOMEM.
 */
static int encoded_size(struct ediff *e, const struct hwfs_extent *eb,
			const struct hwfs_extent *ea, unsigned w, uint64_t *cost)
{
	struct store *st = e->d->st;
	size_t cap = (size_t)(eb->len * hwfs_tun.delta_max_pct / 100);
	struct shard *sa = NULL, *sb = NULL;
	ssize_t n;
	int r = 0;

	*cost = eb->len;
	if (cap <= DELTA_HDR)
		return 0;
	if (cap > e->enc_cap) {
		uint8_t *nb = realloc(e->enc, cap);

		if (!nb)
			return -ENOMEM;
		e->enc = nb;
		e->enc_cap = cap;
	}
	sa = store_get(st, &ea->hash);
	sb = store_get(st, &eb->hash);
	if (!sa || !sb) {
		r = -ESTALE;
		goto out;
	}
	if (sa->size != eb->len || sb->size != eb->len) {
		r = -EIO;
		goto out;
	}
	n = delta_encode(e->cx, store_shard_data(st, sa), store_shard_data(st, sb), eb->len, w,
			 e->enc, cap);
	if (n >= 0)
		*cost = (uint64_t)n;
	else if (n != -E2BIG)
		r = (int)n;
out:
	if (sa)
		store_unref(st, sa);
	if (sb)
		store_unref(st, sb);
	return r;
}

/*
 * shard_cost() - what a receiver holding A is sent for extent @eb of B, into
 * *@cost: nothing when A has its hash; else encoded_size() against its base
 * @ea in A (shuffled by @w), or the whole shard when it has none (@ea NULL).
 * The first time a hash of B is costed it is also added to the total
 * (e->delta_bytes): the receiver fetches it once.  Returns 1 when it was
 * added there, 0 when not, or what encoded_size() returns.
 */
static int shard_cost(struct ediff *e, const struct hwfs_extent *eb, const struct hwfs_extent *ea,
		      unsigned w, uint64_t *cost)
{
	const hwfs_hash_t *k;
	int r;

	*cost = 0;
	if (bsearch(&eb->hash, e->ha, e->na, sizeof(*e->ha), cmp_hash))
		return 0;
	*cost = eb->len;
	if (ea && (r = encoded_size(e, eb, ea, w, cost)) < 0)
		return r;
	k = bsearch(&eb->hash, e->hb, e->nb, sizeof(*e->hb), cmp_hash);
	if (!k || e->counted[k - e->hb])
		return 0;
	e->counted[k - e->hb] = 1;
	e->delta_bytes += *cost;
	return 1;
}

/* Fraction @n of @total, 0 for an empty total. */
static double fraction(uint64_t n, uint64_t total)
{
	return total ? (double)n / (double)total : 0.0;
}

/*
 * diff_tensor() - compare tensor @tb of B's file @fb with its match in A and
 * append its line to @arr, with @dbytes, what its shards cost.  Returns 0 or
 * -errno.
 */
static int diff_tensor(struct ediff *e, const struct hwfs_frec *fb, const struct hwfs_trec *tb,
		       uint64_t dbytes, json_t *arr)
{
	const struct tref *m = match_tensor(e, fb, tb);
	unsigned w = delta_width(tb->dtype);
	uint64_t elements = tb->len / w + (tb->len % w != 0), changed = elements;
	int r;

	if (m && (r = count_changed(e, m->f, m->t, fb, tb, w, &changed)) < 0)
		return r;
	e->tensors++;
	e->tensors_changed += !m || changed;
	e->elements += elements;
	e->changed += changed;
	json_array_append_new(
		arr, json_pack("{s:s, s:s, s:s, s:I, s:I, s:f, s:I, s:I, s:b}", "file", fb->path,
			       "tensor", tb->name, "dtype", tb->dtype, "elements",
			       (json_int_t)elements, "changed_elements", (json_int_t)changed,
			       "changed_fraction", fraction(changed, elements), "bytes",
			       (json_int_t)tb->len, "delta_bytes", (json_int_t)dbytes, "matched",
			       m != NULL));
	return 0;
}

/* Sentence for error @r of a step that read shards. */
static const char *read_error(int r)
{
	return r == -ESTALE ? "a shard left the store (was a version removed?)"
	       : r == -EIO  ? "its bytes are not where the version says"
			    : strerror(-r);
}

/*
 * diff_file() - cost every shard of B's file @fb (shard_cost() against its
 * base in A, delta_base_of()), adding it to the tensor it lies in or to the
 * bytes outside tensors, then compare each tensor (diff_tensor()).  Returns
 * 0 or -errno with a sentence in e->err.
 */
static int diff_file(struct ediff *e, const struct hwfs_frec *fb, json_t *arr)
{
	uint64_t *dbytes = calloc(fb->n_tensors ? fb->n_tensors : 1, sizeof(*dbytes));
	int r = 0;

	if (!dbytes)
		return -ENOMEM;
	e->bytes += fb->size;
	for (size_t j = 0; j < fb->n_ext; j++) {
		const struct hwfs_extent *x = &fb->ext[j], *base;
		const struct hwfs_trec *t;
		uint64_t cost;
		unsigned w;

		if (stopping(e)) {
			r = -ESHUTDOWN;
			goto out;
		}
		/* the replicator's base and width; the tensor the shard belongs to */
		base = delta_base_of(e->bases, fb, x, &w, NULL);
		t = delta_tensor_at(fb, x->off, x->len);
		r = shard_cost(e, x, base, w, &cost);
		if (r < 0) {
			snprintf(e->err, sizeof(e->err), "%s: bytes %llu..%llu: %s", fb->path,
				 (unsigned long long)x->off, (unsigned long long)(x->off + x->len),
				 read_error(r));
			goto out;
		}
		if (t) {
			dbytes[t - fb->tensors] += cost;
		} else {
			e->other_bytes += x->len;
			e->other_delta += r > 0 ? cost : 0;
		}
	}
	for (size_t i = 0; i < fb->n_tensors; i++)
		if ((r = diff_tensor(e, fb, &fb->tensors[i], dbytes[i], arr)) < 0) {
			snprintf(e->err, sizeof(e->err), "%s: tensor %s: %s", fb->path,
				 fb->tensors[i].name, read_error(r));
			goto out;
		}
	r = 0;
out:
	free(dbytes);
	return r;
}

/* A's tensors indexed by (path, name) into e->ta.  Returns 0 or -ENOMEM. */
static int index_a(struct ediff *e)
{
	size_t n = 0;

	for (size_t i = 0; i < e->va->n_files; i++)
		n += e->va->files[i].n_tensors;
	e->ta = malloc((n ? n : 1) * sizeof(*e->ta));
	if (!e->ta)
		return -ENOMEM;
	for (size_t i = 0; i < e->va->n_files; i++) {
		const struct hwfs_frec *f = &e->va->files[i];

		for (size_t j = 0; j < f->n_tensors; j++)
			e->ta[e->nta++] = (struct tref){f, &f->tensors[j]};
	}
	qsort(e->ta, e->nta, sizeof(*e->ta), cmp_tref);
	return 0;
}

/*
 * count_removed() - how many tensors of A have no tensor of the same file
 * path and name in B, into *@n.  Returns 0 or -ENOMEM.
 */
static int count_removed(const struct ediff *e, uint64_t *n)
{
	struct tref *tb;
	size_t k = 0, nb = 0;

	for (size_t i = 0; i < e->vb->n_files; i++)
		nb += e->vb->files[i].n_tensors;
	tb = malloc((nb ? nb : 1) * sizeof(*tb));
	if (!tb)
		return -ENOMEM;
	for (size_t i = 0; i < e->vb->n_files; i++)
		for (size_t j = 0; j < e->vb->files[i].n_tensors; j++)
			tb[k++] = (struct tref){&e->vb->files[i], &e->vb->files[i].tensors[j]};
	qsort(tb, nb, sizeof(*tb), cmp_tref);
	*n = 0;
	for (size_t i = 0; i < e->nta; i++)
		*n += !bsearch(&e->ta[i], tb, nb, sizeof(*tb), cmp_tref);
	free(tb);
	return 0;
}

/* The reply's "total" object. */
static json_t *total_json(const struct ediff *e, uint64_t removed)
{
	return json_pack("{s:I, s:I, s:f, s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I}", "elements",
			 (json_int_t)e->elements, "changed_elements", (json_int_t)e->changed,
			 "changed_fraction", fraction(e->changed, e->elements), "bytes",
			 (json_int_t)e->bytes, "delta_bytes", (json_int_t)e->delta_bytes,
			 "delta_ratio", fraction(e->delta_bytes, e->bytes), "tensors",
			 (json_int_t)e->tensors, "tensors_changed", (json_int_t)e->tensors_changed,
			 "tensors_identical", (json_int_t)(e->tensors - e->tensors_changed),
			 "tensors_removed", (json_int_t)removed, "other_bytes",
			 (json_int_t)e->other_bytes, "other_delta_bytes",
			 (json_int_t)e->other_delta);
}

/* Sentence for a snapshot that failed with @r. */
static const char *snapshot_error(int r)
{
	return r == -ENOENT ? "no such version" : strerror(-r);
}

/*
 * compare() - compare sealed snapshots @va and @vb: B's tensors into
 * *@tensors and the totals into *@total (new references).  Returns 0 or
 * -errno with a sentence in @err (@errlen bytes).
 */
static int compare(struct daemon *d, const struct hwfs_vrec *va, const struct hwfs_vrec *vb,
		   json_t **tensors, json_t **total, char *err, size_t errlen)
{
	struct ediff e = {.d = d, .va = va, .vb = vb};
	json_t *arr = json_array();
	uint64_t removed;
	int r = -ENOMEM;

	e.ha = daemon_vrec_distinct_shards(va, &e.na);
	e.hb = daemon_vrec_distinct_shards(vb, &e.nb);
	e.counted = calloc(e.nb ? e.nb : 1, 1);
	e.cx = delta_ctx_new((int)hwfs_tun.delta_level);
	if (!e.ha || !e.hb || !e.counted || !e.cx || !arr || index_a(&e) < 0 ||
	    delta_bases_new(va, &e.bases) < 0) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < vb->n_files; i++) {
		if (vb->files[i].kind != HWFS_K_REG)
			continue;
		r = diff_file(&e, &vb->files[i], arr);
		if (r == -ESHUTDOWN)
			snprintf(e.err, sizeof(e.err), "the daemon is shutting down");
		if (r < 0) {
			snprintf(err, errlen, "%s", e.err[0] ? e.err : strerror(-r));
			goto out;
		}
	}
	if ((r = count_removed(&e, &removed)) < 0 || !(*total = total_json(&e, removed))) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	*tensors = arr;
	arr = NULL;
out:
	json_decref(arr);
	delta_bases_free(e.bases);
	delta_ctx_free(e.cx);
	free(e.enc);
	free(e.ta);
	free(e.counted);
	free(e.ha);
	free(e.hb);
	return r;
}

/* ----------------------------------------------------------- limits and results kept */

/* Memory of one tensor's line in a result, and of a delta context (zstd), as estimated. */
#define DIFF_TENSOR_BYTES 1024
#define DIFF_CTX_BYTES (8u << 20)

/* One pair's result, or its computation in progress (struct diffs). */
struct diff_entry {
	hwfs_hash_t a, b;       /* the digests of A and B */
	int running;            /* being computed; tensors and total still NULL */
	json_t *tensors, *total; /* the result */
	uint64_t used;          /* diffs->clock at its last use: the least recent goes first */
	struct diff_entry *next;
};

/* Computations (running or waiting) of one uid. */
struct diff_uid {
	uid_t uid;
	unsigned n;
};

/* Every element diff of the daemon: what runs, what waits, what is kept. */
struct diffs {
	pthread_mutex_t mu;
	pthread_cond_t cv;    /* a computation ended: a slot, memory, a result */
	struct diff_entry *entries;
	size_t n_kept;        /* entries not running */
	uint64_t clock;
	unsigned running;     /* computations holding a slot */
	uint64_t bytes;       /* their estimated memory */
	struct diff_uid *uids; /* uids with computations running or waiting */
	size_t n_uids;
	uint64_t computed;    /* computations started (status diffs.computed) */
};

int daemon_diffs_create(struct diffs **out)
{
	struct diffs *g = calloc(1, sizeof(*g));
	pthread_condattr_t ca;

	if (!g)
		return -ENOMEM;
	pthread_mutex_init(&g->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->cv, &ca);
	pthread_condattr_destroy(&ca);
	*out = g;
	return 0;
}

/* Free @e and its result. */
static void entry_free(struct diff_entry *e)
{
	json_decref(e->tensors);
	json_decref(e->total);
	free(e);
}

void daemon_diffs_destroy(struct diffs *g)
{
	if (!g)
		return;
	while (g->entries) {
		struct diff_entry *e = g->entries;

		g->entries = e->next;
		entry_free(e);
	}
	free(g->uids);
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	free(g);
}

uint64_t daemon_diffs_computed(struct diffs *g)
{
	uint64_t n;

	pthread_mutex_lock(&g->mu);
	n = g->computed;
	pthread_mutex_unlock(&g->mu);
	return n;
}

/* The computations of @uid counted in @g (mu held), or NULL. */
static struct diff_uid *uid_slot(struct diffs *g, uid_t uid)
{
	for (size_t i = 0; i < g->n_uids; i++)
		if (g->uids[i].uid == uid)
			return &g->uids[i];
	return NULL;
}

/* Count one computation less for @uid (mu held). */
static void uid_put(struct diffs *g, uid_t uid)
{
	struct diff_uid *u = uid_slot(g, uid);

	if (u && --u->n == 0)
		*u = g->uids[--g->n_uids];
}

/*
 * diff_cost() - the memory one comparison of @va and @vb takes, as
 * estimated: a delta of B's largest shard (its input copy and its output,
 * up to delta_max_pct of it), a delta context, and one line per tensor of B
 * with the tables of both versions' shards.
 */
static uint64_t diff_cost(const struct hwfs_vrec *va, const struct hwfs_vrec *vb)
{
	uint64_t big = 0, lines = 0;

	for (size_t i = 0; i < vb->n_files; i++) {
		lines += vb->files[i].n_tensors + vb->files[i].n_ext;
		for (size_t j = 0; j < vb->files[i].n_ext; j++)
			big = HWFS_MAX(big, vb->files[i].ext[j].len);
	}
	for (size_t i = 0; i < va->n_files; i++)
		lines += va->files[i].n_tensors + va->files[i].n_ext;
	return big + big * hwfs_tun.delta_max_pct / 100 + DIFF_CTX_BYTES +
	       lines * DIFF_TENSOR_BYTES;
}

/* @t plus @ms milliseconds. */
static struct timespec ts_after(struct timespec t, uint64_t ms)
{
	t.tv_sec += (time_t)(ms / 1000);
	t.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

/* Is @a at or after @b? */
static int ts_reached(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec > b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec >= b->tv_nsec);
}

/*
 * Wait on g->cv (mu held) until woken, 200 ms pass or @until (NULL: no
 * limit), so that a waiter sees shutdown.  Returns -ESHUTDOWN when the
 * daemon stops, -ETIMEDOUT once @until passed, else 0.
 */
static int diffs_wait(struct daemon *d, const struct timespec *until)
{
	struct diffs *g = d->diffs;
	struct timespec now, t;

	if (__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE))
		return -ESHUTDOWN;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (until && ts_reached(&now, until))
		return -ETIMEDOUT;
	t = ts_after(now, 200);
	if (until && ts_reached(&t, until))
		t = *until;
	pthread_cond_timedwait(&g->cv, &g->mu, &t);
	return 0;
}

/*
 * diffs_acquire() - a slot and @bytes of the memory budget for a
 * computation by @uid.  Returns 0, -ENOMEM (@bytes is more than the whole
 * budget), -EBUSY (@uid has diff_per_uid computations running or waiting, or
 * nothing freed up within diff_queue_ms) or -ESHUTDOWN.
 */
static int diffs_acquire(struct daemon *d, uid_t uid, uint64_t bytes)
{
	struct diffs *g = d->diffs;
	struct diff_uid *u;
	struct timespec until;
	int r = 0;

	if (bytes > hwfs_tun.diff_mem_bytes)
		return -ENOMEM;
	pthread_mutex_lock(&g->mu);
	u = uid_slot(g, uid);
	if (u && u->n >= hwfs_tun.diff_per_uid) {
		pthread_mutex_unlock(&g->mu);
		return -EBUSY;
	}
	if (!u) {
		struct diff_uid *nu = realloc(g->uids, (g->n_uids + 1) * sizeof(*nu));

		if (!nu) {
			pthread_mutex_unlock(&g->mu);
			return -ENOMEM;
		}
		g->uids = nu;
		u = &g->uids[g->n_uids++];
		*u = (struct diff_uid){uid, 0};
	}
	u->n++;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until = ts_after(until, hwfs_tun.diff_queue_ms);
	while (g->running >= hwfs_tun.diff_threads || g->bytes + bytes > hwfs_tun.diff_mem_bytes)
		if ((r = diffs_wait(d, &until)) < 0)
			break;
	if (r == 0) {
		g->running++;
		g->bytes += bytes;
		g->computed++;
	} else {
		uid_put(g, uid);
	}
	pthread_mutex_unlock(&g->mu);
	return r == -ETIMEDOUT ? -EBUSY : r;
}

/* Give back what diffs_acquire() gave @uid. */
static void diffs_release(struct daemon *d, uid_t uid, uint64_t bytes)
{
	struct diffs *g = d->diffs;

	pthread_mutex_lock(&g->mu);
	g->running--;
	g->bytes -= bytes;
	uid_put(g, uid);
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* The entry of digests (@a, @b) (mu held), or NULL. */
static struct diff_entry *entry_find(struct diffs *g, const hwfs_hash_t *a, const hwfs_hash_t *b)
{
	for (struct diff_entry *e = g->entries; e; e = e->next)
		if (!hwfs_hash_cmp(&e->a, a) && !hwfs_hash_cmp(&e->b, b))
			return e;
	return NULL;
}

/* Take @e off the list (mu held); it is not freed. */
static void entry_unlink(struct diffs *g, struct diff_entry *e)
{
	for (struct diff_entry **p = &g->entries; *p; p = &(*p)->next)
		if (*p == e) {
			*p = e->next;
			return;
		}
}

/*
 * diffs_lookup() - the result for digests (@a, @b) into *@tensors and
 * *@total (copies of the kept one: jansson's reference counts are not safe
 * to share between threads), waiting while another request computes it.
 * Returns 1 (found), 0 (not kept and not being computed: an entry is now
 * marked running for the caller, who computes and calls diffs_done()) or
 * -ESHUTDOWN, -ENOMEM.
 */
static int diffs_lookup(struct daemon *d, const hwfs_hash_t *a, const hwfs_hash_t *b,
			json_t **tensors, json_t **total)
{
	struct diffs *g = d->diffs;
	struct diff_entry *e;
	int r = 0;

	pthread_mutex_lock(&g->mu);
	while ((e = entry_find(g, a, b)) && e->running)
		if ((r = diffs_wait(d, NULL)) < 0)
			goto out;
	if (e) {
		e->used = ++g->clock;
		*tensors = json_deep_copy(e->tensors);
		*total = json_deep_copy(e->total);
		r = *tensors && *total ? 1 : -ENOMEM;
	} else if (!(e = calloc(1, sizeof(*e)))) {
		r = -ENOMEM;
	} else {
		*e = (struct diff_entry){.a = *a, .b = *b, .running = 1, .next = g->entries};
		g->entries = e;
	}
out:
	pthread_mutex_unlock(&g->mu);
	return r;
}

/*
 * diffs_done() - end the computation diffs_lookup() marked running for
 * (@a, @b): keep copies of @tensors and @total (NULL: it failed and
 * nothing is kept, a waiting request computes again; so without memory for
 * the copies), dropping the least
 * recently used results beyond diff_cache, and wake the waiting requests.
 */
static void diffs_done(struct daemon *d, const hwfs_hash_t *a, const hwfs_hash_t *b,
		       json_t *tensors, json_t *total)
{
	struct diffs *g = d->diffs;
	struct diff_entry *e;

	pthread_mutex_lock(&g->mu);
	e = entry_find(g, a, b);
	if (e && tensors && total) {
		e->tensors = json_deep_copy(tensors);
		e->total = json_deep_copy(total);
	}
	if (e && e->tensors && e->total) {
		e->running = 0;
		e->used = ++g->clock;
		g->n_kept++;
	} else if (e) { /* failed, or no memory to keep it */
		entry_unlink(g, e);
		entry_free(e);
	}
	while (g->n_kept > hwfs_tun.diff_cache) {
		struct diff_entry *old = NULL;

		for (struct diff_entry *x = g->entries; x; x = x->next)
			if (!x->running && (!old || x->used < old->used))
				old = x;
		entry_unlink(g, old);
		entry_free(old);
		g->n_kept--;
	}
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/*
 * compute_limited() - compare @va and @vb for @peer within the limits
 * (diffs_acquire()), into *@tensors and *@total.  Returns 0 or -errno with
 * a sentence in @err.
 */
static int compute_limited(struct daemon *d, const struct ctl_peer *peer,
			   const struct hwfs_vrec *va, const struct hwfs_vrec *vb,
			   json_t **tensors, json_t **total, char *err, size_t errlen)
{
	uint64_t cost = diff_cost(va, vb);
	char need[32], all[32];
	int r = diffs_acquire(d, peer->uid, cost);

	if (r == -ENOMEM) {
		snprintf(err, errlen, "it needs about %s of memory, more than diff_mem_bytes "
			 "(%s) allows", hwfs_fmt_size(cost, need, sizeof(need)),
			 hwfs_fmt_size(hwfs_tun.diff_mem_bytes, all, sizeof(all)));
		return r;
	}
	if (r == -EBUSY) {
		snprintf(err, errlen, "busy: too many element diffs are running (diff_per_uid %llu "
			 "per user, diff_threads %llu in all); try again later",
			 (unsigned long long)hwfs_tun.diff_per_uid,
			 (unsigned long long)hwfs_tun.diff_threads);
		return r;
	}
	if (r < 0) {
		snprintf(err, errlen, "%s", r == -ESHUTDOWN ? "the daemon is shutting down"
							    : strerror(-r));
		return r;
	}
	r = compare(d, va, vb, tensors, total, err, errlen);
	diffs_release(d, peer->uid, cost);
	return r;
}

/*
 * op_diff_elements() - the reply to {"op": "diff", "a", "b", "elements": true}:
 * {"a", "b", "tensors": [one object per tensor of B], "total": {...}}
 * (docs/cli.md).  Refuses a version that does not exist or is open (its
 * tensors are known once it is sealed).  Errors are replies, with "errno".
 */
json_t *op_diff_elements(struct daemon *d, json_t *req, struct ctl_reader *rd,
			 const struct ctl_peer *peer)
{
	const char *a = daemon_req_str(req, "a"), *b = daemon_req_str(req, "b");
	struct hwfs_vrec *va = NULL, *vb = NULL;
	json_t *tensors = NULL, *total = NULL, *res = NULL;
	char err[640] = "";
	int r;

	if (!a || !b)
		return daemon_err_reply(EINVAL, "diff: two versions needed");
	if ((r = ns_snapshot(d->ns, a, &va)) < 0) {
		res = daemon_err_reply(-r, "cannot diff: %s: %s", a, snapshot_error(r));
		goto out;
	}
	if ((r = ns_snapshot(d->ns, b, &vb)) < 0) {
		res = daemon_err_reply(-r, "cannot diff: %s: %s", b, snapshot_error(r));
		goto out;
	}
	if (va->state == HWFS_V_OPEN || vb->state == HWFS_V_OPEN) {
		res = daemon_err_reply(EBUSY, "cannot diff --elements: %s is open (its tensors are "
				"known once it is sealed)", va->state == HWFS_V_OPEN ? a : b);
		goto out;
	}
	r = diffs_lookup(d, &va->digest, &vb->digest, &tensors, &total);
	if (r == 0) {
		r = compute_limited(d, peer, va, vb, &tensors, &total, err, sizeof(err));
		diffs_done(d, &va->digest, &vb->digest, r < 0 ? NULL : tensors,
			   r < 0 ? NULL : total);
	} else if (r < 0) {
		snprintf(err, sizeof(err), "%s", r == -ESHUTDOWN ? "the daemon is shutting down"
								 : strerror(-r));
	}
	if (r < 0)
		res = daemon_err_reply(-r, "cannot diff %s %s: %s", a, b, err);
	else
		res = json_pack("{s:b, s:s, s:s, s:O, s:O}", "ok", 1, "a", a, "b", b, "tensors",
				tensors, "total", total);
out:
	json_decref(tensors);
	json_decref(total);
	hwfs_vrec_free(va);
	hwfs_vrec_free(vb);
	return res;
}
