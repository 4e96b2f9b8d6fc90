/*
 * test_ingest.c — unit tests for the writer (fs/store/ingest.c) over a real store:
 * sequential and out-of-order writes, dedup, holes, truncation, malformed input.
 * Resume, presized files, reserve/commit, abort and random runs: test_ingest_resume.c.
 *
 * Every test opens a real store (arena + index + lock) in a fresh mkdtemp()
 * directory under /dev/shm and removes it afterwards.  The tunables are made
 * small (max_shard 64 KiB, fixed_chunk 16 KiB, staging_min 16 KiB) so that
 * files of a few hundred KiB exercise tensor splitting, fixed chunking and
 * staging growth; they are restored after each test.
 *
 * Safetensors inputs are real file images built in memory (8-byte LE header
 * length, JSON header padded with spaces, data buffer with a distinct pattern
 * per tensor).  Every finished result is checked against a reference buffer
 * kept by the test: extents tile [0,size) exactly, each extent is a whole
 * shard whose bytes (read through the arena) equal the reference and whose
 * hash is the XXH3-128 of those bytes.  Leaks are checked through arena_used()
 * and store_usage(): after ingest_result_clear()/writer_abort() both are back
 * at their baseline.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chunker.h"
#include "ingest.h"
#include "safetensors.h"
#include "store.h"
#include "tunables.h"
#include "tmpdir.h"

#include "ingest_util.h"

/* -------------------------------------------------------------- tests */

static void test_fext_find(void **state)
{
	struct fext e[] = {{0, 10, NULL}, {10, 5, NULL}, {15, 100, NULL}};

	(void)state;
	assert_int_equal(ingest_fext_find(e, 3, 0), 0);
	assert_int_equal(ingest_fext_find(e, 3, 9), 0);
	assert_int_equal(ingest_fext_find(e, 3, 10), 1);
	assert_int_equal(ingest_fext_find(e, 3, 14), 1);
	assert_int_equal(ingest_fext_find(e, 3, 15), 2);
	assert_int_equal(ingest_fext_find(e, 3, 114), 2);
	assert_int_equal(ingest_fext_find(e, 3, 115), 3);
	assert_int_equal(ingest_fext_find(e, 0, 0), 0);
}

/* (a) A safetensors image written front to back in 1000-byte writes. */
static void test_sequential_safetensors(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(0);
	struct st_header *h = parse_img(&im);
	uint64_t used0 = arena_used_of(f), cuts[64];
	struct writer *w = new_writer(f);
	struct ingest_result r;
	size_t nc;

	for (uint64_t off = 0; off < im.len;) {
		size_t n = (size_t)HWFS_MIN(1000, im.len - off);
		uint64_t staged;

		assert_int_equal(writer_write(w, off, im.buf + off, n), 0);
		off += n;
		/* Streaming: staging holds only the piece in progress. */
		staged = arena_used_of(f) - used0 - usage_bytes(f);
		assert_true(staged <= 4ull * MAX_SHARD);
		/* Everything before the current piece is cut already. */
		assert_true(usage_bytes(f) + MAX_SHARD >= off || off < im.data_start);
	}
	/* The last tensor ends at EOF: all of it is cut before finish. */
	assert_int_equal(usage_bytes(f), im.len);
	check_read(w, im.buf, im.len);

	r = finish(w);
	check_result(f, &r, im.buf, im.len);
	check_cuts(&r, h);
	nc = model_cuts(&im, cuts);
	assert_int_equal(r.n_ext, nc);
	assert_int_equal(r.n_ext, 1 + 1 + 1 + 4 + 2 + 1);
	for (size_t i = 0; i < nc; i++)
		assert_int_equal(r.ext[i].off + r.ext[i].len, cuts[i]);
	assert_int_equal(r.ext[0].len, im.data_start);
	check_tensors(&r, &im, MODEL);
	/* Staging is gone: the arena holds exactly the shards. */
	assert_int_equal(arena_used_of(f) - used0, im.len);

	ingest_result_clear(f->s, &r);
	assert_int_equal(r.n_ext, 0);
	assert_null(r.ext);
	check_clean(f, used0, 0, 0);
	st_free(h);
	free(im.buf);
}

/* Chunk sizes that straddle the header and every boundary differently. */
static void test_sequential_various_chunks(void **state)
{
	struct fx *f = *state;
	static const size_t chunks[] = {1, 7, 4096, 65536, 65537, 1 << 20};
	struct img im = model_img(10);
	struct st_header *h = parse_img(&im);

	for (size_t c = 0; c < HWFS_ARRAY_SIZE(chunks); c++) {
		struct writer *w = new_writer(f);
		struct ingest_result r;
		size_t step = chunks[c];

		/* 1-byte writes over the whole image are slow; do the header and 3000 bytes. */
		if (step == 1) {
			write_seq(w, im.buf, 0, im.data_start + 3000, 1);
			write_seq(w, im.buf, im.data_start + 3000, im.len, 9999);
		} else {
			write_seq(w, im.buf, 0, im.len, step);
		}
		r = finish(w);
		check_result(f, &r, im.buf, im.len);
		check_cuts(&r, h);
		check_tensors(&r, &im, MODEL);
		ingest_result_clear(f->s, &r);
		check_clean(f, 0, 0, 0);
	}
	st_free(h);
	free(im.buf);
}

/* (b) The same image twice: the second writer adds no shard. */
static void test_dedup_same_image(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(0);
	struct ingest_result r1, r2, r3;
	uint64_t b1, c1, used1, b3;
	struct writer *w;

	w = new_writer(f);
	write_seq(w, im.buf, 0, im.len, 1000);
	r1 = finish(w);
	usage(f, &b1, &c1);
	used1 = arena_used_of(f);
	assert_int_equal(b1, im.len);
	assert_int_equal(c1, r1.n_ext);

	w = new_writer(f);
	write_seq(w, im.buf, 0, im.len, 777);
	check_read(w, im.buf, im.len);
	r2 = finish(w);
	check_clean(f, used1, b1, c1);
	check_result(f, &r2, im.buf, im.len);
	check_tensors(&r2, &im, MODEL);
	assert_int_equal(r2.n_ext, r1.n_ext);
	for (size_t i = 0; i < r1.n_ext; i++) {
		assert_ptr_equal(r2.ext[i].sh, r1.ext[i].sh);
		assert_int_equal(r1.ext[i].sh->refs, 2);
	}
	for (size_t i = 0; i < r1.n_tensors; i++)
		assert_memory_equal(r1.tensors[i].hash.b, r2.tensors[i].hash.b, HWFS_HASH_LEN);

	/* A third version with only "b.weight" changed costs exactly that tensor. */
	{
		struct tdesc t[N_MODEL];
		struct img im3;

		memcpy(t, MODEL, sizeof(t));
		t[1].seed = 999;
		im3 = build_st(t, N_MODEL);
		assert_int_equal(im3.len, im.len);
		w = new_writer(f);
		write_seq(w, im3.buf, 0, im3.len, 4096);
		r3 = finish(w);
		check_result(f, &r3, im3.buf, im3.len);
		check_tensors(&r3, &im3, t);
		b3 = usage_bytes(f);
		assert_int_equal(b3, b1 + im3.nbytes[1]);
		assert_int_equal(arena_used_of(f), used1 + im3.nbytes[1]);
		ingest_result_clear(f->s, &r3);
		free(im3.buf);
	}
	check_clean(f, used1, b1, c1);

	ingest_result_clear(f->s, &r2);
	check_clean(f, used1, b1, c1);
	for (size_t i = 0; i < r1.n_ext; i++)
		assert_int_equal(r1.ext[i].sh->refs, 1);
	ingest_result_clear(f->s, &r1);
	check_clean(f, 0, 0, 0);
	free(im.buf);
}

/* Duplicate pieces within one file (also the "slide to the front" path). */
static void test_dedup_within_file(void **state)
{
	struct fx *f = *state;
	const size_t size = 10 * FIXED + 1234;
	uint8_t *ref = malloc(size);
	struct ingest_result r;
	struct writer *w;

	assert_non_null(ref);
	/* Every 16 KiB chunk identical except the last, short one. */
	fill(ref, FIXED, 42);
	ref[0] = 0xFF; /* N huge: not safetensors */
	ref[7] = 0xFF;
	for (size_t i = 1; i < 10; i++)
		memcpy(ref + i * FIXED, ref, FIXED);
	fill(ref + 10 * FIXED, 1234, 43);

	w = new_writer(f);
	write_seq(w, ref, 0, size, 3000);
	r = finish(w);
	check_result(f, &r, ref, size);
	check_cuts(&r, NULL);
	assert_int_equal(r.n_ext, 11);
	for (size_t i = 1; i < 10; i++)
		assert_ptr_equal(r.ext[i].sh, r.ext[0].sh);
	assert_int_equal(r.ext[0].sh->refs, 10);
	check_clean(f, FIXED + 1234, FIXED + 1234, 2);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	free(ref);
}

/* (c) A plain file: fixed_chunk pieces, st_error set. */
static void test_plain_file(void **state)
{
	struct fx *f = *state;
	const size_t size = 7 * FIXED + 555;
	uint8_t *ref = malloc(size);
	struct ingest_result r;
	struct writer *w;

	assert_non_null(ref);
	fill(ref, size, 77);
	memcpy(ref, "plain text, not a model\n", 24);
	w = new_writer(f);
	write_seq(w, ref, 0, size, 1000);
	/* All whole chunks are cut while writing. */
	assert_int_equal(usage_bytes(f), 7 * FIXED);
	check_read(w, ref, size);
	r = finish(w);
	check_result(f, &r, ref, size);
	check_cuts(&r, NULL);
	assert_int_equal(r.n_ext, 8);
	for (size_t i = 0; i < 7; i++)
		assert_int_equal(r.ext[i].len, FIXED);
	assert_int_equal(r.ext[7].len, 555);
	check_no_tensors(&r, NULL);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	free(ref);
}

static void test_tiny_and_empty_files(void **state)
{
	struct fx *f = *state;
	struct ingest_result r;
	struct writer *w;

	w = new_writer(f);
	r = finish(w);
	assert_int_equal(r.size, 0);
	assert_int_equal(r.n_ext, 0);
	assert_null(r.tensors);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);

	w = new_writer(f);
	assert_int_equal(writer_write(w, 0, "hello", 5), 0);
	assert_int_equal(writer_write(w, 5, "", 0), 0);
	check_read(w, (const uint8_t *)"hello", 5);
	r = finish(w);
	check_result(f, &r, (const uint8_t *)"hello", 5);
	check_no_tensors(&r, "shorter than 8");
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);

	/* Exactly 8 bytes: a length but nothing after it. */
	w = new_writer(f);
	assert_int_equal(writer_write(w, 0, "\x10\0\0\0\0\0\0\0", 8), 0);
	r = finish(w);
	check_result(f, &r, (const uint8_t *)"\x10\0\0\0\0\0\0\0", 8);
	check_no_tensors(&r, NULL);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
}

/* (d1) Second half first, then the first half: a valid model in the end. */
static void test_second_half_first(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(20);
	struct st_header *h = parse_img(&im);
	uint64_t half = im.len / 2;
	uint8_t *ref = calloc(1, im.len);
	struct ingest_result r;
	struct writer *w = new_writer(f);

	assert_non_null(ref);
	write_seq(w, im.buf, half, im.len, 1000);
	memcpy(ref + half, im.buf + half, im.len - half);
	check_read(w, ref, im.len); /* the gap reads as zeros */
	write_seq(w, im.buf, 0, half, 1000);
	check_read(w, im.buf, im.len);
	r = finish(w);
	check_result(f, &r, im.buf, im.len);
	check_cuts(&r, h);
	check_tensors(&r, &im, MODEL);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	st_free(h);
	free(ref);
	free(im.buf);
}

/* (d2) Overwrite in the middle after data has been cut; writes past EOF. */
static void test_overwrite_and_gap(void **state)
{
	struct fx *f = *state;
	const size_t cap = 400000;
	uint8_t *ref = calloc(1, cap), *patch = malloc(20000);
	uint64_t size = 0;
	struct ingest_result r;
	struct writer *w = new_writer(f);

	assert_non_null(ref);
	assert_non_null(patch);
	fill(ref, 200000, 5);
	ref[7] = 0xFF; /* plain */
	write_seq(w, ref, 0, 200000, 1000);
	size = 200000;
	assert_true(usage_bytes(f) >= 12 * FIXED); /* cutting happened */
	check_read(w, ref, size);

	/* Overwrite [50000, 70000): before the cut position. */
	fill(patch, 20000, 6);
	assert_int_equal(writer_write(w, 50000, patch, 20000), 0);
	memcpy(ref + 50000, patch, 20000);
	check_read(w, ref, size);

	/* Past EOF: [200000, 250000) stays a zero gap. */
	fill(patch, 10000, 7);
	assert_int_equal(writer_write(w, 250000, patch, 10000), 0);
	memcpy(ref + 250000, patch, 10000);
	size = 260000;
	check_read(w, ref, size);

	/* Overwrite across the old end and the gap. */
	fill(patch, 20000, 8);
	assert_int_equal(writer_write(w, 195000, patch, 20000), 0);
	memcpy(ref + 195000, patch, 20000);
	check_read(w, ref, size);

	r = finish(w);
	check_result(f, &r, ref, size);
	check_cuts(&r, NULL);
	check_no_tensors(&r, NULL);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	free(patch);
	free(ref);
}

/* Gap past EOF while still streaming (nothing before the cut position is touched). */
static void test_gap_streaming(void **state)
{
	struct fx *f = *state;
	const size_t size = 300000;
	uint8_t *ref = calloc(1, size);
	struct ingest_result r;
	struct writer *w = new_writer(f);

	assert_non_null(ref);
	fill(ref, 20000, 9);
	ref[7] = 0xFF;
	fill(ref + 100000, 30000, 10);
	fill(ref + 290000, 10000, 11);
	write_seq(w, ref, 0, 20000, 1000);
	write_seq(w, ref, 100000, 130000, 1000);
	write_seq(w, ref, 290000, 300000, 1000);
	check_read(w, ref, size);
	r = finish(w);
	check_result(f, &r, ref, size);
	check_cuts(&r, NULL);
	/* The all-zero chunks of the gaps are one shard. */
	assert_ptr_equal(r.ext[8].sh, r.ext[9].sh);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	free(ref);
}

/* (d3) Truncate below cut data, then grow (zero-filled), then write again. */
/*
 * The hole (ingest.c): bytes that read as zeros after ftruncate or a write
 * past the end are zeroed lazily, when something reads staging.  Staging here
 * holds stale bytes under the hole (written, then cut off by a shrink), so a
 * byte of the hole that is hashed, cut or read without being zeroed shows
 * up.  Writes cover the hole's front, its middle and its back; nothing is
 * read until the end, so the cuts (random mode, then streaming) and the
 * finish must do the zeroing themselves.
 */
static void test_lazy_hole(void **state)
{
	struct fx *f = *state;
	const size_t cap = 300000;
	uint8_t *ref = calloc(1, cap), *old = malloc(cap);
	struct ingest_result r;
	struct writer *w = new_writer(f);

	assert_non_null(ref);
	assert_non_null(old);
	fill(old, cap, 41);
	old[0] = 0xFF; /* not safetensors */
	write_seq(w, old, 0, 200000, 4096);
	/* below the cut position: thawed, random mode; staging keeps the old bytes */
	assert_int_equal(writer_truncate(w, 1000), 0);
	assert_int_equal(writer_truncate(w, 150000), 0); /* hole [1000, 150000) */
	memcpy(ref, old, 1000);
	assert_int_equal(writer_write(w, 50000, old + 50000, 10000), 0); /* middle */
	memcpy(ref + 50000, old + 50000, 10000);
	assert_int_equal(writer_write(w, 140000, old + 140000, 20000), 0); /* back */
	memcpy(ref + 140000, old + 140000, 20000);
	assert_int_equal(writer_write(w, 60000, old + 60000, 10000), 0); /* front */
	memcpy(ref + 60000, old + 60000, 10000);
	assert_int_equal(writer_write(w, 200000, "END", 3), 0); /* a gap: one more hole */
	memcpy(ref + 200000, "END", 3);
	r = finish(w);
	check_result(f, &r, ref, 200003);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);

	/* streaming: cuts pass through a hole over stale bytes */
	memset(ref, 0, cap);
	w = new_writer(f);
	write_seq(w, old, 0, 100000, 4096);
	memcpy(ref, old, 99000);
	assert_int_equal(writer_truncate(w, 99000), 0);  /* above the cut position */
	assert_int_equal(writer_truncate(w, 200000), 0); /* hole [99000, 200000) */
	/* covers the back of the hole and goes past it: the front stays a hole */
	assert_int_equal(writer_write(w, 150000, old + 150000, 60000), 0);
	memcpy(ref + 150000, old + 150000, 60000);
	r = finish(w);
	check_result(f, &r, ref, 210000);
	check_cuts(&r, NULL);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	free(ref);
	free(old);
}

static void test_truncate(void **state)
{
	struct fx *f = *state;
	const size_t cap = 300000;
	uint8_t *ref = calloc(1, cap), *old = malloc(cap);
	struct ingest_result r;
	struct writer *w = new_writer(f);

	assert_non_null(ref);
	assert_non_null(old);
	fill(old, cap, 12);
	old[7] = 0xFF;
	write_seq(w, old, 0, 200000, 4096);
	memcpy(ref, old, 200000);
	assert_true(usage_bytes(f) > 100000);

	/* Shrink below the cut position. */
	assert_int_equal(writer_truncate(w, 40000), 0);
	memset(ref + 40000, 0, cap - 40000);
	check_read(w, ref, 40000);
	/* Grow: zero-filled, never the old bytes. */
	assert_int_equal(writer_truncate(w, 90000), 0);
	check_read(w, ref, 90000);
	/* Write across the end. */
	assert_int_equal(writer_write(w, 85000, old + 85000, 10000), 0);
	memcpy(ref + 85000, old + 85000, 10000);
	check_read(w, ref, 95000);
	/* Shrink within staging, then grow again: the dropped tail must read as zeros. */
	assert_int_equal(writer_truncate(w, 94000), 0);
	assert_int_equal(writer_truncate(w, 95000), 0);
	memset(ref + 94000, 0, 1000);
	check_read(w, ref, 95000);
	/* Shrink, then write past the new end: the gap is zeros. */
	assert_int_equal(writer_truncate(w, 93000), 0);
	assert_int_equal(writer_write(w, 94500, "XYZ", 3), 0);
	memset(ref + 93000, 0, 1500);
	memcpy(ref + 94500, "XYZ", 3);
	memset(ref + 94503, 0, 497);
	check_read(w, ref, 94503);
	assert_int_equal(writer_truncate(w, 94503), 0); /* same size: no-op */
	check_read(w, ref, 94503);

	r = finish(w);
	check_result(f, &r, ref, 94503);
	check_cuts(&r, NULL);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);

	/* Truncate to 0 after streaming cuts, then write a model from scratch. */
	{
		struct img im = model_img(30);

		w = new_writer(f);
		write_seq(w, old, 0, 100000, 1000);
		assert_int_equal(writer_truncate(w, 0), 0);
		assert_int_equal(writer_size(w), 0);
		check_clean(f, 0, 0, 0);
		write_seq(w, im.buf, 0, im.len, 1000);
		assert_int_equal(usage_bytes(f), im.len); /* streaming again */
		r = finish(w);
		check_result(f, &r, im.buf, im.len);
		check_tensors(&r, &im, MODEL);
		ingest_result_clear(f->s, &r);
		check_clean(f, 0, 0, 0);
		free(im.buf);
	}
	free(old);
	free(ref);
}

/* Truncate a streamed model below its header: it becomes plain data. */
static void test_truncate_model(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(40);
	struct ingest_result r;
	struct writer *w = new_writer(f);
	uint64_t cut_at = im.off[2] + 1000; /* inside big.weight */

	write_seq(w, im.buf, 0, im.len, 1000);
	assert_int_equal(writer_truncate(w, cut_at), 0);
	check_read(w, im.buf, cut_at);
	r = finish(w);
	check_result(f, &r, im.buf, cut_at);
	check_no_tensors(&r, "truncated");
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	free(im.buf);
}

/* (e) Malformed safetensors: stored as plain bytes, st_error, no tensors. */
static void malformed_case(struct fx *f, const uint8_t *buf, size_t len, const char *needle)
{
	struct ingest_result r;
	struct writer *w = new_writer(f);

	write_seq(w, buf, 0, len, 1000);
	check_read(w, buf, len);
	r = finish(w);
	check_result(f, &r, buf, len);
	check_no_tensors(&r, needle);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
}

static void test_malformed(void **state)
{
	struct fx *f = *state;
	const char *json = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4096],\"data_offsets\":[0,4096]}}";
	size_t jl = strlen(json);
	uint8_t *buf = malloc(200000);

	assert_non_null(buf);

	/* Header length 1000, file shorter than 1008. */
	fill(buf, 500, 1);
	memcpy(buf, "\xe8\x03\0\0\0\0\0\0", 8);
	memcpy(buf + 8, json, jl);
	malformed_case(f, buf, 500, "exceeds");

	/* Invalid JSON (object never closed). */
	memcpy(buf, "\x40\0\0\0\0\0\0\0", 8);
	memcpy(buf + 8, "{\"a\": {\"dtype\": \"U8\", \"shape\": [4096], \"data_", 46);
	memset(buf + 54, ' ', 64 - 46);
	fill(buf + 72, 4096, 2);
	malformed_case(f, buf, 72 + 4096, NULL);

	/* Data truncated: 4096 declared, 4000 present. */
	memset(buf, 0, 8);
	buf[0] = (uint8_t)jl;
	memcpy(buf + 8, json, jl);
	fill(buf + 8 + jl, 4096, 3);
	malformed_case(f, buf, 8 + jl + 4000, "truncated");

	/* Trailing bytes after the data (also across a fixed_chunk boundary). */
	fill(buf + 8 + jl + 4096, 40000, 4);
	malformed_case(f, buf, 8 + jl + 4096 + 40000, "trailing");

	/* Header length 0 and a huge header length. */
	memset(buf, 0, 8);
	malformed_case(f, buf, 5000, "0");
	memcpy(buf, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);
	malformed_case(f, buf, 5000, "exceeds");

	/* Valid length but not starting with '{'. */
	memset(buf, 0, 8);
	buf[0] = 16;
	memcpy(buf + 8, "[1,2,3]         ", 16);
	malformed_case(f, buf, 24, NULL);
	free(buf);
}

/* (f) Resume a finished file and append. */
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fext_find),
		T(test_sequential_safetensors),
		T(test_sequential_various_chunks),
		T(test_dedup_same_image),
		T(test_dedup_within_file),
		T(test_plain_file),
		T(test_tiny_and_empty_files),
		T(test_second_half_first),
		T(test_overwrite_and_gap),
		T(test_gap_streaming),
		T(test_truncate),
		T(test_lazy_hole),
		T(test_truncate_model),
		T(test_malformed),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
