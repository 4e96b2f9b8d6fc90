/*
 * test_delta_base.c — the base-matching rule of fs/common/delta_base.c
 * (docs/delta.md, "Which base"): which shard of an earlier version a shard of
 * a new version is a delta against.
 *
 * A shard inside a tensor matches the shard at the same offset within the
 * tensor of the same name, in the file of the same path, when both tensors
 * have the same dtype and byte length and that shard has the same length;
 * a shard outside every tensor matches the shard at the same offset with the
 * same length in the file of the same path; anything else has no base.  The
 * versions here are built by hand (hwfs_vrec records, as manifest_parse()
 * makes them), so each case states exactly the layout it is about.
 *
 * delta_base_bytes(), the score of a base version that the coordinator's
 * planner and a publisher's encode-ahead both pick by, is checked too: it
 * counts every shard with a base by the rule, those equal to their base
 * included, so both sides pick the same base.
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

#include "delta_base.h"
#include "vrec.h"

/* ---- building versions by hand ---- */

/* A tensor description: name, dtype, absolute offset in the file, byte length. */
struct tdesc {
	const char *name, *dtype;
	uint64_t off, len;
};

/*
 * A regular file @path of version @ver whose extents are the consecutive
 * lengths @lens (@n of them, hashed "ver/path@off") and whose tensors are
 * @ts (@nt of them, sorted by offset).
 */
static void make_file(struct hwfs_frec *f, const char *ver, const char *path, const uint64_t *lens,
		      size_t n, const struct tdesc *ts, size_t nt)
{
	uint64_t off = 0;
	char tag[256];

	memset(f, 0, sizeof(*f));
	f->path = strdup(path);
	f->kind = HWFS_K_REG;
	f->mode = 0644;
	f->n_ext = n;
	f->ext = calloc(n ? n : 1, sizeof(*f->ext));
	assert_non_null(f->path);
	assert_non_null(f->ext);
	for (size_t i = 0; i < n; i++) {
		snprintf(tag, sizeof(tag), "%s@%llu", path, (unsigned long long)off);
		f->ext[i] = (struct hwfs_extent){off, lens[i], H(ver, tag)};
		off += lens[i];
	}
	f->size = off;
	f->n_tensors = nt;
	f->tensors = nt ? calloc(nt, sizeof(*f->tensors)) : NULL;
	for (size_t i = 0; i < nt; i++) {
		struct hwfs_trec *t = &f->tensors[i];

		t->name = strdup(ts[i].name);
		assert_non_null(t->name);
		snprintf(t->dtype, sizeof(t->dtype), "%s", ts[i].dtype);
		t->off = ts[i].off;
		t->len = ts[i].len;
	}
}

/* A non-regular entry (directory or symlink) @path. */
static void make_other(struct hwfs_frec *f, const char *path, enum hwfs_kind kind)
{
	memset(f, 0, sizeof(*f));
	f->path = strdup(path);
	f->kind = kind;
	f->mode = kind == HWFS_K_DIR ? 0755 : 0777;
	f->target = kind == HWFS_K_LNK ? strdup("elsewhere") : NULL;
	assert_non_null(f->path);
}

/* An empty sealed version @name with room for @n files (filled by the caller, sorted by path). */
static struct hwfs_vrec *make_version(const char *name, size_t n)
{
	struct hwfs_vrec *v = calloc(1, sizeof(*v));

	assert_non_null(v);
	v->name = strdup(name);
	v->state = HWFS_V_SEALED;
	v->n_files = n;
	v->files = calloc(n ? n : 1, sizeof(*v->files));
	assert_non_null(v->files);
	return v;
}

/* The extent of @f starting at @off (the test's layouts always have one). */
static const struct hwfs_extent *ext_at(const struct hwfs_frec *f, uint64_t off)
{
	for (size_t i = 0; i < f->n_ext; i++)
		if (f->ext[i].off == off)
			return &f->ext[i];
	fail_msg("no extent at %llu in %s", (unsigned long long)off, f->path);
	return NULL;
}

/* delta_base_of() of the extent of @f at @off against @idx; width and tensor into the out-params. */
static const struct hwfs_extent *base_of(const struct delta_bases *idx, const struct hwfs_frec *f,
					 uint64_t off, unsigned *width, const struct hwfs_trec **t)
{
	*width = 99;
	return delta_base_of(idx, f, ext_at(f, off), width, t);
}

/* ---- the cases ---- */

/*
 * A safetensors file: header shard, then tensors a (BF16, 64 bytes),
 * b (F32, 128 bytes), c (F64, 32 bytes), one shard each.  In the base the
 * header is longer (another JSON) and the tensors lie in another order, so
 * their absolute offsets differ: they match by name, offset within tensor.
 */
static void test_same_tensor_matches_by_name_not_file_offset(void **state)
{
	(void)state;
	struct hwfs_vrec *v1 = make_version("v1", 1), *v2 = make_version("v2", 1);
	/* v1: header 40, c@40 (32), a@72 (64), b@136 (128) */
	const uint64_t l1[] = {40, 32, 64, 128};
	const struct tdesc t1[] = {{"c", "F64", 40, 32}, {"a", "BF16", 72, 64}, {"b", "F32", 136, 128}};
	/* v2: header 24, a@24 (64), b@88 (128), c@216 (32) */
	const uint64_t l2[] = {24, 64, 128, 32};
	const struct tdesc t2[] = {{"a", "BF16", 24, 64}, {"b", "F32", 88, 128}, {"c", "F64", 216, 32}};
	struct delta_bases *idx = NULL;
	const struct hwfs_trec *t;
	const struct hwfs_extent *e;
	unsigned width;

	make_file(&v1->files[0], "v1", "model.safetensors", l1, 4, t1, 3);
	make_file(&v2->files[0], "v2", "model.safetensors", l2, 4, t2, 3);
	assert_int_equal(delta_bases_new(v1, &idx), 0);

	e = base_of(idx, &v2->files[0], 24, &width, &t);
	assert_ptr_equal(e, &v1->files[0].ext[2]); /* a@72 */
	assert_int_equal(width, 2);
	assert_non_null(t);
	assert_string_equal(t->name, "a");

	e = base_of(idx, &v2->files[0], 88, &width, &t);
	assert_ptr_equal(e, &v1->files[0].ext[3]); /* b@136 */
	assert_int_equal(width, 4);
	assert_string_equal(t->name, "b");

	e = base_of(idx, &v2->files[0], 216, &width, &t);
	assert_ptr_equal(e, &v1->files[0].ext[1]); /* c@40 */
	assert_int_equal(width, 8);

	/* the header (outside every tensor): 24 bytes at 0 vs 40 at 0 — another length */
	e = base_of(idx, &v2->files[0], 0, &width, &t);
	assert_null(e);
	assert_int_equal(width, 1);
	assert_null(t);

	delta_bases_free(idx);
	hwfs_vrec_free(v1);
	hwfs_vrec_free(v2);
}

/*
 * Shards outside tensors — a safetensors header of the same length, a file
 * that is not safetensors (fixed-size chunks) — match the base shard at the
 * same offset with the same length in the file of the same path; another
 * length at that offset, or no shard starting there, is no base.
 */
static void test_outside_tensors_same_offset_and_length(void **state)
{
	(void)state;
	struct hwfs_vrec *v1 = make_version("v1", 3), *v2 = make_version("v2", 3);
	const uint64_t hdr[] = {16, 64};
	const struct tdesc tw[] = {{"w", "BF16", 16, 64}};
	const uint64_t bin1[] = {100, 100, 50}, bin2[] = {100, 100, 60};
	const uint64_t odd1[] = {30, 70}, odd2[] = {40, 60};
	struct delta_bases *idx = NULL;
	const struct hwfs_trec *t;
	const struct hwfs_extent *e;
	unsigned width;

	/* sorted by path: data.bin, m.safetensors, odd.bin */
	make_file(&v1->files[0], "v1", "data.bin", bin1, 3, NULL, 0);
	make_file(&v1->files[1], "v1", "m.safetensors", hdr, 2, tw, 1);
	make_file(&v1->files[2], "v1", "odd.bin", odd1, 2, NULL, 0);
	make_file(&v2->files[0], "v2", "data.bin", bin2, 3, NULL, 0);
	make_file(&v2->files[1], "v2", "m.safetensors", hdr, 2, tw, 1);
	make_file(&v2->files[2], "v2", "odd.bin", odd2, 2, NULL, 0);
	assert_int_equal(delta_bases_new(v1, &idx), 0);

	e = base_of(idx, &v2->files[1], 0, &width, &t); /* the header: same length */
	assert_ptr_equal(e, &v1->files[1].ext[0]);
	assert_int_equal(width, 1);
	assert_null(t);

	e = base_of(idx, &v2->files[0], 0, &width, &t);
	assert_ptr_equal(e, &v1->files[0].ext[0]);
	assert_int_equal(width, 1);
	e = base_of(idx, &v2->files[0], 100, &width, &t);
	assert_ptr_equal(e, &v1->files[0].ext[1]);
	/* the last chunk grew: 60 bytes at 200 vs 50 */
	assert_null(base_of(idx, &v2->files[0], 200, &width, &t));
	assert_int_equal(width, 1);

	/* odd.bin: chunks 0+40, 40+60 against 0+30, 30+70: nothing starts alike */
	assert_null(base_of(idx, &v2->files[2], 0, &width, &t));
	assert_null(base_of(idx, &v2->files[2], 40, &width, &t));

	delta_bases_free(idx);
	hwfs_vrec_free(v1);
	hwfs_vrec_free(v2);
}

/*
 * A renamed tensor, a reshaped one (another byte length), a retyped one
 * (same length, another dtype) and a new one have no base, though a shard of
 * the same length lies at the same file offset in the base; the width and
 * the tensor are reported anyway.  A tensor whose shape changed but not its
 * dtype or byte length keeps its base (the rule looks at bytes, not shape).
 */
static void test_renamed_reshaped_retyped_new_have_no_base(void **state)
{
	(void)state;
	struct hwfs_vrec *v1 = make_version("v1", 1), *v2 = make_version("v2", 1);
	const uint64_t l1[] = {8, 64, 64, 64, 64}, l2[] = {8, 64, 64, 32, 64, 64};
	const struct tdesc t1[] = {{"old", "BF16", 8, 64},
				   {"typed", "BF16", 72, 64},
				   {"shaped", "F32", 136, 64},
				   {"square", "F32", 200, 64}};
	const struct tdesc t2[] = {{"renamed", "BF16", 8, 64}, {"typed", "F16", 72, 64},
				   {"shaped", "F32", 136, 32}, {"square", "F32", 168, 64},
				   {"fresh", "I8", 232, 64}};
	struct delta_bases *idx = NULL;
	const struct hwfs_trec *t;
	const struct hwfs_extent *e;
	unsigned width;

	make_file(&v1->files[0], "v1", "m.safetensors", l1, 5, t1, 4);
	make_file(&v2->files[0], "v2", "m.safetensors", l2, 6, t2, 5);
	v2->files[0].tensors[3].ndim = 2; /* "square": another shape, same dtype and length */
	v2->files[0].tensors[3].shape = calloc(2, sizeof(uint64_t));
	assert_non_null(v2->files[0].tensors[3].shape);
	v2->files[0].tensors[3].shape[0] = v2->files[0].tensors[3].shape[1] = 4;
	assert_int_equal(delta_bases_new(v1, &idx), 0);

	assert_null(base_of(idx, &v2->files[0], 8, &width, &t)); /* renamed */
	assert_int_equal(width, 2);
	assert_string_equal(t->name, "renamed");
	assert_null(base_of(idx, &v2->files[0], 72, &width, &t)); /* BF16 -> F16 */
	assert_int_equal(width, 2);
	assert_string_equal(t->name, "typed");
	assert_null(base_of(idx, &v2->files[0], 136, &width, &t)); /* 64 -> 32 bytes */
	assert_int_equal(width, 4);
	assert_null(base_of(idx, &v2->files[0], 232, &width, &t)); /* new */
	assert_int_equal(width, 1);
	assert_string_equal(t->name, "fresh");

	e = base_of(idx, &v2->files[0], 168, &width, &t); /* moved and reshaped, same bytes */
	assert_ptr_equal(e, &v1->files[0].ext[4]);
	assert_int_equal(width, 4);

	delta_bases_free(idx);
	hwfs_vrec_free(v1);
	hwfs_vrec_free(v2);
}

/*
 * A tensor larger than max_shard is cut into several shards; each maps to
 * the shard at the same offset within the same tensor of the base (cut
 * alike), piece by piece, whatever the tensor's offset in the file.  A piece
 * the base cut otherwise (another length at that offset) has no base, and
 * none of the pieces of a tensor that grew has one, not even those whose
 * place and length the base shares.
 */
static void test_cut_tensor_maps_piece_by_piece(void **state)
{
	(void)state;
	struct hwfs_vrec *v1 = make_version("v1", 1), *v2 = make_version("v2", 1);
	/* big: 3 pieces 100+100+50; in v1 after a 16-byte header, in v2 after 48 bytes and "small" */
	const uint64_t l1[] = {16, 100, 100, 50}, l2[] = {32, 16, 100, 100, 50};
	const struct tdesc t1[] = {{"big", "BF16", 16, 250}};
	const struct tdesc t2[] = {{"small", "F32", 32, 16}, {"big", "BF16", 48, 250}};
	/* v3: big cut 100+150 (another max_shard) */
	struct hwfs_vrec *v3 = make_version("v3", 1);
	const uint64_t l3[] = {16, 100, 150};
	/* v4: big was 200 bytes (100+100): it grew to 250 in v2 */
	struct hwfs_vrec *v4 = make_version("v4", 1);
	const uint64_t l4[] = {16, 100, 100};
	const struct tdesc t4[] = {{"big", "BF16", 16, 200}};
	struct delta_bases *idx = NULL, *idx3 = NULL, *idx4 = NULL;
	const struct hwfs_trec *t;
	unsigned width;

	make_file(&v1->files[0], "v1", "m.safetensors", l1, 4, t1, 1);
	make_file(&v2->files[0], "v2", "m.safetensors", l2, 5, t2, 2);
	make_file(&v3->files[0], "v3", "m.safetensors", l3, 3, t1, 1);
	make_file(&v4->files[0], "v4", "m.safetensors", l4, 3, t4, 1);
	assert_int_equal(delta_bases_new(v1, &idx), 0);
	assert_int_equal(delta_bases_new(v3, &idx3), 0);
	assert_int_equal(delta_bases_new(v4, &idx4), 0);

	assert_ptr_equal(base_of(idx, &v2->files[0], 48, &width, &t), &v1->files[0].ext[1]);
	assert_int_equal(width, 2);
	assert_string_equal(t->name, "big");
	assert_ptr_equal(base_of(idx, &v2->files[0], 148, &width, &t), &v1->files[0].ext[2]);
	assert_ptr_equal(base_of(idx, &v2->files[0], 248, &width, &t), &v1->files[0].ext[3]);
	assert_null(base_of(idx, &v2->files[0], 32, &width, &t)); /* "small" is new */

	/* against v3 (cut 100+150): the first piece matches, the others do not */
	assert_ptr_equal(base_of(idx3, &v2->files[0], 48, &width, &t), &v3->files[0].ext[1]);
	assert_null(base_of(idx3, &v2->files[0], 148, &width, &t));
	assert_null(base_of(idx3, &v2->files[0], 248, &width, &t));

	/* against v4 (big was 200 bytes): no piece, though 48+100 and 148+100 are cut alike */
	assert_null(base_of(idx4, &v2->files[0], 48, &width, &t));
	assert_null(base_of(idx4, &v2->files[0], 148, &width, &t));
	assert_null(base_of(idx4, &v2->files[0], 248, &width, &t));
	assert_int_equal(width, 2);

	delta_bases_free(idx);
	delta_bases_free(idx3);
	delta_bases_free(idx4);
	hwfs_vrec_free(v4);
	hwfs_vrec_free(v1);
	hwfs_vrec_free(v2);
	hwfs_vrec_free(v3);
}

/*
 * A file the base does not have (another path, or the same path as a
 * directory or symlink there) has no base for any of its shards; a new
 * version's symlink or directory entry is never looked up; an empty base
 * matches nothing.  A shard that spans two tensors lies in no single one and
 * is matched as bytes outside tensors (same offset and length).
 */
static void test_missing_file_and_other_kinds(void **state)
{
	(void)state;
	struct hwfs_vrec *v1 = make_version("v1", 3), *v2 = make_version("v2", 4);
	struct hwfs_vrec *empty = make_version("v0", 0);
	const uint64_t l[] = {16, 64}, two[] = {8, 48};
	const struct tdesc tw[] = {{"w", "BF16", 16, 64}};
	const struct tdesc tpair[] = {{"p", "F32", 8, 24}, {"q", "F32", 32, 24}};
	struct delta_bases *idx = NULL, *idx0 = NULL;
	const struct hwfs_trec *t;
	unsigned width;

	/* v1: a.safetensors, dir (a directory), pair.safetensors */
	make_file(&v1->files[0], "v1", "a.safetensors", l, 2, tw, 1);
	make_other(&v1->files[1], "dir", HWFS_K_DIR);
	make_file(&v1->files[2], "v1", "pair.safetensors", two, 2, tpair, 2);
	/* v2: b.safetensors (new path, same layout), dir (now a file), link, pair.safetensors */
	make_file(&v2->files[0], "v2", "b.safetensors", l, 2, tw, 1);
	make_file(&v2->files[1], "v2", "dir", l, 2, NULL, 0);
	make_other(&v2->files[2], "link", HWFS_K_LNK);
	make_file(&v2->files[3], "v2", "pair.safetensors", two, 2, tpair, 2);
	assert_int_equal(delta_bases_new(v1, &idx), 0);
	assert_int_equal(delta_bases_new(empty, &idx0), 0);

	assert_null(base_of(idx, &v2->files[0], 16, &width, &t)); /* a file the base lacks */
	assert_int_equal(width, 2);
	assert_string_equal(t->name, "w");
	assert_null(base_of(idx, &v2->files[0], 0, &width, &t));
	assert_null(base_of(idx, &v2->files[1], 0, &width, &t)); /* a directory in the base */
	assert_null(base_of(idx, &v2->files[1], 16, &width, &t));

	/* the 48-byte shard holds both p and q: matched as bytes at 8 (width 1) */
	assert_ptr_equal(base_of(idx, &v2->files[3], 8, &width, &t), &v1->files[2].ext[1]);
	assert_int_equal(width, 1);
	assert_null(t);

	assert_null(base_of(idx0, &v2->files[3], 8, &width, &t));
	assert_null(base_of(idx0, &v2->files[0], 16, &width, &t));

	delta_bases_free(idx);
	delta_bases_free(idx0);
	hwfs_vrec_free(v1);
	hwfs_vrec_free(v2);
	hwfs_vrec_free(empty);
}

/* delta_base_of() with a NULL @tensor out-parameter, and delta_bases_free(NULL). */
static void test_null_tensor_out_and_free_null(void **state)
{
	(void)state;
	struct hwfs_vrec *v1 = make_version("v1", 1);
	const uint64_t l[] = {16, 64};
	const struct tdesc tw[] = {{"w", "F64", 16, 64}};
	struct delta_bases *idx = NULL;
	unsigned width = 0;

	make_file(&v1->files[0], "v1", "m.safetensors", l, 2, tw, 1);
	assert_int_equal(delta_bases_new(v1, &idx), 0);
	/* a version against itself: every shard is its own base */
	assert_ptr_equal(delta_base_of(idx, &v1->files[0], &v1->files[0].ext[1], &width, NULL),
			 &v1->files[0].ext[1]);
	assert_int_equal(width, 8);
	delta_bases_free(idx);
	delta_bases_free(NULL);
	hwfs_vrec_free(v1);
}

/* ---- delta_base_bytes() ---- */

/* What delta_base_bytes() called back with, in order. */
struct seen {
	size_t n;
	struct {
		const struct hwfs_extent *be, *e;
		unsigned width;
	} at[16];
	uint64_t changed; /* bytes of the shards that differ from their base */
};

static void record(void *arg, const struct hwfs_extent *be, const struct hwfs_extent *e,
		   unsigned width)
{
	struct seen *s = arg;

	assert_true(s->n < sizeof(s->at) / sizeof(s->at[0]));
	s->at[s->n].be = be;
	s->at[s->n].e = e;
	s->at[s->n].width = width;
	s->n++;
	if (hwfs_hash_cmp(&be->hash, &e->hash))
		s->changed += e->len;
}

/* The @i-th call back was for base @be, shard @e, width @width. */
static void seen_is(const struct seen *s, size_t i, const struct hwfs_extent *be,
		    const struct hwfs_extent *e, unsigned width)
{
	assert_true(i < s->n);
	assert_ptr_equal(s->at[i].be, be);
	assert_ptr_equal(s->at[i].e, e);
	assert_int_equal(s->at[i].width, width);
}

/*
 * The score is the bytes of the new version's shards that have a base by the
 * rule, and @each is called for each of them (file by file, shard by shard)
 * with its base and width: a changed header of the same length, a tensor
 * moved and changed, a tensor equal to its base (counted and called back like
 * the others), chunks of a file that is not safetensors.  A new tensor, a
 * chunk that grew, a symlink and a file only the base has count for nothing.
 */
static void test_base_bytes_counts_every_shard_with_a_base(void **state)
{
	(void)state;
	struct hwfs_vrec *v1 = make_version("v1", 3), *v2 = make_version("v2", 3);
	const uint64_t bin1[] = {100, 100, 50}, bin2[] = {100, 100, 60}, gone[] = {70};
	/* v1: header 24, b@24 (128), a@152 (64); v2: header 24, a@24, b@88, c@216 (new) */
	const uint64_t l1[] = {24, 128, 64}, l2[] = {24, 64, 128, 32};
	const struct tdesc t1[] = {{"b", "F32", 24, 128}, {"a", "BF16", 152, 64}};
	const struct tdesc t2[] = {{"a", "BF16", 24, 64}, {"b", "F32", 88, 128},
				   {"c", "I8", 216, 32}};
	struct seen s = {0};
	const struct hwfs_frec *d1, *d2, *m1, *m2;

	/* sorted by path: v1 data.bin, gone.bin, m.safetensors; v2 data.bin, link, m.safetensors */
	make_file(&v1->files[0], "v1", "data.bin", bin1, 3, NULL, 0);
	make_file(&v1->files[1], "v1", "gone.bin", gone, 1, NULL, 0);
	make_file(&v1->files[2], "v1", "m.safetensors", l1, 3, t1, 2);
	make_file(&v2->files[0], "v2", "data.bin", bin2, 3, NULL, 0);
	make_other(&v2->files[1], "link", HWFS_K_LNK);
	make_file(&v2->files[2], "v2", "m.safetensors", l2, 4, t2, 3);
	d1 = &v1->files[0];
	m1 = &v1->files[2];
	d2 = &v2->files[0];
	m2 = &v2->files[2];
	m2->ext[2].hash = m1->ext[1].hash; /* b did not change */

	/* data.bin 100 + 100, the header 24, a 64, b 128 */
	assert_int_equal(delta_base_bytes(v2, v1, NULL, NULL), 416);
	assert_int_equal(delta_base_bytes(v2, v1, record, &s), 416);
	assert_int_equal(s.n, 5);
	seen_is(&s, 0, &d1->ext[0], &d2->ext[0], 1);
	seen_is(&s, 1, &d1->ext[1], &d2->ext[1], 1);
	seen_is(&s, 2, &m1->ext[0], &m2->ext[0], 1); /* the header */
	seen_is(&s, 3, &m1->ext[2], &m2->ext[1], 2); /* a */
	seen_is(&s, 4, &m1->ext[1], &m2->ext[2], 4); /* b, equal to its base */
	assert_int_equal(s.changed, 416 - 128);

	hwfs_vrec_free(v1);
	hwfs_vrec_free(v2);
}

/*
 * No version (NULL on either side), a version of another model (no file in
 * common) and an empty one score 0 and call nothing back; a version against
 * itself scores all its shard bytes.
 */
static void test_base_bytes_zero_without_a_common_file(void **state)
{
	(void)state;
	struct hwfs_vrec *v1 = make_version("v1", 2), *other = make_version("o1", 1);
	struct hwfs_vrec *empty = make_version("v0", 0);
	const uint64_t l[] = {16, 64}, bin[] = {100, 30};
	const struct tdesc tw[] = {{"w", "BF16", 16, 64}};
	struct seen s = {0};

	make_file(&v1->files[0], "v1", "data.bin", bin, 2, NULL, 0);
	make_file(&v1->files[1], "v1", "m.safetensors", l, 2, tw, 1);
	make_file(&other->files[0], "o1", "other.safetensors", l, 2, tw, 1);

	assert_int_equal(delta_base_bytes(NULL, v1, record, &s), 0);
	assert_int_equal(delta_base_bytes(v1, NULL, record, &s), 0);
	assert_int_equal(delta_base_bytes(NULL, NULL, record, &s), 0);
	assert_int_equal(delta_base_bytes(v1, other, record, &s), 0);
	assert_int_equal(delta_base_bytes(other, v1, record, &s), 0);
	assert_int_equal(delta_base_bytes(v1, empty, record, &s), 0);
	assert_int_equal(delta_base_bytes(empty, v1, record, &s), 0);
	assert_int_equal(s.n, 0);

	assert_int_equal(delta_base_bytes(v1, v1, record, &s), 210);
	assert_int_equal(s.n, 4);
	assert_int_equal(s.changed, 0);

	hwfs_vrec_free(v1);
	hwfs_vrec_free(other);
	hwfs_vrec_free(empty);
}

/*
 * Which base wins depends on counting the shards equal to their base.  The
 * new version v3 keeps its embedding (1000 bytes) as it was in version A
 * and changes two layers (300 bytes each) that A names otherwise; version B
 * has the two layers under the same names but an embedding of another size.
 * A: 1000 bytes have a base, all equal to it; B: 600, all changed.  The
 * score counts both kinds, so A wins (as the coordinator's pick_base() has
 * it); counting only the shards that differ from their base (what
 * encode-ahead encodes) would give A 0 and pick B instead.
 */
static void test_base_bytes_counts_shards_equal_to_their_base(void **state)
{
	(void)state;
	struct hwfs_vrec *v3 = make_version("v3", 1), *va = make_version("a", 1);
	struct hwfs_vrec *vb = make_version("b", 1), *cand[2], *best = NULL;
	/* v3: header 16, emb@16 (1000), l0@1016 (300), l1@1316 (300) */
	const uint64_t l3[] = {16, 1000, 300, 300};
	const struct tdesc t3[] = {{"emb", "BF16", 16, 1000}, {"l0", "F32", 1016, 300},
				   {"l1", "F32", 1316, 300}};
	/* A: header 12, emb@12 (1000), h0@1012 (300), h1@1312 (300): the layers renamed */
	const uint64_t la[] = {12, 1000, 300, 300};
	const struct tdesc ta[] = {{"emb", "BF16", 12, 1000}, {"h0", "F32", 1012, 300},
				   {"h1", "F32", 1312, 300}};
	/* B: header 20, emb@20 (800), l0@820 (300), l1@1120 (300) */
	const uint64_t lb[] = {20, 800, 300, 300};
	const struct tdesc tb[] = {{"emb", "BF16", 20, 800}, {"l0", "F32", 820, 300},
				   {"l1", "F32", 1120, 300}};
	struct seen sa = {0}, sb = {0};
	uint64_t best_bytes = 0;

	make_file(&v3->files[0], "v3", "m.safetensors", l3, 4, t3, 3);
	make_file(&va->files[0], "a", "m.safetensors", la, 4, ta, 3);
	make_file(&vb->files[0], "b", "m.safetensors", lb, 4, tb, 3);
	v3->files[0].ext[1].hash = va->files[0].ext[1].hash; /* emb as it was in A */

	assert_int_equal(delta_base_bytes(v3, va, record, &sa), 1000);
	assert_int_equal(delta_base_bytes(v3, vb, record, &sb), 600);
	/* the case discriminates: without the equal shards A would score 0, B 600 */
	assert_int_equal(sa.n, 1);
	assert_int_equal(sa.changed, 0);
	assert_int_equal(sb.n, 2);
	assert_int_equal(sb.changed, 600);

	/* the pick both sides make: most bytes, the newest of equals (B is newer) */
	cand[0] = va;
	cand[1] = vb;
	for (size_t i = 2; i-- > 0;) {
		uint64_t bytes = delta_base_bytes(v3, cand[i], NULL, NULL);

		if (bytes > best_bytes) {
			best = cand[i];
			best_bytes = bytes;
		}
	}
	assert_ptr_equal(best, va);

	hwfs_vrec_free(v3);
	hwfs_vrec_free(va);
	hwfs_vrec_free(vb);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_same_tensor_matches_by_name_not_file_offset),
		cmocka_unit_test(test_outside_tensors_same_offset_and_length),
		cmocka_unit_test(test_renamed_reshaped_retyped_new_have_no_base),
		cmocka_unit_test(test_cut_tensor_maps_piece_by_piece),
		cmocka_unit_test(test_missing_file_and_other_kinds),
		cmocka_unit_test(test_null_tensor_out_and_free_null),
		cmocka_unit_test(test_base_bytes_counts_every_shard_with_a_base),
		cmocka_unit_test(test_base_bytes_zero_without_a_common_file),
		cmocka_unit_test(test_base_bytes_counts_shards_equal_to_their_base),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
