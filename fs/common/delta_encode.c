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
 * encoder first scans the block for changed elements, 64 at a time into a
 * bit mask without a branch per element (changed64()), and, when listing them (gaps, then their XOR by planes) is
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
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "delta_i.h"
#include "delta_shuffle.h"

/*
 * Which of the 64 elements of @W bytes at @a and @b differ: bit j of the
 * result for element j.  Branch-free, so the scan costs the same whatever
 * the changes' pattern: with SSE2 (every x86-64) 16 bytes are compared at a
 * time and the per-element results packed to one bit each (movemask);
 * elsewhere, and for width 8 (SSE2 compares at most 32 bits), one element
 * at a time.
 */
static inline __attribute__((always_inline)) uint64_t
changed64(const uint8_t *a, const uint8_t *b, const unsigned W)
{
	uint64_t eq = 0;

#if defined(__SSE2__)
	if (W == 1) {
		for (unsigned q = 0; q < 4; q++) {
			__m128i x = _mm_loadu_si128((const __m128i *)(a + 16 * q));
			__m128i y = _mm_loadu_si128((const __m128i *)(b + 16 * q));

			eq |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x, y)) << 16 * q;
		}
		return ~eq;
	}
	if (W == 2) { /* 16 elements (32 bytes) per mask of 16 bits */
		for (unsigned q = 0; q < 4; q++) {
			const uint8_t *pa = a + 32 * q, *pb = b + 32 * q;
			__m128i c0 = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)pa),
			                             _mm_loadu_si128((const __m128i *)pb));
			__m128i c1 = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(pa + 16)),
			                             _mm_loadu_si128((const __m128i *)(pb + 16)));

			eq |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_packs_epi16(c0, c1)) << 16 * q;
		}
		return ~eq;
	}
	if (W == 4) { /* 16 elements (64 bytes) per mask of 16 bits */
		for (unsigned q = 0; q < 4; q++) {
			const uint8_t *pa = a + 64 * q, *pb = b + 64 * q;
			__m128i c[4];

			for (unsigned r = 0; r < 4; r++)
				c[r] = _mm_cmpeq_epi32(
					_mm_loadu_si128((const __m128i *)(pa + 16 * r)),
					_mm_loadu_si128((const __m128i *)(pb + 16 * r)));
			eq |= (uint64_t)(uint16_t)_mm_movemask_epi8(
				      _mm_packs_epi16(_mm_packs_epi32(c[0], c[1]),
				                      _mm_packs_epi32(c[2], c[3])))
			      << 16 * q;
		}
		return ~eq;
	}
#endif
	for (unsigned j = 0; j < 64; j++) {
		unsigned ne = 0;

		for (unsigned k = 0; k < W; k++)
			ne |= a[j * W + k] ^ b[j * W + k];
		eq |= (uint64_t)(ne == 0) << j;
	}
	return ~eq;
}

/* changed64() for the last @cnt (< 64) elements of a block, one at a time. */
static uint64_t changed_tail(const uint8_t *a, const uint8_t *b, unsigned W, size_t cnt)
{
	uint64_t mk = 0;

	for (size_t j = 0; j < cnt; j++)
		if (memcmp(a + j * W, b + j * W, W))
			mk |= 1ull << j;
	return mk;
}

/*
 * The sparse form of a block (@bl bytes of @a and @b, whole elements of @W
 * bytes, a constant once inlined) into @dst: the changed elements found 64
 * at a time as a bit mask (changed64()), then taken bit by bit (2% of the
 * elements of an RL step: one or two per mask), their gaps written as they
 * are found and byte k of their XOR put straight in plane k of @vals (plane
 * k at k * (bl / W)), the planes then copied after the gaps.  Returns the
 * content's length (at most @bl / SPARSE_FRACTION + SPARSE_SLACK), or 0 as
 * soon as it would pass the bound above (the block is not sparse enough).
 * The bound is checked at every changed element, so the content is exactly
 * what the element-by-element scan of issue 20 wrote.
 */
static inline __attribute__((always_inline)) size_t
sparse_w(uint8_t *restrict dst, uint8_t *restrict vals, const uint8_t *a, const uint8_t *b,
         size_t bl, const unsigned W)
{
	size_t n = bl / W, p = SPARSE_HDR, m = 0, last = 0;

	for (size_t c = 0; c < n; c += 64) {
		uint64_t mk = n - c >= 64 ? changed64(a + c * W, b + c * W, W)
		                          : changed_tail(a + c * W, b + c * W, W, n - c);

		while (mk) {
			size_t e = c + (size_t)__builtin_ctzll(mk);
			const uint8_t *ea = a + e * W, *eb = b + e * W;

			mk &= mk - 1;
			if (p + GAP_MAX_BYTES + (m + 1) * W >= e * W / SPARSE_FRACTION + SPARSE_SLACK)
				return 0;
			for (size_t g = e - last; ; g >>= 7) {
				dst[p++] = (uint8_t)((g & 0x7f) | (g >= 0x80 ? 0x80 : 0));
				if (g < 0x80)
					break;
			}
			for (unsigned k = 0; k < W; k++)
				vals[k * n + m] = ea[k] ^ eb[k];
			m++;
			last = e + 1;
		}
	}
	delta_put_le32(dst, (uint32_t)m);
	for (unsigned k = 0; k < W; k++)
		memcpy(dst + p + k * m, vals + k * n, m);
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
