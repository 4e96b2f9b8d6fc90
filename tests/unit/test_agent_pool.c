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
 * cancelled job does not run, and many jobs of different shards all come
 * back (run under ThreadSanitizer by `make tsan`'s unit binaries).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_i.h"
#include "agent_pool.h"
#include "tmpdir.h"

#define LEN (1u << 20) /* bytes per shard: above few_changed()'s probe threshold */

struct fx {
	char dir[64];
	struct store *s;
	struct delta_stats ds;
	struct pool *p;
};

/* A store (preallocated with @prealloc: rebuilds go straight into the arena) and a pool. */
static int fx_open(void **state, int prealloc)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (!f || hwfs_tunables_load(NULL, 0) < 0)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/dev/shm/hwfs-test-pool-XXXXXX");
	if (!mkdtemp(f->dir) || store_open(f->dir, 64ull << 20, &f->s) < 0 ||
	    (prealloc && arena_preallocate(store_arena(f->s), 0) < 0) ||
	    pool_new(f->s, 2, 1, &f->ds, &f->p) < 0)
		return -1;
	*state = f;
	return 0;
}

static int fx_setup(void **state)
{
	return fx_open(state, 0);
}

static int fx_setup_prealloc(void **state)
{
	return fx_open(state, 1);
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;

	pool_free(f->p);
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
	assert_int_equal(k->r, -E2BIG); /* every element differs: the probe says so, no encode */
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

static void test_cancelled_jobs_do_not_run_and_many_come_back(void **state)
{
	struct fx *f = *state;
	struct shard *bsh, *sh;
	uint8_t *n;
	struct pool_job *all;
	size_t ok = 0, cancelled = 0;

	pair(f, 1000, &bsh, &sh, &n);
	for (int i = 0; i < 16; i++) {
		struct pool_job *e = calloc(1, sizeof(*e));

		store_ref(f->s, bsh);
		store_ref(f->s, sh);
		*e = (struct pool_job){.kind = POOL_ENCODE, .id = (uint64_t)i + 1, .ahead = i % 2,
				       .cancel = i % 4 == 3, .bsh = bsh, .sh = sh, .base = bsh->hash,
				       .hash = sh->hash, .width = 2, .size = LEN};
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
			cancelled++;
		} else {
			assert_int_equal(j->r, 0);
			ok++;
		}
		pool_job_free(f->s, j);
	}
	assert_int_equal(cancelled, 4);
	assert_int_equal(ok, 12);
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
		cmocka_unit_test_setup_teardown(test_cancelled_jobs_do_not_run_and_many_come_back,
						fx_setup, fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
