/*
 * libhwfs_dlpack.c — a mapped tensor as a DLPack tensor (hwfs_map_dlpack,
 * hwfs_map_dlpack_versioned), the one exchange format numpy, torch, cupy and
 * jax take without a copy.
 *
 * Each DLPack tensor is one malloc(): the managed tensor first (so the block
 * is what the deleter gets), then its shape as int64_t.  manager_ctx is the
 * map, on which the tensor holds a reference (lib_map_hold): the deleter
 * frees the block and drops the reference, so the mapping, its lease and a
 * device map's IPC buckets last until the caller has unmapped AND every
 * consumer has released its tensor, whatever the order.  Data is never
 * copied: a host tensor is kDLCPU over the arena mapping (read-only pages), a
 * device tensor kDLCUDA over the bucket opened with CUDA IPC.  strides are
 * NULL (C-contiguous), byte_offset 0.
 *
 * The versioned form (DLPack 1.0) carries DLPACK_FLAG_BITMASK_READ_ONLY;
 * the 0.6 form has no flags word, so a consumer of it cannot know (numpy then
 * makes a writable array over read-only pages: a write faults).  Which form a
 * consumer gets is the producer's choice (the Python package picks by the
 * consumer's max_version: docs/gpu.md, "DLPack").
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "libhwfs_i.h"
#include "dlpack_v1.h"

/* One DLPack data type per safetensors dtype. */
static const struct {
	const char *name;
	uint8_t code, bits;
} dtypes[] = {
	{"F64", kDLFloat, 64},	{"F32", kDLFloat, 32},	{"F16", kDLFloat, 16},
	{"BF16", kDLBfloat, 16},	{"I64", kDLInt, 64},	{"I32", kDLInt, 32},
	{"I16", kDLInt, 16},	{"I8", kDLInt, 8},	{"U64", kDLUInt, 64},
	{"U32", kDLUInt, 32},	{"U16", kDLUInt, 16},	{"U8", kDLUInt, 8},
	{"BOOL", kDLBool, 8},
};

/* A 0.6 tensor: the managed tensor, then the shape. */
struct dl_block {
	DLManagedTensor mt;
	int64_t shape[];
};

/* A 1.0 tensor: the versioned managed tensor, then the shape. */
struct dl_block_v1 {
	DLManagedTensorVersioned mt;
	int64_t shape[];
};

static void deleter(DLManagedTensor *self)
{
	struct hwfs_map *m = self->manager_ctx;

	free(self);
	lib_map_put(m);
}

static void deleter_v1(DLManagedTensorVersioned *self)
{
	struct hwfs_map *m = self->manager_ctx;

	free(self);
	lib_map_put(m);
}

/*
 * Fill @dl (its shape array @shape has t->ndim entries) from tensor @i of
 * @m, checking that its dtype has a DLPack type and that its shape holds
 * exactly its bytes (a shape that claims more would let the consumer read
 * past them).  Returns 0, -ERANGE, -ENOTSUP, -EPROTO, with the sentence.
 */
static int fill(struct hwfs_map *m, const struct hwfs_tensor *t, DLTensor *dl, int64_t *shape)
{
	uint64_t count = 1, itemsize;
	size_t k;

	for (k = 0; k < HWFS_ARRAY_SIZE(dtypes); k++)
		if (!strcmp(t->dtype, dtypes[k].name))
			break;
	if (k == HWFS_ARRAY_SIZE(dtypes)) {
		if (!strncmp(t->dtype, "F8_", 3))
			return lib_fail(-ENOTSUP, "tensor %s is %s: DLPack has no 8-bit float type "
					"(read its bytes with hwfs_map_tensor)", t->name, t->dtype);
		return lib_fail(-ENOTSUP, "tensor %s is %s: a dtype DLPack cannot express",
				t->name, t->dtype);
	}
	itemsize = dtypes[k].bits / 8;
	for (uint32_t d = 0; d < t->ndim; d++) {
		if (t->shape[d] > INT64_MAX ||
		    (t->shape[d] && count > UINT64_MAX / t->shape[d]))
			goto bad;
		count *= t->shape[d];
		shape[d] = (int64_t)t->shape[d];
	}
	if (count > UINT64_MAX / itemsize || count * itemsize != t->len || t->ndim > INT32_MAX)
		goto bad;
	dl->data = (void *)t->data;
	dl->device.device_type = m->device >= 0 ? kDLCUDA : kDLCPU;
	dl->device.device_id = m->device >= 0 ? m->device : 0;
	dl->ndim = (int)t->ndim;
	dl->dtype.code = dtypes[k].code;
	dl->dtype.bits = dtypes[k].bits;
	dl->dtype.lanes = 1;
	dl->shape = shape;
	dl->strides = NULL;
	dl->byte_offset = 0;
	return 0;
bad:
	return lib_fail(-EPROTO, "tensor %s: its %llu bytes do not hold %s of its shape", t->name,
			(unsigned long long)t->len, t->dtype);
}

/* Tensor @i of @m, or NULL with -ERANGE's sentence set. */
static const struct hwfs_tensor *tensor_at(struct hwfs_map *m, size_t i)
{
	if (i < m->n)
		return &m->t[i];
	lib_fail(-ERANGE, "no tensor %zu: version %s has %zu", i, m->version, m->n);
	return NULL;
}

/*
 * What both exports share: one zeroed block of @head bytes (the managed
 * tensor, whose DLTensor is at @dl_off) followed by the shape of tensor @i of
 * @m, the DLTensor filled, and a reference on @m taken for the deleter.  The
 * caller fills in the rest of its managed tensor.  Returns 0 with the block
 * in *@out, or -ERANGE, -ENOMEM, -ENOTSUP, -EPROTO, with the sentence.
 */
static int export_block(struct hwfs_map *m, size_t i, size_t head, size_t dl_off, void **out)
{
	const struct hwfs_tensor *t;
	char *b;
	int r;

	lib_clear_error();
	t = tensor_at(m, i);
	if (!t)
		return -ERANGE;
	b = calloc(1, head + (t->ndim + 1) * sizeof(int64_t));
	if (!b)
		return lib_fail(-ENOMEM, "out of memory");
	r = fill(m, t, (DLTensor *)(b + dl_off), (int64_t *)(b + head));
	if (r < 0) {
		free(b);
		return r;
	}
	lib_map_hold(m);
	*out = b;
	return 0;
}

int hwfs_map_dlpack(struct hwfs_map *m, size_t i, struct DLManagedTensor **out)
{
	void *p = NULL;
	int r = export_block(m, i, offsetof(struct dl_block, shape),
			     offsetof(struct dl_block, mt.dl_tensor), &p);
	struct dl_block *b = p;

	if (r < 0)
		return r;
	b->mt.manager_ctx = m;
	b->mt.deleter = deleter;
	*out = &b->mt;
	return 0;
}

int hwfs_map_dlpack_versioned(struct hwfs_map *m, size_t i,
			      struct DLManagedTensorVersioned **out)
{
	void *p = NULL;
	int r = export_block(m, i, offsetof(struct dl_block_v1, shape),
			     offsetof(struct dl_block_v1, mt.dl_tensor), &p);
	struct dl_block_v1 *b = p;

	if (r < 0)
		return r;
	b->mt.version.major = HWFS_DLPACK_MAJOR;
	b->mt.version.minor = HWFS_DLPACK_MINOR;
	b->mt.manager_ctx = m;
	b->mt.deleter = deleter_v1;
	b->mt.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
	*out = &b->mt;
	return 0;
}
