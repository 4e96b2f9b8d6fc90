/*
 * ns_io.c — file data: writes (from a buffer, or straight from a file
 * descriptor into the arena), truncation and reads of regular files and
 * tensors.
 *
 * Writes and truncation go through the file's writer (ingest.h), created or
 * resumed on first use, under the file's own mutex (node->mu); a failure is
 * remembered in node->write_error so that ns_seal() can refuse the version.
 * Reads of sealed data take no lock at all: their extents never change, and
 * the reply points into the arena (adjacent extents merged into one iovec).
 * Files being written are read through a bounce buffer under node->mu.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ns_i.h"

/* ----------------------------------------------------------------- writes */

/* Make sure a file of an open version has a writer (n->mu held). */
static int ensure_writer(struct ns *ns, struct node *n)
{
	struct writer *w = NULL;
	int r;

	if (n->w)
		return 0;
	if (n->data.size == 0 && n->data.n_ext == 0) {
		ingest_result_clear(ns->st, &n->data);
		r = writer_create(ns->st, &w);
	} else {
		r = writer_resume(ns->st, &n->data, &w);
	}
	if (r == 0)
		node_set_writer(n, w);
	return r;
}

static int write_common(struct ns *ns, struct node *n, uint64_t off, const void *buf, int fd,
			size_t len)
{
	int r;

	if (n->type != NT_REG)
		return -EBADF;
	pthread_mutex_lock(&n->mu);
	r = ns_writable(n) ? ensure_writer(ns, n) : -EROFS;
	if (r == 0 && buf) {
		r = writer_write(n->w, off, buf, len);
	} else if (r == 0) {
		uint8_t *p;
		size_t done = 0;

		r = writer_reserve(n->w, off, len, &p);
		while (r == 0 && done < len) {
			ssize_t got = pread(fd, p + done, len - done, (off_t)(off + done));

			if (got < 0 && errno == EINTR)
				continue;
			if (got <= 0) {
				r = got < 0 ? -errno : -EIO; /* file shrank under us */
				break;
			}
			done += (size_t)got;
		}
		if (done)
			r = writer_commit(n->w, off, done) ?: r;
	}
	if (r == 0)
		ns_touch(n, (int64_t)hwfs_now_ns());
	else if (r != -EROFS) /* the writer was told its bytes are not there */
		n->write_error = -r;
	pthread_mutex_unlock(&n->mu);
	return r;
}

int ns_write(struct ns *ns, struct node *n, uint64_t off, const void *buf, size_t len)
{
	return write_common(ns, n, off, buf, -1, len);
}

int ns_write_from_fd(struct ns *ns, struct node *n, uint64_t off, int fd, size_t len)
{
	return write_common(ns, n, off, NULL, fd, len);
}

int ns_truncate(struct ns *ns, struct node *n, uint64_t size)
{
	int r;

	if (n->type != NT_REG)
		return ns_is_dir_type(n->type) ? -EISDIR : -EINVAL;
	pthread_mutex_lock(&n->mu);
	r = ns_writable(n) ? ensure_writer(ns, n) : -EROFS;
	if (r == 0)
		r = writer_truncate(n->w, size);
	if (r == 0)
		ns_touch(n, (int64_t)hwfs_now_ns());
	if (r == 0 && size == 0) /* a full rewrite starts here */
		n->write_error = 0;
	else if (r < 0 && r != -EROFS)
		n->write_error = -r;
	pthread_mutex_unlock(&n->mu);
	return r;
}

/* ------------------------------------------------------------------ reads */

/*
 * Copy [off, off+len) of a finished file (already clamped to its size) into
 * one bounce buffer and emit it as a single iovec.  Used when the span covers
 * more separate arena runs than one reply may carry.  Returns what @emit
 * returns, or -ENOMEM (then @emit is not called).
 */
static int read_bounce(struct ns *ns, const struct ingest_result *d, uint64_t off, size_t len,
		       int (*emit)(void *, const struct iovec *, int), void *arg)
{
	uint8_t *buf = malloc(len ? len : 1);
	struct iovec iov = {buf, 0};
	size_t i;
	int r;

	if (!buf)
		return -ENOMEM;
	for (i = ingest_fext_find(d->ext, d->n_ext, off); iov.iov_len < len && i < d->n_ext; i++) {
		const struct fext *e = &d->ext[i];
		size_t n = (size_t)HWFS_MIN((uint64_t)(len - iov.iov_len), e->off + e->len - off);

		memcpy(buf + iov.iov_len, store_shard_data(ns->st, e->sh) + (off - e->off), n);
		iov.iov_len += n;
		off += n;
	}
	r = emit(arg, &iov, 1);
	free(buf);
	return r;
}

/*
 * iovec over the extents of a finished file: [off, off+len) clamped to size.
 * Extents that follow each other in the arena share one iovec (a sequentially
 * written file is one run).  Up to 32 runs need no allocation; @emit never
 * gets more than NS_READ_IOV_MAX iovecs: a span over more runs is copied into
 * a bounce buffer instead (read_bounce).  Returns what @emit returns, or
 * -ENOMEM without calling it.
 */
static int read_extents(struct ns *ns, const struct ingest_result *d, uint64_t off, size_t len,
			int (*emit)(void *, const struct iovec *, int), void *arg)
{
	struct iovec iov_small[32], *iov = iov_small;
	int cnt = 0, cap = (int)HWFS_ARRAY_SIZE(iov_small), r;
	uint64_t off0 = off;
	size_t i, len0;

	if (off >= d->size)
		return emit(arg, NULL, 0);
	len0 = len = (size_t)HWFS_MIN((uint64_t)len, d->size - off);
	i = ingest_fext_find(d->ext, d->n_ext, off);
	while (len && i < d->n_ext) {
		const struct fext *e = &d->ext[i++];
		size_t n = (size_t)HWFS_MIN((uint64_t)len, e->off + e->len - off);
		uint8_t *p = (uint8_t *)store_shard_data(ns->st, e->sh) + (off - e->off);

		if (cnt && (uint8_t *)iov[cnt - 1].iov_base + iov[cnt - 1].iov_len == p) {
			iov[cnt - 1].iov_len += n;
		} else {
			if (cnt == cap) {
				int ncap = HWFS_MIN(cap * 4, NS_READ_IOV_MAX);
				struct iovec *ni;

				if (cnt == NS_READ_IOV_MAX) { /* more runs than a reply takes */
					r = read_bounce(ns, d, off0, len0, emit, arg);
					goto out;
				}
				ni = malloc(sizeof(*ni) * (size_t)ncap);
				if (!ni) {
					r = -ENOMEM;
					goto out;
				}
				memcpy(ni, iov, sizeof(*ni) * (size_t)cnt);
				if (iov != iov_small)
					free(iov);
				iov = ni;
				cap = ncap;
			}
			iov[cnt].iov_base = p;
			iov[cnt++].iov_len = n;
		}
		off += n;
		len -= n;
	}
	r = emit(arg, iov, cnt);
out:
	if (iov != iov_small)
		free(iov);
	return r;
}

int ns_read(struct ns *ns, struct node *n, uint64_t off, size_t len,
	    int (*emit)(void *, const struct iovec *, int), void *arg)
{
	int r;

	if (n->type == NT_TENSOR) {
		const struct hwfs_trec *t = n->tensor;

		if (!t || !n->tfile)
			return -ESTALE;
		if (off >= t->len)
			return emit(arg, NULL, 0);
		len = (size_t)HWFS_MIN((uint64_t)len, t->len - off);
		return read_extents(ns, &n->tfile->data, t->off + off, len, emit, arg);
	}
	if (n->type == NT_TPFILE)
		return tp_read(ns, n, off, len, emit, arg);
	if (n->type != NT_REG)
		return -EISDIR;
	/* Sealed data never changes: no lock on the hot path. */
	if (n->ver && __atomic_load_n(&n->ver->state, __ATOMIC_ACQUIRE) != HWFS_V_OPEN &&
	    !node_writer(n))
		return read_extents(ns, &n->data, off, len, emit, arg);
	pthread_mutex_lock(&n->mu);
	if (n->w) {
		uint8_t *buf = malloc(len ? len : 1);
		struct iovec iov;

		if (!buf) {
			r = -ENOMEM;
		} else {
			iov.iov_base = buf;
			iov.iov_len = writer_read(n->w, off, len, buf);
			r = emit(arg, &iov, 1);
			free(buf);
		}
	} else {
		r = read_extents(ns, &n->data, off, len, emit, arg);
	}
	pthread_mutex_unlock(&n->mu);
	return r;
}
