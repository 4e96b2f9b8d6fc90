/*
 * test_delta.c — the element-level delta codec (fs/common/delta.h): what it
 * makes.  The decoder's refusals are test_delta_refuse.c.
 *
 * Round trips in both formats at every width over lengths that are and are
 * not multiples of it (0, 1, 7, 4097, 1 MiB + 3, several format-2 blocks),
 * dense and sparse, the hash delta_decode_hash() returns, the exact encoded
 * forms (header fields, and the frames decompressed by plain zstd compared
 * with a reference written here from the format's description), the size bound
 * (-E2BIG without a byte written past cap), format 2's per-block refusals
 * (block content: mode, sparse counts, gaps, values, written by hand and
 * compressed with plain zstd), the sparse scan's edges (elements at the
 * ends of its groups of 64 and of the blocks), delta_count_diff() and
 * delta_width().
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <xxhash.h>
#include <zstd.h>

#include "delta.h"
#include "delta_util.h"

/* ---- round trips and the encoded form ---- */

/* Every format, width, length (multiples of the width or not), dense and
 * sparse, three levels sharing one context whose scratch grows and shrinks
 * in use; delta_decode_hash() gives the rebuilt shard's hash. */
static void test_roundtrip(void **state)
{
	static const int levels[] = {-5, 1, 9};

	for (unsigned fmt = 1; fmt <= 2; fmt++) {
		for (size_t l = 0; l < sizeof(levels) / sizeof(levels[0]); l++) {
			struct delta_ctx *cx = ctx_format(levels[l], fmt);

			for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
				for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
					size_t len = lens[i], n;
					uint8_t *base = random_buf(len), *enc;
					uint8_t *nw = mutated_every(base, len, i % 2 ? 50 : 2000);
					uint8_t *out = xmalloc(len);
					hwfs_hash_t h, want;
					uint64_t dlen = 1;
					unsigned dw = 0;
					char err[256] = "";

					if (levels[l] == 9 && len > 4097)
						goto next; /* slow, and adds nothing */
					n = encode_ok(cx, base, nw, len, widths[w], &enc);
					assert_int_equal(enc[4], fmt);
					assert_int_equal(
					    delta_peek(enc, n, &dlen, &dw, err, sizeof(err)), 0);
					assert_int_equal(dlen, len);
					assert_int_equal(dw, widths[w]);
					memset(out, 0xa5, len);
					if (delta_decode(cx, base, len, enc, n, out, err, sizeof(err)))
						fail_msg("len %zu width %u: %s", len, widths[w], err);
					assert_memory_equal(out, nw, len);
					memset(out, 0xa5, len);
					memset(&h, 0, sizeof(h));
					if (delta_decode_hash(cx, base, len, enc, n, out, &h, err,
					                      sizeof(err)))
						fail_msg("len %zu width %u: %s", len, widths[w], err);
					assert_memory_equal(out, nw, len);
					hwfs_hash_buf(nw, len, &want);
					assert_memory_equal(h.b, want.b, HWFS_HASH_LEN);
					free(enc);
				next:
					free(base);
					free(nw);
					free(out);
				}
			}
			delta_ctx_free(cx);
		}
	}
}

/* Only 1 and 2 can be asked for. */
static void test_set_format(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);

	assert_non_null(cx);
	assert_int_equal(delta_ctx_set_format(cx, 0), -EINVAL);
	assert_int_equal(delta_ctx_set_format(cx, 3), -EINVAL);
	assert_int_equal(delta_ctx_set_format(cx, 1), 0);
	assert_int_equal(delta_ctx_set_format(cx, 2), 0);
	delta_ctx_free(cx);
}

/* Format 1: the frame holds exactly the format's shuffle: plane k = byte k
 * of every whole element of base ^ new, then the tail bytes as they are.
 * The reference here is the format's description, written naively. */
static void test_format_layout(void **state)
{
	struct delta_ctx *cx = ctx_format(1, 1);
	const size_t len = 4096 * 8 + 5; /* several shuffle blocks, a tail for 2, 4, 8 */
	uint8_t *base = random_buf(len), *nw = random_buf(len), *want = xmalloc(len);
	uint8_t *got = xmalloc(len);

	assert_non_null(cx);
	for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
		unsigned W = widths[w];
		size_t n = len / W, enc_len;
		uint8_t *enc;

		for (size_t i = 0; i < n; i++)
			for (unsigned k = 0; k < W; k++)
				want[k * n + i] = base[i * W + k] ^ nw[i * W + k];
		for (size_t i = n * W; i < len; i++)
			want[i] = base[i] ^ nw[i];
		enc_len = encode_ok(cx, base, nw, len, W, &enc);
		assert_memory_equal(enc, "HWDL", 4);
		assert_int_equal(enc[4], 1);
		assert_int_equal(enc[5], W);
		assert_int_equal(enc[6] | enc[7], 0);
		for (int b = 0; b < 8; b++)
			assert_int_equal(enc[8 + b], (uint8_t)((uint64_t)len >> (8 * b)));
		assert_int_equal(ZSTD_getFrameContentSize(enc + DELTA_HDR, enc_len - DELTA_HDR),
		                 len);
		assert_int_equal(ZSTD_decompress(got, len, enc + DELTA_HDR, enc_len - DELTA_HDR),
		                 len);
		assert_memory_equal(got, want, len);
		free(enc);
	}
	free(base);
	free(nw);
	free(want);
	free(got);
	delta_ctx_free(cx);
}

/*
 * Format 2, read from the description in delta.h, written naively: walk the
 * frames of @enc (one per block), decompress each with plain zstd and
 * rebuild the block's XOR from its content (dense, as long as the block:
 * planes then tail; sparse, shorter: count, LEB128 gaps, planes of the
 * changed elements).  Checks that it is base ^ new and counts the dense
 * and sparse blocks into @modes[0] and [1].
 */
static void check_v2_layout(const uint8_t *enc, size_t enc_len, const uint8_t *base,
                            const uint8_t *nw, size_t len, unsigned W, unsigned modes[2])
{
	uint8_t *c = xmalloc(DELTA_BLOCK), *x = xmalloc(DELTA_BLOCK);
	size_t pos = DELTA_HDR, off = 0;

	assert_int_equal(enc[4], 2);
	assert_int_equal(enc[6], DELTA_BLOCK_LOG);
	do {
		size_t bl = len - off < DELTA_BLOCK ? len - off : DELTA_BLOCK, n = bl / W;
		size_t fl = ZSTD_findFrameCompressedSize(enc + pos, enc_len - pos);
		unsigned long long cl = ZSTD_getFrameContentSize(enc + pos, enc_len - pos);

		assert_false(ZSTD_isError(fl));
		assert_true(cl <= bl);
		assert_int_equal(ZSTD_decompress(c, DELTA_BLOCK, enc + pos, fl), cl);
		memset(x, 0, DELTA_BLOCK);
		if (cl == bl) { /* dense */
			for (size_t i = 0; i < n; i++)
				for (unsigned k = 0; k < W; k++)
					x[i * W + k] = c[k * n + i];
			for (size_t i = n * W; i < bl; i++)
				x[i] = c[i];
		} else { /* sparse */
			size_t m = c[0] | c[1] << 8 | (size_t)c[2] << 16 | (size_t)c[3] << 24;
			size_t p = 4, idx = 0, *at = malloc((m + 1) * sizeof(size_t));

			assert_non_null(at);
			for (size_t j = 0; j < m; j++) {
				size_t g = 0;

				for (unsigned sh = 0;; sh += 7) {
					g |= (size_t)(c[p] & 0x7f) << sh;
					if (!(c[p++] & 0x80))
						break;
				}
				idx += g;
				at[j] = idx++;
			}
			assert_int_equal(cl - p, W * m);
			for (size_t j = 0; j < m; j++)
				for (unsigned k = 0; k < W; k++)
					x[at[j] * W + k] = c[p + k * m + j];
			free(at);
		}
		modes[cl < bl]++;
		for (size_t i = 0; i < bl; i++)
			if (x[i] != (base[off + i] ^ nw[off + i]))
				fail_msg("block %zu byte %zu: layout gives %02x, xor is %02x",
				         off / DELTA_BLOCK, i, x[i], base[off + i] ^ nw[off + i]);
		pos += fl;
		off += bl;
	} while (off < len);
	assert_int_equal(pos, enc_len);
	free(c);
	free(x);
}

/* Format 2's frames per block hold what delta.h says, both modes: a sparse
 * change (one byte in 2000) is sent sparse, random bytes dense. */
static void test_format2_layout(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	const size_t len = 2 * DELTA_BLOCK + 4096 * 8 + 5; /* a short last block with a tail */

	assert_non_null(cx);
	for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
		uint8_t *base = random_buf(len), *sparse = mutated_every(base, len, 2000);
		uint8_t *dense = random_buf(len), *enc;
		unsigned modes[2] = {0, 0};
		size_t n;

		n = encode_ok(cx, base, sparse, len, widths[w], &enc);
		check_v2_layout(enc, n, base, sparse, len, widths[w], modes);
		free(enc);
		/* the last block has a tail at widths 2, 4, 8: dense */
		assert_int_equal(modes[1], widths[w] == 1 ? 3 : 2);
		modes[0] = modes[1] = 0;
		n = encode_ok(cx, base, dense, len, widths[w], &enc);
		check_v2_layout(enc, n, base, dense, len, widths[w], modes);
		assert_int_equal(modes[0], 3);
		free(enc);
		free(base);
		free(sparse);
		free(dense);
	}
	delta_ctx_free(cx);
}

/*
 * The encoder finds changed elements 64 at a time (a bit mask, compared 16
 * bytes at a time where the machine can): every element at the edges of
 * those groups and of the blocks (first, 63rd, 64th, last, the last ones of
 * a block whose element count is no multiple of 64), each changed in one
 * byte only (its first, or its last: a compare of wide lanes must still see
 * it), is listed, sparse, and nothing else.
 */
static void test_sparse_edges(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);

	assert_non_null(cx);
	for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
		const unsigned W = widths[w];
		/* one whole block, then a block of 64 * 37 + 5 elements */
		const size_t n1 = DELTA_BLOCK / W, n = n1 + 64 * 37 + 5, len = n * W;
		const size_t at[] = {0, 1, 62, 63, 64, 65, 127, 128, 1000, n1 - 65, n1 - 64,
		                     n1 - 1, n1, n1 + 63, n1 + 64, n - 6, n - 5, n - 2, n - 1};
		uint8_t *base = random_buf(len), *nw = xmalloc(len), *enc, *out = xmalloc(len);
		unsigned modes[2] = {0, 0};
		char err[256] = "";
		size_t sz;

		memcpy(nw, base, len);
		for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++)
			nw[at[i] * W + (i % 2 ? W - 1 : 0)] ^= (uint8_t)(1u << (i % 8));
		sz = encode_ok(cx, base, nw, len, W, &enc);
		check_v2_layout(enc, sz, base, nw, len, W, modes);
		assert_int_equal(modes[1], 2); /* both blocks sparse */
		assert_int_equal(delta_decode(cx, base, len, enc, sz, out, err, sizeof(err)), 0);
		assert_memory_equal(out, nw, len);
		free(enc);
		free(out);
		free(base);
		free(nw);
	}
	delta_ctx_free(cx);
}

/*
 * A format-2 delta of @len bytes at width @w whose frames hold the block
 * contents @c[i] (@cl[i] bytes), compressed by plain zstd, into @enc (room
 * for it).  Returns its length.
 */
static size_t v2_delta(uint8_t *enc, size_t cap, size_t len, unsigned w, const uint8_t **c,
                       const size_t *cl, size_t nb)
{
	size_t p = DELTA_HDR;

	put_hdr_fmt(enc, 2, len, w);
	for (size_t i = 0; i < nb; i++) {
		size_t r = ZSTD_compress(enc + p, cap - p, c[i], cl[i], 1);

		assert_false(ZSTD_isError(r));
		p += r;
	}
	return p;
}

/* One block of 4096 bytes at width 2 (2048 elements) holding @c (@cl bytes):
 * refused with @why, or with @why NULL decoded and compared with @want. */
static void v2_block(struct delta_ctx *cx, const uint8_t *base, const uint8_t *c, size_t cl,
                     const char *why, const uint8_t *want)
{
	uint8_t enc[DELTA_HDR + 8192], out[4096];
	const uint8_t *cs[1] = {c};
	size_t n = v2_delta(enc, sizeof(enc), 4096, 2, cs, &cl, 1);
	char err[256] = "";

	if (why) {
		refused(cx, base, 4096, enc, n, why);
		return;
	}
	if (delta_decode(cx, base, 4096, enc, n, out, err, sizeof(err)))
		fail_msg("%s", err);
	assert_memory_equal(out, want, 4096);
}

/* The block content's own rules: its length, a sparse block's count, gaps
 * and values; and a sparse block written by hand here from the description
 * decodes to what it says. */
static void test_refuse_block_content(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	uint8_t *base = random_buf(4096), want[4096], c[4200];

	assert_non_null(cx);
	/* elements 3 and 4 (gaps 3, 0) XOR 0x0201 and 0x0403, element 2047 (gap
	 * 2042) XOR 0x0605: as planes 01 03 05, 02 04 06 */
	memcpy(c, "\x03\x00\x00\x00\x03\x00\xfa\x0f\x01\x03\x05\x02\x04\x06", 14);
	memcpy(want, base, 4096);
	want[6] ^= 1, want[7] ^= 2, want[8] ^= 3, want[9] ^= 4, want[4094] ^= 5, want[4095] ^= 6;
	v2_block(cx, base, c, 14, NULL, want);
	/* the same with a gap that passes the end, values short, long; a
	 * 4-byte gap, a count above the elements, content cut inside the gaps,
	 * an element past the end, a count cut short */
	c[7] = 0x10; /* gap 2042 + 128 */
	v2_block(cx, base, c, 14, "bad gap before changed element 2", NULL);
	c[7] = 0x0f;
	v2_block(cx, base, c, 13, "5 bytes of values for 3 elements", NULL);
	c[14] = 0;
	v2_block(cx, base, c, 15, "7 bytes of values for 3 elements", NULL);
	memcpy(c, "\x01\x00\x00\x00\x80\x80\x80\x00\x01\x02", 10);
	v2_block(cx, base, c, 10, "bad gap before changed element 0", NULL);
	memcpy(c, "\x01\x08\x00\x00\x00", 5); /* 2049 elements */
	v2_block(cx, base, c, 5, "2049 changed elements of 2048", NULL);
	memcpy(c, "\x02\x00\x00\x00\x00", 5);
	v2_block(cx, base, c, 5, "bad gap before changed element 1", NULL);
	memcpy(c, "\x01\x00\x00\x00\x80\x10\x01\x02", 8); /* gap 2048: element 2048 */
	v2_block(cx, base, c, 8, "bad gap before changed element 0", NULL);
	v2_block(cx, base, c, 3, "shorter than its count", NULL);
	/* no more than the block; a dense block of zeros is the base */
	memset(c, 0, sizeof(c));
	v2_block(cx, base, c, 4097, "declares 4097 bytes (0 to 4096)", NULL);
	v2_block(cx, base, c, 4096, NULL, base);
	v2_block(cx, base, c, 4, NULL, base); /* sparse, nothing changed */
	v2_block(cx, base, c, 0, "shorter than its count", NULL);
	/* a sparse last block with a partial element (4097 bytes at width 2) */
	{
		uint8_t enc[DELTA_HDR + 256];
		const uint8_t *cs[1] = {(const uint8_t *)"\x00\x00\x00\x00"};
		size_t cl = 4, n = v2_delta(enc, sizeof(enc), 4097, 2, cs, &cl, 1);
		uint8_t *b = random_buf(4097);

		refused(cx, b, 4097, enc, n, "a sparse block with a partial element");
		free(b);
	}
	free(base);
	delta_ctx_free(cx);
}

/* A delta of several blocks: a frame missing at every boundary, trailing
 * bytes after the last, a cut inside each frame. */
static void test_refuse_frames(void **state)
{
	const size_t len = 2 * DELTA_BLOCK + 100;
	struct delta_ctx *cx = delta_ctx_new(1);
	uint8_t *base = random_buf(len), *nw = mutated(base, len), *enc, *e;
	size_t n = 0, fl[3], p = DELTA_HDR;

	assert_non_null(cx);
	n = encode_ok(cx, base, nw, len, 2, &enc);
	for (int i = 0; i < 3; i++) {
		fl[i] = ZSTD_findFrameCompressedSize(enc + p, n - p);
		assert_false(ZSTD_isError(fl[i]));
		p += fl[i];
	}
	assert_int_equal(p, n);
	refused(cx, base, len, enc, DELTA_HDR + fl[0], "no zstd frame after the delta header for block 1");
	refused(cx, base, len, enc, DELTA_HDR + fl[0] + fl[1], "no zstd frame after the delta header for block 2");
	refused(cx, base, len, enc, DELTA_HDR + fl[0] + 3, "truncated");
	refused(cx, base, len, enc, DELTA_HDR + fl[0] + fl[1] / 2, "truncated");
	refused(cx, base, len, enc, n - 1, "truncated");
	e = xmalloc(n + fl[2]);
	memcpy(e, enc, n);
	memcpy(e + n, enc + n - fl[2], fl[2]); /* the last frame twice */
	refused(cx, base, len, e, n + fl[2], "trailing bytes after the last zstd frame");
	/* the frames of blocks 0 and 2 swapped: block 0's frame has block 2's size */
	memcpy(e + DELTA_HDR, enc + DELTA_HDR + fl[0] + fl[1], fl[2]);
	memcpy(e + DELTA_HDR + fl[2], enc + DELTA_HDR + fl[0], fl[1]);
	memcpy(e + DELTA_HDR + fl[2] + fl[1], enc + DELTA_HDR, fl[0]);
	{
		char err[256] = "";
		uint8_t *out = xmalloc(len);

		/* block 0 rebuilt from block 2's (100-byte) content, which it can
		 * hold; block 1 as it was; block 2 has block 0's frame, too big */
		assert_int_equal(delta_decode(cx, base, len, e, n, out, err, sizeof(err)), -EBADMSG);
		free(out);
	}
	free(e);
	free(enc);
	free(base);
	free(nw);
	delta_ctx_free(cx);
}

/* A width the format does not know is encoded as 1 (and still round trips). */
static void test_other_width(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	uint8_t *base = random_buf(1000), *nw = mutated(base, 1000), *enc, out[1000];
	char err[256];
	size_t n;

	assert_non_null(cx);
	n = encode_ok(cx, base, nw, 1000, 3, &enc);
	assert_int_equal(enc[5], 1);
	assert_int_equal(delta_decode(cx, base, 1000, enc, n, out, err, sizeof(err)), 0);
	assert_memory_equal(out, nw, 1000);
	free(enc);
	free(base);
	free(nw);
	delta_ctx_free(cx);
}

/* len 0: a header and one frame of 0 bytes, which decodes. */
static void test_empty(void **state)
{
	for (unsigned fmt = 1; fmt <= 2; fmt++) {
		struct delta_ctx *cx = ctx_format(1, fmt);
		uint8_t enc[DELTA_HDR + 64], b = 0, o = 0;
		uint64_t dlen = 1;
		char err[256] = "";
		ssize_t n;

		n = delta_encode(cx, &b, &b, 0, 2, enc, sizeof(enc));
		assert_true(n > DELTA_HDR);
		assert_int_equal(delta_peek(enc, n, &dlen, NULL, err, sizeof(err)), 0);
		assert_int_equal(dlen, 0);
		assert_int_equal(ZSTD_getFrameContentSize(enc + DELTA_HDR, n - DELTA_HDR), 0);
		if (delta_decode(cx, &b, 0, enc, n, &o, err, sizeof(err)))
			fail_msg("%s", err);
		/* ... and only for a shard of 0 bytes. */
		refused(cx, &b, 1, enc, n, "declares 0 bytes");
		delta_ctx_free(cx);
	}
}

/* Identical inputs: a delta of a few dozen bytes for 1 MiB (format 2: a
 * frame of an empty sparse block per 128 KiB). */
static void test_identical(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	uint8_t *base = random_buf(MIB), *enc, *out = xmalloc(MIB);
	char err[256];
	size_t n;

	assert_non_null(cx);
	n = encode_ok(cx, base, base, MIB, 2, &enc);
	if (n > DELTA_HDR + 16 * (MIB / DELTA_BLOCK))
		fail_msg("identical 1 MiB encoded in %zu bytes", n);
	assert_int_equal(delta_decode(cx, base, MIB, enc, n, out, err, sizeof(err)), 0);
	assert_memory_equal(out, base, MIB);
	free(enc);
	free(base);
	free(out);
	delta_ctx_free(cx);
}

/* Random against random does not fit in half the length: -E2BIG, and not a
 * byte written past cap; with room enough it round trips. */
static void test_too_big(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	const size_t len = 256 << 10, cap = len / 2, guard = 4096;
	uint8_t *base = random_buf(len), *nw = random_buf(len), *out = xmalloc(len);
	uint8_t *enc = xmalloc(cap + guard);
	char err[256];
	ssize_t n;

	assert_non_null(cx);
	memset(enc, 0x5a, cap + guard);
	assert_int_equal(delta_encode(cx, base, nw, len, 2, enc, cap), -E2BIG);
	for (size_t i = cap; i < cap + guard; i++)
		if (enc[i] != 0x5a)
			fail_msg("byte %zu written past cap %zu", i, cap);
	free(enc);

	enc = xmalloc(DELTA_HDR + ZSTD_compressBound(len));
	n = delta_encode(cx, base, nw, len, 2, enc, DELTA_HDR + ZSTD_compressBound(len));
	assert_true(n > (ssize_t)cap);
	assert_int_equal(delta_decode(cx, base, len, enc, n, out, err, sizeof(err)), 0);
	assert_memory_equal(out, nw, len);
	/* The exact length fits; one byte less does not. */
	assert_int_equal(delta_encode(cx, base, nw, len, 2, enc, n), n);
	assert_int_equal(delta_encode(cx, base, nw, len, 2, enc, n - 1), -E2BIG);
	free(enc);
	free(base);
	free(nw);
	free(out);
	delta_ctx_free(cx);
}

/* A cap below the header (or with no room for the frame) is -E2BIG, with
 * nothing written. */
static void test_cap_below_header(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	uint8_t b[16] = {0}, enc[64];

	assert_non_null(cx);
	for (size_t cap = 0; cap <= DELTA_HDR; cap++) {
		memset(enc, 0x5a, sizeof(enc));
		assert_int_equal(delta_encode(cx, b, b, sizeof(b), 1, enc, cap), -E2BIG);
		for (size_t i = cap; i < sizeof(enc); i++)
			assert_int_equal(enc[i], 0x5a);
	}
	delta_ctx_free(cx);
}

/* ---- delta_count_diff, delta_width ---- */

/* 35 bytes (tails of 1, 3, 3 bytes at widths 2, 4, 8) differing at bytes 0,
 * 1, 3, 9 and 34 (the last byte, in every width's tail). */
static void test_count_diff(void **state)
{
	uint8_t a[35], b[35];
	static const struct {
		unsigned width;
		uint64_t want;
	} cases[] = {{1, 5}, {2, 4}, {4, 3}, {8, 3}, {3, 5}, {0, 5}};

	for (size_t i = 0; i < sizeof(a); i++)
		a[i] = b[i] = (uint8_t)(i * 31 + 7);
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
		assert_int_equal(delta_count_diff(a, b, sizeof(a), cases[c].width), 0);
	b[0] ^= 1;
	b[1] ^= 2;
	b[3] ^= 4;
	b[9] ^= 8;
	b[34] ^= 16;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
		if (delta_count_diff(a, b, sizeof(a), cases[c].width) != cases[c].want)
			fail_msg(
			    "width %u: %llu differ, want %llu", cases[c].width,
			    (unsigned long long)delta_count_diff(a, b, sizeof(a), cases[c].width),
			    (unsigned long long)cases[c].want);
	/* Only the tail differs: one element at every width. */
	memcpy(b, a, sizeof(a));
	b[33] ^= 1;
	assert_int_equal(delta_count_diff(a, b, sizeof(a), 1), 1);
	assert_int_equal(delta_count_diff(a, b, sizeof(a), 2), 1); /* element 16 */
	assert_int_equal(delta_count_diff(a, b, sizeof(a), 4), 1);
	assert_int_equal(delta_count_diff(a, b, sizeof(a), 8), 1);
	assert_int_equal(delta_count_diff(a, b, 0, 8), 0);
	/* Every element of a longer buffer. */
	{
		size_t len = 4096 + 3;
		uint8_t *x = xmalloc(len), *y = xmalloc(len);

		memset(x, 0, len);
		memset(y, 0xff, len);
		for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++)
			assert_int_equal(delta_count_diff(x, y, len, widths[w]),
			                 len / widths[w] + (len % widths[w] != 0));
		free(x);
		free(y);
	}
}

static void test_width(void **state)
{
	static const struct {
		const char *dtype;
		unsigned width;
	} cases[] = {
	    {"BOOL", 1},
	    {"U8", 1},
	    {"I8", 1},
	    {"F8_E4M3", 1},
	    {"F8_E5M2", 1},
	    {"F8_E8M0", 1},
	    {"BF16", 2},
	    {"F16", 2},
	    {"I16", 2},
	    {"U16", 2},
	    {"F32", 4},
	    {"I32", 4},
	    {"U32", 4},
	    {"F64", 8},
	    {"I64", 8},
	    {"U64", 8},
	    {"C64", 4},
	    {"F4", 1},
	    {"F6_E2M3", 1},
	    {"bf16", 1},
	    {"", 1},
	    {"BF16 ", 1},
	    {"F32F32F32F32F32F32", 1},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (delta_width(cases[i].dtype) != cases[i].width)
			fail_msg("%s: width %u, want %u", cases[i].dtype,
			         delta_width(cases[i].dtype), cases[i].width);
	assert_int_equal(delta_width(NULL), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_set_format),
		cmocka_unit_test(test_format_layout),
		cmocka_unit_test(test_format2_layout),
		cmocka_unit_test(test_sparse_edges),
		cmocka_unit_test(test_refuse_block_content),
		cmocka_unit_test(test_refuse_frames),
		cmocka_unit_test(test_other_width),
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_identical),
		cmocka_unit_test(test_too_big),
		cmocka_unit_test(test_cap_below_header),
		cmocka_unit_test(test_count_diff),
		cmocka_unit_test(test_width),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
