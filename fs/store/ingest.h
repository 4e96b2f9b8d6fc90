/*
 * ingest.h — turning a stream of writes into shards.
 *
 * One writer per regular file of an open version.  Bytes land in a staging
 * range of the arena that covers the file from the first byte not yet cut
 * (cut_pos) to its end.  As soon as the bytes up to the next boundary (see
 * chunker.h: tensor boundaries once the safetensors header has arrived,
 * fixed chunks otherwise) have been written, that piece is hashed and
 * interned: it becomes a shard in place, or is dropped as a duplicate.  So
 * a sequential writer's file is cut, hashed and deduplicated while it is still
 * being written, and staging never holds more than the piece in progress.
 *
 * A write before cut_pos (random access, rewrite, truncation) "thaws" the
 * file: everything is copied back into one staging range and cutting waits
 * for writer_finish().  Gaps left by writes past the end are zero-filled at
 * once, so staging never exposes stale bytes.
 *
 * A writer is not thread-safe; the namespace serialises calls per file.
 */
#ifndef HWFS_INGEST_H
#define HWFS_INGEST_H

#include <sys/uio.h>

#include "safetensors.h"
#include "store.h"

/** A file extent held in memory: [off, off+len) is shard @sh. */
struct fext {
	uint64_t off;
	uint64_t len;
	struct shard *sh;
};

struct writer;

/** The finished form of a file: what a sealed file node keeps. */
struct ingest_result {
	uint64_t size;
	size_t n_ext;
	struct fext *ext;            /* one reference held on each shard */
	struct st_header *hdr;       /* header when the bytes are valid safetensors */
	struct hwfs_trec *tensors; /* hdr->n tensors with hashes, or NULL */
	size_t n_tensors;
	char *st_error;              /* why the bytes are not valid safetensors */
};

/** New empty writer. Returns 0 or -ENOMEM. */
int writer_create(struct store *s, struct writer **out);

/**
 * writer_resume() - a writer over a finished file (reopened for writing).
 * Takes ownership of @res's contents (and clears @res). Returns 0 or -ENOMEM.
 */
int writer_resume(struct store *s, struct ingest_result *res, struct writer **out);

/** Write @len bytes at @off. Returns 0, -ENOSPC (arena full), -ENOMEM, -EFBIG. */
int writer_write(struct writer *w, uint64_t off, const void *buf, size_t len);

/**
 * writer_reserve() / writer_commit() - zero-copy writes: reserve returns a
 * pointer where the @len bytes at @off go (valid until the next call on @w);
 * commit declares that @len bytes at @off have been written there.
 */
int writer_reserve(struct writer *w, uint64_t off, size_t len, uint8_t **ptr);
int writer_commit(struct writer *w, uint64_t off, size_t len);

/** Set the size (shrink or zero-extend). Returns 0 or -errno. */
int writer_truncate(struct writer *w, uint64_t size);

/** Current logical size. */
uint64_t writer_size(const struct writer *w);

/**
 * writer_read() - copy up to @len bytes at @off into @buf. Returns the count
 * (short at end of file).
 */
size_t writer_read(struct writer *w, uint64_t off, size_t len, uint8_t *buf);

/**
 * writer_finish() - cut what is left, validate the safetensors header
 * against the final size, hash tensors, free staging, destroy @w.
 * On error (-ENOMEM) @w is destroyed too and nothing is returned.
 */
int writer_finish(struct writer *w, struct ingest_result *res);

/** Drop everything @w holds (shards unreferenced, staging freed). */
void writer_abort(struct writer *w);

/** Release everything in @res (shard references included). */
void ingest_result_clear(struct store *s, struct ingest_result *res);

/**
 * ingest_tensor_hashes() - tensors of @hdr with their XXH3-128: the shard hash
 * when a tensor is exactly one extent, else hashed over its extents.
 * Returns a calloc'd array of hdr->n entries, or NULL on -ENOMEM.
 */
struct hwfs_trec *ingest_tensor_hashes(struct store *s, const struct st_header *hdr,
					 const struct fext *ext, size_t n_ext);

/** Index of the extent holding @off (binary search), or n_ext if none. */
size_t ingest_fext_find(const struct fext *ext, size_t n_ext, uint64_t off);

#endif /* HWFS_INGEST_H */
