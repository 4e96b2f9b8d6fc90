/*
 * delta_util.h — what the two unit tests of the delta codec share
 * (test_delta.c: round trips and the encoded form; test_delta_refuse.c: the
 * decoder's refusals): random and mutated buffers, hand-written headers and
 * zstd frames, the encode-or-fail and must-refuse checks.  Included by a
 * test file only; a test that does not use a helper is not warned about it.
 */
#ifndef HWFS_TEST_DELTA_UTIL_H
#define HWFS_TEST_DELTA_UTIL_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wunused-const-variable"

#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define ZBLOCK (128u << 10) /* zstd's largest block */

static const size_t lens[] = {0, 1, 7, 4097, MIB + 3, 3 * DELTA_BLOCK + 1};
static const unsigned widths[] = {1, 2, 4, 8};

/* ---- helpers ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static uint8_t *xmalloc(size_t n)
{
	uint8_t *p = malloc(n ? n : 1);

	assert_non_null(p);
	return p;
}

static uint8_t *random_buf(size_t n)
{
	uint8_t *p = xmalloc(n);

	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)rnd();
	return p;
}

/* A copy of @base with about one byte in @every changed (never to itself). */
static uint8_t *mutated_every(const uint8_t *base, size_t n, unsigned every)
{
	uint8_t *p = xmalloc(n);

	memcpy(p, base, n);
	for (size_t i = 0; i < n; i++)
		if (rnd() % every == 0)
			p[i] ^= (uint8_t)(1 + rnd() % 255);
	return p;
}

/* A copy of @base with about one byte in 50 changed. */
static uint8_t *mutated(const uint8_t *base, size_t n)
{
	return mutated_every(base, n, 50);
}

/* A codec context at @level encoding @format. */
static struct delta_ctx *ctx_format(int level, unsigned format)
{
	struct delta_ctx *cx = delta_ctx_new(level);

	assert_non_null(cx);
	assert_int_equal(delta_ctx_set_format(cx, format), 0);
	return cx;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* A format-@fmt delta header declaring @len bytes at width @width. */
static void put_hdr_fmt(uint8_t *p, unsigned fmt, uint64_t len, unsigned width)
{
	memcpy(p, "HWDL", 4);
	p[4] = (uint8_t)fmt;
	p[5] = (uint8_t)width;
	p[6] = fmt == 2 ? DELTA_BLOCK_LOG : 0;
	p[7] = 0;
	put_le64(p + 8, len);
}

/* A format-1 delta header (one frame for the whole shard). */
static void put_hdr(uint8_t *p, uint64_t len, unsigned width)
{
	put_hdr_fmt(p, 1, len, width);
}

/* Encode @nw against @base with room for any result; returns the length. */
static size_t encode_ok(struct delta_ctx *cx, const uint8_t *base, const uint8_t *nw, size_t len,
                        unsigned width, uint8_t **enc)
{
	size_t cap = DELTA_HDR + ZSTD_compressBound(len);
	ssize_t n;

	*enc = xmalloc(cap);
	n = delta_encode(cx, base, nw, len, width, *enc, cap);
	assert_true(n > DELTA_HDR);
	assert_true((size_t)n <= cap);
	return (size_t)n;
}

/* Decode @enc against @base for @len bytes, expecting -EBADMSG with a
 * reason containing @why. */
static void refused(struct delta_ctx *cx, const uint8_t *base, size_t len, const uint8_t *enc,
                    size_t enc_len, const char *why)
{
	uint8_t *out = xmalloc(len);
	char err[256] = "";

	assert_int_equal(delta_decode(cx, base, len, enc, enc_len, out, err, sizeof(err)),
	                 -EBADMSG);
	if (!strstr(err, why))
		fail_msg("reason '%s' does not say '%s'", err, why);
	for (const char *p = err; *p; p++)
		assert_true(*p >= 0x20 && *p < 0x7f);
	free(out);
}

/*
 * A zstd frame, written by hand, of @content zero bytes as RLE blocks of at
 * most 128 KiB (4 bytes each), whose header declares @fcs in a 4-byte field
 * and a window of 2^@wlog bytes (not single-segment).  Returns its length;
 * @f must hold 10 + 4 * ceil(content / 128 KiB) bytes.
 */
static size_t rle_frame(uint8_t *f, uint32_t fcs, uint64_t content, unsigned wlog)
{
	size_t p = 0;

	put_le32(f, ZSTD_MAGICNUMBER);
	p = 4;
	f[p++] = 0x80;                        /* FCS field 4 bytes, no flags */
	f[p++] = (uint8_t)((wlog - 10) << 3); /* window descriptor, mantissa 0 */
	put_le32(f + p, fcs);
	p += 4;
	do {
		uint32_t bs = content < ZBLOCK ? (uint32_t)content : ZBLOCK, h;

		content -= bs;
		h = bs << 3 | 1u << 1 | (content == 0); /* RLE block, last? */
		f[p++] = (uint8_t)h;
		f[p++] = (uint8_t)(h >> 8);
		f[p++] = (uint8_t)(h >> 16);
		f[p++] = 0; /* the repeated byte */
	} while (content);
	return p;
}

static size_t rle_frame_size(uint64_t content)
{
	return 10 + 4 * (content ? (content + ZBLOCK - 1) / ZBLOCK : 1);
}


#pragma GCC diagnostic pop

#endif /* HWFS_TEST_DELTA_UTIL_H */
