/*
 * manifest.c — the canonical JSON form of a version, and its strict decoder.
 *
 * Encoding.  The manifest is a jansson tree dumped with JSON_COMPACT |
 * JSON_SORT_KEYS, so the bytes depend only on the content:
 *
 *   {"files":[FILE...],"format":"hwfs-manifest/1",
 *    "shards":[[HASH,SIZE]...],"version":NAME}
 *
 * FILE is {"kind":"dir"|"file"|"symlink","mode":INT,"mtime_ns":INT,"path":P}
 * plus, for a regular file, "size" and "extents":[[OFF,LEN,HASH]...] and,
 * when present, "tensors":[{"dtype","hash","length","name","offset","shape"}]
 * and "safetensors_error"; for a symlink, "target".  Files are sorted by path
 * (strcmp), whatever order the record holds them in; extents and tensors keep
 * the record's order (sorted by offset by contract).  "shards" lists each
 * distinct extent hash once with its size, sorted by hash: an extent is a
 * whole shard, so the size is the extent length, and two extents with the
 * same hash and different lengths make the record invalid.  HASH is 32
 * lowercase hex digits.  Only permission bits of the mode are written.
 * Node-local facts (uid, gid, seq, creation and sealing times, arena offsets)
 * are left out so that two nodes holding the same version produce the same
 * bytes and therefore the same digest.  JSON integers are signed 64-bit, so
 * an unsigned quantity above INT64_MAX makes manifest_build() fail with
 * -EOVERFLOW; a string that is not valid UTF-8 makes it fail with -EINVAL.
 *
 * Decoding.  manifest_parse() is fed bytes from other nodes and trusts none
 * of them.  Besides well-formed JSON (no duplicate keys, no NUL in strings)
 * it requires: the exact format tag; no unknown keys anywhere; a version name
 * usable as a directory name (1..255 bytes, no '/', no control character,
 * not "." or ".."); files sorted and unique by path; safe relative paths (no
 * leading '/', no empty, "." or ".." component, no control character,
 * components of at most 255 bytes, at most 4095 bytes in all; the same rules
 * the namespace applies to names) and no entry below a path that
 * is listed as something other than a directory; modes within 07777;
 * extents of positive length tiling [0, size) exactly; tensors sorted by
 * offset and inside their file, with a dtype of 1..15 characters and at most
 * 32 non-negative dimensions; lowercase 32-digit hashes; a "shards" list
 * sorted, distinct, and equal to the set of extent hashes with matching
 * sizes; and at most 1<<20 files + extents + tensors.  The first violation is
 * reported as one line in @err.  Non-canonical spacing or key order is
 * accepted; the digest of the record is the hash of the bytes received.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "manifest.h"
#include "names.h"

#define MF_MAX_ENTRIES (1u << 20)
#define MF_MAX_NDIM 32
#define MF_MAX_PATH 4095

/* ------------------------------------------------------------------ */
/* encoding                                                            */
/* ------------------------------------------------------------------ */

/* Strict UTF-8 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF). */
static int utf8_valid(const char *str)
{
	const unsigned char *s = (const unsigned char *)str;

	while (*s) {
		unsigned c = *s, n, cp;

		if (c < 0x80) {
			s++;
			continue;
		} else if (c >= 0xc2 && c <= 0xdf) {
			n = 1;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			n = 2;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			n = 3;
			cp = c & 0x07;
		} else {
			return 0;
		}
		for (unsigned i = 1; i <= n; i++) {
			if ((s[i] & 0xc0) != 0x80)
				return 0;
			cp = cp << 6 | (s[i] & 0x3f);
		}
		if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		s += n + 1;
	}
	return 1;
}

/* Set @key of @obj to @val (consumed). */
static int add(json_t *obj, const char *key, json_t *val)
{
	if (!val)
		return -ENOMEM;
	return json_object_set_new(obj, key, val) ? -ENOMEM : 0;
}

/* Append @val (consumed) to @arr. */
static int push(json_t *arr, json_t *val)
{
	if (!val)
		return -ENOMEM;
	return json_array_append_new(arr, val) ? -ENOMEM : 0;
}

static int mk_str(const char *s, json_t **out)
{
	if (!s) {
		LOG_ERR("manifest: a required string is missing");
		return -EINVAL;
	}
	if (!utf8_valid(s)) {
		LOG_ERR("manifest: a name or path is not valid UTF-8");
		return -EINVAL;
	}
	*out = json_string(s);
	return *out ? 0 : -ENOMEM;
}

static int mk_u64(uint64_t v, json_t **out)
{
	if (v > (uint64_t)INT64_MAX)
		return -EOVERFLOW;
	*out = json_integer((json_int_t)v);
	return *out ? 0 : -ENOMEM;
}

static int add_str(json_t *obj, const char *key, const char *s)
{
	json_t *x = NULL;
	int rc = mk_str(s, &x);

	return rc ? rc : add(obj, key, x);
}

static int add_u64(json_t *obj, const char *key, uint64_t v)
{
	json_t *x = NULL;
	int rc = mk_u64(v, &x);

	return rc ? rc : add(obj, key, x);
}

static int push_u64(json_t *arr, uint64_t v)
{
	json_t *x = NULL;
	int rc = mk_u64(v, &x);

	return rc ? rc : push(arr, x);
}

static int push_hash(json_t *arr, const hwfs_hash_t *h)
{
	char hex[HWFS_HASH_HEX];

	hwfs_hash_hex(h, hex);
	return push(arr, json_string(hex));
}

static int add_hash(json_t *obj, const char *key, const hwfs_hash_t *h)
{
	char hex[HWFS_HASH_HEX];

	hwfs_hash_hex(h, hex);
	return add(obj, key, json_string(hex));
}

static int cmp_frec_ptr(const void *a, const void *b)
{
	const struct hwfs_frec *const *x = a, *const *y = b;

	return strcmp((*x)->path, (*y)->path);
}

static int cmp_extent_hash(const void *a, const void *b)
{
	const struct hwfs_extent *x = a, *y = b;
	int c = hwfs_hash_cmp(&x->hash, &y->hash);

	if (c)
		return c;
	return x->len < y->len ? -1 : x->len > y->len;
}

static int build_tensor(const struct hwfs_trec *t, json_t **out)
{
	json_t *o = json_object(), *shape = json_array();
	char dtype[sizeof(t->dtype) + 1];
	int rc;

	if (!o || !shape) {
		json_decref(shape);
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < t->ndim; i++)
		if ((rc = push_u64(shape, t->shape[i]))) {
			json_decref(shape);
			goto out;
		}
	memcpy(dtype, t->dtype, sizeof(t->dtype));
	dtype[sizeof(t->dtype)] = '\0';
	if ((rc = add_str(o, "name", t->name)) || (rc = add_str(o, "dtype", dtype)) ||
	    (rc = add(o, "shape", shape)) || (rc = add_u64(o, "offset", t->off)) ||
	    (rc = add_u64(o, "length", t->len)) || (rc = add_hash(o, "hash", &t->hash)))
		goto out;
	*out = o;
	o = NULL;
out:
	json_decref(o);
	return rc;
}

static int build_file(const struct hwfs_frec *f, json_t **out)
{
	json_t *o = json_object(), *arr = NULL;
	const char *kind;
	int rc;

	if (!o) {
		rc = -ENOMEM;
		goto out;
	}
	switch (f->kind) {
	case HWFS_K_REG:
		kind = "file";
		break;
	case HWFS_K_DIR:
		kind = "dir";
		break;
	case HWFS_K_LNK:
		kind = "symlink";
		break;
	default:
		LOG_ERR("manifest: %s: unknown kind %d", f->path, (int)f->kind);
		rc = -EINVAL;
		goto out;
	}
	if ((rc = add_str(o, "path", f->path)) || (rc = add(o, "kind", json_string(kind))) ||
	    (rc = add(o, "mode", json_integer(f->mode & 07777))) ||
	    (rc = add(o, "mtime_ns", json_integer(f->mtime_ns))))
		goto out;

	if (f->kind == HWFS_K_LNK) {
		rc = add_str(o, "target", f->target);
		if (rc)
			goto out;
	}
	if (f->kind == HWFS_K_REG) {
		if ((rc = add_u64(o, "size", f->size)))
			goto out;
		arr = json_array();
		if (!arr) {
			rc = -ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < f->n_ext; i++) {
			json_t *e = json_array();

			if ((rc = push(arr, e)) || (rc = push_u64(e, f->ext[i].off)) ||
			    (rc = push_u64(e, f->ext[i].len)) || (rc = push_hash(e, &f->ext[i].hash)))
				goto out;
		}
		rc = add(o, "extents", arr);
		arr = NULL;
		if (rc)
			goto out;

		if (f->n_tensors) {
			arr = json_array();
			if (!arr) {
				rc = -ENOMEM;
				goto out;
			}
			for (size_t i = 0; i < f->n_tensors; i++) {
				json_t *t = NULL;

				if ((rc = build_tensor(&f->tensors[i], &t)) || (rc = push(arr, t)))
					goto out;
			}
			rc = add(o, "tensors", arr);
			arr = NULL;
			if (rc)
				goto out;
		}
		if (f->st_error && (rc = add_str(o, "safetensors_error", f->st_error)))
			goto out;
	}
	*out = o;
	o = NULL;
out:
	json_decref(arr);
	json_decref(o);
	return rc;
}

/* The distinct [hash, size] pairs of every extent, sorted by hash. */
static int build_shards(const struct hwfs_vrec *v, json_t **out)
{
	struct hwfs_extent *all = NULL;
	json_t *arr = json_array();
	size_t n = 0;
	int rc = 0;

	if (!arr) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < v->n_files; i++)
		if (v->files[i].kind == HWFS_K_REG)
			n += v->files[i].n_ext;
	all = n ? calloc(n, sizeof(*all)) : NULL;
	if (n && !all) {
		rc = -ENOMEM;
		goto out;
	}
	n = 0;
	for (size_t i = 0; i < v->n_files; i++)
		if (v->files[i].kind == HWFS_K_REG && v->files[i].n_ext) {
			memcpy(all + n, v->files[i].ext, v->files[i].n_ext * sizeof(*all));
			n += v->files[i].n_ext;
		}
	if (n)
		qsort(all, n, sizeof(*all), cmp_extent_hash);
	for (size_t i = 0; i < n; i++) {
		json_t *pair;

		if (i && hwfs_hash_cmp(&all[i].hash, &all[i - 1].hash) == 0) {
			if (all[i].len != all[i - 1].len) {
				char hex[HWFS_HASH_HEX];

				hwfs_hash_hex(&all[i].hash, hex);
				LOG_ERR("manifest: version %s: shard %s has two sizes", v->name, hex);
				rc = -EINVAL;
				goto out;
			}
			continue;
		}
		pair = json_array();
		if ((rc = push(arr, pair)) || (rc = push_hash(pair, &all[i].hash)) ||
		    (rc = push_u64(pair, all[i].len)))
			goto out;
	}
	*out = arr;
	arr = NULL;
out:
	free(all);
	json_decref(arr);
	return rc;
}

int manifest_build(const struct hwfs_vrec *v, char **json, size_t *len)
{
	const struct hwfs_frec **order = NULL;
	json_t *root = NULL, *files = NULL, *shards = NULL;
	char *s;
	int rc;

	if (!v || !v->name || (v->n_files && !v->files)) {
		rc = -EINVAL;
		goto out;
	}
	order = calloc(v->n_files ? v->n_files : 1, sizeof(*order));
	root = json_object();
	files = json_array();
	if (!order || !root || !files) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < v->n_files; i++) {
		if (!v->files[i].path) {
			LOG_ERR("manifest: version %s: file %zu has no path", v->name, i);
			rc = -EINVAL;
			goto out;
		}
		order[i] = &v->files[i];
	}
	if (v->n_files)
		qsort(order, v->n_files, sizeof(*order), cmp_frec_ptr);
	for (size_t i = 0; i < v->n_files; i++) {
		json_t *f = NULL;

		if (i && strcmp(order[i]->path, order[i - 1]->path) == 0) {
			LOG_ERR("manifest: version %s: path %s listed twice", v->name, order[i]->path);
			rc = -EINVAL;
			goto out;
		}
		if ((rc = build_file(order[i], &f)) || (rc = push(files, f)))
			goto out;
	}
	if ((rc = build_shards(v, &shards)))
		goto out;
	if ((rc = add(root, "format", json_string(MANIFEST_FORMAT))) ||
	    (rc = add_str(root, "version", v->name)))
		goto out;
	rc = add(root, "files", files);
	files = NULL;
	if (rc)
		goto out;
	rc = add(root, "shards", shards);
	shards = NULL;
	if (rc)
		goto out;

	s = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	if (!s) {
		rc = -ENOMEM;
		goto out;
	}
	*json = s;
	*len = strlen(s);
	rc = 0;
out:
	json_decref(shards);
	json_decref(files);
	json_decref(root);
	free(order);
	return rc;
}

int manifest_digest(const struct hwfs_vrec *v, hwfs_hash_t *out)
{
	char *json;
	size_t len;
	int rc;

	rc = manifest_build(v, &json, &len);
	if (rc)
		return rc;
	hwfs_hash_buf(json, len, out);
	free(json);
	return 0;
}

/* ------------------------------------------------------------------ */
/* decoding                                                            */
/* ------------------------------------------------------------------ */

struct pctx {
	char *err;
	size_t errlen;
	size_t total; /* files + extents + tensors so far */
};

struct shard {
	hwfs_hash_t hash;
	uint64_t size;
	int used;
};

/* A refusal: the reason into c->err, one line (line breaks become spaces), -EINVAL. */
#define fail(c, ...) hwfs_fail(-EINVAL, (c)->err, (c)->errlen, HWFS_ERR_LINES, __VA_ARGS__)

/* Every key of @obj must be in the NULL-terminated @allowed. */
static int only_keys(struct pctx *c, const char *where, json_t *obj, const char *const *allowed)
{
	const char *key;
	json_t *val;

	json_object_foreach(obj, key, val) {
		const char *const *a;

		for (a = allowed; *a; a++)
			if (strcmp(*a, key) == 0)
				break;
		if (!*a)
			return fail(c, "%s: unknown key \"%.32s\"", where, key);
	}
	return 0;
}

static int get_str(struct pctx *c, const char *where, json_t *obj, const char *key,
		   const char **out)
{
	json_t *x = json_object_get(obj, key);

	if (!json_is_string(x))
		return fail(c, "%s: \"%s\" missing or not a string", where, key);
	*out = json_string_value(x);
	return 0;
}

/* A JSON integer in [lo, hi]. */
static int int_in(struct pctx *c, const char *where, const char *what, json_t *x, int64_t lo,
		  int64_t hi, int64_t *out)
{
	json_int_t v;

	if (!json_is_integer(x))
		return fail(c, "%s: %s missing or not an integer", where, what);
	v = json_integer_value(x);
	if (v < lo || v > hi)
		return fail(c, "%s: %s %" PRId64 " out of range", where, what, (int64_t)v);
	*out = v;
	return 0;
}

static int get_u64(struct pctx *c, const char *where, const char *what, json_t *x, uint64_t *out)
{
	int64_t v = 0;
	int rc = int_in(c, where, what, x, 0, INT64_MAX, &v);

	if (!rc)
		*out = (uint64_t)v;
	return rc;
}

/* 32 lowercase hex digits. */
static int get_hash(struct pctx *c, const char *where, json_t *x, hwfs_hash_t *out)
{
	const char *s = json_string_value(x);

	if (!s)
		return fail(c, "%s: hash is not a string", where);
	if (json_string_length(x) != 2 * HWFS_HASH_LEN)
		return fail(c, "%s: hash is not 32 hex digits", where);
	for (const char *p = s; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return fail(c, "%s: hash is not 32 lowercase hex digits", where);
	if (hwfs_hash_parse(s, out))
		return fail(c, "%s: bad hash", where);
	return 0;
}

static int check_path(struct pctx *c, const char *where, const char *p, size_t len)
{
	const char *comp = p;

	if (len == 0)
		return fail(c, "%s: empty path", where);
	if (len > MF_MAX_PATH)
		return fail(c, "%s: path longer than %d bytes", where, MF_MAX_PATH);
	if (p[0] == '/')
		return fail(c, "%s: absolute path", where);
	for (const char *q = p;; q++) {
		if ((unsigned char)*q < 0x20 && *q)
			return fail(c, "%s: control character in path", where);
		if (*q == '/' || *q == '\0') {
			size_t n = (size_t)(q - comp);

			if (n == 0)
				return fail(c, "%s: empty path component", where);
			if ((n == 1 && comp[0] == '.') || (n == 2 && comp[0] == '.' && comp[1] == '.'))
				return fail(c, "%s: \".\" or \"..\" in path", where);
			if (n > HWFS_NAME_MAX)
				return fail(c, "%s: path component longer than %d bytes", where,
					    HWFS_NAME_MAX);
			if (!*q)
				break;
			comp = q + 1;
		}
	}
	return 0;
}

static int check_version_name(struct pctx *c, const char *s, size_t len)
{
	if (len == 0 || len > HWFS_NAME_MAX)
		return fail(c, "version name must be 1..%d bytes", HWFS_NAME_MAX);
	if (strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
		return fail(c, "version name is not usable as a directory name");
	for (const char *p = s; *p; p++)
		if ((unsigned char)*p < 0x20)
			return fail(c, "version name has a control character");
	return 0;
}

static int cmp_shard(const void *key, const void *elem)
{
	const struct shard *s = elem;

	return hwfs_hash_cmp(key, &s->hash);
}

static int parse_shards(struct pctx *c, json_t *arr, struct shard **out, size_t *n_out)
{
	size_t n = json_array_size(arr);
	struct shard *sh = NULL;
	char where[64];
	int rc = 0;

	if (n > MF_MAX_ENTRIES) {
		rc = fail(c, "too many shards");
		goto out;
	}
	sh = calloc(n ? n : 1, sizeof(*sh));
	if (!sh) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *p = json_array_get(arr, i);

		snprintf(where, sizeof(where), "shards[%zu]", i);
		if (!json_is_array(p) || json_array_size(p) != 2) {
			rc = fail(c, "%s: not a [hash, size] pair", where);
			goto out;
		}
		if ((rc = get_hash(c, where, json_array_get(p, 0), &sh[i].hash)) ||
		    (rc = get_u64(c, where, "size", json_array_get(p, 1), &sh[i].size)))
			goto out;
		if (sh[i].size == 0) {
			rc = fail(c, "%s: empty shard", where);
			goto out;
		}
		if (i && hwfs_hash_cmp(&sh[i - 1].hash, &sh[i].hash) >= 0) {
			rc = fail(c, "%s: shards not sorted by hash or not distinct", where);
			goto out;
		}
	}
	*out = sh;
	*n_out = n;
	sh = NULL;
out:
	free(sh);
	return rc;
}

static int parse_extents(struct pctx *c, const char *where, json_t *arr, struct hwfs_frec *f,
			 struct shard *sh, size_t n_sh)
{
	size_t n = json_array_size(arr);
	uint64_t pos = 0;

	if (n > MF_MAX_ENTRIES - c->total)
		return fail(c, "more than %u files, extents and tensors", MF_MAX_ENTRIES);
	c->total += n;
	if (n) {
		f->ext = calloc(n, sizeof(*f->ext));
		if (!f->ext)
			return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(arr, i);
		struct hwfs_extent *x = &f->ext[i];
		struct shard *s;
		int rc;

		if (!json_is_array(e) || json_array_size(e) != 3)
			return fail(c, "%s: extent %zu is not [offset, length, hash]", where, i);
		if ((rc = get_u64(c, where, "extent offset", json_array_get(e, 0), &x->off)) ||
		    (rc = get_u64(c, where, "extent length", json_array_get(e, 1), &x->len)) ||
		    (rc = get_hash(c, where, json_array_get(e, 2), &x->hash)))
			return rc;
		if (x->off != pos)
			return fail(c, "%s: extent %zu starts at %" PRIu64 ", expected %" PRIu64,
				    where, i, x->off, pos);
		if (x->len == 0)
			return fail(c, "%s: extent %zu is empty", where, i);
		if (x->len > f->size - pos)
			return fail(c, "%s: extents run past the size %" PRIu64, where, f->size);
		pos += x->len;
		s = bsearch(&x->hash, sh, n_sh, sizeof(*sh), cmp_shard);
		if (!s)
			return fail(c, "%s: extent %zu: shard missing from \"shards\"", where, i);
		if (s->size != x->len)
			return fail(c, "%s: extent %zu: length %" PRIu64 " but shard size %" PRIu64,
				    where, i, x->len, s->size);
		s->used = 1;
		f->n_ext++;
	}
	if (pos != f->size)
		return fail(c, "%s: extents cover %" PRIu64 " of %" PRIu64 " bytes", where, pos,
			    f->size);
	return 0;
}

static int parse_tensor(struct pctx *c, const char *where, json_t *o, const struct hwfs_frec *f,
			struct hwfs_trec *t)
{
	static const char *const keys[] = {"name", "dtype", "shape", "offset", "length", "hash",
					   NULL};
	const char *name = NULL, *dtype = NULL;
	json_t *shape;
	size_t nd;
	int rc;

	if (!json_is_object(o))
		return fail(c, "%s: not an object", where);
	if ((rc = only_keys(c, where, o, keys)) || (rc = get_str(c, where, o, "name", &name)) ||
	    (rc = get_str(c, where, o, "dtype", &dtype)) ||
	    (rc = get_u64(c, where, "offset", json_object_get(o, "offset"), &t->off)) ||
	    (rc = get_u64(c, where, "length", json_object_get(o, "length"), &t->len)) ||
	    (rc = get_hash(c, where, json_object_get(o, "hash"), &t->hash)))
		return rc;
	if (strlen(dtype) == 0 || strlen(dtype) >= sizeof(t->dtype))
		return fail(c, "%s: dtype must be 1..%zu characters", where, sizeof(t->dtype) - 1);
	strcpy(t->dtype, dtype);
	if (t->off > f->size || t->len > f->size - t->off)
		return fail(c, "%s: tensor [%" PRIu64 ", +%" PRIu64 ") outside the file of %" PRIu64
			    " bytes",
			    where, t->off, t->len, f->size);
	shape = json_object_get(o, "shape");
	if (!json_is_array(shape))
		return fail(c, "%s: \"shape\" missing or not an array", where);
	nd = json_array_size(shape);
	if (nd > MF_MAX_NDIM)
		return fail(c, "%s: more than %d dimensions", where, MF_MAX_NDIM);
	if (nd) {
		t->shape = calloc(nd, sizeof(*t->shape));
		if (!t->shape)
			return -ENOMEM;
	}
	t->ndim = (uint32_t)nd;
	for (size_t i = 0; i < nd; i++)
		if ((rc = get_u64(c, where, "dimension", json_array_get(shape, i), &t->shape[i])))
			return rc;
	t->name = strdup(name);
	return t->name ? 0 : -ENOMEM;
}

static int parse_tensors(struct pctx *c, const char *where, json_t *arr, struct hwfs_frec *f)
{
	uint64_t nz_end = 0; /* end of the non-empty tensors so far */
	size_t n;
	char w[96];

	if (!json_is_array(arr))
		return fail(c, "%s: \"tensors\" is not an array", where);
	n = json_array_size(arr);
	if (n > MF_MAX_ENTRIES - c->total)
		return fail(c, "more than %u files, extents and tensors", MF_MAX_ENTRIES);
	c->total += n;
	if (!n)
		return 0;
	f->tensors = calloc(n, sizeof(*f->tensors));
	if (!f->tensors)
		return -ENOMEM;
	f->n_tensors = n;
	for (size_t i = 0; i < n; i++) {
		int rc;

		snprintf(w, sizeof(w), "%s: tensors[%zu]", where, i);
		rc = parse_tensor(c, w, json_array_get(arr, i), f, &f->tensors[i]);
		if (rc)
			return rc;
		if (i && f->tensors[i].off < f->tensors[i - 1].off)
			return fail(c, "%s: tensors not sorted by offset", w);
		/* as a local safetensors header must not (safetensors.c): non-empty ones overlap */
		if (f->tensors[i].len && f->tensors[i].off < nz_end)
			return fail(c, "%s: overlaps the tensor before it", w);
		if (f->tensors[i].len) /* inside the file: parse_tensor() checked */
			nz_end = f->tensors[i].off + f->tensors[i].len;
	}
	return 0;
}

static int parse_file(struct pctx *c, size_t idx, json_t *o, const char *prev,
		      struct hwfs_frec *f, struct shard *sh, size_t n_sh)
{
	static const char *const k_dir[] = {"path", "kind", "mode", "mtime_ns", NULL};
	static const char *const k_lnk[] = {"path", "kind", "mode", "mtime_ns", "target", NULL};
	static const char *const k_reg[] = {"path",    "kind",    "mode",
					    "mtime_ns", "size",   "extents",
					    "tensors", "safetensors_error", NULL};
	const char *path = NULL, *kind = NULL, *s = NULL;
	char where[64];
	json_t *x = NULL;
	int64_t iv = 0;
	int rc;

	snprintf(where, sizeof(where), "files[%zu]", idx);
	if (!json_is_object(o))
		return fail(c, "%s: not an object", where);
	if ((rc = get_str(c, where, o, "path", &path)) ||
	    (rc = check_path(c, where, path, json_string_length(json_object_get(o, "path")))))
		return rc;
	if (prev && strcmp(prev, path) >= 0)
		return fail(c, "%s: files not sorted by path or not unique", where);
	if ((rc = get_str(c, where, o, "kind", &kind)))
		return rc;
	if (strcmp(kind, "file") == 0)
		f->kind = HWFS_K_REG;
	else if (strcmp(kind, "dir") == 0)
		f->kind = HWFS_K_DIR;
	else if (strcmp(kind, "symlink") == 0)
		f->kind = HWFS_K_LNK;
	else
		return fail(c, "%s: unknown kind", where);
	rc = only_keys(c, where, o,
		       f->kind == HWFS_K_REG ? k_reg : f->kind == HWFS_K_DIR ? k_dir : k_lnk);
	if (rc)
		return rc;
	if ((rc = int_in(c, where, "mode", json_object_get(o, "mode"), 0, 07777, &iv)))
		return rc;
	f->mode = (uint32_t)iv;
	if ((rc = int_in(c, where, "mtime_ns", json_object_get(o, "mtime_ns"), INT64_MIN,
			 INT64_MAX, &f->mtime_ns)))
		return rc;

	if (f->kind == HWFS_K_LNK) {
		if ((rc = get_str(c, where, o, "target", &s)))
			return rc;
		if (!*s || strlen(s) > MF_MAX_PATH)
			return fail(c, "%s: symlink target must be 1..%d bytes", where, MF_MAX_PATH);
		f->target = strdup(s);
		if (!f->target)
			return -ENOMEM;
	} else if (f->kind == HWFS_K_REG) {
		if ((rc = get_u64(c, where, "size", json_object_get(o, "size"), &f->size)))
			return rc;
		x = json_object_get(o, "extents");
		if (!json_is_array(x))
			return fail(c, "%s: \"extents\" missing or not an array", where);
		if ((rc = parse_extents(c, where, x, f, sh, n_sh)))
			return rc;
		x = json_object_get(o, "tensors");
		if (x && (rc = parse_tensors(c, where, x, f)))
			return rc;
		x = json_object_get(o, "safetensors_error");
		if (x) {
			if (!json_is_string(x))
				return fail(c, "%s: \"safetensors_error\" is not a string", where);
			f->st_error = strdup(json_string_value(x));
			if (!f->st_error)
				return -ENOMEM;
		}
	}
	f->path = strdup(path);
	return f->path ? 0 : -ENOMEM;
}

static int cmp_frec_path(const void *key, const void *elem)
{
	const struct hwfs_frec *f = elem;

	return strcmp(key, f->path);
}

/* No entry may sit below a path that is listed as something else than a dir. */
static int check_parents(struct pctx *c, const struct hwfs_vrec *v)
{
	char buf[MF_MAX_PATH + 1];

	for (size_t i = 0; i < v->n_files; i++) {
		const char *p = v->files[i].path;
		const char *q;

		for (q = strchr(p, '/'); q; q = strchr(q + 1, '/')) {
			const struct hwfs_frec *parent;
			size_t n = (size_t)(q - p);

			memcpy(buf, p, n);
			buf[n] = '\0';
			parent = bsearch(buf, v->files, i, sizeof(*v->files), cmp_frec_path);
			if (parent && parent->kind != HWFS_K_DIR)
				return fail(c, "files[%zu]: parent files[%zu] is not a directory", i,
					    (size_t)(parent - v->files));
		}
	}
	return 0;
}

int manifest_parse(const char *json, size_t len, struct hwfs_vrec **out, char *err,
		   size_t errlen)
{
	static const char *const k_root[] = {"format", "version", "files", "shards", NULL};
	struct pctx c = {.err = err, .errlen = errlen};
	struct hwfs_vrec *v = NULL;
	struct shard *sh = NULL;
	size_t n_sh = 0, n_files;
	json_t *root = NULL, *files, *shards;
	json_error_t jerr;
	const char *s = NULL, *name = NULL;
	int rc;

	if (err && errlen)
		err[0] = '\0';
	if (!json) {
		rc = fail(&c, "no input");
		goto out;
	}
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		rc = fail(&c, "invalid JSON at line %d column %d: %s", jerr.line, jerr.column,
			  jerr.text);
		goto out;
	}
	if (!json_is_object(root)) {
		rc = fail(&c, "manifest is not a JSON object");
		goto out;
	}
	if ((rc = only_keys(&c, "manifest", root, k_root)) ||
	    (rc = get_str(&c, "manifest", root, "format", &s)))
		goto out;
	if (strcmp(s, MANIFEST_FORMAT) != 0) {
		rc = fail(&c, "format is not \"" MANIFEST_FORMAT "\"");
		goto out;
	}
	if ((rc = get_str(&c, "manifest", root, "version", &name)) ||
	    (rc = check_version_name(&c, name,
				     json_string_length(json_object_get(root, "version")))))
		goto out;
	files = json_object_get(root, "files");
	shards = json_object_get(root, "shards");
	if (!json_is_array(files) || !json_is_array(shards)) {
		rc = fail(&c, "\"files\" or \"shards\" missing or not an array");
		goto out;
	}
	n_files = json_array_size(files);
	if (n_files > MF_MAX_ENTRIES) {
		rc = fail(&c, "more than %u files, extents and tensors", MF_MAX_ENTRIES);
		goto out;
	}
	c.total = n_files;
	if ((rc = parse_shards(&c, shards, &sh, &n_sh)))
		goto out;

	v = calloc(1, sizeof(*v));
	if (!v || !(v->name = strdup(name)) ||
	    (n_files && !(v->files = calloc(n_files, sizeof(*v->files))))) {
		rc = -ENOMEM;
		goto out;
	}
	v->n_files = n_files;
	for (size_t i = 0; i < n_files; i++) {
		rc = parse_file(&c, i, json_array_get(files, i), i ? v->files[i - 1].path : NULL,
				&v->files[i], sh, n_sh);
		if (rc)
			goto out;
	}
	if ((rc = check_parents(&c, v)))
		goto out;
	for (size_t i = 0; i < n_sh; i++)
		if (!sh[i].used) {
			rc = fail(&c, "shards[%zu]: not used by any extent", i);
			goto out;
		}

	v->state = HWFS_V_SEALED;
	hwfs_hash_buf(json, len, &v->digest);
	*out = v;
	v = NULL;
	rc = 0;
out:
	if (rc == -ENOMEM)
		fail(&c, "out of memory");
	hwfs_vrec_free(v);
	free(sh);
	json_decref(root);
	return rc;
}

static int cmp_ext_hash(const void *a, const void *b)
{
	return hwfs_hash_cmp(&((const struct hwfs_extent *)a)->hash,
			     &((const struct hwfs_extent *)b)->hash);
}

uint64_t manifest_shard_bytes(const struct hwfs_vrec *v)
{
	struct hwfs_extent *all;
	size_t n = 0, k = 0;
	uint64_t sum = 0;

	for (size_t i = 0; i < v->n_files; i++)
		n += v->files[i].n_ext;
	all = malloc((n ? n : 1) * sizeof(*all));
	if (!all)
		return 0;
	for (size_t i = 0; i < v->n_files; i++)
		for (size_t j = 0; j < v->files[i].n_ext; j++)
			all[k++] = v->files[i].ext[j];
	qsort(all, n, sizeof(*all), cmp_ext_hash);
	for (size_t i = 0; i < n; i++)
		if (i == 0 || hwfs_hash_cmp(&all[i].hash, &all[i - 1].hash))
			sum += all[i].len;
	free(all);
	return sum;
}
