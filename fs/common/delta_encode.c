/*
 * delta_encode.c — delta_encode() (API and encoded forms: delta.h).
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
 * shorter) the block's XOR is shuffled by element width (delta_shuffle.c),
 * as in format 1, and compressed by the context's accelerated dense
 * context (DENSE_ACCEL, delta_i.h).  The two are told apart by the frame's
 * content size alone (delta.h).
 *
 * Format 1 (one frame for the whole shard, shuffled as a whole, in the
 * context's scratch buffer) is written when delta_ctx_set_format() asks
 * for it (the tests, the benchmark, a cluster of mixed builds).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "delta_i.h"
#include "delta_shuffle.h"

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
	delta_put_le32(dst, (uint32_t)m);
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
	delta_xor_shuffle(d, a, b, bl, w);
	return bl;
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

	width = delta_norm_width(width);
	if (cap > SSIZE_MAX)
		cap = SSIZE_MAX;
	if (cap < DELTA_HDR)
		return -E2BIG;
	if (cx->format == 1) {
		rc = delta_scratch_reserve(cx, len);
		if (rc)
			return rc;
		delta_xor_shuffle(cx->scratch, a, b, len, width);
		/* ZSTD_compress2() declares @len as the frame's content size. */
		r = ZSTD_compress2(cx->cc, o + pos, cap - pos, cx->scratch, len);
		if (ZSTD_isError(r))
			return zstd_enc_err(r);
		pos += r;
	} else {
		do { /* one frame per block; a shard of 0 bytes has one empty frame */
			size_t bl = len - off < DELTA_BLOCK ? len - off : DELTA_BLOCK;

			size_t cl = block_content(cx, a + off, b + off, bl, width);

			r = ZSTD_compress2(cl < bl ? cx->cc : cx->cc_dense, o + pos, cap - pos,
			                   cx->blk, cl);
			if (ZSTD_isError(r))
				return zstd_enc_err(r);
			pos += r;
			off += bl;
		} while (off < len);
	}
	delta_put_header(o, cx->format, width, len);
	return (ssize_t)pos;
}
