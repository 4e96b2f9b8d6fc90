/*
 * ingest_util.h — what the two unit tests of the writer share (test_ingest.c,
 * test_ingest_resume.c): the fixture (a real store in a fresh directory under
 * /dev/shm, small tunables, both restored after each test), safetensors images
 * built in memory, and the checks every result goes through (see
 * test_ingest.c's header).  Included by a test file only; a test that does
 * not use a helper is not warned about it.
 */
#ifndef HWFS_TEST_INGEST_UTIL_H
#define HWFS_TEST_INGEST_UTIL_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wunused-const-variable"

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


#pragma GCC diagnostic pop

#endif /* HWFS_TEST_INGEST_UTIL_H */
