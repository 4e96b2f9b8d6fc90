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
 *
 * This file: the program, writing seeds, and the delta and proto seeds;
 * gen_corpus_files.c: the safetensors, manifest and partition seeds.
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
#include "gen_corpus.h"


static const char *root;
static unsigned written;

void fatal(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "gen_corpus: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		fatal("out of memory");
	return p;
}

/* Write @n bytes at @p as CORPUS_DIR/@dir/@name. */
void put(const char *dir, const char *name, const void *p, size_t n)
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

void put_str(const char *dir, const char *name, const char *s)
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

/*
 * The delta seeds.  Long by design: a flat list, one call per seed (or per
 * loop over lengths and widths), read top to bottom; splitting it would only
 * spread the list.
 */
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


/*
 * The proto seeds.  Long by design: a flat list of messages, one call each;
 * splitting it would only spread the list.
 */
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
