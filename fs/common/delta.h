/*
 * delta.h — element-level deltas between two versions of a shard.
 *
 * Between two steps of an RL loop most bf16 weights keep their value, so a
 * new shard differs from the same tensor's shard in the previous version in
 * a few scattered elements.  A delta is the XOR of the two shards (zero where
 * an element kept its value), byte-shuffled by element width (all first
 * bytes of the elements, then all second bytes, ...: the bytes that change
 * together sit together) and compressed with zstd.  The receiver, holding
 * the base, decompresses, unshuffles and XORs it back, and checks the
 * rebuilt shard's XXH3-128 before interning it, so a wrong base or a
 * corrupt delta is caught there; delta_decode_hash() computes that hash in
 * the same pass (docs/delta.md).
 *
 * Encoded form (all integers little-endian):
 *   0  4 bytes  magic "HWDL"
 *   4  1 byte   format version: 2 (DELTA_FORMAT, written) or 1 (still read)
 *   5  1 byte   element width the XOR was shuffled with: 1, 2, 4 or 8
 *   6  1 byte   format 2: log2 of the block size, DELTA_BLOCK_LOG (17);
 *               format 1: zero
 *   7  1 byte   reserved, zero
 *   8  8 bytes  length of the shard (the base and the rebuilt shard)
 *  16  ...      format 2: one zstd frame per block of DELTA_BLOCK bytes of
 *               the shard, in order (the last block shorter; a shard of 0
 *               bytes has one empty frame), each declaring its content
 *               size, which says what it holds:
 *                 exactly the block's length: dense, the block's XOR
 *                 shuffled on its own (planes of its whole elements, then
 *                 its len % width tail bytes as they are);
 *                 less: sparse (only for a block of whole elements): m, the
 *                 number of elements that changed (4 bytes), m gaps (LEB128,
 *                 at most 3 bytes each: how many unchanged elements come
 *                 before each changed one, counted from the start of the
 *                 block or from the previous changed one), then their XOR
 *                 as width planes of m bytes (byte k of every changed
 *                 element, then byte k + 1, ...), and nothing else;
 *               format 1: exactly one zstd frame, declaring the shard's
 *               length, of the whole shard's XOR shuffled as one block
 *
 * The decoder is the only code that reads a delta from the network.  It
 * refuses (-EBADMSG, with a one-line reason) anything but exactly that: a
 * length other than the one the caller expects, a frame that does not
 * declare its content size, declares another one, or that is followed by
 * trailing bytes; in format 2 also a frame holding more than its block, a
 * sparse block whose count, gaps or values do not add up or that names an
 * element outside the block.  It decompresses each frame in one shot into a
 * buffer of at most the expected length (a block, or for format 1 the
 * shard) and no further, so a decompression bomb costs at most that length;
 * rebuilding writes the caller's buffer.
 *
 * A context (struct delta_ctx) holds the zstd contexts, a block buffer, a
 * hash state and (for format 1 only) a scratch buffer that grows to the
 * largest shard seen; it is not thread-safe: one per thread.
 */
#ifndef HWFS_DELTA_H
#define HWFS_DELTA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "hwfs_common.h"

#define DELTA_FORMAT 2     /* the format delta_encode() writes by default */
#define DELTA_HDR 16       /* bytes of the header before the zstd frames */
#define DELTA_BLOCK_LOG 17 /* format 2: a frame per 128 KiB of the shard (in L2) */
#define DELTA_BLOCK (1u << DELTA_BLOCK_LOG)

struct delta_ctx;

/**
 * delta_ctx_new() - a codec context compressing at zstd level @level
 * (negative levels are zstd's fast levels).  Returns NULL when out of memory.
 */
struct delta_ctx *delta_ctx_new(int level);

/**
 * delta_ctx_set_format() - make @cx encode format @format: 2 (the default)
 * or 1 (what a node of an earlier build reads).  Returns 0 or -EINVAL.
 */
int delta_ctx_set_format(struct delta_ctx *cx, unsigned format);

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
 * or format version (1 and 2 are read), a width not 1/2/4/8, another block
 * size, non-zero reserved bytes.
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
 * delta_decode_hash() - delta_decode(), and the XXH3-128 of the rebuilt
 * shard (what hwfs_hash_buf() gives for @out's @len bytes) into *@hash,
 * computed while each block of @out is still in the cache: the caller
 * compares it with the shard's hash instead of hashing @out again.  @hash
 * NULL is delta_decode().  On an error *@hash is undefined.
 */
int delta_decode_hash(struct delta_ctx *cx, const void *base, size_t len, const void *enc,
		      size_t enc_len, void *out, hwfs_hash_t *hash, char *err, size_t errlen);

/**
 * delta_count_diff() - how many elements of width @width (as delta_encode)
 * differ between @a and @b (@len bytes each); a trailing partial element
 * counts as one element.
 */
uint64_t delta_count_diff(const void *a, const void *b, size_t len, unsigned width);

#endif /* HWFS_DELTA_H */
