/*
 * gen_corpus.c — writes the generated seeds of the fuzz targets' corpora
 * (tests/fuzz/README.md), from the codecs themselves:
 *
 *   delta/        fuzz_delta: deltas made by delta_encode() (format 2 and 1,
 *                 sparse and dense, 0 .. 1 MiB + 7 bytes, widths 1-8), the
 *                 target's other modes (bare frames after a made-up header,
 *                 a shard to encode and corrupt) and broken ones (header
 *                 fields, truncation, trailing bytes, frames without or with
 *                 another content size, hand-made sparse blocks that do not
 *                 add up)
 *   proto/        fuzz_proto: every message type, version 2, with its
 *                 optional fields, and ill-formed ones (beside the
 *                 hand-written seeds already there)
 *   safetensors/  fuzz_safetensors: valid files (every dtype, padding,
 *                 metadata, empty and 0-dim tensors), truncated or over-long
 *                 data, header lengths 0 / huge / past the end, bad JSON,
 *                 overlapping or gapped offsets, bad dtypes and shapes
 *   manifest/     fuzz_manifest: manifests as manifest_build() writes them
 *                 (what the daemon sends) and broken ones
 *   partition/    fuzz_partition: hwfs-partition.json files, good and bad
 *
 * Every seed is checked here against the decoder it feeds: a seed named
 * as valid must be accepted, any other refused, so a seed keeps meaning what
 * its name says.  Run by `make fuzz-corpus` (tests/fuzz/fuzz.mk), which
 * then replays the whole corpus; the output is checked in.
 *
 *   gen_corpus CORPUS_DIR
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zstd.h>

#include "delta.h"
#include "manifest.h"
#include "proto.h"
#include "safetensors.h"

static const char *root;
static unsigned written;

static void __attribute__((noreturn, format(printf, 1, 2))) fatal(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "gen_corpus: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		fatal("out of memory");
	return p;
}

/* Write @n bytes at @p as CORPUS_DIR/@dir/@name. */
static void put(const char *dir, const char *name, const void *p, size_t n)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, dir);
	if (mkdir(path, 0755) < 0 && errno != EEXIST)
		fatal("mkdir %s: %s", path, strerror(errno));
	snprintf(path, sizeof(path), "%s/%s/%s", root, dir, name);
	f = fopen(path, "wb");
	if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f))
		fatal("write %s: %s", path, strerror(errno));
	written++;
}

static void put_str(const char *dir, const char *name, const char *s)
{
	put(dir, name, s, strlen(s));
}

/* ------------------------------------------------------------------ delta */

/* As fuzz_delta.c: the shard lengths of the first byte, the base. */
#define MAX_LEN ((1u << 20) + 7)
static const size_t lens[] = {0, 1, 7, 64, 4097, 65539};
static uint8_t *base;
static struct delta_ctx *cx;
static uint64_t rng = 88172645463325252ull;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* The first byte of a seed: mode, format-1 flag, width, length selector. */
static uint8_t b0(unsigned mode, int fmt1, unsigned width, unsigned sel)
{
	unsigned wb = width == 8 ? 3 : width == 4 ? 2 : width == 2 ? 1 : 0;

	return (uint8_t)(mode << 6 | (fmt1 ? 0x20 : 0) | wb << 3 | sel);
}

/* A shard of @len bytes: the base with @changes elements of @width changed
 * (every element by a small amount when @changes is SIZE_MAX). */
static uint8_t *shard(size_t len, unsigned width, size_t changes)
{
	uint8_t *s = xmalloc(len);

	memcpy(s, base, len);
	if (changes == SIZE_MAX) {
		for (size_t i = 0; i < len; i++)
			s[i] ^= (uint8_t)(rnd() & 0x07);
	} else {
		for (size_t c = 0; c < changes && len >= width; c++) {
			size_t e = (size_t)(rnd() % (len / width));

			s[e * width] ^= (uint8_t)(1 + rnd() % 255);
		}
	}
	return s;
}

/* delta_encode() of @nw against the base, in format @format; the delta is malloc'd. */
static uint8_t *encode(const uint8_t *nw, size_t len, unsigned width, unsigned format,
		       size_t *n)
{
	size_t cap = DELTA_HDR + ZSTD_compressBound(len) + (len / DELTA_BLOCK + 1) * 64;
	uint8_t *d = xmalloc(cap);
	ssize_t r;

	if (delta_ctx_set_format(cx, format))
		fatal("delta_ctx_set_format(%u)", format);
	r = delta_encode(cx, base, nw, len, width, d, cap);
	if (r <= 0)
		fatal("delta_encode(%zu bytes): %zd", len, r);
	*n = (size_t)r;
	return d;
}

/* A hand-made delta header. */
static void header(uint8_t *h, unsigned format, unsigned width, uint64_t len)
{
	memcpy(h, "HWDL", 4);
	h[4] = (uint8_t)format;
	h[5] = (uint8_t)width;
	h[6] = format == 2 ? DELTA_BLOCK_LOG : 0;
	h[7] = 0;
	for (int i = 0; i < 8; i++)
		h[8 + i] = (uint8_t)(len >> (8 * i));
}

/* Where the last zstd frame of delta @d (@n bytes) starts. */
static size_t last_frame(const uint8_t *d, size_t n)
{
	size_t pos = DELTA_HDR, last = pos;

	while (pos < n) {
		size_t f = ZSTD_findFrameCompressedSize(d + pos, n - pos);

		if (ZSTD_isError(f))
			fatal("not a sequence of zstd frames");
		last = pos;
		pos += f;
	}
	return last;
}

/* One zstd frame of @n bytes at @p, declaring its size or not. */
static size_t zframe(const void *p, size_t n, int declare, uint8_t *out, size_t cap)
{
	ZSTD_CCtx *c = ZSTD_createCCtx();
	size_t r;

	if (!c || ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, declare)))
		fatal("zstd context");
	r = ZSTD_compress2(c, out, cap, p, n);
	if (ZSTD_isError(r))
		fatal("ZSTD_compress2: %s", ZSTD_getErrorName(r));
	ZSTD_freeCCtx(c);
	return r;
}

/*
 * Write delta seed @name: first byte @first, then @n bytes at @d; check that
 * decoding it (modes 0 and 3) gives @want (NULL: that it is refused).
 */
static void delta_seed(const char *name, uint8_t first, const uint8_t *d, size_t n,
		       const uint8_t *want)
{
	uint8_t *buf = xmalloc(n + 1);
	unsigned mode = first >> 6, sel = first & 7;
	uint64_t len = sel < 6 ? lens[sel] : 0, declared;
	char err[256] = "";

	if (sel >= 6 && !delta_peek(d, n, &declared, NULL, NULL, 0) && declared <= MAX_LEN)
		len = declared;
	if (mode == 0 || mode == 3) {
		uint8_t *out = xmalloc(len);
		int rc = delta_decode(cx, base, len, d, n, out, err, sizeof(err));

		if (want && (rc || (len && memcmp(out, want, len))))
			fatal("delta seed %s does not decode: %s", name, err);
		if (!want && rc != -EBADMSG)
			fatal("delta seed %s is not refused (%d)", name, rc);
		free(out);
	}
	buf[0] = first;
	if (n)
		memcpy(buf + 1, d, n);
	put("delta", name, buf, n + 1);
	free(buf);
}

/* A valid delta seed of a shard of @len bytes. */
static void delta_valid(const char *name, unsigned mode, unsigned sel, size_t len, unsigned width,
			unsigned format, size_t changes)
{
	uint8_t *s = shard(len, width, changes), *d;
	size_t n;

	d = encode(s, len, width, format, &n);
	delta_seed(name, b0(mode, 0, 0, sel), d, n, s);
	free(d);
	free(s);
}

/* A hand-made format-2 delta of one sparse block: header for @len bytes of
 * width @width, then @content (@n bytes) as its frame. */
static void delta_sparse(const char *name, unsigned sel, size_t len, unsigned width,
			 const uint8_t *content, size_t n)
{
	uint8_t d[512];
	size_t f;

	header(d, 2, width, len);
	f = zframe(content, n, 1, d + DELTA_HDR, sizeof(d) - DELTA_HDR);
	delta_seed(name, b0(0, 0, 0, sel), d, DELTA_HDR + f, NULL);
}

static void gen_delta(void)
{
	uint8_t *s, *d, *t, hdr[DELTA_HDR + 256];
	size_t n, f;

	cx = delta_ctx_new(1);
	base = xmalloc(MAX_LEN);
	if (!cx)
		fatal("delta_ctx_new");
	for (size_t i = 0; i < MAX_LEN; i++)
		base[i] = (uint8_t)(i * 131 + (i >> 9));

	/* mode 3 (decode, re-encode, decode) and 0 (decode): real deltas */
	delta_valid("f2-sparse-w2-4097", 3, 4, 4097, 2, 2, 12);
	delta_valid("f2-sparse-w4-65539", 0, 5, 65539, 4, 2, 40);
	delta_valid("f2-dense-w4-4097", 3, 4, 4097, 4, 2, SIZE_MAX);
	delta_valid("f2-dense-w1-64", 3, 3, 64, 1, 2, SIZE_MAX);
	delta_valid("f2-unchanged-w2-4097", 3, 4, 4097, 2, 2, 0);
	delta_valid("f2-empty", 3, 0, 0, 2, 2, 0);
	delta_valid("f2-len1-w8", 3, 1, 1, 8, 2, SIZE_MAX);
	delta_valid("f2-len7-w8", 3, 2, 7, 8, 2, 1);
	delta_valid("f2-len64-w8", 3, 3, 64, 8, 2, 2);
	delta_valid("f2-declared-w2-300000", 3, 6, 300000, 2, 2, 30);
	delta_valid("f2-declared-max-w4", 0, 7, MAX_LEN, 4, 2, 20);
	delta_valid("f1-sparse-w2-4097", 3, 4, 4097, 2, 1, 12);
	delta_valid("f1-dense-w8-64", 3, 3, 64, 8, 1, SIZE_MAX);
	delta_valid("f1-empty", 3, 0, 0, 1, 1, 0);
	delta_valid("f1-declared-w2-140000", 0, 6, 140000, 2, 1, 25);

	/* A multi-block shard: sparse, dense and unchanged blocks. */
	s = shard(300000, 2, 0);
	for (size_t i = 0; i < 40; i++)
		s[(size_t)(rnd() % DELTA_BLOCK) & ~(size_t)1] ^= 0x5a;
	for (size_t i = DELTA_BLOCK; i < 2 * DELTA_BLOCK; i++)
		s[i] ^= (uint8_t)(rnd() & 3);
	d = encode(s, 300000, 2, 2, &n);
	delta_seed("f2-blocks-sparse-dense-same", b0(3, 0, 0, 6), d, n, s);
	free(d);
	free(s);

	/* broken: the header's fields, on a small three-block delta */
	s = shard(300000, 2, 9);
	d = encode(s, 300000, 2, 2, &n);
	t = xmalloc(n + 8);
#define BROKEN(nm, edit, len_)                                                                     \
	do {                                                                                       \
		memcpy(t, d, n);                                                                   \
		edit;                                                                              \
		delta_seed(nm, b0(0, 0, 0, 6), t, len_, NULL);                                     \
	} while (0)
	BROKEN("bad-magic", t[3] = 'X', n);
	BROKEN("bad-format-3", t[4] = 3, n);
	BROKEN("bad-format-0", t[4] = 0, n);
	BROKEN("bad-width-3", t[5] = 3, n);
	BROKEN("bad-width-16", t[5] = 16, n);
	BROKEN("bad-blocklog-16", t[6] = 16, n);
	BROKEN("bad-reserved", t[7] = 1, n);
	BROKEN("bad-truncated-frame", (void)0, n - 20);
	BROKEN("bad-last-frame-missing", (void)0, last_frame(d, n));
	BROKEN("bad-trailing-bytes", memcpy(t + n, "\x28\xb5\x2f", 3), n + 3);
	BROKEN("bad-header-only", (void)0, DELTA_HDR);
	BROKEN("bad-short-header", (void)0, 10);
	BROKEN("bad-corrupt-frame", t[DELTA_HDR + 20] ^= 0xff; t[DELTA_HDR + 21] ^= 0x55, n);
#undef BROKEN
	delta_seed("bad-empty", b0(0, 0, 0, 0), d, 0, NULL);
	/* a length other than the caller's: 300000 declared, 64 expected */
	delta_seed("bad-length-mismatch", b0(0, 0, 0, 3), d, n, NULL);
	free(t);
	free(d);
	free(s);

	/* format 1 with two frames */
	s = shard(4097, 2, 3);
	d = encode(s, 4097, 2, 1, &n);
	t = xmalloc(2 * n);
	memcpy(t, d, n);
	memcpy(t + n, d + DELTA_HDR, n - DELTA_HDR);
	delta_seed("bad-f1-two-frames", b0(0, 0, 0, 4), t, 2 * n - DELTA_HDR, NULL);
	/* mode 1: the frames alone, after the target's own header */
	delta_seed("m1-f1-frames-w2-4097", b0(1, 1, 2, 4), d + DELTA_HDR, n - DELTA_HDR, NULL);
	free(t);
	free(d);
	d = encode(s, 4097, 2, 2, &n);
	delta_seed("m1-f2-frames-w2-4097", b0(1, 0, 2, 4), d + DELTA_HDR, n - DELTA_HDR, NULL);
	delta_seed("m1-f2-frames-wrong-width", b0(1, 0, 8, 4), d + DELTA_HDR, n - DELTA_HDR, NULL);
	delta_seed("m1-garbage", b0(1, 0, 1, 3), (const uint8_t *)"not a zstd frame", 16, NULL);
	free(d);
	free(s);

	/* frames without a content size, or with another one */
	s = shard(64, 1, SIZE_MAX);
	header(hdr, 2, 1, 64);
	f = zframe(s, 64, 0, hdr + DELTA_HDR, sizeof(hdr) - DELTA_HDR);
	delta_seed("bad-frame-no-content-size", b0(0, 0, 0, 3), hdr, DELTA_HDR + f, NULL);
	header(hdr, 1, 1, 64);
	f = zframe(s, 64, 0, hdr + DELTA_HDR, sizeof(hdr) - DELTA_HDR);
	delta_seed("bad-f1-frame-no-content-size", b0(0, 0, 0, 3), hdr, DELTA_HDR + f, NULL);
	{
		uint8_t big[100] = {0};

		header(hdr, 2, 1, 64);
		f = zframe(big, sizeof(big), 1, hdr + DELTA_HDR, sizeof(hdr) - DELTA_HDR);
		delta_seed("bad-frame-larger-than-block", b0(0, 0, 0, 3), hdr, DELTA_HDR + f, NULL);
		header(hdr, 1, 1, 64);
		f = zframe(big, 63, 1, hdr + DELTA_HDR, sizeof(hdr) - DELTA_HDR);
		delta_seed("bad-f1-frame-short", b0(0, 0, 0, 3), hdr, DELTA_HDR + f, NULL);
	}
	free(s);

	/* hand-made sparse blocks (4096 bytes of width 2: 2048 elements) */
	{
		static const uint8_t outside[] = {1, 0, 0, 0, 0xb8, 0x17, 0xaa, 0xbb};
		static const uint8_t sum_outside[] = {2, 0, 0, 0, 0xff, 0x0f, 0x00, 1, 2, 3, 4};
		static const uint8_t count_big[] = {0x88, 0x13, 0, 0, 0, 0, 0, 0};
		static const uint8_t gap_4bytes[] = {1, 0, 0, 0, 0x80, 0x80, 0x80, 0x01, 7, 7};
		static const uint8_t trailing[] = {1, 0, 0, 0, 5, 0x11, 0x22, 0x33};
		static const uint8_t short_gaps[] = {3, 0, 0, 0, 1};
		static const uint8_t zero_value[] = {1, 0, 0, 0, 5, 0, 0};
		static const uint8_t partial[] = {1, 0, 0, 0, 0, 0x11, 0x22};

		delta_sparse("bad-sparse-gap-outside-block", 6, 4096, 2, outside, sizeof(outside));
		delta_sparse("bad-sparse-gaps-sum-outside", 6, 4096, 2, sum_outside,
			     sizeof(sum_outside));
		delta_sparse("bad-sparse-count-too-big", 6, 4096, 2, count_big, sizeof(count_big));
		delta_sparse("bad-sparse-gap-4-bytes", 6, 4096, 2, gap_4bytes, sizeof(gap_4bytes));
		delta_sparse("bad-sparse-trailing-byte", 6, 4096, 2, trailing, sizeof(trailing));
		delta_sparse("bad-sparse-gaps-short", 6, 4096, 2, short_gaps, sizeof(short_gaps));
		delta_sparse("bad-sparse-partial-element-block", 4, 4097, 2, partial,
			     sizeof(partial));
		/* a changed element whose XOR is zero: the encoder never writes it */
		header(hdr, 2, 2, 4096);
		f = zframe(zero_value, sizeof(zero_value), 1, hdr + DELTA_HDR,
			   sizeof(hdr) - DELTA_HDR);
		{
			uint8_t first = b0(0, 0, 0, 6);
			uint64_t len = 4096;
			uint8_t *out = xmalloc(len), *buf = xmalloc(DELTA_HDR + f + 1);
			int rc = delta_decode(cx, base, len, hdr, DELTA_HDR + f, out, NULL, 0);

			buf[0] = first;
			memcpy(buf + 1, hdr, DELTA_HDR + f);
			put("delta", rc ? "bad-sparse-zero-value" : "sparse-zero-value", buf,
			    DELTA_HDR + f + 1);
			free(out);
			free(buf);
		}
	}

	/* mode 2: a shard to encode, one byte of its delta XORed (0: none) */
	{
		static const struct {
			const char *name;
			size_t len;
			unsigned width;
			uint8_t x;
		} m2[] = {
			{"m2-w2-5000-intact", 5000, 2, 0},
			{"m2-w2-5000-corrupt", 5000, 2, 0x5a},
			{"m2-w8-3000-corrupt-header", 3000, 8, 0x01},
			{"m2-w1-3", 3, 1, 0},
		};

		for (size_t i = 0; i < HWFS_ARRAY_SIZE(m2); i++) {
			uint8_t *b = xmalloc(m2[i].len + 1);

			s = shard(m2[i].len, m2[i].width, 20);
			b[0] = b0(2, 0, m2[i].width, 0);
			memcpy(b + 1, s, m2[i].len);
			if (m2[i].len > 4) {
				b[5] = m2[i].x; /* rest[4] */
				if (strstr(m2[i].name, "header")) /* the position: byte 4 of the header */
					b[1] = 4, b[2] = b[3] = b[4] = 0;
			}
			put("delta", m2[i].name, b, m2[i].len + 1);
			free(b);
			free(s);
		}
	}
	delta_ctx_free(cx);
	free(base);
}

/* ------------------------------------------------------------------ proto */

#define HX "0123456789abcdef0123456789abcdef"
#define HY "fedcba9876543210fedcba9876543210"

/*
 * Write proto seed @name: frames as fuzz_proto.c cuts them (first byte: the
 * number of frames - 1; every frame but the last after its 2-byte length);
 * @nf frames: @hdr, then @p1 (@n1 bytes), then @p2 (@n2).  Check that the
 * decoder accepts it (@ok) or refuses it.
 */
static void proto_seed(const char *name, int ok, size_t nf, const char *hdr, size_t hl,
		       const void *p1, size_t n1, const void *p2, size_t n2)
{
	size_t n = 1 + (nf > 1 ? 2 : 0) + hl + n1 + (nf > 2 ? 2 : 0) + n2, pos = 0;
	uint8_t *b = xmalloc(n);
	const void *fr[3] = {hdr, p1, p2};
	size_t fl[3] = {hl, n1, n2};
	struct proto_msg m = {0};
	char err[256];
	int rc;

	b[pos++] = (uint8_t)(nf - 1);
	for (size_t i = 0; i < nf; i++) {
		if (i + 1 < nf) {
			b[pos++] = (uint8_t)fl[i];
			b[pos++] = (uint8_t)(fl[i] >> 8);
		}
		if (fl[i])
			memcpy(b + pos, fr[i], fl[i]);
		pos += fl[i];
	}
	if (nf > 1 && hl > 0xffff)
		fatal("proto seed %s: header too long for the framing", name);
	rc = proto_decode_frames(fr, fl, nf, &m, err, sizeof(err));
	if (ok && rc)
		fatal("proto seed %s is refused: %s", name, err);
	if (!ok && rc != -EBADMSG)
		fatal("proto seed %s is not refused", name);
	proto_msg_clear(&m);
	put("proto", name, b, pos);
	free(b);
}

static void msg(const char *name, int ok, const char *hdr)
{
	proto_seed(name, ok, 1, hdr, strlen(hdr), NULL, 0, NULL, 0);
}

static void msg_payload(const char *name, int ok, const char *hdr, const char *payload)
{
	proto_seed(name, ok, 2, hdr, strlen(hdr), payload, strlen(payload), NULL, 0);
}

static char *manifest_text; /* a real manifest, for ANNOUNCE and PLAN */

static void gen_proto(void)
{
	char *s;

	msg("hello_v2", 1,
	    "{\"v\":2,\"t\":\"HELLO\",\"node\":\"node-a\",\"listen\":\"tcp://10.0.0.2:7101\","
	    "\"versions\":[{\"name\":\"v1\",\"digest\":\"" HX "\",\"complete\":true},"
	    "{\"name\":\"v2\",\"digest\":\"" HY "\",\"complete\":false}],\"current\":\"v1\","
	    "\"key\":\"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\",\"session\":\"5f2c\","
	    "\"engines\":[{\"name\":\"vllm-0\",\"pid\":4242,\"serving\":\"v1\",\"shadow\":null,"
	    "\"state\":\"serving\",\"reason\":null,\"last_swap_pause_us\":1200,\"swaps\":3},"
	    "{\"name\":\"\\u0001bad\",\"pid\":-1,\"state\":\"zombie\"}],"
	    "\"applied\":\"v1\",\"epoch\":7,\"wire_bytes_received\":1048576,"
	    "\"wire_bytes_sent\":0,\"unknown_field\":[1,{\"x\":null}]}");
	msg("hello_minimal", 1,
	    "{\"v\":2,\"t\":\"HELLO\",\"node\":\"n\",\"listen\":\"l\",\"versions\":[],"
	    "\"current\":null}");
	s = xmalloc(200);
	snprintf(s, 200, "{\"v\":2,\"t\":\"ANNOUNCE\",\"version\":\"v1\",\"digest\":\"" HX "\"}");
	msg_payload("announce", 1, s, manifest_text);
	snprintf(s, 200,
		 "{\"v\":2,\"t\":\"PLAN\",\"version\":\"v1\",\"digest\":\"" HX "\",\"donors\":"
		 "[{\"node\":\"a\",\"addr\":\"tcp://a:1\"},{\"node\":\"b\",\"addr\":\"tcp://b:1\","
		 "\"key\":\"k\"}],\"stripe\":true}");
	msg_payload("plan_stripe", 1, s, manifest_text);
	free(s);
	msg("have", 1,
	    "{\"v\":2,\"t\":\"HAVE\",\"version\":\"v1\",\"digest\":\"" HX "\",\"complete\":false,"
	    "\"bytes_held\":4096,\"bytes_needed\":9007199254740992,\"bad_donor\":\"node-c\","
	    "\"waiting\":\"waiting for space: need 24.0M, free 15.9M\"}");
	msg("ready", 1,
	    "{\"v\":2,\"t\":\"READY\",\"txid\":12,\"version\":\"v1\",\"ok\":true,\"prepare_us\":800}");
	msg("ready_refused", 1,
	    "{\"v\":2,\"t\":\"READY\",\"txid\":12,\"version\":\"v1\",\"ok\":false,"
	    "\"reason\":\"version v1 is not complete\"}");
	msg("ack", 1,
	    "{\"v\":2,\"t\":\"ACK\",\"txid\":12,\"version\":\"v1\",\"ok\":true,\"flip_us\":35}");
	msg("commit_req", 1,
	    "{\"v\":2,\"t\":\"COMMIT_REQ\",\"req\":1,\"version\":\"v1\",\"deadline_ms\":30000}");
	msg("status_req", 1, "{\"v\":2,\"t\":\"STATUS_REQ\",\"req\":2}");
	msg("ping", 1, "{\"v\":2,\"t\":\"PING\"}");
	msg("welcome", 1,
	    "{\"v\":2,\"t\":\"WELCOME\",\"coordinator\":\"coord\",\"committed\":null,\"epoch\":0}");
	msg("prepare", 1,
	    "{\"v\":2,\"t\":\"PREPARE\",\"txid\":13,\"version\":\"v2\",\"digest\":\"" HY "\"}");
	msg("commit", 1, "{\"v\":2,\"t\":\"COMMIT\",\"txid\":13,\"version\":\"v2\",\"epoch\":8}");
	msg("abort", 1,
	    "{\"v\":2,\"t\":\"ABORT\",\"txid\":13,\"version\":\"v2\",\"reason\":\"node b refused\"}");
	msg("commit_res", 1,
	    "{\"v\":2,\"t\":\"COMMIT_RES\",\"req\":1,\"ok\":false,\"reason\":\"partial\","
	    "\"nodes\":[\"a\",\"b\",\"c\"],\"outcome\":\"partial\",\"committed\":[\"a\"],"
	    "\"failed\":{\"b\":\"flip failed\"},\"unknown\":[\"c\"],\"errno\":115}");
	msg("status_res", 1,
	    "{\"v\":2,\"t\":\"STATUS_RES\",\"req\":2,\"cluster\":{\"coordinator\":\"coord\","
	    "\"committed\":\"v1\",\"epoch\":3,\"refused_messages\":0,\"nodes\":[{\"name\":\"a\","
	    "\"addr\":\"tcp://a:1\",\"alive\":true,\"versions\":[]}],\"commits\":[],"
	    "\"recent_versions\":[]}}");
	msg("pong", 1, "{\"v\":2,\"t\":\"PONG\",\"committed\":\"v1\",\"epoch\":4}");
	msg("get_widths", 1,
	    "{\"v\":2,\"t\":\"GET\",\"req\":9,\"hashes\":[\"" HX "\",\"" HY "\"],\"bases\":[\"" HY
	    "\",\"00000000000000000000000000000000\"],\"widths\":[2,8]}");
	msg("missing", 1, "{\"v\":2,\"t\":\"MISSING\",\"req\":9,\"hash\":\"" HX "\"}");
	msg_payload("shard_piece", 1,
		    "{\"v\":2,\"t\":\"SHARD\",\"req\":9,\"hash\":\"" HX "\",\"size\":5,"
		    "\"offset\":10,\"total\":20}",
		    "01234");
	msg_payload("shard_empty", 1,
		    "{\"v\":2,\"t\":\"SHARD\",\"req\":9,\"hash\":\"" HX "\",\"size\":0}", "");

	/* ill-formed */
	msg("bad_unknown_type", 0, "{\"v\":2,\"t\":\"NOPE\"}");
	msg("bad_version_3", 0, "{\"v\":3,\"t\":\"PING\"}");
	msg("bad_no_type", 0, "{\"v\":2}");
	msg("bad_missing_field", 0,
	    "{\"v\":2,\"t\":\"HAVE\",\"version\":\"v1\",\"complete\":true,\"bytes_held\":1,"
	    "\"bytes_needed\":0}");
	msg("bad_str_for_int", 0, "{\"v\":2,\"t\":\"STATUS_REQ\",\"req\":\"1\"}");
	msg("bad_int_fraction", 0, "{\"v\":2,\"t\":\"STATUS_REQ\",\"req\":1.0}");
	msg("bad_int_exponent", 0, "{\"v\":2,\"t\":\"STATUS_REQ\",\"req\":1e3}");
	msg("bad_int_too_big", 0, "{\"v\":2,\"t\":\"STATUS_REQ\",\"req\":9007199254740993}");
	msg("bad_int_negative", 0, "{\"v\":2,\"t\":\"STATUS_REQ\",\"req\":-1}");
	msg("bad_hex_upper", 0,
	    "{\"v\":2,\"t\":\"MISSING\",\"req\":9,\"hash\":\"0123456789ABCDEF0123456789abcdef\"}");
	msg("bad_hex_short", 0, "{\"v\":2,\"t\":\"MISSING\",\"req\":9,\"hash\":\"0123\"}");
	msg("bad_str_empty", 0,
	    "{\"v\":2,\"t\":\"COMMIT\",\"txid\":1,\"version\":\"\"}");
	msg("bad_nul_in_str", 0,
	    "{\"v\":2,\"t\":\"COMMIT\",\"txid\":1,\"version\":\"a\\u0000b\"}");
	msg("bad_bool_as_int", 0,
	    "{\"v\":2,\"t\":\"ACK\",\"txid\":1,\"version\":\"v\",\"ok\":1}");
	msg("bad_duplicate_key", 0, "{\"v\":2,\"t\":\"PING\",\"t\":\"PING\"}");
	msg("bad_not_object", 0, "[2,\"PING\"]");
	msg("bad_trailing_garbage", 0, "{\"v\":2,\"t\":\"PING\"} x");
	msg("bad_invalid_utf8", 0, "{\"v\":2,\"t\":\"ABORT\",\"txid\":1,\"version\":\"v\","
				   "\"reason\":\"\xc3\x28\"}");
	msg("bad_hashes_empty", 0, "{\"v\":2,\"t\":\"GET\",\"req\":1,\"hashes\":[]}");
	msg("bad_bases_count", 0,
	    "{\"v\":2,\"t\":\"GET\",\"req\":1,\"hashes\":[\"" HX "\",\"" HY "\"],\"bases\":[\"" HX
	    "\"]}");
	msg("bad_width_3", 0,
	    "{\"v\":2,\"t\":\"GET\",\"req\":1,\"hashes\":[\"" HX "\"],\"widths\":[3]}");
	msg("bad_shard_no_payload", 0,
	    "{\"v\":2,\"t\":\"SHARD\",\"req\":9,\"hash\":\"" HX "\",\"size\":3}");
	msg_payload("bad_shard_size_mismatch", 0,
		    "{\"v\":2,\"t\":\"SHARD\",\"req\":9,\"hash\":\"" HX "\",\"size\":10}", "abc");
	msg_payload("bad_enc_without_base", 0,
		    "{\"v\":2,\"t\":\"SHARD\",\"req\":9,\"hash\":\"" HX "\",\"size\":3,"
		    "\"enc\":\"xor-zstd\"}",
		    "abc");
	msg_payload("bad_enc_unknown", 0,
		    "{\"v\":2,\"t\":\"SHARD\",\"req\":9,\"hash\":\"" HX "\",\"size\":3,"
		    "\"enc\":\"gzip\",\"base\":\"" HY "\"}",
		    "abc");
	msg_payload("bad_payload_for_ping", 0, "{\"v\":2,\"t\":\"PING\"}", "x");
	proto_seed("bad_three_frames", 0, 3, "{\"v\":2,\"t\":\"PING\"}", 19, "a", 1, "b", 1);
	proto_seed("bad_empty_header", 0, 1, "", 0, NULL, 0, NULL, 0);
	{ /* 1025 hashes */
		size_t cap = 64 + 1025 * 35;
		char *h = xmalloc(cap), *p = h;

		p += sprintf(p, "{\"v\":2,\"t\":\"GET\",\"req\":1,\"hashes\":[");
		for (int i = 0; i < 1025; i++)
			p += sprintf(p, "%s\"%032x\"", i ? "," : "", i);
		strcpy(p, "]}");
		msg("bad_hashes_1025", 0, h);
		free(h);
	}
	{ /* a str of 4097 bytes */
		char *h = xmalloc(4200);
		int k = sprintf(h, "{\"v\":2,\"t\":\"ABORT\",\"txid\":1,\"version\":\"v\",\"reason\":\"");

		memset(h + k, 'r', 4097);
		strcpy(h + k + 4097, "\"}");
		msg("bad_str_4097", 0, h);
		free(h);
	}
	{ /* nesting past jansson's limit */
		char *h = xmalloc(8000), *p = h;

		p += sprintf(p, "{\"v\":2,\"t\":\"PING\",\"x\":");
		for (int i = 0; i < 3000; i++)
			*p++ = '[';
		for (int i = 0; i < 3000; i++)
			*p++ = ']';
		strcpy(p, "}");
		msg("bad_deep_nesting", 0, h);
		free(h);
	}
}

/* ------------------------------------------------------------ safetensors */

/*
 * Write safetensors seed @name: the 8-byte length (@hlen, or the JSON's
 * length plus @pad when @hlen is 0), the JSON, @pad spaces, @data_len bytes
 * of data.  @parses: what st_parse() with the file's size must say (0 or
 * -EINVAL).
 */
static void st_seed(const char *name, int parses, uint64_t hlen, const char *json, size_t pad,
		    size_t data_len)
{
	size_t jl = strlen(json), n = 8 + jl + pad + data_len;
	uint8_t *b = xmalloc(n);
	struct st_header *h = NULL;
	char err[256] = "";
	int rc;

	if (!hlen)
		hlen = jl + pad;
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(hlen >> (8 * i));
	memcpy(b + 8, json, jl);
	memset(b + 8 + jl, ' ', pad);
	for (size_t i = 0; i < data_len; i++)
		b[8 + jl + pad + i] = (uint8_t)(i * 7 + 3);
	rc = st_parse(b, n, n, &h, err, sizeof(err));
	if (rc != parses)
		fatal("safetensors seed %s: st_parse gives %d (%s), not %d", name, rc, err, parses);
	st_free(h);
	put("safetensors", name, b, n);
	free(b);
}

static void gen_safetensors(void)
{
	static const char *const dtypes[][2] = {
		{"BOOL", "1"}, {"U8", "1"},      {"I8", "1"},      {"F8_E5M2", "1"}, {"F8_E4M3", "1"},
		{"F8_E8M0", "1"}, {"I16", "2"},  {"U16", "2"},     {"F16", "2"},     {"BF16", "2"},
		{"I32", "4"},  {"U32", "4"},     {"F32", "4"},     {"F64", "8"},     {"I64", "8"},
		{"U64", "8"},  {"C64", "8"},
	};
	const char *llama =
	    "{\"__metadata__\":{\"format\":\"pt\"},"
	    "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[16,8],\"data_offsets\":[0,256]},"
	    "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,8],"
	    "\"data_offsets\":[256,384]},"
	    "\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"F32\",\"shape\":[8],"
	    "\"data_offsets\":[384,416]},"
	    "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[416,448]}}";
	char json[8192], *p;
	uint64_t off = 0;

	st_seed("valid_llama", 0, 0, llama, 0, 448);
	st_seed("valid_llama_padded", 0, 0, llama, 6, 448);
	st_seed("valid_one_f32", 0, 0,
		"{\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 0, 24);
	st_seed("valid_empty_object", 0, 0, "{}", 6, 0);
	st_seed("valid_metadata_only", 0, 0, "{\"__metadata__\":{\"a\":\"b\",\"c\":\"\"}}", 0, 0);
	st_seed("valid_scalar_and_empty", 0, 0,
		"{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
		"\"e\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[8,8]},"
		"\"e2\":{\"dtype\":\"BF16\",\"shape\":[4,0],\"data_offsets\":[8,8]},"
		"\"t\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[8,11]}}",
		0, 11);
	st_seed("valid_subbyte", 0, 0,
		"{\"f4\":{\"dtype\":\"F4\",\"shape\":[6],\"data_offsets\":[0,3]},"
		"\"f6\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[3,6]},"
		"\"f6b\":{\"dtype\":\"F6_E3M2\",\"shape\":[2,4],\"data_offsets\":[6,12]}}",
		0, 12);
	st_seed("valid_unordered_keys_extra_fields", 0, 0,
		"{\"b\":{\"shape\":[2],\"data_offsets\":[2,4],\"dtype\":\"U8\",\"extra\":[1]},"
		"\"a\":{\"data_offsets\":[0,2],\"dtype\":\"U8\",\"shape\":[2]}}",
		0, 4);
	p = json + sprintf(json, "{");
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(dtypes); i++) {
		unsigned sz = (unsigned)atoi(dtypes[i][1]);

		p += sprintf(p, "%s\"t_%s\":{\"dtype\":\"%s\",\"shape\":[3,%zu],"
			     "\"data_offsets\":[%llu,%llu]}", i ? "," : "", dtypes[i][0],
			     dtypes[i][0], i + 1, (unsigned long long)off,
			     (unsigned long long)(off + 3 * (i + 1) * sz));
		off += 3 * (i + 1) * sz;
	}
	strcpy(p, "}");
	st_seed("valid_every_dtype", 0, 0, json, 0, (size_t)off);
	/* many small tensors: long chunker walks */
	p = json + sprintf(json, "{");
	off = 0;
	for (int i = 0; i < 48; i++) {
		unsigned len = 4 * (unsigned)(1 + (i * 37) % 29);

		p += sprintf(p, "%s\"layers.%d.w\":{\"dtype\":\"F32\",\"shape\":[%u],"
			     "\"data_offsets\":[%llu,%llu]}", i ? "," : "", i, len / 4,
			     (unsigned long long)off, (unsigned long long)(off + len));
		off += len;
	}
	strcpy(p, "}");
	st_seed("valid_48_tensors", 0, 0, json, 3, (size_t)off);

	/* the size check */
	st_seed("data_truncated", -EINVAL, 0, llama, 0, 300);
	st_seed("data_missing", -EINVAL, 0, llama, 0, 0);
	st_seed("data_trailing_bytes", -EINVAL, 0, llama, 0, 460);
	/* the length field */
	st_seed("hlen_zero", -EINVAL, 0x0, "", 0, 0);
	{
		static const uint8_t zero[8] = {0};
		static const uint8_t short5[5] = {0x10, 0, 0, 0, 0};
		static const uint8_t only_len[8] = {0x10, 0, 0, 0, 0, 0, 0, 0};
		static const uint8_t nine[9] = {0x01, 0, 0, 0, 0, 0, 0, 0, '{'};

		put("safetensors", "hlen_zero_8_bytes", zero, sizeof(zero));
		put("safetensors", "short_5_bytes", short5, sizeof(short5));
		put("safetensors", "only_length", only_len, sizeof(only_len));
		put("safetensors", "hlen_1_brace", nine, sizeof(nine));
		put("safetensors", "empty_file", "", 0);
	}
	st_seed("hlen_huge", -EINVAL, UINT64_MAX, "{}", 0, 0);
	st_seed("hlen_2_63", -EINVAL, 1ull << 63, "{}", 0, 0);
	st_seed("hlen_over_limit", -EINVAL, ST_MAX_HEADER + 1ull, "{}", 0, 0);
	st_seed("hlen_at_limit_truncated", -EINVAL, ST_MAX_HEADER, "{}", 0, 0);
	st_seed("hlen_past_end", -EINVAL, 4096, llama, 0, 448);
	st_seed("hlen_short_cuts_json", -EINVAL, 40, llama, 0, 448);
	/* the JSON */
	st_seed("json_not_object", -EINVAL, 0, "[1,2]", 0, 0);
	st_seed("json_unterminated", -EINVAL, 0, "{\"a\":{\"dtype\":\"F32\"", 0, 0);
	st_seed("json_trailing_garbage", -EINVAL, 0, "{} xx", 0, 0);
	st_seed("json_invalid_utf8", -EINVAL, 0,
		"{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1);
	st_seed("json_nul_in_name", -EINVAL, 0,
		"{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1);
	st_seed("json_duplicate_tensor", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		"\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
		0, 2);
	st_seed("json_control_chars_in_name", -EINVAL, 0,
		"{\"evil\\nname\\u001b[31m\":{\"dtype\":\"XX\",\"shape\":[1],\"data_offsets\":[0,1]}}",
		0, 1);
	/* the layout */
	st_seed("offsets_overlap", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
		"\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
		0, 24);
	st_seed("offsets_same_start", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		"\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		0, 8);
	st_seed("offsets_gap", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		"\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
		0, 20);
	st_seed("offsets_not_from_0", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 12);
	st_seed("offsets_reversed", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 0, 8);
	st_seed("offsets_size_mismatch", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 0, 12);
	st_seed("offsets_three", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,4]}}", 0, 2);
	st_seed("offsets_negative", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-2,0]}}", 0, 0);
	st_seed("offsets_huge", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
		"\"data_offsets\":[9223372036854775806,9223372036854775807]}}",
		0, 0);
	/* dtypes and shapes */
	st_seed("dtype_unknown", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]}}", 0, 16);
	st_seed("dtype_lowercase", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4);
	st_seed("dtype_number", -EINVAL, 0,
		"{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4);
	st_seed("dtype_with_nul", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\\u0000X\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4);
	st_seed("dtype_long", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32F32F32F32F32F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0,
		4);
	st_seed("dtype_missing", -EINVAL, 0, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4);
	st_seed("subbyte_odd_count", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 0, 2);
	st_seed("shape_negative", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 0, 1);
	st_seed("shape_float", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 0, 1);
	st_seed("shape_not_array", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 0, 1);
	st_seed("shape_overflow", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,16],"
		"\"data_offsets\":[0,0]}}",
		0, 0);
	p = json + sprintf(json, "{\"a\":{\"dtype\":\"U8\",\"shape\":[");
	for (int i = 0; i < 33; i++)
		p += sprintf(p, "%s1", i ? "," : "");
	strcpy(p, "],\"data_offsets\":[0,1]}}");
	st_seed("shape_33_dims", -EINVAL, 0, json, 0, 1);
	st_seed("tensor_not_object", -EINVAL, 0, "{\"a\":[0,1]}", 0, 0);
	st_seed("metadata_not_strings", -EINVAL, 0, "{\"__metadata__\":{\"a\":1}}", 0, 0);
	st_seed("metadata_not_object", -EINVAL, 0, "{\"__metadata__\":\"pt\"}", 0, 0);
}

/* --------------------------------------------------------------- manifest */

static struct hwfs_frec file_rec(const char *path, enum hwfs_kind kind, uint32_t mode)
{
	return (struct hwfs_frec){.path = (char *)path, .kind = kind, .mode = mode,
				  .mtime_ns = 1700000000123456789ll};
}

static hwfs_hash_t hash_of(const char *tag)
{
	hwfs_hash_t h;

	hwfs_hash_buf(tag, strlen(tag), &h);
	return h;
}

/* Write @v as manifest_build() encodes it (and that it parses). */
static char *manifest_seed(const char *name, const struct hwfs_vrec *v)
{
	struct hwfs_vrec *back = NULL;
	char *j, err[256];
	size_t n;

	if (manifest_build(v, &j, &n))
		fatal("manifest_build(%s)", name);
	if (manifest_parse(j, n, &back, err, sizeof(err)))
		fatal("manifest seed %s does not parse: %s", name, err);
	hwfs_vrec_free(back);
	put("manifest", name, j, n);
	return j;
}

/* Write @text as manifest seed @name, which manifest_parse() must refuse. */
static void manifest_bad(const char *name, const char *text)
{
	struct hwfs_vrec *v = NULL;
	char err[256];

	if (!manifest_parse(text, strlen(text), &v, err, sizeof(err)))
		fatal("manifest seed %s parses", name);
	put_str("manifest", name, text);
}

/* @text with its first @from replaced by @to (malloc'd); @from must occur. */
static char *edit(const char *text, const char *from, const char *to)
{
	const char *at = strstr(text, from);
	char *out;

	if (!at)
		fatal("edit: \"%s\" not found", from);
	if (asprintf(&out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from)) < 0)
		fatal("out of memory");
	return out;
}

static void gen_manifest(void)
{
	uint64_t shape_e[2] = {16, 8}, shape_q[2] = {8, 8}, shape_n[1] = {8}, shape_z[2] = {0, 4};
	struct hwfs_trec tensors[] = {
		{.name = "model.embed_tokens.weight", .dtype = "BF16", .ndim = 2, .shape = shape_e,
		 .off = 256, .len = 256},
		{.name = "model.empty", .dtype = "F16", .ndim = 2, .shape = shape_z, .off = 512,
		 .len = 0},
		{.name = "model.layers.0.self_attn.q_proj.weight", .dtype = "BF16", .ndim = 2,
		 .shape = shape_q, .off = 512, .len = 128},
		{.name = "model.norm.weight", .dtype = "F32", .ndim = 1, .shape = shape_n,
		 .off = 640, .len = 32},
		{.name = "scale", .dtype = "F32", .ndim = 0, .shape = NULL, .off = 672, .len = 4},
	};
	struct hwfs_extent ext_st[3], ext_cfg[1], ext_copy[1], ext_big[2], ext_part[1];
	struct hwfs_frec files[10];
	struct hwfs_vrec v = {.name = "v1", .state = HWFS_V_SEALED};
	char *simple, *full, *s, *t;
	size_t nf = 0;

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(tensors); i++)
		tensors[i].hash = hash_of(tensors[i].name);
	ext_st[0] = (struct hwfs_extent){0, 256, hash_of("st-header")};
	ext_st[1] = (struct hwfs_extent){256, 256, hash_of("st-embed")};
	ext_st[2] = (struct hwfs_extent){512, 164, hash_of("st-rest")};
	ext_cfg[0] = (struct hwfs_extent){0, 120, hash_of("config")};
	ext_copy[0] = ext_cfg[0]; /* the same shard in two files */
	ext_big[0] = (struct hwfs_extent){0, 1ull << 30, hash_of("big-0")};
	ext_big[1] = (struct hwfs_extent){1ull << 30, 12345, hash_of("big-1")};
	ext_part[0] = (struct hwfs_extent){0, 64, hash_of("partition")};

	/* simple: a directory, a file, a symlink, an empty file */
	files[nf] = file_rec("a", HWFS_K_DIR, 0755), nf++;
	files[nf] = file_rec("a/b.bin", HWFS_K_REG, 0644);
	files[nf].size = 120, files[nf].n_ext = 1, files[nf].ext = ext_cfg, nf++;
	files[nf] = file_rec("empty", HWFS_K_REG, 0600), nf++;
	files[nf] = file_rec("link", HWFS_K_LNK, 0777);
	files[nf].target = "a/b.bin", nf++;
	v.n_files = nf;
	v.files = files;
	simple = manifest_seed("simple", &v);

	/* full: the same, a safetensors file with its tensors, a failed one,
	 * a shard shared by two files, a large file, a partition file */
	files[nf] = file_rec("config.json", HWFS_K_REG, 0644);
	files[nf].size = 120, files[nf].n_ext = 1, files[nf].ext = ext_copy, nf++;
	files[nf] = file_rec("model.safetensors", HWFS_K_REG, 0444);
	files[nf].size = 676, files[nf].n_ext = 3, files[nf].ext = ext_st;
	files[nf].n_tensors = HWFS_ARRAY_SIZE(tensors), files[nf].tensors = tensors, nf++;
	files[nf] = file_rec("broken.safetensors", HWFS_K_REG, 0644);
	files[nf].size = 64, files[nf].n_ext = 1, files[nf].ext = ext_part;
	files[nf].st_error = "header length 0", nf++;
	files[nf] = file_rec("hwfs-partition.json", HWFS_K_REG, 0644);
	files[nf].size = 64, files[nf].n_ext = 1, files[nf].ext = ext_part, nf++;
	files[nf] = file_rec("sub/dir/big.bin", HWFS_K_REG, 04755);
	files[nf].mtime_ns = -5;
	files[nf].size = (1ull << 30) + 12345, files[nf].n_ext = 2, files[nf].ext = ext_big, nf++;
	files[nf] = file_rec("sub", HWFS_K_DIR, 0700), nf++;
	v.n_files = nf;
	v.name = "run-7.step-001200";
	full = manifest_seed("full", &v);

	v.n_files = 0;
	v.name = "empty-version";
	free(manifest_seed("empty_version", &v));
	files[0] = file_rec("mod\xc3\xa8le/\xe6\xa8\xa9\xe9\x87\x8d.bin", HWFS_K_REG, 0644);
	files[0].size = 120, files[0].n_ext = 1, files[0].ext = ext_cfg;
	files[1] = file_rec("mod\xc3\xa8le", HWFS_K_DIR, 0755);
	v.n_files = 2;
	v.name = "v-\xc3\xbcn\xc3\xaf";
	free(manifest_seed("unicode", &v));
	manifest_text = strdup(simple);

	/* accepted, not canonical: spacing, key order */
	{
		json_error_t je;
		json_t *js = json_loads(full, 0, &je);
		char *pretty = js ? json_dumps(js, JSON_INDENT(2)) : NULL;
		struct hwfs_vrec *back = NULL;
		char err[256];

		if (!pretty || manifest_parse(pretty, strlen(pretty), &back, err, sizeof(err)))
			fatal("an indented manifest does not parse");
		hwfs_vrec_free(back);
		put_str("manifest", "full_indented", pretty);
		free(pretty);
		json_decref(js);
	}

	/* refused */
#define BAD(nm, from, to)                                                                          \
	do {                                                                                       \
		t = edit(simple, from, to);                                                        \
		manifest_bad(nm, t);                                                               \
		free(t);                                                                           \
	} while (0)
	BAD("bad_format_tag", "hwfs-manifest/1", "hwfs-manifest/2");
	BAD("bad_version_dotdot", "\"version\":\"v1\"", "\"version\":\"..\"");
	BAD("bad_version_slash", "\"version\":\"v1\"", "\"version\":\"a/b\"");
	BAD("bad_version_empty", "\"version\":\"v1\"", "\"version\":\"\"");
	BAD("bad_path_dotdot", "\"path\":\"a/b.bin\"", "\"path\":\"a/../b.bin\"");
	BAD("bad_path_absolute", "\"path\":\"empty\"", "\"path\":\"/empty\"");
	BAD("bad_path_empty_component", "\"path\":\"a/b.bin\"", "\"path\":\"a//b.bin\"");
	BAD("bad_path_dot", "\"path\":\"a/b.bin\"", "\"path\":\"a/./b.bin\"");
	BAD("bad_path_control_char", "\"path\":\"empty\"", "\"path\":\"em\\u0001pty\"");
	BAD("bad_path_nul", "\"path\":\"empty\"", "\"path\":\"em\\u0000pty\"");
	BAD("bad_files_unsorted", "\"path\":\"empty\"", "\"path\":\"0\"");
	BAD("bad_files_duplicate", "\"path\":\"empty\"", "\"path\":\"a/b.bin\"");
	BAD("bad_below_a_file", "\"path\":\"empty\"", "\"path\":\"a/b.bin/c\"");
	BAD("bad_below_a_symlink", "\"target\":\"a/b.bin\"}",
	    "\"target\":\"a/b.bin\"},{\"kind\":\"dir\",\"mode\":493,\"mtime_ns\":1,"
	    "\"path\":\"link/x\"}");
	BAD("bad_mode_too_big", "\"mode\":420", "\"mode\":4096000");
	BAD("bad_mode_negative", "\"mode\":420", "\"mode\":-1");
	BAD("bad_unknown_key", "\"kind\":\"dir\"", "\"kind\":\"dir\",\"uid\":0");
	BAD("bad_unknown_root_key", "\"format\"", "\"seq\":1,\"format\"");
	BAD("bad_kind", "\"kind\":\"dir\"", "\"kind\":\"fifo\"");
	BAD("bad_symlink_no_target", ",\"target\":\"a/b.bin\"", "");
	BAD("bad_file_no_size", ",\"size\":120", "");
	BAD("bad_size_more_than_extents", "\"size\":120", "\"size\":121");
	BAD("bad_size_huge", "\"size\":120", "\"size\":18446744073709551615");
	BAD("bad_extent_zero_length", "[0,120,", "[0,0,");
	BAD("bad_extent_not_from_0", "[0,120,", "[1,120,");
	BAD("bad_shard_size", ",120]]", ",121]]");
	BAD("bad_shards_not_array", "\"shards\":[", "\"shards\":{\"x\":[");
	BAD("bad_duplicate_key", "\"version\":\"v1\"", "\"version\":\"v1\",\"version\":\"v1\"");
	BAD("bad_trailing_garbage", "\"version\":\"v1\"}", "\"version\":\"v1\"} {}");
	BAD("bad_truncated", "\"version\":\"v1\"}", "\"version\":\"v");
#undef BAD
	t = strdup(simple); /* the shard's hash, and only there, in upper case */
	for (char *h = strstr(t, "\"shards\":[[\"") + 11, *e = h + 32; h < e; h++)
		if (*h >= 'a' && *h <= 'f')
			*h = (char)(*h - 'a' + 'A');
	manifest_bad("bad_hash_upper", t);
	free(t);
	t = edit(simple, "\"shards\":[", "\"shards\":[[\"00000000000000000000000000000000\",1],");
	manifest_bad("bad_shard_unused", t);
	free(t);
	s = edit(full, "\"length\":128,", "\"length\":256,");
	manifest_bad("bad_tensors_overlap", s);
	free(s);
	s = edit(full, "\"offset\":672", "\"offset\":673");
	manifest_bad("bad_tensor_outside_file", s);
	free(s);
	s = edit(full, "\"dtype\":\"F32\"", "\"dtype\":\"F32F32F32F32F32F32\"");
	manifest_bad("bad_tensor_dtype_long", s);
	free(s);
	s = edit(full, "\"shape\":[8]", "\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
					  "1,1,1,1,1,1,1,1,1,8]");
	manifest_bad("bad_tensor_33_dims", s);
	free(s);
	s = edit(full, "\"shape\":[8]", "\"shape\":[-8]");
	manifest_bad("bad_tensor_shape_negative", s);
	free(s);
	manifest_bad("bad_not_object", "[\"hwfs-manifest/1\"]");
	manifest_bad("bad_empty", "");
	manifest_bad("bad_null", "null");
	{
		char name[300];

		memset(name, 'n', 256);
		name[256] = '\0';
		t = xmalloc(strlen(simple) + 300);
		sprintf(t, "%.*s%s%s", (int)(strstr(simple, "\"v1\"") - simple + 1), simple, name,
			strstr(simple, "\"v1\"") + 3);
		manifest_bad("bad_version_256_bytes", t);
		free(t);
	}
	free(simple);
	free(full);
}

/* -------------------------------------------------------------- partition */

static void gen_partition(void)
{
	static const struct {
		const char *name, *text;
	} seeds[] = {
		{"empty_object", "{}"},
		{"docs_example",
		 "{\"*.qkv_proj.weight\": 0, \"*.shared_expert_gate.weight\": \"replicate\"}\n"},
		{"all_dim0", "{\"*\": 0}"},
		{"all_dim1", "{\"*.weight\": 1}"},
		{"all_replicate", "{\"*\": \"replicate\"}"},
		{"experts_split", "{\"*.experts.*\": 0, \"*w2*\": 1}"},
		{"expert_rule_no_expert", "{\"*.scale\": \"expert\"}"},
		{"expert_rule_experts", "{\"*experts.[0-9]*\": \"expert\", \"*\": \"replicate\"}"},
		{"first_match_wins", "{\"*q_proj*\": 1, \"*proj*\": 0, \"*\": \"replicate\"}"},
		{"char_classes",
		 "{\"model.layers.[0-9].*.weight\": 1, \"model.[!l]*\": 0, \"*\": \"replicate\"}"},
		{"conv_3d_dim1", "{\"*conv*\": 1, \"*odd*\": \"replicate\"}"},
		{"packed_subbyte_dim0", "{\"*packed*\": 0}"},
		{"scalar_dim0", "{\"*.scale\": 0}"},
		{"odd_dim0", "{\"*odd*\": 0}"},
		{"fnmatch_odd_patterns",
		 "{\"[\": 0, \"\\\\\": 1, \"[!a-\": 0, \"**\": \"replicate\", \"[]]\": 1, \"*[\": 0}"},
		{"duplicate_keys", "{\"*\": 0, \"*\": \"replicate\"}"},
		{"rule_minus_zero", "{\"*q_proj*\": -0}"},
		{"unicode_pattern", "{\"*\xc3\xbc*\": 1, \"*\\u00e9*\": 0}"},
		{"whitespace", "\n\t {\r\n  \"lm_head.*\" :\t0 ,\n  \"*norm*\": \"replicate\"\n}\n\n"},
		{"nul_then_garbage", "{\"*\": 0}\0 garbage after the NUL"},
		{"expert_uppercase", "{\"*\": \"Expert\"}"},
		{"rule_2", "{\"*\": 2}"},
		{"rule_float", "{\"*\": 1.0}"},
		{"rule_true", "{\"*\": true}"},
		{"rule_null", "{\"*\": null}"},
		{"rule_object", "{\"*\": {\"dim\": 0}}"},
		{"rule_array", "{\"*\": [0]}"},
		{"pattern_newline", "{\"a\\nb\": 7}"},
		{"late_bad_rule", "{\"*q_proj*\": 0, \"*\": \"shard\"}"},
		{"not_object_array", "[{\"*\": 0}]"},
		{"not_object_string", "\"*\""},
		{"not_object_number", "0"},
		{"empty_file", ""},
		{"truncated", "{\"*q_proj*\": 0, \"*o_pr"},
		{"invalid_utf8", "{\"\xff*\": 0}"},
		{"bom", "\xef\xbb\xbf{}"},
		{"trailing_garbage", "{} {}"},
	};
	char *big, *p;

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(seeds); i++) {
		size_t n = strlen(seeds[i].text);

		if (!strcmp(seeds[i].name, "nul_then_garbage"))
			n = 9 + strlen(seeds[i].text + 9);
		put("partition", seeds[i].name, seeds[i].text, n);
	}
	/* many patterns, none matching but the last */
	big = xmalloc(64 * 1024);
	p = big + sprintf(big, "{");
	for (int i = 0; i < 1000; i++)
		p += sprintf(p, "\"nothing.%d.*\": %d, ", i, i & 1);
	strcpy(p, "\"*\": \"replicate\"}");
	put_str("partition", "many_patterns", big);
	free(big);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen_corpus CORPUS_DIR\n");
		return 2;
	}
	root = argv[1];
	gen_manifest(); /* first: ANNOUNCE and PLAN carry a manifest */
	gen_delta();
	gen_proto();
	gen_safetensors();
	gen_partition();
	free(manifest_text);
	printf("gen_corpus: %u seeds written under %s\n", written, root);
	return 0;
}
