/*
 * test_devload.c — unit tests for the bucket plan of the device shadow-load
 * (gpu/devload.c, devload_plan()) and the CPU side of its table of loads
 * (no device: the copy itself needs a GPU and is tested by `make test-gpu`).
 *
 * Every plan is checked against the rules of docs/gpu.md by one function
 * (check_plan()): offsets 256-byte aligned, tensors in order and never
 * overlapping within a bucket, every bucket's size the end of its last
 * tensor, no bucket over the chosen size unless it holds one tensor larger
 * than that size (alone, at offset 0), the need the sum of the buckets.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "devload.h"
#include "manifest.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

/* The invariants of every plan of @n tensors @lens (see the file's comment). */
static void check_plan(const uint64_t *lens, size_t n, const struct devload_plan *p, int streams)
{
	uint64_t sum = 0;
	int last_b = -1;
	uint64_t last_end = 0;

	for (size_t b = 0; b < p->n_buckets; b++) {
		uint64_t end = 0;
		size_t count = 0, big = 0;

		assert_int_equal(p->bucket_stream[b], (int)(b % (size_t)streams));
		for (size_t i = 0; i < n; i++) {
			if (p->t_bucket[i] != (int)b)
				continue;
			count++;
			if (lens[i] > p->bucket_cap) {
				big++;
				assert_int_equal(p->t_offset[i], 0);
			}
			if (p->t_offset[i] + lens[i] > end)
				end = p->t_offset[i] + lens[i];
		}
		assert_true(count > 0 || (p->n_buckets == 1 && p->bucket_bytes[0] == DEVLOAD_ALIGN));
		if (end == 0) /* the one minimal bucket of a version without bytes */
			end = DEVLOAD_ALIGN;
		assert_int_equal(p->bucket_bytes[b], end);
		/* over the size: only a bucket whose one tensor with bytes is larger than it */
		if (end > p->bucket_cap)
			assert_int_equal(big, 1);
		sum += p->bucket_bytes[b];
	}
	assert_int_equal(p->need, sum);
	assert_true(p->n_buckets >= 1);
	for (size_t i = 0; i < n; i++) {
		int b = p->t_bucket[i];

		assert_int_equal(p->t_offset[i] % DEVLOAD_ALIGN, 0);
		assert_true(b >= 0 && (size_t)b < p->n_buckets);
		if (lens[i] == 0) { /* empty: at the start of bucket 0, out of the order */
			assert_int_equal(b, 0);
			assert_int_equal(p->t_offset[i], 0);
			continue;
		}
		assert_true(b >= last_b); /* in order */
		if (b == last_b && lens[i] > 0)
			assert_true(p->t_offset[i] >= last_end); /* no overlap */
		if (b != last_b)
			last_end = 0;
		last_b = b;
		if (lens[i] > 0)
			last_end = p->t_offset[i] + lens[i];
	}
}

static void test_alignment_and_packing(void **state)
{
	uint64_t lens[] = {1, 255, 256, 257, 1000, 4096, 3};
	struct devload_plan p;

	assert_int_equal(devload_plan(lens, 7, 80 * GiB, 90, 4, GiB, &p), 0);
	check_plan(lens, 7, &p, 4);
	/* all small: one bucket, each tensor at the next multiple of 256 */
	assert_int_equal(p.n_buckets, 1);
	assert_int_equal(p.t_offset[0], 0);
	assert_int_equal(p.t_offset[1], 256);
	assert_int_equal(p.t_offset[2], 512);
	assert_int_equal(p.t_offset[3], 768);
	assert_int_equal(p.t_offset[4], 1280);
	assert_int_equal(p.t_offset[5], 2304);
	assert_int_equal(p.t_offset[6], 6400);
	assert_int_equal(p.bucket_bytes[0], 6403);
	devload_plan_free(&p);
}

static void test_bucket_size_is_clamped(void **state)
{
	uint64_t lens[] = {MiB};
	struct devload_plan p;

	/* 90% of 80 GiB / 64 = 1.125 GiB: capped at gpu_bucket_bytes (1 GiB) */
	assert_int_equal(devload_plan(lens, 1, 80 * GiB, 90, 4, GiB, &p), 0);
	assert_int_equal(p.bucket_cap, GiB);
	devload_plan_free(&p);
	/* 50% of 8 GiB / 64 = 64 MiB */
	assert_int_equal(devload_plan(lens, 1, 8 * GiB, 50, 4, GiB, &p), 0);
	assert_int_equal(p.bucket_cap, 64 * MiB);
	devload_plan_free(&p);
	/* a small device: at least 16 MiB */
	assert_int_equal(devload_plan(lens, 1, 512 * MiB, 90, 4, GiB, &p), 0);
	assert_int_equal(p.bucket_cap, DEVLOAD_MIN_BUCKET);
	devload_plan_free(&p);
	/* gpu_bucket_bytes below 16 MiB wins */
	assert_int_equal(devload_plan(lens, 1, 80 * GiB, 90, 4, 2 * MiB, &p), 0);
	assert_int_equal(p.bucket_cap, 2 * MiB);
	devload_plan_free(&p);
}

static void test_buckets_fill_then_spill(void **state)
{
	/* 16 MiB buckets: three 6 MiB tensors make two buckets (2 + 1) */
	uint64_t lens[] = {6 * MiB, 6 * MiB, 6 * MiB};
	struct devload_plan p;

	assert_int_equal(devload_plan(lens, 3, GiB, 100, 2, 16 * MiB, &p), 0);
	check_plan(lens, 3, &p, 2);
	assert_int_equal(p.n_buckets, 2);
	assert_int_equal(p.t_bucket[0], 0);
	assert_int_equal(p.t_bucket[1], 0);
	assert_int_equal(p.t_offset[1], 6 * MiB);
	assert_int_equal(p.t_bucket[2], 1);
	assert_int_equal(p.t_offset[2], 0);
	assert_int_equal(p.bucket_bytes[0], 12 * MiB);
	assert_int_equal(p.bucket_bytes[1], 6 * MiB);
	assert_int_equal(p.bucket_stream[1], 1);
	devload_plan_free(&p);
}

static void test_big_tensor_gets_its_own_bucket(void **state)
{
	uint64_t lens[] = {MiB, 40 * MiB, MiB, 100, 17 * MiB};
	struct devload_plan p;

	assert_int_equal(devload_plan(lens, 5, GiB, 100, 4, 16 * MiB, &p), 0);
	check_plan(lens, 5, &p, 4);
	assert_int_equal(p.n_buckets, 4);
	assert_int_equal(p.t_bucket[1], 1);
	assert_int_equal(p.t_offset[1], 0);
	assert_int_equal(p.bucket_bytes[1], 40 * MiB);
	/* the tensors after it start a new bucket */
	assert_int_equal(p.t_bucket[2], 2);
	assert_int_equal(p.t_bucket[3], 2);
	assert_int_equal(p.t_bucket[4], 3);
	assert_int_equal(p.bucket_bytes[3], 17 * MiB);
	devload_plan_free(&p);
}

static void test_zero_length_tensors(void **state)
{
	uint64_t lens[] = {0, 0, 100, 0, 16 * MiB, 0};
	uint64_t none[] = {0, 0, 0};
	struct devload_plan p;

	assert_int_equal(devload_plan(lens, 6, GiB, 100, 4, 16 * MiB, &p), 0);
	check_plan(lens, 6, &p, 4);
	/* every empty tensor sits at the start of the first bucket, wherever it is in order */
	for (int i = 0; i < 6; i += i == 1 ? 2 : 1 + (i == 3)) {
		assert_int_equal(p.t_bucket[i], 0);
		assert_int_equal(p.t_offset[i], 0);
	}
	assert_int_equal(p.t_offset[2], 0);
	assert_int_equal(p.n_buckets, 2);
	assert_int_equal(p.t_bucket[4], 1);
	devload_plan_free(&p);
	/* a version of only empty tensors gets one minimal bucket, every tensor in it */
	assert_int_equal(devload_plan(none, 3, GiB, 100, 4, 16 * MiB, &p), 0);
	check_plan(none, 3, &p, 4);
	assert_int_equal(p.n_buckets, 1);
	assert_int_equal(p.bucket_bytes[0], DEVLOAD_ALIGN);
	assert_int_equal(p.need, DEVLOAD_ALIGN);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(p.t_bucket[i], 0);
		assert_int_equal(p.t_offset[i], 0);
	}
	devload_plan_free(&p);
	/* and so does a version of no tensors at all */
	assert_int_equal(devload_plan(NULL, 0, GiB, 100, 4, 16 * MiB, &p), 0);
	assert_int_equal(p.n_buckets, 1);
	assert_int_equal(p.bucket_bytes[0], DEVLOAD_ALIGN);
	devload_plan_free(&p);
}

static void test_refused_when_too_big(void **state)
{
	uint64_t lens[] = {600 * MiB, 600 * MiB};
	struct devload_plan p;

	/* 90% of 1 GiB free is 921.6 MiB: 1200 MiB does not fit */
	assert_int_equal(devload_plan(lens, 2, GiB, 90, 4, GiB, &p), -ENOMEM);
	assert_int_equal(p.need, 1200 * MiB);
	assert_int_equal(p.allowed, GiB / 100 * 90 + GiB % 100 * 90 / 100);
	assert_null(p.bucket_bytes);
	assert_null(p.t_bucket);
	/* exactly the allowed amount fits */
	lens[1] = 0;
	assert_int_equal(devload_plan(lens, 2, 600 * MiB, 100, 4, GiB, &p), 0);
	devload_plan_free(&p);
	lens[1] = 1;
	assert_int_equal(devload_plan(lens, 2, 600 * MiB, 100, 4, GiB, &p), -ENOMEM);
	/* nothing free: anything with bytes is refused */
	assert_int_equal(devload_plan(lens, 2, 0, 90, 4, GiB, &p), -ENOMEM);
}

static void test_many_tiny_tensors(void **state)
{
	size_t n = 100000;
	uint64_t *lens = malloc(n * sizeof(*lens));
	struct devload_plan p;

	assert_non_null(lens);
	for (size_t i = 0; i < n; i++)
		lens[i] = 1 + i % 300;
	assert_int_equal(devload_plan(lens, n, 80 * GiB, 90, 8, 16 * MiB, &p), 0);
	check_plan(lens, n, &p, 8);
	/* each takes one or two 256-byte slots: 100000 tensors fit in two 16 MiB buckets */
	assert_true(p.n_buckets >= 1 && p.n_buckets <= 3);
	devload_plan_free(&p);
	free(lens);
}

static void test_overflow_safe(void **state)
{
	uint64_t huge[] = {UINT64_MAX - 10, 100};
	uint64_t two[] = {UINT64_MAX / 2 + 1, UINT64_MAX / 2 + 1};
	uint64_t one[] = {UINT64_MAX};
	struct devload_plan p;

	assert_int_equal(devload_plan(huge, 2, UINT64_MAX, 100, 4, GiB, &p), -EOVERFLOW);
	assert_int_equal(p.need, UINT64_MAX);
	assert_int_equal(devload_plan(two, 2, UINT64_MAX, 100, 4, UINT64_MAX, &p), -EOVERFLOW);
	/* one tensor of 2^64 - 1 bytes: planned (own bucket), refused for want of memory */
	assert_int_equal(devload_plan(one, 1, UINT64_MAX, 90, 4, GiB, &p), -ENOMEM);
	assert_int_equal(p.need, UINT64_MAX);
	assert_int_equal(devload_plan(one, 1, UINT64_MAX, 100, 4, GiB, &p), 0);
	assert_int_equal(p.n_buckets, 1);
	devload_plan_free(&p);
	/* a free figure near 2^64 does not wrap in pct% of it */
	assert_int_equal(devload_plan(huge + 1, 1, UINT64_MAX, 100, 4, GiB, &p), 0);
	assert_int_equal(p.allowed, UINT64_MAX / 100 * 100 + UINT64_MAX % 100);
	devload_plan_free(&p);
}

static void test_bad_arguments(void **state)
{
	uint64_t lens[] = {1};
	struct devload_plan p;

	assert_int_equal(devload_plan(lens, 1, GiB, 0, 4, GiB, &p), -EINVAL);
	assert_int_equal(devload_plan(lens, 1, GiB, 101, 4, GiB, &p), -EINVAL);
	assert_int_equal(devload_plan(lens, 1, GiB, 90, 0, GiB, &p), -EINVAL);
	assert_int_equal(devload_plan(lens, 1, GiB, 90, 4, 0, &p), -EINVAL);
}

/*
 * The pieces of a file's tensors never pass the room the daemon gives them
 * (one per tensor plus one per extent), even when a peer's manifest makes
 * the tensors overlap: 1000 tensors all [0, size) over a 3-extent file need
 * 3000 pieces; the call says -E2BIG instead of writing past the array (ASan
 * sees a write past it, the heap array is exactly @cap long).
 */
static void test_pieces_bounded(void **state)
{
	enum { NT = 1000, NE = 3 };
	struct hwfs_extent ext[NE] = {{0, 100, {{0}}}, {100, 100, {{0}}}, {200, 56, {{0}}}};
	uint64_t ext_at[NE] = {4096, 65536, 8192};
	struct hwfs_trec *t = calloc(NT, sizeof(*t));
	struct hwfs_frec f = {.kind = HWFS_K_REG, .size = 256, .n_ext = NE, .ext = ext,
			      .n_tensors = NT, .tensors = t};
	size_t cap = NT + NE, np = 0, e0 = 0;
	struct devload_piece *pc = calloc(cap, sizeof(*pc));
	int r = 0;

	assert_non_null(t);
	assert_non_null(pc);
	for (size_t i = 0; i < NT; i++)
		t[i].len = 256;
	for (size_t i = 0; i < NT && r == 0; i++)
		r = devload_tensor_pieces(&f, ext_at, &t[i], &e0, pc, cap, &np);
	assert_int_equal(r, -E2BIG);
	assert_true(np <= cap);
	/* tensors that do not overlap fit: [0,150) over two extents, [150,256) over two */
	t[0] = (struct hwfs_trec){.off = 0, .len = 150};
	t[1] = (struct hwfs_trec){.off = 150, .len = 0};
	t[2] = (struct hwfs_trec){.off = 150, .len = 106};
	np = e0 = 0;
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(devload_tensor_pieces(&f, ext_at, &t[i], &e0, pc, 3 + NE, &np), 0);
	assert_int_equal(np, 4);
	assert_int_equal(pc[0].arena_off, 4096);
	assert_int_equal(pc[0].len, 100);
	assert_int_equal(pc[1].arena_off, 65536);
	assert_int_equal(pc[1].len, 50);
	assert_int_equal(pc[2].arena_off, 65536 + 50);
	assert_int_equal(pc[2].len, 50);
	assert_int_equal(pc[3].arena_off, 8192);
	assert_int_equal(pc[3].len, 56);
	/* outside the file */
	t[3] = (struct hwfs_trec){.off = 200, .len = 57};
	assert_int_equal(devload_tensor_pieces(&f, ext_at, &t[3], &e0, pc, 3 + NE, &np), -EIO);
	free(pc);
	free(t);
}

/* A peer's manifest whose non-empty tensors overlap is refused (a local header would be). */
static void test_manifest_refuses_overlap(void **state)
{
#define MH "0123456789abcdef0123456789abcdef"
#define MT(name, off, len)                                                                     \
	"{\"dtype\":\"U8\",\"hash\":\"" MH "\",\"length\":" #len ",\"name\":\"" name "\","       \
	"\"offset\":" #off ",\"shape\":[" #len "]}"
#define MF(tensors)                                                                            \
	"{\"files\":[{\"extents\":[[0,8,\"" MH "\"]],\"kind\":\"file\",\"mode\":420,"          \
	"\"mtime_ns\":2,\"path\":\"f\",\"size\":8,\"tensors\":[" tensors "]}],"                \
	"\"format\":\"hwfs-manifest/1\",\"shards\":[[\"" MH "\",8]],\"version\":\"v1\"}"
	static const char ok[] = MF(MT("a", 0, 4) "," MT("e", 4, 0) "," MT("b", 4, 4));
	static const char bad[] = MF(MT("a", 0, 8) "," MT("b", 4, 4));
	static const char same[] = MF(MT("a", 0, 8) "," MT("b", 0, 8));
	struct hwfs_vrec *v = NULL;
	char err[256] = "";

	assert_int_equal(manifest_parse(ok, strlen(ok), &v, err, sizeof(err)), 0);
	hwfs_vrec_free(v);
	v = NULL;
	assert_int_equal(manifest_parse(bad, strlen(bad), &v, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "overlaps"));
	assert_int_equal(manifest_parse(same, strlen(same), &v, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "overlaps"));
#undef MF
#undef MT
#undef MH
}

/* Flag @key of @version in status "loads": 1, 0, or -1 when it is not there. */
static int load_flag(json_t *st, const char *version, const char *key)
{
	for (size_t i = 0; i < json_array_size(st); i++) {
		json_t *o = json_array_get(st, i);

		if (!strcmp(json_string_value(json_object_get(o, "version")), version))
			return json_is_true(json_object_get(o, key));
	}
	return -1; /* not there */
}

/*
 * Loads the barrier made ("auto") go when `current` moves to another
 * version; manual ones, the new current's and those still loading stay; a
 * manual load of an auto entry makes it manual.
 */
static void test_auto_unload(void **state)
{
	struct devloads *dl;
	struct devload *a = NULL, *b = NULL, *c = NULL, *m = NULL, *x = NULL;
	uint64_t freed = 1;
	json_t *st;

	assert_int_equal(devloads_create(NULL, &dl), 0);
	assert_int_equal(devloads_begin(dl, "a", 1, 0, 1, &a), 0);
	assert_int_equal(devloads_begin(dl, "b", 2, 0, 1, &b), 0);
	assert_int_equal(devloads_begin(dl, "c", 3, 0, 1, &c), 0);
	assert_int_equal(devloads_begin(dl, "m", 4, 0, 0, &m), 0);
	assert_int_equal(devloads_begin(dl, "x", 5, 1, 1, &x), 0);
	/* a manual load of "x" while the barrier's runs: it becomes manual */
	assert_int_equal(devloads_begin(dl, "x", 5, 1, 0, &x), -EINPROGRESS);
	devloads_fail(dl, a, "a");
	devloads_fail(dl, b, "b");
	devloads_fail(dl, m, "m");
	st = devloads_json(dl);
	assert_int_equal(load_flag(st, "a", "auto"), 1);
	assert_int_equal(load_flag(st, "m", "auto"), 0);
	assert_int_equal(load_flag(st, "x", "auto"), 0);
	json_decref(st);
	/* current is now "b": "a" goes; "b" (current), "c" (loading), "m", "x" (manual) stay */
	assert_int_equal(devloads_unload_auto(dl, "b", &freed), 1);
	assert_int_equal(freed, 0);
	st = devloads_json(dl);
	assert_int_equal(json_array_size(st), 4);
	assert_int_equal(load_flag(st, "a", "auto"), -1);
	assert_int_equal(load_flag(st, "b", "auto"), 1);
	json_decref(st);
	/* "b" removed since: it goes even while current names it */
	devloads_removed(dl, "b");
	assert_int_equal(devloads_unload_auto(dl, "b", &freed), 1);
	devloads_fail(dl, c, "c");
	devloads_fail(dl, x, "x");
	assert_int_equal(devloads_unload_auto(dl, NULL, &freed), 1); /* "c" */
	st = devloads_json(dl);
	assert_int_equal(json_array_size(st), 2);
	assert_int_equal(load_flag(st, "m", "auto"), 0);
	assert_int_equal(load_flag(st, "x", "auto"), 0);
	json_decref(st);
	devloads_stop(dl);
	devloads_drain(dl);
	devloads_destroy(dl);
}

/* The table without a device: begin, fail, status, unload, removed; nothing leaks. */
static void test_table_without_device(void **state)
{
	struct devloads *dl;
	struct devload *l = NULL, *l2 = NULL;
	uint64_t freed, pending;
	json_t *st, *rep = NULL;
	char err[256];

	assert_int_equal(devloads_create(NULL, &dl), 0);
	assert_int_equal(devloads_begin(dl, "v1", 1, 0, 0, &l), 0);
	assert_int_equal(devloads_begin(dl, "v1", 1, 0, 0, &l2), -EINPROGRESS);
	assert_int_equal(devloads_ready(dl, "v1", 1, 0, 0, err, sizeof(err)), -EINPROGRESS);
	assert_int_equal(devloads_unload(dl, "v1", 0, &freed, &pending), -EBUSY);
	assert_int_equal(devloads_map(dl, "v1", 0, &rep, &l2), -ENOENT);
	devloads_fail(dl, l, "no CUDA device: test");
	assert_int_equal(devloads_wait(dl, "v1", 0, NULL, err, sizeof(err)), -ECANCELED);
	assert_string_equal(err, "no CUDA device: test");
	devloads_removed(dl, "v1");
	st = devloads_json(dl);
	assert_int_equal(json_array_size(st), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(st, 0), "state")),
			    "failed");
	assert_true(json_is_true(json_object_get(json_array_get(st, 0), "removed")));
	json_decref(st);
	/*
	 * a barrier that began before the failure is told it, as often as it asks
	 * (two engines on one GPU); one that began after it finds it stale: gone
	 */
	assert_int_equal(devloads_ready(dl, "v1", 1, 0, 1, err, sizeof(err)), -ECANCELED);
	assert_string_equal(err, "no CUDA device: test");
	assert_int_equal(devloads_ready(dl, "v1", 1, 0, 1, err, sizeof(err)), -ECANCELED);
	assert_int_equal(devloads_ready(dl, "v1", 1, 0, UINT64_MAX, err, sizeof(err)), -ENOENT);
	assert_int_equal(devloads_ready(dl, "v1", 1, 0, 1, err, sizeof(err)), -ENOENT);
	assert_int_equal(devloads_unload(dl, "v1", -1, &freed, &pending), -ENOENT);
	/* a failed entry is replaced by the next begin; unload of a failed one frees it */
	assert_int_equal(devloads_begin(dl, "v2", 2, 1, 0, &l), 0);
	devloads_fail(dl, l, "x");
	assert_int_equal(devloads_begin(dl, "v2", 2, 1, 0, &l), 0);
	devloads_fail(dl, l, "y");
	assert_int_equal(devloads_unload(dl, "v2", 1, &freed, &pending), 0);
	assert_int_equal(freed, 0);
	assert_int_equal(pending, 0);
	/* the run without a runtime fails cleanly */
	assert_int_equal(devloads_begin(dl, "v3", 3, 0, 0, &l), 0);
	{
		uint64_t lens[] = {4};
		size_t at[] = {0, 1};
		struct devload_piece pc[] = {{0, 4}};
		uint8_t arena[4] = {1, 2, 3, 4};
		json_t *t = json_pack("[{s:s}]", "name", "a");
		struct devload_src src = {arena, 1, lens, at, pc, t, {{0}}, 0};

		assert_int_equal(devloads_run(dl, l, &src, 90, 4, GiB, NULL, NULL, NULL, err,
					      sizeof(err)),
				 -ENODEV);
		json_decref(t);
	}
	devloads_stop(dl);
	assert_int_equal(devloads_begin(dl, "v4", 4, 0, 0, &l), -ESHUTDOWN);
	assert_int_equal(devloads_worker_enter(dl), -ESHUTDOWN);
	devloads_drain(dl);
	devloads_destroy(dl);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_alignment_and_packing),
		cmocka_unit_test(test_bucket_size_is_clamped),
		cmocka_unit_test(test_buckets_fill_then_spill),
		cmocka_unit_test(test_big_tensor_gets_its_own_bucket),
		cmocka_unit_test(test_zero_length_tensors),
		cmocka_unit_test(test_refused_when_too_big),
		cmocka_unit_test(test_many_tiny_tensors),
		cmocka_unit_test(test_overflow_safe),
		cmocka_unit_test(test_bad_arguments),
		cmocka_unit_test(test_table_without_device),
		cmocka_unit_test(test_pieces_bounded),
		cmocka_unit_test(test_auto_unload),
		cmocka_unit_test(test_manifest_refuses_overlap),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
