/*
 * delta.h — element-level deltas between two versions of a shard.
 *
 * Between two steps of an RL loop most bf16 weights keep their value, so a
 * new shard differs from the same tensor's shard in the previous version in
 * a few scattered elements.  A delta is the XOR of the two shards (zero where
 * an element kept its value), byte-shuffled by element width (all first
 * bytes of the elements, then all second bytes, ...: the bytes that change
 * together sit together) and compressed with zstd.  The receiver, holding
 * the base, decompresses, unshuffles and XORs it back; the caller then checks
 * the rebuilt shard's XXH3-128 before interning it, so a wrong base or a
 * corrupt delta is caught there (docs/delta.md).
 *
 * Encoded form (all integers little-endian):
 *   0  4 bytes  magic "HWDL"
 *   4  1 byte   format version, DELTA_FORMAT (1)
 *   5  1 byte   element width the XOR was shuffled with: 1, 2, 4 or 8
 *   6  2 bytes  reserved, zero
 *   8  8 bytes  length of the shard (the base and the rebuilt shard)
 *  16  ...      exactly one zstd frame whose content size is that length
 *
 * The decoder is the only code that reads a delta from the network.  It
 * refuses (-EBADMSG, with a one-line reason) anything but exactly that: a
 * length other than the one the caller expects, a frame that does not
 * declare its content size, declares another one, or is followed by
 * trailing bytes.  It decompresses in one shot into the context's scratch
 * buffer of exactly the expected length and no further, so a decompression
 * bomb costs at most that length; unshuffling writes the caller's buffer.
 *
 * A context (struct delta_ctx) holds the zstd contexts and a scratch buffer
 * that grows to the largest shard seen; it is not thread-safe: one per
 * thread.
 */
#ifndef HWFS_DELTA_H
#define HWFS_DELTA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define DELTA_FORMAT 1
#define DELTA_HDR 16 /* bytes of the header before the zstd frame */

struct delta_ctx;

/**
 * delta_ctx_new() - a codec context compressing at zstd level @level
 * (negative levels are zstd's fast levels).  Returns NULL when out of memory.
 */
struct delta_ctx *delta_ctx_new(int level);

/** Free @cx and its buffers. NULL is a no-op. */
void delta_ctx_free(struct delta_ctx *cx);

/**
 * delta_width() - the element width, in bytes, of safetensors dtype @dtype
 * (BF16 -> 2, F32 -> 4, F64 -> 8, I8 -> 1, ...); 1 for an unknown dtype,
 * NULL, or a dtype narrower than a byte.  Any width is correct for any
 * bytes; the right one compresses better.
 */
unsigned delta_width(const char *dtype);

/**
 * delta_encode() - encode @new_ against @base, both @len bytes, shuffling by
 * element width @width (1, 2, 4 or 8; anything else is taken as 1; a @len
 * that is not a multiple of it keeps its last len % width bytes unshuffled).
 * Writes at most @cap bytes to @out.
 * Returns the encoded length (DELTA_HDR + frame), -E2BIG when the encoding
 * does not fit in @cap (the caller sends the whole shard instead), -ENOMEM.
 */
ssize_t delta_encode(struct delta_ctx *cx, const void *base, const void *new_, size_t len,
		     unsigned width, void *out, size_t cap);

/**
 * delta_peek() - read the header of @enc (@enc_len bytes): the shard length
 * it declares into *@len and its width into *@width (either may be NULL).
 * Returns 0 or -EBADMSG (reason in @err) for a short buffer, another magic
 * or format version, a width not 1/2/4/8, non-zero reserved bytes.
 */
int delta_peek(const void *enc, size_t enc_len, uint64_t *len, unsigned *width, char *err,
	       size_t errlen);

/**
 * delta_decode() - rebuild a shard of @len bytes into @out from @base (@len
 * bytes) and the delta @enc (@enc_len bytes).  @out may not overlap @base or
 * @enc.  Returns 0, -EBADMSG (reason in @err: see the header comment; @out's
 * content is then undefined) or -ENOMEM.  The caller verifies the result's
 * hash: a delta made against another base decodes to the wrong bytes.
 */
int delta_decode(struct delta_ctx *cx, const void *base, size_t len, const void *enc,
		 size_t enc_len, void *out, char *err, size_t errlen);

/**
 * delta_count_diff() - how many elements of width @width (as delta_encode)
 * differ between @a and @b (@len bytes each); a trailing partial element
 * counts as one element.
 */
uint64_t delta_count_diff(const void *a, const void *b, size_t len, unsigned width);

#endif /* HWFS_DELTA_H */
