/*
 * ns_tp.c — the tp/ view of a sealed version: resharding for tensor
 * parallelism, computed, read-only, never stored nor replicated.
 *
 *   versions/V/tp/README                 each size 1..64: ok, or why not
 *   versions/V/tp/<N>/<r>/model.safetensors
 *                                        rank r's slice of every tensor, TP size N
 *
 * Every tensor of every safetensors file of V (path order, first file wins a
 * duplicated name) gets one rule: split on dim 0, split on dim 1, replicate,
 * or expert (an MoE expert, `...experts.<e>...`, given whole to rank
 * e / (E / N), E the number of experts).  The rules come from
 * `hwfs-partition.json` at the top of V when it has one (an object, name
 * pattern (fnmatch) -> 0, 1, "replicate" or "expert"; the first pattern in
 * file order that matches wins) and otherwise from the built-in rules for
 * Llama, Qwen, Mistral and Mixtral names (tp_rule()).
 *
 * A view file is a safetensors header made here (kept in memory) followed by
 * segments, each a run of bytes of one tensor of a source file: a dim-0 slice
 * or a whole tensor is one contiguous range of the source (served zero-copy:
 * the reply points into the arena), a dim-1 slice is `outer` runs spaced by the
 * tensor's row length (assembled on read: one iovec per run, or one bounce
 * copy when a reply would take more iovecs than the kernel allows: the reads
 * are in ns_tp_file.c).  A view file pins its source files (as tensors/
 * does, see ns.c).  This file builds the view, once, when the version is
 * sealed or loaded (tp_build(): gather the tensors, apply the partition file,
 * then one directory per size).
 *
 * Sizes: the powers of two 1..64 that divide every split tensor (and the
 * expert count) have their tree (one header per size, shared by its ranks
 * when the version has no experts); any other N in 1..64 answers EINVAL on
 * lookup, and tp/README says why, naming the tensor (the powers of two up to
 * 8 that fail are also logged when the version is sealed or loaded).  A
 * tensor name or a partition pattern is whatever a file says: README shows
 * the reason through hwfs_escape() (control characters as \xNN), as the log
 * does, so neither can hold a terminal escape or add a line.
 *
 * Listing (decision, issue 26): tp/ is found by name but readdir of V does
 * not show it (ns_listed()), so `cp -r`, `rsync -a`, `du` and backups of a
 * version see the checkpoint, not up to seven times its bytes in views.  The
 * directories of the view keep their children in numeric order (by_number):
 * readdir of tp/ gives 1 2 4 8 16 ... README, of tp/16/ 0 1 2 ... 15.
 */
#define _GNU_SOURCE
#include <fnmatch.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ns_i.h"

#define TP_MAX_N 64
#define TP_PARTITION_FILE "hwfs-partition.json"
#define TP_PARTITION_MAX (1u << 20)

enum tp_kind { TP_REPLICATE, TP_DIM0, TP_DIM1, TP_EXPERT };

/* One tensor of the version and the rule it gets. */
struct tp_tensor {
	const struct hwfs_trec *t;
	const struct node *src;
	enum tp_kind kind;
	int expert; /* TP_EXPERT: its index */
};

/* ------------------------------------------------------------------ rules */

/* Whether dotted component @comp appears in @name as a whole component. */
static int has_comp(const char *name, const char *comp)
{
	size_t n = strlen(comp);

	for (const char *p = strstr(name, comp); p; p = strstr(p + 1, comp))
		if ((p == name || p[-1] == '.') && (p[n] == '.' || p[n] == '\0'))
			return 1;
	return 0;
}

/* The expert index of an MoE expert tensor (`experts.<e>.`), or -1. */
static int expert_index(const char *name)
{
	for (const char *p = strstr(name, "experts."); p; p = strstr(p + 1, "experts.")) {
		const char *d = p + 8;
		int e = 0;

		if (p != name && p[-1] != '.')
			continue;
		if (*d < '0' || *d > '9')
			continue;
		while (*d >= '0' && *d <= '9' && e < 1000000)
			e = e * 10 + (*d++ - '0');
		if (*d == '.' || *d == '\0')
			return e;
	}
	return -1;
}

/*
 * The built-in rule for tensor @t: MoE experts whole; otherwise the first row
 * of tp_rules.def (the table the Python package reads too) whose component
 * the name holds: split on that row's dim when @t has more dims and its name
 * ends with the row's suffix, else replicated (column-parallel q/k/v/gate/up,
 * the embeddings and lm_head on dim 0; row-parallel o/down weights on dim 1);
 * everything else (norms, routers, biases of row-parallel layers, rotary
 * tables) replicated.
 */
static enum tp_kind tp_rule(const struct hwfs_trec *t)
{
	static const struct {
		uint32_t dim; /* 0 or 1 */
		const char *comp, *suffix;
	} split[] = {
#define TP_SPLIT(dim, comp, suffix) {dim, comp, suffix},
#include "tp_rules.def"
#undef TP_SPLIT
	};

	if (expert_index(t->name) >= 0)
		return TP_EXPERT;
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(split); i++)
		if (has_comp(t->name, split[i].comp))
			return t->ndim > split[i].dim && ns_ends_with(t->name, split[i].suffix)
				       ? (split[i].dim ? TP_DIM1 : TP_DIM0)
				       : TP_REPLICATE;
	return TP_REPLICATE;
}

/* A finished file's bytes [0, size) copied out (size <= TP_PARTITION_MAX), or NULL. */
static char *read_small_file(struct ns *ns, const struct node *f)
{
	const struct ingest_result *d = &f->data;
	char *buf;
	uint64_t pos = 0;

	if (f->type != NT_REG || node_writer(f) || d->size > TP_PARTITION_MAX)
		return NULL;
	buf = malloc(d->size + 1);
	if (!buf)
		return NULL;
	for (size_t i = 0; i < d->n_ext && pos < d->size; i++) {
		memcpy(buf + d->ext[i].off, store_shard_data(ns->st, d->ext[i].sh), d->ext[i].len);
		pos = d->ext[i].off + d->ext[i].len;
	}
	buf[d->size] = '\0';
	return buf;
}

/*
 * Apply hwfs-partition.json (@js, parsed) to @tt: 0, or -EINVAL with @why
 * set (a bad rule value).
 */
static int apply_overrides(json_t *js, struct tp_tensor *tt, size_t n, char **why)
{
	const char *pat;
	json_t *val;

	json_object_foreach(js, pat, val) {
		if (!(json_is_integer(val) && (json_integer_value(val) == 0 ||
					       json_integer_value(val) == 1)) &&
		    !(json_is_string(val) && (!strcmp(json_string_value(val), "replicate") ||
					      !strcmp(json_string_value(val), "expert")))) {
			if (asprintf(why, TP_PARTITION_FILE ": pattern \"%s\": the rule must be 0, 1, "
					  "\"replicate\" or \"expert\"", pat) < 0)
				*why = NULL;
			return -EINVAL;
		}
	}
	for (size_t i = 0; i < n; i++) {
		json_object_foreach(js, pat, val) {
			if (fnmatch(pat, tt[i].t->name, 0) != 0)
				continue;
			if (json_is_integer(val))
				tt[i].kind = json_integer_value(val) == 0 ? TP_DIM0 : TP_DIM1;
			else if (!strcmp(json_string_value(val), "replicate"))
				tt[i].kind = TP_REPLICATE;
			else
				tt[i].kind = TP_EXPERT;
			break;
		}
	}
	return 0;
}

/* The number of elements of @t (0 for an empty tensor). */
static uint64_t numel(const struct hwfs_trec *t)
{
	uint64_t n = 1;

	for (uint32_t i = 0; i < t->ndim; i++)
		n *= t->shape[i];
	return n;
}

/*
 * Whether TP size @N serves every tensor: 0, or -EINVAL with @why set to the
 * first tensor that does not divide (malloc'd).
 */
static int tp_check(const struct tp_tensor *tt, size_t n, int experts, int N, char **why)
{
	for (size_t i = 0; i < n; i++) {
		const struct hwfs_trec *t = tt[i].t;
		int d = tt[i].kind == TP_DIM1;
		int r = 0;

		*why = NULL;
		if (tt[i].kind == TP_DIM0 || tt[i].kind == TP_DIM1) {
			if (t->ndim <= (uint32_t)d)
				r = asprintf(why, "tensor %s: has %u dims, cannot be split on dim %d",
					     t->name, t->ndim, d);
			else if (t->shape[d] % (uint64_t)N)
				r = asprintf(why, "tensor %s: dim %d of size %llu does not divide by "
						  "%d", t->name, d, (unsigned long long)t->shape[d], N);
			else if (numel(t) && t->len % numel(t))
				r = asprintf(why, "tensor %s: %llu bytes do not hold its shape",
					     t->name, (unsigned long long)t->len);
			else
				continue;
		} else if (tt[i].kind == TP_EXPERT) {
			if (tt[i].expert < 0)
				r = asprintf(why, "tensor %s: an expert rule, but no experts.<e> in "
						  "its name", t->name);
			else if (experts % N)
				r = asprintf(why, "tensor %s: %d experts do not divide by %d",
					     t->name, experts, N);
			else
				continue;
		} else {
			continue;
		}
		if (r < 0)
			*why = NULL;
		return -EINVAL;
	}
	return 0;
}

/* ----------------------------------------------------------- view files */

static int add_seg(struct tp_file *f, size_t *cap, const struct tp_seg *s)
{
	if (f->nseg == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		struct tp_seg *ns = realloc(f->seg, nc * sizeof(*ns));

		if (!ns)
			return -ENOMEM;
		f->seg = ns;
		*cap = nc;
	}
	f->seg[f->nseg++] = *s;
	return 0;
}

static int add_pin(struct tp_file *f, const struct node *src)
{
	struct node **np;

	for (size_t i = 0; i < f->npins; i++)
		if (f->pins[i] == src)
			return 0;
	np = realloc(f->pins, (f->npins + 1) * sizeof(*np));
	if (!np)
		return -ENOMEM;
	f->pins = np;
	f->pins[f->npins++] = (struct node *)src;
	return 0;
}

/* Rank @r's view file for size @N (every tensor checked by tp_check): 0 or -ENOMEM. */
static int tp_file_build(const struct tp_tensor *tt, size_t n, int experts, int N, int r,
			 struct tp_file **out)
{
	struct tp_file *f = calloc(1, sizeof(*f));
	json_t *hdr = json_object(), *meta = json_pack("{s:s}", "format", "pt");
	size_t cap = 0;
	uint64_t data = 0;
	char *js = NULL;
	int rc = -ENOMEM;

	if (!f || !hdr || !meta || json_object_set_new(hdr, "__metadata__", meta) < 0)
		goto out;
	meta = NULL;
	for (size_t i = 0; i < n; i++) {
		const struct hwfs_trec *t = tt[i].t;
		struct tp_seg s = {0};
		json_t *shape = json_array(), *e;

		if (!shape)
			goto out;
		s.src = tt[i].src;
		s.src_off = t->off;
		s.run = s.len = t->len;
		for (uint32_t k = 0; k < t->ndim; k++)
			json_array_append_new(shape, json_integer((json_int_t)t->shape[k]));
		if (tt[i].kind == TP_EXPERT) {
			if (tt[i].expert / (experts / N) != r) {
				json_decref(shape);
				continue;
			}
		} else if ((tt[i].kind == TP_DIM0 || tt[i].kind == TP_DIM1) && numel(t)) {
			int d = tt[i].kind == TP_DIM1;
			uint64_t outer = 1, inner = t->len / numel(t);

			for (int k = 0; k < d; k++)
				outer *= t->shape[k];
			for (uint32_t k = (uint32_t)d + 1; k < t->ndim; k++)
				inner *= t->shape[k];
			s.stride = t->shape[d] * inner;
			s.run = t->shape[d] / (uint64_t)N * inner;
			s.src_off = t->off + (uint64_t)r * s.run;
			s.len = s.run * outer;
			json_array_set_new(shape, (size_t)d,
					   json_integer((json_int_t)(t->shape[d] / (uint64_t)N)));
		}
		s.off = data;
		e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", t->dtype, "shape", shape,
			      "data_offsets", (json_int_t)data, (json_int_t)(data + s.len));
		if (!e || json_object_set_new(hdr, t->name, e) < 0)
			goto out;
		data += s.len;
		if (s.len && (add_seg(f, &cap, &s) < 0 || add_pin(f, s.src) < 0))
			goto out;
	}
	js = json_dumps(hdr, JSON_COMPACT);
	if (!js)
		goto out;
	{
		size_t jl = strlen(js), pad = (8 - jl % 8) % 8;
		uint64_t hl = jl + pad;

		char *buf = malloc(8 + hl);

		f->head_len = 8 + hl;
		f->head = buf ? calloc(1, sizeof(*f->head)) : NULL;
		if (!f->head) {
			free(buf);
			goto out;
		}
		*f->head = (struct tp_head){buf, f->head_len, 1};
		for (int k = 0; k < 8; k++)
			buf[k] = (char)(hl >> (8 * k));
		memcpy(buf + 8, js, jl);
		memset(buf + 8 + jl, ' ', pad);
	}
	for (size_t k = 0; k < f->nseg; k++)
		f->seg[k].off += f->head_len;
	f->size = f->head_len + data;
	*out = f;
	f = NULL;
	rc = 0;
out:
	free(js);
	json_decref(meta);
	json_decref(hdr);
	tp_file_free(f);
	return rc;
}

/*
 * Rank @r's view file made from rank 0's @f0 of the same size, for a version
 * without experts (every rank has the same tensors, so the same header,
 * shared): the split segments start @r runs further.  NULL: out of memory.
 */
static struct tp_file *tp_file_clone(const struct tp_file *f0, int r)
{
	struct tp_file *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	*f = *f0;
	f->seg = malloc((f0->nseg ? f0->nseg : 1) * sizeof(*f->seg));
	f->pins = malloc((f0->npins ? f0->npins : 1) * sizeof(*f->pins));
	if (!f->seg || !f->pins) {
		free(f->seg);
		free(f->pins);
		free(f);
		return NULL;
	}
	memcpy(f->seg, f0->seg, f0->nseg * sizeof(*f->seg));
	memcpy(f->pins, f0->pins, f0->npins * sizeof(*f->pins));
	for (size_t i = 0; i < f->nseg; i++)
		if (f->seg[i].stride) /* split: rank r's runs */
			f->seg[i].src_off += (uint64_t)r * f->seg[i].run;
	f->head->refs++;
	return f;
}

/* A text file of the view (README): its bytes are its header. */
static struct tp_file *tp_text(char *text)
{
	struct tp_file *f = calloc(1, sizeof(*f));

	if (f)
		f->head = calloc(1, sizeof(*f->head));
	if (!f || !f->head) {
		free(f);
		free(text);
		return NULL;
	}
	*f->head = (struct tp_head){text, strlen(text), 1};
	f->head_len = f->size = f->head->len;
	return f;
}

/* A view node (lock held): a read-only NT_TDIR or NT_TPFILE named @name. */
static struct node *tp_node(struct ns *ns, struct version *v, enum ntype type, const char *name,
			    uint32_t mode)
{
	struct node *n = ns_node_new(ns, type, name, mode, v->root->uid, v->root->gid);

	if (n) {
		n->mtime_ns = n->ctime_ns = v->sealed_ns;
		n->ver = v;
		n->by_number = type == NT_TDIR;
	}
	return n;
}

/* Attach view file @f as @name in @dir, pinning its sources: 0 or -ENOMEM (@f freed). */
static int tp_attach_file(struct ns *ns, struct version *v, struct node *dir, const char *name,
			  struct tp_file *f, uint32_t mode)
{
	struct node *n = f ? tp_node(ns, v, NT_TPFILE, name, S_IFREG | mode) : NULL;

	if (!n) {
		tp_file_free(f);
		return -ENOMEM;
	}
	n->tp = f;
	if (ns_kid_insert(dir, n) < 0) {
		n->tp = NULL;
		ns_node_free(ns, n);
		tp_file_free(f);
		return -ENOMEM;
	}
	for (size_t i = 0; i < f->npins; i++)
		f->pins[i]->pins++;
	return 0;
}

static int is_pow2(int n)
{
	return n > 0 && !(n & (n - 1));
}

/* Append to the README being built (*@buf, NULL once out of memory). */
static void text_add(char **buf, const char *fmt, const char *a, int N)
{
	char *nb = NULL;

	if (!*buf)
		return;
	if (asprintf(&nb, fmt, *buf, N, a) < 0)
		nb = NULL;
	free(*buf);
	*buf = nb;
}

/* What tp_build() works from: the version's tensors with their rules. */
struct tp_plan {
	struct tp_tensor *tt;
	size_t n, cap;
	int experts;   /* the number of experts (0: none) */
	uint32_t mode; /* the view files' mode: 0444 as every source file allows it */
	char *err;     /* why no size can be served (hwfs-partition.json unusable), or NULL */
};

/*
 * tp_gather() - every tensor of the safetensors files of @l, in @order (path
 * order: the first file wins a duplicated name), with its built-in rule.
 * Returns 0 or -ENOMEM.
 */
static int tp_gather(struct tp_plan *pl, const struct nodelist *l, const size_t *order)
{
	for (size_t k = 0; k < l->n; k++) {
		const struct node *f = l->v[order[k]];

		if (f->type != NT_REG || !ns_exposes_tensors(f))
			continue;
		pl->mode &= f->mode;
		for (size_t i = 0; i < f->data.n_tensors; i++) {
			const struct hwfs_trec *t = &f->data.tensors[i];
			struct tp_tensor *tt;
			int dup = 0;

			for (size_t j = 0; j < pl->n && !dup; j++)
				dup = !strcmp(pl->tt[j].t->name, t->name);
			if (dup)
				continue;
			if (pl->n == pl->cap) {
				size_t nc = pl->cap ? pl->cap * 2 : 64;
				struct tp_tensor *nt = realloc(pl->tt, nc * sizeof(*nt));

				if (!nt)
					return -ENOMEM;
				pl->tt = nt;
				pl->cap = nc;
			}
			tt = &pl->tt[pl->n++];
			tt->t = t;
			tt->src = f;
			tt->kind = tp_rule(t);
			tt->expert = expert_index(t->name);
			if (tt->expert + 1 > pl->experts)
				pl->experts = tt->expert + 1;
		}
	}
	return 0;
}

/*
 * tp_partition() - apply the rules of version @v's hwfs-partition.json, when
 * it has one; a file that cannot be used sets pl->err (then every size is
 * refused with that reason).
 */
static void tp_partition(struct ns *ns, struct version *v, struct tp_plan *pl)
{
	struct node *part = ns_child(v->root, TP_PARTITION_FILE);
	json_t *js = NULL;
	json_error_t je;
	char *text;

	if (!part)
		return;
	text = read_small_file(ns, part);
	js = text ? json_loads(text, 0, &je) : NULL;
	if (!js || !json_is_object(js)) {
		if (asprintf(&pl->err, TP_PARTITION_FILE ": %s", !text ? "cannot be read (a regular "
			     "file of at most 1 MiB)" : js ? "not a JSON object" : je.text) < 0)
			pl->err = NULL;
	} else {
		apply_overrides(js, pl->tt, pl->n, &pl->err);
	}
	free(text);
	json_decref(js);
}

/*
 * tp_size_why() - whether TP size @N can be served: 0, or -EINVAL with the
 * reason in *@why (malloc'd; NULL without memory).
 */
static int tp_size_why(const struct tp_plan *pl, int N, char **why)
{
	int bad;

	*why = NULL;
	if (pl->err) {
		*why = strdup(pl->err);
		return -EINVAL;
	}
	bad = tp_check(pl->tt, pl->n, pl->experts, N, why);
	if (!bad && !is_pow2(N)) {
		*why = strdup("every tensor divides, but tp/ serves powers of two only "
			      "(hwfs.open(m).map(V, tp=(N, r)) takes any N)");
		bad = -EINVAL;
	}
	return bad;
}

/*
 * tp_add_size() - add tp/<N>/ to @tpdir: the view file of every rank, or
 * (a directory that lookup refuses) why size @N cannot be served; either way
 * a line of the README being built in *@readme.  Returns 0 or -ENOMEM.
 */
static int tp_add_size(struct ns *ns, struct version *v, const struct tp_plan *pl,
		       struct node *tpdir, int N, char **readme)
{
	struct tp_file *f0 = NULL;
	char name[16], *why;
	struct node *nd;
	int bad = tp_size_why(pl, N, &why);

	snprintf(name, sizeof(name), "%d", N);
	nd = tp_node(ns, v, NT_TDIR, name, S_IFDIR | 0555);
	if (!nd) {
		free(why);
		return -ENOMEM;
	}
	if (bad) {
		char *esc;

		nd->why = why ? why : strdup("cannot be served");
		/* a tensor name or a rule's pattern: no raw escape, no line of its own */
		esc = nd->why ? hwfs_escape_dup(nd->why) : NULL;
		text_add(readme, "%s%d: EINVAL: %s\n", esc ? esc : "cannot be served", N);
		free(esc);
		if (is_pow2(N) && N <= 8) /* hwfs_log escapes it */
			LOG_INFO("version %s: tp/%d: %s", v->name, N, nd->why);
	} else {
		free(why);
		text_add(readme, "%s%d: ok\n", "", N);
	}
	if (ns_kid_insert(tpdir, nd) < 0) {
		ns_node_free(ns, nd);
		return -ENOMEM;
	}
	for (int r = 0; !bad && r < N; r++) {
		struct tp_file *f = NULL;
		struct node *rd;

		snprintf(name, sizeof(name), "%d", r);
		rd = tp_node(ns, v, NT_TDIR, name, S_IFDIR | 0555);
		if (!rd)
			return -ENOMEM;
		if (ns_kid_insert(nd, rd) < 0) {
			ns_node_free(ns, rd);
			return -ENOMEM;
		}
		if (f0 && !pl->experts)
			f = tp_file_clone(f0, r);
		else if (tp_file_build(pl->tt, pl->n, pl->experts, N, r, &f) < 0)
			f = NULL;
		if (r == 0)
			f0 = f;
		if (tp_attach_file(ns, v, rd, "model.safetensors", f, pl->mode & 0444) < 0)
			return -ENOMEM;
	}
	return 0;
}

void tp_build(struct ns *ns, struct version *v, struct nodelist *l, const size_t *order)
{
	struct tp_plan pl = {.mode = 0444};
	struct node *tpdir = NULL;
	char *readme = NULL;

	if (ns_child(v->root, "tp"))
		return; /* the checkpoint's own entry wins */
	if (tp_gather(&pl, l, order) < 0 || !pl.n)
		goto out;
	tp_partition(ns, v, &pl);
	tpdir = tp_node(ns, v, NT_TDIR, "tp", S_IFDIR | 0555);
	readme = strdup("TP views of this version: tp/N/r/model.safetensors is rank r's slice of "
			"every tensor for tensor-parallel size N (docs/trainers.md).\n"
			"Sizes 1..64 (listed: the powers of two that work):\n");
	if (!tpdir || !readme)
		goto out;
	for (int N = 1; N <= TP_MAX_N; N++)
		if (tp_add_size(ns, v, &pl, tpdir, N, &readme) < 0)
			goto out;
	if (tp_attach_file(ns, v, tpdir, "README", tp_text(readme), 0444) < 0) {
		readme = NULL;
		goto out;
	}
	readme = NULL;
	if (ns_kid_insert(v->root, tpdir) == 0)
		tpdir = NULL;
out:
	if (tpdir)
		ns_detach_tree(ns, tpdir);
	free(readme);
	free(pl.err);
	free(pl.tt);
}
