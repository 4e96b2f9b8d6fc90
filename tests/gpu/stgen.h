/*
 * stgen.h — deterministic safetensors files for the GPU test and benchmark.
 *
 * hwfs-gputest and hwfs-gpubench run on a bare GPU machine (no Python, no
 * safetensors package), so they write their own checkpoints: a valid
 * safetensors file of about the size asked for, whose bytes depend only on a
 * seed.  The layout covers what the device loader must handle: one tensor
 * larger than everything else (45% of the file: larger than max_shard in the
 * test, so it is stored in several shards), F32, BF16 and I64 tensors, a
 * scalar (shape []), a tensor whose length is not a multiple of 256 (the
 * loader aligns every tensor to 256 bytes in its buckets), and several
 * middling ones.  Tensor data is xorshift64* output: every byte differs
 * between tensors and seeds, so a swapped or misplaced tensor never compares
 * equal by chance.
 */
#ifndef HWFS_STGEN_H
#define HWFS_STGEN_H

#include <stddef.h>
#include <stdint.h>

/**
 * stgen_write() - write a safetensors file of about @bytes bytes (at least
 * 64 KiB is used) at @path (created or truncated, mode 0644), its data
 * generated from @seed.  Returns 0 or -errno, with a one-line sentence in
 * @err.
 */
int stgen_write(const char *path, uint64_t seed, uint64_t bytes, char *err, size_t errlen);

#endif /* HWFS_STGEN_H */
