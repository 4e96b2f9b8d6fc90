/*
 * ns_tensors.c — the tensors/ view of a sealed version: one read-only
 * NT_TENSOR node per tensor of every safetensors file, under one NT_TDIR, and
 * the version's figures (bytes, files, tensors, per-file parse errors).
 *
 * Whether a file exposes tensors is decided by its content (ingest parsed it),
 * not by its name.  A tensor's name is escaped into a file name ('%', '/' and
 * control characters as %XX, "." and ".." made harmless); a name used by two files is qualified
 * with the file's escaped path; names that cannot be a directory entry are
 * left out.  A tensor node reads through its file node and pins it (see
 * ns.c).  The view is built once, when the version is sealed or loaded, and
 * never changes afterwards.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ns_i.h"

/*
 * Does the byte at @p (of a name) start a character that is escaped in a
 * tensor file name: '%', '/', a C0 control, DEL, or a C1 control (U+0080 to
 * U+009F, 0xC2 0x80..0x9F: some terminals obey those too)?  Returns how many
 * bytes it has (1 or 2), or 0 when it is kept as it is.
 */
static int escaped_len(const unsigned char *p)
{
	if (*p == '/' || *p == '%' || *p < 0x20 || *p == 0x7f)
		return 1;
	return p[0] == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F ? 2 : 0;
}

/*
 * Tensor file name: '%', '/' and control characters escaped as %XX (a C1
 * control as its two bytes, %C2%XX), "." and ".." made harmless, so that
 * `ls tensors/` prints no terminal escape and no name spans two lines.
 */
static char *tensor_fname(const char *name)
{
	const unsigned char *u = (const unsigned char *)name;
	size_t n = strlen(name), j = 0;
	char *s = malloc(3 * n + 4);

	if (!s)
		return NULL;
	if (!strcmp(name, ".") || !strcmp(name, "..")) {
		for (size_t i = 0; i < n; i++)
			j += (size_t)sprintf(s + j, "%%2E");
		s[j] = '\0';
		return s;
	}
	for (size_t i = 0; i < n;) {
		int e = escaped_len(u + i);

		if (!e)
			s[j++] = name[i++];
		for (; e > 0; e--)
			j += (size_t)sprintf(s + j, "%%%02X", u[i++]);
	}
	s[j] = '\0';
	return s;
}

/*
 * Whether @fname (a tensor_fname() result, maybe qualified) can be a directory
 * entry: 1..NAME_MAX bytes.  The escaping already removed '/' and made "." and
 * ".." harmless, and a name is a C string (no NUL).  Names that fail are left
 * out of tensors/ (the kernel refuses a whole readdir over one such entry).
 */
static int tensor_fname_ok(const char *fname)
{
	size_t len = strlen(fname);

	return len > 0 && len <= NAME_MAX;
}

/* Add tensors/ to a sealed version, and compute its figures (lock held). */
void ns_version_finish_tree(struct ns *ns, struct version *v)
{
	struct nodelist l = {0};
	struct node *tdir = NULL;
	size_t *order = NULL;

	v->bytes = v->files = v->tensors = 0;
	for (size_t i = 0; i < v->n_errors; i++) {
		free(v->errors[i].file);
		free(v->errors[i].error);
	}
	free(v->errors);
	v->errors = NULL;
	v->n_errors = 0;
	if (ns_collect(&l, v->root) < 0)
		goto out;
	order = malloc((l.n ? l.n : 1) * sizeof(*order));
	if (!order)
		goto out;
	for (size_t i = 0; i < l.n; i++)
		order[i] = i;
	qsort_r(order, l.n, sizeof(*order), ns_cmp_idx, &l);
	if (!ns_child(v->root, "tensors")) {
		tdir = ns_node_new(ns, NT_TDIR, "tensors", S_IFDIR | 0555, v->root->uid, v->root->gid);
		if (tdir)
			tdir->mtime_ns = tdir->ctime_ns = v->sealed_ns;
	}
	for (size_t k = 0; k < l.n; k++) {
		struct node *f = l.v[order[k]];
		const char *path = l.path[order[k]];

		if (f->type != NT_REG)
			continue;
		v->files++;
		v->bytes += f->data.size;
		if (!ns_exposes_tensors(f)) {
			if (ns_ends_with(path, ".safetensors")) {
				struct version_error *e =
					realloc(v->errors, (v->n_errors + 1) * sizeof(*e));

				if (e) {
					v->errors = e;
					e[v->n_errors].file = strdup(path);
					e[v->n_errors].error = strdup(
						f->data.st_error ? f->data.st_error
								 : "not a safetensors file");
					v->n_errors++;
				}
			}
			continue;
		}
		v->tensors += f->data.n_tensors;
		if (!tdir)
			continue;
		for (size_t i = 0; i < f->data.n_tensors; i++) {
			const struct hwfs_trec *t = &f->data.tensors[i];
			char *fname = tensor_fname(t->name);
			struct node *tn;

			if (!fname)
				continue;
			if (!tensor_fname_ok(fname)) {
				LOG_WARN("version %s: %s: a tensor name of %zu bytes cannot be a "
					 "file name; left out of tensors/", v->name, path,
					 strlen(t->name));
				free(fname);
				continue;
			}
			if (ns_child(tdir, fname)) { /* same name in two files: qualify */
				char *q = NULL, *ep = tensor_fname(path);

				if (ep && asprintf(&q, "%s@%s", fname, ep) < 0)
					q = NULL;
				free(ep);
				free(fname);
				fname = q;
				if (!fname || !tensor_fname_ok(fname) || ns_child(tdir, fname)) {
					free(fname);
					continue;
				}
			}
			/* a tensor is readable by whoever may read its file, never writable */
			tn = ns_node_new(ns, NT_TENSOR, fname, S_IFREG | (f->mode & 0444), f->uid,
				      f->gid);
			free(fname);
			if (!tn)
				continue;
			tn->tensor = t;
			tn->tfile = f;
			tn->mtime_ns = tn->ctime_ns = f->mtime_ns;
			if (ns_kid_insert(tdir, tn) < 0) {
				ns_node_free(ns, tn);
				continue;
			}
			f->pins++;
		}
	}
	if (tdir && tdir->nkids && ns_kid_insert(v->root, tdir) == 0)
		tdir = NULL;
	tp_build(ns, v, &l, order);
out:
	if (tdir) {
		tdir->detached = 1;
		ns_node_free(ns, tdir);
	}
	ns_nodelist_free(&l);
	free(order);
}
