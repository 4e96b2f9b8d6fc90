/*
 * delta.c — the element-level delta codec (API and encoded form: delta.h).
 *
 * Encoding is one pass and one call: the XOR of base and new is written
 * straight into its shuffled place in the context's scratch buffer (plane k
 * holds byte k of every whole element, then come the len % width tail bytes
 * as they are), and zstd compresses the scratch in a single frame that
 * declares its content size, directly into the caller's buffer after the
 * header and never past its capacity: a delta that does not fit is -E2BIG,
 * and the caller sends the whole shard.
 *
 * Decoding trusts nothing it reads.  Before any byte is decompressed the
 * header is checked (delta_peek()), the declared length must be the
 * caller's, and the zstd frame header must be a regular frame without a
 * dictionary that declares exactly that content size, with a window no
 * larger than DELTA_WINDOW_LOG_MAX (or than the shard itself), and whose
 * compressed size is all that is left of the input.  zstd then decompresses
 * one-shot into scratch of exactly that length (a frame whose blocks hold
 * more fails there, having written at most the length), and one pass
 * unshuffles and XORs it with the base into the caller's buffer.
 *
 * The shuffle loops for widths 2, 4 and 8 run over blocks of SHUF_BLOCK
 * elements: a constant trip count the compiler vectorises whole even at
 * -O2 (GCC's very-cheap cost model), with the bytes of the block's elements
 * gathered from (or scattered to) the planes by vector permutes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "delta.h"
#include "hwfs_common.h"
#include "safetensors.h"

static const uint8_t delta_magic[4] = {'H', 'W', 'D', 'L'};

/*
 * The largest zstd window a delta may ask for, as a power of two: 128 MiB,
 * what zstd's strongest levels use (the levels hwfs encodes at, 1..19, use
 * at most 8 MiB).  Decoding is one-shot into a buffer of the shard's length,
 * so this bounds nothing today; it keeps a later streaming decoder from
 * having to allocate what a hostile frame asks for.
 */
#define DELTA_WINDOW_LOG_MAX 27

/* Elements per inner shuffle loop (see the header comment). */
#define SHUF_BLOCK 64

struct delta_ctx {
	ZSTD_CCtx *cc;
	ZSTD_DCtx *dc;
	uint8_t *scratch; /* the shuffled XOR: grows to the largest shard */
	size_t scratch_cap;
};

/*
 * Create a context: zstd contexts set to compress at @level with the content
 * size in the frame and no checksum (the caller hashes the rebuilt shard),
 * and to refuse windows above DELTA_WINDOW_LOG_MAX (zstd applies that to
 * streaming only; check_frame() applies it to our one-shot decoding).
 * NULL when out of memory.
 */
struct delta_ctx *delta_ctx_new(int level)
{
	struct delta_ctx *cx = calloc(1, sizeof(*cx));

	if (!cx)
		return NULL;
	cx->cc = ZSTD_createCCtx();
	cx->dc = ZSTD_createDCtx();
	if (!cx->cc || !cx->dc)
		goto fail;
	/* An out-of-range level is clamped by zstd, not refused. */
	if (ZSTD_isError(ZSTD_CCtx_setParameter(cx->cc, ZSTD_c_compressionLevel, level)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(cx->cc, ZSTD_c_contentSizeFlag, 1)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(cx->cc, ZSTD_c_checksumFlag, 0)) ||
	    ZSTD_isError(ZSTD_DCtx_setParameter(cx->dc, ZSTD_d_windowLogMax, DELTA_WINDOW_LOG_MAX)))
		goto fail;
	return cx;
fail:
	delta_ctx_free(cx);
	return NULL;
}

/* Free @cx, its zstd contexts and its scratch buffer.  NULL is a no-op. */
void delta_ctx_free(struct delta_ctx *cx)
{
	if (!cx)
		return;
	ZSTD_freeCCtx(cx->cc);
	ZSTD_freeDCtx(cx->dc);
	free(cx->scratch);
	free(cx);
}

/*
 * Make the scratch buffer hold at least @len bytes (and never be NULL, so
 * zstd always gets a real pointer).  Returns 0 or -ENOMEM, the old buffer
 * then kept.
 */
static int scratch_reserve(struct delta_ctx *cx, size_t len)
{
	uint8_t *p;

	if (len < 1)
		len = 1;
	if (cx->scratch && cx->scratch_cap >= len)
		return 0;
	p = realloc(cx->scratch, len);
	if (!p)
		return -ENOMEM;
	cx->scratch = p;
	cx->scratch_cap = len;
	return 0;
}

/*
 * The width of safetensors dtype @dtype: its size in bytes when that is 1,
 * 2, 4 or 8, except C64 (a pair of F32: their bytes change together as
 * 4-byte elements do); 1 for NULL, an unknown or a sub-byte dtype.
 */
unsigned delta_width(const char *dtype)
{
	unsigned bits = st_dtype_bits(dtype);

	if (bits == 64 && !strcmp(dtype, "C64"))
		return 4;
	switch (bits) {
	case 16:
		return 2;
	case 32:
		return 4;
	case 64:
		return 8;
	default:
		return 1;
	}
}

/* @w if it is a width the format knows (2, 4, 8), else 1. */
static unsigned norm_width(unsigned w)
{
	return w == 2 || w == 4 || w == 8 ? w : 1;
}

/*
 * One block of SHUF_BLOCK elements of @W bytes (2, 4 or 8, a constant once
 * inlined): byte k of element j of @a ^ @b goes to plane k, d<k>[j].  The
 * planes are separate restrict pointers so the compiler knows the stores
 * do not alias, the trip count is constant so it needs no epilogue: GCC
 * vectorises it at -O2 (16-byte vectors, permutes gathering the bytes).
 */
static inline __attribute__((always_inline)) void
xor_shuffle_block(const unsigned W, uint8_t *restrict d0, uint8_t *restrict d1,
                  uint8_t *restrict d2, uint8_t *restrict d3, uint8_t *restrict d4,
                  uint8_t *restrict d5, uint8_t *restrict d6, uint8_t *restrict d7,
                  const uint8_t *restrict a, const uint8_t *restrict b)
{
	for (size_t j = 0; j < SHUF_BLOCK; j++) {
		d0[j] = a[j * W] ^ b[j * W];
		d1[j] = a[j * W + 1] ^ b[j * W + 1];
		if (W >= 4) {
			d2[j] = a[j * W + 2] ^ b[j * W + 2];
			d3[j] = a[j * W + 3] ^ b[j * W + 3];
		}
		if (W == 8) {
			d4[j] = a[j * W + 4] ^ b[j * W + 4];
			d5[j] = a[j * W + 5] ^ b[j * W + 5];
			d6[j] = a[j * W + 6] ^ b[j * W + 6];
			d7[j] = a[j * W + 7] ^ b[j * W + 7];
		}
	}
}

/*
 * s = shuffle(a ^ b) for @n whole elements of @W bytes: byte k of element
 * i goes to s[k * n + i].  Whole blocks go through xor_shuffle_block(), the
 * last n % SHUF_BLOCK elements byte by byte.
 */
static inline __attribute__((always_inline)) void
xor_shuffle_w(uint8_t *s, const uint8_t *a, const uint8_t *b, size_t n, const unsigned W)
{
	uint8_t *p[8];
	size_t i = 0;

	for (unsigned k = 0; k < 8; k++)
		p[k] = s + (k < W ? k : 0) * n;
	for (; i + SHUF_BLOCK <= n; i += SHUF_BLOCK)
		xor_shuffle_block(W, p[0] + i, p[1] + i, p[2] + i, p[3] + i, p[4] + i, p[5] + i,
		                  p[6] + i, p[7] + i, a + i * W, b + i * W);
	for (; i < n; i++)
		for (unsigned k = 0; k < W; k++)
			s[k * n + i] = a[i * W + k] ^ b[i * W + k];
}

/* The inverse of xor_shuffle_block(): o[j * W + k] = base ^ d<k>[j]. */
static inline __attribute__((always_inline)) void
unshuffle_xor_block(const unsigned W, uint8_t *restrict o, const uint8_t *restrict base,
                    const uint8_t *restrict d0, const uint8_t *restrict d1,
                    const uint8_t *restrict d2, const uint8_t *restrict d3,
                    const uint8_t *restrict d4, const uint8_t *restrict d5,
                    const uint8_t *restrict d6, const uint8_t *restrict d7)
{
	for (size_t j = 0; j < SHUF_BLOCK; j++) {
		o[j * W] = base[j * W] ^ d0[j];
		o[j * W + 1] = base[j * W + 1] ^ d1[j];
		if (W >= 4) {
			o[j * W + 2] = base[j * W + 2] ^ d2[j];
			o[j * W + 3] = base[j * W + 3] ^ d3[j];
		}
		if (W == 8) {
			o[j * W + 4] = base[j * W + 4] ^ d4[j];
			o[j * W + 5] = base[j * W + 5] ^ d5[j];
			o[j * W + 6] = base[j * W + 6] ^ d6[j];
			o[j * W + 7] = base[j * W + 7] ^ d7[j];
		}
	}
}

/*
 * out = base ^ unshuffle(s) for @n whole elements of @W bytes: the inverse
 * of xor_shuffle_w().
 */
static inline __attribute__((always_inline)) void
unshuffle_xor_w(uint8_t *out, const uint8_t *base, const uint8_t *s, size_t n, const unsigned W)
{
	const uint8_t *p[8];
	size_t i = 0;

	for (unsigned k = 0; k < 8; k++)
		p[k] = s + (k < W ? k : 0) * n;
	for (; i + SHUF_BLOCK <= n; i += SHUF_BLOCK)
		unshuffle_xor_block(W, out + i * W, base + i * W, p[0] + i, p[1] + i, p[2] + i,
		                    p[3] + i, p[4] + i, p[5] + i, p[6] + i, p[7] + i);
	for (; i < n; i++)
		for (unsigned k = 0; k < W; k++)
			out[i * W + k] = base[i * W + k] ^ s[k * n + i];
}

/*
 * s = a ^ b for @len bytes (width 1, and the tail of the wider widths), in
 * blocks of SHUF_BLOCK bytes for the vectoriser as above.
 */
static void xor_bytes(uint8_t *restrict s, const uint8_t *restrict a, const uint8_t *restrict b,
                      size_t len)
{
	size_t i = 0;

	for (; i + SHUF_BLOCK <= len; i += SHUF_BLOCK)
		for (size_t j = 0; j < SHUF_BLOCK; j++)
			s[i + j] = a[i + j] ^ b[i + j];
	for (; i < len; i++)
		s[i] = a[i] ^ b[i];
}

/*
 * Write shuffle(@a ^ @b) (@len bytes, width @w in 1/2/4/8) into @s: the
 * planes of the len / w whole elements, then the len % w tail bytes.
 */
static void xor_shuffle(uint8_t *restrict s, const uint8_t *a, const uint8_t *b, size_t len,
                        unsigned w)
{
	size_t n = len / w, whole = n * w;

	switch (w) {
	case 2:
		xor_shuffle_w(s, a, b, n, 2);
		break;
	case 4:
		xor_shuffle_w(s, a, b, n, 4);
		break;
	case 8:
		xor_shuffle_w(s, a, b, n, 8);
		break;
	default:
		whole = 0;
		break;
	}
	xor_bytes(s + whole, a + whole, b + whole, len - whole);
}

/* Write @base ^ unshuffle(@s) into @out: the inverse of xor_shuffle(). */
static void unshuffle_xor(uint8_t *restrict out, const uint8_t *base, const uint8_t *s, size_t len,
                          unsigned w)
{
	size_t n = len / w, whole = n * w;

	switch (w) {
	case 2:
		unshuffle_xor_w(out, base, s, n, 2);
		break;
	case 4:
		unshuffle_xor_w(out, base, s, n, 4);
		break;
	case 8:
		unshuffle_xor_w(out, base, s, n, 8);
		break;
	default:
		whole = 0;
		break;
	}
	xor_bytes(out + whole, base + whole, s + whole, len - whole);
}

/* Store @v little-endian in the 8 bytes at @p. */
static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* The little-endian 64-bit integer at @p. */
static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/*
 * Encode @new_ against @base (@len bytes each) at width @width into @out
 * (at most @cap bytes): the shuffled XOR into the scratch, compressed by
 * zstd into @out + DELTA_HDR, then the header.  Returns the encoded length;
 * -E2BIG when it does not fit in @cap (@out's content then undefined),
 * -ENOMEM when the scratch or zstd's own memory cannot be had.
 */
ssize_t delta_encode(struct delta_ctx *cx, const void *base, const void *new_, size_t len,
                     unsigned width, void *out, size_t cap)
{
	uint8_t *o = out;
	size_t r;
	int rc;

	width = norm_width(width);
	if (cap > SSIZE_MAX)
		cap = SSIZE_MAX;
	if (cap < DELTA_HDR)
		return -E2BIG;
	rc = scratch_reserve(cx, len);
	if (rc)
		return rc;
	xor_shuffle(cx->scratch, base, new_, len, width);
	/* ZSTD_compress2() declares @len as the frame's content size. */
	r = ZSTD_compress2(cx->cc, o + DELTA_HDR, cap - DELTA_HDR, cx->scratch, len);
	if (ZSTD_isError(r))
		/* With sizes and parameters zstd accepted, running out of
		 * room or memory are its only failures. */
		return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? -E2BIG : -ENOMEM;
	memcpy(o, delta_magic, sizeof(delta_magic));
	o[4] = DELTA_FORMAT;
	o[5] = (uint8_t)width;
	o[6] = o[7] = 0;
	put_le64(o + 8, len);
	return (ssize_t)(DELTA_HDR + r);
}

/*
 * Check the header of @enc (@enc_len bytes) and return what it declares in
 * *@len and *@width (either may be NULL).  Returns 0 or -EBADMSG with a
 * one-line reason in @err.
 */
int delta_peek(const void *enc, size_t enc_len, uint64_t *len, unsigned *width, char *err,
               size_t errlen)
{
	const uint8_t *e = enc;

	if (enc_len < DELTA_HDR) {
		hwfs_set_err(err, errlen, "delta of %zu bytes is shorter than its %d-byte header",
		             enc_len, DELTA_HDR);
		return -EBADMSG;
	}
	if (memcmp(e, delta_magic, sizeof(delta_magic))) {
		hwfs_set_err(err, errlen, "not a delta (bad magic)");
		return -EBADMSG;
	}
	if (e[4] != DELTA_FORMAT) {
		hwfs_set_err(err, errlen, "delta format version %u (this node reads %d)", e[4],
		             DELTA_FORMAT);
		return -EBADMSG;
	}
	if (norm_width(e[5]) != e[5]) {
		hwfs_set_err(err, errlen, "delta element width %u (not 1, 2, 4 or 8)", e[5]);
		return -EBADMSG;
	}
	if (e[6] || e[7]) {
		hwfs_set_err(err, errlen, "delta reserved bytes are not zero");
		return -EBADMSG;
	}
	if (len)
		*len = get_le64(e + 8);
	if (width)
		*width = e[5];
	return 0;
}

/* The little-endian 32-bit integer at @p. */
static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/*
 * The window size of the zstd frame whose header (already parsed by zstd,
 * so present) starts at @f: the content size for a single-segment frame,
 * else what its window descriptor says (RFC 8878, 3.1.1.1.2).
 */
static uint64_t frame_window(const uint8_t *f, uint64_t content)
{
	uint64_t base;

	if (f[4] & 0x20) /* Single_Segment_Flag */
		return content;
	base = 1ull << (10 + (f[5] >> 3));
	return base + base / 8 * (f[5] & 7);
}

/*
 * Check that the zstd frame @f (@flen bytes, what follows the header) is
 * exactly one regular frame rebuilding @len bytes, without decompressing it
 * (zstd's stable API only).  Returns 0 or -EBADMSG with a one-line reason
 * in @err.
 */
static int check_frame(const uint8_t *f, size_t flen, size_t len, char *err, size_t errlen)
{
	unsigned long long fcs;
	uint64_t window;
	size_t r;

	if (!flen) {
		hwfs_set_err(err, errlen, "no zstd frame after the delta header");
		return -EBADMSG;
	}
	if (flen < 4) {
		hwfs_set_err(err, errlen, "truncated zstd frame (%zu bytes)", flen);
		return -EBADMSG;
	}
	if (get_le32(f) != ZSTD_MAGICNUMBER) {
		hwfs_set_err(err, errlen, "no zstd frame after the delta header (magic %08x)",
		             get_le32(f));
		return -EBADMSG;
	}
	fcs = ZSTD_getFrameContentSize(f, flen);
	if (fcs == ZSTD_CONTENTSIZE_ERROR) {
		hwfs_set_err(err, errlen, "truncated or corrupt zstd frame header");
		return -EBADMSG;
	}
	if (fcs == ZSTD_CONTENTSIZE_UNKNOWN) {
		hwfs_set_err(err, errlen, "the zstd frame does not declare its content size");
		return -EBADMSG;
	}
	if (fcs != len) {
		hwfs_set_err(err, errlen, "the zstd frame declares %llu bytes, the shard has %zu",
		             fcs, len);
		return -EBADMSG;
	}
	if (ZSTD_getDictID_fromFrame(f, flen)) {
		hwfs_set_err(err, errlen, "the zstd frame needs a dictionary");
		return -EBADMSG;
	}
	window = frame_window(f, fcs);
	if (window > 1ull << DELTA_WINDOW_LOG_MAX && window != len) {
		hwfs_set_err(err, errlen, "zstd window of %llu bytes (limit %llu)",
		             (unsigned long long)window, 1ull << DELTA_WINDOW_LOG_MAX);
		return -EBADMSG;
	}
	r = ZSTD_findFrameCompressedSize(f, flen);
	if (ZSTD_isError(r)) {
		hwfs_set_err(err, errlen, "truncated or corrupt zstd frame (%s)",
		             ZSTD_getErrorName(r));
		return -EBADMSG;
	}
	if (r != flen) {
		hwfs_set_err(err, errlen, "%zu trailing bytes after the zstd frame", flen - r);
		return -EBADMSG;
	}
	return 0;
}

/*
 * Rebuild @len bytes into @out from @base and the delta @enc: header and
 * frame checked first (delta_peek(), check_frame()), then decompressed into
 * the scratch (capacity exactly @len), then unshuffled and XORed with
 * @base.  Returns 0, -EBADMSG with a one-line reason in @err (@out then
 * undefined), or -ENOMEM when the scratch cannot grow to @len.
 */
int delta_decode(struct delta_ctx *cx, const void *base, size_t len, const void *enc,
                 size_t enc_len, void *out, char *err, size_t errlen)
{
	const uint8_t *f = (const uint8_t *)enc + DELTA_HDR;
	uint64_t dlen;
	unsigned width;
	size_t r, flen;
	int rc;

	rc = delta_peek(enc, enc_len, &dlen, &width, err, errlen);
	if (rc)
		return rc;
	if (dlen != len) {
		hwfs_set_err(err, errlen, "delta declares %llu bytes, the shard has %zu",
		             (unsigned long long)dlen, len);
		return -EBADMSG;
	}
	flen = enc_len - DELTA_HDR;
	rc = check_frame(f, flen, len, err, errlen);
	if (rc)
		return rc;
	rc = scratch_reserve(cx, len);
	if (rc) {
		hwfs_set_err(err, errlen, "no memory for a %zu-byte delta", len);
		return rc;
	}
	r = ZSTD_decompressDCtx(cx->dc, cx->scratch, len, f, flen);
	if (ZSTD_isError(r)) {
		hwfs_set_err(err, errlen, "zstd: %s", ZSTD_getErrorName(r));
		return ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation ? -ENOMEM : -EBADMSG;
	}
	if (r != len) { /* zstd checks the declared size; kept as a guard */
		hwfs_set_err(err, errlen, "the zstd frame holds %zu bytes, the shard has %zu", r,
		             len);
		return -EBADMSG;
	}
	unshuffle_xor(out, base, cx->scratch, len, width);
	return 0;
}

/*
 * Whether the elements of @W bytes (a constant once inlined) at @x and @y
 * differ: one load of each as an integer of that width.
 */
static inline __attribute__((always_inline)) unsigned elem_ne(const uint8_t *x, const uint8_t *y,
                                                              const unsigned W)
{
	uint16_t h, k;
	uint32_t u, v;
	uint64_t q, r;

	switch (W) {
	case 1:
		return x[0] != y[0];
	case 2:
		memcpy(&h, x, 2);
		memcpy(&k, y, 2);
		return h != k;
	case 4:
		memcpy(&u, x, 4);
		memcpy(&v, y, 4);
		return u != v;
	default:
		memcpy(&q, x, 8);
		memcpy(&r, y, 8);
		return q != r;
	}
}

/*
 * Count the elements of @W bytes that differ between @a and @b (@n whole
 * elements), in blocks of SHUF_BLOCK elements for the vectoriser.
 */
static inline __attribute__((always_inline)) uint64_t count_w(const uint8_t *a, const uint8_t *b,
                                                              size_t n, const unsigned W)
{
	uint64_t c = 0;
	size_t i = 0;

	for (; i + SHUF_BLOCK <= n; i += SHUF_BLOCK) {
		const uint8_t *pa = a + i * W, *pb = b + i * W;
		unsigned bc = 0;

		for (size_t j = 0; j < SHUF_BLOCK; j++)
			bc += elem_ne(pa + j * W, pb + j * W, W);
		c += bc;
	}
	for (; i < n; i++)
		c += elem_ne(a + i * W, b + i * W, W);
	return c;
}

/*
 * The number of elements of width @width (normalised as delta_encode())
 * that differ between @a and @b (@len bytes each); a trailing partial
 * element counts as one.
 */
uint64_t delta_count_diff(const void *a, const void *b, size_t len, unsigned width)
{
	const uint8_t *pa = a, *pb = b;
	unsigned w = norm_width(width);
	size_t n = len / w, whole = n * w;
	uint64_t c;

	switch (w) {
	case 2:
		c = count_w(pa, pb, n, 2);
		break;
	case 4:
		c = count_w(pa, pb, n, 4);
		break;
	case 8:
		c = count_w(pa, pb, n, 8);
		break;
	default:
		c = count_w(pa, pb, n, 1);
		break;
	}
	if (len > whole && memcmp(pa + whole, pb + whole, len - whole))
		c++;
	return c;
}
