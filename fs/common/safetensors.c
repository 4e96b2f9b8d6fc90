/*
 * safetensors.c — a strict, hostile-input-safe parser for the safetensors
 * header.
 *
 * A safetensors file is 8 bytes of little-endian N, N bytes of JSON and then
 * the data buffer.  hwfs parses the header of every *.safetensors file it
 * ingests so that shards can be cut at tensor boundaries (see chunker.c).
 * Anything that is not a well-formed file is simply stored as a plain file,
 * so the parser's job is to say "no" early, precisely and without ever
 * touching memory it was not given.
 *
 * Parsing runs in three passes:
 *
 *   1. framing: N is read little-endian, must be 1..ST_MAX_HEADER, the
 *      caller must have supplied all 8 + N bytes and byte 8 must be '{'.
 *      jansson then parses exactly those N bytes (trailing space padding is
 *      JSON whitespace) with JSON_REJECT_DUPLICATES; jansson also validates
 *      UTF-8 and refuses "\u0000" in strings.
 *   2. per entry: "__metadata__" must be an object of strings; every other
 *      key is a tensor whose value must be an object with a known "dtype",
 *      a "shape" of at most ST_MAX_NDIM non-negative JSON integers and
 *      "data_offsets" of two non-negative integers with begin <= end.  The
 *      byte length end - begin must equal product(shape) * bits / 8, all
 *      arithmetic overflow-checked; sub-byte dtypes must fill whole bytes.
 *      Unknown keys inside a tensor object are ignored, as the reference
 *      implementation does.
 *   3. layout: tensors are sorted by (offset, name) and walked once.  The
 *      ranges must tile [0, data_len): the first begins at 0 and each new
 *      offset equals the end of everything before it.  Zero-length tensors
 *      may share an offset with one non-empty tensor; two non-empty tensors
 *      at one offset overlap.
 *
 * The size check (data_start + data_len == file_size) is separate so that
 * ingest can parse the header as soon as it has arrived and check the size
 * once the writer is done (st_check_size()).
 *
 * Error messages are single lines: tensor names are quoted shortened to a
 * few dozen bytes and every control character in the final text is replaced
 * by '?', so hostile names cannot forge extra log lines.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

/* Longest tensor name quoted in an error message, in bytes. */
#define NAME_QUOTE_MAX 48

static const struct {
	const char *name;
	unsigned bits;
} dtypes[] = {
	{"BOOL", 8},	{"U8", 8},	 {"I8", 8},	  {"F8_E5M2", 8}, {"F8_E4M3", 8},
	{"F8_E8M0", 8}, {"I16", 16},	 {"U16", 16},	  {"F16", 16},	  {"BF16", 16},
	{"I32", 32},	{"U32", 32},	 {"F32", 32},	  {"F64", 64},	  {"I64", 64},
	{"U64", 64},	{"C64", 64},	 {"F4", 4},	  {"F6_E2M3", 6}, {"F6_E3M2", 6},
};

unsigned st_dtype_bits(const char *dtype)
{
	if (!dtype || strlen(dtype) > 15)
		return 0;
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(dtypes); i++)
		if (!strcmp(dtype, dtypes[i].name))
			return dtypes[i].bits;
	return 0;
}

/*
 * A tensor name fit for an error message: at most NAME_QUOTE_MAX bytes, cut
 * at a UTF-8 character boundary, with "..." when shortened.
 */
static const char *qname(const char *name, char buf[NAME_QUOTE_MAX + 4])
{
	size_t n = strlen(name);

	if (n <= NAME_QUOTE_MAX)
		return name;
	n = NAME_QUOTE_MAX;
	while (n > 0 && ((unsigned char)name[n] & 0xc0) == 0x80)
		n--;
	memcpy(buf, name, n);
	memcpy(buf + n, "...", 4);
	return buf;
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

int st_header_size(const uint8_t *buf, size_t len, uint64_t *total)
{
	uint64_t n;

	if (!buf || len < 8)
		return -EAGAIN;
	n = get_le64(buf);
	if (n == 0 || n > ST_MAX_HEADER)
		return -EINVAL;
	if (len < 9)
		return -EAGAIN;
	if (buf[8] != '{')
		return -EINVAL;
	*total = 8 + n;
	return 0;
}

void st_free(struct st_header *h)
{
	if (!h)
		return;
	for (size_t i = 0; i < h->n; i++) {
		free(h->t[i].name);
		free(h->t[i].shape);
	}
	free(h->t);
	free(h);
}

/* A JSON integer >= 0, as uint64.  Returns 0 or -EINVAL. */
static int get_uint(const json_t *v, uint64_t *out)
{
	json_int_t i;

	if (!json_is_integer(v))
		return -EINVAL;
	i = json_integer_value(v);
	if (i < 0)
		return -EINVAL;
	*out = (uint64_t)i;
	return 0;
}

static int check_metadata(const json_t *meta, char *err, size_t errlen)
{
	const char *key;
	json_t *val;
	char qb[NAME_QUOTE_MAX + 4];

	if (!json_is_object(meta)) {
		hwfs_set_err(err, errlen, "__metadata__ is not an object");
		return -EINVAL;
	}
	json_object_foreach((json_t *)meta, key, val) {
		if (!json_is_string(val)) {
			hwfs_set_err(err, errlen, "__metadata__ value of '%s' is not a string",
			             qname(key, qb));
			return -EINVAL;
		}
	}
	return 0;
}

/*
 * Validate one tensor entry and fill @t (name, dtype, shape, relative
 * offsets in off/len; the caller makes off absolute).  On failure @t owns
 * whatever was allocated so far and is freed by the caller.
 */
static int parse_tensor(const char *name, size_t name_len, const json_t *obj,
			struct st_tensor *t, char *err, size_t errlen)
{
	char qb[NAME_QUOTE_MAX + 4];
	const char *qn;
	json_t *dtype, *shape, *offs;
	const char *ds;
	unsigned bits;
	uint64_t count = 1, nbits, begin, end;
	size_t ndim;
	int zero = 0;

	if (name_len == 0) {
		hwfs_set_err(err, errlen, "empty tensor name");
		return -EINVAL;
	}
	if (strlen(name) != name_len) {
		hwfs_set_err(err, errlen, "tensor name contains a NUL byte");
		return -EINVAL;
	}
	qn = qname(name, qb);
	if (!json_is_object(obj)) {
		hwfs_set_err(err, errlen, "tensor '%s': entry is not an object", qn);
		return -EINVAL;
	}
	t->name = strdup(name);
	if (!t->name)
		return -ENOMEM;

	dtype = json_object_get(obj, "dtype");
	if (!json_is_string(dtype)) {
		hwfs_set_err(err, errlen, "tensor '%s': missing or non-string dtype", qn);
		return -EINVAL;
	}
	ds = json_string_value(dtype);
	bits = strlen(ds) == json_string_length(dtype) ? st_dtype_bits(ds) : 0;
	if (!bits) {
		char db[NAME_QUOTE_MAX + 4];

		hwfs_set_err(err, errlen, "tensor '%s': unknown dtype '%s'", qn, qname(ds, db));
		return -EINVAL;
	}
	strcpy(t->dtype, ds); /* known dtypes are at most 15 bytes */

	shape = json_object_get(obj, "shape");
	if (!json_is_array(shape)) {
		hwfs_set_err(err, errlen, "tensor '%s': missing or non-array shape", qn);
		return -EINVAL;
	}
	ndim = json_array_size(shape);
	if (ndim > ST_MAX_NDIM) {
		hwfs_set_err(err, errlen, "tensor '%s': %zu dimensions (limit %d)", qn, ndim,
		             ST_MAX_NDIM);
		return -EINVAL;
	}
	if (ndim) {
		t->shape = calloc(ndim, sizeof(*t->shape));
		if (!t->shape)
			return -ENOMEM;
	}
	t->ndim = (uint32_t)ndim;
	for (size_t i = 0; i < ndim; i++) {
		if (get_uint(json_array_get(shape, i), &t->shape[i])) {
			hwfs_set_err(err, errlen,
			             "tensor '%s': shape[%zu] is not a non-negative integer", qn,
			             i);
			return -EINVAL;
		}
		if (t->shape[i] == 0)
			zero = 1;
	}
	/* An empty dimension makes the product 0 whatever the others are. */
	if (zero) {
		count = 0;
	} else {
		for (size_t i = 0; i < ndim; i++) {
			if (__builtin_mul_overflow(count, t->shape[i], &count)) {
				hwfs_set_err(err, errlen,
				             "tensor '%s': shape element count overflows", qn);
				return -EINVAL;
			}
		}
	}
	if (__builtin_mul_overflow(count, (uint64_t)bits, &nbits)) {
		hwfs_set_err(err, errlen, "tensor '%s': shape byte size overflows", qn);
		return -EINVAL;
	}
	if (nbits % 8) {
		hwfs_set_err(err, errlen,
		             "tensor '%s': %llu elements of %s do not fill whole bytes", qn,
		             (unsigned long long)count, t->dtype);
		return -EINVAL;
	}

	offs = json_object_get(obj, "data_offsets");
	if (!json_is_array(offs) || json_array_size(offs) != 2 ||
	    get_uint(json_array_get(offs, 0), &begin) ||
	    get_uint(json_array_get(offs, 1), &end)) {
		hwfs_set_err(err, errlen,
		             "tensor '%s': data_offsets is not two non-negative integers", qn);
		return -EINVAL;
	}
	if (begin > end) {
		hwfs_set_err(err, errlen, "tensor '%s': data_offsets begin %llu > end %llu", qn,
		             (unsigned long long)begin, (unsigned long long)end);
		return -EINVAL;
	}
	if (end - begin != nbits / 8) {
		hwfs_set_err(err, errlen,
		             "tensor '%s': data_offsets span %llu bytes, dtype and shape need %llu",
		             qn, (unsigned long long)(end - begin),
		             (unsigned long long)(nbits / 8));
		return -EINVAL;
	}
	t->off = begin;
	t->len = end - begin;
	return 0;
}

static int cmp_tensor(const void *a, const void *b)
{
	const struct st_tensor *x = a, *y = b;

	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return strcmp(x->name, y->name);
}

/*
 * Check that the (sorted, relative) ranges tile [0, end) and return end in
 * @data_len.  Tensors sharing an offset form a group: at most one of them
 * is non-empty, and every group starts where the previous one ended.
 */
static int check_layout(const struct st_header *h, uint64_t *data_len, char *err,
			size_t errlen)
{
	char qa[NAME_QUOTE_MAX + 4], qb[NAME_QUOTE_MAX + 4];
	uint64_t cursor = 0;
	const char *last_nz = NULL;  /* non-empty tensor that ends at cursor */
	const char *group_nz = NULL; /* non-empty tensor of the current group */

	for (size_t i = 0; i < h->n; i++) {
		const struct st_tensor *t = &h->t[i];

		if (i > 0 && t->off == h->t[i - 1].off) {
			if (!t->len)
				continue;
			if (group_nz) {
				hwfs_set_err(err, errlen, "tensors '%s' and '%s' overlap",
				             qname(group_nz, qa), qname(t->name, qb));
				return -EINVAL;
			}
		} else {
			if (t->off < cursor) {
				hwfs_set_err(err, errlen, "tensors '%s' and '%s' overlap",
				             qname(last_nz, qa), qname(t->name, qb));
				return -EINVAL;
			}
			if (t->off > cursor) {
				if (!last_nz)
					hwfs_set_err(err, errlen,
					             "tensor data does not start at offset 0: '%s' "
					             "begins at %llu",
					             qname(t->name, qb),
					             (unsigned long long)t->off);
				else
					hwfs_set_err(
					    err, errlen,
					    "gap of %llu bytes between tensors '%s' and '%s'",
					    (unsigned long long)(t->off - cursor),
					    qname(last_nz, qa), qname(t->name, qb));
				return -EINVAL;
			}
			group_nz = NULL;
			if (!t->len)
				continue;
		}
		group_nz = t->name;
		last_nz = t->name;
		cursor = t->off + t->len; /* cannot wrap: both came from int64 */
	}
	*data_len = cursor;
	return 0;
}

int st_check_size(const struct st_header *h, uint64_t file_size, char *err, size_t errlen)
{
	uint64_t need;

	if (!h)
		return -EINVAL;
	if (__builtin_add_overflow(h->data_start, h->data_len, &need)) {
		hwfs_set_err(err, errlen, "tensor data end overflows");
		return -EINVAL;
	}
	if (file_size < need) {
		hwfs_set_err(err, errlen, "truncated data: file is %llu bytes, tensors need %llu",
		             (unsigned long long)file_size, (unsigned long long)need);
		return -EINVAL;
	}
	if (file_size > need) {
		hwfs_set_err(err, errlen, "trailing bytes after tensor data: %llu extra",
		             (unsigned long long)(file_size - need));
		return -EINVAL;
	}
	return 0;
}

int st_parse(const uint8_t *buf, size_t len, uint64_t file_size, struct st_header **out,
	     char *err, size_t errlen)
{
	struct st_header *h = NULL;
	json_t *root = NULL, *val;
	json_error_t jerr;
	const char *key;
	uint64_t n, total;
	size_t cap;
	int ret;

	if (!buf || len < 8) {
		hwfs_set_err(err, errlen, "file shorter than the 8-byte header length");
		return -EINVAL;
	}
	n = get_le64(buf);
	if (n == 0) {
		hwfs_set_err(err, errlen, "header length is 0");
		return -EINVAL;
	}
	if (n > ST_MAX_HEADER) {
		hwfs_set_err(err, errlen, "header length %llu exceeds limit",
		             (unsigned long long)n);
		return -EINVAL;
	}
	total = 8 + n;
	if (len < total) {
		hwfs_set_err(err, errlen, "header incomplete: %llu of %llu bytes",
		             (unsigned long long)len, (unsigned long long)total);
		return -EINVAL;
	}
	if (buf[8] != '{') {
		hwfs_set_err(err, errlen, "header does not start with '{'");
		return -EINVAL;
	}

	root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		if (json_error_code(&jerr) == json_error_out_of_memory) {
			ret = -ENOMEM;
			goto out;
		}
		hwfs_set_err(err, errlen, "invalid JSON header: %s (offset %d)", jerr.text,
		             jerr.position);
		ret = -EINVAL;
		goto out;
	}
	if (!json_is_object(root)) {
		hwfs_set_err(err, errlen, "header is not a JSON object");
		ret = -EINVAL;
		goto out;
	}

	ret = -ENOMEM;
	h = calloc(1, sizeof(*h));
	if (!h)
		goto out;
	h->header_len = n;
	h->data_start = total;
	cap = json_object_size(root);
	if (cap) {
		h->t = calloc(cap, sizeof(*h->t));
		if (!h->t)
			goto out;
	}

	json_object_foreach(root, key, val) {
		size_t klen = json_object_iter_key_len(json_object_key_to_iter(key));

		if (klen == 12 && !memcmp(key, "__metadata__", 12)) {
			ret = check_metadata(val, err, errlen);
			if (ret)
				goto out;
			continue;
		}
		/* Count first so that st_free() frees a half-built entry. */
		h->n++;
		ret = parse_tensor(key, klen, val, &h->t[h->n - 1], err, errlen);
		if (ret)
			goto out;
	}

	if (h->n)
		qsort(h->t, h->n, sizeof(*h->t), cmp_tensor);
	ret = check_layout(h, &h->data_len, err, errlen);
	if (ret)
		goto out;
	if (__builtin_add_overflow(h->data_start, h->data_len, &total)) {
		hwfs_set_err(err, errlen, "tensor data end overflows");
		ret = -EINVAL;
		goto out;
	}
	for (size_t i = 0; i < h->n; i++)
		h->t[i].off += h->data_start; /* off <= data_len: cannot wrap */
	if (file_size != UINT64_MAX) {
		ret = st_check_size(h, file_size, err, errlen);
		if (ret)
			goto out;
	}
	*out = h;
	h = NULL;
	ret = 0;
out:
	if (ret == -ENOMEM)
		hwfs_set_err(err, errlen, "out of memory");
	st_free(h);
	json_decref(root);
	return ret;
}
