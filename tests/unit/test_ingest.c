/*
 * test_ingest.c — unit tests for the writer (fs/store/ingest.c) over a real store.
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

#define CAP (64ull << 20)
#define MAX_SHARD (64u << 10)
#define FIXED (16u << 10)

struct fx {
	char dir[64];
	struct store *s;
	struct hwfs_tunables saved;
};

static int fx_setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/dev/shm/hwfs-test-ingest-XXXXXX");
	if (!mkdtemp(f->dir)) {
		free(f);
		return -1;
	}
	if (store_open(f->dir, CAP, &f->s) < 0) {
		rm_rf(f->dir);
		free(f);
		return -1;
	}
	f->saved = hwfs_tun;
	hwfs_tun.max_shard = MAX_SHARD;
	hwfs_tun.fixed_chunk = FIXED;
	hwfs_tun.staging_min = 16u << 10;
	hwfs_tun.staging_step = 1u << 20;
	*state = f;
	return 0;
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;

	hwfs_tun = f->saved;
	store_close(f->s);
	rm_rf(f->dir);
	free(f);
	return 0;
}

/* ------------------------------------------------------------ helpers */

static uint64_t prng(uint64_t *x)
{
	/* splitmix64 */
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x1000193ull + 1;

	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = prng(&x);

		memcpy(p + i, &v, HWFS_MIN(8, n - i));
	}
}

static uint64_t arena_used_of(struct fx *f)
{
	return arena_used(store_arena(f->s));
}

static void usage(struct fx *f, uint64_t *bytes, uint64_t *count)
{
	uint64_t c;

	store_usage(f->s, bytes, count ? count : &c);
}

static uint64_t usage_bytes(struct fx *f)
{
	uint64_t b;

	usage(f, &b, NULL);
	return b;
}

/* ---- safetensors images ---- */

struct tdesc {
	const char *name;
	const char *dtype;
	uint32_t ndim;
	uint64_t shape[2];
	uint64_t seed;
};

struct img {
	uint8_t *buf;
	size_t len;
	uint64_t data_start;
	size_t n;
	uint64_t off[16]; /* absolute offset of each tensor (in tdesc order) */
	uint64_t nbytes[16];
};

static uint64_t tbytes(const struct tdesc *t)
{
	uint64_t n = st_dtype_bits(t->dtype) / 8;

	for (uint32_t d = 0; d < t->ndim; d++)
		n *= t->shape[d];
	return n;
}

/* Tensors are laid out in the data buffer in tdesc order. */
static struct img build_st(const struct tdesc *t, size_t n)
{
	char json[4096];
	size_t jl = 0, hl;
	uint64_t pos = 0;
	struct img im = {0};

	assert_true(n <= 16);
	jl += (size_t)snprintf(json + jl, sizeof(json) - jl, "{\"__metadata__\":{\"format\":\"pt\"}");
	for (size_t i = 0; i < n; i++) {
		uint64_t nb = tbytes(&t[i]);

		jl += (size_t)snprintf(json + jl, sizeof(json) - jl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
				       t[i].name, t[i].dtype);
		for (uint32_t d = 0; d < t[i].ndim; d++)
			jl += (size_t)snprintf(json + jl, sizeof(json) - jl, "%s%llu", d ? "," : "",
					       (unsigned long long)t[i].shape[d]);
		jl += (size_t)snprintf(json + jl, sizeof(json) - jl, "],\"data_offsets\":[%llu,%llu]}",
				       (unsigned long long)pos, (unsigned long long)(pos + nb));
		im.nbytes[i] = nb;
		im.off[i] = pos; /* relative for now */
		pos += nb;
	}
	jl += (size_t)snprintf(json + jl, sizeof(json) - jl, "}");
	assert_true(jl < sizeof(json));
	hl = (jl + 7) / 8 * 8;
	im.data_start = 8 + hl;
	im.len = (size_t)(8 + hl + pos);
	im.n = n;
	im.buf = malloc(im.len);
	assert_non_null(im.buf);
	for (int i = 0; i < 8; i++)
		im.buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	memcpy(im.buf + 8, json, jl);
	memset(im.buf + 8 + jl, ' ', hl - jl);
	for (size_t i = 0; i < n; i++) {
		im.off[i] += im.data_start;
		fill(im.buf + im.off[i], im.nbytes[i], t[i].seed);
	}
	return im;
}

/*
 * The standard test model: a header, a small tensor, a 2-D F32 tensor, a big
 * tensor split in 64 KiB pieces (3 whole + 1 short), an empty tensor, a
 * tensor just over max_shard, and a 1-byte tensor.
 */
static const struct tdesc MODEL[] = {
	{"a.weight", "U8", 1, {1000, 0}, 1},
	{"b.weight", "F32", 2, {100, 100}, 2},
	{"big.weight", "U8", 1, {3 * 65536 + 3392, 0}, 3},
	{"empty", "F32", 1, {0, 0}, 4},
	{"c.weight", "F16", 2, {35000, 1}, 5},
	{"d.bias", "U8", 1, {1, 0}, 6},
};
#define N_MODEL HWFS_ARRAY_SIZE(MODEL)

static struct img model_img(uint64_t seed_bump)
{
	struct tdesc t[N_MODEL];

	memcpy(t, MODEL, sizeof(t));
	for (size_t i = 0; i < N_MODEL; i++)
		t[i].seed += seed_bump;
	return build_st(t, N_MODEL);
}

static struct st_header *parse_img(const struct img *im)
{
	struct st_header *h = NULL;
	char err[256] = "";

	if (st_parse(im->buf, im->len, im->len, &h, err, sizeof(err)) < 0)
		print_error("st_parse: %s\n", err);
	assert_non_null(h);
	return h;
}

/* ---- writer drivers ---- */

static struct writer *new_writer(struct fx *f)
{
	struct writer *w = NULL;

	assert_int_equal(writer_create(f->s, &w), 0);
	assert_non_null(w);
	return w;
}

static void write_seq(struct writer *w, const uint8_t *buf, uint64_t from, uint64_t to,
		      size_t chunk)
{
	for (uint64_t off = from; off < to;) {
		size_t n = (size_t)HWFS_MIN((uint64_t)chunk, to - off);

		assert_int_equal(writer_write(w, off, buf + off, n), 0);
		off += n;
	}
}

static void check_read(struct writer *w, const uint8_t *ref, uint64_t size)
{
	uint8_t *got = malloc(size + 100);

	assert_non_null(got);
	assert_int_equal(writer_size(w), size);
	memset(got, 0xAB, size + 100);
	assert_int_equal(writer_read(w, 0, size + 100, got), size);
	if (size)
		assert_memory_equal(got, ref, size);
	/* A few ranges not starting at 0, one crossing the end. */
	if (size > 10) {
		uint64_t mid = size / 3;

		assert_int_equal(writer_read(w, mid, 7, got), 7);
		assert_memory_equal(got, ref + mid, 7);
		assert_int_equal(writer_read(w, size - 5, 50, got), 5);
		assert_memory_equal(got, ref + size - 5, 5);
	}
	assert_int_equal(writer_read(w, size, 10, got), 0);
	assert_int_equal(writer_read(w, size + 1000, 10, got), 0);
	free(got);
}

static struct ingest_result finish(struct writer *w)
{
	struct ingest_result r;

	memset(&r, 0x5A, sizeof(r));
	assert_int_equal(writer_finish(w, &r), 0);
	return r;
}

/* Extents tile [0,size); every extent is a whole shard with the right bytes and hash. */
static void check_result(struct fx *f, const struct ingest_result *r, const uint8_t *ref,
			 uint64_t size)
{
	uint64_t pos = 0;

	assert_int_equal(r->size, size);
	if (size == 0)
		assert_int_equal(r->n_ext, 0);
	for (size_t i = 0; i < r->n_ext; i++) {
		const struct fext *e = &r->ext[i];
		hwfs_hash_t h;

		assert_int_equal(e->off, pos);
		assert_true(e->len > 0);
		assert_non_null(e->sh);
		assert_int_equal(e->sh->size, e->len);
		assert_true(e->sh->refs >= 1);
		assert_ptr_equal(store_lookup(f->s, &e->sh->hash), e->sh);
		assert_memory_equal(store_shard_data(f->s, e->sh), ref + e->off, e->len);
		hwfs_hash_buf(ref + e->off, e->len, &h);
		assert_memory_equal(h.b, e->sh->hash.b, HWFS_HASH_LEN);
		assert_int_equal(ingest_fext_find(r->ext, r->n_ext, e->off), i);
		assert_int_equal(ingest_fext_find(r->ext, r->n_ext, e->off + e->len - 1), i);
		pos += e->len;
	}
	assert_int_equal(pos, size);
	assert_int_equal(ingest_fext_find(r->ext, r->n_ext, size), r->n_ext);
}

/* The extents end exactly at the chunker's boundaries for @h (NULL: plain). */
static void check_cuts(const struct ingest_result *r, const struct st_header *h)
{
	uint64_t pos = 0;

	for (size_t i = 0; i < r->n_ext; i++) {
		uint64_t cut = chunker_next_cut(h, pos, MAX_SHARD, FIXED);

		cut = HWFS_MIN(cut, r->size);
		assert_int_equal(r->ext[i].off, pos);
		if (r->ext[i].off + r->ext[i].len != cut)
			print_error("extent %zu [%llu,+%llu) should end at %llu\n", i,
				    (unsigned long long)r->ext[i].off,
				    (unsigned long long)r->ext[i].len, (unsigned long long)cut);
		assert_int_equal(r->ext[i].off + r->ext[i].len, cut);
		pos = cut;
	}
	assert_int_equal(pos, r->size);
}

/*
 * After a finish + resume the tail piece of the first session stays a shard
 * of its own (cutting resumes at the old size), so only this holds: no
 * extent reaches past the chunker's boundary for its start.
 */
static void check_cuts_weak(const struct ingest_result *r, const struct st_header *h)
{
	for (size_t i = 0; i < r->n_ext; i++) {
		uint64_t cut = chunker_next_cut(h, r->ext[i].off, MAX_SHARD, FIXED);

		assert_true(r->ext[i].off + r->ext[i].len <= cut);
	}
}

/* The boundaries of MODEL computed by hand (independent of the chunker). */
static size_t model_cuts(const struct img *im, uint64_t *cuts)
{
	size_t k = 0;

	cuts[k++] = im->data_start;
	for (size_t i = 0; i < im->n; i++) {
		uint64_t end = im->off[i] + im->nbytes[i];

		for (uint64_t p = im->off[i]; p < end; p += MAX_SHARD)
			cuts[k++] = HWFS_MIN(p + MAX_SHARD, end);
	}
	return k;
}

static void check_tensors(const struct ingest_result *r, const struct img *im,
			  const struct tdesc *t)
{
	assert_null(r->st_error);
	assert_non_null(r->hdr);
	assert_non_null(r->tensors);
	assert_int_equal(r->n_tensors, im->n);
	for (size_t i = 0; i < im->n; i++) {
		const struct hwfs_trec *x = NULL;
		hwfs_hash_t h;

		for (size_t k = 0; k < r->n_tensors; k++)
			if (!strcmp(r->tensors[k].name, t[i].name))
				x = &r->tensors[k];
		assert_non_null(x);
		assert_string_equal(x->dtype, t[i].dtype);
		assert_int_equal(x->ndim, t[i].ndim);
		for (uint32_t d = 0; d < t[i].ndim; d++)
			assert_int_equal(x->shape[d], t[i].shape[d]);
		assert_int_equal(x->off, im->off[i]);
		assert_int_equal(x->len, im->nbytes[i]);
		hwfs_hash_buf(im->buf + im->off[i], im->nbytes[i], &h);
		assert_memory_equal(x->hash.b, h.b, HWFS_HASH_LEN);
	}
	/* Sorted by offset. */
	for (size_t k = 1; k < r->n_tensors; k++)
		assert_true(r->tensors[k - 1].off <= r->tensors[k].off);
}

/*
 * For the regression tests of the header-sniffing fixes: say whether @r is a valid model without
 * aborting the test, so the caller can release everything (no leak report
 * under ASan) before asserting.
 */
static int is_model(const struct ingest_result *r, const char *what)
{
	if (r->st_error || !r->hdr || !r->tensors) {
		print_error("%s reported as not safetensors: %s\n", what,
			    r->st_error ? r->st_error : "(no error, no tensors)");
		return 0;
	}
	return 1;
}

static void check_no_tensors(const struct ingest_result *r, const char *needle)
{
	assert_non_null(r->st_error);
	assert_true(strlen(r->st_error) > 0);
	if (needle && !strstr(r->st_error, needle))
		print_error("st_error '%s' does not mention '%s'\n", r->st_error, needle);
	if (needle)
		assert_non_null(strstr(r->st_error, needle));
	assert_null(r->hdr);
	assert_null(r->tensors);
	assert_int_equal(r->n_tensors, 0);
}

static void check_clean(struct fx *f, uint64_t used0, uint64_t bytes0, uint64_t count0)
{
	uint64_t b, c;

	usage(f, &b, &c);
	assert_int_equal(b, bytes0);
	assert_int_equal(c, count0);
	assert_int_equal(arena_used_of(f), used0);
}

/*
 * The end of a test that wrote the model @im through @w: close the writer,
 * check its bytes and that it is reported as the model (@what names the case
 * in the failure), with its tensors; then release everything and check that
 * the store is empty again.  Frees im->buf.
 */
static void finish_model(struct fx *f, struct writer *w, struct img *im, const char *what)
{
	struct ingest_result r = finish(w);
	int ok;

	check_result(f, &r, im->buf, im->len);
	ok = is_model(&r, what);
	if (ok)
		check_tensors(&r, im, MODEL);
	ingest_result_clear(f->s, &r);
	check_clean(f, 0, 0, 0);
	free(im->buf);
	assert_true(ok);
}

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
