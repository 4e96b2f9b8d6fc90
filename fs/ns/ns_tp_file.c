/*
 * ns_tp_file.c — the files of the tp/ view once built (ns_tp.c builds them):
 * their size, their reads and their end.  A view file is a safetensors header
 * kept in memory followed by segments, each a run of bytes of one tensor of a
 * source file; a read gathers iovecs over the header and the source files'
 * extents in the arena (zero-copy), or one bounce copy when a reply would take
 * more iovecs than the kernel allows.  The bottom of the namespace's files:
 * it calls none of them (ns.c calls it to size and free a view file).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "ns_i.h"

void tp_file_free(struct tp_file *f)
{
	if (!f)
		return;
	if (f->head && --f->head->refs == 0) {
		free(f->head->buf);
		free(f->head);
	}
	free(f->seg);
	free(f->pins);
	free(f);
}

struct iovs {
	struct iovec *v;
	int n, cap;
};

static int iov_add(struct iovs *io, const void *p, size_t len)
{
	if (!len)
		return 0;
	if (io->n && (const uint8_t *)io->v[io->n - 1].iov_base + io->v[io->n - 1].iov_len == p) {
		io->v[io->n - 1].iov_len += len;
		return 0;
	}
	if (io->n == io->cap) {
		int nc = io->cap ? io->cap * 2 : 32;
		struct iovec *nv = realloc(io->v, (size_t)nc * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		io->v = nv;
		io->cap = nc;
	}
	io->v[io->n].iov_base = (void *)p;
	io->v[io->n++].iov_len = len;
	return 0;
}

/* iovecs over source bytes [off, off+len) of finished file @src. */
static int iov_src(struct ns *ns, struct iovs *io, const struct node *src, uint64_t off,
		   uint64_t len)
{
	const struct ingest_result *d = &src->data;

	for (size_t i = ingest_fext_find(d->ext, d->n_ext, off); len && i < d->n_ext; i++) {
		const struct fext *e = &d->ext[i];
		uint64_t k = HWFS_MIN(len, e->off + e->len - off);

		if (iov_add(io, store_shard_data(ns->st, e->sh) + (off - e->off), (size_t)k) < 0)
			return -ENOMEM;
		off += k;
		len -= k;
	}
	return len ? -EIO : 0;
}

uint64_t tp_size(const struct node *n)
{
	return n->tp ? n->tp->size : 0;
}

int tp_read(struct ns *ns, struct node *n, uint64_t off, size_t len,
	    int (*emit)(void *, const struct iovec *, int), void *arg)
{
	const struct tp_file *f = n->tp;
	struct iovs io = {0};
	uint64_t end;
	size_t lo, hi;
	int r = 0;

	if (!f)
		return -ESTALE;
	if (off >= f->size)
		return emit(arg, NULL, 0);
	end = off + HWFS_MIN((uint64_t)len, f->size - off);
	if (off < f->head_len)
		r = iov_add(&io, f->head->buf + off, (size_t)(HWFS_MIN(end, f->head_len) - off));
	/* the first segment ending after off */
	for (lo = 0, hi = f->nseg; lo < hi;) {
		size_t mid = lo + (hi - lo) / 2;

		if (f->seg[mid].off + f->seg[mid].len <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; r == 0 && i < f->nseg && f->seg[i].off < end; i++) {
		const struct tp_seg *s = &f->seg[i];
		uint64_t a = HWFS_MAX(off, s->off) - s->off, b = HWFS_MIN(end, s->off + s->len) - s->off;

		while (r == 0 && a < b) { /* run by run (one run when contiguous) */
			uint64_t k = a / s->run, in = a % s->run, m = HWFS_MIN(b - a, s->run - in);

			r = iov_src(ns, &io, s->src, s->src_off + k * s->stride + in, m);
			a += m;
		}
	}
	if (r == 0 && io.n > NS_READ_IOV_MAX) { /* more runs than a reply takes: one copy */
		size_t total = 0;
		uint8_t *buf;

		for (int i = 0; i < io.n; i++)
			total += io.v[i].iov_len;
		buf = malloc(total ? total : 1);
		if (!buf) {
			r = -ENOMEM;
		} else {
			struct iovec one = {buf, 0};

			for (int i = 0; i < io.n; i++) {
				memcpy(buf + one.iov_len, io.v[i].iov_base, io.v[i].iov_len);
				one.iov_len += io.v[i].iov_len;
			}
			r = emit(arg, &one, 1);
			free(buf);
			free(io.v);
			return r;
		}
	}
	if (r == 0)
		r = emit(arg, io.v, io.n);
	free(io.v);
	return r;
}

size_t tp_pins(const struct tp_file *f, struct node ***pins)
{
	*pins = f->pins;
	return f->npins;
}
