/*
 * dlpack_v1.h — DLPack for libhwfs: the installed <dlpack/dlpack.h>, plus the
 * parts of DLPack 1.0 an older header lacks.
 *
 * Debian's libdlpack-dev is DLPack 0.6 (DLPACK_VERSION 60): it has
 * DLManagedTensor but neither the versioned form (DLPackVersion,
 * DLManagedTensorVersioned, the flags word with DLPACK_FLAG_BITMASK_READ_ONLY)
 * nor kDLBool (added in 0.8).  They are defined here exactly as DLPack 1.0's
 * dlpack.h defines them (same members, order and types: the layout is the ABI
 * consumers read), and only when the installed header lacks them, so a newer
 * header is used as it is.
 */
#ifndef HWFS_DLPACK_V1_H
#define HWFS_DLPACK_V1_H

#include <dlpack/dlpack.h>

/* DLPack 1.0 defines DLPACK_MAJOR_VERSION (and drops DLPACK_VERSION); older ones do not. */
#ifndef DLPACK_MAJOR_VERSION

/* The DLPack ABI version of a DLManagedTensorVersioned (1.0 here). */
typedef struct {
	uint32_t major;
	uint32_t minor;
} DLPackVersion;

/* Bits of DLManagedTensorVersioned.flags. */
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL) /* the consumer must not write */
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL) /* the producer made a copy */

/* DLPack 1.0's managed tensor: the version first, then as DLManagedTensor plus flags. */
typedef struct DLManagedTensorVersioned {
	DLPackVersion version;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensorVersioned *self);
	uint64_t flags;
	DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* kDLBool is a DLDataTypeCode enumerator from DLPack 0.8 on. */
#if !defined(DLPACK_VERSION) || DLPACK_VERSION < 80
#define kDLBool 6U
#endif

#endif /* !DLPACK_MAJOR_VERSION */

/* The version hwfs_map_dlpack_versioned() writes into its tensors. */
#define HWFS_DLPACK_MAJOR 1
#define HWFS_DLPACK_MINOR 0

#endif /* HWFS_DLPACK_V1_H */
