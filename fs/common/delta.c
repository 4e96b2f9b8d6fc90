/*
 * delta.c — the element-level delta codec (API and encoded forms: delta.h):
 * its context and its header.  The codec is four files (delta_i.h):
 *
 *   delta.c          a context (zstd contexts, the block buffers, a hash
 *                    state, format 1's scratch), the element width of a
 *                    dtype, the header written and checked (delta_peek())
 *   delta_encode.c   delta_encode(): a zstd frame per block, of the list of
 *                    its changed elements or of its shuffled XOR
 *   delta_decode.c   delta_decode_hash(): every frame checked before it is
 *                    decompressed, the block rebuilt and hashed in one pass
 *   delta_shuffle.c  the byte-plane kernels both use, and delta_count_diff()
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_c_literalCompressionMode (zstd >= 1.4.5) */
#include <zstd.h>
#include <xxhash.h>

#include "delta_i.h"
#include "hwfs_common.h"
#include "safetensors.h"

static const uint8_t delta_magic[4] = {'H', 'W', 'D', 'L'};

/*
 * Set @cc to compress at @level with the content size in the frame and no
 * checksum (the caller hashes the rebuilt shard).  Returns 0, or -1 when
 * zstd refuses one of these.
 */
static int cc_init(ZSTD_CCtx *cc, int level)
{
	/* An out-of-range level is clamped by zstd, not refused. */
	if (ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 1)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 0)))
		return -1;
	return 0;
}

/*
 * Create a context: two compression contexts at @level (cc_init()), the
 * dense blocks' one accelerated (DENSE_ACCEL, delta_i.h: a libzstd that
 * refuses those parameters compresses dense blocks at the plain level,
 * which only costs time) and the other's matches at least SPARSE_MIN_MATCH
 * bytes (sparse lists, and format 1's whole shard), and a decompression context that refuses windows
 * above DELTA_WINDOW_LOG_MAX (zstd applies that to streaming only;
 * delta_decode.c's check_frame() applies it to our one-shot decoding).
 * NULL when out of memory.
 */
struct delta_ctx *delta_ctx_new(int level)
{
	struct delta_ctx *cx = calloc(1, sizeof(*cx));

	if (!cx)
		return NULL;
	cx->format = DELTA_FORMAT;
	cx->cc = ZSTD_createCCtx();
	cx->cc_dense = ZSTD_createCCtx();
	cx->dc = ZSTD_createDCtx();
	cx->xs = XXH3_createState();
	cx->blk = malloc(DELTA_BLOCK);
	cx->vals = malloc(DELTA_BLOCK);
	if (!cx->cc || !cx->cc_dense || !cx->dc || !cx->xs || !cx->blk || !cx->vals)
		goto fail;
	if (cc_init(cx->cc, level) || cc_init(cx->cc_dense, level) ||
	    ZSTD_isError(ZSTD_DCtx_setParameter(cx->dc, ZSTD_d_windowLogMax, DELTA_WINDOW_LOG_MAX)))
		goto fail;
	/* each of these on its own: what the library refuses is left as the level set it */
	(void)ZSTD_CCtx_setParameter(cx->cc_dense, ZSTD_c_targetLength, DENSE_ACCEL);
	(void)ZSTD_CCtx_setParameter(cx->cc_dense, ZSTD_c_minMatch, DENSE_MIN_MATCH);
	(void)ZSTD_CCtx_setParameter(cx->cc_dense, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
	(void)ZSTD_CCtx_setParameter(cx->cc, ZSTD_c_minMatch, SPARSE_MIN_MATCH);
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
	ZSTD_freeCCtx(cx->cc_dense);
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
int delta_scratch_reserve(struct delta_ctx *cx, size_t len)
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


/* Write the header of a delta of format @format, width @width, @len bytes at @o. */
void delta_put_header(uint8_t *o, unsigned format, unsigned width, uint64_t len)
{
	memcpy(o, delta_magic, sizeof(delta_magic));
	o[4] = (uint8_t)format;
	o[5] = (uint8_t)width;
	o[6] = format == 1 ? 0 : DELTA_BLOCK_LOG;
	o[7] = 0;
	put_le64(o + 8, len);
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
	if (delta_norm_width(e[5]) != e[5]) {
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
