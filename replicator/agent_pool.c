/*
 * agent_pool.c — the codec workers of the replication agent (see
 * agent_pool.h for the model).
 *
 * A fixed set of threads takes jobs from two FIFO queues under one mutex:
 * demand jobs (a puller waits, a shard is being pulled) first, then
 * encode-ahead ones.  Each worker owns a codec context and, when the arena
 * is not preallocated, a scratch buffer the size of the largest shard it
 * rebuilt, given back after codec_idle_ms without work.  A finished job goes
 * on the done list and the eventfd is signalled; the agent thread takes the
 * list (pool_take_done()).
 *
 * What a worker does to the node is limited to reading shards it holds a
 * reference on and, for a rebuild, staging bytes in a fresh arena range
 * (thread-safe store calls) that stays staged only when their hash matched:
 * it never interns, so no shard becomes visible that the agent thread did
 * not accept.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "agent_i.h"
#include "agent_pool.h"

struct worker {
	struct pool *p;
	pthread_t thread;
	struct delta_ctx *cx;
	uint8_t *scratch;
	size_t scratch_len;
	uint8_t *probe; /* worth_encoding()'s sample: base, new, delta */
};

struct pool {
	struct store *st;
	struct delta_stats *ds;
	pthread_mutex_t mu; /* guards everything below */
	pthread_cond_t cv;  /* a job was queued, or stop */
	struct pool_job *hi, *hi_tail, *lo, *lo_tail; /* queued: demand, encode-ahead */
	struct pool_job *done, *done_tail;
	int stop;
	int efd;
	struct worker *w;
	unsigned n;
};

/* Append @j to the queue (@head, @tail). */
static void q_push(struct pool_job **head, struct pool_job **tail, struct pool_job *j)
{
	j->next = NULL;
	if (*tail)
		(*tail)->next = j;
	else
		*head = j;
	*tail = j;
}

/* Take @j out of the queue (@head, @tail); 1 if it was there. */
static int q_remove(struct pool_job **head, struct pool_job **tail, struct pool_job *j)
{
	struct pool_job *prev = NULL;

	for (struct pool_job *x = *head; x; prev = x, x = x->next) {
		if (x != j)
			continue;
		if (prev)
			prev->next = x->next;
		else
			*head = x->next;
		if (*tail == x)
			*tail = prev;
		x->next = NULL;
		return 1;
	}
	return 0;
}

/*
 * worth_encoding() - a cheap look before encoding: a sample of the shard
 * (DELTA_PROBES evenly spaced windows of DELTA_PROBE_BYTES, gathered) is
 * encoded, and its delta must come within delta_max_pct of the sample, as
 * the whole delta must of the shard.  An unrelated tensor that happens to
 * share a name, or new random bits, fails it and is sent whole without
 * spending the encoding.  A dense update whose XOR compresses passes: an RL
 * step at a high learning rate changes half of the bf16 elements, in their
 * low bits (counting the changed elements, as this did before, sent those
 * shards whole at 2.5-3 times zstd -1 of the XOR).  The sample costs
 * 1/16 of the encoding of a 4 MiB shard.  Returns 1 to encode, 0 not to.
 */
static int worth_encoding(struct worker *w, const uint8_t *base, const uint8_t *new_, uint64_t len,
			  unsigned width)
{
	const size_t S = (size_t)DELTA_PROBES * DELTA_PROBE_BYTES;
	uint64_t step = len / DELTA_PROBES;
	size_t n = 0;
	uint8_t *b, *nw;

	if (len <= S)
		return 1; /* small: encoding it costs no more than looking */
	if (!w->probe) {
		w->probe = malloc(3 * S);
		if (!w->probe)
			return 1; /* the encoding decides */
	}
	b = w->probe;
	nw = b + S;
	for (uint64_t off = 0; off + DELTA_PROBE_BYTES <= len && n < S; off += step) {
		uint64_t at = off - off % width;

		memcpy(b + n, base + at, DELTA_PROBE_BYTES);
		memcpy(nw + n, new_ + at, DELTA_PROBE_BYTES);
		n += DELTA_PROBE_BYTES;
	}
	return delta_encode(w->cx, b, nw, n, width, nw + S, n * hwfs_tun.delta_max_pct / 100) >= 0;
}

/* Encode job: the delta of j->sh against j->bsh, or -E2BIG when it is not worth sending. */
static void run_encode(struct worker *w, struct pool_job *j)
{
	struct store *st = w->p->st;
	const uint8_t *base = store_shard_data(st, j->bsh), *new_ = store_shard_data(st, j->sh);
	uint64_t cap = j->size * hwfs_tun.delta_max_pct / 100, t0;
	ssize_t n;

	if (!worth_encoding(w, base, new_, j->size, j->width)) {
		j->r = -E2BIG;
		return;
	}
	j->enc = malloc(cap);
	if (!j->enc) {
		j->r = -ENOMEM;
		return;
	}
	t0 = delta_cpu_ns();
	n = delta_encode(w->cx, base, new_, j->size, j->width, j->enc, cap);
	__atomic_add_fetch(&w->p->ds->encode_ns, delta_cpu_ns() - t0, __ATOMIC_RELAXED);
	__atomic_add_fetch(&w->p->ds->encoded, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&w->p->ds->encode_bytes, j->size, __ATOMIC_RELAXED);
	if (j->ahead)
		__atomic_add_fetch(&w->p->ds->ahead_encoded, 1, __ATOMIC_RELAXED);
	if (n < 0) {
		free(j->enc);
		j->enc = NULL;
		j->r = (int)n;
		return;
	}
	j->enc_len = (size_t)n;
	j->enc = realloc(j->enc, (size_t)n) ?: j->enc;
	j->r = 0;
}

/*
 * Rebuild job: decode j->enc against j->bsh, check the hash, and leave the
 * bytes staged (j->roff) only when it matched.  In a preallocated arena the
 * shard is rebuilt straight into its staged range (every page is backed
 * already: no fault, and no copy afterwards); otherwise into the worker's
 * scratch, then written in with store_stage_write() (a write through the
 * mapping of an unbacked range could fault on a full filesystem).  A staged
 * range is not a shard: nothing reads it before the agent interns it, and a
 * mismatch gives it back.  A mismatch looks at the base too, so the agent
 * knows whose fault it is.
 */
static void run_rebuild(struct worker *w, struct pool_job *j)
{
	struct store *st = w->p->st;
	const uint8_t *base = store_shard_data(st, j->bsh);
	int direct = store_stage_dest(st, 0) != NULL;
	hwfs_hash_t got;
	uint8_t *out;
	uint64_t t0;
	int r;

	if (direct) {
		if (store_stage_alloc(st, j->size, 1, &j->roff) < 0) {
			j->r = -ENOSPC;
			return;
		}
		j->staged = 1;
		out = store_stage_dest(st, j->roff);
	} else {
		if (w->scratch_len < j->size) {
			uint8_t *p = realloc(w->scratch, j->size);

			if (!p) {
				j->r = -ENOMEM;
				return;
			}
			w->scratch = p;
			w->scratch_len = j->size;
		}
		out = w->scratch;
	}
	/* one pass: rebuild and hash (delta.decode_cpu_s counts both) */
	t0 = delta_cpu_ns();
	r = delta_decode_hash(w->cx, base, j->size, j->enc, j->enc_len, out, &got, j->err,
			      sizeof(j->err));
	__atomic_add_fetch(&w->p->ds->decode_ns, delta_cpu_ns() - t0, __ATOMIC_RELAXED);
	if (r == -ENOMEM) {
		j->r = r;
		return; /* (a staged range is given back by pool_job_free()) */
	}
	if (r == 0) {
		__atomic_add_fetch(&w->p->ds->decoded, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&w->p->ds->decode_bytes, j->size, __ATOMIC_RELAXED);
		if (hwfs_hash_cmp(&got, &j->hash))
			snprintf(j->err, sizeof(j->err), "the rebuilt shard does not match its hash");
		delta_peek(j->enc, j->enc_len, NULL, &j->enc_width, NULL, 0);
	}
	if (j->err[0]) { /* whose fault: is the base here intact? */
		hwfs_hash_buf(base, j->size, &got);
		j->base_bad = hwfs_hash_cmp(&got, &j->base) != 0;
		j->r = -EBADMSG;
		if (j->staged) { /* wrong bytes: give them back now */
			store_stage_free(st, j->roff, j->size);
			j->staged = 0;
		}
		return;
	}
	if (!direct) {
		r = store_stage_alloc(st, j->size, 1, &j->roff);
		if (r < 0) {
			j->r = -ENOSPC;
			return;
		}
		r = store_stage_write(st, j->roff, w->scratch, j->size);
		if (r < 0) {
			LOG_ERR("agent: writing a shard into the arena: %s", strerror(-r));
			store_stage_free(st, j->roff, j->size);
			j->r = -ENOSPC;
			return;
		}
		j->staged = 1;
	}
	j->r = 0;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct pool *p = w->p;
	uint64_t one = 1;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		struct pool_job *j;

		while (!p->stop && !p->hi && !p->lo) {
			struct timespec dl;

			if (!w->scratch) {
				pthread_cond_wait(&p->cv, &p->mu);
				continue;
			}
			clock_gettime(CLOCK_REALTIME, &dl);
			dl.tv_sec += (time_t)(hwfs_tun.codec_idle_ms / 1000);
			dl.tv_nsec += (long)(hwfs_tun.codec_idle_ms % 1000) * 1000000L;
			if (dl.tv_nsec >= 1000000000L) {
				dl.tv_sec++;
				dl.tv_nsec -= 1000000000L;
			}
			if (pthread_cond_timedwait(&p->cv, &p->mu, &dl) == ETIMEDOUT && !p->hi &&
			    !p->lo) { /* idle: give the largest shard's buffer back */
				free(w->scratch);
				w->scratch = NULL;
				w->scratch_len = 0;
			}
		}
		if (p->stop)
			break;
		j = p->hi ? p->hi : p->lo;
		if (j == p->hi)
			q_remove(&p->hi, &p->hi_tail, j);
		else
			q_remove(&p->lo, &p->lo_tail, j);
		pthread_mutex_unlock(&p->mu);
		if (__atomic_load_n(&j->cancel, __ATOMIC_ACQUIRE))
			j->r = -ECANCELED;
		else if (j->kind == POOL_ENCODE)
			run_encode(w, j);
		else
			run_rebuild(w, j);
		pthread_mutex_lock(&p->mu);
		q_push(&p->done, &p->done_tail, j);
		if (write(p->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			LOG_WARN("agent: codec pool eventfd: %s", strerror(errno));
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int pool_new(struct store *st, unsigned threads, int level, struct delta_stats *ds,
	     struct pool **out)
{
	struct pool *p = calloc(1, sizeof(*p));
	long ncpu;
	int r = -ENOMEM;

	if (!p)
		return -ENOMEM;
	if (!threads) {
		ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		threads = ncpu > 0 ? (unsigned)ncpu : 1;
	}
	p->st = st;
	p->ds = ds;
	p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->w = calloc(threads, sizeof(*p->w));
	if (p->efd < 0 || !p->w) {
		r = p->efd < 0 ? -errno : -ENOMEM;
		goto fail;
	}
	for (unsigned i = 0; i < threads; i++) {
		struct worker *w = &p->w[i];

		w->p = p;
		w->cx = delta_ctx_new(level);
		if (!w->cx)
			goto fail;
		if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
			delta_ctx_free(w->cx);
			w->cx = NULL;
			r = -EAGAIN;
			goto fail;
		}
		p->n++;
	}
	*out = p;
	return 0;
fail:
	pool_free(p);
	return r;
}

void pool_free(struct pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->n; i++)
		pthread_join(p->w[i].thread, NULL);
	for (unsigned i = 0; p->w && i < p->n; i++) {
		delta_ctx_free(p->w[i].cx);
		free(p->w[i].scratch);
		free(p->w[i].probe);
	}
	for (struct pool_job **q[] = {&p->hi, &p->lo, &p->done}, ***l = q; l < q + 3; l++)
		while (**l) {
			struct pool_job *j = **l;

			**l = j->next;
			pool_job_free(p->st, j);
		}
	if (p->efd >= 0)
		close(p->efd);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p->w);
	free(p);
}

int pool_fd(const struct pool *p)
{
	return p->efd;
}

uint64_t pool_cpu_ns(const struct pool *p)
{
	uint64_t ns = 0;

	for (unsigned i = 0; i < p->n; i++)
		ns += hwfs_thread_cpu_ns(p->w[i].thread);
	return ns;
}

unsigned pool_threads(const struct pool *p)
{
	return p->n;
}

void pool_submit(struct pool *p, struct pool_job *j)
{
	pthread_mutex_lock(&p->mu);
	if (j->ahead)
		q_push(&p->lo, &p->lo_tail, j);
	else
		q_push(&p->hi, &p->hi_tail, j);
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

void pool_promote(struct pool *p, struct pool_job *j)
{
	pthread_mutex_lock(&p->mu);
	if (q_remove(&p->lo, &p->lo_tail, j))
		q_push(&p->hi, &p->hi_tail, j);
	pthread_mutex_unlock(&p->mu);
}

struct pool_job *pool_take_done(struct pool *p)
{
	struct pool_job *list;
	uint64_t v;

	if (read(p->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		LOG_WARN("agent: codec pool eventfd: %s", strerror(errno));
	pthread_mutex_lock(&p->mu);
	list = p->done;
	p->done = p->done_tail = NULL;
	pthread_mutex_unlock(&p->mu);
	return list;
}

void pool_job_free(struct store *st, struct pool_job *j)
{
	if (!j)
		return;
	if (j->staged)
		store_stage_free(st, j->roff, j->size);
	if (j->bsh)
		store_unref(st, j->bsh);
	if (j->sh)
		store_unref(st, j->sh);
	free(j->enc);
	free(j);
}
