/*
 * test_ingest_resume.c — unit tests for the writer (fs/store/ingest.c) over a
 * real store, continued from test_ingest.c (whose header says how every
 * result is checked): a file resumed and completed later, presized files and
 * headers completed out of order, reserve/commit, EFBIG, abort, random runs
 * of writes and rewrites, and two writers interleaved.
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

static void test_resume_append(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(50);
	const size_t extra = 30000;
	uint8_t *ref = malloc(im.len + extra);
	struct ingest_result r;
	struct writer *w = new_writer(f);

	assert_non_null(ref);
	memcpy(ref, im.buf, im.len);
	fill(ref + im.len, extra, 51);
	write_seq(w, im.buf, 0, im.len, 1000);
	r = finish(w);
	check_tensors(&r, &im, MODEL);

	/* Resume takes the result over and clears it. */
	assert_int_equal(writer_resume(f->s, &r, &w), 0);
	assert_int_equal(r.n_ext, 0);
	assert_null(r.ext);
	assert_null(r.hdr);
	assert_null(r.tensors);
	assert_int_equal(r.size, 0);
	check_read(w, im.buf, im.len);
	check_clean(f, im.len, im.len, 10);

	/* Appending to a model gives trailing bytes: plain from then on. */
	write_seq(w, ref, im.len, im.len + extra, 1000);
	check_read(w, ref, im.len + extra);
	r = finish(w);
	check_result(f, &r, ref, im.len + extra);
	check_no_tensors(&r, "trailing");

	/* Resume again and cut the extra bytes off: a valid model once more. */
	assert_int_equal(writer_resume(f->s, &r, &w), 0);
	assert_int_equal(writer_truncate(w, im.len), 0);
	check_read(w, im.buf, im.len);
	r = finish(w);
	check_result(f, &r, im.buf, im.len);
	check_tensors(&r, &im, MODEL);
	check_clean(f, im.len, im.len, 10);

	/* Resume and rewrite one tensor in the middle. */
	{
		struct tdesc t[N_MODEL];
		struct img im2;

		memcpy(t, MODEL, sizeof(t));
		for (size_t i = 0; i < N_MODEL; i++)
			t[i].seed += 50;
		t[2].seed = 4242;
		im2 = build_st(t, N_MODEL);
		assert_int_equal(writer_resume(f->s, &r, &w), 0);
		write_seq(w, im2.buf, im2.off[2], im2.off[2] + im2.nbytes[2], 5000);
		check_read(w, im2.buf, im2.len);
		r = finish(w);
		check_result(f, &r, im2.buf, im2.len);
		check_cuts(&r, r.hdr);
		check_tensors(&r, &im2, t);
		ingest_result_clear(f->s, &r);
		free(im2.buf);
	}
	check_clean(f, 0, 0, 0);

	/* A plain file resumed and appended to. */
	fill(ref, 50000, 52);
	ref[7] = 0xFF;
	w = new_writer(f);
	write_seq(w, ref, 0, 20000, 1000);
	r = finish(w);
	check_result(f, &r, ref, 20000);
	assert_int_equal(writer_resume(f->s, &r, &w), 0);
	write_seq(w, ref, 20000, 50000, 1000);
	r = finish(w);
	check_result(f, &r, ref, 50000);
	check_no_tensors(&r, NULL);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);

	/* An empty result resumed. */
	w = new_writer(f);
	r = finish(w);
	assert_int_equal(writer_resume(f->s, &r, &w), 0);
	write_seq(w, im.buf, 0, im.len, 3000);
	r = finish(w);
	check_result(f, &r, im.buf, im.len);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	free(ref);
	free(im.buf);
}

/*
 * (f') A model written in two sessions: the first close leaves it short
 * (truncated data), the second appends the rest.  The final bytes are a valid
 * safetensors file and must be reported as one.
 */
static void test_resume_completes_model(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(60);
	struct ingest_result r;
	struct writer *w = new_writer(f);
	uint64_t part = im.off[2] + 70000; /* inside big.weight */

	write_seq(w, im.buf, 0, part, 1000);
	r = finish(w);
	check_result(f, &r, im.buf, part);
	check_no_tensors(&r, "truncated");

	assert_int_equal(writer_resume(f->s, &r, &w), 0);
	write_seq(w, im.buf, part, im.len, 1000);
	check_read(w, im.buf, im.len);
	finish_model(f, w, &im, "complete model after resume + append");
}

/* The same when the first session ended inside the header. */
static void test_resume_completes_header(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(61);
	struct ingest_result r;
	struct writer *w = new_writer(f);

	write_seq(w, im.buf, 0, 100, 1000);
	r = finish(w);
	check_result(f, &r, im.buf, 100);
	check_no_tensors(&r, "exceeds");
	assert_int_equal(writer_resume(f->s, &r, &w), 0);
	write_seq(w, im.buf, 100, im.len, 1000);
	finish_model(f, w, &im, "complete model after resume + append");
}

/*
 * Pre-sized file: ftruncate to the final size, then write front to back.
 * When the header arrives in one write this works; when it is split across
 * writes the header must not be judged from the zero-filled bytes that have
 * not been written yet.
 */
static void presized(struct fx *f, size_t chunk)
{
	struct img im = model_img(70);
	struct st_header *h = parse_img(&im);
	struct ingest_result r;
	struct writer *w = new_writer(f);
	char what[96];
	int ok;

	assert_int_equal(writer_truncate(w, im.len), 0);
	write_seq(w, im.buf, 0, im.len, chunk);
	check_read(w, im.buf, im.len);
	r = finish(w);
	check_result(f, &r, im.buf, im.len);
	snprintf(what, sizeof(what), "pre-sized model written in %zu-byte writes", chunk);
	ok = is_model(&r, what);
	if (ok) {
		check_tensors(&r, &im, MODEL);
		check_cuts(&r, h);
	}
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	st_free(h);
	free(im.buf);
	assert_true(ok);
}

static void test_presized_header_in_one_write(void **state)
{
	presized(*state, 4096);
}

static void test_presized_header_split(void **state)
{
	presized(*state, 100);
}

/* Out-of-order writer (parallel download): a later block lands before the header is complete. */
static void test_header_completed_after_later_block(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(80);
	struct writer *w = new_writer(f);

	assert_true(im.data_start > 64);
	write_seq(w, im.buf, 0, 16, 16);                /* length + first bytes of JSON */
	write_seq(w, im.buf, 4096, 8192, 4096);         /* a later block */
	write_seq(w, im.buf, 16, 4096, 4096);           /* the rest of the first block */
	write_seq(w, im.buf, 8192, im.len, 4096);       /* the rest, in order */
	check_read(w, im.buf, im.len);
	finish_model(f, w, &im, "model written out of order");
}

/* Pre-sized plain file bigger than the slide-to-front limit, with duplicate chunks. */
static void test_presized_duplicates(void **state)
{
	struct fx *f = *state;
	const size_t size = (6u << 20) + 777;
	uint8_t *ref = malloc(size);
	struct ingest_result r;
	struct writer *w = new_writer(f);
	uint64_t b, c;

	assert_non_null(ref);
	fill(ref, FIXED, 90);
	ref[7] = 0xFF;
	for (size_t off = FIXED; off + FIXED <= size; off += FIXED)
		memcpy(ref + off, ref, FIXED);
	fill(ref + size - 777, 777, 91);
	assert_int_equal(writer_truncate(w, size), 0);
	write_seq(w, ref, 0, size, 1 << 20);
	/* Staging never holds the whole file: the unwritten tail was not allocated twice. */
	r = finish(w);
	check_result(f, &r, ref, size);
	check_cuts(&r, NULL);
	usage(f, &b, &c);
	assert_int_equal(c, 2);
	assert_int_equal(b, FIXED + 777);
	assert_int_equal(arena_used_of(f), FIXED + 777);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	free(ref);
}

/* Zero-copy writes: reserve + commit, including a short commit. */
static void test_reserve_commit(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(85);
	struct ingest_result r;
	struct writer *w = new_writer(f);
	uint8_t *p;
	uint64_t off = 0;

	while (off < im.len) {
		size_t want = (size_t)HWFS_MIN(8192, im.len - off), got = HWFS_MIN(want, 5000);

		assert_int_equal(writer_reserve(w, off, want, &p), 0);
		memcpy(p, im.buf + off, got); /* a short read: only @got bytes arrived */
		assert_int_equal(writer_commit(w, off, got), 0);
		off += got;
		assert_int_equal(writer_size(w), off);
	}
	check_read(w, im.buf, im.len);
	r = finish(w);
	check_result(f, &r, im.buf, im.len);
	check_tensors(&r, &im, MODEL);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);

	/* Reserve past EOF zero-fills the gap. */
	w = new_writer(f);
	assert_int_equal(writer_write(w, 0, "\xff\xff\xff\xff\xff\xff\xff\xff", 8), 0);
	assert_int_equal(writer_reserve(w, 100, 4, &p), 0);
	memcpy(p, "abcd", 4);
	assert_int_equal(writer_commit(w, 100, 4), 0);
	{
		uint8_t ref[104] = {0};

		memset(ref, 0xff, 8);
		memcpy(ref + 100, "abcd", 4);
		check_read(w, ref, 104);
		r = finish(w);
		check_result(f, &r, ref, 104);
	}
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	free(im.buf);
}

static void test_efbig(void **state)
{
	struct fx *f = *state;
	struct writer *w = new_writer(f);
	uint8_t *p;

	assert_int_equal(writer_write(w, UINT64_MAX - 2, "abc", 3), -EFBIG);
	assert_int_equal(writer_reserve(w, 1ull << 50, 1, &p), -EFBIG);
	assert_int_equal(writer_size(w), 0);
	writer_abort(w);
	check_clean(f, 0, 0, 0);
}

/* (g) Abort gives back everything; shards of other files are untouched. */
static void test_abort(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(100), im2 = model_img(200);
	struct ingest_result keep;
	struct writer *w;
	uint64_t used0, b0, c0;

	w = new_writer(f);
	write_seq(w, im.buf, 0, im.len, 1000);
	keep = finish(w);
	usage(f, &b0, &c0);
	used0 = arena_used_of(f);

	/* Streaming: new shards and duplicates of kept ones, then abort midway. */
	w = new_writer(f);
	write_seq(w, im.buf, 0, im.len / 2, 1000);
	assert_true(keep.ext[1].sh->refs >= 2);
	writer_abort(w);
	check_clean(f, used0, b0, c0);
	for (size_t i = 0; i < keep.n_ext; i++)
		assert_int_equal(keep.ext[i].sh->refs, 1);

	w = new_writer(f);
	write_seq(w, im2.buf, 0, im2.len - 10, 1000);
	assert_true(usage_bytes(f) > b0);
	writer_abort(w);
	check_clean(f, used0, b0, c0);

	/* Thawed (random) writer. */
	w = new_writer(f);
	write_seq(w, im2.buf, 0, im2.len, 1000);
	assert_int_equal(writer_write(w, 10, "zz", 2), 0);
	assert_int_equal(writer_truncate(w, im2.len + 100000), 0);
	writer_abort(w);
	check_clean(f, used0, b0, c0);

	/* A resumed writer owns the result: aborting it drops the file. */
	assert_int_equal(writer_resume(f->s, &keep, &w), 0);
	write_seq(w, im2.buf, 0, 5000, 1000);
	writer_abort(w);
	check_clean(f, 0, 0, 0);

	writer_abort(NULL);
	free(im.buf);
	free(im2.buf);
}

/* (h) Random operations against a reference buffer. */
struct model {
	uint8_t *ref;
	uint64_t size;
	uint64_t cap;
};

static void random_run(struct fx *f, uint64_t seed, const struct img *start, int ops)
{
	const uint64_t cap = 1200000;
	struct model m = {calloc(1, cap), 0, cap};
	uint8_t *buf = malloc(cap), *rep = malloc(FIXED);
	uint64_t x = seed, used0 = arena_used_of(f), b0, c0;
	struct ingest_result r;
	struct writer *w = new_writer(f);
	int resumed = 0;

	assert_non_null(m.ref);
	assert_non_null(buf);
	assert_non_null(rep);
	usage(f, &b0, &c0);
	fill(rep, FIXED, seed + 1);
	if (start) {
		write_seq(w, start->buf, 0, start->len, 1000 + (size_t)(seed % 5000));
		memcpy(m.ref, start->buf, start->len);
		m.size = start->len;
	}
	for (int op = 0; op < ops; op++) {
		uint64_t k = prng(&x) % 100, off, len;

		if (k < 40) { /* write somewhere, maybe past EOF */
			off = prng(&x) % (m.size + 60000);
			len = 1 + prng(&x) % 40000;
			if (off + len > cap)
				continue;
			if (prng(&x) % 3 == 0) { /* duplicate-friendly content */
				off -= off % FIXED;
				len = FIXED;
				if (off + len > cap)
					continue;
				memcpy(buf, rep, FIXED);
			} else {
				fill(buf, (size_t)len, prng(&x));
			}
			assert_int_equal(writer_write(w, off, buf, (size_t)len), 0);
			memcpy(m.ref + off, buf, (size_t)len);
			if (off > m.size)
				memset(m.ref + m.size, 0, off - m.size);
			if (off + len > m.size)
				m.size = off + len;
		} else if (k < 55) { /* append a sequential run */
			uint64_t n = 1 + prng(&x) % 8, step = 1 + prng(&x) % 20000;

			fill(buf, (size_t)(n * step), prng(&x));
			for (uint64_t i = 0; i < n && m.size + step <= cap; i++) {
				assert_int_equal(writer_write(w, m.size, buf + i * step, (size_t)step), 0);
				memcpy(m.ref + m.size, buf + i * step, (size_t)step);
				m.size += step;
			}
		} else if (k < 63) { /* truncate */
			uint64_t ns = prng(&x) % 4 == 0 ? 0 : prng(&x) % (m.size + 100000);

			if (ns > cap)
				continue;
			assert_int_equal(writer_truncate(w, ns), 0);
			if (ns > m.size)
				memset(m.ref + m.size, 0, ns - m.size);
			m.size = ns;
		} else if (k < 68) { /* zero-copy write, maybe short */
			uint8_t *p;
			uint64_t got;

			off = prng(&x) % (m.size + 30000);
			len = 1 + prng(&x) % 30000;
			got = prng(&x) % 2 ? len : 1 + prng(&x) % len;
			if (off + len > cap)
				continue;
			fill(buf, (size_t)got, prng(&x));
			assert_int_equal(writer_reserve(w, off, (size_t)len, &p), 0);
			memcpy(p, buf, (size_t)got);
			assert_int_equal(writer_commit(w, off, (size_t)got), 0);
			memcpy(m.ref + off, buf, (size_t)got);
			if (off > m.size)
				memset(m.ref + m.size, 0, off - m.size);
			if (off + got > m.size)
				m.size = off + got;
		} else if (k < 70) { /* finish and resume (close and reopen) */
			r = finish(w);
			check_result(f, &r, m.ref, m.size);
			assert_int_equal(writer_resume(f->s, &r, &w), 0);
			resumed = 1;
		} else { /* read back a random range */
			uint64_t got;

			off = prng(&x) % (m.size + 10);
			len = prng(&x) % 70000;
			got = writer_read(w, off, (size_t)len, buf);
			assert_int_equal(got, off >= m.size ? 0 : HWFS_MIN(len, m.size - off));
			if (got)
				assert_memory_equal(buf, m.ref + off, got);
		}
		assert_int_equal(writer_size(w), m.size);
		if (op % 50 == 49)
			check_read(w, m.ref, m.size);
	}
	check_read(w, m.ref, m.size);
	r = finish(w);
	check_result(f, &r, m.ref, m.size);
	if (resumed)
		check_cuts_weak(&r, r.hdr);
	else
		check_cuts(&r, r.hdr);
	if (r.hdr)
		assert_null(r.st_error);
	ingest_result_clear(f->s, &r);
	check_clean(f, used0, b0, c0);
	free(rep);
	free(buf);
	free(m.ref);
}

static void test_random_plain(void **state)
{
	for (uint64_t seed = 1; seed <= 6; seed++)
		random_run(*state, seed, NULL, 300);
}

static void test_random_from_model(void **state)
{
	struct img im = model_img(300);

	for (uint64_t seed = 11; seed <= 16; seed++)
		random_run(*state, seed, &im, 300);
	free(im.buf);
}

/* A model that survives random writes that leave it a valid model. */
static void test_random_rewrites_keep_model(void **state)
{
	struct fx *f = *state;
	struct img im = model_img(400);
	struct st_header *h = parse_img(&im);
	struct ingest_result r;
	struct writer *w = new_writer(f);
	uint64_t x = 77;

	write_seq(w, im.buf, 0, im.len, 65536);
	/* Rewrite random ranges with the same bytes, in random order. */
	for (int i = 0; i < 200; i++) {
		uint64_t off = prng(&x) % im.len, len = 1 + prng(&x) % 20000;

		len = HWFS_MIN(len, im.len - off);
		assert_int_equal(writer_write(w, off, im.buf + off, (size_t)len), 0);
	}
	check_read(w, im.buf, im.len);
	r = finish(w);
	check_result(f, &r, im.buf, im.len);
	check_cuts(&r, h);
	check_tensors(&r, &im, MODEL);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	st_free(h);
	free(im.buf);
}

/* Two writers interleaved over one store (two files of one version). */
static void test_two_writers_interleaved(void **state)
{
	struct fx *f = *state;
	struct img a = model_img(500), b = model_img(500);
	struct ingest_result ra, rb;
	struct writer *wa = new_writer(f), *wb = new_writer(f);
	uint64_t oa = 0, ob = 0;

	while (oa < a.len || ob < b.len) {
		size_t na = (size_t)HWFS_MIN(3000, a.len - oa), nb = (size_t)HWFS_MIN(5000, b.len - ob);

		if (na)
			assert_int_equal(writer_write(wa, oa, a.buf + oa, na), 0);
		if (nb)
			assert_int_equal(writer_write(wb, ob, b.buf + ob, nb), 0);
		oa += na;
		ob += nb;
	}
	ra = finish(wa);
	rb = finish(wb);
	check_result(f, &ra, a.buf, a.len);
	check_result(f, &rb, b.buf, b.len);
	check_tensors(&ra, &a, MODEL);
	check_tensors(&rb, &b, MODEL);
	/* Identical content: one set of shards, two references each. */
	assert_int_equal(usage_bytes(f), a.len);
	assert_int_equal(arena_used_of(f), a.len);
	for (size_t i = 0; i < ra.n_ext; i++)
		assert_ptr_equal(ra.ext[i].sh, rb.ext[i].sh);
	ingest_result_clear(f->s, &ra);
	ingest_result_clear(f->s, &rb);
	check_clean(f, 0, 0, 0);
	free(a.buf);
	free(b.buf);
}


#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_resume_append),
		T(test_resume_completes_model),
		T(test_resume_completes_header),
		T(test_presized_header_in_one_write),
		T(test_presized_header_split),
		T(test_header_completed_after_later_block),
		T(test_presized_duplicates),
		T(test_reserve_commit),
		T(test_efbig),
		T(test_abort),
		T(test_random_plain),
		T(test_random_from_model),
		T(test_random_rewrites_keep_model),
		T(test_two_writers_interleaved),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
