/*
 * devload.c — device shadow-load: the bucket plan, the table of loads and
 * the multi-stream copy with IPC export (see devload.h and docs/gpu.md).
 *
 * A load is one entry of the table, made "loading" by devloads_begin() under
 * the table's mutex, then filled by devloads_run() on its caller's thread
 * with the mutex released (the copy may take seconds), and published
 * "loaded" (or "failed") under the mutex again.  While loading, only the
 * thread that began it touches its buckets; nobody can unload or replace it.
 * Once loaded, its buckets and layout are read-only until it is freed, which
 * happens only when it was unloaded and no gpumap reference remains.
 *
 * CUDA is reached only through gpu/cudart.h.  Every call is checked; an
 * error frees everything the load allocated (streams synchronised first, so
 * no copy is in flight into freed memory).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudart.h"
#include "devload.h"

/* ------------------------------------------------------------------ plan */

/* @x rounded up to DEVLOAD_ALIGN; UINT64_MAX when that overflows. */
static uint64_t align_up(uint64_t x)
{
	if (x > UINT64_MAX - (DEVLOAD_ALIGN - 1))
		return UINT64_MAX;
	return (x + DEVLOAD_ALIGN - 1) & ~(uint64_t)(DEVLOAD_ALIGN - 1);
}

/* @pct% of @x (pct <= 100) without overflowing. */
static uint64_t pct_of(uint64_t x, unsigned pct)
{
	return x / 100 * pct + x % 100 * pct / 100;
}

void devload_plan_free(struct devload_plan *p)
{
	free(p->bucket_bytes);
	free(p->bucket_stream);
	free(p->t_bucket);
	free(p->t_offset);
	p->bucket_bytes = NULL;
	p->bucket_stream = NULL;
	p->t_bucket = NULL;
	p->t_offset = NULL;
	p->n_buckets = 0;
}

/*
 * The plan (see devload.h).  One pass: @cur is the open bucket (-1: none
 * yet), @cursor the end of its last tensor.  A tensor with bytes opens a new
 * bucket when there is none or when it would pass the bucket size in a
 * bucket that holds bytes already; so a tensor larger than the size lands at
 * offset 0 of a fresh bucket, and the next one (cursor > size) opens
 * another.  Sums are checked: lengths near 2^64 give -EOVERFLOW, not a wrap.
 */
int devload_plan(const uint64_t *lens, size_t n, uint64_t free_bytes, unsigned pct, int streams,
		 uint64_t max_bucket, struct devload_plan *out)
{
	struct devload_plan p = {0};
	uint64_t cap, cursor = 0, need = 0;
	long cur = -1;
	int r = -ENOMEM;

	memset(out, 0, sizeof(*out));
	if (pct < 1 || pct > 100 || streams < 1 || max_bucket == 0)
		return -EINVAL;
	p.allowed = pct_of(free_bytes, pct);
	cap = HWFS_MAX(p.allowed / 64, DEVLOAD_MIN_BUCKET);
	cap = HWFS_MIN(cap, max_bucket);
	p.bucket_cap = cap;
	/* at most one bucket per tensor (and one for a version of empty tensors) */
	p.bucket_bytes = calloc(n ? n : 1, sizeof(*p.bucket_bytes));
	p.t_bucket = calloc(n ? n : 1, sizeof(*p.t_bucket));
	p.t_offset = calloc(n ? n : 1, sizeof(*p.t_offset));
	if (!p.bucket_bytes || !p.t_bucket || !p.t_offset)
		goto fail;
	for (size_t i = 0; i < n; i++) {
		uint64_t off = align_up(cursor), end;

		if (lens[i] == 0)
			continue; /* placed below: bucket 0, offset 0; takes no room */
		if (cur < 0 || (cursor > 0 && (off == UINT64_MAX || lens[i] > cap ||
					       off > cap - lens[i]))) {
			cur++;
			cursor = 0;
			off = 0;
		}
		if (off == UINT64_MAX || __builtin_add_overflow(off, lens[i], &end)) {
			r = -EOVERFLOW;
			goto fail;
		}
		p.t_bucket[i] = (int)cur;
		p.t_offset[i] = off;
		cursor = end;
		p.bucket_bytes[cur] = HWFS_MAX(p.bucket_bytes[cur], end);
	}
	p.n_buckets = (size_t)(cur + 1);
	if (p.n_buckets == 0) { /* no bytes at all: one minimal bucket, so every index is valid */
		p.n_buckets = 1;
		p.bucket_bytes[0] = DEVLOAD_ALIGN;
	}
	/* every empty tensor sits at the start of the first bucket */
	for (size_t i = 0; i < n; i++)
		if (lens[i] == 0) {
			p.t_bucket[i] = 0;
			p.t_offset[i] = 0;
		}
	for (size_t b = 0; b < p.n_buckets; b++)
		if (__builtin_add_overflow(need, p.bucket_bytes[b], &need)) {
			r = -EOVERFLOW;
			goto fail;
		}
	p.need = need;
	if (need > p.allowed) {
		out->need = need;
		out->allowed = p.allowed;
		out->bucket_cap = cap;
		devload_plan_free(&p);
		return -ENOMEM;
	}
	p.bucket_stream = calloc(p.n_buckets ? p.n_buckets : 1, sizeof(*p.bucket_stream));
	if (!p.bucket_stream)
		goto fail;
	for (size_t b = 0; b < p.n_buckets; b++)
		p.bucket_stream[b] = (int)(b % (size_t)streams);
	*out = p;
	return 0;
fail:
	devload_plan_free(&p);
	if (r == -EOVERFLOW) {
		out->need = UINT64_MAX;
		out->allowed = pct_of(free_bytes, pct);
	}
	return r;
}

/* ------------------------------------------------------------------ pieces */

/* The pieces of a tensor (see devload.h): bounded by @cap, whatever the manifest says. */
int devload_tensor_pieces(const struct hwfs_frec *f, const uint64_t *ext_at,
			  const struct hwfs_trec *t, size_t *e0, struct devload_piece *pieces,
			  size_t cap, size_t *np)
{
	uint64_t at = t->off, end;

	if (__builtin_add_overflow(t->off, t->len, &end) || end > f->size)
		return -EIO;
	while (*e0 < f->n_ext && f->ext[*e0].off + f->ext[*e0].len <= t->off)
		(*e0)++;
	for (size_t i = *e0; i < f->n_ext && at < end; i++) {
		const struct hwfs_extent *e = &f->ext[i];
		uint64_t e_end = e->off + e->len, take;

		if (at < e->off || at >= e_end)
			return -EIO; /* a hole: extents must cover the file */
		if (*np >= cap)
			return -E2BIG; /* overlapping tensors: more pieces than room */
		take = HWFS_MIN(e_end, end) - at;
		pieces[(*np)++] = (struct devload_piece){ext_at[i] + (at - e->off), take};
		at += take;
	}
	return at == end ? 0 : -EIO;
}

/* ------------------------------------------------------------------ table */

enum dl_state { DL_LOADING, DL_LOADED, DL_FAILED };
static const char *const dl_state_names[] = {"loading", "loaded", "failed"};

struct dl_bucket {
	void *ptr; /* device memory (NULL: not allocated) */
	uint64_t bytes;
	cudart_ipc_handle handle;
};

struct devload {
	char *version;
	uint64_t seq; /* the version's seq on this node: a name used again is another version */
	int gpu;
	enum dl_state state;
	char reason[DEVLOAD_REASON_MAX];
	uint64_t failed_ns; /* when it failed (CLOCK_MONOTONIC ns): is it news to a barrier? */
	struct dl_bucket *b;
	size_t nb;
	json_t *tensors; /* gpumap's layout (with bucket and offset), once loaded */
	hwfs_hash_t digest;
	uint64_t bytes;   /* tensor bytes copied */
	size_t n_tensors;
	double seconds;
	int pinned;
	int removed;   /* `hwfs rm` removed the version; the copy stays until unloaded */
	int autoload;  /* made by the commit barrier: unloaded when `current` moves on */
	int unloading; /* unloaded while mapped: freed at the last unmap, invisible to lookups */
	unsigned refs; /* gpumap connections */
	struct devload *next;
};

struct devloads {
	struct cudart *rt;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* a load finished, a worker left */
	struct devload *loads;
	unsigned workers;
	int stop;
};

int devloads_create(struct cudart *rt, struct devloads **out)
{
	struct devloads *dl = calloc(1, sizeof(*dl));

	if (!dl)
		return -ENOMEM;
	dl->rt = rt;
	pthread_mutex_init(&dl->mu, NULL);
	pthread_cond_init(&dl->cv, NULL);
	*out = dl;
	return 0;
}

/* Free the device memory of @l's buckets (on this thread: SetDevice first). */
static void buckets_free(struct cudart *rt, struct devload *l)
{
	int set = 0;

	for (size_t i = 0; i < l->nb; i++) {
		if (!l->b[i].ptr)
			continue;
		if (!set) {
			rt->SetDevice(l->gpu);
			set = 1;
		}
		if (rt->Free(l->b[i].ptr) != CUDART_SUCCESS)
			LOG_WARN("gpu: cudaFree of a bucket of %s on GPU %d failed", l->version,
				 l->gpu);
		l->b[i].ptr = NULL;
	}
	free(l->b);
	l->b = NULL;
	l->nb = 0;
}

/* Free @l (on no list) and its device memory. */
static void load_free(struct devloads *dl, struct devload *l)
{
	if (l->nb)
		buckets_free(dl->rt, l);
	json_decref(l->tensors);
	free(l->version);
	free(l);
}

/* Take @l off the table (dl->mu held). */
static void unlink_load(struct devloads *dl, struct devload *l)
{
	for (struct devload **pp = &dl->loads; *pp; pp = &(*pp)->next)
		if (*pp == l) {
			*pp = l->next;
			return;
		}
}

void devloads_destroy(struct devloads *dl)
{
	if (!dl)
		return;
	while (dl->loads) {
		struct devload *l = dl->loads;

		dl->loads = l->next;
		if (l->refs)
			LOG_INFO("gpu: freeing %s on GPU %d at shutdown (%u map(s) still open)",
				 l->version, l->gpu, l->refs);
		load_free(dl, l);
	}
	pthread_cond_destroy(&dl->cv);
	pthread_mutex_destroy(&dl->mu);
	free(dl);
}

void devloads_stop(struct devloads *dl)
{
	pthread_mutex_lock(&dl->mu);
	dl->stop = 1;
	pthread_mutex_unlock(&dl->mu);
}

int devloads_worker_enter(struct devloads *dl)
{
	int r = 0;

	pthread_mutex_lock(&dl->mu);
	if (dl->stop)
		r = -ESHUTDOWN;
	else
		dl->workers++;
	pthread_mutex_unlock(&dl->mu);
	return r;
}

void devloads_worker_exit(struct devloads *dl)
{
	pthread_mutex_lock(&dl->mu);
	dl->workers--;
	pthread_cond_broadcast(&dl->cv);
	pthread_mutex_unlock(&dl->mu);
}

void devloads_drain(struct devloads *dl)
{
	pthread_mutex_lock(&dl->mu);
	while (dl->workers)
		pthread_cond_wait(&dl->cv, &dl->mu);
	pthread_mutex_unlock(&dl->mu);
}

int devloads_drain_for(struct devloads *dl, unsigned ms, unsigned *left)
{
	struct timespec until;
	int r;

	clock_gettime(CLOCK_REALTIME, &until); /* the condition variable's clock */
	until.tv_sec += (time_t)(ms / 1000);
	until.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&dl->mu);
	while (dl->workers && pthread_cond_timedwait(&dl->cv, &dl->mu, &until) != ETIMEDOUT)
		;
	*left = dl->workers;
	r = dl->workers ? -ETIMEDOUT : 0;
	pthread_mutex_unlock(&dl->mu);
	return r;
}

/* The visible entry of (@v, @gpu) (dl->mu held): not being freed by an unload. */
static struct devload *find(struct devloads *dl, const char *v, int gpu)
{
	for (struct devload *l = dl->loads; l; l = l->next)
		if (!l->unloading && l->gpu == gpu && !strcmp(l->version, v))
			return l;
	return NULL;
}

int devloads_begin(struct devloads *dl, const char *version, uint64_t seq, int gpu, int autoload,
		   struct devload **out)
{
	struct devload *l;
	int r = 0;

	pthread_mutex_lock(&dl->mu);
	if (dl->stop) {
		r = -ESHUTDOWN;
		goto out;
	}
	l = find(dl, version, gpu);
	if (l && l->state == DL_FAILED) {
		unlink_load(dl, l);
		load_free(dl, l); /* a failed load holds no device memory */
		l = NULL;
	}
	if (l) {
		r = l->removed || l->seq != seq ? -EEXIST
		    : l->state == DL_LOADING    ? -EINPROGRESS
						: -EALREADY;
		if (r != -EEXIST && !autoload)
			l->autoload = 0; /* asked for by hand now: kept until unloaded by hand */
		goto out;
	}
	l = calloc(1, sizeof(*l));
	if (!l || !(l->version = strdup(version))) {
		free(l);
		r = -ENOMEM;
		goto out;
	}
	l->seq = seq;
	l->gpu = gpu;
	l->autoload = !!autoload;
	l->state = DL_LOADING;
	l->next = dl->loads;
	dl->loads = l;
	*out = l;
out:
	pthread_mutex_unlock(&dl->mu);
	return r;
}

/* Load's figures of loaded @l (dl->mu held, or @l still private): a new object or NULL. */
static json_t *summary_of(const struct devload *l)
{
	return json_pack("{s:I, s:I, s:I, s:f, s:s}", "bytes", (json_int_t)l->bytes, "tensors",
			 (json_int_t)l->n_tensors, "buckets", (json_int_t)l->nb, "seconds",
			 l->seconds, "source", l->pinned ? "pinned" : "pageable");
}

/* @l ends loading in @st (dl->mu taken here); wakes the waiters. */
static void finish(struct devloads *dl, struct devload *l, enum dl_state st, json_t **summary)
{
	uint64_t now = hwfs_mono_ns();

	pthread_mutex_lock(&dl->mu);
	l->state = st;
	if (st == DL_FAILED)
		l->failed_ns = now;
	if (summary)
		*summary = st == DL_LOADED ? summary_of(l) : NULL;
	pthread_cond_broadcast(&dl->cv);
	pthread_mutex_unlock(&dl->mu);
}

void devloads_fail(struct devloads *dl, struct devload *l, const char *reason)
{
	snprintf(l->reason, sizeof(l->reason), "%s", reason);
	finish(dl, l, DL_FAILED, NULL);
}

/* Has shutdown begun?  (read without holding the mutex for long) */
static int stopping(struct devloads *dl)
{
	int s;

	pthread_mutex_lock(&dl->mu);
	s = dl->stop;
	pthread_mutex_unlock(&dl->mu);
	return s;
}

/* "cudaMalloc: cudaErrorMemoryAllocation (out of memory)" into @err; returns -EIO or -ENOMEM. */
static int cuda_fail(struct cudart *rt, const char *what, cudart_err e, char *err, size_t errlen)
{
	char buf[256];

	snprintf(err, errlen, "%s failed: %s", what, cudart_strerror(rt, e, buf, sizeof(buf)));
	return e == CUDART_ERR_MEMORY_ALLOCATION ? -ENOMEM : -EIO;
}

/* Check the pieces of @src add up to each tensor's length.  Returns 0 or -EIO. */
static int src_check(const struct devload_src *src, char *err, size_t errlen)
{
	if (json_array_size(src->tensors) != src->n_tensors) {
		snprintf(err, errlen, "internal error: %zu tensors, %zu layout entries",
			 src->n_tensors, json_array_size(src->tensors));
		return -EIO;
	}
	for (size_t i = 0; i < src->n_tensors; i++) {
		uint64_t sum = 0;

		for (size_t k = src->piece_at[i]; k < src->piece_at[i + 1]; k++)
			if (__builtin_add_overflow(sum, src->pieces[k].len, &sum))
				break;
		if (sum != src->lens[i]) {
			snprintf(err, errlen, "internal error: tensor %zu: its pieces hold %llu of "
				 "its %llu bytes", i, (unsigned long long)sum,
				 (unsigned long long)src->lens[i]);
			return -EIO;
		}
	}
	return 0;
}

/*
 * Plan @src's buckets on device @gpu (made current) within @pct% of its free
 * memory, into @p (the caller frees it with devload_plan_free()).  Returns
 * 0, or -errno with the sentence in @err: -ENOMEM when they do not fit.
 */
static int plan_buckets(struct cudart *rt, int gpu, const struct devload_src *src, unsigned pct,
			int streams, uint64_t max_bucket, struct devload_plan *p, char *err,
			size_t errlen)
{
	size_t free_b = 0, total_b = 0;
	cudart_err e;
	int r;

	if ((e = rt->SetDevice(gpu)) != CUDART_SUCCESS)
		return cuda_fail(rt, "cudaSetDevice", e, err, errlen);
	if ((e = rt->MemGetInfo(&free_b, &total_b)) != CUDART_SUCCESS)
		return cuda_fail(rt, "cudaMemGetInfo", e, err, errlen);
	r = devload_plan(src->lens, src->n_tensors, (uint64_t)free_b, pct, streams, max_bucket, p);
	if (r == -ENOMEM && p->need) {
		char need[32], fr[32], al[32];

		snprintf(err, errlen, "needs %s (%llu bytes), %u%% of the %s free is %s",
			 hwfs_fmt_size(p->need, need, sizeof(need)), (unsigned long long)p->need, pct,
			 hwfs_fmt_size((uint64_t)free_b, fr, sizeof(fr)),
			 hwfs_fmt_size(p->allowed, al, sizeof(al)));
		return -ENOMEM;
	}
	if (r == -EOVERFLOW) {
		snprintf(err, errlen, "its tensors add up to more than 2^64 bytes");
		return -ENOMEM;
	}
	if (r < 0) {
		snprintf(err, errlen, "cannot plan the buckets: %s", strerror(-r));
		return r;
	}
	return 0;
}

/*
 * cudaMalloc each bucket of plan @p into @l->b (calloc'ed, @l->nb set); a
 * bucket that fails is left NULL, for buckets_free().  Returns 0 or -errno
 * with the sentence in @err.
 */
static int alloc_buckets(struct cudart *rt, struct devload *l, const struct devload_plan *p,
			 char *err, size_t errlen)
{
	cudart_err e;

	for (size_t b = 0; b < p->n_buckets; b++) {
		size_t len = (size_t)p->bucket_bytes[b]; /* > 0: the plan makes no empty bucket */

		l->b[b].bytes = p->bucket_bytes[b];
		if ((e = rt->Malloc(&l->b[b].ptr, len)) != CUDART_SUCCESS) {
			char what[96];

			l->b[b].ptr = NULL;
			snprintf(what, sizeof(what), "cudaMalloc of bucket %zu (%zu bytes)", b, len);
			return cuda_fail(rt, what, e, err, errlen);
		}
	}
	return 0;
}

/*
 * Queue the copies of @src's tensors, piece by piece from the arena, into
 * their buckets of @l at the offsets of plan @p, each bucket on its stream
 * of @st; @progress (when not NULL) hears the bytes queued of @total after
 * each tensor.  Stops between tensors when the daemon is shutting down.
 * Returns 0, or -errno with the sentence in @err (copies may be in flight).
 */
static int copy_tensors(struct devloads *dl, struct devload *l, const struct devload_src *src,
			const struct devload_plan *p, cudart_stream *st, uint64_t total,
			devload_progress_fn progress, void *arg, char *err, size_t errlen)
{
	struct cudart *rt = dl->rt;
	uint64_t done = 0;
	cudart_err e;

	for (size_t i = 0; i < src->n_tensors; i++) {
		int b = p->t_bucket[i];
		uint64_t at = 0;

		if (src->lens[i] == 0)
			continue;
		if (stopping(dl)) {
			snprintf(err, errlen, "the daemon is shutting down");
			return -ESHUTDOWN;
		}
		for (size_t k = src->piece_at[i]; k < src->piece_at[i + 1]; k++) {
			const struct devload_piece *pc = &src->pieces[k];
			uint8_t *dst = (uint8_t *)l->b[b].ptr + p->t_offset[i] + at;

			if (pc->len == 0)
				continue;
			e = rt->MemcpyAsync(dst, src->arena_base + pc->arena_off, (size_t)pc->len,
					    CUDART_MEMCPY_H2D, st[p->bucket_stream[b]]);
			if (e != CUDART_SUCCESS)
				return cuda_fail(rt, "cudaMemcpyAsync", e, err, errlen);
			at += pc->len;
		}
		done += src->lens[i];
		if (progress)
			progress(arg, done, total);
	}
	return 0;
}

/*
 * The copy of devloads_run() (see devload.h), into @l's buckets; on error
 * everything it allocated is freed again (the caller marks @l failed).
 */
static int copy(struct devloads *dl, struct devload *l, const struct devload_src *src,
		unsigned pct, int streams, uint64_t max_bucket, devload_progress_fn progress,
		void *arg, char *err, size_t errlen)
{
	struct cudart *rt = dl->rt;
	struct devload_plan p = {0};
	cudart_stream *st = NULL;
	uint64_t total = 0;
	int nst = 0, r;
	cudart_err e;
	double t0 = hwfs_mono_s();

	r = src_check(src, err, errlen);
	if (r < 0)
		return r;
	for (size_t i = 0; i < src->n_tensors; i++)
		total += src->lens[i]; /* fits: src_check() and the plan check the sums */
	r = plan_buckets(rt, l->gpu, src, pct, streams, max_bucket, &p, err, errlen);
	if (r < 0)
		return r;
	l->b = calloc(p.n_buckets ? p.n_buckets : 1, sizeof(*l->b));
	nst = (int)HWFS_MIN((size_t)streams, HWFS_MAX(p.n_buckets, (size_t)1));
	st = calloc((size_t)nst, sizeof(*st));
	if (!l->b || !st) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	l->nb = p.n_buckets;
	r = alloc_buckets(rt, l, &p, err, errlen);
	if (r < 0)
		goto fail;
	for (int s = 0; s < nst; s++)
		if ((e = rt->StreamCreateWithFlags(&st[s], CUDART_STREAM_NON_BLOCKING)) !=
		    CUDART_SUCCESS) {
			st[s] = NULL;
			r = cuda_fail(rt, "cudaStreamCreateWithFlags", e, err, errlen);
			goto fail;
		}
	r = copy_tensors(dl, l, src, &p, st, total, progress, arg, err, errlen);
	if (r < 0)
		goto fail;
	for (int s = 0; s < nst; s++)
		if ((e = rt->StreamSynchronize(st[s])) != CUDART_SUCCESS) {
			r = cuda_fail(rt, "cudaStreamSynchronize", e, err, errlen);
			goto fail;
		}
	for (size_t b = 0; b < p.n_buckets; b++)
		if ((e = rt->IpcGetMemHandle(&l->b[b].handle, l->b[b].ptr)) != CUDART_SUCCESS) {
			r = cuda_fail(rt, "cudaIpcGetMemHandle", e, err, errlen);
			goto fail;
		}
	for (int s = 0; s < nst; s++)
		rt->StreamDestroy(st[s]); /* synchronised: nothing left on them */
	free(st);
	/* the layout gpumap replies: each tensor's bucket and offset */
	for (size_t i = 0; i < src->n_tensors; i++) {
		json_t *t = json_array_get(src->tensors, i);

		json_object_set_new(t, "bucket", json_integer(p.t_bucket[i]));
		json_object_set_new(t, "offset", json_integer((json_int_t)p.t_offset[i]));
	}
	l->tensors = json_incref(src->tensors);
	l->digest = src->digest;
	l->bytes = total;
	l->n_tensors = src->n_tensors;
	l->pinned = src->pinned;
	l->seconds = hwfs_mono_s() - t0;
	devload_plan_free(&p);
	return 0;
fail:
	for (int s = 0; st && s < nst; s++)
		if (st[s]) {
			rt->StreamSynchronize(st[s]); /* no copy in flight into memory freed below */
			rt->StreamDestroy(st[s]);
		}
	free(st);
	if (l->b) {
		l->nb = p.n_buckets;
		buckets_free(rt, l);
	}
	devload_plan_free(&p);
	return r;
}

int devloads_run(struct devloads *dl, struct devload *l, const struct devload_src *src,
		 unsigned pct, int streams, uint64_t max_bucket, devload_progress_fn progress,
		 void *arg, json_t **summary, char *err, size_t errlen)
{
	int r;

	if (summary)
		*summary = NULL;
	if (!dl->rt) {
		snprintf(err, errlen, "no CUDA device");
		r = -ENODEV;
	} else {
		r = copy(dl, l, src, pct, streams, max_bucket, progress, arg, err, errlen);
	}
	if (r < 0) {
		snprintf(l->reason, sizeof(l->reason), "%s", err);
		finish(dl, l, DL_FAILED, NULL);
		return r;
	}
	finish(dl, l, DL_LOADED, summary);
	return 0;
}

int devloads_wait(struct devloads *dl, const char *version, int gpu, json_t **summary,
		  char *err, size_t errlen)
{
	struct devload *l;
	int r;

	if (summary)
		*summary = NULL;
	pthread_mutex_lock(&dl->mu);
	while ((l = find(dl, version, gpu)) && l->state == DL_LOADING)
		pthread_cond_wait(&dl->cv, &dl->mu);
	if (!l) {
		snprintf(err, errlen, "the load went away (unloaded)");
		r = -ENOENT;
	} else if (l->state == DL_FAILED) {
		snprintf(err, errlen, "%s", l->reason);
		r = -ECANCELED;
	} else {
		if (summary)
			*summary = summary_of(l);
		r = 0;
	}
	pthread_mutex_unlock(&dl->mu);
	return r;
}

int devloads_ready(struct devloads *dl, const char *version, uint64_t seq, int gpu,
		   uint64_t started_ns, char *err, size_t errlen)
{
	struct devload *l;
	int r;

	pthread_mutex_lock(&dl->mu);
	l = find(dl, version, gpu);
	if (l && l->state == DL_FAILED && l->failed_ns < started_ns) {
		unlink_load(dl, l); /* stale: it failed before this barrier began; load again */
		load_free(dl, l);   /* a failed load holds no device memory */
		l = NULL;
	}
	if (!l) {
		r = -ENOENT;
	} else if (l->state == DL_FAILED) {
		/* kept: every engine of this barrier on that device is told the same */
		snprintf(err, errlen, "%s", l->reason);
		r = -ECANCELED;
	} else if (l->removed || l->seq != seq) {
		snprintf(err, errlen, "GPU %d holds an earlier %s (removed since): unload it first "
			 "(hwfs unload %s --gpu %d)", gpu, version, version, gpu);
		r = -ECANCELED;
	} else if (l->state == DL_LOADING) {
		r = -EINPROGRESS;
	} else {
		r = 0;
	}
	pthread_mutex_unlock(&dl->mu);
	return r;
}

/* The 64-byte IPC handle as 128 lowercase hex digits, a new JSON string. */
static json_t *handle_hex(const cudart_ipc_handle *h)
{
	static const char hex[] = "0123456789abcdef";
	char s[2 * CUDART_IPC_HANDLE_SIZE + 1];

	for (size_t i = 0; i < CUDART_IPC_HANDLE_SIZE; i++) {
		unsigned char c = (unsigned char)h->reserved[i];

		s[2 * i] = hex[c >> 4];
		s[2 * i + 1] = hex[c & 15];
	}
	s[sizeof(s) - 1] = '\0';
	return json_string(s);
}

/* Free the loads of list @gone (unlinked from the table; mu not held); returns their bucket bytes. */
static uint64_t free_unlinked(struct devloads *dl, struct devload *gone)
{
	uint64_t bytes = 0;

	while (gone) {
		struct devload *l = gone;

		gone = l->next;
		for (size_t b = 0; b < l->nb; b++)
			bytes += l->b[b].bytes;
		load_free(dl, l);
	}
	return bytes;
}

/* The hash as hwfs writes it everywhere (hwfs_hash_hex()), a new JSON string. */
static json_t *hash_hex(const hwfs_hash_t *h)
{
	char hex[HWFS_HASH_HEX];

	hwfs_hash_hex(h, hex);
	return json_string(hex);
}

int devloads_map(struct devloads *dl, const char *version, int gpu, json_t **reply,
		 struct devload **ref)
{
	struct devload *l;
	json_t *bk = NULL, *res = NULL;
	int r = -ENOENT;

	pthread_mutex_lock(&dl->mu);
	l = find(dl, version, gpu);
	if (!l || l->state != DL_LOADED)
		goto out;
	r = -ENOMEM;
	bk = json_array();
	for (size_t b = 0; bk && b < l->nb; b++)
		if (json_array_append_new(bk, json_pack("{s:o, s:I}", "handle",
							handle_hex(&l->b[b].handle), "bytes",
							(json_int_t)l->b[b].bytes)))
			goto out;
	if (!bk)
		goto out;
	/* a deep copy: the reply is sent after the mutex is released */
	res = json_pack("{s:b, s:s, s:o, s:i, s:O, s:o}", "ok", 1, "version", version, "digest",
			hash_hex(&l->digest), "gpu", gpu, "buckets", bk, "tensors",
			json_deep_copy(l->tensors));
	if (!res)
		goto out;
	l->refs++;
	*ref = l;
	*reply = res;
	r = 0;
out:
	pthread_mutex_unlock(&dl->mu);
	json_decref(bk);
	return r;
}

void devloads_unmap(struct devloads *dl, struct devload *ref)
{
	int gone;

	if (!ref)
		return;
	pthread_mutex_lock(&dl->mu);
	gone = --ref->refs == 0 && ref->unloading;
	if (gone)
		unlink_load(dl, ref);
	pthread_mutex_unlock(&dl->mu);
	if (gone) {
		LOG_INFO("gpu: %s freed on GPU %d (its last map ended)", ref->version, ref->gpu);
		load_free(dl, ref);
	}
}

/*
 * Unload the load at **@pp in the table (mu held), the cursor *@pp moving on:
 * one still mapped is marked unloading (the last devloads_unmap() frees it)
 * and stays; any other is unlinked onto the list *@gone, for free_unlinked()
 * once mu is released.  Returns the maps that keep it (0: unlinked).
 */
static unsigned unload_one(struct devload ***pp, struct devload **gone)
{
	struct devload *l = **pp;

	if (l->refs) {
		l->unloading = 1;
		*pp = &l->next;
		return l->refs;
	}
	**pp = l->next;
	l->next = *gone;
	*gone = l;
	return 0;
}

int devloads_unload(struct devloads *dl, const char *version, int gpu, uint64_t *freed,
		    uint64_t *pending)
{
	struct devload *gone = NULL, **pp;
	int found = 0, busy = 0;

	*freed = 0;
	*pending = 0;
	pthread_mutex_lock(&dl->mu);
	for (pp = &dl->loads; *pp;) {
		struct devload *l = *pp;

		if (l->unloading || strcmp(l->version, version) || (gpu >= 0 && l->gpu != gpu)) {
			pp = &l->next;
			continue;
		}
		if (l->state == DL_LOADING) {
			busy = 1;
			pp = &l->next;
			continue;
		}
		found = 1;
		*pending += unload_one(&pp, &gone);
	}
	pthread_mutex_unlock(&dl->mu);
	*freed += free_unlinked(dl, gone);
	return found ? 0 : busy ? -EBUSY : -ENOENT;
}

size_t devloads_unload_auto(struct devloads *dl, const char *keep, uint64_t *freed)
{
	struct devload *gone = NULL, **pp;
	size_t n = 0;

	*freed = 0;
	pthread_mutex_lock(&dl->mu);
	for (pp = &dl->loads; *pp;) {
		struct devload *l = *pp;

		if (!l->autoload || l->unloading || l->state == DL_LOADING ||
		    (keep && !l->removed && !strcmp(l->version, keep))) {
			pp = &l->next;
			continue;
		}
		n++;
		unload_one(&pp, &gone);
	}
	pthread_mutex_unlock(&dl->mu);
	*freed += free_unlinked(dl, gone);
	return n;
}

void devloads_removed(struct devloads *dl, const char *version)
{
	pthread_mutex_lock(&dl->mu);
	for (struct devload *l = dl->loads; l; l = l->next)
		if (!strcmp(l->version, version))
			l->removed = 1;
	pthread_mutex_unlock(&dl->mu);
}

json_t *devloads_json(struct devloads *dl)
{
	json_t *arr = json_array();

	if (!arr)
		return NULL;
	pthread_mutex_lock(&dl->mu);
	for (struct devload *l = dl->loads; l; l = l->next) {
		uint64_t bytes = 0;
		json_t *o;

		/* a loading entry's buckets belong to its copying thread until it finishes */
		for (size_t b = 0; l->state != DL_LOADING && b < l->nb; b++)
			bytes += l->b[b].bytes;
		o = json_pack("{s:s, s:i, s:I, s:I, s:I, s:s, s:i, s:b, s:b}", "version", l->version,
			      "gpu", l->gpu, "bytes", (json_int_t)bytes, "tensors",
			      (json_int_t)(l->state == DL_LOADING ? 0 : l->n_tensors), "buckets",
			      (json_int_t)(l->state == DL_LOADING ? 0 : l->nb), "state",
			      l->unloading ? "unloading" : dl_state_names[l->state], "maps",
			      (int)l->refs, "removed", l->removed, "auto", l->autoload);
		if (o && l->state == DL_FAILED)
			json_object_set_new(o, "reason", json_string(l->reason));
		json_array_append_new(arr, o);
	}
	pthread_mutex_unlock(&dl->mu);
	return arr;
}
