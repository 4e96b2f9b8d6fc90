/*
 * delta_shuffle.c — the delta codec's byte-plane kernels (delta_shuffle.h):
 * the XOR of two versions of a block shuffled by element width (byte k of
 * every element together, plane k), its inverse XORed back onto the base,
 * the plain XOR of a tail, and the count of changed elements behind
 * delta_count_diff().  delta_encode.c and delta_decode.c call them once per
 * block; everything inside a kernel stays in this file, inlined.
 *
 * The shuffle loops for widths 2, 4 and 8 run over blocks of SHUF_BLOCK
 * elements: a constant trip count the compiler vectorises whole even at
 * -O2 (GCC's very-cheap cost model), with the bytes of the block's elements
 * gathered from (or scattered to) the planes by vector permutes.
 */
#define _GNU_SOURCE
#include <string.h>

#include "delta_i.h"
#include "delta_shuffle.h"

/* Elements per inner shuffle loop (see the header comment). */
#define SHUF_BLOCK 64

/*
 * One block of SHUF_BLOCK elements of @W bytes (2, 4 or 8, a constant once
 * inlined): byte k of element j of @a ^ @b goes to plane k, d<k>[j].  The
 * planes are separate restrict pointers so the compiler knows the stores
 * do not alias, the trip count is constant so it needs no epilogue: GCC
 * vectorises it at -O2 (16-byte vectors, permutes gathering the bytes).
 */
static inline __attribute__((always_inline)) void
xor_shuffle_block(const unsigned W, uint8_t *restrict d0, uint8_t *restrict d1,
                  uint8_t *restrict d2, uint8_t *restrict d3, uint8_t *restrict d4,
                  uint8_t *restrict d5, uint8_t *restrict d6, uint8_t *restrict d7,
                  const uint8_t *restrict a, const uint8_t *restrict b)
{
	for (size_t j = 0; j < SHUF_BLOCK; j++) {
		d0[j] = a[j * W] ^ b[j * W];
		d1[j] = a[j * W + 1] ^ b[j * W + 1];
		if (W >= 4) {
			d2[j] = a[j * W + 2] ^ b[j * W + 2];
			d3[j] = a[j * W + 3] ^ b[j * W + 3];
		}
		if (W == 8) {
			d4[j] = a[j * W + 4] ^ b[j * W + 4];
			d5[j] = a[j * W + 5] ^ b[j * W + 5];
			d6[j] = a[j * W + 6] ^ b[j * W + 6];
			d7[j] = a[j * W + 7] ^ b[j * W + 7];
		}
	}
}

/*
 * s = shuffle(a ^ b) for @n whole elements of @W bytes: byte k of element
 * i goes to s[k * n + i].  Whole blocks go through xor_shuffle_block(), the
 * last n % SHUF_BLOCK elements byte by byte.
 */
static inline __attribute__((always_inline)) void
xor_shuffle_w(uint8_t *s, const uint8_t *a, const uint8_t *b, size_t n, const unsigned W)
{
	uint8_t *p[8];
	size_t i = 0;

	for (unsigned k = 0; k < 8; k++)
		p[k] = s + (k < W ? k : 0) * n;
	for (; i + SHUF_BLOCK <= n; i += SHUF_BLOCK)
		xor_shuffle_block(W, p[0] + i, p[1] + i, p[2] + i, p[3] + i, p[4] + i, p[5] + i,
		                  p[6] + i, p[7] + i, a + i * W, b + i * W);
	for (; i < n; i++)
		for (unsigned k = 0; k < W; k++)
			s[k * n + i] = a[i * W + k] ^ b[i * W + k];
}

/* The inverse of xor_shuffle_block(): o[j * W + k] = base ^ d<k>[j]. */
static inline __attribute__((always_inline)) void
unshuffle_xor_block(const unsigned W, uint8_t *restrict o, const uint8_t *restrict base,
                    const uint8_t *restrict d0, const uint8_t *restrict d1,
                    const uint8_t *restrict d2, const uint8_t *restrict d3,
                    const uint8_t *restrict d4, const uint8_t *restrict d5,
                    const uint8_t *restrict d6, const uint8_t *restrict d7)
{
	for (size_t j = 0; j < SHUF_BLOCK; j++) {
		o[j * W] = base[j * W] ^ d0[j];
		o[j * W + 1] = base[j * W + 1] ^ d1[j];
		if (W >= 4) {
			o[j * W + 2] = base[j * W + 2] ^ d2[j];
			o[j * W + 3] = base[j * W + 3] ^ d3[j];
		}
		if (W == 8) {
			o[j * W + 4] = base[j * W + 4] ^ d4[j];
			o[j * W + 5] = base[j * W + 5] ^ d5[j];
			o[j * W + 6] = base[j * W + 6] ^ d6[j];
			o[j * W + 7] = base[j * W + 7] ^ d7[j];
		}
	}
}

/*
 * out = base ^ unshuffle(s) for @n whole elements of @W bytes whose planes
 * lie @stride bytes apart in @s (plane k at s + k * stride): the inverse of
 * xor_shuffle_w() with stride n, or a run of elements of a longer shuffle.
 */
static inline __attribute__((always_inline)) void
unshuffle_xor_w(uint8_t *out, const uint8_t *base, const uint8_t *s, size_t stride, size_t n,
                const unsigned W)
{
	const uint8_t *p[8];
	size_t i = 0;

	for (unsigned k = 0; k < 8; k++)
		p[k] = s + (k < W ? k : 0) * stride;
	for (; i + SHUF_BLOCK <= n; i += SHUF_BLOCK)
		unshuffle_xor_block(W, out + i * W, base + i * W, p[0] + i, p[1] + i, p[2] + i,
		                    p[3] + i, p[4] + i, p[5] + i, p[6] + i, p[7] + i);
	for (; i < n; i++)
		for (unsigned k = 0; k < W; k++)
			out[i * W + k] = base[i * W + k] ^ s[k * stride + i];
}

/*
 * s = a ^ b for @len bytes (width 1, and the tail of the wider widths), in
 * blocks of SHUF_BLOCK bytes for the vectoriser as above.
 */
void delta_xor_bytes(uint8_t *restrict s, const uint8_t *restrict a, const uint8_t *restrict b,
                     size_t len)
{
	size_t i = 0;

	for (; i + SHUF_BLOCK <= len; i += SHUF_BLOCK)
		for (size_t j = 0; j < SHUF_BLOCK; j++)
			s[i + j] = a[i + j] ^ b[i + j];
	for (; i < len; i++)
		s[i] = a[i] ^ b[i];
}

/*
 * Write shuffle(@a ^ @b) (@len bytes, width @w in 1/2/4/8) into @s: the
 * planes of the len / w whole elements, then the len % w tail bytes.
 */
void delta_xor_shuffle(uint8_t *restrict s, const uint8_t *a, const uint8_t *b, size_t len,
                       unsigned w)
{
	size_t n = len / w, whole = n * w;

	switch (w) {
	case 2:
		xor_shuffle_w(s, a, b, n, 2);
		break;
	case 4:
		xor_shuffle_w(s, a, b, n, 4);
		break;
	case 8:
		xor_shuffle_w(s, a, b, n, 8);
		break;
	default:
		whole = 0;
		break;
	}
	delta_xor_bytes(s + whole, a + whole, b + whole, len - whole);
}

/*
 * Write @base ^ unshuffle(@s) into @out for @n whole elements of width @w
 * (2, 4 or 8) whose planes lie @stride bytes apart in @s.
 */
void delta_unshuffle_xor_planes(uint8_t *restrict out, const uint8_t *base, const uint8_t *s,
                                size_t stride, size_t n, unsigned w)
{
	switch (w) {
	case 2:
		unshuffle_xor_w(out, base, s, stride, n, 2);
		break;
	case 4:
		unshuffle_xor_w(out, base, s, stride, n, 4);
		break;
	default:
		unshuffle_xor_w(out, base, s, stride, n, 8);
		break;
	}
}

/* Write @base ^ unshuffle(@s) into @out: the inverse of delta_xor_shuffle(). */
void delta_unshuffle_xor(uint8_t *restrict out, const uint8_t *base, const uint8_t *s, size_t len,
                         unsigned w)
{
	size_t n = len / w, whole = n * w;

	if (w == 1)
		whole = 0;
	else
		delta_unshuffle_xor_planes(out, base, s, n, n, w);
	delta_xor_bytes(out + whole, base + whole, s + whole, len - whole);
}

/*
 * Whether the elements of @W bytes (a constant once inlined) at @x and @y
 * differ: one load of each as an integer of that width.
 */
static inline __attribute__((always_inline)) unsigned elem_ne(const uint8_t *x, const uint8_t *y,
                                                              const unsigned W)
{
	uint16_t h, k;
	uint32_t u, v;
	uint64_t q, r;

	switch (W) {
	case 1:
		return x[0] != y[0];
	case 2:
		memcpy(&h, x, 2);
		memcpy(&k, y, 2);
		return h != k;
	case 4:
		memcpy(&u, x, 4);
		memcpy(&v, y, 4);
		return u != v;
	default:
		memcpy(&q, x, 8);
		memcpy(&r, y, 8);
		return q != r;
	}
}

/*
 * Count the elements of @W bytes that differ between @a and @b (@n whole
 * elements), in blocks of SHUF_BLOCK elements for the vectoriser.
 */
static inline __attribute__((always_inline)) uint64_t count_w(const uint8_t *a, const uint8_t *b,
                                                              size_t n, const unsigned W)
{
	uint64_t c = 0;
	size_t i = 0;

	for (; i + SHUF_BLOCK <= n; i += SHUF_BLOCK) {
		const uint8_t *pa = a + i * W, *pb = b + i * W;
		unsigned bc = 0;

		for (size_t j = 0; j < SHUF_BLOCK; j++)
			bc += elem_ne(pa + j * W, pb + j * W, W);
		c += bc;
	}
	for (; i < n; i++)
		c += elem_ne(a + i * W, b + i * W, W);
	return c;
}

/*
 * The number of elements of width @width (normalised as delta_encode())
 * that differ between @a and @b (@len bytes each); a trailing partial
 * element counts as one.
 */
uint64_t delta_count_diff(const void *a, const void *b, size_t len, unsigned width)
{
	const uint8_t *pa = a, *pb = b;
	unsigned w = delta_norm_width(width);
	size_t n = len / w, whole = n * w;
	uint64_t c;

	switch (w) {
	case 2:
		c = count_w(pa, pb, n, 2);
		break;
	case 4:
		c = count_w(pa, pb, n, 4);
		break;
	case 8:
		c = count_w(pa, pb, n, 8);
		break;
	default:
		c = count_w(pa, pb, n, 1);
		break;
	}
	if (len > whole && memcmp(pa + whole, pb + whole, len - whole))
		c++;
	return c;
}
