/*
 * test_delta_refuse.c — the delta codec's decoder refuses what it must
 * (fs/common/delta.h); what the encoder makes is test_delta.c.
 *
 * Every header field, a length other than the caller's, frames that lie
 * about or omit their content size, trailing bytes, truncation, skippable
 * frames, dictionaries, oversized windows, and decompression bombs (built
 * by hand as frames of RLE blocks, so that a 1 GiB frame is 32 KiB of test
 * data); the context after a failure; a delta against the wrong base
 * decodes (0) to other bytes: only the caller's hash of the result catches
 * it (test_wrong_base).
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

/* ---- the decoder's refusals ---- */

/* A valid delta of 4096 bytes to corrupt, with its base. */
struct fixture {
	struct delta_ctx *cx;
	uint8_t *base, *nw, *enc;
	size_t n;
};

static void fixture_make_fmt(struct fixture *fx, size_t len, unsigned fmt)
{
	fx->cx = ctx_format(1, fmt);
	fx->base = random_buf(len);
	fx->nw = mutated(fx->base, len);
	fx->n = encode_ok(fx->cx, fx->base, fx->nw, len, 2, &fx->enc);
}

/* The fixture in format 2, what delta_encode() writes. */
static void fixture_make(struct fixture *fx, size_t len)
{
	fixture_make_fmt(fx, len, 2);
}

static void fixture_free(struct fixture *fx)
{
	free(fx->base);
	free(fx->nw);
	free(fx->enc);
	delta_ctx_free(fx->cx);
}

/* Each header field: short, magic, version, width, reserved. */
static void test_refuse_header(void **state)
{
	struct fixture fx;
	uint8_t *e;
	char err[256] = "";

	fixture_make(&fx, 4096);
	e = fx.enc;
	refused(fx.cx, fx.base, 4096, e, DELTA_HDR - 1, "shorter than its 16-byte header");
	refused(fx.cx, fx.base, 4096, e, 0, "shorter");
	e[0] = 'X';
	refused(fx.cx, fx.base, 4096, e, fx.n, "bad magic");
	e[0] = 'H';
	e[4] = 3;
	refused(fx.cx, fx.base, 4096, e, fx.n, "format version 3");
	e[4] = 0;
	refused(fx.cx, fx.base, 4096, e, fx.n, "format version 0");
	e[4] = DELTA_FORMAT;
	for (unsigned w = 0; w < 256; w++) {
		if (w == 1 || w == 2 || w == 4 || w == 8)
			continue;
		e[5] = (uint8_t)w;
		refused(fx.cx, fx.base, 4096, e, fx.n, "element width");
		assert_int_equal(delta_peek(e, fx.n, NULL, NULL, err, sizeof(err)), -EBADMSG);
	}
	e[5] = 2;
	e[6] = 1;
	refused(fx.cx, fx.base, 4096, e, fx.n, "block size 2^1");
	e[6] = DELTA_BLOCK_LOG + 1;
	refused(fx.cx, fx.base, 4096, e, fx.n, "block size");
	e[6] = DELTA_BLOCK_LOG;
	e[7] = 0x80;
	refused(fx.cx, fx.base, 4096, e, fx.n, "reserved");
	e[7] = 0;
	/* Restored, it decodes: each refusal was for the field changed. */
	assert_int_equal(delta_peek(e, fx.n, NULL, NULL, err, sizeof(err)), 0);
	{
		uint8_t out[4096];

		assert_int_equal(delta_decode(fx.cx, fx.base, 4096, e, fx.n, out, err, sizeof(err)),
		                 0);
		assert_memory_equal(out, fx.nw, 4096);
	}
	fixture_free(&fx);
	/* Format 1 has no block size: byte 6 is reserved there. */
	fixture_make_fmt(&fx, 4096, 1);
	fx.enc[6] = DELTA_BLOCK_LOG;
	refused(fx.cx, fx.base, 4096, fx.enc, fx.n, "reserved");
	fx.enc[6] = 0;
	fx.enc[7] = 1;
	refused(fx.cx, fx.base, 4096, fx.enc, fx.n, "reserved");
	fixture_free(&fx);
}

/* The header declares another length than the caller's (format 1: the
 * frame's content size is the shard's; format 2: a block's frame holds more
 * than the block can need). */
static void test_refuse_length(void **state)
{
	struct fixture fx;
	struct delta_ctx *cx;
	uint8_t *base, *nw, *enc;
	size_t n;

	cx = delta_ctx_new(1);
	assert_non_null(cx);
	base = random_buf(4096);
	nw = random_buf(4096); /* dense: a frame of 4096 bytes */
	n = encode_ok(cx, base, nw, 4096, 2, &enc);
	refused(cx, base, 2048, enc, n, "delta declares 4096 bytes, the shard has 2048");
	put_le64(enc + 8, 2048);
	refused(cx, base, 2048, enc, n,
	        "the zstd frame of block 0 declares 4096 bytes (0 to 2048)");
	free(base);
	free(nw);
	free(enc);
	delta_ctx_free(cx);

	fixture_make_fmt(&fx, 4096, 1);
	refused(fx.cx, fx.base, 2048, fx.enc, fx.n,
	        "delta declares 4096 bytes, the shard has 2048");
	put_le64(fx.enc + 8, 2048); /* header and caller agree, the frame does not */
	refused(fx.cx, fx.base, 2048, fx.enc, fx.n,
	        "the zstd frame declares 4096 bytes, the shard has 2048");
	fixture_free(&fx);
}

/* A frame of another content size behind a header of the right length. */
static void test_refuse_content_size(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	uint8_t *base = random_buf(4096), src[4095] = {0};
	uint8_t enc[DELTA_HDR + 256];
	size_t r;

	assert_non_null(cx);
	put_hdr(enc, 4096, 1);
	r = ZSTD_compress(enc + DELTA_HDR, sizeof(enc) - DELTA_HDR, src, sizeof(src), 1);
	assert_false(ZSTD_isError(r));
	refused(cx, base, 4096, enc, DELTA_HDR + r, "the zstd frame declares 4095 bytes");
	free(base);
	delta_ctx_free(cx);
}

/* A frame that does not declare its content size. */
static void test_refuse_no_content_size(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	uint8_t *base = random_buf(4096), src[4096] = {0};
	uint8_t enc[DELTA_HDR + 256];
	ZSTD_outBuffer o = {enc + DELTA_HDR, sizeof(enc) - DELTA_HDR, 0};
	ZSTD_inBuffer in = {src, sizeof(src), 0};

	assert_non_null(cx);
	assert_non_null(cc);
	put_hdr(enc, 4096, 1);
	assert_false(ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0)));
	/* Streaming, so zstd does not know the size to put in anyway. */
	assert_int_equal(ZSTD_compressStream2(cc, &o, &in, ZSTD_e_continue), 0);
	assert_int_equal(ZSTD_compressStream2(cc, &o, &in, ZSTD_e_end), 0);
	assert_int_equal(ZSTD_getFrameContentSize(o.dst, o.pos), ZSTD_CONTENTSIZE_UNKNOWN);
	refused(cx, base, 4096, enc, DELTA_HDR + o.pos, "does not declare its content size");
	ZSTD_freeCCtx(cc);
	free(base);
	delta_ctx_free(cx);
}

/* Trailing bytes: one byte, or a second frame. */
static void test_refuse_trailing(void **state)
{
	for (unsigned fmt = 1; fmt <= 2; fmt++) {
		struct fixture fx;
		uint8_t *e;

		fixture_make_fmt(&fx, 4096, fmt);
		e = xmalloc(2 * fx.n);
		memcpy(e, fx.enc, fx.n);
		e[fx.n] = 0;
		refused(fx.cx, fx.base, 4096, e, fx.n + 1,
		        fmt == 1 ? "1 trailing bytes after the zstd frame"
		                 : "1 trailing bytes after the last zstd frame");
		memcpy(e + fx.n, fx.enc + DELTA_HDR, fx.n - DELTA_HDR);
		refused(fx.cx, fx.base, 4096, e, 2 * fx.n - DELTA_HDR, "trailing bytes");
		free(e);
		fixture_free(&fx);
	}
}

/* A truncated frame, at every length short of whole. */
static void test_refuse_truncated(void **state)
{
	for (unsigned fmt = 1; fmt <= 2; fmt++) {
		struct fixture fx;

		fixture_make_fmt(&fx, 4096, fmt);
		refused(fx.cx, fx.base, 4096, fx.enc, DELTA_HDR, "no zstd frame");
		for (size_t n = DELTA_HDR + 1; n < fx.n; n++)
			refused(fx.cx, fx.base, 4096, fx.enc, n, "truncated");
		fixture_free(&fx);
	}
}

/* A skippable frame, or no zstd frame at all, after the header. */
static void test_refuse_not_a_frame(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	uint8_t base[1] = {0}, enc[DELTA_HDR + 8];

	assert_non_null(cx);
	put_hdr(enc, 0, 1);
	put_le32(enc + DELTA_HDR, 0x184D2A50); /* skippable frame, 0 bytes of content */
	put_le32(enc + DELTA_HDR + 4, 0);
	assert_int_equal(ZSTD_getFrameContentSize(enc + DELTA_HDR, 8), 0); /* zstd: fine */
	refused(cx, base, 0, enc, sizeof(enc), "no zstd frame");
	memset(enc + DELTA_HDR, 0, 8);
	refused(cx, base, 0, enc, sizeof(enc), "no zstd frame");
	delta_ctx_free(cx);
}

/* A frame that names a dictionary (1-byte dictionary ID 7): refused before
 * zstd is asked to decode it; without the ID the same frame decodes. */
static void test_refuse_dictionary(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	uint8_t base[4096] = {0}, out[4096], enc[DELTA_HDR + 16];
	uint8_t *f = enc + DELTA_HDR;
	char err[256];
	size_t n;

	assert_non_null(cx);
	put_hdr(enc, 4096, 1);
	n = rle_frame(f, 4096, 4096, 17); /* magic, FHD, WD, FCS(4), one block */
	memmove(f + 7, f + 6, n - 6);     /* room for the ID after the WD */
	f[4] |= 0x01;                     /* Dictionary_ID_flag: 1 byte */
	f[6] = 7;
	assert_int_equal(ZSTD_getDictID_fromFrame(f, n + 1), 7);
	refused(cx, base, 4096, enc, DELTA_HDR + n + 1, "needs a dictionary");
	n = rle_frame(f, 4096, 4096, 17);
	assert_int_equal(delta_decode(cx, base, 4096, enc, DELTA_HDR + n, out, err, sizeof(err)),
	                 0);
	/* Format 2: the frame of block 0, a dense block of zeros. */
	put_hdr_fmt(enc, 2, 4096, 1);
	n = rle_frame(f, 4096, 4096, 17);
	memmove(f + 7, f + 6, n - 6);
	f[4] |= 0x01;
	f[6] = 7;
	refused(cx, base, 4096, enc, DELTA_HDR + n + 1, "needs a dictionary");
	n = rle_frame(f, 4096, 4096, 17);
	assert_int_equal(delta_decode(cx, base, 4096, enc, DELTA_HDR + n, out, err, sizeof(err)),
	                 0);
	delta_ctx_free(cx);
}

/* A frame asking for a window above the limit (2^28 for 4096 bytes) is
 * refused though one-shot decoding would not need it; the same frame with a
 * 128 KiB window decodes. */
static void test_refuse_window(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	uint8_t base[4096] = {0}, out[4096], enc[DELTA_HDR + 16];
	char err[256];
	size_t n;

	assert_non_null(cx);
	for (unsigned fmt = 1; fmt <= 2; fmt++) { /* format 2: block 0 a dense block of zeros */
		put_hdr_fmt(enc, fmt, 4096, 1);
		n = rle_frame(enc + DELTA_HDR, 4096, 4096, 28);
		refused(cx, base, 4096, enc, DELTA_HDR + n, "zstd window of 268435456 bytes");
		n = rle_frame(enc + DELTA_HDR, 4096, 4096, 17);
		memset(out, 1, sizeof(out));
		if (delta_decode(cx, base, 4096, enc, DELTA_HDR + n, out, err, sizeof(err)))
			fail_msg("format %u: %s", fmt, err);
		assert_memory_equal(out, base, sizeof(out));
	}
	delta_ctx_free(cx);
}

/* The process's peak resident size, in bytes. */
static uint64_t maxrss(void)
{
	struct rusage ru;

	assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
	return (uint64_t)ru.ru_maxrss << 10;
}

/*
 * Decompression bombs for a 4096-byte shard, each refused without the
 * 1 GiB being made (the peak resident size grows by far less): a header
 * declaring 1 GiB; a header declaring 4096 before a frame of 1 GiB that
 * says so; and a frame that says 4096 but whose blocks hold 1 GiB (zstd
 * stops at the end of the 4096-byte buffer).
 */
static void test_refuse_bombs(void **state)
{
	struct delta_ctx *cx = delta_ctx_new(1);
	size_t fsz = rle_frame_size(GIB), n;
	uint8_t *enc = xmalloc(DELTA_HDR + fsz), base[4096] = {0};
	uint64_t rss0 = maxrss();

	assert_non_null(cx);
	n = rle_frame(enc + DELTA_HDR, (uint32_t)GIB, GIB, 17);
	assert_int_equal(n, fsz);
	assert_int_equal(ZSTD_findFrameCompressedSize(enc + DELTA_HDR, n), n); /* well-formed */

	put_hdr(enc, GIB, 1);
	refused(cx, base, 4096, enc, DELTA_HDR + n,
	        "delta declares 1073741824 bytes, the shard has 4096");
	put_hdr(enc, 4096, 1);
	refused(cx, base, 4096, enc, DELTA_HDR + n,
	        "the zstd frame declares 1073741824 bytes, the shard has 4096");
	put_le32(enc + DELTA_HDR + 6, 4096); /* the frame's content size field lies */
	refused(cx, base, 4096, enc, DELTA_HDR + n, "zstd: ");
	/* Format 2: block 0's frame declares 1 GiB, or says 4096 or 100 and
	 * holds 1 GiB (zstd stops at the end of the block buffer). */
	put_hdr_fmt(enc, 2, 4096, 1);
	put_le32(enc + DELTA_HDR + 6, (uint32_t)GIB);
	refused(cx, base, 4096, enc, DELTA_HDR + n,
	        "the zstd frame of block 0 declares 1073741824 bytes (0 to 4096)");
	put_le32(enc + DELTA_HDR + 6, 4096);
	refused(cx, base, 4096, enc, DELTA_HDR + n, "zstd: ");
	put_le32(enc + DELTA_HDR + 6, 100);
	refused(cx, base, 4096, enc, DELTA_HDR + n, "zstd: ");
	/* A shard of 3 blocks: the last block's frame holds 1 GiB. */
	{
		size_t len = 2 * DELTA_BLOCK + 4096, p = DELTA_HDR;
		uint8_t *b3 = xmalloc(len), *e3 = xmalloc(DELTA_HDR + 2 * 64 + fsz);

		memset(b3, 0, len);
		put_hdr_fmt(e3, 2, len, 1);
		p += rle_frame(e3 + p, DELTA_BLOCK, DELTA_BLOCK, 17);
		p += rle_frame(e3 + p, DELTA_BLOCK, DELTA_BLOCK, 17);
		p += rle_frame(e3 + p, 4096, GIB, 17);
		refused(cx, b3, len, e3, p, "zstd: ");
		free(b3);
		free(e3);
	}
	if (maxrss() - rss0 > 64 * MIB)
		fail_msg("peak resident size grew by %llu MiB",
		         (unsigned long long)((maxrss() - rss0) / MIB));
	free(enc);
	delta_ctx_free(cx);
}

/* After a decode that failed inside zstd (a frame whose blocks hold 8192
 * bytes where it declared 4096), the same context decodes again. */
static void test_ctx_after_failure(void **state)
{
	struct fixture fx;
	uint8_t out[4096], bad[DELTA_HDR + 32];
	char err[256];
	size_t n;

	fixture_make(&fx, 4096);
	put_hdr(bad, 4096, 2);
	n = rle_frame(bad + DELTA_HDR, 4096, 8192, 17);
	refused(fx.cx, fx.base, 4096, bad, DELTA_HDR + n, "zstd: ");
	assert_int_equal(delta_decode(fx.cx, fx.base, 4096, fx.enc, fx.n, out, err, sizeof(err)),
	                 0);
	assert_memory_equal(out, fx.nw, 4096);
	fixture_free(&fx);
}

/*
 * A delta applied to a base other than the one it was made against decodes
 * (returns 0: nothing in a delta names its base) to bytes that are not the
 * new shard.  Only the caller's XXH3-128 of the result tells: the contract
 * delta.h states, and the reason the rebuilt shard is hashed before use.
 */
static void test_wrong_base(void **state)
{
	struct fixture fx;
	uint8_t *other, out[4096];
	char err[256];
	XXH128_hash_t want, got;

	fixture_make(&fx, 4096);
	other = mutated(fx.base, 4096);
	assert_memory_not_equal(other, fx.base, 4096);
	assert_int_equal(delta_decode(fx.cx, other, 4096, fx.enc, fx.n, out, err, sizeof(err)), 0);
	want = XXH3_128bits(fx.nw, 4096);
	got = XXH3_128bits(out, 4096);
	assert_false(XXH128_isEqual(want, got));
	/* Against its own base, the same delta gives the new shard's hash. */
	assert_int_equal(delta_decode(fx.cx, fx.base, 4096, fx.enc, fx.n, out, err, sizeof(err)),
	                 0);
	assert_true(XXH128_isEqual(want, XXH3_128bits(out, 4096)));
	free(other);
	fixture_free(&fx);
}


int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_refuse_bombs), /* first: the peak RSS is still low */
		cmocka_unit_test(test_refuse_header),
		cmocka_unit_test(test_refuse_length),
		cmocka_unit_test(test_refuse_content_size),
		cmocka_unit_test(test_refuse_no_content_size),
		cmocka_unit_test(test_refuse_trailing),
		cmocka_unit_test(test_refuse_truncated),
		cmocka_unit_test(test_refuse_not_a_frame),
		cmocka_unit_test(test_refuse_dictionary),
		cmocka_unit_test(test_refuse_window),
		cmocka_unit_test(test_ctx_after_failure),
		cmocka_unit_test(test_wrong_base),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
