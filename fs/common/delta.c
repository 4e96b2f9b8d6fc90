/*
 * delta.c — the element-level delta codec (API and encoded forms: delta.h).
 *
 * Format 2 (what delta_encode() writes) cuts the shard into blocks of
 * DELTA_BLOCK bytes (128 KiB) and makes each block its own zstd frame,
 * compressed straight into the caller's buffer after the frames before it
 * and never past its capacity: a delta that does not fit is -E2BIG (found
 * as soon as it overflows, so a shard not worth a delta costs only what was
 * encoded), and the caller sends the whole shard.  A block's content is
 * made in the context's block buffer, which stays in the L2 cache, so the
 * shard's two versions are read once and only the frames are written.
 *
 * Most blocks of an RL step are sparse: about 2% of their bf16 elements
 * changed, scattered.  zstd spends its time there on the zero runs between
 * them (a sequence per changed byte, 0.3 CPU-s per GiB either way), so the
 * encoder first scans the block a 64-bit word at a time for changed
 * elements and, when listing them (gaps, then their XOR by planes) is
 * shorter than the block, compresses that list instead: zstd then sees 3%
 * of the bytes.  Otherwise (a dense block, or its list would be no
 * shorter) the block's XOR is shuffled by element width, as in format 1.
 * The two are told apart by the frame's content size alone (delta.h).
 *
 * Decoding a format-2 delta is the mirror image, again one pass over memory:
 * each frame is decompressed one-shot into the block buffer (capacity the
 * block's length, no further: a frame holding more fails there), then a
 * dense block is unshuffled and XORed with the base into the caller's
 * buffer, a sparse one is the base copied there with its changed elements
 * XORed in, and for delta_decode_hash() that block of the output is fed to
 * a streaming XXH3-128 while it is still in the cache, so the caller needs
 * no second pass to check the rebuilt shard's hash.
 *
 * Format 1 (one frame for the whole shard, shuffled as a whole) is still
 * decoded, for a node of an earlier build that sends it: the whole frame is
 * decompressed into the context's scratch buffer of exactly the shard's
 * length, then unshuffled, XORed and hashed in chunks of DELTA_BLOCK bytes of
 * output.  delta_ctx_set_format() makes a context encode it (for the tests,
 * the benchmark and a cluster of mixed builds).
 *
 * Decoding trusts nothing it reads.  Before any byte of a frame is
 * decompressed the header is checked (delta_peek()), the declared length
 * must be the caller's, and the zstd frame header must be a regular frame
 * without a dictionary that declares its content size (exactly the shard's
 * for format 1, at most the block's for format 2), with a window no larger
 * than DELTA_WINDOW_LOG_MAX (or than that content), lying whole within what
 * is left of the input; after the last frame nothing may be left.  A sparse
 * block's list is checked whole (count, every gap, the values' length)
 * before any of it is applied, and can name no element outside its block.
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
#include <xxhash.h>

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

/*
 * Format 2's frame content for a block of bl bytes (delta.h) is dense, the
 * block's shuffled XOR, exactly bl bytes; or sparse, fewer: the number m of
 * changed elements (4 bytes), m gaps (LEB128: the unchanged elements before
 * each changed one, since the previous), then the changed elements' XOR as
 * w planes of m bytes.
 */
#define SPARSE_HDR 4
#define GAP_MAX_BYTES 3 /* a gap < DELTA_BLOCK < 2^21 */

/*
 * The encoder lists a block's changes only while the list stays under
 * 1/SPARSE_FRACTION of the bytes scanned so far, plus SPARSE_SLACK (about
 * 16% of a bf16 block's elements changed): past that the shuffled block
 * compresses faster than the list (measured: 30% changed took 3.2 CPU-s
 * per GiB as lists, 1.9 shuffled) for a few more bytes, and a dense block
 * is given up after its first kilobytes, not half its scan.  An encoder's
 * choice, not a format rule: the decoder takes any list shorter than its
 * block.
 */
#define SPARSE_FRACTION 4
#define SPARSE_SLACK 1024

/* Elements per inner shuffle loop (see the header comment). */
#define SHUF_BLOCK 64

struct delta_ctx {
	ZSTD_CCtx *cc;
	ZSTD_DCtx *dc;
	XXH3_state_t *xs;  /* delta_decode_hash()'s running hash */
	unsigned format;   /* what delta_encode() writes: 1 or 2 (DELTA_FORMAT) */
	uint8_t *blk;      /* one block's frame content (format 2): DELTA_BLOCK bytes */
	uint8_t *vals;     /* a sparse block's changed elements while encoding: DELTA_BLOCK */
	uint8_t *scratch;  /* a whole shard's shuffled XOR (format 1): grows to the largest */
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
	cx->format = DELTA_FORMAT;
	cx->cc = ZSTD_createCCtx();
	cx->dc = ZSTD_createDCtx();
	cx->xs = XXH3_createState();
	cx->blk = malloc(DELTA_BLOCK);
	cx->vals = malloc(DELTA_BLOCK);
	if (!cx->cc || !cx->dc || !cx->xs || !cx->blk || !cx->vals)
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

/*
 * Make @cx encode format @format (1 or 2).  Returns 0 or -EINVAL for
 * another number.
 */
int delta_ctx_set_format(struct delta_ctx *cx, unsigned format)
{
	if (format != 1 && format != 2)
		return -EINVAL;
	cx->format = format;
	return 0;
}

/* Free @cx, its zstd contexts and its scratch buffer.  NULL is a no-op. */
void delta_ctx_free(struct delta_ctx *cx)
{
	if (!cx)
		return;
	ZSTD_freeCCtx(cx->cc);
	ZSTD_freeDCtx(cx->dc);
	XXH3_freeState(cx->xs);
	free(cx->blk);
	free(cx->vals);
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
 * out = base ^ unshuffle(s) for @n whole elements of @W bytes whose planes
 * lie @stride bytes apart in @s (plane k at s + k * stride): the inverse of
 * xor_shuffle_w() with stride n, or a run of elements of a longer shuffle.
 */
static inline __attribute__((always_inline)) void
unshuffle_xor_w(uint8_t *out, const uint8_t *base, const uint8_t *s, size_t stride, size_t n,
                const unsigned W)
{
	const uint8_t *p[8];
	size_t i = 0;

	for (unsigned k = 0; k < 8; k++)
		p[k] = s + (k < W ? k : 0) * stride;
	for (; i + SHUF_BLOCK <= n; i += SHUF_BLOCK)
		unshuffle_xor_block(W, out + i * W, base + i * W, p[0] + i, p[1] + i, p[2] + i,
		                    p[3] + i, p[4] + i, p[5] + i, p[6] + i, p[7] + i);
	for (; i < n; i++)
		for (unsigned k = 0; k < W; k++)
			out[i * W + k] = base[i * W + k] ^ s[k * stride + i];
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

/*
 * Write @base ^ unshuffle(@s) into @out for @n whole elements of width @w
 * (2, 4 or 8) whose planes lie @stride bytes apart in @s.
 */
static void unshuffle_xor_planes(uint8_t *restrict out, const uint8_t *base, const uint8_t *s,
                                 size_t stride, size_t n, unsigned w)
{
	switch (w) {
	case 2:
		unshuffle_xor_w(out, base, s, stride, n, 2);
		break;
	case 4:
		unshuffle_xor_w(out, base, s, stride, n, 4);
		break;
	default:
		unshuffle_xor_w(out, base, s, stride, n, 8);
		break;
	}
}

/* Write @base ^ unshuffle(@s) into @out: the inverse of xor_shuffle(). */
static void unshuffle_xor(uint8_t *restrict out, const uint8_t *base, const uint8_t *s, size_t len,
                          unsigned w)
{
	size_t n = len / w, whole = n * w;

	if (w == 1)
		whole = 0;
	else
		unshuffle_xor_planes(out, base, s, n, n, w);
	xor_bytes(out + whole, base + whole, s + whole, len - whole);
}

/* The little-endian 32-bit integer at @p. */
static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Store @v little-endian in the 4 bytes at @p. */
static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/*
 * The sparse form of a block (@bl bytes of @a and @b, whole elements of @W
 * bytes, a constant once inlined) into @dst: the changed elements found a
 * 64-bit word at a time (most words are equal), their gaps written as they
 * are found and their XOR gathered in @vals, then laid out as planes.  Returns the content's length (at most
 * @bl / SPARSE_FRACTION + SPARSE_SLACK), or 0 as soon as it would pass the
 * bound above (the block is not sparse enough).
 */
static inline __attribute__((always_inline)) size_t
sparse_w(uint8_t *restrict dst, uint8_t *restrict vals, const uint8_t *a, const uint8_t *b,
         size_t bl, const unsigned W)
{
	const unsigned per = 8 / W; /* elements per word */
	size_t n = bl / W, p = SPARSE_HDR, m = 0, last = 0, i = 0;

	for (; i < n; i += per) {
		uint64_t x, y;

		if (i + per <= n) {
			memcpy(&x, a + i * W, 8);
			memcpy(&y, b + i * W, 8);
			if (x == y)
				continue;
		}
		for (size_t e = i; e < i + per && e < n; e++) {
			const uint8_t *ea = a + e * W, *eb = b + e * W;
			unsigned ne = 0;

			for (unsigned k = 0; k < W; k++)
				ne |= ea[k] ^ eb[k];
			if (!ne)
				continue;
			if (p + GAP_MAX_BYTES + (m + 1) * W >= e * W / SPARSE_FRACTION + SPARSE_SLACK)
				return 0;
			for (size_t g = e - last; ; g >>= 7) {
				dst[p++] = (uint8_t)((g & 0x7f) | (g >= 0x80 ? 0x80 : 0));
				if (g < 0x80)
					break;
			}
			for (unsigned k = 0; k < W; k++)
				vals[m * W + k] = ea[k] ^ eb[k];
			m++;
			last = e + 1;
		}
	}
	put_le32(dst, (uint32_t)m);
	for (unsigned k = 0; k < W; k++)
		for (size_t j = 0; j < m; j++)
			dst[p + k * m + j] = vals[j * W + k];
	return p + W * m;
}

/*
 * The frame content of a block: the sparse form when sparse_w() makes one
 * and it is smaller than the block (widths 2, 4, 8 need whole elements: a
 * last block with a tail is always dense), else the shuffled XOR.  Returns its length (at most the
 * block's, which means dense).
 */
static size_t block_content(struct delta_ctx *cx, const uint8_t *a, const uint8_t *b, size_t bl,
                            unsigned w)
{
	uint8_t *d = cx->blk;
	size_t r = 0;

	if (bl % w == 0) {
		switch (w) {
		case 1:
			r = sparse_w(d, cx->vals, a, b, bl, 1);
			break;
		case 2:
			r = sparse_w(d, cx->vals, a, b, bl, 2);
			break;
		case 4:
			r = sparse_w(d, cx->vals, a, b, bl, 4);
			break;
		default:
			r = sparse_w(d, cx->vals, a, b, bl, 8);
			break;
		}
	}
	if (r && r < bl) /* (a tiny block with nothing changed is not smaller) */
		return r;
	xor_shuffle(d, a, b, bl, w);
	return bl;
}

/*
 * Read the gap at @c[*p] (@clen bytes of content): at most GAP_MAX_BYTES
 * of LEB128.  Returns 0 and the gap in *@g, or -1 for a gap that runs past
 * the content or is longer.
 */
static int read_gap(const uint8_t *c, size_t clen, size_t *p, size_t *g)
{
	size_t v = 0;

	for (unsigned i = 0; i < GAP_MAX_BYTES; i++) {
		if (*p >= clen)
			return -1;
		v |= (size_t)(c[*p] & 0x7f) << (7 * i);
		if (!(c[(*p)++] & 0x80)) {
			*g = v;
			return 0;
		}
	}
	return -1;
}

/*
 * Apply the sparse block content @c (@clen bytes) to @out, which holds a
 * copy of the base's @bl bytes: checked whole first
 * (every gap well formed, every element inside the block, exactly w * m
 * bytes of values after the gaps), then each changed element XORed in.
 * Returns 0 or -EBADMSG with a reason naming block @blkno in @err.
 */
static int apply_sparse(uint8_t *out, size_t bl, unsigned w, const uint8_t *c, size_t clen,
                        size_t blkno, char *err, size_t errlen)
{
	size_t n = bl / w, m, p = SPARSE_HDR, g, idx = 0;
	const uint8_t *v;

	if (bl % w || clen < SPARSE_HDR) {
		hwfs_set_err(err, errlen, "block %zu: a sparse block %s", blkno,
		             bl % w ? "with a partial element" : "shorter than its count");
		return -EBADMSG;
	}
	m = get_le32(c);
	if (m > n) {
		hwfs_set_err(err, errlen, "block %zu: %zu changed elements of %zu", blkno, m, n);
		return -EBADMSG;
	}
	for (size_t j = 0; j < m; j++, idx++) {
		if (read_gap(c, clen, &p, &g) || g >= n - idx) {
			hwfs_set_err(err, errlen, "block %zu: bad gap before changed element %zu",
			             blkno, j);
			return -EBADMSG;
		}
		idx += g;
	}
	if (clen - p != w * m) {
		hwfs_set_err(err, errlen, "block %zu: %zu bytes of values for %zu elements", blkno,
		             clen - p, m);
		return -EBADMSG;
	}
	v = c + p;
	p = SPARSE_HDR;
	idx = 0;
	for (size_t j = 0; j < m; j++, idx++) {
		read_gap(c, clen, &p, &g);
		idx += g;
		for (unsigned k = 0; k < w; k++)
			out[idx * w + k] ^= v[k * m + j];
	}
	return 0;
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

/* The zstd error of @r as a negative errno: -E2BIG for no room, else -ENOMEM
 * (with sizes and parameters zstd accepted, its only other failure). */
static ssize_t zstd_enc_err(size_t r)
{
	return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? -E2BIG : -ENOMEM;
}

/*
 * Encode @new_ against @base (@len bytes each) at width @width into @out
 * (at most @cap bytes) in the context's format: for format 2 block by
 * block, each XORed and shuffled into the block buffer and compressed as
 * its own frame right after the previous one; for format 1 the whole
 * shuffled XOR into the scratch, compressed as one frame.  The header goes
 * in last.  Returns the encoded length; -E2BIG when it does not fit in @cap
 * (@out's content then undefined), -ENOMEM when the scratch or zstd's own
 * memory cannot be had.
 */
ssize_t delta_encode(struct delta_ctx *cx, const void *base, const void *new_, size_t len,
                     unsigned width, void *out, size_t cap)
{
	const uint8_t *a = base, *b = new_;
	uint8_t *o = out;
	size_t r, pos = DELTA_HDR, off = 0;
	int rc;

	width = norm_width(width);
	if (cap > SSIZE_MAX)
		cap = SSIZE_MAX;
	if (cap < DELTA_HDR)
		return -E2BIG;
	if (cx->format == 1) {
		rc = scratch_reserve(cx, len);
		if (rc)
			return rc;
		xor_shuffle(cx->scratch, a, b, len, width);
		/* ZSTD_compress2() declares @len as the frame's content size. */
		r = ZSTD_compress2(cx->cc, o + pos, cap - pos, cx->scratch, len);
		if (ZSTD_isError(r))
			return zstd_enc_err(r);
		pos += r;
	} else {
		do { /* one frame per block; a shard of 0 bytes has one empty frame */
			size_t bl = len - off < DELTA_BLOCK ? len - off : DELTA_BLOCK;

			size_t cl = block_content(cx, a + off, b + off, bl, width);

			r = ZSTD_compress2(cx->cc, o + pos, cap - pos, cx->blk, cl);
			if (ZSTD_isError(r))
				return zstd_enc_err(r);
			pos += r;
			off += bl;
		} while (off < len);
	}
	memcpy(o, delta_magic, sizeof(delta_magic));
	o[4] = (uint8_t)cx->format;
	o[5] = (uint8_t)width;
	o[6] = cx->format == 1 ? 0 : DELTA_BLOCK_LOG;
	o[7] = 0;
	put_le64(o + 8, len);
	return (ssize_t)pos;
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
	if (e[4] != 1 && e[4] != 2) {
		hwfs_set_err(err, errlen, "delta format version %u (this node reads 1 and 2)",
		             e[4]);
		return -EBADMSG;
	}
	if (norm_width(e[5]) != e[5]) {
		hwfs_set_err(err, errlen, "delta element width %u (not 1, 2, 4 or 8)", e[5]);
		return -EBADMSG;
	}
	if (e[4] == 2 && e[6] != DELTA_BLOCK_LOG) {
		hwfs_set_err(err, errlen, "delta block size 2^%u (this node reads 2^%d)", e[6],
		             DELTA_BLOCK_LOG);
		return -EBADMSG;
	}
	if ((e[4] == 1 && e[6]) || e[7]) {
		hwfs_set_err(err, errlen, "delta reserved bytes are not zero");
		return -EBADMSG;
	}
	if (len)
		*len = get_le64(e + 8);
	if (width)
		*width = e[5];
	return 0;
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
 * Check that the input @f (@flen bytes, what is left of the delta) starts
 * with one regular zstd frame whose content is @lo to @len bytes (exactly
 * @len when @lo is @len), without decompressing it (zstd's stable API
 * only), and return its length in *@fsize and its content size in *@csize.
 * @what names the content in messages ("the shard", "block 3"; format 1's
 * keep their wording of before format 2).  Returns 0 or -EBADMSG with a
 * one-line reason in @err.
 */
static int check_frame(const uint8_t *f, size_t flen, size_t lo, size_t len, const char *what,
                       size_t *fsize, size_t *csize, char *err, size_t errlen)
{
	const char *for_ = lo == len ? "" : " for ";
	unsigned long long fcs;
	uint64_t window;
	size_t r;

	if (lo == len)
		what = "";
	if (!flen) {
		hwfs_set_err(err, errlen, "no zstd frame after the delta header%s%s", for_, what);
		return -EBADMSG;
	}
	if (flen < 4) {
		hwfs_set_err(err, errlen, "truncated zstd frame (%zu bytes)", flen);
		return -EBADMSG;
	}
	if (get_le32(f) != ZSTD_MAGICNUMBER) {
		hwfs_set_err(err, errlen, "no zstd frame after the delta header%s%s (magic %08x)",
		             for_, what, get_le32(f));
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
	if (lo == len && fcs != len) { /* format 1 */
		hwfs_set_err(err, errlen, "the zstd frame declares %llu bytes, the shard has %zu",
		             fcs, len);
		return -EBADMSG;
	}
	if (fcs < lo || fcs > len) {
		hwfs_set_err(err, errlen, "the zstd frame of %s declares %llu bytes (%zu to %zu)",
		             what, fcs, lo, len);
		return -EBADMSG;
	}
	if (ZSTD_getDictID_fromFrame(f, flen)) {
		hwfs_set_err(err, errlen, "the zstd frame needs a dictionary");
		return -EBADMSG;
	}
	window = frame_window(f, fcs);
	if (window > 1ull << DELTA_WINDOW_LOG_MAX && window != fcs) {
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
	*fsize = r;
	*csize = (size_t)fcs;
	return 0;
}

/*
 * Decompress the frame @f (@fsize bytes, checked) into @dst, exactly @len
 * bytes.  Returns 0, -EBADMSG with the reason in @err, or -ENOMEM.
 */
static int decompress(struct delta_ctx *cx, uint8_t *dst, size_t len, const uint8_t *f,
                      size_t fsize, char *err, size_t errlen)
{
	size_t r = ZSTD_decompressDCtx(cx->dc, dst, len, f, fsize);

	if (ZSTD_isError(r)) {
		hwfs_set_err(err, errlen, "zstd: %s", ZSTD_getErrorName(r));
		return ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation ? -ENOMEM : -EBADMSG;
	}
	if (r != len) { /* zstd checks the declared size; kept as a guard */
		hwfs_set_err(err, errlen, "the zstd frame holds %zu bytes, %zu expected", r, len);
		return -EBADMSG;
	}
	return 0;
}

/*
 * Format 1: the one frame @f (@flen bytes) into the scratch (capacity
 * exactly @len), then unshuffled and XORed with @base into @out, and hashed
 * into @xs when not NULL, in runs of DELTA_BLOCK bytes of output.
 */
static int decode_v1(struct delta_ctx *cx, const uint8_t *base, size_t len, const uint8_t *f,
                     size_t flen, unsigned w, uint8_t *out, XXH3_state_t *xs, char *err,
                     size_t errlen)
{
	size_t fsize, csize, n = len / w, whole = w == 1 ? 0 : n * w, run = DELTA_BLOCK / w;
	int rc;

	rc = check_frame(f, flen, len, len, NULL, &fsize, &csize, err, errlen);
	if (rc)
		return rc;
	if (fsize != flen) {
		hwfs_set_err(err, errlen, "%zu trailing bytes after the zstd frame", flen - fsize);
		return -EBADMSG;
	}
	rc = scratch_reserve(cx, len);
	if (rc) {
		hwfs_set_err(err, errlen, "no memory for a %zu-byte delta", len);
		return rc;
	}
	rc = decompress(cx, cx->scratch, len, f, fsize, err, errlen);
	if (rc)
		return rc;
	for (size_t i = 0; whole && i < n; i += run) {
		size_t m = n - i < run ? n - i : run;

		unshuffle_xor_planes(out + i * w, base + i * w, cx->scratch + i, n, m, w);
		if (xs)
			XXH3_128bits_update(xs, out + i * w, m * w);
	}
	for (size_t i = whole; i < len; i += DELTA_BLOCK) {
		size_t m = len - i < DELTA_BLOCK ? len - i : DELTA_BLOCK;

		xor_bytes(out + i, base + i, cx->scratch + i, m);
		if (xs)
			XXH3_128bits_update(xs, out + i, m);
	}
	return 0;
}

/*
 * Format 2: frame by frame, each checked, decompressed into the block
 * buffer (capacity the block's length, no more), then a dense block (as
 * long as the block) unshuffled and XORed with @base into @out, a sparse
 * one (shorter) a copy of @base with its changed elements XORed in; each
 * block of @out then hashed into @xs when not NULL.  Nothing may follow the
 * last.
 */
static int decode_v2(struct delta_ctx *cx, const uint8_t *base, size_t len, const uint8_t *f,
                     size_t flen, unsigned w, uint8_t *out, XXH3_state_t *xs, char *err,
                     size_t errlen)
{
	size_t off = 0, pos = 0, fsize, csize;
	char what[48];
	int rc;

	do {
		size_t bl = len - off < DELTA_BLOCK ? len - off : DELTA_BLOCK, bn = off / DELTA_BLOCK;

		snprintf(what, sizeof(what), "block %zu", bn);
		rc = check_frame(f + pos, flen - pos, 0, bl, what, &fsize, &csize, err, errlen);
		if (rc)
			return rc;
		rc = decompress(cx, cx->blk, csize, f + pos, fsize, err, errlen);
		if (rc)
			return rc;
		if (csize == bl) {
			unshuffle_xor(out + off, base + off, cx->blk, bl, w);
		} else {
			memcpy(out + off, base + off, bl);
			rc = apply_sparse(out + off, bl, w, cx->blk, csize, bn, err, errlen);
			if (rc)
				return rc;
		}
		if (xs)
			XXH3_128bits_update(xs, out + off, bl);
		pos += fsize;
		off += bl;
	} while (off < len);
	if (pos != flen) {
		hwfs_set_err(err, errlen, "%zu trailing bytes after the last zstd frame",
		             flen - pos);
		return -EBADMSG;
	}
	return 0;
}

/*
 * Rebuild @len bytes into @out from @base and the delta @enc, and when
 * @hash is not NULL their XXH3-128 into it: header checked first
 * (delta_peek()), then the frames as their format says (decode_v1(),
 * decode_v2()).  Returns 0, -EBADMSG with a one-line reason in @err (@out
 * and @hash then undefined), or -ENOMEM.
 */
int delta_decode_hash(struct delta_ctx *cx, const void *base, size_t len, const void *enc,
                      size_t enc_len, void *out, hwfs_hash_t *hash, char *err, size_t errlen)
{
	const uint8_t *e = enc, *f = e + DELTA_HDR;
	XXH3_state_t *xs = hash ? cx->xs : NULL;
	XXH128_canonical_t c;
	uint64_t dlen;
	unsigned width;
	int rc;

	rc = delta_peek(enc, enc_len, &dlen, &width, err, errlen);
	if (rc)
		return rc;
	if (dlen != len) {
		hwfs_set_err(err, errlen, "delta declares %llu bytes, the shard has %zu",
		             (unsigned long long)dlen, len);
		return -EBADMSG;
	}
	if (xs)
		XXH3_128bits_reset(xs);
	if (e[4] == 1)
		rc = decode_v1(cx, base, len, f, enc_len - DELTA_HDR, width, out, xs, err, errlen);
	else
		rc = decode_v2(cx, base, len, f, enc_len - DELTA_HDR, width, out, xs, err, errlen);
	if (rc || !xs)
		return rc;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(xs));
	memcpy(hash->b, c.digest, HWFS_HASH_LEN);
	return 0;
}

/* delta_decode_hash() without the hash. */
int delta_decode(struct delta_ctx *cx, const void *base, size_t len, const void *enc,
                 size_t enc_len, void *out, char *err, size_t errlen)
{
	return delta_decode_hash(cx, base, len, enc, enc_len, out, NULL, err, errlen);
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
