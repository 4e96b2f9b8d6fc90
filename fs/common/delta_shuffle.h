/*
 * delta_shuffle.h — the delta codec's byte-plane kernels (private to the
 * codec: delta_encode.c and delta_decode.c call them; delta.h has the API).
 *
 * A width @w is 1, 2, 4 or 8 bytes per element.  Shuffling @len bytes puts
 * byte k of each of the len / w whole elements in plane k (plane k at
 * k * (len / w)), then the len % w tail bytes as they are; width 1 is no
 * shuffle.  No function here fails or allocates.
 */
#ifndef HWFS_DELTA_SHUFFLE_H
#define HWFS_DELTA_SHUFFLE_H

#include <stddef.h>
#include <stdint.h>

/** @s = @a ^ @b, @len bytes. */
void delta_xor_bytes(uint8_t *restrict s, const uint8_t *restrict a, const uint8_t *restrict b,
		     size_t len);

/** @s = shuffle(@a ^ @b) for @len bytes of width @w. */
void delta_xor_shuffle(uint8_t *restrict s, const uint8_t *a, const uint8_t *b, size_t len,
		       unsigned w);

/**
 * @out = @base ^ unshuffle(planes) for @n whole elements of width @w (2, 4
 * or 8) whose planes lie @stride bytes apart in @s (plane k at s + k *
 * stride): a whole shuffle (stride n) or a run of elements of a longer one.
 */
void delta_unshuffle_xor_planes(uint8_t *restrict out, const uint8_t *base, const uint8_t *s,
				size_t stride, size_t n, unsigned w);

/** @out = @base ^ unshuffle(@s) for @len bytes of width @w: the inverse of delta_xor_shuffle(). */
void delta_unshuffle_xor(uint8_t *restrict out, const uint8_t *base, const uint8_t *s, size_t len,
			 unsigned w);

#endif /* HWFS_DELTA_SHUFFLE_H */
