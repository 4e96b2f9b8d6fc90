/*
 * test_arena.c — unit tests for the shard arena (fs/store/arena.c).
 *
 * Every test works on a real arena file in a fresh mkdtemp() directory under
 * /dev/shm (tmpfs, like production), so fallocate(), hole punching and the
 * shared mapping are the real thing.  The fixture closes the arena and
 * removes the file and directory after each test, pass or fail.
 *
 * The free list itself is private, so coalescing is observed from outside: a
 * single allocation of the whole capacity succeeds only when every freed
 * piece merged back into one run.  Punching is observed through the mapping
 * (a punched page reads as zeros) and st_blocks.  The randomized test drives
 * a small arena with a fixed-seed PRNG against a byte-map model that predicts
 * the exact first-fit offset of every allocation, the outcome of every
 * extend/reserve, the used counter, and checks that live bytes keep the
 * pattern written into them (so a wrong punch or an overlap shows up).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "arena.h"

struct fx {
	char dir[64];
	char path[128];
	struct arena *a;
	uint64_t P; /* page size */
};

static int fx_setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/dev/shm/hwfs-test-arena-XXXXXX");
	if (!mkdtemp(f->dir)) {
		free(f);
		return -1;
	}
	snprintf(f->path, sizeof(f->path), "%s/arena", f->dir);
	f->P = (uint64_t)sysconf(_SC_PAGESIZE);
	*state = f;
	return 0;
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;

	arena_close(f->a);
	unlink(f->path);
	rmdir(f->dir);
	free(f);
	return 0;
}

static struct arena *fx_open(struct fx *f, uint64_t cap)
{
	arena_close(f->a);
	f->a = NULL;
	assert_int_equal(arena_open(f->path, cap, &f->a), 0);
	assert_non_null(f->a);
	return f->a;
}

static uint64_t file_size(const char *path)
{
	struct stat st;

	assert_int_equal(stat(path, &st), 0);
	return (uint64_t)st.st_size;
}

static uint64_t file_blocks(const char *path)
{
	struct stat st;

	assert_int_equal(stat(path, &st), 0);
	return (uint64_t)st.st_blocks;
}

static uint64_t must_alloc(struct arena *a, uint64_t len)
{
	uint64_t off = UINT64_MAX;

	assert_int_equal(arena_alloc(a, len, &off), 0);
	return off;
}

static int range_is(const uint8_t *p, size_t n, uint8_t v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

/*
 * Compare file bytes through pread(): reading a hole through a MAP_SHARED
 * tmpfs mapping would fault a fresh page in, pread() of a hole does not.
 */
static int file_range_is(int fd, uint64_t off, size_t n, uint8_t v)
{
	uint8_t *buf = malloc(n);
	int ok;

	assert_non_null(buf);
	assert_int_equal(pread(fd, buf, n, (off_t)off), (ssize_t)n);
	ok = range_is(buf, n, v);
	free(buf);
	return ok;
}

/* ---- open ---- */

static void test_open_sizes(void **state)
{
	struct fx *f = *state;
	struct arena *a = NULL;
	uint64_t P = f->P;
	char bad[160];

	assert_int_equal(arena_open(f->path, 0, &a), -EINVAL);
	assert_null(a);
	snprintf(bad, sizeof(bad), "%s/nope/arena", f->dir);
	assert_int_equal(arena_open(bad, 4 * P, &a), -ENOENT);
	assert_null(a);

	a = fx_open(f, 16 * P);
	assert_int_equal(arena_capacity(a), 16 * P);
	assert_int_equal(file_size(f->path), 16 * P);
	assert_int_equal(arena_used(a), 0);
	assert_true(arena_fd(a) >= 0);
	assert_non_null(arena_base(a));
	/* the whole mapping is usable */
	arena_base(a)[16 * P - 1] = 7;

	/* a larger file keeps its size and capacity follows it */
	a = fx_open(f, 4 * P);
	assert_int_equal(arena_capacity(a), 16 * P);
	assert_int_equal(file_size(f->path), 16 * P);
	assert_int_equal(arena_base(a)[16 * P - 1], 7);

	/* a smaller file is grown */
	a = fx_open(f, 32 * P + 100);
	assert_int_equal(arena_capacity(a), 32 * P + 100);
	assert_int_equal(file_size(f->path), 32 * P + 100);
	assert_int_equal(arena_used(a), 0);
	/* initially everything is free */
	assert_int_equal(must_alloc(a, 32 * P + 100), 0);

	arena_close(NULL);
}

/* ---- alloc ---- */

static void test_alloc_alignment(void **state)
{
	struct fx *f = *state;
	struct arena *a = fx_open(f, 16 * f->P);
	uint64_t P = f->P, off = 12345;

	assert_int_equal(arena_alloc(a, 0, &off), -EINVAL);
	assert_int_equal(off, 12345);

	/* an unaligned hole at the front: the allocation starts on the next page */
	assert_int_equal(arena_reserve(a, 0, 10), 0);
	off = must_alloc(a, 5);
	assert_int_equal(off, P);
	/* ...and the unaligned head [10, P) stayed free */
	assert_int_equal(arena_reserve(a, 10, P - 10), 0);

	/* byte-sized allocations each start on their own page */
	assert_int_equal(must_alloc(a, 1), 2 * P);
	assert_int_equal(must_alloc(a, P + 1), 3 * P);
	assert_int_equal(must_alloc(a, 100), 5 * P);
	assert_int_equal(must_alloc(a, P), 6 * P);
	for (int i = 0; i < 8; i++)
		assert_int_equal(must_alloc(a, 1 + (uint64_t)i * 77) % P, 0);
	assert_int_equal(arena_used(a), P + 5 + 1 + (P + 1) + 100 + P + 8 + 77 * 28);
}

static void test_first_fit_reuse(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P;
	struct arena *a = fx_open(f, 8 * P);

	assert_int_equal(must_alloc(a, P), 0);
	assert_int_equal(must_alloc(a, P), P);
	assert_int_equal(must_alloc(a, P), 2 * P);

	arena_free(a, P, P);
	assert_int_equal(must_alloc(a, P), P); /* the hole, not the tail */
	arena_free(a, 0, P);
	assert_int_equal(must_alloc(a, 2 * P), 3 * P); /* hole at 0 too small */
	assert_int_equal(must_alloc(a, 10), 0);         /* but it is first for this */
	assert_int_equal(must_alloc(a, P), 5 * P);
	assert_int_equal(arena_used(a), 10 + 5 * P);
}

static void test_coalesce_orders(void **state)
{
	static const int order[6][3] = {
		{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0},
	};
	struct fx *f = *state;
	uint64_t P = f->P;
	struct arena *a = fx_open(f, 3 * P);

	/* three page-sized neighbours */
	for (int o = 0; o < 6; o++) {
		uint64_t off[3];

		for (int i = 0; i < 3; i++)
			off[i] = must_alloc(a, P);
		assert_int_equal(off[0], 0);
		assert_int_equal(off[1], P);
		assert_int_equal(off[2], 2 * P);
		for (int i = 0; i < 3; i++)
			arena_free(a, off[order[o][i]], P);
		assert_int_equal(arena_used(a), 0);
		assert_int_equal(must_alloc(a, 3 * P), 0);
		arena_free(a, 0, 3 * P);
	}

	/* three byte-granular pieces of one allocation */
	for (int o = 0; o < 6; o++) {
		const uint64_t s[3] = {0, 100, 5000}, e[3] = {100, 5000, 3 * P};

		assert_int_equal(must_alloc(a, 3 * P), 0);
		for (int i = 0; i < 3; i++)
			arena_free(a, s[order[o][i]], e[order[o][i]] - s[order[o][i]]);
		assert_int_equal(arena_used(a), 0);
		assert_int_equal(must_alloc(a, 3 * P), 0);
		arena_free(a, 0, 3 * P);
	}
}

/* ---- extend ---- */

static void test_extend(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P;
	struct arena *a = fx_open(f, 4 * P);
	uint64_t A, B;

	A = must_alloc(a, 100);
	assert_int_equal(A, 0);
	assert_int_equal(arena_extend(a, A, 100, 100), 0);
	assert_int_equal(arena_extend(a, A, 100, P), 0); /* into the unaligned tail */
	assert_int_equal(arena_extend(a, A, P, 2 * P), 0);
	assert_int_equal(arena_used(a), 2 * P);
	B = must_alloc(a, P);
	assert_int_equal(B, 2 * P);

	/* blocked by B: fails and changes nothing */
	assert_int_equal(arena_extend(a, A, 2 * P, 2 * P + 1), -ENOSPC);
	assert_int_equal(arena_used(a), 3 * P);
	/* up to the end of the arena, not beyond */
	assert_int_equal(arena_extend(a, B, P, 2 * P + 1), -ENOSPC);
	assert_int_equal(arena_used(a), 3 * P);
	assert_int_equal(arena_extend(a, B, P, 2 * P), 0);
	assert_int_equal(arena_used(a), 4 * P);
	assert_int_equal(arena_extend(a, B, 2 * P, 2 * P + 1), -ENOSPC);

	/* the free run after B is there but too short */
	arena_free(a, 3 * P, P);
	assert_int_equal(arena_reserve(a, 3 * P + 100, 100), 0);
	assert_int_equal(arena_extend(a, B, P, P + 101), -ENOSPC);
	assert_int_equal(arena_used(a), 3 * P + 100);
	assert_int_equal(arena_extend(a, B, P, P + 100), 0);
	assert_int_equal(arena_used(a), 3 * P + 200);
	/* the extension is really in use now */
	assert_int_equal(arena_reserve(a, 3 * P + 99, 1), -EEXIST);

	/* a range whose next byte is allocated cannot extend, free run elsewhere */
	arena_free(a, 3 * P + 200, P - 200);
	assert_int_equal(arena_extend(a, 0, P, P + 1), -ENOSPC);
	assert_int_equal(arena_used(a), 3 * P + 200);
}

/* ---- reserve ---- */

static void test_reserve(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P, off;
	struct arena *a = fx_open(f, 4 * P);

	assert_int_equal(arena_reserve(a, 100, 100), 0);
	assert_int_equal(arena_used(a), 100);
	assert_int_equal(arena_reserve(a, 150, 100), -EEXIST);
	assert_int_equal(arena_reserve(a, 50, 51), -EEXIST);
	assert_int_equal(arena_reserve(a, 199, 1), -EEXIST);
	assert_int_equal(arena_reserve(a, 0, 4 * P), -EEXIST);
	assert_int_equal(arena_used(a), 100);

	assert_int_equal(arena_reserve(a, 4 * P - 1, 2), -ERANGE);
	assert_int_equal(arena_reserve(a, 4 * P, 1), -ERANGE);
	assert_int_equal(arena_reserve(a, UINT64_MAX, 2), -ERANGE);
	assert_int_equal(arena_reserve(a, 1, UINT64_MAX), -ERANGE);
	assert_int_equal(arena_used(a), 100);

	/* split a run: [0,100) and [200, 4P) stay free */
	assert_int_equal(arena_reserve(a, 2 * P, P), 0);
	off = must_alloc(a, P);
	assert_int_equal(off, P);
	assert_int_equal(arena_reserve(a, 0, 100), 0);
	assert_int_equal(arena_reserve(a, 200, P - 200), 0);
	assert_int_equal(arena_reserve(a, 3 * P, P), 0);
	assert_int_equal(arena_used(a), 4 * P);
	assert_int_equal(arena_alloc(a, 1, &off), -ENOSPC);

	arena_free(a, 0, 4 * P);
	assert_int_equal(arena_used(a), 0);
	assert_int_equal(must_alloc(a, 4 * P), 0);
}

/* ---- full ---- */

static void test_enospc_full(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P, off = 4242;
	struct arena *a = fx_open(f, 4 * P);

	assert_int_equal(must_alloc(a, 4 * P), 0);
	assert_int_equal(arena_alloc(a, 1, &off), -ENOSPC);
	assert_int_equal(off, 4242);
	assert_int_equal(arena_used(a), 4 * P);

	arena_free(a, P, P);
	assert_int_equal(arena_alloc(a, P + 1, &off), -ENOSPC);
	assert_int_equal(must_alloc(a, P), P);
	/* a free run long enough, but not from its first page boundary */
	arena_free(a, P + 1, 2 * P - 1);
	assert_int_equal(arena_alloc(a, P + 1, &off), -ENOSPC);
	assert_int_equal(must_alloc(a, P), 2 * P);
	assert_int_equal(arena_used(a), 3 * P + 1);
	assert_int_equal(arena_alloc(a, 5 * P, &off), -ENOSPC);
}

/*
 * The backing filesystem refuses the memory: a sparse arena bigger than the
 * whole tmpfs, and an allocation bigger than the tmpfs. tmpfs rejects that
 * fallocate() up front, so this costs no memory.
 */
static void test_enospc_backing(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P, total, off = 4242;
	struct statvfs sv;
	struct arena *a;

	assert_int_equal(statvfs(f->dir, &sv), 0);
	total = (uint64_t)sv.f_blocks * sv.f_frsize;
	if (total == 0 || total > (1ull << 44))
		skip();
	a = fx_open(f, total + 64 * P);
	assert_int_equal(arena_alloc(a, total + P, &off), -ENOSPC);
	assert_int_equal(off, 4242);
	assert_int_equal(arena_used(a), 0);
	/* the failed allocation was given back whole */
	assert_int_equal(must_alloc(a, P), 0);
	/* the same for an extension that the filesystem refuses */
	assert_int_equal(arena_extend(a, 0, P, total + 2 * P), -ENOSPC);
	assert_int_equal(arena_used(a), P);
	assert_int_equal(arena_extend(a, 0, P, 2 * P), 0);
	arena_free(a, P, P);
	assert_int_equal(arena_reserve(a, P, total + 63 * P), 0);
	arena_free(a, 0, total + 64 * P);
	assert_int_equal(arena_used(a), 0);
	assert_true(file_blocks(f->path) < 64 * P / 512);
}

/* ---- byte-granular free ---- */

static void test_free_subrange(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P;
	struct arena *a = fx_open(f, 4 * P);

	assert_int_equal(must_alloc(a, 3 * P), 0);
	arena_free(a, 100, 5000 - 100);
	assert_int_equal(arena_used(a), 3 * P - 4900);
	/* the hole [100, 5000) is reused from its first page boundary */
	if (P + 1 <= 5000) {
		assert_int_equal(must_alloc(a, 1), P);
		arena_free(a, P, 1);
	}
	assert_int_equal(arena_reserve(a, 99, 2), -EEXIST);
	assert_int_equal(arena_reserve(a, 4999, 2), -EEXIST);
	assert_int_equal(arena_reserve(a, 100, 4900), 0);
	arena_free(a, 100, 4900);

	arena_free(a, 0, 100);
	arena_free(a, 5000, 3 * P - 5000);
	assert_int_equal(arena_used(a), 0);
	assert_int_equal(must_alloc(a, 4 * P), 0);
}

static void test_double_free_ignored(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P;
	struct arena *a = fx_open(f, 4 * P);

	assert_int_equal(must_alloc(a, P), 0);
	arena_free(a, 0, 100);
	arena_free(a, 50, 100);    /* half free already: ignored */
	arena_free(a, 0, 100);     /* all free already: ignored */
	arena_free(a, P - 1, 2);   /* runs into the free tail: ignored */
	arena_free(a, 3 * P, 1);   /* never allocated: ignored */
	arena_free(a, 4 * P, 1);   /* outside: ignored */
	arena_free(a, 100, 0);     /* empty: no-op */
	assert_int_equal(arena_used(a), P - 100);
	assert_int_equal(arena_reserve(a, 100, 1), -EEXIST);
	arena_free(a, 100, P - 100);
	assert_int_equal(arena_used(a), 0);
	assert_int_equal(must_alloc(a, 4 * P), 0);
}

/* ---- used counter ---- */

static void test_used_counter(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P, A;
	struct arena *a = fx_open(f, 8 * P);

	assert_int_equal(arena_used(a), 0);
	A = must_alloc(a, 1);
	assert_int_equal(arena_used(a), 1);
	assert_int_equal(arena_reserve(a, 2 * P + 3, 10), 0);
	assert_int_equal(arena_used(a), 11);
	assert_int_equal(arena_extend(a, A, 1, 6), 0);
	assert_int_equal(arena_used(a), 16);
	arena_free(a, A + 2, 3);
	assert_int_equal(arena_used(a), 13);
	assert_int_equal(arena_extend(a, 2 * P + 3, 10, 8 * P), -ENOSPC);
	assert_int_equal(arena_reserve(a, 2 * P, 4), -EEXIST);
	assert_int_equal(arena_used(a), 13);
	arena_free(a, 2 * P + 3, 10);
	arena_free(a, A, 2);
	arena_free(a, A + 5, 1);
	assert_int_equal(arena_used(a), 0);
}

/* ---- persistence and punching ---- */

static void test_persist_across_reopen(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P, off, n = 2 * P + 123;
	struct arena *a = fx_open(f, 8 * P);
	uint8_t *buf;

	must_alloc(a, 1); /* so the interesting range is not at 0 */
	off = must_alloc(a, n);
	assert_int_equal(off, P);
	for (uint64_t i = 0; i < n; i++)
		arena_base(a)[off + i] = (uint8_t)(i * 7 + 1);
	arena_close(f->a);
	f->a = NULL;

	a = fx_open(f, 8 * P);
	assert_int_equal(arena_used(a), 0);
	assert_int_equal(arena_reserve(a, off, n), 0);
	for (uint64_t i = 0; i < n; i++)
		assert_int_equal(arena_base(a)[off + i], (uint8_t)(i * 7 + 1));
	/* the fd sees the same bytes */
	buf = malloc(n);
	assert_non_null(buf);
	assert_int_equal(pread(arena_fd(a), buf, n, (off_t)off), (ssize_t)n);
	assert_memory_equal(buf, arena_base(a) + off, n);
	free(buf);
	/* the reserved range is skipped by allocation */
	assert_int_equal(must_alloc(a, P), 0);
	assert_int_equal(must_alloc(a, P), 4 * P);
}

static void test_punch(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P, b0, b1;
	struct arena *a = fx_open(f, 4 * P);
	uint8_t *m = arena_base(a);
	int fd = arena_fd(a);

	assert_int_equal(must_alloc(a, 3 * P), 0);
	memset(m, 0xA5, 3 * P);
	b0 = file_blocks(f->path);
	assert_true(b0 >= 3 * P / 512);

	/* page 1 lies wholly inside the freed range; pages 0 and 2 do not */
	arena_free(a, 100, 2 * P + 50 - 100);
	b1 = file_blocks(f->path);
	assert_int_equal(b1 + P / 512, b0);
	assert_true(range_is(m, 100, 0xA5));
	assert_true(file_range_is(fd, P, P, 0));
	assert_true(range_is(m + 2 * P + 50, P - 50, 0xA5));

	/* now page 0 is wholly free and goes; page 2 keeps its live bytes */
	arena_free(a, 0, 100);
	assert_int_equal(file_blocks(f->path) + P / 512, b1);
	assert_true(file_range_is(fd, 0, P, 0));
	assert_true(range_is(m + 2 * P + 50, P - 50, 0xA5));

	arena_free(a, 2 * P + 50, P - 50);
	assert_int_equal(file_blocks(f->path), 0);
	assert_true(file_range_is(fd, 0, 4 * P, 0));
	assert_int_equal(arena_used(a), 0);
	/* reusing a punched page gives zeros, backed again */
	assert_int_equal(must_alloc(a, P), 0);
	assert_int_equal(file_blocks(f->path), P / 512);
	assert_true(range_is(m, P, 0));
}

/* a neighbour from another allocation shares the last page of the freed one */
static void test_punch_spares_neighbour(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P;
	struct arena *a = fx_open(f, 4 * P);
	uint8_t *m = arena_base(a);
	int fd = arena_fd(a);

	assert_int_equal(must_alloc(a, P + 100), 0);
	assert_int_equal(arena_reserve(a, P + 100, 100), 0);
	assert_int_equal(arena_reserve(a, P - 1, 1), -EEXIST);
	memset(m, 0x11, P + 100);
	memset(m + P + 100, 0x22, 100);

	arena_free(a, 0, P + 100);
	assert_true(file_range_is(fd, 0, P, 0));       /* page 0 punched */
	assert_true(range_is(m + P + 100, 100, 0x22)); /* neighbour intact */
	/* the neighbour's page keeps the freed bytes too (not punched) */
	assert_true(range_is(m + P, 100, 0x11));

	/* the other side: a live neighbour in front, in the same page */
	arena_free(a, P + 100, 100);
	assert_int_equal(arena_reserve(a, 2 * P, 10), 0);
	memset(m + 2 * P, 0x33, 10);
	assert_int_equal(arena_extend(a, 2 * P, 10, 2 * P), 0);
	memset(m + 2 * P + 10, 0x44, 2 * P - 10);
	arena_free(a, 2 * P + 10, 2 * P - 10);
	assert_true(range_is(m + 2 * P, 10, 0x33));
	assert_true(range_is(m + 2 * P + 10, P - 10, 0x44));
	assert_true(file_range_is(fd, 3 * P, P, 0));
	assert_int_equal(arena_used(a), 10);
}

/* ---- randomized, against a byte-map model ---- */

struct seg {
	uint64_t off, len;
};

static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1Dull;
}

static uint8_t pat(uint64_t i)
{
	return (uint8_t)(((i * 2654435761u) >> 13) | 1);
}

static int model_free(const uint8_t *used, uint64_t off, uint64_t len)
{
	return memchr(used + off, 1, len) == NULL;
}

/* Lowest page-aligned p with [p, p+len) free, or UINT64_MAX. */
static uint64_t model_first_fit(const uint8_t *used, uint64_t cap, uint64_t P, uint64_t len)
{
	uint64_t p = 0;

	while (p + len <= cap) {
		const uint8_t *hit = memchr(used + p, 1, len);

		if (!hit)
			return p;
		p = ((uint64_t)(hit - used) + 1 + P - 1) / P * P;
	}
	return UINT64_MAX;
}

static void model_mark(struct arena *a, uint8_t *used, uint64_t off, uint64_t len, uint8_t v)
{
	memset(used + off, v, len);
	if (v)
		for (uint64_t i = off; i < off + len; i++)
			arena_base(a)[i] = pat(i);
}

static void model_check(struct arena *a, const uint8_t *used, uint64_t cap, uint64_t nused)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < cap; i++) {
		if (!used[i])
			continue;
		n++;
		if (arena_base(a)[i] != pat(i))
			fail_msg("live byte %llu lost its pattern", (unsigned long long)i);
	}
	assert_int_equal(n, nused);
	assert_int_equal(arena_used(a), nused);
}

/*
 * Random allocations and frees checked against a model of the arena after
 * every step (long: the model and its checks are one loop, kept together).
 */
static void test_random_model(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P, cap = 32 * P + 1000, nused = 0;
	struct arena *a = fx_open(f, cap);
	uint8_t *used = calloc(cap, 1);
	struct seg *segs = NULL;
	size_t nseg = 0, maxseg = 0;
	int nalloc_ok = 0, nalloc_full = 0, next_ok = 0, next_fail = 0, nres_ok = 0, nfree = 0;
	int nbad = 0;

	assert_non_null(used);
	rng_state = 0x9E3779B97F4A7C15ull;
	for (int op = 0; op < 5000; op++) {
		uint64_t r = rnd() % 100, off = 0, len, exp;
		int ret;

		if (nseg + 2 > maxseg) {
			maxseg = maxseg ? 2 * maxseg : 64;
			segs = realloc(segs, maxseg * sizeof(*segs));
			assert_non_null(segs);
		}
		if (r < 40) {
			len = rnd() % 8 == 0 ? 1 + rnd() % (8 * P) : 1 + rnd() % (2 * P);
			exp = model_first_fit(used, cap, P, len);
			ret = arena_alloc(a, len, &off);
			if (exp == UINT64_MAX) {
				assert_int_equal(ret, -ENOSPC);
				nalloc_full++;
				continue;
			}
			assert_int_equal(ret, 0);
			assert_int_equal(off, exp);
			assert_int_equal(off % P, 0);
			assert_true(model_free(used, off, len));
			model_mark(a, used, off, len, 1);
			nused += len;
			segs[nseg++] = (struct seg){off, len};
			nalloc_ok++;
		} else if (r < 75) {
			size_t k;
			struct seg s;
			uint64_t lo, hi;

			if (!nseg)
				continue;
			k = rnd() % nseg;
			s = segs[k];
			if (rnd() % 2) {
				lo = s.off;
				hi = s.off + s.len;
			} else {
				lo = s.off + rnd() % s.len;
				hi = lo + 1 + rnd() % (s.off + s.len - lo);
			}
			arena_free(a, lo, hi - lo);
			model_mark(a, used, lo, hi - lo, 0);
			nused -= hi - lo;
			segs[k] = segs[--nseg];
			if (lo > s.off)
				segs[nseg++] = (struct seg){s.off, lo - s.off};
			if (hi < s.off + s.len)
				segs[nseg++] = (struct seg){hi, s.off + s.len - hi};
			nfree++;
		} else if (r < 87) {
			size_t k;
			uint64_t newlen;
			int ok;

			if (!nseg)
				continue;
			k = rnd() % nseg;
			newlen = segs[k].len + 1 + rnd() % (2 * P);
			ok = segs[k].off + newlen <= cap &&
			     model_free(used, segs[k].off + segs[k].len, newlen - segs[k].len);
			ret = arena_extend(a, segs[k].off, segs[k].len, newlen);
			if (!ok) {
				assert_int_equal(ret, -ENOSPC);
				next_fail++;
			} else {
				assert_int_equal(ret, 0);
				model_mark(a, used, segs[k].off + segs[k].len, newlen - segs[k].len, 1);
				nused += newlen - segs[k].len;
				segs[k].len = newlen;
				next_ok++;
			}
		} else if (r < 98) {
			off = rnd() % (cap + P);
			len = 1 + rnd() % (2 * P);
			ret = arena_reserve(a, off, len);
			if (off + len > cap) {
				assert_int_equal(ret, -ERANGE);
			} else if (!model_free(used, off, len)) {
				assert_int_equal(ret, -EEXIST);
			} else {
				assert_int_equal(ret, 0);
				model_mark(a, used, off, len, 1);
				nused += len;
				segs[nseg++] = (struct seg){off, len};
				nres_ok++;
			}
		} else if (nbad < 20) {
			/* a free that overlaps free bytes is ignored */
			off = rnd() % cap;
			len = 1 + rnd() % HWFS_MIN(2 * P, cap - off);
			if (model_free(used, off, len) || !memchr(used + off, 0, len))
				continue;
			arena_free(a, off, len);
			nbad++;
		}
		assert_int_equal(arena_used(a), nused);
		if (op % 64 == 0)
			model_check(a, used, cap, nused);
	}
	model_check(a, used, cap, nused);
	/* the mix really exercised every path */
	assert_true(nalloc_ok > 200 && nalloc_full > 20 && next_ok > 20 && next_fail > 20);
	assert_true(nres_ok > 20 && nfree > 200 && nbad > 5);

	while (nseg) {
		nseg--;
		arena_free(a, segs[nseg].off, segs[nseg].len);
		nused -= segs[nseg].len;
		assert_int_equal(arena_used(a), nused);
	}
	assert_int_equal(arena_used(a), 0);
	/* everything coalesced back into one run, and every page was punched */
	assert_int_equal(must_alloc(a, cap), 0);
	arena_free(a, 0, cap);
	assert_int_equal(file_blocks(f->path), 0);
	free(segs);
	free(used);
}

/* ---- threads ---- */

struct thr {
	struct arena *a;
	uint64_t seed;
	uint64_t P;
	int errors;
};

static void *thr_main(void *arg)
{
	struct thr *t = arg;
	uint64_t s = t->seed, offs[16] = {0}, lens[16] = {0};
	uint8_t tag = (uint8_t)(t->seed & 0xff) | 1;

	for (int i = 0; i < 2000; i++) {
		int k = i % 16;

		s = s * 6364136223846793005ull + 1442695040888963407ull;
		if (lens[k]) {
			if (!range_is(arena_base(t->a) + offs[k], lens[k], tag))
				t->errors++;
			arena_free(t->a, offs[k], lens[k]);
			lens[k] = 0;
		}
		lens[k] = 1 + (s >> 33) % (3 * t->P);
		if (arena_alloc(t->a, lens[k], &offs[k]) == 0)
			memset(arena_base(t->a) + offs[k], tag, lens[k]);
		else
			lens[k] = 0;
	}
	for (int k = 0; k < 16; k++) {
		if (!lens[k])
			continue;
		if (!range_is(arena_base(t->a) + offs[k], lens[k], tag))
			t->errors++;
		arena_free(t->a, offs[k], lens[k]);
	}
	return NULL;
}

static void test_threads(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P;
	struct arena *a = fx_open(f, 256 * P);
	struct thr t[4];
	pthread_t th[4];

	for (int i = 0; i < 4; i++) {
		t[i] = (struct thr){a, 0x1234567ull * (uint64_t)(i + 1), P, 0};
		assert_int_equal(pthread_create(&th[i], NULL, thr_main, &t[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		assert_int_equal(t[i].errors, 0);
	}
	assert_int_equal(arena_used(a), 0);
	assert_int_equal(must_alloc(a, 256 * P), 0);
}

/* ---- preallocate ---- */

/*
 * A preallocated arena holds every page from the start, keeps bytes written
 * before it was preallocated, and gives nothing back on free or trim.
 */
static void test_preallocate(void **state)
{
	struct fx *f = *state;
	uint64_t P = f->P, cap = 64 * P, off, blocks_all;
	struct arena *a = fx_open(f, cap);
	uint8_t *base = arena_base(a);

	off = must_alloc(a, 3 * P);
	memset(base + off, 0xA5, 3 * P);
	assert_int_equal(arena_preallocated(a), 0);
	assert_true(file_blocks(f->path) * 512 < cap);

	assert_int_equal(arena_preallocate(a, 1), 0);
	assert_int_equal(arena_preallocated(a), 1);
	blocks_all = file_blocks(f->path);
	assert_true(blocks_all * 512 >= cap);
	assert_true(range_is(base + off, 3 * P, 0xA5));
	assert_int_equal(arena_used(a), 3 * P);
	/* arena_write() and arena_zero() copy through the mapping here, same bytes */
	arena_write(a, off + P - 1, "xyz", 3);
	assert_memory_equal(base + off + P - 1, "xyz", 3);
	arena_zero(a, off + P, 1);
	assert_memory_equal(base + off + P - 1, "x\0z", 3);
	arena_write(a, off + P - 1, "\xA5\xA5\xA5", 3);

	/* Free, trim and re-allocate: nothing punched, the allocator unchanged. */
	arena_free(a, off, 3 * P);
	arena_trim(a);
	assert_int_equal(file_blocks(f->path), blocks_all);
	assert_true(range_is(base + off, 3 * P, 0xA5));
	assert_int_equal(must_alloc(a, cap), 0);
	arena_free(a, 0, cap);
	assert_int_equal(arena_used(a), 0);
	assert_int_equal(file_blocks(f->path), blocks_all);
}

/*
 * A capacity larger than the filesystem is -ENOSPC (tmpfs says so before
 * allocating anything), and the arena goes on working page by page.
 */
static void test_preallocate_enospc(void **state)
{
	struct fx *f = *state;
	struct statvfs vfs;
	uint64_t total;
	struct arena *a;

	assert_int_equal(statvfs(f->dir, &vfs), 0);
	total = (uint64_t)vfs.f_blocks * vfs.f_frsize;
	if (total == 0 || total > (1ull << 44))
		skip();
	a = fx_open(f, total + 64 * f->P);
	assert_int_equal(arena_preallocate(a, 0), -ENOSPC);
	assert_int_equal(arena_preallocated(a), 0);
	(void)must_alloc(a, 4 * f->P);
}

/* ---- arena_write ---- */

/*
 * arena_write() lands its bytes where the mapping shows them, on fresh
 * fallocate()d pages and on pages already touched through the mapping: the
 * bytes before it in the same page (written through the mapping) stay, the
 * bytes after it on a fresh page read as zeros, and nothing outside the range
 * changes.  Ingest writes every byte of a file through it; arena_zero()
 * (its zero-fill) clears what either way wrote and nothing around it.
 */
static void test_write_through_fd(void **state)
{
	struct fx *f = *state;
	struct arena *a = fx_open(f, 64 * f->P);
	uint64_t off = must_alloc(a, 4 * f->P), off2;
	uint8_t *base = arena_base(a);
	size_t len = (size_t)(2 * f->P + 123);
	uint8_t *buf = malloc(len);

	assert_non_null(buf);
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	memset(base + off, 0xA5, 100); /* a neighbour, through the mapping */
	arena_write(a, off + 100, buf, len);
	assert_true(range_is(base + off, 100, 0xA5));
	assert_memory_equal(base + off + 100, buf, len);
	assert_true(range_is(base + off + 100 + len, (size_t)(4 * f->P - 100 - len), 0));
	/* a range never touched through the mapping: pread sees the same bytes */
	off2 = must_alloc(a, 2 * f->P);
	arena_write(a, off2 + 5, buf, 10);
	assert_true(file_range_is(arena_fd(a), off2, 5, 0));
	assert_memory_equal(base + off2 + 5, buf, 10);
	assert_true(range_is(base + off2 + 15, (size_t)(2 * f->P - 15), 0));
	/* a second write over part of the first, then the tail */
	arena_write(a, off2 + 8, buf + 100, 4);
	assert_memory_equal(base + off2 + 5, buf, 3);
	assert_memory_equal(base + off2 + 8, buf + 100, 4);
	assert_memory_equal(base + off2 + 12, buf + 7, 3);
	/* arena_zero over bytes written both ways, longer than its zero buffer */
	arena_zero(a, off + 50, 3 * f->P);
	assert_true(range_is(base + off, 50, 0xA5));
	assert_true(range_is(base + off + 50, (size_t)(3 * f->P), 0));
	assert_true(range_is(base + off + 50 + 3 * f->P, (size_t)(f->P - 50), 0));
	free(buf);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_open_sizes),
		T(test_alloc_alignment),
		T(test_first_fit_reuse),
		T(test_coalesce_orders),
		T(test_extend),
		T(test_reserve),
		T(test_enospc_full),
		T(test_enospc_backing),
		T(test_free_subrange),
		T(test_double_free_ignored),
		T(test_used_counter),
		T(test_persist_across_reopen),
		T(test_punch),
		T(test_punch_spares_neighbour),
		T(test_random_model),
		T(test_threads),
		T(test_preallocate),
		T(test_preallocate_enospc),
		T(test_write_through_fd),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
