/*
 * delta_i.h — what the files of the delta codec share (private: only
 * fs/common/delta*.c include it; the API and the encoded forms are delta.h).
 *
 *   delta.c          the context, the header (written and checked), widths
 *   delta_encode.c   delta_encode()
 *   delta_decode.c   delta_decode_hash(), delta_decode()
 *   delta_shuffle.c  the byte-plane kernels both directions use (delta_shuffle.h)
 */
#ifndef HWFS_DELTA_I_H
#define HWFS_DELTA_I_H

#include <stddef.h>
#include <stdint.h>
#include <zstd.h>
#include <xxhash.h>

#include "delta.h"

/*
 * The largest zstd window a delta may ask for, as a power of two: 128 MiB,
 * what zstd's strongest levels use (the levels hwfs encodes at, 1..19, use
 * at most 8 MiB).  Decoding is one-shot into a buffer of the shard's length,
 * so this bounds nothing today; it keeps a later streaming decoder from
 * having to allocate what a hostile frame asks for.
 */
#define DELTA_WINDOW_LOG_MAX 27

/*
 * Format 2's frame content for a block of bl bytes (delta.h) is dense, the
 * block's shuffled XOR, exactly bl bytes; or sparse, fewer: the number m of
 * changed elements (4 bytes), m gaps (LEB128: the unchanged elements before
 * each changed one, since the previous), then the changed elements' XOR as
 * w planes of m bytes.
 */
#define SPARSE_HDR 4
#define GAP_MAX_BYTES 3 /* a gap < DELTA_BLOCK < 2^21 */

/*
 * The encoder lists a block's changes only while the list stays under
 * 1/SPARSE_FRACTION of the bytes scanned so far, plus SPARSE_SLACK (about
 * 16% of a bf16 block's elements changed): past that the shuffled block
 * compresses faster than the list (measured: 30% changed took 3.2 CPU-s
 * per GiB as lists, 1.9 shuffled) for a few more bytes, and a dense block
 * is given up after its first kilobytes, not half its scan.  An encoder's
 * choice, not a format rule: the decoder takes any list shorter than its
 * block.
 */
#define SPARSE_FRACTION 4
#define SPARSE_SLACK 1024

/*
 * A dense block (its shuffled XOR) is compressed by a context of its own:
 * zstd's level, with the match search accelerated by DENSE_ACCEL (the fast
 * strategy's step grows where no match is found: the random low bits of the
 * changed elements), matches of at least DENSE_MIN_MATCH bytes (the zero
 * runs of the unchanged planes), and the literals still Huffman-coded (a
 * negative level's acceleration drops that, and the low planes are mostly
 * literals).  Measured (docs/delta.md, "Dense blocks, accelerated"): on
 * bench-delta's data, 30% of the elements changed, encode 2.95 -> 2.1
 * CPU-s per GiB, rebuild 1.03 -> 1.0, 0.81 -> 0.75 times zstd -1 of the XOR;
 * on real AdamW steps (make bench-rl, 26-51% changed) smaller deltas in
 * every step but the first, whose update has patterns a faster search
 * misses (64 was faster still on bench-delta and 19% larger there).  The
 * lists of sparse blocks keep the plain level: accelerated, they grew by 8
 * to 11% for 5 to 10% less CPU.  The decoder is unchanged (these are
 * ordinary zstd frames).
 */
#define DENSE_ACCEL 16
#define DENSE_MIN_MATCH 7

/*
 * The lists of sparse blocks are compressed at zstd's level with matches of
 * at least SPARSE_MIN_MATCH bytes (level 1 takes 6): the short matches it
 * found in the gaps and the low bytes of the values saved less than their
 * sequences cost, to encode and to decode.  Counted by callgrind on
 * bench-delta's 64 MiB shard, 2% changed (docs/benchmarks.md, "Issue 29,
 * item 3"): zstd's compression 76.2 -> 67.3 M instructions, its
 * decompression 32.0 -> 24.1 M, and 0.9% fewer bytes.  Ordinary zstd
 * frames: the decoder is unchanged.
 */
#define SPARSE_MIN_MATCH 7

/* A codec context (delta.h): one per thread. */
struct delta_ctx {
	ZSTD_CCtx *cc;     /* sparse blocks' lists (SPARSE_MIN_MATCH), format 1's whole shard */
	ZSTD_CCtx *cc_dense; /* dense blocks (DENSE_ACCEL) */
	ZSTD_DCtx *dc;
	XXH3_state_t *xs;  /* delta_decode_hash()'s running hash */
	unsigned format;   /* what delta_encode() writes: 1 or 2 (DELTA_FORMAT) */
	uint8_t *blk;      /* one block's frame content (format 2): DELTA_BLOCK bytes */
	uint8_t *vals;     /* a sparse block's changed elements while encoding: DELTA_BLOCK */
	uint8_t *scratch;  /* a whole shard's shuffled XOR (format 1): grows to the largest */
	size_t scratch_cap;
};

/* @w if it is a width the format knows (2, 4, 8), else 1. */
static inline unsigned delta_norm_width(unsigned w)
{
	return w == 2 || w == 4 || w == 8 ? w : 1;
}

/* The little-endian 32-bit integer at @p. */
static inline uint32_t delta_get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Store @v little-endian in the 4 bytes at @p. */
static inline void delta_put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/**
 * delta_scratch_reserve() - make @cx's scratch buffer hold at least @len
 * bytes (never NULL, so zstd always gets a real pointer).  Returns 0 or
 * -ENOMEM, the old buffer then kept.
 */
int delta_scratch_reserve(struct delta_ctx *cx, size_t len);

/**
 * delta_put_header() - write the DELTA_HDR bytes of a delta's header at @o:
 * the magic, @format, @width, the block size's log (format 2) and @len.
 */
void delta_put_header(uint8_t *o, unsigned format, unsigned width, uint64_t len);

#endif /* HWFS_DELTA_I_H */
