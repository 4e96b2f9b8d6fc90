/*
 * delta_base.h — which shard of an earlier version a new shard is a delta
 * against.
 *
 * The rule (docs/delta.md, "Which base"): a shard of the new version that
 * lies inside a tensor is matched to the shard at the same offset within the
 * tensor of the same name, in the file of the same path, of the base
 * version, when the two tensors have the same dtype and byte length and that
 * shard has the same length (the chunker cuts both tensors alike).  A shard
 * outside every tensor (a safetensors header, a file that is not
 * safetensors) is matched to the shard at the same offset with the same
 * length in the file of the same path.  Anything else has no base.
 *
 * Both the replicator (which base a puller names in its GET) and `hwfs diff
 * --elements` (what a delta would move) use this one rule.
 */
#ifndef HWFS_DELTA_BASE_H
#define HWFS_DELTA_BASE_H

#include "hwfs_common.h"

struct delta_bases;

/**
 * delta_bases_new() - an index of version @base for delta_base_of() (its
 * files by path, their tensors by name).  @base must outlive the index.
 * Returns 0 or -ENOMEM.
 */
int delta_bases_new(const struct hwfs_vrec *base, struct delta_bases **out);

/** Free @b (not the version it indexes). NULL is a no-op. */
void delta_bases_free(struct delta_bases *b);

/**
 * delta_base_of() - the extent of the base version that extent @e of file
 * @f (of the new version) is a delta against, or NULL.  *@width gets the
 * element width to shuffle by (delta_width() of the tensor's dtype; 1
 * outside tensors); *@tensor, when @tensor is not NULL, the tensor of @f
 * that @e lies in (NULL outside tensors).  Both are set even when NULL is
 * returned.
 */
const struct hwfs_extent *delta_base_of(const struct delta_bases *b, const struct hwfs_frec *f,
					const struct hwfs_extent *e, unsigned *width,
					const struct hwfs_trec **tensor);

/**
 * delta_base_bytes() - how many shard bytes of version @v have a base in
 * version @b by the rule above (0 for versions of another model, or without
 * memory): the score by which a base version is picked, the same for the
 * coordinator's planner and a publisher's encode-ahead.  When @each is not
 * NULL it is called for every such shard @e with its base @be and width.
 */
uint64_t delta_base_bytes(const struct hwfs_vrec *v, const struct hwfs_vrec *b,
			  void (*each)(void *arg, const struct hwfs_extent *be,
				       const struct hwfs_extent *e, unsigned width),
			  void *arg);

/**
 * delta_tensor_at() - the tensor of @f whose bytes hold all of [@off,
 * @off+@len), or NULL (a header, bytes between or after tensors, a file
 * without tensors).  Zero-length tensors hold nothing, even at @off.
 */
const struct hwfs_trec *delta_tensor_at(const struct hwfs_frec *f, uint64_t off, uint64_t len);

#endif /* HWFS_DELTA_BASE_H */
