/*
 * libhwfs_map.c — hwfs_map(): a sealed version mapped read-only, zero-copy.
 *
 * The daemon answers {"op": "map"} with the version's files, their extents
 * ([file_off, len, arena_off], sorted by file offset) and tensors, and passes
 * its arena file (read-only) with the answer (docs/engines.md).  The arena is
 * mapped once, PROT_READ and MAP_SHARED: these are the daemon's own pages.
 * Then, per tensor:
 *  - its bytes are one run of the arena (one shard, or shards that happen to
 *    lie end to end): the tensor points into the arena mapping;
 *  - else, when every piece's boundaries inside the tensor fall on page
 *    boundaries of the arena (a tensor cut into max_shard pieces: every shard
 *    starts on a page and max_shard is a multiple of it), the pieces are
 *    stitched: a PROT_NONE range is reserved and each piece mapped over it
 *    with MAP_FIXED from the arena descriptor, so the tensor is contiguous and
 *    still the arena's pages;
 *  - else its bytes are copied into a buffer of the map's own and the tensor
 *    says `copied` (bytes the file does not cover read as zeros).
 * The control connection stays open for as long as the map lives: that open
 * connection is the lease that keeps every shard of the version in the arena
 * (hwfs rm and gc do not free them); the real unmap closes it, and so does
 * the kernel when the process dies.
 *
 * A map is reference-counted (struct hwfs_map in libhwfs_i.h): the caller of
 * hwfs_map() holds one reference and each DLPack tensor made from the map
 * another (libhwfs_dlpack.c).  hwfs_unmap() drops the caller's; the last one
 * dropped, from whichever thread, unmaps everything and ends the lease.  A
 * device map (hwfs_map_gpu, libhwfs_gpu.c) is the same structure with device
 * buckets instead of an arena, and is released here too.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "libhwfs_i.h"

/* One extent of a file as the answer gives it. */
struct extent {
	uint64_t off, len, aoff;
};

/* A piece of a tensor: bytes [foff, foff+len) of its file, at arena offset aoff. */
struct piece {
	uint64_t foff, len, aoff;
};

/* Where the pieces of one tensor are found, and how many fit (grows). */
struct pieces {
	struct piece *p;
	size_t n, cap;
};

static const char empty_tensor[1];

/* Round @x up to a multiple of @page (a power of two). */
static uint64_t page_up(uint64_t x, uint64_t page)
{
	return (x + page - 1) & ~(page - 1);
}

int lib_parse_hash(const char *hex, uint8_t out[16])
{
	hwfs_hash_t h;

	if (!hex || hwfs_hash_parse(hex, &h) < 0)
		return -EINVAL;
	memcpy(out, h.b, sizeof(h.b));
	return 0;
}

/* No "", ".", ".." or control character in any component (lib_valid_name). */
int lib_valid_file_path(const char *path)
{
	char comp[HWFS_NAME_MAX + 1];

	if (!path || !*path)
		return 0;
	for (const char *p = path;;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);

		if (n > HWFS_NAME_MAX)
			return 0;
		memcpy(comp, p, n);
		comp[n] = '\0';
		if (!lib_valid_name(comp))
			return 0;
		if (!slash)
			return 1;
		p = slash + 1;
	}
}

int lib_get_u64(json_t *o, const char *key, uint64_t *v)
{
	json_t *x = json_object_get(o, key);

	if (!json_is_integer(x) || json_integer_value(x) < 0)
		return -EPROTO;
	*v = (uint64_t)json_integer_value(x);
	return 0;
}

int lib_read_shape(json_t *shape, struct hwfs_tensor *t, uint64_t **shape_at, const char *answer)
{
	json_t *d;
	size_t k;

	t->ndim = (uint32_t)json_array_size(shape);
	t->shape = *shape_at;
	json_array_foreach(shape, k, d) {
		if (!json_is_integer(d) || json_integer_value(d) < 0)
			return lib_fail(-EPROTO, "malformed %s answer: shape of tensor %s", answer,
					t->name);
		(*shape_at)[k] = (uint64_t)json_integer_value(d);
	}
	*shape_at += t->ndim;
	return 0;
}

/*
 * Read the extents of file record @f into *@ext (*@n entries; free with
 * free()), checking that they lie inside the arena (@arena_len bytes) and
 * the file, in file order without overlap.  Returns 0, -EPROTO (sentence
 * set), -ENOMEM.
 */
static int read_extents(json_t *f, const char *path, uint64_t fsize, uint64_t arena_len,
			struct extent **ext, size_t *n)
{
	json_t *arr = json_object_get(f, "extents"), *e;
	struct extent *x = NULL;
	uint64_t end = 0;
	size_t i;
	int r = 0;

	if (!json_is_array(arr))
		return lib_fail(-EPROTO, "malformed map answer: %s has no extents", path);
	x = calloc(json_array_size(arr) + 1, sizeof(*x));
	if (!x)
		return lib_fail(-ENOMEM, "out of memory");
	json_array_foreach(arr, i, e) {
		json_t *a = json_array_get(e, 0), *b = json_array_get(e, 1),
		       *c = json_array_get(e, 2);

		if (json_array_size(e) != 3 || !json_is_integer(a) || !json_is_integer(b) ||
		    !json_is_integer(c) || json_integer_value(a) < 0 ||
		    json_integer_value(b) < 0 || json_integer_value(c) < 0) {
			r = -EPROTO;
			goto out;
		}
		x[i].off = (uint64_t)json_integer_value(a);
		x[i].len = (uint64_t)json_integer_value(b);
		x[i].aoff = (uint64_t)json_integer_value(c);
		if (x[i].off < end || x[i].len > fsize || x[i].off > fsize - x[i].len ||
		    x[i].len > arena_len || x[i].aoff > arena_len - x[i].len) {
			r = -EPROTO;
			goto out;
		}
		end = x[i].off + x[i].len;
	}
	*ext = x;
	*n = json_array_size(arr);
	x = NULL;
out:
	free(x);
	if (r < 0)
		lib_fail(r, "malformed map answer: extent %zu of %s is out of order or outside "
			    "the file or the arena", i, path);
	return r;
}

/*
 * The pieces of file bytes [off, off+len) among extents @ext (@n, sorted),
 * into @pc (reset first).  Returns 0 or -ENOMEM.
 */
static int find_pieces(const struct extent *ext, size_t n, uint64_t off, uint64_t len,
		       struct pieces *pc)
{
	size_t lo = 0, hi = n;

	pc->n = 0;
	/* the first extent that ends after off */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ext[mid].off + ext[mid].len <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < n && ext[i].off < off + len; i++) {
		uint64_t a = HWFS_MAX(off, ext[i].off);
		uint64_t b = HWFS_MIN(off + len, ext[i].off + ext[i].len);

		if (pc->n == pc->cap) {
			size_t ncap = pc->cap ? pc->cap * 2 : 8;
			struct piece *np = realloc(pc->p, ncap * sizeof(*np));

			if (!np)
				return -ENOMEM;
			pc->p = np;
			pc->cap = ncap;
		}
		pc->p[pc->n++] = (struct piece){a, b - a, ext[i].aoff + (a - ext[i].off)};
	}
	return 0;
}

/*
 * Does @pc cover the tensor [off, off+len) without a hole?  Neighbouring
 * pieces that are also neighbours in the arena are merged first.
 */
static int covered(struct pieces *pc, uint64_t off, uint64_t len)
{
	size_t k = 0;

	if (!pc->n || pc->p[0].foff != off)
		return 0;
	for (size_t i = 1; i < pc->n; i++) {
		if (pc->p[i].foff != pc->p[k].foff + pc->p[k].len)
			return 0;
		if (pc->p[i].aoff == pc->p[k].aoff + pc->p[k].len)
			pc->p[k].len += pc->p[i].len;
		else
			pc->p[++k] = pc->p[i];
	}
	pc->n = k + 1;
	return pc->p[k].foff + pc->p[k].len == off + len;
}

/* Can pieces @pc be stitched with page mappings? Every inner boundary on a page. */
static int stitchable(const struct pieces *pc, uint64_t page)
{
	for (size_t i = 0; i < pc->n; i++) {
		if (i > 0 && pc->p[i].aoff % page)
			return 0;
		if (i + 1 < pc->n && (pc->p[i].aoff + pc->p[i].len) % page)
			return 0;
	}
	return 1;
}

/*
 * Remember range @p (@len bytes, @heap) for hwfs_unmap; m->regions has a slot
 * for every tensor, and a tensor makes at most one region.
 */
static void add_region(struct hwfs_map *m, void *p, size_t len, int heap)
{
	m->regions[m->n_regions++] = (struct lib_region){p, len, heap};
}

/*
 * Map pieces @pc of a tensor of @len bytes contiguously: reserve a PROT_NONE
 * range and map each piece of arena descriptor @afd over it (MAP_FIXED).
 * Returns 0 with *@data set, or -errno (nothing left mapped).
 */
static int stitch(struct hwfs_map *m, int afd, const struct pieces *pc, uint64_t len,
		  uint64_t page, const void **data)
{
	uint64_t pad = pc->p[0].aoff % page, at = 0;
	size_t total = page_up(pad + len, page);
	char *base = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			  -1, 0);
	int r = 0;

	if (base == MAP_FAILED)
		return -errno;
	for (size_t i = 0; i < pc->n && r == 0; i++) {
		uint64_t head = i == 0 ? pad : 0, span = page_up(head + pc->p[i].len, page);

		if (mmap(base + at, span, PROT_READ, MAP_SHARED | MAP_FIXED, afd,
			 (off_t)(pc->p[i].aoff - head)) == MAP_FAILED)
			r = -errno;
		at += span;
	}
	if (r < 0) {
		munmap(base, total);
		return r;
	}
	add_region(m, base, total, 0);
	*data = base + pad;
	return 0;
}

/*
 * Copy pieces @pc of the tensor [off, off+len) out of the arena into a
 * buffer of the map's (holes read as zeros).  Returns 0 with *@data set, or
 * -ENOMEM.
 */
static int copy_out(struct hwfs_map *m, const struct pieces *pc, uint64_t off, uint64_t len,
		    const void **data)
{
	char *buf = calloc(1, len);

	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < pc->n; i++)
		memcpy(buf + (pc->p[i].foff - off), (const char *)m->arena + pc->p[i].aoff,
		       pc->p[i].len);
	add_region(m, buf, len, 1);
	*data = buf;
	return 0;
}

/*
 * Fill tensor @t from its JSON record @jt of file @path: name, dtype, shape
 * (stored at *@shape_at, which advances), hash, offset and length (checked
 * against the file size).  Returns 0 or -EPROTO (sentence set).
 */
static int read_tensor(json_t *jt, const char *path, uint64_t fsize, struct hwfs_tensor *t,
		       uint64_t **shape_at, uint64_t *off)
{
	json_t *shape = json_object_get(jt, "shape");

	t->name = lib_jstr(jt, "name");
	t->dtype = lib_jstr(jt, "dtype");
	t->file = path;
	if (!t->name || !t->dtype || !json_is_array(shape) ||
	    lib_get_u64(jt, "off", off) < 0 || lib_get_u64(jt, "len", &t->len) < 0 ||
	    lib_parse_hash(lib_jstr(jt, "hash"), t->hash) < 0 || t->len > fsize ||
	    *off > fsize - t->len)
		return lib_fail(-EPROTO, "malformed map answer: a tensor of %s (%s)", path,
				t->name ? t->name : "no name");
	return lib_read_shape(shape, t, shape_at, "map");
}

/*
 * Count the tensors and shape entries of every file of answer @files, so
 * that the map's arrays are allocated once.  Returns 0 or -EPROTO.
 */
static int count_tensors(json_t *files, size_t *n, size_t *dims)
{
	json_t *f, *jt;
	size_t i, k;

	*n = *dims = 0;
	if (!json_is_array(files))
		return lib_fail(-EPROTO, "malformed map answer: no files");
	json_array_foreach(files, i, f) {
		json_t *ts = json_object_get(f, "tensors");

		if (!ts)
			continue;
		if (!json_is_array(ts))
			return lib_fail(-EPROTO, "malformed map answer: tensors of a file");
		json_array_foreach(ts, k, jt)
			*dims += json_array_size(json_object_get(jt, "shape"));
		*n += json_array_size(ts);
	}
	return 0;
}

/* Order of tensor indices in by_name: name, then index (so a bare name finds the first). */
static int by_name_cmp(const void *a, const void *b, void *arg)
{
	const struct hwfs_map *m = arg;
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	int c = strcmp(m->t[x].name, m->t[y].name);

	return c ? c : (x > y) - (x < y);
}

void lib_map_index(struct hwfs_map *m)
{
	for (size_t i = 0; i < m->n; i++)
		m->by_name[i] = i;
	qsort_r(m->by_name, m->n, sizeof(*m->by_name), by_name_cmp, m);
}

/* Order of the tensors of one file: by offset (the answer's order when already so). */
struct tensor_at {
	struct hwfs_tensor t;
	uint64_t off;
};

static int by_off_cmp(const void *a, const void *b)
{
	const struct tensor_at *x = a, *y = b;

	return (x->off > y->off) - (x->off < y->off);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

/*
 * Fill the page tables of every tensor mapped in place (not the copies),
 * so that the first use after a shadow-load takes no page fault: the kernel
 * maps a tensor's resident pages in one call instead of one fault per
 * 64 KiB (fault-around) as it is first read.  Best effort: a kernel without
 * MADV_POPULATE_READ leaves the pages to be faulted in on use.
 */
static void populate(struct hwfs_map *m, uint64_t page)
{
	for (size_t i = 0; i < m->n; i++) {
		const struct hwfs_tensor *t = &m->t[i];
		uintptr_t a, e;

		if (t->copied || !t->len)
			continue;
		a = (uintptr_t)t->data & ~(uintptr_t)(page - 1);
		e = (uintptr_t)t->data + t->len;
		if (madvise((void *)a, e - a, MADV_POPULATE_READ) < 0 && errno == EINVAL)
			return; /* not supported here */
	}
}

/*
 * Build every tensor of answer @res into @m, with the arena already mapped
 * and its descriptor @afd.  Returns 0 or -errno (sentence set).
 */
static int build_tensors(struct hwfs_map *m, json_t *res, int afd, uint64_t page)
{
	json_t *files = json_object_get(res, "files"), *f, *jt;
	struct tensor_at *tmp = NULL;
	struct pieces pc = {0};
	struct extent *ext = NULL;
	uint64_t *shape_at;
	size_t i, k, n, dims, n_ext = 0;
	int r = count_tensors(files, &n, &dims);

	if (r < 0)
		return r;
	m->t = calloc(n + 1, sizeof(*m->t));
	m->shapes = calloc(dims + 1, sizeof(*m->shapes));
	m->by_name = calloc(n + 1, sizeof(*m->by_name));
	m->regions = calloc(n + 1, sizeof(*m->regions));
	tmp = calloc(n + 1, sizeof(*tmp));
	if (!m->t || !m->shapes || !m->by_name || !m->regions || !tmp) {
		r = lib_fail(-ENOMEM, "out of memory");
		goto out;
	}
	shape_at = m->shapes;
	json_array_foreach(files, i, f) {
		json_t *ts = json_object_get(f, "tensors");
		const char *path = lib_jstr(f, "path");
		uint64_t fsize;
		size_t first = m->n;

		if (!path || lib_get_u64(f, "size", &fsize) < 0) {
			r = lib_fail(-EPROTO, "malformed map answer: a file without path or size");
			goto out;
		}
		if (!lib_valid_file_path(path)) {
			r = lib_fail(-EPROTO, "malformed map answer: invalid file path");
			goto out;
		}
		if (!json_array_size(ts))
			continue;
		free(ext);
		ext = NULL;
		r = read_extents(f, path, fsize, m->arena_len, &ext, &n_ext);
		if (r < 0)
			goto out;
		json_array_foreach(ts, k, jt) {
			r = read_tensor(jt, path, fsize, &tmp[m->n].t, &shape_at, &tmp[m->n].off);
			if (r < 0)
				goto out;
			m->n++;
		}
		qsort(tmp + first, m->n - first, sizeof(*tmp), by_off_cmp);
		for (size_t j = first; j < m->n; j++) {
			struct hwfs_tensor *t = &m->t[j];
			uint64_t off = tmp[j].off;
			int whole;

			*t = tmp[j].t;
			if (!t->len) {
				t->data = empty_tensor;
				continue;
			}
			if (find_pieces(ext, n_ext, off, t->len, &pc) < 0) {
				r = lib_fail(-ENOMEM, "out of memory");
				goto out;
			}
			whole = covered(&pc, off, t->len);
			if (whole && pc.n == 1) {
				t->data = (const char *)m->arena + pc.p[0].aoff;
				continue;
			}
			r = -EINVAL;
			if (whole && stitchable(&pc, page))
				r = stitch(m, afd, &pc, t->len, page, &t->data);
			if (r < 0) {
				t->copied = 1;
				r = copy_out(m, &pc, off, t->len, &t->data);
			}
			if (r < 0) {
				r = lib_fail(r, "cannot place tensor %s of %s: %s", t->name, path,
					     strerror(-r));
				goto out;
			}
		}
	}
	lib_map_index(m);
	r = 0;
out:
	free(pc.p);
	free(ext);
	free(tmp);
	return r;
}

struct hwfs_map *lib_map_new(void)
{
	struct hwfs_map *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	atomic_init(&m->refs, 1);
	m->fd = -1;
	m->device = -1;
	return m;
}

void lib_map_hold(struct hwfs_map *m)
{
	atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
}

/* The real unmap, at the last reference: nothing else can see @m any more. */
static void map_free(struct hwfs_map *m)
{
	for (size_t i = 0; i < m->n_regions; i++) {
		if (m->regions[i].heap)
			free(m->regions[i].p);
		else
			munmap(m->regions[i].p, m->regions[i].len);
	}
	if (m->arena)
		munmap(m->arena, m->arena_len);
	lib_gpu_release(m); /* device buckets, before the daemon may free them */
	if (m->fd >= 0)
		close(m->fd); /* ends the lease */
	json_decref(m->reply);
	free(m->t);
	free(m->shapes);
	free(m->by_name);
	free(m->regions);
	free(m);
}

void lib_map_put(struct hwfs_map *m)
{
	/* release: our writes happen before the free; acquire: the freer sees every one */
	if (m && atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1)
		map_free(m);
}

void hwfs_unmap(struct hwfs_map *m)
{
	lib_map_put(m);
}

/*
 * Check what the answer of map @m says against what came with it: the
 * version is the one asked for (@version) and a valid name, and the arena
 * descriptor @afd is a regular file that holds all @arena_len bytes (extents
 * are checked against arena_len later, so none lies past the file's end: a
 * page past it would be SIGBUS at first read).  Returns 0 or -EPROTO (or
 * -errno of fstat), with the sentence set.
 */
static int check_answer(const struct hwfs_map *m, int afd, const char *version,
			uint64_t arena_len)
{
	struct stat st;

	if (!lib_valid_name(m->version) || !version || strcmp(m->version, version))
		return lib_fail(-EPROTO, "malformed map answer: it is not of the version asked "
					 "for (%s)", version ? version : "none");
	if (fstat(afd, &st) < 0)
		return lib_fail(-errno, "cannot check the arena descriptor: %s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return lib_fail(-EPROTO, "malformed map answer: the arena descriptor is not a "
					 "regular file");
	if (st.st_size < 0 || arena_len > (uint64_t)st.st_size)
		return lib_fail(-EPROTO, "malformed map answer: arena_size %llu is beyond the end "
					 "of the arena file (%lld bytes)",
				(unsigned long long)arena_len, (long long)st.st_size);
	return 0;
}

int lib_map_request(struct hwfs *h, struct hwfs_map *m, json_t *req, struct ctl_reader *rd)
{
	int r;

	m->fd = lib_connect(h);
	if (m->fd < 0)
		return m->fd;
	rd->fd = m->fd;
	r = lib_exchange(m->fd, rd, req, NULL, NULL, &m->reply);
	if (r < 0 || (r = lib_check(m->reply)) < 0)
		return r;
	m->version = lib_jstr(m->reply, "version");
	m->digest = lib_jstr(m->reply, "digest");
	return 0;
}

int hwfs_map(struct hwfs *h, const char *version, struct hwfs_map **out)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), arena_len = 0, their_page = 0;
	json_t *req = json_pack("{s:s, s:s}", "op", "map", "version", version ? version : "");
	struct hwfs_map *m = lib_map_new();
	struct ctl_reader rd;
	int r, afd = -1;

	lib_clear_error();
	ctl_reader_init(&rd, -1);
	rd.accept_fds = 1; /* the arena's descriptor comes with the answer */
	if (!req || !m) {
		r = lib_fail(-ENOMEM, "out of memory");
		goto out;
	}
	r = lib_map_request(h, m, req, &rd);
	if (r < 0)
		goto out;
	afd = ctl_take_fd(&rd);
	if (afd < 0 || !m->version || !m->digest ||
	    lib_get_u64(m->reply, "arena_size", &arena_len) < 0 ||
	    lib_get_u64(m->reply, "page_size", &their_page) < 0 || arena_len > SIZE_MAX) {
		r = lib_fail(-EPROTO, "malformed map answer from the daemon%s",
			     afd < 0 ? ": no arena descriptor came with it" : "");
		goto out;
	}
	r = check_answer(m, afd, version, arena_len);
	if (r < 0)
		goto out;
	if (their_page != page) {
		r = lib_fail(-EPROTO, "the daemon's page size (%llu) is not ours (%llu)",
			     (unsigned long long)their_page, (unsigned long long)page);
		goto out;
	}
	m->arena_len = (size_t)arena_len;
	if (m->arena_len) {
		m->arena = mmap(NULL, m->arena_len, PROT_READ, MAP_SHARED, afd, 0);
		if (m->arena == MAP_FAILED) {
			m->arena = NULL;
			r = lib_fail(-errno, "cannot map the arena (%llu bytes): %s",
				     (unsigned long long)arena_len, strerror(errno));
			goto out;
		}
	}
	r = build_tensors(m, m->reply, afd, page);
	if (r < 0)
		goto out;
	populate(m, page);
	*out = m;
	m = NULL;
out:
	if (afd >= 0)
		close(afd);
	ctl_reader_free(&rd);
	json_decref(req);
	hwfs_unmap(m);
	return r;
}

const char *hwfs_map_version(const struct hwfs_map *m)
{
	return m->version;
}

const char *hwfs_map_digest(const struct hwfs_map *m)
{
	return m->digest;
}

int hwfs_map_device(const struct hwfs_map *m)
{
	return m->device;
}

size_t hwfs_map_count(const struct hwfs_map *m)
{
	return m->n;
}

const struct hwfs_tensor *hwfs_map_tensor(const struct hwfs_map *m, size_t i)
{
	return i < m->n ? &m->t[i] : NULL;
}

/*
 * The first tensor (in map order) named @name whose file is the @flen bytes at
 * @file (NULL: any file), or NULL.  A binary search over by_name.
 */
static const struct hwfs_tensor *find(const struct hwfs_map *m, const char *name,
				      const char *file, size_t flen)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(m->t[m->by_name[mid]].name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < m->n && !strcmp(m->t[m->by_name[lo]].name, name); lo++) {
		const struct hwfs_tensor *t = &m->t[m->by_name[lo]];

		if (!file || (!strncmp(t->file, file, flen) && t->file[flen] == '\0'))
			return t;
	}
	return NULL;
}

const struct hwfs_tensor *hwfs_map_find(const struct hwfs_map *m, const char *name)
{
	const struct hwfs_tensor *t = find(m, name, NULL, 0);

	/* "FILE:TENSOR": either part may hold ':' itself, so try every split */
	for (const char *c = strchr(name, ':'); !t && c; c = strchr(c + 1, ':'))
		t = find(m, c + 1, name, (size_t)(c - name));
	return t;
}
