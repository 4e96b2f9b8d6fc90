/*
 * test_agent_pool.c — unit tests for the replicator's codec workers
 * (replicator/agent_pool.c).
 *
 * Each test opens a real store under /dev/shm, makes base and new shards in
 * it (preallocated or not: a rebuild goes straight into a preallocated
 * arena), and runs jobs through a pool of real threads, waiting on the pool's
 * eventfd as the agent's loop does.  What is checked: a rebuild stages
 * exactly the new shard's bytes and nothing when the delta is wrong (and
 * says whether the base was to blame), an encode's delta rebuilds the shard,
 * a shard that changed everywhere is "not worth it" without an encode, a
 * cancelled job does not run (no encode is counted, no delta comes back),
 * promoted jobs are taken before the other encode-ahead ones, and many jobs
 * of different shards all come back (run under ThreadSanitizer by `make
 * tsan`'s unit binaries).
 *
 * What is queued behind a busy worker is observed with a gate: a rebuild
 * job whose delta lies in pages nobody may read.  The one worker of the pool
 * takes it and faults on its first byte; the SIGSEGV handler, on that
 * worker's thread, says so and waits until the test opens the gate (makes the
 * pages readable), then the job goes on as any other.  Meanwhile every job
 * submitted stays queued, so the test knows exactly what the worker will
 * find: the order it takes them in (the done list's, with one worker) and
 * the jobs cancelled before it took them.  No sleep: each side waits on a
 * semaphore the other posts.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "agent_i.h"
#include "agent_pool.h"
#include "tmpdir.h"

#define LEN (1u << 20) /* bytes per shard: above worth_encoding()'s sample */

struct fx {
	char dir[64];
	struct store *s;
	struct delta_stats ds;
	struct pool *p;
};

/* The gate (see the top of this file). */
static struct {
	uint8_t *buf; /* the gate job's delta (malloc'd, whole pages): PROT_NONE until opened */
	size_t len;
	sem_t held; /* posted by the worker that faulted on @buf */
	sem_t open; /* posted by gate_open() */
	struct sigaction old;
} gate;

/*
 * SIGSEGV on a worker: the gate when the fault is in its pages (hold the
 * worker there until gate_open(), then give the pages their access back);
 * any other fault goes to the handler that was there before (it faults
 * again on return).
 */
static void gate_fault(int sig, siginfo_t *si, void *uc)
{
	uint8_t *at = si->si_addr;
	int e = errno;

	(void)sig;
	(void)uc;
	if (!gate.buf || at < gate.buf || at >= gate.buf + gate.len) {
		sigaction(SIGSEGV, &gate.old, NULL);
		errno = e;
		return;
	}
	sem_post(&gate.held);
	while (sem_wait(&gate.open) < 0 && errno == EINTR)
		;
	mprotect(gate.buf, gate.len, PROT_READ | PROT_WRITE);
	errno = e;
}

/* Wait on @s; fails the test after 30 s (a pool that lost the job) rather than hang. */
static void sem_wait_or_fail(sem_t *s)
{
	struct timespec dl;
	int r;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 30;
	while ((r = sem_timedwait(s, &dl)) < 0 && errno == EINTR)
		;
	assert_int_equal(r, 0);
}

/* Let the held worker go on with the gate job. */
static void gate_open(void)
{
	sem_post(&gate.open);
}

/* No gate any more (the job holding its pages is freed, or about to be). */
static void gate_end(void)
{
	sigaction(SIGSEGV, &gate.old, NULL);
	gate.buf = NULL;
	sem_destroy(&gate.held);
	sem_destroy(&gate.open);
}

/*
 * A store (preallocated with @prealloc: rebuilds go straight into the arena)
 * and a pool of @threads workers.
 */
static int fx_open(void **state, int prealloc, unsigned threads)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (!f || hwfs_tunables_load(NULL, 0) < 0)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/dev/shm/hwfs-test-pool-XXXXXX");
	if (!mkdtemp(f->dir) || store_open(f->dir, 64ull << 20, &f->s) < 0 ||
	    (prealloc && arena_preallocate(store_arena(f->s), 0) < 0) ||
	    pool_new(f->s, threads, 1, &f->ds, &f->p) < 0)
		return -1;
	*state = f;
	return 0;
}

static int fx_setup(void **state)
{
	return fx_open(state, 0, 2);
}

static int fx_setup_prealloc(void **state)
{
	return fx_open(state, 1, 2);
}

/* One worker: the order jobs are taken in is the order they come back. */
static int fx_setup_one(void **state)
{
	return fx_open(state, 0, 1);
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;

	/* a test that failed with the gate shut: open it (pool_free() would wait forever) */
	if (gate.buf) {
		mprotect(gate.buf, gate.len, PROT_READ | PROT_WRITE);
		gate_open();
	}
	pool_free(f->p);
	if (gate.buf)
		gate_end();
	store_close(f->s);
	rm_rf(f->dir);
	free(f);
	return 0;
}

/* Pseudo-random bytes from @seed. */
static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 12345u;

	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)(x >> 16);
	}
}

/* Intern @n bytes of @buf as a shard of @s (one reference for the caller). */
static struct shard *mk_shard(struct store *s, const uint8_t *buf, size_t n)
{
	hwfs_hash_t h;
	uint64_t off;
	struct shard *sh;

	hwfs_hash_buf(buf, n, &h);
	assert_int_equal(store_stage_alloc(s, n, 1, &off), 0);
	assert_int_equal(store_stage_write(s, off, buf, n), 0);
	sh = store_intern_staged(s, &h, off, n);
	assert_non_null(sh);
	return sh;
}

/* Wait until @want jobs came back; returns them as a list. */
static struct pool_job *wait_done(struct pool *p, size_t want)
{
	struct pool_job *all = NULL, **tail = &all;
	size_t got = 0;

	while (got < want) {
		struct pollfd pfd = {.fd = pool_fd(p), .events = POLLIN};
		struct pool_job *j;

		assert_true(poll(&pfd, 1, 30000) == 1);
		for (j = pool_take_done(p); j; j = j->next, got++) {
			*tail = j;
			tail = &j->next;
		}
	}
	return all;
}

/* A base and a new shard differing in @changed bytes (every 64th from the start). */
static void pair(struct fx *f, size_t changed, struct shard **bsh, struct shard **sh,
		 uint8_t **newbuf)
{
	uint8_t *b = malloc(LEN), *n = malloc(LEN);

	assert_non_null(b);
	assert_non_null(n);
	fill(b, LEN, 1);
	memcpy(n, b, LEN);
	for (size_t i = 0; i < changed; i++)
		n[(i * 64) % LEN] ^= 0x5a;
	*bsh = mk_shard(f->s, b, LEN);
	*sh = mk_shard(f->s, n, LEN);
	free(b);
	*newbuf = n;
}

/* A delta of @sh against @bsh, made here (not on the pool). */
static uint8_t *encode_here(struct fx *f, struct shard *bsh, struct shard *sh, size_t *len)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	uint8_t *out = malloc(LEN);
	ssize_t n;

	assert_non_null(cx);
	n = delta_encode(cx, store_shard_data(f->s, bsh), store_shard_data(f->s, sh), LEN, 2, out,
			 LEN);
	assert_true(n > 0);
	delta_ctx_free(cx);
	*len = (size_t)n;
	return out;
}

static struct pool_job *rebuild_job(struct fx *f, struct shard *bsh, const hwfs_hash_t *base,
				    const hwfs_hash_t *hash, uint8_t *enc, size_t len)
{
	struct pool_job *j = calloc(1, sizeof(*j));

	assert_non_null(j);
	store_ref(f->s, bsh);
	*j = (struct pool_job){.kind = POOL_REBUILD, .id = 1, .bsh = bsh, .base = *base,
			       .hash = *hash, .width = 2, .size = LEN, .enc = enc, .enc_len = len};
	return j;
}

/* ---- the gate job, encode jobs ---- */

/*
 * gate_job() - a rebuild job of @sh against @bsh (id @id) whose delta lies
 * in unreadable pages: the worker that takes it is held until gate_open().
 * The delta is malloc'd (page-aligned) as any rebuild's, so whoever frees
 * the job frees it.
 */
static struct pool_job *gate_job(struct fx *f, struct shard *bsh, struct shard *sh, uint64_t id)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), len;
	uint8_t *enc = encode_here(f, bsh, sh, &len);
	struct sigaction sa = {.sa_sigaction = gate_fault, .sa_flags = SA_SIGINFO};
	struct pool_job *j;

	gate.len = (len + page - 1) / page * page;
	gate.buf = aligned_alloc(page, gate.len);
	assert_non_null(gate.buf);
	memcpy(gate.buf, enc, len);
	free(enc);
	assert_int_equal(mprotect(gate.buf, gate.len, PROT_NONE), 0);
	assert_int_equal(sem_init(&gate.held, 0, 0), 0);
	assert_int_equal(sem_init(&gate.open, 0, 0), 0);
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGSEGV, &sa, &gate.old), 0);
	j = rebuild_job(f, bsh, &bsh->hash, &sh->hash, gate.buf, len);
	j->id = id;
	return j;
}

/* The gate job @j came back: check it ran as any job, free it and the gate. */
static void gate_close(struct fx *f, struct pool_job *j)
{
	assert_int_equal(j->r, 0); /* held, then rebuilt the shard all the same */
	assert_true(j->staged);
	pool_job_free(f->s, j);
	gate_end();
}

/* An encode job (id @id) of @sh against @bsh, ahead of demand with @ahead. */
static struct pool_job *encode_job(struct fx *f, struct shard *bsh, struct shard *sh, uint64_t id,
				   int ahead)
{
	struct pool_job *e = calloc(1, sizeof(*e));

	assert_non_null(e);
	store_ref(f->s, bsh);
	store_ref(f->s, sh);
	*e = (struct pool_job){.kind = POOL_ENCODE, .id = id, .ahead = ahead, .bsh = bsh, .sh = sh,
			       .base = bsh->hash, .hash = sh->hash, .width = 2, .size = LEN};
	return e;
}

/* ---- the cases ---- */

static void test_rebuild_stages_the_shard(void **state)
{
	struct fx *f = *state;
	struct shard *bsh, *sh;
	uint8_t *n, *enc;
	size_t len;
	struct pool_job *j;

	pair(f, 1000, &bsh, &sh, &n);
	enc = encode_here(f, bsh, sh, &len);
	pool_submit(f->p, rebuild_job(f, bsh, &bsh->hash, &sh->hash, enc, len));
	j = wait_done(f->p, 1);
	assert_int_equal(j->r, 0);
	assert_true(j->staged);
	assert_int_equal(j->enc_width, 2);
	assert_memory_equal(store_stage_data(f->s, j->roff), n, LEN);
	assert_int_equal(f->ds.decoded, 1);
	pool_job_free(f->s, j); /* gives the staged range back */
	store_unref(f->s, sh);
	store_unref(f->s, bsh);
	free(n);
}

static void test_rebuild_of_a_wrong_delta_stages_nothing(void **state)
{
	struct fx *f = *state;
	struct shard *bsh, *sh, *other;
	uint8_t *n, *enc, *ob = malloc(LEN);
	size_t len;
	uint64_t room;
	struct pool_job *j;

	pair(f, 1000, &bsh, &sh, &n);
	fill(ob, LEN, 1); /* the base with other bytes changed: a near, wrong base */
	for (size_t i = 0; i < 500; i++)
		ob[(i * 97 + 13) % LEN] ^= 0xa5;
	other = mk_shard(f->s, ob, LEN);
	/* made against another base: decodes, but to other bytes */
	enc = encode_here(f, other, sh, &len);
	room = store_stage_room(f->s);
	pool_submit(f->p, rebuild_job(f, bsh, &bsh->hash, &sh->hash, enc, len));
	j = wait_done(f->p, 1);
	assert_int_equal(j->r, -EBADMSG);
	assert_false(j->staged);
	assert_int_equal(store_stage_room(f->s), room); /* nothing stays staged */
	assert_false(j->base_bad);
	assert_non_null(strstr(j->err, "does not match"));
	pool_job_free(f->s, j);

	/* the same good delta, but the base here is not what its hash says: the base's fault */
	enc = encode_here(f, other, sh, &len);
	pool_submit(f->p, rebuild_job(f, bsh, &other->hash, &sh->hash, enc, len));
	j = wait_done(f->p, 1);
	assert_int_equal(j->r, -EBADMSG);
	assert_true(j->base_bad);
	assert_false(j->staged);
	pool_job_free(f->s, j);
	store_unref(f->s, other);
	store_unref(f->s, sh);
	store_unref(f->s, bsh);
	free(n);
	free(ob);
}

/*
 * Every element changed, in its low bits only (an RL step at a high
 * learning rate on bf16 weights): the XOR compresses, so the delta is worth
 * sending and the look before encoding must not refuse it (counting changed
 * elements did: more than half differ).
 */
static void test_a_dense_update_whose_xor_compresses_is_encoded(void **state)
{
	struct fx *f = *state;
	uint8_t *b = malloc(LEN), *n = malloc(LEN), *out = malloc(LEN);
	struct delta_ctx *cx = delta_ctx_new(1);
	struct shard *bsh, *sh;
	struct pool_job *e = calloc(1, sizeof(*e)), *j;
	char err[160];

	assert_non_null(b);
	assert_non_null(n);
	assert_non_null(out);
	assert_non_null(e);
	fill(b, LEN, 3);
	memcpy(n, b, LEN);
	for (size_t i = 0; i < LEN; i += 2) /* the low mantissa bit of every bf16 */
		n[i] ^= 1;
	bsh = mk_shard(f->s, b, LEN);
	sh = mk_shard(f->s, n, LEN);
	store_ref(f->s, bsh);
	store_ref(f->s, sh);
	*e = (struct pool_job){.kind = POOL_ENCODE, .id = 1, .bsh = bsh, .sh = sh,
			       .base = bsh->hash, .hash = sh->hash, .width = 2, .size = LEN};
	pool_submit(f->p, e);
	j = wait_done(f->p, 1);
	assert_int_equal(j->r, 0);
	assert_true(j->enc_len > DELTA_HDR && j->enc_len < LEN / 8);
	assert_int_equal(delta_decode(cx, b, LEN, j->enc, j->enc_len, out, err, sizeof(err)), 0);
	assert_memory_equal(out, n, LEN);
	assert_int_equal(f->ds.encoded, 1);
	pool_job_free(f->s, j);
	delta_ctx_free(cx);
	store_unref(f->s, sh);
	store_unref(f->s, bsh);
	free(b);
	free(n);
	free(out);
}

static void test_encode_and_not_worth_it(void **state)
{
	struct fx *f = *state;
	struct shard *bsh, *sh, *other;
	uint8_t *n, *ob = malloc(LEN), *out = malloc(LEN);
	struct delta_ctx *cx = delta_ctx_new(1);
	char err[160];
	struct pool_job *j, *k;

	pair(f, 1000, &bsh, &sh, &n);
	fill(ob, LEN, 9);
	other = mk_shard(f->s, ob, LEN);
	for (int i = 0; i < 2; i++) {
		struct pool_job *e = calloc(1, sizeof(*e));

		store_ref(f->s, bsh);
		store_ref(f->s, i ? other : sh);
		*e = (struct pool_job){.kind = POOL_ENCODE, .id = (uint64_t)i + 1, .ahead = i == 0,
				       .bsh = bsh, .sh = i ? other : sh, .base = bsh->hash,
				       .hash = (i ? other : sh)->hash, .width = 2, .size = LEN};
		pool_submit(f->p, e);
	}
	j = wait_done(f->p, 2);
	if (j->id != 1) { /* (either order) */
		k = j;
		j = j->next;
	} else {
		k = j->next;
	}
	assert_int_equal(j->r, 0);
	assert_true(j->enc_len > DELTA_HDR && j->enc_len < LEN / 2);
	assert_int_equal(delta_decode(cx, store_shard_data(f->s, bsh), LEN, j->enc, j->enc_len, out,
				      err, sizeof(err)),
			 0);
	assert_memory_equal(out, n, LEN);
	assert_int_equal(k->r, -E2BIG); /* new random bits: the sample's delta says so, no encode */
	assert_null(k->enc);
	assert_int_equal(f->ds.encoded, 1);
	assert_int_equal(f->ds.ahead_encoded, 1);
	pool_job_free(f->s, j);
	pool_job_free(f->s, k);
	delta_ctx_free(cx);
	store_unref(f->s, other);
	store_unref(f->s, sh);
	store_unref(f->s, bsh);
	free(n);
	free(ob);
	free(out);
}

/*
 * Jobs cancelled before they are submitted (every fourth, all encode-ahead)
 * come back -ECANCELED without having run: no delta, no encode counted.  All
 * sixteen come back from two workers.
 */
static void test_cancelled_jobs_do_not_run_and_many_come_back(void **state)
{
	struct fx *f = *state;
	struct shard *bsh, *sh;
	uint8_t *n;
	struct pool_job *all;
	size_t ok = 0, cancelled = 0;

	pair(f, 1000, &bsh, &sh, &n);
	for (int i = 0; i < 16; i++) {
		struct pool_job *e = encode_job(f, bsh, sh, (uint64_t)i + 1, i % 2);

		e->cancel = i % 4 == 3;
		pool_submit(f->p, e);
		if (i == 5)
			pool_promote(f->p, e);
	}
	all = wait_done(f->p, 16);
	while (all) {
		struct pool_job *j = all;

		all = j->next;
		if (j->r == -ECANCELED) {
			assert_true(j->id % 4 == 0);
			assert_null(j->enc); /* it never ran: no delta */
			assert_int_equal(j->enc_len, 0);
			cancelled++;
		} else {
			assert_int_equal(j->r, 0);
			assert_non_null(j->enc);
			ok++;
		}
		pool_job_free(f->s, j);
	}
	assert_int_equal(cancelled, 4);
	assert_int_equal(ok, 12);
	/* only the twelve that were not cancelled were encoded (four of them ahead) */
	assert_int_equal(f->ds.encoded, 12);
	assert_int_equal(f->ds.encode_bytes, 12ull * LEN);
	assert_int_equal(f->ds.ahead_encoded, 4);
	store_unref(f->s, sh);
	store_unref(f->s, bsh);
	free(n);
}

/*
 * The agent cancels queued jobs by setting their flag after submitting them
 * (an encode-ahead run whose version went).  With the one worker held by the
 * gate, eight encodes are queued and four of them cancelled before the worker
 * can take any: those four come back -ECANCELED and were never encoded (the
 * counters count the other four only, they hold no delta); the others are
 * encoded as usual.
 */
static void test_jobs_cancelled_while_queued_are_never_encoded(void **state)
{
	struct fx *f = *state;
	struct shard *bsh, *sh;
	struct pool_job *jobs[8], *all;
	uint8_t *n;
	size_t ok = 0, cancelled = 0;

	pair(f, 1000, &bsh, &sh, &n);
	pool_submit(f->p, gate_job(f, bsh, sh, 100));
	sem_wait_or_fail(&gate.held); /* the worker holds the gate: nothing else is taken */
	for (int i = 0; i < 8; i++) {
		jobs[i] = encode_job(f, bsh, sh, (uint64_t)i + 1, i % 2);
		pool_submit(f->p, jobs[i]);
	}
	/* ids 2, 3, 6, 7: two demand jobs, two ahead (as the agent does it: atomic) */
	for (int i = 1; i < 8; i += 4) {
		__atomic_store_n(&jobs[i]->cancel, 1, __ATOMIC_RELEASE);
		__atomic_store_n(&jobs[i + 1]->cancel, 1, __ATOMIC_RELEASE);
	}
	gate_open();
	all = wait_done(f->p, 9);
	assert_int_equal(all->id, 100);
	while (all) {
		struct pool_job *j = all;

		all = j->next;
		if (j->id == 100) {
			gate_close(f, j);
			continue;
		}
		if (j->id % 4 == 2 || j->id % 4 == 3) {
			assert_int_equal(j->r, -ECANCELED);
			assert_null(j->enc);
			assert_int_equal(j->enc_len, 0);
			cancelled++;
		} else {
			assert_int_equal(j->r, 0);
			assert_non_null(j->enc);
			ok++;
		}
		pool_job_free(f->s, j);
	}
	assert_int_equal(cancelled, 4);
	assert_int_equal(ok, 4);
	assert_int_equal(f->ds.encoded, 4); /* ids 1, 4, 5, 8 */
	assert_int_equal(f->ds.encode_bytes, 4ull * LEN);
	assert_int_equal(f->ds.ahead_encoded, 2); /* ids 4, 8 */
	assert_int_equal(f->ds.decoded, 1);       /* the gate */
	store_unref(f->s, sh);
	store_unref(f->s, bsh);
	free(n);
}

/*
 * pool_promote() (agent_pool.h): a queued job wanted by a puller now moves
 * before the encode-ahead jobs.  The pool keeps two FIFO queues, demand then
 * encode-ahead, and a promoted job joins the demand queue: with the one
 * worker held by the gate, six encode-ahead jobs (1-6) then a demand job (7)
 * are queued, and 5 then 2 promoted.  The worker takes 7 (a puller that
 * waited already), 5, 2 (in the order they were promoted), then 1, 3, 4, 6
 * (the rest of the encode-ahead jobs, in the order they came).  Promoting the
 * job that is running (the gate) changes nothing: it runs once.
 */
static void test_promoted_jobs_are_taken_first_in_promotion_order(void **state)
{
	struct fx *f = *state;
	struct shard *bsh, *sh;
	struct pool_job *jobs[7], *g, *all;
	char order[64] = "", *o = order;
	uint8_t *n;

	pair(f, 1000, &bsh, &sh, &n);
	g = gate_job(f, bsh, sh, 100);
	pool_submit(f->p, g);
	sem_wait_or_fail(&gate.held);
	pool_promote(f->p, g); /* running: nothing to move */
	for (int i = 0; i < 7; i++) {
		jobs[i] = encode_job(f, bsh, sh, (uint64_t)i + 1, i < 6);
		pool_submit(f->p, jobs[i]);
	}
	pool_promote(f->p, jobs[4]);
	pool_promote(f->p, jobs[1]);
	gate_open();
	all = wait_done(f->p, 8);
	while (all) {
		struct pool_job *j = all;

		all = j->next;
		o += snprintf(o, sizeof(order) - (size_t)(o - order), "%s%llu",
			      o == order ? "" : " ", (unsigned long long)j->id);
		if (j->id == 100) {
			gate_close(f, j);
			continue;
		}
		assert_int_equal(j->r, 0);
		pool_job_free(f->s, j);
	}
	assert_string_equal(order, "100 7 5 2 1 3 4 6");
	assert_null(pool_take_done(f->p)); /* nothing ran twice */
	assert_int_equal(f->ds.encoded, 7);
	store_unref(f->s, sh);
	store_unref(f->s, bsh);
	free(n);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_rebuild_stages_the_shard, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_rebuild_of_a_wrong_delta_stages_nothing,
						fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_rebuild_stages_the_shard, fx_setup_prealloc,
						fx_teardown),
		cmocka_unit_test_setup_teardown(test_rebuild_of_a_wrong_delta_stages_nothing,
						fx_setup_prealloc, fx_teardown),
		cmocka_unit_test_setup_teardown(test_encode_and_not_worth_it, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_a_dense_update_whose_xor_compresses_is_encoded,
						fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_cancelled_jobs_do_not_run_and_many_come_back,
						fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_jobs_cancelled_while_queued_are_never_encoded,
						fx_setup_one, fx_teardown),
		cmocka_unit_test_setup_teardown(test_promoted_jobs_are_taken_first_in_promotion_order,
						fx_setup_one, fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
