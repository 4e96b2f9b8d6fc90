/*
 * test_manifest.c — the canonical manifest: build -> parse -> build gives the
 * same bytes, the digest depends on content only, keys come out in canonical
 * order, and the decoder rejects each kind of malformed input with -EINVAL
 * and a reason.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manifest.h"
#include "vrec.h"

/* ---- a realistic version (same shape as in test_index.c) ---- */

static struct hwfs_vrec *make_vrec(const char *name)
{
	struct hwfs_vrec *v = calloc(1, sizeof(*v));
	struct hwfs_frec *f;

	assert_non_null(v);
	v->name = strdup(name);
	v->state = HWFS_V_SEALED;
	v->seq = 3;
	v->created_ns = 1700000000123456789LL;
	v->sealed_ns = 1700000001987654321LL;
	v->n_files = 6;
	v->files = calloc(v->n_files, sizeof(*v->files));
	assert_non_null(v->files);

	f = &v->files[0];
	f->path = strdup("bad.safetensors");
	f->kind = HWFS_K_REG;
	f->mode = 0644;
	f->uid = 1000;
	f->gid = 1000;
	f->mtime_ns = 1690000000000000001LL;
	set_ext(f, 1, (uint64_t[]){10}, (hwfs_hash_t[]){H(name, "bad")});
	f->st_error = strdup("header length 999 exceeds the file (10 bytes)");

	f = &v->files[1];
	f->path = strdup("data.bin");
	f->kind = HWFS_K_REG;
	f->mode = 0600;
	f->mtime_ns = -1234567890123LL;
	set_ext(f, 3, (uint64_t[]){100, 150, 50},
		(hwfs_hash_t[]){H(name, "d0"), H(NULL, "shared"), H(name, "d2")});

	f = &v->files[2];
	f->path = strdup("dir");
	f->kind = HWFS_K_DIR;
	f->mode = 0755;
	f->mtime_ns = 42;

	f = &v->files[3];
	f->path = strdup("dir-x");
	f->kind = HWFS_K_REG;
	f->mode = 04755;
	f->mtime_ns = 43;

	f = &v->files[4];
	f->path = strdup("dir/link");
	f->kind = HWFS_K_LNK;
	f->mode = 0777;
	f->mtime_ns = 44;
	f->target = strdup("../model.safetensors");

	f = &v->files[5];
	f->path = strdup("model.safetensors");
	f->kind = HWFS_K_REG;
	f->mode = 0444;
	f->mtime_ns = 45;
	/* The shard "shared" again, so "shards" must deduplicate it. */
	set_ext(f, 3, (uint64_t[]){120, 150, 80},
		(hwfs_hash_t[]){H(name, "m0"), H(NULL, "shared"), H(name, "m1")});
	f->n_tensors = 2;
	f->tensors = calloc(2, sizeof(*f->tensors));
	assert_non_null(f->tensors);
	f->tensors[0].name = strdup("model.layers.0.weight");
	strcpy(f->tensors[0].dtype, "BF16");
	f->tensors[0].ndim = 2;
	f->tensors[0].shape = calloc(2, sizeof(uint64_t));
	f->tensors[0].shape[0] = 4096;
	f->tensors[0].shape[1] = 4096;
	f->tensors[0].off = 100;
	f->tensors[0].len = 12;
	f->tensors[0].hash = H(name, "t0");
	f->tensors[1].name = strdup("scale \"quoted\" \xc3\xa9");
	strcpy(f->tensors[1].dtype, "F8_E4M3FNUZ_XYZ"); /* 15 chars: the limit */
	f->tensors[1].ndim = 0;
	f->tensors[1].off = 350;
	f->tensors[1].len = 0; /* empty tensor at the very end */
	f->tensors[1].hash = H(name, "t1");
	return v;
}

static void assert_hash_equal(const hwfs_hash_t *a, const hwfs_hash_t *b)
{
	assert_memory_equal(a->b, b->b, HWFS_HASH_LEN);
}

static void assert_nstr_equal(const char *a, const char *b)
{
	if (!a || !b)
		assert_ptr_equal(a, b);
	else
		assert_string_equal(a, b);
}

/* Everything the manifest carries. */
static void assert_content_equal(const struct hwfs_vrec *a, const struct hwfs_vrec *b)
{
	assert_string_equal(a->name, b->name);
	assert_int_equal(a->n_files, b->n_files);
	for (size_t i = 0; i < a->n_files; i++) {
		const struct hwfs_frec *x = &a->files[i], *y = &b->files[i];

		assert_string_equal(x->path, y->path);
		assert_int_equal(x->kind, y->kind);
		assert_int_equal(x->mode, y->mode);
		assert_true(x->mtime_ns == y->mtime_ns);
		assert_true(x->size == y->size);
		assert_nstr_equal(x->target, y->target);
		assert_nstr_equal(x->st_error, y->st_error);
		assert_int_equal(x->n_ext, y->n_ext);
		for (size_t j = 0; j < x->n_ext; j++) {
			assert_true(x->ext[j].off == y->ext[j].off);
			assert_true(x->ext[j].len == y->ext[j].len);
			assert_hash_equal(&x->ext[j].hash, &y->ext[j].hash);
		}
		assert_int_equal(x->n_tensors, y->n_tensors);
		for (size_t j = 0; j < x->n_tensors; j++) {
			const struct hwfs_trec *s = &x->tensors[j], *t = &y->tensors[j];

			assert_string_equal(s->name, t->name);
			assert_string_equal(s->dtype, t->dtype);
			assert_int_equal(s->ndim, t->ndim);
			if (s->ndim)
				assert_memory_equal(s->shape, t->shape, s->ndim * sizeof(uint64_t));
			else
				assert_null(t->shape);
			assert_true(s->off == t->off);
			assert_true(s->len == t->len);
			assert_hash_equal(&s->hash, &t->hash);
		}
	}
}

/* ---- build / parse ---- */

static void test_roundtrip(void **state)
{
	struct hwfs_vrec *v = make_vrec("llama-7b@v1"), *p = NULL, *q = NULL;
	char *j1 = NULL, *j2 = NULL, err[256] = "";
	size_t l1 = 0, l2 = 0;
	hwfs_hash_t h;

	assert_int_equal(manifest_build(v, &j1, &l1), 0);
	assert_int_equal(strlen(j1), l1);
	assert_int_equal(manifest_parse(j1, l1, &p, err, sizeof(err)), 0);
	assert_string_equal(err, "");
	assert_content_equal(v, p);
	assert_int_equal(p->state, HWFS_V_SEALED);
	assert_true(p->seq == 0);
	assert_int_equal(p->files[0].uid, 0);
	assert_int_equal(p->files[0].gid, 0);
	hwfs_hash_buf(j1, l1, &h);
	assert_hash_equal(&p->digest, &h);

	assert_int_equal(manifest_build(p, &j2, &l2), 0);
	assert_int_equal(l1, l2);
	assert_memory_equal(j1, j2, l1);

	/* Parsing does not need a NUL after the bytes. */
	j1[l1] = '}';
	assert_int_equal(manifest_parse(j1, l1, &q, err, sizeof(err)), 0);
	hwfs_vrec_free(q);

	free(j1);
	free(j2);
	hwfs_vrec_free(p);
	hwfs_vrec_free(v);
}

static void test_digest(void **state)
{
	struct hwfs_vrec *v = make_vrec("v");
	hwfs_hash_t d1, d2, d3, h;
	char *j = NULL;
	size_t l = 0;

	assert_int_equal(manifest_digest(v, &d1), 0);
	assert_int_equal(manifest_digest(v, &d2), 0);
	assert_hash_equal(&d1, &d2);
	assert_int_equal(manifest_build(v, &j, &l), 0);
	hwfs_hash_buf(j, l, &h);
	assert_hash_equal(&d1, &h);
	free(j);

	/* Node-local facts do not count. */
	v->files[1].uid = 77;
	v->files[2].gid = 88;
	v->seq = 1234;
	v->created_ns = 1;
	v->sealed_ns = 2;
	v->state = HWFS_V_DAMAGED;
	assert_int_equal(manifest_digest(v, &d2), 0);
	assert_hash_equal(&d1, &d2);

	/* One byte of one hash does (extent hash and its shard entry). */
	v->files[0].ext[0].hash.b[7] ^= 1;
	assert_int_equal(manifest_digest(v, &d3), 0);
	assert_memory_not_equal(d1.b, d3.b, HWFS_HASH_LEN);
	v->files[0].ext[0].hash.b[7] ^= 1;
	assert_int_equal(manifest_digest(v, &d2), 0);
	assert_hash_equal(&d1, &d2);

	/* So does a tensor hash, a mode bit and an mtime. */
	v->files[5].tensors[1].hash.b[15] ^= 0x80;
	assert_int_equal(manifest_digest(v, &d3), 0);
	assert_memory_not_equal(d1.b, d3.b, HWFS_HASH_LEN);
	v->files[5].tensors[1].hash.b[15] ^= 0x80;
	v->files[2].mode = 0700;
	assert_int_equal(manifest_digest(v, &d3), 0);
	assert_memory_not_equal(d1.b, d3.b, HWFS_HASH_LEN);
	v->files[2].mode = 0755;
	v->files[4].mtime_ns++;
	assert_int_equal(manifest_digest(v, &d3), 0);
	assert_memory_not_equal(d1.b, d3.b, HWFS_HASH_LEN);
	hwfs_vrec_free(v);
}

static void test_canonical_bytes(void **state)
{
	struct hwfs_vrec v = {0};
	struct hwfs_frec f[3] = {0};
	struct hwfs_extent e[2];
	char hx[2][HWFS_HASH_HEX], want[1024], *j = NULL;
	size_t l = 0;

	e[0].off = 0;
	e[0].len = 3;
	e[0].hash = H("c", "x");
	e[1].off = 3;
	e[1].len = 4;
	e[1].hash = H("c", "y");
	hwfs_hash_hex(&e[0].hash, hx[0]);
	hwfs_hash_hex(&e[1].hash, hx[1]);

	/* Deliberately out of order, with file-type bits in a mode. */
	f[0].path = "s";
	f[0].kind = HWFS_K_LNK;
	f[0].mode = 0120777;
	f[0].mtime_ns = 9;
	f[0].target = "f";
	f[1].path = "f";
	f[1].kind = HWFS_K_REG;
	f[1].mode = 0644;
	f[1].mtime_ns = -7;
	f[1].size = 7;
	f[1].n_ext = 2;
	f[1].ext = e;
	f[2].path = "d";
	f[2].kind = HWFS_K_DIR;
	f[2].mode = 0755;
	f[2].mtime_ns = 5;
	v.name = "v1";
	v.n_files = 3;
	v.files = f;

	assert_int_equal(manifest_build(&v, &j, &l), 0);
	if (strcmp(hx[0], hx[1]) < 0)
		snprintf(want, sizeof(want),
			 "{\"files\":[{\"kind\":\"dir\",\"mode\":493,\"mtime_ns\":5,\"path\":\"d\"},"
			 "{\"extents\":[[0,3,\"%s\"],[3,4,\"%s\"]],\"kind\":\"file\",\"mode\":420,"
			 "\"mtime_ns\":-7,\"path\":\"f\",\"size\":7},"
			 "{\"kind\":\"symlink\",\"mode\":511,\"mtime_ns\":9,\"path\":\"s\",\"target\":\"f\"}],"
			 "\"format\":\"hwfs-manifest/1\",\"shards\":[[\"%s\",3],[\"%s\",4]],"
			 "\"version\":\"v1\"}",
			 hx[0], hx[1], hx[0], hx[1]);
	else
		snprintf(want, sizeof(want),
			 "{\"files\":[{\"kind\":\"dir\",\"mode\":493,\"mtime_ns\":5,\"path\":\"d\"},"
			 "{\"extents\":[[0,3,\"%s\"],[3,4,\"%s\"]],\"kind\":\"file\",\"mode\":420,"
			 "\"mtime_ns\":-7,\"path\":\"f\",\"size\":7},"
			 "{\"kind\":\"symlink\",\"mode\":511,\"mtime_ns\":9,\"path\":\"s\",\"target\":\"f\"}],"
			 "\"format\":\"hwfs-manifest/1\",\"shards\":[[\"%s\",4],[\"%s\",3]],"
			 "\"version\":\"v1\"}",
			 hx[0], hx[1], hx[1], hx[0]);
	assert_string_equal(j, want);
	assert_int_equal(l, strlen(want));
	free(j);
}

#define PFX "\"path\":\"bad.safetensors\",\"safetensors_error\":\"header"

static void test_canonical_keys(void **state)
{
	struct hwfs_vrec *v = make_vrec("k");
	char *j = NULL, *t, *s;
	size_t l = 0;

	assert_int_equal(manifest_build(v, &j, &l), 0);
	/* Top level, a safetensors file and a tensor: keys in strcmp order. */
	assert_true(strncmp(j, "{\"files\":[{\"extents\":", 20) == 0);
	assert_non_null(strstr(j, "],\"format\":\"hwfs-manifest/1\",\"shards\":[[\""));
	assert_non_null(strstr(j, "]],\"version\":\"k\"}"));
	assert_int_equal(j[l - 1], '}');
	s = strstr(j, "\"path\":\"bad.safetensors\"");
	assert_non_null(s);
	assert_true(strncmp(s, PFX, sizeof(PFX) - 1) == 0);
	t = strstr(j, "\"tensors\":[{\"dtype\":\"BF16\",\"hash\":\"");
	assert_non_null(t);
	assert_non_null(strstr(t, "\",\"length\":12,\"name\":\"model.layers.0.weight\","
				  "\"offset\":100,\"shape\":[4096,4096]}"));
	assert_non_null(strstr(t, "\"name\":\"scale \\\"quoted\\\" \xc3\xa9\",\"offset\":350,"
				  "\"shape\":[]}]}"));
	assert_null(strstr(j, "\", \"")); /* compact: no ", " or ": " */
	assert_null(strstr(j, "\": "));
	assert_null(strstr(j, "uid"));
	assert_null(strstr(j, "seq"));
	/* The shared shard is listed once. */
	{
		char hx[HWFS_HASH_HEX], pat[64];
		hwfs_hash_t sh = H(NULL, "shared");

		hwfs_hash_hex(&sh, hx);
		snprintf(pat, sizeof(pat), "[\"%s\",150]", hx);
		s = strstr(j, pat);
		assert_non_null(s);
		assert_null(strstr(s + 1, pat));
	}
	free(j);
	hwfs_vrec_free(v);
}

static void test_unsorted_input(void **state)
{
	struct hwfs_vrec *v = make_vrec("u");
	char *j1 = NULL, *j2 = NULL;
	size_t l1 = 0, l2 = 0;

	assert_int_equal(manifest_build(v, &j1, &l1), 0);
	for (size_t i = 0; i < v->n_files / 2; i++) {
		struct hwfs_frec t = v->files[i];

		v->files[i] = v->files[v->n_files - 1 - i];
		v->files[v->n_files - 1 - i] = t;
	}
	assert_int_equal(manifest_build(v, &j2, &l2), 0);
	assert_int_equal(l1, l2);
	assert_memory_equal(j1, j2, l1);
	free(j1);
	free(j2);
	hwfs_vrec_free(v);
}

static void test_build_errors(void **state)
{
	struct hwfs_vrec *v = make_vrec("e");
	char *j = (char *)0x1;
	size_t l = 0;
	char *saved;

	v->files[3].size = (uint64_t)INT64_MAX + 1;
	assert_int_equal(manifest_build(v, &j, &l), -EOVERFLOW);
	v->files[3].size = 0;

	saved = v->files[2].path;
	v->files[2].path = "bad\xff";
	assert_int_equal(manifest_build(v, &j, &l), -EINVAL);
	v->files[2].path = "data.bin"; /* twice */
	assert_int_equal(manifest_build(v, &j, &l), -EINVAL);
	v->files[2].path = saved;

	v->files[5].ext[1].len++; /* "shared" with two sizes */
	assert_int_equal(manifest_build(v, &j, &l), -EINVAL);
	v->files[5].ext[1].len--;

	v->files[2].kind = (enum hwfs_kind)9;
	assert_int_equal(manifest_build(v, &j, &l), -EINVAL);
	v->files[2].kind = HWFS_K_DIR;
	assert_ptr_equal(j, (char *)0x1);

	assert_int_equal(manifest_build(v, &j, &l), 0);
	free(j);
	hwfs_vrec_free(v);
}

/* ---- decoder ---- */

#define HA "0123456789abcdef0123456789abcdef"
#define HB "1123456789abcdef0123456789abcdef"
#define HC "2123456789abcdef0123456789abcdef"

static const char base[] =
	"{\"files\":[{\"kind\":\"dir\",\"mode\":493,\"mtime_ns\":1,\"path\":\"d\"},"
	"{\"extents\":[[0,3,\"" HA "\"],[3,2,\"" HB "\"]],\"kind\":\"file\",\"mode\":420,"
	"\"mtime_ns\":2,\"path\":\"d/f\",\"size\":5,\"tensors\":[{\"dtype\":\"U8\",\"hash\":\"" HC
	"\",\"length\":2,\"name\":\"t\",\"offset\":1,\"shape\":[2]}]},"
	"{\"kind\":\"symlink\",\"mode\":511,\"mtime_ns\":3,\"path\":\"l\",\"target\":\"d/f\"}],"
	"\"format\":\"hwfs-manifest/1\",\"shards\":[[\"" HA "\",3],[\"" HB "\",2]],"
	"\"version\":\"v1\"}";

/* @base with the first @from replaced by @to (malloc'd). */
static char *subst(const char *from, const char *to)
{
	const char *p = strstr(base, from);
	size_t n = strlen(base) - strlen(from) + strlen(to) + 1;
	char *s;

	assert_non_null(p);
	s = malloc(n);
	assert_non_null(s);
	snprintf(s, n, "%.*s%s%s", (int)(p - base), base, to, p + strlen(from));
	return s;
}

static void test_parse_base(void **state)
{
	struct hwfs_vrec *v = NULL;
	char err[256] = "x", *j = NULL;
	size_t l = 0;

	assert_int_equal(manifest_parse(base, strlen(base), &v, err, sizeof(err)), 0);
	assert_string_equal(v->name, "v1");
	assert_int_equal(v->n_files, 3);
	assert_int_equal(v->files[1].kind, HWFS_K_REG);
	assert_int_equal(v->files[1].n_ext, 2);
	assert_int_equal(v->files[1].n_tensors, 1);
	assert_int_equal(v->files[1].tensors[0].shape[0], 2);
	assert_string_equal(v->files[2].target, "d/f");
	assert_null(v->files[1].st_error);
	/* The canonical base rebuilds to itself. */
	assert_int_equal(manifest_build(v, &j, &l), 0);
	assert_string_equal(j, base);
	free(j);
	hwfs_vrec_free(v);
}

static void test_parse_noncanonical(void **state)
{
	static const char in[] =
		"{ \"version\": \"v1\", \"format\": \"hwfs-manifest/1\",\n"
		"  \"shards\": [],\n"
		"  \"files\": [ {\"path\": \"e\", \"kind\": \"file\", \"mode\": 0, "
		"\"mtime_ns\": 0, \"size\": 0, \"extents\": [], \"tensors\": []} ] }\n";
	struct hwfs_vrec *v = NULL;
	char err[128], *j = NULL;
	size_t l = 0;
	hwfs_hash_t h;

	assert_int_equal(manifest_parse(in, strlen(in), &v, err, sizeof(err)), 0);
	hwfs_hash_buf(in, strlen(in), &h);
	assert_hash_equal(&v->digest, &h);
	assert_int_equal(manifest_build(v, &j, &l), 0);
	assert_string_equal(j, "{\"files\":[{\"extents\":[],\"kind\":\"file\",\"mode\":0,"
			       "\"mtime_ns\":0,\"path\":\"e\",\"size\":0}],"
			       "\"format\":\"hwfs-manifest/1\",\"shards\":[],\"version\":\"v1\"}");
	free(j);
	hwfs_vrec_free(v);
}

struct bad {
	const char *from, *to, *why;
};

static const struct bad bads[] = {
	/* JSON itself */
	{"{\"files\"", "{{\"files\"", "invalid JSON"},
	{"\"version\":\"v1\"}", "\"version\":\"v1\"}x", "invalid JSON"},
	{"\"version\":\"v1\"", "\"version\":\"v1\",\"version\":\"v2\"", "invalid JSON"},
	{"\"path\":\"l\"", "\"path\":\"l\\u0000x\"", "invalid JSON"},
	/* root */
	{"hwfs-manifest/1", "hwfs-manifest/2", "format"},
	{"\"version\":\"v1\"", "\"version\":\"..\"", "version name"},
	{"\"version\":\"v1\"", "\"version\":\"a/b\"", "version name"},
	{"\"version\":\"v1\"", "\"version\":\"\"", "version name"},
	{"\"version\":\"v1\"", "\"version\":\"v\\n1\"", "control character"},
	{"\"version\":\"v1\"", "\"version\":1", "version"},
	{",\"version\":\"v1\"", "", "version"},
	{"\"shards\":", "\"extra\":1,\"shards\":", "unknown key"},
	/* paths */
	{"\"path\":\"l\"", "\"path\":\"../x\"", "\"..\""},
	{"\"path\":\"l\"", "\"path\":\"l/..\"", "\"..\""},
	{"\"path\":\"l\"", "\"path\":\"/l\"", "absolute"},
	{"\"path\":\"l\"", "\"path\":\"l\\u0001\"", "control character"},
	{"\"path\":\"d/f\"", "\"path\":\"d//f\"", "empty path component"},
	{"\"path\":\"d/f\"", "\"path\":\"d/./f\"", "\".\""},
	{"\"path\":\"l\"", "\"path\":\"l/\"", "empty path component"},
	{"\"path\":\"d\"", "\"path\":\"\"", "empty path"},
	{"\"path\":\"l\"", "\"path\":\"a\"", "not sorted"},
	{"\"path\":\"l\"", "\"path\":\"d/f\"", "not unique"},
	{"\"path\":\"l\"", "\"path\":5", "path"},
	{"\"target\":\"d/f\"}", "\"target\":\"d/f\"},{\"kind\":\"dir\",\"mode\":493,"
				  "\"mtime_ns\":1,\"path\":\"l/x\"}",
	 "not a directory"},
	/* entries */
	{"\"kind\":\"symlink\"", "\"kind\":\"fifo\"", "unknown kind"},
	{"\"mode\":511", "\"mode\":4096", "mode"},
	{"\"mode\":511", "\"mode\":-1", "mode"},
	{"\"mtime_ns\":1,", "\"mtime_ns\":1.5,", "mtime_ns"},
	{"\"mtime_ns\":1,", "", "mtime_ns"},
	{"\"kind\":\"dir\",", "\"kind\":\"dir\",\"uid\":0,", "unknown key"},
	{"\"kind\":\"dir\",", "\"kind\":\"dir\",\"size\":0,", "unknown key"},
	{",\"target\":\"d/f\"", "", "target"},
	{"\"target\":\"d/f\"", "\"target\":\"\"", "target"},
	{"{\"kind\":\"dir\"", "[{\"kind\":\"dir\"", "invalid JSON"},
	{"\"files\":[{", "\"files\":[7,{", "not an object"},
	/* extents */
	{"[3,2,\"" HB "\"]", "[4,2,\"" HB "\"]", "starts at 4"},
	{"\"size\":5", "\"size\":6", "cover 5 of 6"},
	{"\"size\":5", "\"size\":4", "past the size"},
	{"\"size\":5", "\"size\":-5", "size"},
	{"[3,2,\"" HB "\"]", "[3,0,\"" HB "\"],[3,2,\"" HB "\"]", "empty"},
	{"[3,2,\"" HB "\"]", "[3,2]", "extent 1"},
	{"[3,2,\"" HB "\"]", "[3,2,\"" HB "0\"]", "32 hex"},
	{"[3,2,\"" HB "\"]", "[3,2,\"" "1123456789abcdef0123456789abcdeg" "\"]", "hex"},
	{"[3,2,\"" HB "\"]", "[3,2,\"" "1123456789ABCDEF0123456789abcdef" "\"]", "lowercase"},
	{"\"extents\":[", "\"extents\":{},\"x\":[", "unknown key"},
	{",\"size\":5", "", "size"},
	/* shards */
	{",[\"" HB "\",2]", "", "shard missing"},
	{"[\"" HB "\",2]", "[\"" HB "\",2],[\"" HC "\",1]", "not used"},
	{"[\"" HB "\",2]", "[\"" HB "\",7]", "shard size 7"},
	{"[[\"" HA "\",3],[\"" HB "\",2]]", "[[\"" HB "\",2],[\"" HA "\",3]]", "not sorted"},
	{"[[\"" HA "\",3],", "[[\"" HA "\",3],[\"" HA "\",3],", "not sorted"},
	{"[\"" HB "\",2]", "[\"" HB "\",0]", "empty shard"},
	{"[\"" HB "\",2]", "[\"" HB "\"]", "pair"},
	/* tensors */
	{"\"offset\":1", "\"offset\":4", "outside"},
	{"\"length\":2", "\"length\":6", "outside"},
	{"\"dtype\":\"U8\"", "\"dtype\":\"ABCDEFGHIJKLMNOP\"", "dtype"},
	{"\"dtype\":\"U8\"", "\"dtype\":\"\"", "dtype"},
	{"\"shape\":[2]", "\"shape\":[-2]", "dimension"},
	{"\"shape\":[2]", "\"shape\":2", "shape"},
	{"\"name\":\"t\",", "", "name"},
	{"\"name\":\"t\",", "\"name\":\"t\",\"extra\":0,", "unknown key"},
	{"\"tensors\":[{", "\"tensors\":[{\"dtype\":\"U8\",\"hash\":\"" HC "\",\"length\":0,"
			   "\"name\":\"z\",\"offset\":4,\"shape\":[0]},{",
	 "not sorted by offset"},
	{"\"tensors\":[", "\"tensors\":7,\"x\":[", "unknown key"},
	{"\"tensors\":[{", "\"tensors\":[1,{", "not an object"},
};

static void test_parse_rejects(void **state)
{
	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		char *in = subst(bads[i].from, bads[i].to);
		struct hwfs_vrec *v = (struct hwfs_vrec *)0x1;
		char err[256] = "";
		int rc = manifest_parse(in, strlen(in), &v, err, sizeof(err));

		if (rc != -EINVAL || !err[0] || !strstr(err, bads[i].why) || strchr(err, '\n'))
			print_error("case %zu (%s -> %s): rc=%d err='%s', want '%s'\n", i,
				    bads[i].from, bads[i].to, rc, err, bads[i].why);
		assert_int_equal(rc, -EINVAL);
		assert_true(err[0] != '\0');
		assert_non_null(strstr(err, bads[i].why));
		assert_ptr_equal(v, (struct hwfs_vrec *)0x1);
		free(in);
	}
}

static void test_parse_misc_rejects(void **state)
{
	struct hwfs_vrec *v = NULL;
	char err[256], small[8], *s, shape[256];
	size_t n, cap;

	/* Not an object, empty, NULL. */
	assert_int_equal(manifest_parse("[]", 2, &v, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "not a JSON object"));
	assert_int_equal(manifest_parse("", 0, &v, err, sizeof(err)), -EINVAL);
	assert_true(err[0]);
	assert_int_equal(manifest_parse(NULL, 0, &v, err, sizeof(err)), -EINVAL);
	/* A short error buffer is truncated, and no buffer is fine too. */
	assert_int_equal(manifest_parse("[]", 2, &v, small, sizeof(small)), -EINVAL);
	assert_int_equal(strlen(small), sizeof(small) - 1);
	assert_int_equal(manifest_parse("[]", 2, &v, NULL, 0), -EINVAL);
	/* Input cut one byte short. */
	assert_int_equal(manifest_parse(base, strlen(base) - 1, &v, err, sizeof(err)), -EINVAL);
	assert_null(v);

	/* 33 dimensions. */
	n = (size_t)snprintf(shape, sizeof(shape), "\"shape\":[");
	for (int i = 0; i < 33; i++)
		n += (size_t)snprintf(shape + n, sizeof(shape) - n, "%s1", i ? "," : "");
	snprintf(shape + n, sizeof(shape) - n, "]");
	s = subst("\"shape\":[2]", shape);
	assert_int_equal(manifest_parse(s, strlen(s), &v, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "dimensions"));
	free(s);

	/* A path component longer than 255 bytes. */
	{
		char p[300] = "\"path\":\"l";

		memset(p + 9, 'x', 260);
		strcpy(p + 269, "\"");
		s = subst("\"path\":\"l\"", p);
		assert_int_equal(manifest_parse(s, strlen(s), &v, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "longer"));
		free(s);
	}

	/* More than 1<<20 entries: rejected before looking at any of them. */
	cap = 64 + 2 * ((1u << 20) + 1);
	s = malloc(cap);
	assert_non_null(s);
	n = (size_t)snprintf(s, cap, "{\"format\":\"hwfs-manifest/1\",\"version\":\"v\","
				     "\"shards\":[],\"files\":[");
	for (size_t i = 0; i < (1u << 20) + 1; i++) {
		s[n++] = i ? ',' : '0';
		if (i)
			s[n++] = '0';
	}
	s[n++] = ']';
	s[n++] = '}';
	assert_int_equal(manifest_parse(s, n, &v, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "more than"));
	free(s);
	assert_null(v);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),	  cmocka_unit_test(test_digest),
		cmocka_unit_test(test_canonical_bytes),	  cmocka_unit_test(test_canonical_keys),
		cmocka_unit_test(test_unsorted_input),	  cmocka_unit_test(test_build_errors),
		cmocka_unit_test(test_parse_base),	  cmocka_unit_test(test_parse_noncanonical),
		cmocka_unit_test(test_parse_rejects),	  cmocka_unit_test(test_parse_misc_rejects),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
