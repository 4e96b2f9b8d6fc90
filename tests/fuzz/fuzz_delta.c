/*
 * fuzz_delta.c — libFuzzer target for the delta decoder (fs/common/delta_decode.c),
 * the only code that reads a delta from the network.
 *
 * The first input byte picks the shard length (its low 3 bits: 0, 1, 7, 64,
 * 4097, 65539 bytes, or the length the delta's header declares when that is
 * at most 1 MiB + 7) and what the rest of the input is (its top 2 bits):
 *   0  the delta, as it is;
 *   1  the zstd frames after a valid header for that length, at width
 *      1 << ((byte >> 3) & 3), of format 2 (bit 5 clear) or 1 (bit 5
 *      set), so the search starts past the header;
 *   2  the bytes of a new shard (its length is theirs): it is encoded
 *      against the base, then one byte of the delta (picked by the first
 *      4 bytes of the shard) is XORed with the shard's 5th byte, and the
 *      result decoded (a zero XOR must give back exactly the new shard);
 *   3  as 0, and whatever decodes must re-encode and decode to the same
 *      bytes.
 * The base is a fixed pattern.  Every buffer is allocated at its exact size
 * so that AddressSanitizer sees a byte read or written past it.
 * delta_decode_hash() must return 0 or -EBADMSG with a one-line printable
 * reason, and on 0 the hash of what it rebuilt; anything else aborts,
 * which libFuzzer reports as a crash.  One
 * codec context serves every input, as one serves a daemon thread.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "delta.h"

#define FUZZ_NAME "fuzz_delta"
#include "fuzz_util.h"

#define MAX_LEN ((1u << 20) + 7)

static struct delta_ctx *cx;
static uint8_t *base;

/* A buffer of exactly @n bytes (1 for 0). */
static uint8_t *exact(size_t n)
{
	uint8_t *c = malloc(n ? n : 1);

	if (!c)
		die("out of memory", NULL);
	return c;
}

/* A copy of @n bytes at @p in a buffer of exactly that size. */
static uint8_t *exact_copy(const void *p, size_t n)
{
	uint8_t *c = exact(n);

	if (n)
		memcpy(c, p, n);
	return c;
}

/* Decode @enc against the base for @len bytes into a fresh buffer of
 * exactly @len bytes; returns it (caller frees) or NULL when refused. */
static uint8_t *decode(const uint8_t *enc, size_t enc_len, size_t len)
{
	uint8_t *out = exact(len), *e = exact_copy(enc, enc_len);
	char err[256] = "";
	hwfs_hash_t h, want;
	int rc = delta_decode_hash(cx, base, len, e, enc_len, out, &h, err, sizeof(err));

	free(e);
	if (!rc) {
		hwfs_hash_buf(out, len, &want);
		if (hwfs_hash_cmp(&h, &want))
			die("delta_decode_hash() gave another hash than the rebuilt shard's", NULL);
		return out;
	}
	free(out);
	if (rc != -EBADMSG)
		die("unexpected error code", err);
	if (!one_line(err))
		die("refused without a one-line printable reason", NULL);
	return NULL;
}

/* Encode @nw (@len bytes) against the base; returns the delta's length and
 * the delta in *@enc (caller frees). */
static size_t encode(const uint8_t *nw, size_t len, unsigned width, uint8_t **enc)
{
	size_t cap = DELTA_HDR + ZSTD_compressBound(len);
	ssize_t n;

	*enc = exact(cap);
	n = delta_encode(cx, base, nw, len, width, *enc, cap);
	if (n <= DELTA_HDR || (size_t)n > cap)
		die("encoding with room for anything failed", NULL);
	return (size_t)n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	cx = delta_ctx_new(1);
	base = malloc(MAX_LEN);
	if (!cx || !base)
		die("out of memory", NULL);
	for (size_t i = 0; i < MAX_LEN; i++)
		base[i] = (uint8_t)(i * 131 + (i >> 9));
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t lens[] = {0, 1, 7, 64, 4097, 65539};
	const uint8_t *rest = data + 1;
	size_t n = size - 1, len, enc_len;
	unsigned mode, width;
	uint8_t *enc = NULL, *out = NULL, *enc2 = NULL, *out2 = NULL;
	uint64_t declared;

	if (size < 1)
		return 0;
	mode = data[0] >> 6;
	width = 1u << ((data[0] >> 3) & 3);
	len = (data[0] & 7) < 6 ? lens[data[0] & 7] : 0;
	if ((data[0] & 7) >= 6 && !delta_peek(rest, n, &declared, NULL, NULL, 0) &&
	    declared <= MAX_LEN)
		len = (size_t)declared;

	switch (mode) {
	case 1: /* a valid header, then the input */
		enc_len = DELTA_HDR + n;
		enc = exact(enc_len);
		memcpy(enc, "HWDL", 4);
		enc[4] = data[0] & 0x20 ? 1 : 2;
		enc[5] = (uint8_t)width;
		enc[6] = enc[4] == 2 ? DELTA_BLOCK_LOG : 0;
		enc[7] = 0;
		for (int i = 0; i < 8; i++)
			enc[8 + i] = (uint8_t)((uint64_t)len >> (8 * i));
		if (n)
			memcpy(enc + DELTA_HDR, rest, n);
		free(decode(enc, enc_len, len));
		break;
	case 2: { /* a real delta of the input, one byte changed */
		uint32_t pos = 0;
		uint8_t x = n > 4 ? rest[4] : 0;

		len = n < MAX_LEN ? n : MAX_LEN;
		for (size_t i = 0; i < 4 && i < len; i++)
			pos |= (uint32_t)rest[i] << (8 * i);
		enc_len = encode(rest, len, width, &enc);
		enc[pos % enc_len] ^= x;
		out = decode(enc, enc_len, len);
		if (!x && (!out || (len && memcmp(out, rest, len))))
			die("a delta did not decode to what was encoded", NULL);
		break;
	}
	default: /* the input is the delta */
		out = decode(rest, n, len);
		if (mode == 3 && out) {
			unsigned w = 1;

			if (delta_peek(rest, n, NULL, &w, NULL, 0))
				die("decoded what delta_peek refuses", NULL);
			enc_len = encode(out, len, w, &enc2);
			out2 = decode(enc2, enc_len, len);
			if (!out2 || (len && memcmp(out, out2, len)))
				die("a decoded shard does not survive re-encoding", NULL);
		}
		break;
	}
	free(enc);
	free(out);
	free(enc2);
	free(out2);
	return 0;
}
