/*
 * delta_base.c — the base-matching rule of delta_base.h: binary searches
 * over a version's files (sorted by path), each file's extents (sorted by
 * offset) and tensors (sorted by offset, and here by name).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "delta.h"
#include "delta_base.h"

struct delta_bases {
	const struct hwfs_vrec *v;
	const struct hwfs_trec ***by_name; /* per file: its tensors sorted by name */
};

static int cmp_trec_name(const void *x, const void *y)
{
	const struct hwfs_trec *a = *(const struct hwfs_trec *const *)x;
	const struct hwfs_trec *b = *(const struct hwfs_trec *const *)y;

	return strcmp(a->name, b->name);
}

int delta_bases_new(const struct hwfs_vrec *base, struct delta_bases **out)
{
	struct delta_bases *b = calloc(1, sizeof(*b));

	if (!b)
		return -ENOMEM;
	b->v = base;
	b->by_name = calloc(base->n_files ? base->n_files : 1, sizeof(*b->by_name));
	if (!b->by_name)
		goto oom;
	for (size_t i = 0; i < base->n_files; i++) {
		const struct hwfs_frec *f = &base->files[i];

		if (!f->n_tensors)
			continue;
		b->by_name[i] = malloc(f->n_tensors * sizeof(*b->by_name[i]));
		if (!b->by_name[i])
			goto oom;
		for (size_t k = 0; k < f->n_tensors; k++)
			b->by_name[i][k] = &f->tensors[k];
		qsort(b->by_name[i], f->n_tensors, sizeof(*b->by_name[i]), cmp_trec_name);
	}
	*out = b;
	return 0;
oom:
	delta_bases_free(b);
	return -ENOMEM;
}

void delta_bases_free(struct delta_bases *b)
{
	if (!b)
		return;
	for (size_t i = 0; b->by_name && i < b->v->n_files; i++)
		free(b->by_name[i]);
	free(b->by_name);
	free(b);
}

/* Index of the base file with path @path, or -1. */
static ssize_t file_index(const struct hwfs_vrec *v, const char *path)
{
	size_t lo = 0, hi = v->n_files;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(v->files[mid].path, path);

		if (c == 0)
			return (ssize_t)mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

/* The extent of @f starting at @off with length @len, or NULL. */
static const struct hwfs_extent *extent_at(const struct hwfs_frec *f, uint64_t off, uint64_t len)
{
	size_t lo = 0, hi = f->n_ext;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (f->ext[mid].off == off)
			return f->ext[mid].len == len ? &f->ext[mid] : NULL;
		if (f->ext[mid].off < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const struct hwfs_trec *delta_tensor_at(const struct hwfs_frec *f, uint64_t off, uint64_t len)
{
	const struct hwfs_trec *t;
	size_t lo = 0, hi = f->n_tensors;

	while (lo < hi) { /* tensors [0, lo) start at or before @off */
		size_t mid = lo + (hi - lo) / 2;

		if (f->tensors[mid].off <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	while (lo > 0 && !f->tensors[lo - 1].len) /* an empty tensor may share the offset */
		lo--;
	if (lo == 0)
		return NULL;
	t = &f->tensors[lo - 1];
	return off + len <= t->off + t->len ? t : NULL;
}

/* The tensor called @name among the base file @i's, or NULL. */
static const struct hwfs_trec *tensor_named(const struct delta_bases *b, size_t i, const char *name)
{
	const struct hwfs_trec key = {.name = (char *)name}, *kp = &key, **hit;

	if (!b->by_name[i])
		return NULL;
	hit = bsearch(&kp, b->by_name[i], b->v->files[i].n_tensors, sizeof(*b->by_name[i]),
		      cmp_trec_name);
	return hit ? *hit : NULL;
}

const struct hwfs_extent *delta_base_of(const struct delta_bases *b, const struct hwfs_frec *f,
					const struct hwfs_extent *e, unsigned *width,
					const struct hwfs_trec **tensor)
{
	const struct hwfs_trec *t = delta_tensor_at(f, e->off, e->len), *bt;
	ssize_t i = f->kind == HWFS_K_REG ? file_index(b->v, f->path) : -1;
	const struct hwfs_frec *bf;

	*width = t ? delta_width(t->dtype) : 1;
	if (tensor)
		*tensor = t;
	if (i < 0 || b->v->files[i].kind != HWFS_K_REG)
		return NULL;
	bf = &b->v->files[i];
	if (!t)
		return extent_at(bf, e->off, e->len);
	bt = tensor_named(b, (size_t)i, t->name);
	if (!bt || strcmp(bt->dtype, t->dtype) || bt->len != t->len)
		return NULL;
	return extent_at(bf, bt->off + (e->off - t->off), e->len);
}

uint64_t delta_base_bytes(const struct hwfs_vrec *v, const struct hwfs_vrec *b,
			  void (*each)(void *arg, const struct hwfs_extent *be,
				       const struct hwfs_extent *e, unsigned width),
			  void *arg)
{
	struct delta_bases *idx = NULL;
	uint64_t bytes = 0;

	if (!v || !b || delta_bases_new(b, &idx) < 0)
		return 0;
	for (size_t i = 0; i < v->n_files; i++)
		for (size_t k = 0; k < v->files[i].n_ext; k++) {
			const struct hwfs_extent *e = &v->files[i].ext[k], *be;
			unsigned width;

			be = delta_base_of(idx, &v->files[i], e, &width, NULL);
			if (!be)
				continue;
			bytes += e->len;
			if (each)
				each(arg, be, e, width);
		}
	delta_bases_free(idx);
	return bytes;
}
