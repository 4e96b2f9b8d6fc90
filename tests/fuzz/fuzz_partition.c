/*
 * fuzz_partition.c — libFuzzer target for hwfs-partition.json, the
 * tensor-parallel rules a version may carry (fs/ns/ns_tp.c,
 * docs/trainers.md "Rules"), the file of a version the daemon reads to
 * build tp/N/r/model.safetensors.
 *
 * The input is the file's bytes.  The rules of ns_tp.c are static, so this
 * file includes ns_tp.c itself (its global functions then come from here,
 * and the archive's copy of ns_tp.o is never linked) and runs what
 * tp_build() runs on a version: json_loads() of the text (at most 1 MiB,
 * read up to its first NUL), apply_overrides() on an object, then for every
 * N in 1..64 tp_check() and, for a size that works, each rank's view file
 * (tp_file_build(), or tp_file_clone() of rank 0's as tp_build() does for a
 * version without experts).  The version is one of two fixed tensor sets, a
 * Llama-like one (no experts) and a Mixtral-like one (4 experts), and every
 * input is run against both.
 *
 * Invariants (a violation aborts): a rejected file has a reason; a size that
 * works works for each of its divisors; every view file's header (of every
 * rank up to N = 8, of ranks 0, 1 and N - 1 above: speed) is a
 * safetensors header that st_parse() accepts for the view file's size, with
 * one entry per tensor the rank holds, with its dtype, the shape
 * of its slice and its length; the segments tile the data from the header
 * on; each stays inside its source tensor; over the ranks of one size a
 * split tensor is served exactly once, a replicated one by every rank, an
 * expert by one rank (N <= 8); a cloned rank equals a built one.
 */
#include "ns_tp.c" /* first: it defines _GNU_SOURCE */

#include <stdint.h>

#include "safetensors.h"

#define FUZZ_NAME "fuzz_partition"
#include "fuzz_util.h"

#define MAX_T 24

struct tspec {
	const char *name, *dtype;
	uint32_t ndim;
	uint64_t shape[3];
};

/* Llama-like: every N up to 64 divides the split tensors by default. */
static const struct tspec dense[] = {
	{"lm_head.weight", "BF16", 2, {32000, 4096}},
	{"model.embed_tokens.weight", "BF16", 2, {32000, 4096}},
	{"model.layers.0.input_layernorm.weight", "BF16", 1, {4096}},
	{"model.layers.0.mlp.down_proj.weight", "BF16", 2, {4096, 11008}},
	{"model.layers.0.mlp.gate_proj.weight", "BF16", 2, {11008, 4096}},
	{"model.layers.0.mlp.up_proj.weight", "BF16", 2, {11008, 4096}},
	{"model.layers.0.self_attn.k_proj.bias", "F32", 1, {1024}},
	{"model.layers.0.self_attn.k_proj.weight", "BF16", 2, {1024, 4096}},
	{"model.layers.0.self_attn.o_proj.bias", "F32", 1, {4096}},
	{"model.layers.0.self_attn.o_proj.weight", "BF16", 2, {4096, 4096}},
	{"model.layers.0.self_attn.q_proj.weight", "BF16", 2, {4096, 4096}},
	{"model.layers.0.self_attn.qkv_proj.weight", "F16", 2, {6144, 4096}},
	{"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", 1, {64}},
	{"model.layers.0.self_attn.scale", "F32", 0, {0}},
	{"model.layers.0.conv.weight", "F32", 3, {128, 96, 3}},
	{"model.layers.0.odd.weight", "U8", 2, {3, 5}},
	{"model.layers.0.empty.weight", "F16", 2, {0, 64}},
	{"model.layers.0.packed.weight", "F4", 2, {64, 64}},
	{"model.norm.weight", "F64", 1, {4096}},
};

/* Mixtral-like: 4 experts, so 8 and above do not serve by default. */
static const struct tspec moe[] = {
	{"model.embed_tokens.weight", "BF16", 2, {32000, 1024}},
	{"model.layers.0.block_sparse_moe.experts.0.w1.weight", "BF16", 2, {2048, 1024}},
	{"model.layers.0.block_sparse_moe.experts.0.w2.weight", "BF16", 2, {1024, 2048}},
	{"model.layers.0.block_sparse_moe.experts.1.w1.weight", "BF16", 2, {2048, 1024}},
	{"model.layers.0.block_sparse_moe.experts.1.w2.weight", "BF16", 2, {1024, 2048}},
	{"model.layers.0.block_sparse_moe.experts.2.w1.weight", "BF16", 2, {2048, 1024}},
	{"model.layers.0.block_sparse_moe.experts.3.w1.weight", "BF16", 2, {2048, 1024}},
	{"model.layers.0.block_sparse_moe.experts.3.w3.weight", "BF16", 2, {2048, 1024}},
	{"model.layers.0.block_sparse_moe.gate.weight", "BF16", 2, {4, 1024}},
	{"model.layers.0.mlp.shared_expert_gate.weight", "BF16", 2, {1, 1024}},
	{"model.layers.0.self_attn.o_proj.weight", "BF16", 2, {1024, 1024}},
	{"model.layers.0.self_attn.q_proj.weight", "BF16", 2, {1024, 1024}},
	{"model.layers.0.post_attention_layernorm.weight", "BF16", 1, {1024}},
	{"model.layers.0.experts.scale", "F32", 1, {16}},
	{"lm_head.weight", "BF16", 2, {32000, 1024}},
};

struct tset {
	size_t n;
	int experts;
	struct hwfs_trec rec[MAX_T];
	uint64_t shape[MAX_T][3];
	struct node src[MAX_T]; /* one source "file" per tensor: a segment names its tensor */
	struct tp_tensor tt[MAX_T];
};

static struct tset sets[2];

/* The tensors of @spec laid end to end after a 4 KiB header, as one safetensors file holds them. */
static void make_set(struct tset *s, const struct tspec *spec, size_t n)
{
	uint64_t off = 4096;

	s->n = n;
	for (size_t i = 0; i < n; i++) {
		struct hwfs_trec *t = &s->rec[i];
		uint64_t bits = st_dtype_bits(spec[i].dtype), numel = 1;

		t->name = (char *)spec[i].name;
		snprintf(t->dtype, sizeof(t->dtype), "%s", spec[i].dtype);
		t->ndim = spec[i].ndim;
		t->shape = t->ndim ? s->shape[i] : NULL;
		for (uint32_t k = 0; k < t->ndim; k++)
			numel *= (t->shape[k] = spec[i].shape[k]);
		t->off = off;
		t->len = numel * bits / 8;
		off += t->len;
	}
}

/* What tp_build() sets up from the tensors: the built-in rules, the expert count. */
static void reset_rules(struct tset *s)
{
	s->experts = 0;
	for (size_t i = 0; i < s->n; i++) {
		s->tt[i] = (struct tp_tensor){&s->rec[i], &s->src[i], tp_rule(&s->rec[i]),
					      expert_index(s->rec[i].name)};
		if (s->tt[i].expert + 1 > s->experts)
			s->experts = s->tt[i].expert + 1;
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	make_set(&sets[0], dense, HWFS_ARRAY_SIZE(dense));
	make_set(&sets[1], moe, HWFS_ARRAY_SIZE(moe));
	return 0;
}

static uint64_t le64(const char *p)
{
	uint64_t v = 0;

	for (int k = 7; k >= 0; k--)
		v = v << 8 | (uint8_t)p[k];
	return v;
}

/* Which tensor of @s segment source @src is. */
static size_t tensor_of(const struct tset *s, const struct node *src)
{
	for (size_t i = 0; i < s->n; i++)
		if (src == &s->src[i])
			return i;
	die("a segment of a source that is no tensor of the version", NULL);
}

/*
 * Check rank @r's view file @f for size @N; add the bytes it serves of each
 * tensor to @served.
 */
static void check_file(const struct tset *s, int N, int r, const struct tp_file *f,
		       uint64_t *served)
{
	struct st_header *h = NULL;
	char err[256];
	uint64_t pos;
	size_t k = 0, seg = 0;

	if (!f || !f->head || f->head->len != f->head_len || f->head_len < 16 || f->head_len % 8)
		die("a view file without a header", NULL);
	if (le64(f->head->buf) != f->head_len - 8)
		die("the header's length field is not its length", NULL);
	if (st_parse((const uint8_t *)f->head->buf, f->head_len, f->size, &h, err, sizeof(err)))
		die("a view file's header does not parse as safetensors", err);
	if (h->data_start != f->head_len || h->data_start + h->data_len != f->size)
		die("the header does not describe the view file", NULL);
	/* The header's tensors, in data order, are the ones rank r holds. */
	for (size_t i = 0; i < s->n; i++) {
		const struct tp_tensor *tt = &s->tt[i];
		const struct hwfs_trec *t = tt->t;
		int split = (tt->kind == TP_DIM0 || tt->kind == TP_DIM1) && numel(t);
		int d = tt->kind == TP_DIM1;
		uint64_t want = t->len;
		const struct st_tensor *x;

		if (tt->kind == TP_EXPERT && tt->expert / (s->experts / N) != r)
			continue;
		if (tt->kind == TP_DIM0 || tt->kind == TP_DIM1)
			want = t->len / (uint64_t)N;
		/* st_parse sorts by (offset, name): find the entry by name */
		x = NULL;
		for (size_t j = 0; j < h->n && !x; j++)
			if (!strcmp(h->t[j].name, t->name))
				x = &h->t[j];
		if (!x)
			die("a tensor of the rank is missing from its header", t->name);
		k++;
		if (strcmp(x->dtype, t->dtype) || x->ndim != t->ndim || x->len != want)
			die("a header entry is not its tensor's slice", t->name);
		/* The slice's shape is torch.chunk's (partition.py), except that an empty
		 * tensor keeps its whole shape (ns_tp.c does not cut what holds no bytes). */
		for (uint32_t j = 0; j < t->ndim; j++)
			if (x->shape[j] != (split && j == (uint32_t)d ? t->shape[j] / (uint64_t)N
								       : t->shape[j]))
				die("a header entry's shape is not its slice's", t->name);
		served[i] += want;
	}
	if (k != h->n)
		die("the header holds a tensor the rank does not", NULL);
	/* Segments: in order, tiling the data, each inside its source tensor. */
	pos = f->head_len;
	for (seg = 0; seg < f->nseg; seg++) {
		const struct tp_seg *g = &f->seg[seg];
		const struct hwfs_trec *t = s->tt[tensor_of(s, g->src)].t;
		uint64_t runs;

		if (g->off != pos || !g->len || !g->run || g->len % g->run)
			die("segments do not tile the view file", t->name);
		runs = g->len / g->run;
		if (runs > 1 && g->stride < g->run)
			die("the runs of a segment overlap", t->name);
		if (g->src_off < t->off ||
		    g->src_off + (runs - 1) * g->stride + g->run > t->off + t->len)
			die("a segment reads outside its tensor", t->name);
		pos += g->len;
	}
	if (pos != f->size)
		die("segments do not end at the view file's end", NULL);
	st_free(h);
}

static int same_file(const struct tp_file *a, const struct tp_file *b)
{
	if (a->size != b->size || a->head_len != b->head_len || a->nseg != b->nseg ||
	    a->npins != b->npins || memcmp(a->head->buf, b->head->buf, a->head_len))
		return 0;
	for (size_t i = 0; i < a->nseg; i++)
		if (a->seg[i].off != b->seg[i].off || a->seg[i].len != b->seg[i].len ||
		    a->seg[i].src != b->seg[i].src || a->seg[i].src_off != b->seg[i].src_off ||
		    a->seg[i].run != b->seg[i].run || a->seg[i].stride != b->seg[i].stride)
			return 0;
	return 1;
}

/* Every size of @s under the rules as they stand. */
static void check_sizes(struct tset *s)
{
	int ok[TP_MAX_N + 1] = {0};

	for (int N = 1; N <= TP_MAX_N; N++) {
		char *why = NULL;
		int rc = tp_check(s->tt, s->n, s->experts, N, &why);

		if (rc != 0 && rc != -EINVAL)
			die("tp_check() gave an unexpected error code", NULL);
		if (rc && (!why || !one_line(why)))
			die("a size refused without a one-line reason", NULL);
		if (!rc && why)
			die("a size that works has a reason", why);
		free(why);
		ok[N] = !rc;
		for (int d = 1; ok[N] && d < N; d++)
			if (N % d == 0 && !ok[d])
				die("a size works but one of its divisors does not", NULL);
	}
	for (int N = 1; N <= TP_MAX_N; N *= 2) {
		uint64_t served[MAX_T] = {0};
		struct tp_file *f0 = NULL;

		if (!ok[N])
			continue;
		for (int r = 0; r < N; r++) {
			struct tp_file *f = NULL;

			if (N > 8 && r > 1 && r != N - 1) /* past 8, ranks 0, 1 and N-1 (speed) */
				continue;

			if (tp_file_build(s->tt, s->n, s->experts, N, r, &f) < 0)
				die("tp_file_build() failed", NULL);
			check_file(s, N, r, f, served);
			if (r && !s->experts) { /* tp_build() clones rank 0's instead */
				struct tp_file *c = tp_file_clone(f0, r);

				if (!c)
					die("out of memory", NULL);
				if (!same_file(c, f))
					die("a cloned rank differs from a built one", NULL);
				tp_file_free(c);
			}
			if (r == 0)
				f0 = f;
			else
				tp_file_free(f);
		}
		tp_file_free(f0);
		for (size_t i = 0; N <= 8 && i < s->n; i++) { /* a slice per rank, or a whole tensor per rank */
			const struct tp_tensor *tt = &s->tt[i];
			uint64_t want = tt->t->len * (tt->kind == TP_REPLICATE ? (uint64_t)N : 1);

			if (served[i] != want)
				die("the ranks of a size do not serve a tensor exactly", tt->t->name);
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text, *why = NULL;
	json_t *js;
	json_error_t je;

	if (size > TP_PARTITION_MAX) /* "cannot be read": nothing parses it */
		return 0;
	text = malloc(size + 1); /* read_small_file(): the bytes and a NUL */
	if (!text)
		die("out of memory", NULL);
	memcpy(text, data, size);
	text[size] = '\0';
	js = json_loads(text, 0, &je);
	free(text);
	if (!js || !json_is_object(js)) { /* every N is EINVAL, with this reason */
		if (!js && !je.text[0])
			die("rejected without a reason", NULL);
		json_decref(js);
		return 0;
	}
	for (size_t k = 0; k < HWFS_ARRAY_SIZE(sets); k++) {
		struct tset *s = &sets[k];
		int rc;

		reset_rules(s);
		rc = apply_overrides(js, s->tt, s->n, &why);
		if (rc) {
			if (rc != -EINVAL || !why || strncmp(why, TP_PARTITION_FILE ": ", sizeof(TP_PARTITION_FILE ": ") - 1))
				die("a bad rule refused without a reason", NULL);
			free(why);
			why = NULL;
			break; /* the same for every version */
		}
		if (why)
			die("rules applied, and a reason", why);
		check_sizes(s);
	}
	json_decref(js);
	return 0;
}
