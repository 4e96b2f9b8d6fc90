/*
 * ingest.c — the writer: staging, streaming cuts, dedup (see ingest.h).
 *
 * State of a writer:
 *
 *     0            cut_pos                    size
 *     |  ext[] ... |  staging [stg_off, +stg_len) holds [cut_pos, size)
 *
 * `wmax` is the end of the furthest write() seen; streaming cuts never pass it,
 * so a file that was first extended with ftruncate() and then written front to
 * back is still cut as it is written.  `random` is set by a thaw and stops
 * streaming cuts until writer_finish().
 *
 * [hz, he) is the hole: bytes of the file that read as zeros (a gap left by
 * a write past the end, a file extended by ftruncate) but whose staging
 * bytes have not been zeroed yet.  Zeroing is lazy because the common writer
 * that makes a hole fills it right away (ftruncate to the final size, then
 * writes front to back): a write that covers the front of the hole just moves
 * hz, and only bytes still in the hole when something reads staging (a cut,
 * a reader, the header sniff) are zeroed (fill_hole).  At most one hole: a
 * second one that does not continue the first zeroes the first at once.
 * The hole lies in staging (cut_pos <= hz <= he <= size) or is empty (hz == he).
 *
 * Staging grows in place (store_stage_extend) when the range after it is
 * free — the common case, since a sequential writer sits at the arena's
 * high-water mark — and otherwise moves, copying only the bytes of the piece
 * in progress.  Staging ranges come from the store's staging calls; ingest
 * never calls the arena's allocator.  A write's bytes and the zero-fill go
 * into staging with arena_write()/arena_zero() (pwrite on the arena file: the
 * fresh fallocate()d pages are never faulted in and zeroed only to be
 * overwritten); hashing, readers and the moves within staging use the
 * mapping (arena_base), which shows the same pages.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "chunker.h"
#include "ingest.h"
#include "tunables.h"

enum st_state { ST_UNKNOWN, ST_YES, ST_NO };

/* Staged bytes of the next piece slid to the front after a duplicate (see cut_one). */
#define STG_REUSE_MAX (4u << 20)

struct writer {
	struct store *st;
	struct arena *ar; /* arena_write()/arena_zero() into staging, arena_base() to read it */
	struct fext *ext;
	size_t n_ext, cap_ext;
	uint64_t cut_pos;
	uint64_t stg_off, stg_len; /* stg_len 0: no staging */
	uint64_t size;
	uint64_t wmax;
	uint64_t prefix;   /* [0, prefix) written by writes, not by zero-fill */
	uint64_t hz, he;   /* the hole: [hz, he) reads as zeros, staging not zeroed yet */
	int random;
	int thaw_on_change; /* resumed without a valid header: re-examine it all */
	enum st_state st_state;
	struct st_header *hdr;
	char *st_error;
};

size_t ingest_fext_find(const struct fext *ext, size_t n_ext, uint64_t off)
{
	size_t lo = 0, hi = n_ext;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ext[mid].off + ext[mid].len <= off)
			lo = mid + 1;
		else if (ext[mid].off > off)
			hi = mid;
		else
			return mid;
	}
	return n_ext;
}

static uint8_t *stg_ptr(struct writer *w, uint64_t file_off)
{
	return arena_base(w->ar) + w->stg_off + (file_off - w->cut_pos);
}

/* The arena offset of file offset @file_off (>= cut_pos), in staging. */
static uint64_t stg_off_of(const struct writer *w, uint64_t file_off)
{
	return w->stg_off + (file_off - w->cut_pos);
}

/* Zero the hole's staging bytes below @upto (before they are read). */
static void fill_hole(struct writer *w, uint64_t upto)
{
	uint64_t end = HWFS_MIN(w->he, upto);

	if (w->hz >= end)
		return;
	arena_zero(w->ar, stg_off_of(w, w->hz), end - w->hz);
	w->hz = end;
	if (w->hz == w->he)
		w->hz = w->he = 0;
}

/* [a, b) (a = the size before, b > a) now reads as zeros: add it to the hole. */
static void add_hole(struct writer *w, uint64_t a, uint64_t b)
{
	if (w->hz < w->he && w->he != a)
		fill_hole(w, UINT64_MAX); /* not contiguous: the old hole is zeroed now */
	if (w->hz == w->he)
		w->hz = a;
	w->he = b;
}

/* [off, end) is about to be written: it leaves the hole (what is before it stays zero). */
static void hole_write(struct writer *w, uint64_t off, uint64_t end)
{
	if (w->hz >= w->he || off >= w->he || end <= w->hz)
		return;
	if (off > w->hz) {
		if (end < w->he) { /* in the middle: zero the front, keep the back */
			fill_hole(w, off);
		} else { /* covers the back: the front stays a hole */
			w->he = off;
			return;
		}
	}
	w->hz = HWFS_MIN(end, w->he);
	if (w->hz == w->he)
		w->hz = w->he = 0;
}

int writer_create(struct store *s, struct writer **out)
{
	struct writer *w = calloc(1, sizeof(*w));

	if (!w)
		return -ENOMEM;
	w->st = s;
	w->ar = store_arena(s);
	*out = w;
	return 0;
}

int writer_resume(struct store *s, struct ingest_result *res, struct writer **out)
{
	struct writer *w;
	int r = writer_create(s, &w);

	if (r < 0)
		return r;
	w->ext = res->ext;
	w->n_ext = w->cap_ext = res->n_ext;
	w->size = w->cut_pos = w->wmax = w->prefix = res->size;
	w->hdr = res->hdr;
	w->st_state = res->hdr ? ST_YES : ST_NO;
	w->st_error = res->st_error;
	/*
	 * A file that was not valid safetensors when it was closed may become so
	 * (a resumed download): its first change thaws it, so the header is
	 * sniffed again and the cuts follow tensors.  A valid one stays cut as it
	 * is; bytes appended to it make it invalid ("trailing bytes") at finish.
	 */
	w->thaw_on_change = !res->hdr && res->size > 0;
	for (size_t i = 0; i < res->n_tensors; i++) {
		free(res->tensors[i].name);
		free(res->tensors[i].shape);
	}
	free(res->tensors);
	memset(res, 0, sizeof(*res));
	*out = w;
	return 0;
}

static void set_st_error(struct writer *w, const char *msg)
{
	free(w->st_error);
	w->st_error = strdup(msg);
	st_free(w->hdr);
	w->hdr = NULL;
	w->st_state = ST_NO;
}

/*
 * Make staging cover [cut_pos, cut_pos + need).  Bytes [cut_pos, size) are
 * preserved; anything new is garbage until written or zero-filled.
 */
static int stg_ensure(struct writer *w, uint64_t need)
{
	uint64_t newlen, noff;
	int r;

	if (need <= w->stg_len)
		return 0;
	if (w->stg_len == 0) {
		newlen = HWFS_MAX(need, hwfs_tun.staging_min);
		r = store_stage_alloc(w->st, newlen, 0, &noff);
		if (r < 0)
			return r;
		w->stg_off = noff;
		w->stg_len = newlen;
		return 0;
	}
	newlen = HWFS_MAX(need, w->stg_len + HWFS_MIN(w->stg_len, hwfs_tun.staging_step));
	if (store_stage_extend(w->st, w->stg_off, w->stg_len, newlen) == 0 ||
	    (newlen > need && store_stage_extend(w->st, w->stg_off, w->stg_len, need) == 0 &&
	     (newlen = need))) {
		w->stg_len = newlen;
		return 0;
	}
	r = store_stage_alloc(w->st, newlen, 0, &noff);
	if (r < 0 && newlen > need && (r = store_stage_alloc(w->st, need, 0, &noff)) == 0)
		newlen = need;
	if (r < 0)
		return r;
	memcpy(arena_base(w->ar) + noff, arena_base(w->ar) + w->stg_off, w->size - w->cut_pos);
	store_stage_free(w->st, w->stg_off, w->stg_len);
	w->stg_off = noff;
	w->stg_len = newlen;
	return 0;
}

static void stg_release(struct writer *w)
{
	if (w->stg_len)
		store_stage_free(w->st, w->stg_off, w->stg_len);
	w->stg_len = 0;
}

static void drop_extents(struct writer *w)
{
	for (size_t i = 0; i < w->n_ext; i++)
		store_unref(w->st, w->ext[i].sh);
	w->n_ext = 0;
}

/* The header must be sniffed again (the bytes it came from changed). */
static void forget_header(struct writer *w)
{
	w->st_state = ST_UNKNOWN;
	st_free(w->hdr);
	w->hdr = NULL;
	free(w->st_error);
	w->st_error = NULL;
}

/* Copy the whole file back into one staging range; cutting waits for finish. */
static int thaw(struct writer *w)
{
	uint64_t noff = 0, len = w->size;
	uint8_t *base = arena_base(w->ar);
	int r;

	if (len) {
		r = store_stage_alloc(w->st, len, 0, &noff);
		if (r < 0)
			return r;
		for (size_t i = 0; i < w->n_ext; i++)
			memcpy(base + noff + w->ext[i].off, store_shard_data(w->st, w->ext[i].sh),
			       w->ext[i].len);
		if (w->size > w->cut_pos)
			memcpy(base + noff + w->cut_pos, stg_ptr(w, w->cut_pos),
			       w->size - w->cut_pos);
	}
	drop_extents(w);
	stg_release(w);
	w->stg_off = noff;
	w->stg_len = len;
	w->cut_pos = 0;
	w->random = 1;
	w->thaw_on_change = 0;
	forget_header(w);
	return 0;
}

/* Room for one more extent, so that nothing can fail after interning. */
static int ext_reserve(struct writer *w)
{
	if (w->n_ext == w->cap_ext) {
		size_t ncap = w->cap_ext ? w->cap_ext * 2 : 16;
		struct fext *n = realloc(w->ext, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		w->ext = n;
		w->cap_ext = ncap;
	}
	return 0;
}

/* Hash and intern [cut_pos, cut_pos+len) from the front of staging. */
static int cut_one(struct writer *w, uint64_t len)
{
	hwfs_hash_t h;
	struct shard *sh;
	int adopted;

	if (ext_reserve(w) < 0)
		return -ENOMEM;
	fill_hole(w, w->cut_pos + len);
	hwfs_hash_buf(stg_ptr(w, w->cut_pos), len, &h);
	sh = store_intern(w->st, &h, w->stg_off, len, &adopted);
	if (!sh)
		return -ENOMEM;
	w->ext[w->n_ext++] = (struct fext){w->cut_pos, len, sh};
	w->cut_pos += len;
	if (!adopted && w->size - w->cut_pos <= STG_REUSE_MAX) {
		/*
		 * A duplicate: keep the staging pages (already allocated and
		 * cache-warm) and slide the few bytes of the next piece to the
		 * front, instead of freeing pages only to allocate new ones.
		 */
		uint8_t *base = arena_base(w->ar) + w->stg_off;

		memmove(base, base + len, w->size - w->cut_pos);
		return 0;
	}
	if (!adopted)
		store_stage_free(w->st, w->stg_off, len);
	w->stg_off += len;
	w->stg_len -= len;
	if (w->stg_len == 0)
		w->stg_off = 0;
	return 0;
}

/* Decide, once enough bytes are there, whether the file is safetensors. */
static void sniff(struct writer *w, int final)
{
	uint64_t total, avail;
	char err[256];
	int r;

	if (w->st_state != ST_UNKNOWN || w->cut_pos != 0)
		return;
	/*
	 * Until the last close only bytes really written count: zero-fill from
	 * ftruncate() or from a write past the end is not a header.
	 */
	avail = final ? w->size : HWFS_MIN(w->prefix, w->size);
	fill_hole(w, HWFS_MIN(avail, ST_MAX_HEADER + 8));
	r = st_header_size(w->stg_len ? stg_ptr(w, 0) : NULL, avail, &total);
	if (r == -EAGAIN) {
		if (final)
			set_st_error(w, w->size < 8 ? "file shorter than 8 bytes"
						    : "header does not start with '{'");
		return;
	}
	if (r < 0) {
		uint64_t n = 0;

		memcpy(&n, stg_ptr(w, 0), 8);
		if (n == 0)
			snprintf(err, sizeof(err), "header length is 0");
		else if (n > ST_MAX_HEADER)
			snprintf(err, sizeof(err), "header length %llu exceeds the %u byte limit",
				 (unsigned long long)n, ST_MAX_HEADER);
		else
			snprintf(err, sizeof(err), "header does not start with '{'");
		set_st_error(w, err);
		return;
	}
	if (avail < total) {
		if (final) {
			snprintf(err, sizeof(err), "header length %llu exceeds the file size %llu",
				 (unsigned long long)(total - 8), (unsigned long long)w->size);
			set_st_error(w, err);
		}
		return;
	}
	if (st_parse(stg_ptr(w, 0), total, UINT64_MAX, &w->hdr, err, sizeof(err)) < 0)
		set_st_error(w, err);
	else
		w->st_state = ST_YES;
}

/* Cut every complete piece up to @limit. */
static int cut_upto(struct writer *w, uint64_t limit, int final)
{
	int r;

	sniff(w, final);
	if (w->st_state == ST_UNKNOWN && !final)
		return 0;
	while (w->cut_pos < limit) {
		uint64_t next = chunker_next_cut(w->hdr, w->cut_pos, hwfs_tun.max_shard,
					       hwfs_tun.fixed_chunk);

		if (next > limit) {
			if (!final)
				break;
			next = limit;
		}
		r = cut_one(w, next - w->cut_pos);
		if (r < 0)
			return r;
	}
	return 0;
}

int writer_reserve(struct writer *w, uint64_t off, size_t len, uint8_t **ptr)
{
	uint64_t end;
	int r;

	if (__builtin_add_overflow(off, (uint64_t)len, &end) || end > (1ull << 50))
		return -EFBIG;
	if (off < w->cut_pos || w->thaw_on_change) {
		r = thaw(w);
		if (r < 0)
			return r;
	}
	r = stg_ensure(w, end - w->cut_pos);
	if (r < 0)
		return r;
	*ptr = stg_ptr(w, off); /* a gap before it: writer_commit() */
	return 0;
}

int writer_commit(struct writer *w, uint64_t off, size_t len)
{
	uint64_t end = off + len;

	/* the hole changes once the bytes are there (a short write leaves the rest in it) */
	if (off > w->size) /* the gap reads as zeros (zeroed when read: fill_hole) */
		add_hole(w, w->size, off);
	hole_write(w, off, end);
	if (end > w->size)
		w->size = end;
	if (end > w->wmax)
		w->wmax = end;
	if (off <= w->prefix && end > w->prefix)
		w->prefix = end;
	if (w->random)
		return 0;
	return cut_upto(w, HWFS_MIN(w->wmax, w->size), 0);
}

int writer_write(struct writer *w, uint64_t off, const void *buf, size_t len)
{
	uint8_t *p;
	int r;

	if (len == 0)
		return 0;
	r = writer_reserve(w, off, len, &p);
	if (r < 0)
		return r;
	/* pwrite, not memcpy: no page fault per fresh staging page (arena_write) */
	arena_write(w->ar, stg_off_of(w, off), buf, len);
	return writer_commit(w, off, len);
}

int writer_truncate(struct writer *w, uint64_t size)
{
	int r;

	if (size == w->size)
		return 0;
	if (size == 0) {
		drop_extents(w);
		stg_release(w);
		w->cut_pos = w->size = w->wmax = w->prefix = 0;
		w->hz = w->he = 0;
		w->random = 0;
		w->thaw_on_change = 0;
		forget_header(w);
		return 0;
	}
	if (size < w->cut_pos || w->thaw_on_change) {
		r = thaw(w);
		if (r < 0)
			return r;
	}
	if (size > w->size) {
		r = stg_ensure(w, size - w->cut_pos);
		if (r < 0)
			return r;
		add_hole(w, w->size, size); /* zeroed when read, if not written first */
	}
	w->size = size;
	if (w->wmax > size)
		w->wmax = size;
	if (w->prefix > size)
		w->prefix = size;
	if (w->he > size) /* shrunk into the hole */
		w->he = size;
	if (w->hz >= w->he)
		w->hz = w->he = 0;
	return 0;
}

uint64_t writer_size(const struct writer *w)
{
	return w->size;
}

size_t writer_read(struct writer *w, uint64_t off, size_t len, uint8_t *buf)
{
	size_t done = 0;

	if (off >= w->size)
		return 0;
	len = (size_t)HWFS_MIN((uint64_t)len, w->size - off);
	fill_hole(w, off + len);
	while (done < len) {
		uint64_t pos = off + done;
		size_t n;

		if (pos >= w->cut_pos) {
			memcpy(buf + done, stg_ptr(w, pos), len - done);
			return len;
		}
		size_t i = ingest_fext_find(w->ext, w->n_ext, pos);

		if (i == w->n_ext)
			break;
		n = (size_t)HWFS_MIN((uint64_t)(len - done), w->ext[i].off + w->ext[i].len - pos);
		memcpy(buf + done, store_shard_data(w->st, w->ext[i].sh) + (pos - w->ext[i].off), n);
		done += n;
	}
	return done;
}

struct hwfs_trec *ingest_tensor_hashes(struct store *s, const struct st_header *hdr,
					 const struct fext *ext, size_t n_ext)
{
	struct hwfs_trec *t = calloc(hdr->n ? hdr->n : 1, sizeof(*t));

	if (!t)
		return NULL;
	for (size_t i = 0; i < hdr->n; i++) {
		const struct st_tensor *st = &hdr->t[i];
		size_t k = ingest_fext_find(ext, n_ext, st->off);

		t[i].name = strdup(st->name);
		t[i].ndim = st->ndim;
		t[i].shape = st->ndim ? malloc(st->ndim * sizeof(uint64_t)) : NULL;
		if (!t[i].name || (st->ndim && !t[i].shape))
			goto oom;
		if (st->ndim)
			memcpy(t[i].shape, st->shape, st->ndim * sizeof(uint64_t));
		memcpy(t[i].dtype, st->dtype, sizeof(t[i].dtype));
		t[i].off = st->off;
		t[i].len = st->len;
		if (st->len == 0) {
			hwfs_hash_buf("", 0, &t[i].hash);
		} else if (k < n_ext && ext[k].off == st->off && ext[k].len == st->len) {
			t[i].hash = ext[k].sh->hash;
		} else {
			XXH3_state_t *xs = XXH3_createState();
			uint64_t pos = st->off, end = st->off + st->len;
			XXH128_canonical_t c;

			if (!xs)
				goto oom;
			XXH3_128bits_reset(xs);
			while (pos < end && k < n_ext) {
				uint64_t n = HWFS_MIN(end, ext[k].off + ext[k].len) - pos;

				XXH3_128bits_update(xs, store_shard_data(s, ext[k].sh) +
								(pos - ext[k].off), n);
				pos += n;
				k++;
			}
			XXH128_canonicalFromHash(&c, XXH3_128bits_digest(xs));
			memcpy(t[i].hash.b, c.digest, HWFS_HASH_LEN);
			XXH3_freeState(xs);
		}
	}
	return t;
oom:
	for (size_t i = 0; i < hdr->n; i++) {
		free(t[i].name);
		free(t[i].shape);
	}
	free(t);
	return NULL;
}

int writer_finish(struct writer *w, struct ingest_result *res)
{
	char err[256];
	int r;

	memset(res, 0, sizeof(*res));
	r = cut_upto(w, w->size, 1);
	if (r < 0) {
		writer_abort(w);
		return r;
	}
	stg_release(w);
	if (w->st_state == ST_YES && st_check_size(w->hdr, w->size, err, sizeof(err)) < 0)
		set_st_error(w, err);
	if (w->hdr) {
		res->tensors = ingest_tensor_hashes(w->st, w->hdr, w->ext, w->n_ext);
		if (!res->tensors) {
			writer_abort(w);
			return -ENOMEM;
		}
		res->n_tensors = w->hdr->n;
	}
	res->size = w->size;
	res->n_ext = w->n_ext;
	res->ext = w->ext;
	res->hdr = w->hdr;
	res->st_error = w->st_error;
	free(w);
	return 0;
}

void writer_abort(struct writer *w)
{
	if (!w)
		return;
	drop_extents(w);
	stg_release(w);
	free(w->ext);
	st_free(w->hdr);
	free(w->st_error);
	free(w);
}

void ingest_result_clear(struct store *s, struct ingest_result *res)
{
	for (size_t i = 0; i < res->n_ext; i++)
		store_unref(s, res->ext[i].sh);
	free(res->ext);
	st_free(res->hdr);
	for (size_t i = 0; i < res->n_tensors; i++) {
		free(res->tensors[i].name);
		free(res->tensors[i].shape);
	}
	free(res->tensors);
	free(res->st_error);
	memset(res, 0, sizeof(*res));
}
