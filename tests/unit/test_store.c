/*
 * test_store.c — unit tests for the shard store (fs/store/store.c).
 *
 * Every test works on a real store directory (arena file, sqlite index and
 * lock file) in a fresh mkdtemp() directory under /dev/shm, like production.
 * The fixture closes the store and removes the directory after each test.
 *
 * Shards are made the way ingest makes them: bytes are written into an arena
 * range through arena_base(), hashed with hwfs_hash_buf() and interned.
 * Persistence is tested through the index exactly as a seal does it: a small
 * hwfs_vrec whose file extents reference the shards, plus their arena
 * locations, goes through index_put_version(); after store_close() and a
 * reopen the shards must be back at the same offsets with intact bytes.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store.h"
#include "tmpdir.h"

#define CAP (16ull << 20)

struct fx {
	char dir[64];
	struct store *s;
};

static int fx_setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/dev/shm/hwfs-test-store-XXXXXX");
	if (!mkdtemp(f->dir)) {
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;

	store_close(f->s);
	rm_rf(f->dir);
	free(f);
	return 0;
}

static struct store *fx_open(struct fx *f, uint64_t cap)
{
	store_close(f->s);
	f->s = NULL;
	assert_int_equal(store_open(f->dir, cap, &f->s), 0);
	assert_non_null(f->s);
	return f->s;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 12345u;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (uint8_t)x;
	}
}

/* Stage @n bytes of pattern @seed in a fresh arena range; return its offset and hash. */
static uint64_t stage(struct store *s, size_t n, uint32_t seed, hwfs_hash_t *h)
{
	struct arena *a = store_arena(s);
	uint64_t off = UINT64_MAX;

	assert_int_equal(arena_alloc(a, n, &off), 0);
	fill(arena_base(a) + off, n, seed);
	hwfs_hash_buf(arena_base(a) + off, n, h);
	return off;
}

/* Stage and intern; the shard must be new. */
static struct shard *make_shard(struct store *s, size_t n, uint32_t seed)
{
	hwfs_hash_t h;
	uint64_t off = stage(s, n, seed, &h);
	int adopted = -1;
	struct shard *sh = store_intern(s, &h, off, n, &adopted);

	assert_non_null(sh);
	assert_int_equal(adopted, 1);
	assert_int_equal(sh->off, off);
	assert_int_equal(sh->size, n);
	assert_int_equal(sh->refs, 1);
	assert_memory_equal(sh->hash.b, h.b, HWFS_HASH_LEN);
	return sh;
}

static void usage_is(struct store *s, uint64_t bytes, uint64_t count)
{
	uint64_t b = 12345, c = 12345;

	store_usage(s, &b, &c);
	assert_int_equal(b, bytes);
	assert_int_equal(c, count);
}

static void test_open_new(void **state)
{
	struct fx *f = *state;
	char sub[128], p[192], buf[32] = "";
	struct stat st;
	struct store *s;
	char *real;
	int fd;
	ssize_t n;

	/* A directory that does not exist yet is created. */
	snprintf(sub, sizeof(sub), "%s/new", f->dir);
	assert_int_equal(store_open(sub, CAP, &f->s), 0);
	s = f->s;
	real = realpath(sub, NULL);
	assert_non_null(real);
	assert_string_equal(store_dir(s), real);
	free(real);
	assert_non_null(store_arena(s));
	assert_int_equal(arena_capacity(store_arena(s)), CAP);
	assert_int_equal(arena_used(store_arena(s)), 0);
	usage_is(s, 0, 0);

	snprintf(p, sizeof(p), "%s/arena", sub);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal((uint64_t)st.st_size, CAP);
	snprintf(p, sizeof(p), "%s/index.db", sub);
	assert_int_equal(stat(p, &st), 0);
	snprintf(p, sizeof(p), "%s/lock", sub);
	fd = open(p, O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	assert_true(n > 0);
	assert_int_equal(atoi(buf), (int)getpid());
}

static void test_intern_twice(void **state)
{
	struct fx *f = *state;
	struct store *s = fx_open(f, CAP);
	struct arena *a = store_arena(s);
	const size_t n = 10000;
	struct shard *sh, *sh2;
	hwfs_hash_t h, h2;
	uint64_t off1, off2;
	int adopted = -1;

	off1 = stage(s, n, 7, &h);
	sh = store_intern(s, &h, off1, n, &adopted);
	assert_non_null(sh);
	assert_int_equal(adopted, 1);
	assert_int_equal(sh->refs, 1);
	assert_int_equal(sh->off, off1);
	assert_int_equal(sh->size, n);
	usage_is(s, n, 1);
	assert_int_equal(arena_used(a), n);

	/* Same bytes in another range: the existing shard gets the reference. */
	off2 = stage(s, n, 7, &h2);
	assert_int_not_equal(off1, off2);
	assert_memory_equal(h.b, h2.b, HWFS_HASH_LEN);
	adopted = -1;
	sh2 = store_intern(s, &h2, off2, n, &adopted);
	assert_ptr_equal(sh2, sh);
	assert_int_equal(adopted, 0);
	assert_int_equal(sh->refs, 2);
	assert_int_equal(sh->off, off1); /* not moved to the duplicate's range */
	usage_is(s, n, 1);
	/* The caller still owns the duplicate range. */
	assert_int_equal(arena_used(a), 2 * n);
	arena_free(a, off2, n);
	assert_int_equal(arena_used(a), n);

	assert_ptr_equal(store_lookup(s, &h), sh);
	assert_int_equal(sh->refs, 2); /* lookup takes no reference */

	store_unref(s, sh);
	assert_int_equal(sh->refs, 1);
	assert_ptr_equal(store_lookup(s, &h), sh);
	assert_int_equal(arena_used(a), n);

	store_unref(s, sh);
	assert_null(store_lookup(s, &h));
	usage_is(s, 0, 0);
	assert_int_equal(arena_used(a), 0);
	/* The whole arena is one free run again. */
	assert_int_equal(arena_alloc(a, CAP, &off1), 0);
	assert_int_equal(off1, 0);
	arena_free(a, 0, CAP);
}

static void test_get_ref_unref(void **state)
{
	struct fx *f = *state;
	struct store *s = fx_open(f, CAP);
	struct arena *a = store_arena(s);
	struct shard *sh = make_shard(s, 5000, 1);
	hwfs_hash_t h = sh->hash, other;

	hwfs_hash_buf("nothing", 7, &other);
	assert_null(store_get(s, &other));
	assert_null(store_lookup(s, &other));

	assert_ptr_equal(store_get(s, &h), sh);
	assert_int_equal(sh->refs, 2);
	store_ref(s, sh);
	assert_int_equal(sh->refs, 3);
	store_unref(s, sh);
	store_unref(s, sh);
	assert_int_equal(sh->refs, 1);
	assert_int_equal(arena_used(a), 5000);
	store_unref(s, sh);
	assert_null(store_get(s, &h));
	assert_int_equal(arena_used(a), 0);
	usage_is(s, 0, 0);
}

static void test_usage(void **state)
{
	struct fx *f = *state;
	struct store *s = fx_open(f, CAP);
	struct arena *a = store_arena(s);
	static const size_t sizes[] = {1, 4095, 4096, 4097, 65536, 100003, 1 << 20};
	struct shard *sh[HWFS_ARRAY_SIZE(sizes)];
	uint64_t total = 0;

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(sizes); i++) {
		sh[i] = make_shard(s, sizes[i], (uint32_t)(100 + i));
		total += sizes[i];
		usage_is(s, total, i + 1);
	}
	assert_int_equal(arena_used(a), total);
	/* Freeing every other shard; usage and arena follow exactly. */
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(sizes); i += 2) {
		store_unref(s, sh[i]);
		total -= sizes[i];
	}
	usage_is(s, total, HWFS_ARRAY_SIZE(sizes) / 2);
	assert_int_equal(arena_used(a), total);
	for (size_t i = 1; i < HWFS_ARRAY_SIZE(sizes); i += 2) {
		uint8_t *want = malloc(sizes[i]);

		assert_non_null(want);
		fill(want, sizes[i], (uint32_t)(100 + i));
		assert_memory_equal(store_shard_data(s, sh[i]), want, sizes[i]);
		free(want);
		store_unref(s, sh[i]);
	}
	usage_is(s, 0, 0);
	assert_int_equal(arena_used(a), 0);
}

/* Many shards: the table grows past its initial size and finds them all. */
static void test_many_shards(void **state)
{
	struct fx *f = *state;
	struct store *s = fx_open(f, CAP);
	enum { N = 3000 };
	struct shard **sh = calloc(N, sizeof(*sh));

	assert_non_null(sh);
	for (int i = 0; i < N; i++)
		sh[i] = make_shard(s, 17 + (size_t)(i % 50), (uint32_t)i + 1);
	for (int i = 0; i < N; i++) {
		assert_ptr_equal(store_lookup(s, &sh[i]->hash), sh[i]);
		assert_int_equal(sh[i]->refs, 1);
	}
	{
		uint64_t b, c;

		store_usage(s, &b, &c);
		assert_int_equal(c, N);
	}
	for (int i = 0; i < N; i++)
		store_unref(s, sh[i]);
	usage_is(s, 0, 0);
	assert_int_equal(arena_used(store_arena(s)), 0);
	free(sh);
}

static void test_ebusy(void **state)
{
	struct fx *f = *state;
	struct store *s2 = (struct store *)0x1;

	fx_open(f, CAP);
	assert_int_equal(store_open(f->dir, CAP, &s2), -EBUSY);
	assert_ptr_equal(s2, (struct store *)0x1); /* untouched on failure */
	assert_int_equal(store_open(f->dir, 0, &s2), -EBUSY);
	store_close(f->s);
	f->s = NULL;
	/* Released by close. */
	assert_int_equal(store_open(f->dir, 0, &s2), 0);
	f->s = s2;
}

/* ---- persistence ---- */

struct pshard {
	size_t len;
	uint32_t seed;
	struct shard *sh;
	uint64_t off;
	hwfs_hash_t hash;
};

/* A version with one file "data.bin" whose extents are the shards in order. */
static void persist(struct store *s, const char *name, struct pshard *ps, size_t n)
{
	struct hwfs_vrec *v = calloc(1, sizeof(*v));
	struct hwfs_shardloc *locs = calloc(n, sizeof(*locs));
	struct hwfs_frec *fr;
	uint64_t off = 0;
	int r;

	assert_non_null(v);
	assert_non_null(locs);
	v->name = strdup(name);
	v->state = HWFS_V_SEALED;
	v->seq = 1;
	v->created_ns = 1;
	v->sealed_ns = 2;
	hwfs_hash_buf(name, strlen(name), &v->digest);
	v->n_files = 1;
	v->files = calloc(1, sizeof(*v->files));
	assert_non_null(v->files);
	fr = &v->files[0];
	fr->path = strdup("data.bin");
	fr->kind = HWFS_K_REG;
	fr->mode = 0644;
	fr->n_ext = n;
	fr->ext = calloc(n, sizeof(*fr->ext));
	assert_non_null(fr->ext);
	for (size_t i = 0; i < n; i++) {
		fr->ext[i] = (struct hwfs_extent){off, ps[i].len, ps[i].sh->hash};
		off += ps[i].len;
		locs[i] = (struct hwfs_shardloc){ps[i].sh->hash, ps[i].sh->off, ps[i].sh->size};
	}
	fr->size = off;
	r = store_put_version(s, v, locs, n);
	assert_int_equal(r, 0);
	hwfs_vrec_free(v);
	free(locs);
}

static void check_bytes(struct store *s, const struct shard *sh, size_t len, uint32_t seed)
{
	uint8_t *want = malloc(len ? len : 1);

	assert_non_null(want);
	fill(want, len, seed);
	assert_memory_equal(store_shard_data(s, sh), want, len);
	free(want);
}

static void test_persist_reopen(void **state)
{
	struct fx *f = *state;
	struct store *s = fx_open(f, CAP);
	struct pshard ps[] = {
		{100000, 11, NULL, 0, {{0}}},
		{4096, 12, NULL, 0, {{0}}},
		{777, 13, NULL, 0, {{0}}},
		{1 << 20, 14, NULL, 0, {{0}}},
	};
	const size_t n = HWFS_ARRAY_SIZE(ps);
	struct shard *loose;
	uint64_t total = 0, off;
	hwfs_hash_t loose_hash;
	struct hwfs_vrec **vs = NULL;
	char *cur = NULL;
	size_t nv = 0;

	for (size_t i = 0; i < n; i++) {
		ps[i].sh = make_shard(s, ps[i].len, ps[i].seed);
		ps[i].off = ps[i].sh->off;
		ps[i].hash = ps[i].sh->hash;
		total += ps[i].len;
	}
	/* Interned but never persisted: must not come back. */
	loose = make_shard(s, 5555, 99);
	loose_hash = loose->hash;
	persist(s, "v1", ps, n);

	store_close(f->s);
	f->s = NULL;
	s = fx_open(f, 0); /* 0: keep the existing size */
	assert_int_equal(arena_capacity(store_arena(s)), CAP);
	usage_is(s, total, n);
	assert_int_equal(arena_used(store_arena(s)), total);
	for (size_t i = 0; i < n; i++) {
		struct shard *sh = store_lookup(s, &ps[i].hash);

		assert_non_null(sh);
		assert_int_equal(sh->off, ps[i].off);
		assert_int_equal(sh->size, ps[i].len);
		assert_int_equal(sh->refs, 0); /* refcounts are not persisted */
		check_bytes(s, sh, ps[i].len, ps[i].seed);
		ps[i].sh = sh;
	}
	assert_null(store_lookup(s, &loose_hash));

	/* The version is in the index. */
	assert_int_equal(store_load_versions(s, &vs, &nv, &cur), 0);
	assert_null(cur); /* nothing committed */
	assert_int_equal(nv, 1);
	assert_string_equal(vs[0]->name, "v1");
	assert_int_equal(vs[0]->n_files, 1);
	assert_int_equal(vs[0]->files[0].n_ext, n);
	for (size_t i = 0; i < n; i++)
		assert_memory_equal(vs[0]->files[0].ext[i].hash.b, ps[i].hash.b, HWFS_HASH_LEN);
	hwfs_vrec_free(vs[0]);
	free(vs);

	/* New allocations do not overlap the reloaded shards. */
	assert_int_equal(arena_alloc(store_arena(s), CAP - total, &off), -ENOSPC);
	{
		uint64_t o;
		size_t len = 200000;

		assert_int_equal(arena_alloc(store_arena(s), len, &o), 0);
		for (size_t i = 0; i < n; i++)
			assert_true(o + len <= ps[i].off || ps[i].off + ps[i].len <= o);
		arena_free(store_arena(s), o, len);
	}

	/* A version references shard 1 and 3; the rest are dropped. */
	assert_ptr_equal(store_get(s, &ps[1].hash), ps[1].sh);
	store_ref(s, ps[3].sh);
	assert_int_equal(store_drop_unreferenced(s), 2);
	assert_null(store_lookup(s, &ps[0].hash));
	assert_null(store_lookup(s, &ps[2].hash));
	assert_ptr_equal(store_lookup(s, &ps[1].hash), ps[1].sh);
	assert_ptr_equal(store_lookup(s, &ps[3].hash), ps[3].sh);
	usage_is(s, ps[1].len + ps[3].len, 2);
	assert_int_equal(arena_used(store_arena(s)), ps[1].len + ps[3].len);
	check_bytes(s, ps[1].sh, ps[1].len, ps[1].seed);
	check_bytes(s, ps[3].sh, ps[3].len, ps[3].seed);
	assert_int_equal(store_drop_unreferenced(s), 0);

	/* Interning the same bytes again finds the reloaded shard. */
	{
		hwfs_hash_t h;
		uint64_t o = stage(s, ps[1].len, ps[1].seed, &h);
		int adopted = -1;

		assert_ptr_equal(store_intern(s, &h, o, ps[1].len, &adopted), ps[1].sh);
		assert_int_equal(adopted, 0);
		assert_int_equal(ps[1].sh->refs, 2);
		arena_free(store_arena(s), o, ps[1].len);
		store_unref(s, ps[1].sh);
	}
	store_unref(s, ps[1].sh);
	store_unref(s, ps[3].sh);
	usage_is(s, 0, 0);
	assert_int_equal(arena_used(store_arena(s)), 0);
}

/* After drop_unreferenced everything is free: a reopen finds nothing. */
static void test_drop_all_after_reopen(void **state)
{
	struct fx *f = *state;
	struct store *s = fx_open(f, CAP);
	struct pshard ps[] = {
		{3000, 21, NULL, 0, {{0}}},
		{3000, 22, NULL, 0, {{0}}},
	};

	for (size_t i = 0; i < 2; i++)
		ps[i].sh = make_shard(s, ps[i].len, ps[i].seed);
	persist(s, "v", ps, 2);
	store_close(f->s);
	f->s = NULL;
	s = fx_open(f, CAP);
	usage_is(s, 6000, 2);
	assert_int_equal(store_drop_unreferenced(s), 2);
	usage_is(s, 0, 0);
	assert_int_equal(arena_used(store_arena(s)), 0);
}

/* Concurrent intern/unref of the same few hashes keeps the counts exact. */
struct thr {
	struct store *s;
	hwfs_hash_t h[4];
	uint64_t len;
	int errors;
};

static void *thr_main(void *arg)
{
	struct thr *t = arg;
	struct arena *a = store_arena(t->s);

	for (int i = 0; i < 2000; i++) {
		const hwfs_hash_t *h = &t->h[i % 4];
		uint64_t off;
		int adopted = -1;
		struct shard *sh;

		if (arena_alloc(a, t->len, &off) < 0) {
			t->errors++;
			continue;
		}
		sh = store_intern(t->s, h, off, t->len, &adopted);
		if (!sh) {
			t->errors++;
			continue;
		}
		if (!adopted)
			arena_free(a, off, t->len);
		if (sh->size != t->len)
			t->errors++;
		store_unref(t->s, sh);
	}
	return NULL;
}

static void test_threads(void **state)
{
	struct fx *f = *state;
	struct store *s = fx_open(f, CAP);
	struct thr t[4];
	pthread_t th[4];

	for (int i = 0; i < 4; i++) {
		t[i].s = s;
		t[i].len = 4096;
		t[i].errors = 0;
		for (int k = 0; k < 4; k++)
			hwfs_hash_buf(&k, sizeof(k), &t[i].h[k]);
		assert_int_equal(pthread_create(&th[i], NULL, thr_main, &t[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		assert_int_equal(t[i].errors, 0);
	}
	usage_is(s, 0, 0);
	assert_int_equal(arena_used(store_arena(s)), 0);
}

/*
 * --capacity against the room (issue 26): past the filesystem refused with
 * both sizes; in memory and past the free RAM and swap a warning with the
 * numbers (what the arena holds already not counted again); else nothing.
 */
static void test_capacity_verdict(void **state)
{
	const uint64_t G = 1ull << 30;
	struct store_room disk = {.fs_bytes = 100 * G, .mem_free = 1 * G};
	struct store_room shm = {.fs_bytes = 100 * G, .in_memory = 1, .mem_free = 20 * G};
	char msg[512];

	(void)state;
	assert_int_equal(store_capacity_verdict(50 * G, &disk, msg, sizeof(msg)), 0);
	assert_string_equal(msg, "");
	assert_int_equal(store_capacity_verdict(100 * G, &disk, msg, sizeof(msg)), 0);
	assert_int_equal(store_capacity_verdict(101 * G, &disk, msg, sizeof(msg)), -EFBIG);
	assert_non_null(strstr(msg, "--capacity 101.00 GiB is larger than the filesystem holding "
				    "the store (100.00 GiB)"));
	/* a disk store is never judged against memory */
	assert_int_equal(store_capacity_verdict(90 * G, &disk, msg, sizeof(msg)), 0);
	assert_int_equal(store_capacity_verdict(20 * G, &shm, msg, sizeof(msg)), 0);
	assert_int_equal(store_capacity_verdict(21 * G, &shm, msg, sizeof(msg)), 1);
	assert_non_null(strstr(msg, "--capacity 21.00 GiB: the store is in memory (tmpfs) and "
				    "only 20.00 GiB of RAM and swap is free"));
	assert_null(strstr(msg, "holds already"));
	shm.resident = 4 * G; /* the arena's own pages are not free memory, nor needed again */
	assert_int_equal(store_capacity_verdict(24 * G, &shm, msg, sizeof(msg)), 0);
	assert_int_equal(store_capacity_verdict(25 * G, &shm, msg, sizeof(msg)), 1);
	assert_non_null(strstr(msg, "besides the 4.00 GiB the arena holds already"));
	assert_int_equal(store_capacity_verdict(101 * G, &shm, msg, sizeof(msg)), -EFBIG);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_open_new),
		T(test_intern_twice),
		T(test_get_ref_unref),
		T(test_usage),
		T(test_many_shards),
		T(test_ebusy),
		T(test_persist_reopen),
		T(test_drop_all_after_reopen),
		T(test_threads),
		cmocka_unit_test(test_capacity_verdict),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
