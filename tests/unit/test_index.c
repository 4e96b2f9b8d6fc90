/*
 * test_index.c — the sqlite index against a real database file in a fresh
 * temporary directory: every field of a realistic version survives put,
 * close, reopen and load; meta keys; shard rows shared by two versions;
 * replacement, rollback, state changes and deletes.
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
#include <unistd.h>

#include "index.h"
#include "vrec.h"

struct fixture {
	char dir[64];
	char db[128];
};

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));

	if (!fx)
		return -1;
	strcpy(fx->dir, "/tmp/hwfs-test-index-XXXXXX");
	if (!mkdtemp(fx->dir)) {
		free(fx);
		return -1;
	}
	snprintf(fx->db, sizeof(fx->db), "%s/index.db", fx->dir);
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	static const char *const sfx[] = {"", "-wal", "-shm", "-journal"};
	char p[160];

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(sfx); i++) {
		snprintf(p, sizeof(p), "%s%s", fx->db, sfx[i]);
		unlink(p);
	}
	rmdir(fx->dir);
	free(fx);
	return 0;
}

/* ---- a realistic version ---- */

/*
 * bad.safetensors  file, 1 extent, st_error
 * data.bin         file, 3 extents (the middle one is the shard "shared")
 * dir              dir
 * dir-x            empty file ('-' sorts before '/')
 * dir/link         symlink
 * model.safetensors file, 2 extents, 2 tensors (one scalar)
 */
static struct hwfs_vrec *make_vrec(const char *name, uint64_t seq)
{
	struct hwfs_vrec *v = calloc(1, sizeof(*v));
	struct hwfs_frec *f;

	assert_non_null(v);
	v->name = strdup(name);
	v->state = HWFS_V_SEALED;
	v->seq = seq;
	v->created_ns = 1700000000123456789LL;
	v->sealed_ns = 1700000001987654321LL;
	v->digest = H(name, "digest");
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
	f->uid = 4294967295u;
	f->gid = 0;
	f->mtime_ns = -1234567890123LL;
	set_ext(f, 3, (uint64_t[]){100, 150, 50},
		(hwfs_hash_t[]){H(name, "d0"), H(NULL, "shared"), H(name, "d2")});

	f = &v->files[2];
	f->path = strdup("dir");
	f->kind = HWFS_K_DIR;
	f->mode = 0755;
	f->uid = 1;
	f->gid = 2;
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
	f->uid = 3;
	f->gid = 4;
	f->mtime_ns = 45;
	set_ext(f, 2, (uint64_t[]){120, 80}, (hwfs_hash_t[]){H(name, "m0"), H(name, "m1")});
	f->n_tensors = 2;
	f->tensors = calloc(2, sizeof(*f->tensors));
	assert_non_null(f->tensors);
	f->tensors[0].name = strdup("model.layers.0.weight");
	strcpy(f->tensors[0].dtype, "BF16");
	f->tensors[0].ndim = 2;
	f->tensors[0].shape = calloc(2, sizeof(uint64_t));
	f->tensors[0].shape[0] = 2;
	f->tensors[0].shape[1] = 3;
	f->tensors[0].off = 100;
	f->tensors[0].len = 12;
	f->tensors[0].hash = H(name, "t0");
	f->tensors[1].name = strdup("scale");
	strcpy(f->tensors[1].dtype, "F8_E4M3FNUZ_XY"); /* 14 chars: near the limit */
	f->tensors[1].ndim = 0;
	f->tensors[1].off = 112;
	f->tensors[1].len = 1;
	f->tensors[1].hash = H(name, "t1");
	return v;
}

/* The distinct shards of @v, with made-up arena offsets (some above INT64_MAX). */
static struct hwfs_shardloc *make_locs(const struct hwfs_vrec *v, size_t *n)
{
	struct hwfs_shardloc *l = calloc(64, sizeof(*l));
	size_t k = 0;

	assert_non_null(l);
	for (size_t i = 0; i < v->n_files; i++)
		for (size_t j = 0; j < v->files[i].n_ext; j++) {
			const struct hwfs_extent *e = &v->files[i].ext[j];
			size_t m;

			for (m = 0; m < k; m++)
				if (hwfs_hash_cmp(&l[m].hash, &e->hash) == 0)
					break;
			if (m < k)
				continue;
			l[k].hash = e->hash;
			l[k].size = e->len;
			l[k].arena_off = k % 2 ? UINT64_MAX - 4096 * k : 4096 * k;
			k++;
		}
	*n = k;
	return l;
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

static void assert_frec_equal(const struct hwfs_frec *a, const struct hwfs_frec *b)
{
	assert_string_equal(a->path, b->path);
	assert_int_equal(a->kind, b->kind);
	assert_int_equal(a->mode, b->mode);
	assert_int_equal(a->uid, b->uid);
	assert_int_equal(a->gid, b->gid);
	assert_true(a->mtime_ns == b->mtime_ns);
	assert_true(a->size == b->size);
	assert_nstr_equal(a->target, b->target);
	assert_nstr_equal(a->st_error, b->st_error);
	assert_int_equal(a->n_ext, b->n_ext);
	for (size_t i = 0; i < a->n_ext; i++) {
		assert_true(a->ext[i].off == b->ext[i].off);
		assert_true(a->ext[i].len == b->ext[i].len);
		assert_hash_equal(&a->ext[i].hash, &b->ext[i].hash);
	}
	assert_int_equal(a->n_tensors, b->n_tensors);
	for (size_t i = 0; i < a->n_tensors; i++) {
		const struct hwfs_trec *x = &a->tensors[i], *y = &b->tensors[i];

		assert_string_equal(x->name, y->name);
		assert_string_equal(x->dtype, y->dtype);
		assert_int_equal(x->ndim, y->ndim);
		if (x->ndim)
			assert_memory_equal(x->shape, y->shape, x->ndim * sizeof(uint64_t));
		else
			assert_null(y->shape);
		assert_true(x->off == y->off);
		assert_true(x->len == y->len);
		assert_hash_equal(&x->hash, &y->hash);
	}
}

static void assert_vrec_equal(const struct hwfs_vrec *a, const struct hwfs_vrec *b)
{
	assert_string_equal(a->name, b->name);
	assert_int_equal(a->state, b->state);
	assert_true(a->seq == b->seq);
	assert_true(a->created_ns == b->created_ns);
	assert_true(a->sealed_ns == b->sealed_ns);
	assert_hash_equal(&a->digest, &b->digest);
	assert_int_equal(a->n_files, b->n_files);
	for (size_t i = 0; i < a->n_files; i++)
		assert_frec_equal(&a->files[i], &b->files[i]);
}

static void free_all(struct hwfs_vrec **vs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		hwfs_vrec_free(vs[i]);
	free(vs);
}

static int cmp_loc(const void *a, const void *b)
{
	return hwfs_hash_cmp(&((const struct hwfs_shardloc *)a)->hash,
			     &((const struct hwfs_shardloc *)b)->hash);
}

static int has_shard(const struct hwfs_shardloc *l, size_t n, const hwfs_hash_t *h)
{
	for (size_t i = 0; i < n; i++)
		if (hwfs_hash_cmp(&l[i].hash, h) == 0)
			return 1;
	return 0;
}

/* ---- tests ---- */

static void test_roundtrip(void **state)
{
	struct fixture *fx = *state;
	struct index *ix = NULL;
	struct hwfs_vrec *v = make_vrec("llama-7b@v1", 7), **vs = NULL;
	struct hwfs_shardloc *locs, *got = NULL;
	size_t n_locs, n = 99, n_got = 99;
	char wal[160];

	locs = make_locs(v, &n_locs);
	assert_int_equal(n_locs, 6);
	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_put_version(ix, v, locs, n_locs), 0);
	/* WAL mode: the write went to the -wal file. */
	snprintf(wal, sizeof(wal), "%s-wal", fx->db);
	assert_int_equal(access(wal, F_OK), 0);
	index_close(ix);
	ix = NULL;

	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_load(ix, &vs, &n), 0);
	assert_int_equal(n, 1);
	assert_vrec_equal(v, vs[0]);

	assert_int_equal(index_load_shards(ix, &got, &n_got), 0);
	assert_int_equal(n_got, n_locs);
	qsort(locs, n_locs, sizeof(*locs), cmp_loc);
	for (size_t i = 0; i < n_got; i++) {
		assert_hash_equal(&got[i].hash, &locs[i].hash);
		assert_true(got[i].arena_off == locs[i].arena_off);
		assert_true(got[i].size == locs[i].size);
	}
	index_close(ix);
	free_all(vs, n);
	free(got);
	free(locs);
	hwfs_vrec_free(v);
}

static void test_empty(void **state)
{
	struct fixture *fx = *state;
	struct index *ix = NULL;
	struct hwfs_vrec **vs = NULL;
	struct hwfs_shardloc *l = NULL;
	size_t n = 99;

	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_load(ix, &vs, &n), 0);
	assert_int_equal(n, 0);
	free(vs);
	n = 99;
	assert_int_equal(index_load_shards(ix, &l, &n), 0);
	assert_int_equal(n, 0);
	free(l);
	index_close(ix);
	index_close(NULL);
}

static void test_open_fails(void **state)
{
	struct fixture *fx = *state;
	struct index *ix = (struct index *)0x1;
	char p[200];

	snprintf(p, sizeof(p), "%s/no/such/dir/index.db", fx->dir);
	assert_int_equal(index_open(p, &ix), -EIO);
	assert_ptr_equal(ix, (struct index *)0x1);
}

static void test_meta(void **state)
{
	struct fixture *fx = *state;
	struct index *ix = NULL;
	char *val = NULL;

	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_meta_get(ix, "schema", &val), 0);
	assert_string_equal(val, "1");
	free(val);
	val = NULL;

	assert_int_equal(index_meta_get(ix, "node_id", &val), -ENOENT);
	assert_null(val);
	assert_int_equal(index_meta_set(ix, "node_id", "node-a"), 0);
	assert_int_equal(index_meta_set(ix, "empty", ""), 0);
	assert_int_equal(index_meta_set(ix, "node_id", "node-b"), 0);
	index_close(ix);

	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_meta_get(ix, "node_id", &val), 0);
	assert_string_equal(val, "node-b");
	free(val);
	assert_int_equal(index_meta_get(ix, "empty", &val), 0);
	assert_string_equal(val, "");
	free(val);
	val = NULL;
	assert_int_equal(index_meta_set(ix, "node_id", NULL), 0);
	assert_int_equal(index_meta_get(ix, "node_id", &val), -ENOENT);
	assert_null(val);
	/* Deleting a missing key is not an error. */
	assert_int_equal(index_meta_set(ix, "node_id", NULL), 0);
	index_close(ix);
}

static void test_shared_shards(void **state)
{
	struct fixture *fx = *state;
	struct index *ix = NULL;
	struct hwfs_vrec *a = make_vrec("a", 1), *b = make_vrec("b", 2);
	struct hwfs_shardloc *la, *lb, *got = NULL;
	size_t na, nb, n = 0;
	hwfs_hash_t shared = H(NULL, "shared");

	la = make_locs(a, &na);
	lb = make_locs(b, &nb);
	/* b claims another location for the shared shard: the first row stays. */
	for (size_t i = 0; i < nb; i++)
		if (hwfs_hash_cmp(&lb[i].hash, &shared) == 0)
			lb[i].arena_off = 123456789;
	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_put_version(ix, a, la, na), 0);
	assert_int_equal(index_put_version(ix, b, lb, nb), 0);
	assert_int_equal(index_load_shards(ix, &got, &n), 0);
	assert_int_equal(n, na + nb - 1);
	for (size_t i = 0; i < n; i++)
		if (hwfs_hash_cmp(&got[i].hash, &shared) == 0)
			assert_true(got[i].arena_off != 123456789);
	free(got);
	got = NULL;

	assert_int_equal(index_delete_version(ix, "a"), 0);
	assert_int_equal(index_load_shards(ix, &got, &n), 0);
	assert_int_equal(n, nb);
	assert_true(has_shard(got, n, &shared));
	for (size_t i = 0; i < nb; i++)
		assert_true(has_shard(got, n, &lb[i].hash));
	for (size_t i = 0; i < na; i++)
		if (hwfs_hash_cmp(&la[i].hash, &shared) != 0)
			assert_false(has_shard(got, n, &la[i].hash));
	free(got);
	got = NULL;

	assert_int_equal(index_delete_version(ix, "a"), -ENOENT);
	assert_int_equal(index_delete_version(ix, "b"), 0);
	assert_int_equal(index_load_shards(ix, &got, &n), 0);
	assert_int_equal(n, 0);
	free(got);
	index_close(ix);
	free(la);
	free(lb);
	hwfs_vrec_free(a);
	hwfs_vrec_free(b);
}

static void test_replace(void **state)
{
	struct fixture *fx = *state;
	struct index *ix = NULL;
	struct hwfs_vrec *v1 = make_vrec("same", 1), *v2 = make_vrec("same", 9), **vs = NULL;
	struct hwfs_shardloc *l1, *l2;
	size_t n1, n2, n = 0;

	/* v2: fewer files, other metadata. */
	hwfs_frec_clear(&v2->files[5]);
	hwfs_frec_clear(&v2->files[4]);
	v2->n_files = 4;
	v2->files[1].mode = 0640;
	free(v2->files[0].st_error);
	v2->files[0].st_error = NULL;
	v2->state = HWFS_V_DAMAGED;
	l1 = make_locs(v1, &n1);
	l2 = make_locs(v2, &n2);

	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_put_version(ix, v1, l1, n1), 0);
	assert_int_equal(index_put_version(ix, v2, l2, n2), 0);
	assert_int_equal(index_load(ix, &vs, &n), 0);
	assert_int_equal(n, 1);
	assert_vrec_equal(v2, vs[0]);
	free_all(vs, n);
	index_close(ix);
	free(l1);
	free(l2);
	hwfs_vrec_free(v1);
	hwfs_vrec_free(v2);
}

static void test_rollback(void **state)
{
	struct fixture *fx = *state;
	struct index *ix = NULL;
	struct hwfs_vrec *v = make_vrec("keep", 1), *bad = make_vrec("keep", 2), **vs = NULL;
	struct hwfs_shardloc *l;
	size_t nl, n = 0;

	/* Two entries with the same path violate the primary key mid-transaction. */
	free(bad->files[3].path);
	bad->files[3].path = strdup(bad->files[2].path);
	l = make_locs(v, &nl);

	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_put_version(ix, v, l, nl), 0);
	assert_int_equal(index_put_version(ix, bad, NULL, 0), -EIO);
	/* The index is usable afterwards and still holds the old rows. */
	assert_int_equal(index_load(ix, &vs, &n), 0);
	assert_int_equal(n, 1);
	assert_vrec_equal(v, vs[0]);
	free_all(vs, n);
	assert_int_equal(index_meta_set(ix, "after", "ok"), 0);
	index_close(ix);
	free(l);
	hwfs_vrec_free(v);
	hwfs_vrec_free(bad);
}

static void test_order(void **state)
{
	struct fixture *fx = *state;
	struct index *ix = NULL;
	struct hwfs_vrec *z = make_vrec("z", 5), *y = make_vrec("y", 2), **vs = NULL;
	struct hwfs_extent tmp;
	struct hwfs_trec tt;
	size_t n = 0;

	/* Reverse extents, tensors and files of z on the way in; they come back sorted. */
	tmp = z->files[1].ext[0];
	z->files[1].ext[0] = z->files[1].ext[2];
	z->files[1].ext[2] = tmp;
	tt = z->files[5].tensors[0];
	z->files[5].tensors[0] = z->files[5].tensors[1];
	z->files[5].tensors[1] = tt;
	for (size_t i = 0; i < z->n_files / 2; i++) {
		struct hwfs_frec t = z->files[i];

		z->files[i] = z->files[z->n_files - 1 - i];
		z->files[z->n_files - 1 - i] = t;
	}
	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_put_version(ix, z, NULL, 0), 0);
	assert_int_equal(index_put_version(ix, y, NULL, 0), 0);
	assert_int_equal(index_load(ix, &vs, &n), 0);
	assert_int_equal(n, 2);
	assert_string_equal(vs[0]->name, "y");
	assert_string_equal(vs[1]->name, "z");
	assert_vrec_equal(y, vs[0]);
	hwfs_vrec_free(z);
	z = make_vrec("z", 5);
	assert_vrec_equal(z, vs[1]);
	assert_string_equal(vs[1]->files[3].path, "dir-x");
	assert_string_equal(vs[1]->files[4].path, "dir/link");
	free_all(vs, n);
	index_close(ix);
	hwfs_vrec_free(z);
	hwfs_vrec_free(y);
}

static void test_set_state(void **state)
{
	struct fixture *fx = *state;
	struct index *ix = NULL;
	struct hwfs_vrec *v = make_vrec("v", 1), **vs = NULL;
	size_t n = 0;

	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_put_version(ix, v, NULL, 0), 0);
	assert_int_equal(index_set_state(ix, "v", HWFS_V_DAMAGED), 0);
	assert_int_equal(index_set_state(ix, "nope", HWFS_V_DAMAGED), -ENOENT);
	index_close(ix);
	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_load(ix, &vs, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(vs[0]->state, HWFS_V_DAMAGED);
	v->state = HWFS_V_DAMAGED;
	assert_vrec_equal(v, vs[0]);
	free_all(vs, n);
	assert_int_equal(index_set_state(ix, "v", HWFS_V_SEALED), 0);
	assert_int_equal(index_load(ix, &vs, &n), 0);
	assert_int_equal(vs[0]->state, HWFS_V_SEALED);
	free_all(vs, n);
	assert_int_equal(index_delete_version(ix, "unknown"), -ENOENT);
	assert_int_equal(index_delete_version(ix, "v"), 0);
	assert_int_equal(index_load(ix, &vs, &n), 0);
	assert_int_equal(n, 0);
	free(vs);
	index_close(ix);
	hwfs_vrec_free(v);
}

static void test_many_extents(void **state)
{
	struct fixture *fx = *state;
	struct index *ix = NULL;
	struct hwfs_vrec *v = make_vrec("big", 1), **vs = NULL;
	struct hwfs_frec *f = &v->files[1];
	size_t n = 0, ne = 5000;

	free(f->ext);
	f->ext = calloc(ne, sizeof(*f->ext));
	assert_non_null(f->ext);
	f->n_ext = ne;
	for (size_t i = 0; i < ne; i++) {
		char tag[32];

		snprintf(tag, sizeof(tag), "e%zu", i);
		f->ext[i].off = (uint64_t)i << 20;
		f->ext[i].len = 1u << 20;
		f->ext[i].hash = H("big", tag);
	}
	f->size = (uint64_t)ne << 20;
	assert_int_equal(index_open(fx->db, &ix), 0);
	assert_int_equal(index_put_version(ix, v, NULL, 0), 0);
	assert_int_equal(index_load(ix, &vs, &n), 0);
	assert_int_equal(n, 1);
	assert_vrec_equal(v, vs[0]);
	free_all(vs, n);
	index_close(ix);
	hwfs_vrec_free(v);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_roundtrip), T(test_empty),	T(test_open_fails),
		T(test_meta),	   T(test_shared_shards), T(test_replace),
		T(test_rollback),  T(test_order),	T(test_set_state),
		T(test_many_extents),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
