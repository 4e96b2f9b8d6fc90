/*
 * chunker.h — where shards begin and end.
 *
 * Safetensors files are cut at tensor boundaries: the header [0, data_start)
 * is one shard, every tensor is one shard, and a tensor larger than
 * max_shard is cut into max_shard pieces counted from the tensor's start (the
 * last piece shorter).  Zero-length tensors produce no cut.  Any other file
 * is cut every fixed_chunk bytes.  Identical tensors in two versions therefore
 * give identical shards, which is what makes a new version cost only its
 * changed bytes.
 *
 * The chunker is a pure function of (header, position): ingest calls it as
 * bytes arrive, so cutting can start while the writer is still writing.
 */
#ifndef HWFS_CHUNKER_H
#define HWFS_CHUNKER_H

#include "hwfs_common.h"
#include "safetensors.h"

/**
 * chunker_next_cut() - the first shard boundary strictly after @pos.
 * @h: the parsed header, or NULL for a plain file.
 * @pos: a file offset (normally the start of the shard being formed).
 * @max_shard: largest shard for pieces of a big tensor (> 0).
 * @fixed_chunk: chunk size for plain files and for any bytes after the last
 *               tensor (> 0).
 * Returns the boundary; the caller clamps it to the file size.
 */
uint64_t chunker_next_cut(const struct st_header *h, uint64_t pos, uint64_t max_shard,
			uint64_t fixed_chunk);

#endif /* HWFS_CHUNKER_H */
