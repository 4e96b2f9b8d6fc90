/*
 * test_chunker.c — unit tests for chunker_next_cut().
 *
 * Headers come from st_parse() on real file images, so the chunker is tested
 * against exactly what ingest will hand it.  Each test lists the expected
 * shard boundaries and checks both the walk from 0 (cut after cut) and
 * positions in the middle of shards, which must land on the same boundary
 * as the shard's start.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "chunker.h"
#include "safetensors.h"

static struct st_header *parse_json(const char *json, uint64_t data_len)
{
	size_t jl = strlen(json), len = 8 + jl + (size_t)data_len;
	uint8_t *buf = calloc(1, len);
	struct st_header *h = NULL;
	char err[256] = "";
	int ret;

	assert_non_null(buf);
	for (int i = 0; i < 8; i++)
		buf[i] = (uint8_t)((uint64_t)jl >> (8 * i));
	memcpy(buf + 8, json, jl);
	ret = st_parse(buf, len, len, &h, err, sizeof(err));
	if (ret)
		print_error("st_parse: %s\n", err);
	assert_int_equal(ret, 0);
	free(buf);
	return h;
}

/*
 * Walk from 0 to @file_size and compare the cuts with @want (@n entries,
 * the last being >= file_size before clamping); every position inside a
 * shard must give that shard's end.
 */
static void check_cuts(const struct st_header *h, uint64_t file_size, uint64_t max_shard,
		       uint64_t fixed, const uint64_t *want, size_t n)
{
	uint64_t pos = 0;
	size_t i = 0;

	while (pos < file_size) {
		uint64_t cut = chunker_next_cut(h, pos, max_shard, fixed);

		assert_true(i < n);
		assert_int_equal(cut, want[i]);
		assert_true(cut > pos);
		/* Mid-shard positions map to the same end. */
		assert_int_equal(chunker_next_cut(h, pos + (cut - pos) / 2, max_shard, fixed), cut);
		assert_int_equal(chunker_next_cut(h, cut - 1, max_shard, fixed), cut);
		pos = HWFS_MIN(cut, file_size);
		i++;
	}
	assert_int_equal(i, n);
}

static void test_plain_grid(void **state)
{
	const uint64_t want[] = {100, 200, 300, 400};

	(void)state;
	assert_int_equal(chunker_next_cut(NULL, 0, 7, 100), 100);
	assert_int_equal(chunker_next_cut(NULL, 1, 7, 100), 100);
	assert_int_equal(chunker_next_cut(NULL, 99, 7, 100), 100);
	assert_int_equal(chunker_next_cut(NULL, 100, 7, 100), 200);
	assert_int_equal(chunker_next_cut(NULL, 250, 7, 100), 300);
	assert_int_equal(chunker_next_cut(NULL, 1ull << 40, 7, 1 << 20), (1ull << 40) + (1 << 20));
	/* Saturates instead of wrapping. */
	assert_int_equal(chunker_next_cut(NULL, UINT64_MAX - 5, 7, 100), UINT64_MAX);
	check_cuts(NULL, 350, 7, 100, want, 4);
}

static void test_header_and_small_tensors(void **state)
{
	const char *json =
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]},"
		"\"c\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[19,29]}}";
	struct st_header *h = parse_json(json, 29);
	uint64_t ds = h->data_start;
	const uint64_t want[] = {ds, ds + 16, ds + 19, ds + 29};

	(void)state;
	assert_int_equal(ds, 8 + strlen(json));
	/* Header shard. */
	assert_int_equal(chunker_next_cut(h, 0, 1 << 20, 1 << 20), ds);
	assert_int_equal(chunker_next_cut(h, 5, 1 << 20, 1 << 20), ds);
	assert_int_equal(chunker_next_cut(h, ds - 1, 1 << 20, 1 << 20), ds);
	/* One shard per tensor, regardless of the grid. */
	assert_int_equal(chunker_next_cut(h, ds, 1 << 20, 1 << 20), ds + 16);
	assert_int_equal(chunker_next_cut(h, ds + 7, 1 << 20, 1 << 20), ds + 16);
	assert_int_equal(chunker_next_cut(h, ds + 16, 1 << 20, 1 << 20), ds + 19);
	assert_int_equal(chunker_next_cut(h, ds + 19, 1 << 20, 1 << 20), ds + 29);
	assert_int_equal(chunker_next_cut(h, ds + 28, 1 << 20, 1 << 20), ds + 29);
	check_cuts(h, ds + 29, 1 << 20, 1 << 20, want, 4);
	/* After the data: the fixed grid counted from the data end. */
	assert_int_equal(chunker_next_cut(h, ds + 29, 1 << 20, 10), ds + 39);
	assert_int_equal(chunker_next_cut(h, ds + 40, 1 << 20, 10), ds + 49);
	st_free(h);
}

static void test_big_tensor_pieces(void **state)
{
	/* "big" is 2.5 * max_shard (max_shard 40): pieces 40, 40, 20. */
	const char *json =
		"{\"small\":{\"dtype\":\"U8\",\"shape\":[6],\"data_offsets\":[0,6]},"
		"\"big\":{\"dtype\":\"F32\",\"shape\":[5,5],\"data_offsets\":[6,106]},"
		"\"tail\":{\"dtype\":\"U8\",\"shape\":[50],\"data_offsets\":[106,156]}}";
	struct st_header *h = parse_json(json, 156);
	uint64_t ds = h->data_start;
	/* Pieces count from the tensor's own start, not from data_start. */
	const uint64_t want[] = {ds,	  ds + 6,   ds + 46, ds + 86,
				 ds + 106, ds + 146, ds + 156};

	(void)state;
	assert_int_equal(h->t[1].len, 100);
	check_cuts(h, ds + 156, 40, 1 << 20, want, HWFS_ARRAY_SIZE(want));
	assert_int_equal(chunker_next_cut(h, ds + 6, 40, 1 << 20), ds + 46);
	assert_int_equal(chunker_next_cut(h, ds + 45, 40, 1 << 20), ds + 46);
	assert_int_equal(chunker_next_cut(h, ds + 46, 40, 1 << 20), ds + 86);
	assert_int_equal(chunker_next_cut(h, ds + 90, 40, 1 << 20), ds + 106);
	/* Exactly max_shard: one piece. */
	assert_int_equal(chunker_next_cut(h, ds + 106, 50, 1 << 20), ds + 156);
	st_free(h);
}

static void test_zero_length_skipped(void **state)
{
	const char *json =
		"{\"e0\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
		"\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
		"\"e1\":{\"dtype\":\"F32\",\"shape\":[2,0],\"data_offsets\":[8,8]},"
		"\"zz\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]},"
		"\"e2\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[12,12]}}";
	struct st_header *h = parse_json(json, 12);
	uint64_t ds = h->data_start;
	const uint64_t want[] = {ds, ds + 8, ds + 12};

	(void)state;
	assert_int_equal(h->n, 6);
	check_cuts(h, ds + 12, 1 << 20, 1 << 20, want, 3);
	/* Small max_shard still cuts only inside non-empty tensors. */
	{
		const uint64_t want3[] = {ds, ds + 3, ds + 6, ds + 8, ds + 11, ds + 12};

		check_cuts(h, ds + 12, 3, 1 << 20, want3, HWFS_ARRAY_SIZE(want3));
	}
	st_free(h);
}

static void test_no_tensors(void **state)
{
	struct st_header *h = parse_json("{\"__metadata__\":{\"k\":\"v\"}}", 0);
	uint64_t ds = h->data_start;

	(void)state;
	assert_int_equal(chunker_next_cut(h, 0, 64, 100), ds);
	assert_int_equal(chunker_next_cut(h, ds, 64, 100), ds + 100);
	assert_int_equal(chunker_next_cut(h, ds + 150, 64, 100), ds + 200);
	st_free(h);

	/* Only empty tensors: same as no tensors. */
	h = parse_json("{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0);
	ds = h->data_start;
	assert_int_equal(chunker_next_cut(h, 1, 64, 100), ds);
	assert_int_equal(chunker_next_cut(h, ds, 64, 100), ds + 100);
	st_free(h);
}

/* A hand-built header with a huge tensor: offsets near 2^63, no wrap. */
static void test_large_offsets(void **state)
{
	struct st_tensor t[2] = {
		{.name = "a", .off = 100, .len = 1ull << 62},
		{.name = "b", .off = 100 + (1ull << 62), .len = 1ull << 62},
	};
	struct st_header h = {
		.header_len = 92, .data_start = 100, .data_len = 1ull << 63, .n = 2, .t = t};
	uint64_t shard = 1ull << 30;

	(void)state;
	assert_int_equal(chunker_next_cut(&h, 100, shard, 4096), 100 + shard);
	assert_int_equal(chunker_next_cut(&h, 100 + (1ull << 62) - 1, shard, 4096),
			 100 + (1ull << 62));
	assert_int_equal(chunker_next_cut(&h, 100 + (1ull << 62), shard, 4096),
			 100 + (1ull << 62) + shard);
	assert_int_equal(chunker_next_cut(&h, 100 + (1ull << 63), shard, 4096),
			 100 + (1ull << 63) + 4096);
	assert_int_equal(chunker_next_cut(&h, UINT64_MAX - 1, shard, 4096), UINT64_MAX);
}

/* Binary search over many tensors agrees with a linear reference. */
static void test_many_tensors(void **state)
{
	enum { N = 500 };
	struct st_tensor *t = calloc(N, sizeof(*t));
	struct st_header h = {.header_len = 1000, .data_start = 1008, .n = N, .t = t};
	uint64_t off = h.data_start, max_shard = 7;

	(void)state;
	assert_non_null(t);
	for (size_t i = 0; i < N; i++) {
		t[i].name = "t";
		t[i].off = off;
		t[i].len = (i * 37) % 23; /* includes zero-length tensors */
		off += t[i].len;
	}
	h.data_len = off - h.data_start;
	for (uint64_t pos = h.data_start; pos < off; pos++) {
		uint64_t want = UINT64_MAX;

		for (size_t i = 0; i < N; i++) {
			if (t[i].len && pos >= t[i].off && pos < t[i].off + t[i].len) {
				want = t[i].off + ((pos - t[i].off) / max_shard + 1) * max_shard;
				want = HWFS_MIN(want, t[i].off + t[i].len);
				break;
			}
		}
		assert_int_equal(chunker_next_cut(&h, pos, max_shard, 1000), want);
	}
	free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain_grid),
		cmocka_unit_test(test_header_and_small_tensors),
		cmocka_unit_test(test_big_tensor_pieces),
		cmocka_unit_test(test_zero_length_skipped),
		cmocka_unit_test(test_no_tensors),
		cmocka_unit_test(test_large_offsets),
		cmocka_unit_test(test_many_tensors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
