/*
 * manifest.h — the canonical JSON description of a version.
 *
 * The manifest lists every file (path, kind, mode, mtime, size, symlink
 * target), the extents of each regular file as [offset, length, shard-hash],
 * the tensors of each safetensors file (name, dtype, shape, offset, length,
 * hash), the reason a *.safetensors file was not parsed, and the distinct
 * shards [hash, size] sorted by hash.  Encoding is jansson compact output with
 * sorted keys and files sorted by path, so equal versions give equal bytes;
 * the XXH3-128 of those bytes is the version digest.  Node-local facts (seq,
 * timestamps of sealing, uid/gid, arena offsets) are not part of it.
 *
 * manifest_parse() is the decoder for manifests that arrive from elsewhere
 * (replication): it validates everything and never trusts sizes.
 */
#ifndef HWFS_MANIFEST_H
#define HWFS_MANIFEST_H

#include "hwfs_common.h"

#define MANIFEST_FORMAT "hwfs-manifest/1"

/** Canonical JSON of @v into a malloc'd NUL-terminated *@json of *@len bytes. */
int manifest_build(const struct hwfs_vrec *v, char **json, size_t *len);

/** XXH3-128 of manifest_build(@v). Returns 0 or -ENOMEM. */
int manifest_digest(const struct hwfs_vrec *v, hwfs_hash_t *out);

/**
 * manifest_parse() - decode and validate a manifest.
 * Rejects: invalid JSON, wrong format tag, missing/ill-typed fields, unsafe
 * paths (absolute, "..", empty components), extents that do not tile
 * [0, size) exactly, tensors outside their file or overlapping (non-empty
 * ones; safetensors refuses them too), more than 1<<20 files or
 * extents in total. On success *@out is a new record with state SEALED and
 * digest set to the hash of @json. Returns 0, -EINVAL (@err says why), -ENOMEM.
 */
int manifest_parse(const char *json, size_t len, struct hwfs_vrec **out, char *err,
		   size_t errlen);

/** Sum of the sizes of the distinct shards of @v. */
uint64_t manifest_shard_bytes(const struct hwfs_vrec *v);

#endif /* HWFS_MANIFEST_H */
