/*
 * delta_decode.c — delta_decode_hash() and delta_decode() (API and encoded
 * forms: delta.h): the only code that reads a delta from the network.
 *
 * Decoding a format-2 delta is one pass over memory: each frame is
 * decompressed one-shot into the block buffer (capacity the block's length,
 * no further: a frame holding more fails there), then a dense block is
 * unshuffled and XORed with the base into the caller's buffer
 * (delta_shuffle.c), a sparse one is the base copied there with its changed
 * elements XORed in, and for delta_decode_hash() that block of the output
 * is fed to a streaming XXH3-128 while it is still in the cache, so the
 * caller needs no second pass to check the rebuilt shard's hash.
 *
 * Format 1 (one frame for the whole shard, shuffled as a whole) is still
 * decoded, for a node of an earlier build that sends it: the whole frame is
 * decompressed into the context's scratch buffer of exactly the shard's
 * length, then unshuffled, XORed and hashed in chunks of DELTA_BLOCK bytes of
 * output.
 *
 * Decoding trusts nothing it reads.  Before any byte of a frame is
 * decompressed the header is checked (delta_peek()), the declared length
 * must be the caller's, and the zstd frame header must be a regular frame
 * without a dictionary that declares its content size (exactly the shard's
 * for format 1, at most the block's for format 2), with a window no larger
 * than DELTA_WINDOW_LOG_MAX (or than that content), lying whole within what
 * is left of the input; after the last frame nothing may be left.  A sparse
 * block's list is read in one pass that checks each element inside its
 * block before XORing it in, and the gaps must end exactly where the values
 * begin (the last width * count bytes): a list broken anywhere is refused
 * (what it had applied to the caller's buffer is undefined output, as on
 * any error), with the reason a whole check of the list gives
 * (check_sparse()).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>
#include <xxhash.h>

#include "delta_i.h"
#include "delta_shuffle.h"
#include "hwfs_common.h"

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
 * Check the sparse block content @c (@clen bytes) for block @blkno of @bl
 * bytes at width @w, whole, as the format describes it (every gap well
 * formed, every element inside the block, exactly w * m bytes of values
 * after the gaps).  Returns 0 or -EBADMSG with the first rule broken in
 * @err.  Used only to say why apply_sparse() refused a block: the two
 * accept the same contents.
 */
static int check_sparse(size_t bl, unsigned w, const uint8_t *c, size_t clen, size_t blkno,
                        char *err, size_t errlen)
{
	size_t n = bl / w, m = delta_get_le32(c), p = SPARSE_HDR, g, idx = 0;

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
	hwfs_set_err(err, errlen, "block %zu: a malformed sparse block", blkno); /* not reached */
	return -EBADMSG;
}

/*
 * XOR the changed elements of a sparse block (@m of them, gaps from
 * @c[SPARSE_HDR] up to @gend, byte k of their values in plane @v + k * m)
 * into @out (@n whole elements of @W bytes, a constant once inlined), each
 * element checked inside the block before it is written.  Returns 0, or -1
 * when a gap is malformed, runs past @gend, names an element outside the
 * block, or the gaps do not end exactly at @gend.
 */
static inline __attribute__((always_inline)) int
apply_sparse_w(uint8_t *out, size_t n, const uint8_t *c, size_t gend, const uint8_t *v,
               size_t m, const unsigned W)
{
	size_t p = SPARSE_HDR, g, idx = 0;

	for (size_t j = 0; j < m; j++, idx++) {
		if (p < gend && c[p] < 0x80) /* most gaps: one byte */
			g = c[p++];
		else if (read_gap(c, gend, &p, &g))
			return -1;
		if (g >= n - idx)
			return -1;
		idx += g;
		for (unsigned k = 0; k < W; k++)
			out[idx * W + k] ^= v[k * m + j];
	}
	return p == gend ? 0 : -1;
}

/*
 * Apply the sparse block content @c (@clen bytes) to @out, which holds a
 * copy of the base's @bl bytes, in one pass over the list: the values are
 * the last w * m bytes of the content, so the gaps end where they start,
 * and each element is checked inside the block as it is applied.  A list
 * broken anywhere leaves @out partly changed (the caller's output is
 * undefined on an error, and the shard's hash is never taken from it).
 * Returns 0 or -EBADMSG with a reason naming block @blkno in @err (the same
 * contents are refused, with the same reasons, as when the list was checked
 * whole before it was applied: check_sparse()).
 */
static int apply_sparse(uint8_t *out, size_t bl, unsigned w, const uint8_t *c, size_t clen,
                        size_t blkno, char *err, size_t errlen)
{
	size_t n = bl / w, m, gend;
	int r;

	if (bl % w || clen < SPARSE_HDR) {
		hwfs_set_err(err, errlen, "block %zu: a sparse block %s", blkno,
		             bl % w ? "with a partial element" : "shorter than its count");
		return -EBADMSG;
	}
	m = delta_get_le32(c);
	if (m > n) {
		hwfs_set_err(err, errlen, "block %zu: %zu changed elements of %zu", blkno, m, n);
		return -EBADMSG;
	}
	if (clen - SPARSE_HDR < w * m) /* not even the values */
		return check_sparse(bl, w, c, clen, blkno, err, errlen);
	gend = clen - w * m;
	switch (w) {
	case 1:
		r = apply_sparse_w(out, n, c, gend, c + gend, m, 1);
		break;
	case 2:
		r = apply_sparse_w(out, n, c, gend, c + gend, m, 2);
		break;
	case 4:
		r = apply_sparse_w(out, n, c, gend, c + gend, m, 4);
		break;
	case 8:
		r = apply_sparse_w(out, n, c, gend, c + gend, m, 8);
		break;
	default: /* delta_peek() lets no other width through */
		hwfs_set_err(err, errlen, "block %zu: element width %u", blkno, w);
		return -EBADMSG;
	}
	return r ? check_sparse(bl, w, c, clen, blkno, err, errlen) : 0;
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
	if (delta_get_le32(f) != ZSTD_MAGICNUMBER) {
		hwfs_set_err(err, errlen, "no zstd frame after the delta header%s%s (magic %08x)",
		             for_, what, delta_get_le32(f));
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
	rc = delta_scratch_reserve(cx, len);
	if (rc) {
		hwfs_set_err(err, errlen, "no memory for a %zu-byte delta", len);
		return rc;
	}
	rc = decompress(cx, cx->scratch, len, f, fsize, err, errlen);
	if (rc)
		return rc;
	for (size_t i = 0; whole && i < n; i += run) {
		size_t m = n - i < run ? n - i : run;

		delta_unshuffle_xor_planes(out + i * w, base + i * w, cx->scratch + i, n, m, w);
		if (xs)
			XXH3_128bits_update(xs, out + i * w, m * w);
	}
	for (size_t i = whole; i < len; i += DELTA_BLOCK) {
		size_t m = len - i < DELTA_BLOCK ? len - i : DELTA_BLOCK;

		delta_xor_bytes(out + i, base + i, cx->scratch + i, m);
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
			delta_unshuffle_xor(out + off, base + off, cx->blk, bl, w);
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
