/*
 * ns.c — the in-memory namespace (see ns.h for the model and the locking).
 *
 * Directories keep their children in an array sorted by name, which gives
 * binary-search lookups and readdir offsets that stay meaningful while a
 * directory changes (the offset is an index; a change between two readdir
 * calls may repeat or skip an entry, as POSIX allows).
 *
 * Node lifetime: a node lives while it is attached to the tree, looked up by
 * the kernel (nlookup) or open (nopen).  "Release" (giving back the shards of
 * a file) happens earlier than "free" (the struct itself): as soon as a
 * detached node is closed, so that `hwfs rm` frees memory when the last reader
 * closes even if the kernel keeps the inode cached.  A tensor node reads
 * through its file node and pins it while it may be read.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "manifest.h"
#include "ns.h"
#include "tunables.h"

struct ns {
	struct store *st;
	pthread_rwlock_t lock;
	struct node *root, *versions;
	struct version **vers; /* in seq order */
	size_t nvers, capvers;
	struct version *graveyard; /* removed versions, freed at ns_destroy */
	struct node orphans;       /* list head: detached nodes still referenced */
	void (*seal_hook)(void *arg, const char *name);
	void *seal_hook_arg;
	uint64_t next_ino; /* atomic */
	uint64_t next_seq;
};

static void node_free(struct ns *ns, struct node *n);

/* ------------------------------------------------------------------ nodes */

uint64_t ns_next_ino(struct ns *ns)
{
	return __atomic_add_fetch(&ns->next_ino, 1, __ATOMIC_RELAXED);
}

static struct node *node_new(struct ns *ns, enum ntype type, const char *name, uint32_t mode,
			     uint32_t uid, uint32_t gid)
{
	struct node *n = calloc(1, sizeof(*n));

	if (!n)
		return NULL;
	n->name = strdup(name);
	if (!n->name) {
		free(n);
		return NULL;
	}
	n->ino = type == NT_ROOT ? 1 : ns_next_ino(ns);
	n->type = type;
	n->mode = mode;
	n->uid = uid;
	n->gid = gid;
	n->mtime_ns = n->ctime_ns = hwfs_now_ns();
	if (type == NT_REG)
		pthread_mutex_init(&n->mu, NULL);
	return n;
}

static int is_dir_type(enum ntype t)
{
	return t == NT_ROOT || t == NT_VERSIONS || t == NT_VROOT || t == NT_DIR || t == NT_TDIR;
}

/* Position of @name in @dir's sorted children (or where it would go). */
static size_t kid_pos(const struct node *dir, const char *name, int *found)
{
	size_t lo = 0, hi = dir->nkids;

	*found = 0;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(dir->kids[mid]->name, name);

		if (c == 0) {
			*found = 1;
			return mid;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct node *ns_child(struct node *dir, const char *name)
{
	int found;
	size_t i;

	if (!is_dir_type(dir->type))
		return NULL;
	i = kid_pos(dir, name, &found);
	return found ? dir->kids[i] : NULL;
}

static int kid_insert(struct node *dir, struct node *n)
{
	int found;
	size_t i = kid_pos(dir, n->name, &found);

	if (found)
		return -EEXIST;
	if (dir->nkids == dir->capkids) {
		size_t ncap = dir->capkids ? dir->capkids * 2 : 8;
		struct node **k = realloc(dir->kids, ncap * sizeof(*k));

		if (!k)
			return -ENOMEM;
		dir->kids = k;
		dir->capkids = ncap;
	}
	memmove(dir->kids + i + 1, dir->kids + i, (dir->nkids - i) * sizeof(*dir->kids));
	dir->kids[i] = n;
	dir->nkids++;
	n->parent = dir;
	n->ver = dir->type == NT_VERSIONS ? n->ver : dir->ver;
	return 0;
}

static void kid_remove(struct node *dir, struct node *n)
{
	int found;
	size_t i = kid_pos(dir, n->name, &found);

	if (!found || dir->kids[i] != n)
		return;
	memmove(dir->kids + i, dir->kids + i + 1, (dir->nkids - i - 1) * sizeof(*dir->kids));
	dir->nkids--;
	n->parent = NULL;
}

/* Give back the bytes of a detached, closed node. */
static void node_release_data(struct ns *ns, struct node *n)
{
	if (n->type == NT_REG) {
		if (n->pins)
			return;
		writer_abort(n->w);
		n->w = NULL;
		ingest_result_clear(ns->st, &n->data);
	} else if (n->type == NT_TENSOR && n->tfile) {
		struct node *f = n->tfile;

		n->tfile = NULL;
		n->tensor = NULL;
		f->pins--;
		if (f->detached && __atomic_load_n(&f->nopen, __ATOMIC_ACQUIRE) == 0) {
			node_release_data(ns, f);
			if (__atomic_load_n(&f->nlookup, __ATOMIC_ACQUIRE) == 0)
				node_free(ns, f);
		}
	}
}

/*
 * Whether @n can be freed (exclusive lock held): detached, forgotten by the
 * kernel, closed and pinned by no tensor.  Under the exclusive lock the counts
 * are exact: references are only taken under the namespace lock (ns_open,
 * ns_lookup_ref callers) and only dropped under the exclusive one.
 */
static int node_freeable(const struct node *n)
{
	return n->detached && __atomic_load_n(&n->nlookup, __ATOMIC_ACQUIRE) == 0 &&
	       __atomic_load_n(&n->nopen, __ATOMIC_ACQUIRE) == 0 && n->pins == 0;
}

static void node_free(struct ns *ns, struct node *n)
{
	if (n->orph_next) { /* leave the orphan list */
		n->orph_prev->orph_next = n->orph_next;
		n->orph_next->orph_prev = n->orph_prev;
		n->orph_next = n->orph_prev = NULL;
	}
	node_release_data(ns, n);
	if (n->type == NT_REG) {
		if (n->pins)
			return;
		pthread_mutex_destroy(&n->mu);
	}
	free(n->kids);
	free(n->target);
	free(n->name);
	free(n);
}

/* Detach @n and its whole subtree (exclusive lock held). */
static void detach_tree(struct ns *ns, struct node *n)
{
	if (n->parent)
		kid_remove(n->parent, n);
	/* atomic: ns_writable() reads it without the namespace lock */
	__atomic_store_n(&n->detached, 1, __ATOMIC_RELEASE);
	for (size_t i = 0; i < n->nkids; i++) {
		n->kids[i]->parent = NULL;
		detach_tree(ns, n->kids[i]);
	}
	n->nkids = 0;
	if (__atomic_load_n(&n->nopen, __ATOMIC_ACQUIRE) == 0)
		node_release_data(ns, n);
	if (node_freeable(n)) {
		node_free(ns, n);
	} else if (!n->orph_next) { /* still open or known to the kernel */
		n->orph_next = ns->orphans.orph_next;
		n->orph_prev = &ns->orphans;
		ns->orphans.orph_next->orph_prev = n;
		ns->orphans.orph_next = n;
	}
}

void ns_lookup_ref(struct node *n)
{
	__atomic_add_fetch(&n->nlookup, 1, __ATOMIC_RELAXED);
}

void ns_forget(struct ns *ns, struct node *n, uint64_t nlookup)
{
	uint64_t old, left;

	if (n->type == NT_ROOT)
		return;
	ns_wrlock(ns);
	old = __atomic_load_n(&n->nlookup, __ATOMIC_RELAXED);
	do /* the kernel never forgets more than it looked up; clamp anyway */
		left = old > nlookup ? old - nlookup : 0;
	while (!__atomic_compare_exchange_n(&n->nlookup, &old, left, 0, __ATOMIC_ACQ_REL,
					    __ATOMIC_RELAXED));
	if (node_freeable(n))
		node_free(ns, n);
	ns_unlock(ns);
}

void ns_open_ref(struct node *n)
{
	__atomic_add_fetch(&n->nopen, 1, __ATOMIC_ACQ_REL);
}

/*
 * Take an open reference on @n unless it is detached (removed).  The shared
 * lock orders this against detach_tree() (exclusive lock): either the removal
 * sees the reference and keeps the node's data for this opener, or the opener
 * sees the node detached and gets -ENOENT.  Returns 0 or -ENOENT.
 */
int ns_open(struct ns *ns, struct node *n)
{
	int r = 0;

	ns_rdlock(ns);
	if (n->detached)
		r = -ENOENT;
	else
		ns_open_ref(n);
	ns_unlock(ns);
	return r;
}

void ns_release(struct ns *ns, struct node *n)
{
	uint32_t left;

	/*
	 * The last close of a file being written cuts its tail (see ingest.h).
	 * Best effort: two closes at once may both see the other's handle and
	 * leave the writer to the next close or to the seal (finish_files).
	 */
	if (n->type == NT_REG) {
		pthread_mutex_lock(&n->mu);
		if (n->w && __atomic_load_n(&n->nopen, __ATOMIC_ACQUIRE) == 1) {
			if (writer_finish(n->w, &n->data) < 0) {
				LOG_ERR("file %s: out of memory while finishing; data lost", n->name);
				n->write_error = ENOMEM;
			}
			n->w = NULL;
		}
		pthread_mutex_unlock(&n->mu);
	}
	/*
	 * The count drops under the exclusive lock, which excludes ns_open()
	 * (shared lock) and detach_tree(): the value left is exact, so exactly
	 * one of "the removal" and "the last close" gives the data back.
	 */
	ns_wrlock(ns);
	left = __atomic_sub_fetch(&n->nopen, 1, __ATOMIC_ACQ_REL);
	if (n->detached && left == 0) {
		node_release_data(ns, n);
		if (node_freeable(n))
			node_free(ns, n);
	}
	ns_unlock(ns);
}

/* --------------------------------------------------------------- versions */

struct store *ns_store(struct ns *ns)
{
	return ns->st;
}

struct node *ns_root(struct ns *ns)
{
	return ns->root;
}

void ns_rdlock(struct ns *ns)
{
	pthread_rwlock_rdlock(&ns->lock);
}

void ns_wrlock(struct ns *ns)
{
	pthread_rwlock_wrlock(&ns->lock);
}

void ns_unlock(struct ns *ns)
{
	pthread_rwlock_unlock(&ns->lock);
}

struct version *ns_version(struct ns *ns, const char *name)
{
	struct node *n = ns_child(ns->versions, name);

	return n ? n->ver : NULL;
}

int ns_writable(const struct node *n)
{
	const struct version *v = n->ver;

	return v && !__atomic_load_n(&n->detached, __ATOMIC_ACQUIRE) &&
	       __atomic_load_n(&v->state, __ATOMIC_RELAXED) == HWFS_V_OPEN &&
	       !__atomic_load_n(&v->sealing, __ATOMIC_RELAXED) &&
	       n->type != NT_TDIR && n->type != NT_TENSOR;
}

static void version_free(struct version *v)
{
	for (size_t i = 0; i < v->n_errors; i++) {
		free(v->errors[i].file);
		free(v->errors[i].error);
	}
	free(v->errors);
	free(v->name);
	free(v);
}

/* Create a version and its root (exclusive lock held). */
static int version_new(struct ns *ns, const char *name, enum hwfs_vstate state, uint64_t seq,
		       uint32_t mode, uint32_t uid, uint32_t gid, struct version **out)
{
	struct version *v = calloc(1, sizeof(*v));
	struct node *root = NULL;
	int r = -ENOMEM;

	if (!v)
		return -ENOMEM;
	v->name = strdup(name);
	root = node_new(ns, NT_VROOT, name, S_IFDIR | (mode & 07777), uid, gid);
	if (!v->name || !root)
		goto fail;
	if (ns->nvers == ns->capvers) {
		size_t ncap = ns->capvers ? ns->capvers * 2 : 16;
		struct version **nv = realloc(ns->vers, ncap * sizeof(*nv));

		if (!nv)
			goto fail;
		ns->vers = nv;
		ns->capvers = ncap;
	}
	root->ver = v;
	r = kid_insert(ns->versions, root);
	if (r < 0)
		goto fail;
	root->ver = v;
	v->root = root;
	v->state = state;
	v->seq = seq ? seq : ns->next_seq;
	if (v->seq >= ns->next_seq)
		ns->next_seq = v->seq + 1;
	v->created_ns = hwfs_now_ns();
	ns->vers[ns->nvers++] = v;
	*out = v;
	return 0;
fail:
	if (root)
		node_free(ns, root);
	if (v)
		version_free(v);
	return r;
}

/* Forget version @v: detach its tree (exclusive lock held). */
static void version_drop(struct ns *ns, struct version *v)
{
	size_t i;

	for (i = 0; i < ns->nvers && ns->vers[i] != v; i++)
		;
	if (i < ns->nvers) {
		memmove(ns->vers + i, ns->vers + i + 1, (ns->nvers - i - 1) * sizeof(*ns->vers));
		ns->nvers--;
	}
	detach_tree(ns, v->root);
	/*
	 * Nodes that survive (open, or still known to the kernel) point at @v,
	 * and the lock-free read path looks at v->state: keep the struct until
	 * shutdown rather than count references to it.
	 */
	v->next_dead = ns->graveyard;
	ns->graveyard = v;
}

/* Path of @n relative to its version root, malloc'd. */
static char *node_path(const struct node *n)
{
	size_t len = 0, pos;
	const struct node *p;
	char *s;

	for (p = n; p && p->type != NT_VROOT; p = p->parent)
		len += strlen(p->name) + 1;
	s = malloc(len + 1);
	if (!s)
		return NULL;
	pos = len;
	s[pos] = '\0';
	for (p = n; p && p->type != NT_VROOT; p = p->parent) {
		size_t l = strlen(p->name);

		pos -= l;
		memcpy(s + pos, p->name, l);
		if (pos)
			s[--pos] = '/';
	}
	if (len && s[0] == '/') /* the loop leaves one separator in front */
		memmove(s, s + 1, len);
	return s;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);

	return a >= b && !strcmp(s + a - b, suffix);
}

/* Tensor file name: '%' and '/' escaped, "." and ".." made harmless. */
static char *tensor_fname(const char *name)
{
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
	for (size_t i = 0; i < n; i++) {
		if (name[i] == '/' || name[i] == '%')
			j += (size_t)sprintf(s + j, "%%%02X", (unsigned char)name[i]);
		else
			s[j++] = name[i];
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

/* Collect a version's nodes of the given kinds in path order. */
struct nodelist {
	struct node **v;
	char **path;
	size_t n, cap;
};

static int collect(struct nodelist *l, struct node *n)
{
	for (size_t i = 0; i < n->nkids; i++) {
		struct node *k = n->kids[i];

		if (k->type == NT_TDIR)
			continue;
		if (l->n == l->cap) {
			size_t ncap = l->cap ? l->cap * 2 : 64;
			struct node **nv = realloc(l->v, ncap * sizeof(*nv));
			char **np = realloc(l->path, ncap * sizeof(*np));

			if (nv)
				l->v = nv;
			if (np)
				l->path = np;
			if (!nv || !np)
				return -ENOMEM;
			l->cap = ncap;
		}
		l->path[l->n] = node_path(k);
		if (!l->path[l->n])
			return -ENOMEM;
		l->v[l->n++] = k;
		if (k->type == NT_DIR && collect(l, k) < 0)
			return -ENOMEM;
	}
	return 0;
}

static void nodelist_free(struct nodelist *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->path[i]);
	free(l->path);
	free(l->v);
}

static int cmp_idx(const void *a, const void *b, void *ctx)
{
	const struct nodelist *l = ctx;

	return strcmp(l->path[*(const size_t *)a], l->path[*(const size_t *)b]);
}

/*
 * Whether the tensors of this file are exposed and listed: decided by content,
 * whatever the file's name (a Hugging Face cache names its blobs by hash).
 * Ingest parsed the bytes strictly: a plausible header length (the header
 * starts with '{', fits the file and the size limit), a valid header, and a
 * data buffer ending exactly at the file's end; anything else leaves no
 * tensors.  Only *.safetensors files that fail report why (build_vrec).
 */
static int exposes_tensors(const struct node *n)
{
	return n->data.tensors && !n->data.st_error;
}

/*
 * Build the plain record of version @v (lock held, files finished).
 * With @locs, also the arena location of every distinct shard.
 */
static int build_vrec(struct ns *ns, struct version *v, struct hwfs_vrec **out,
		      struct hwfs_shardloc **locs, size_t *n_locs)
{
	struct nodelist l = {0};
	struct hwfs_vrec *rec = calloc(1, sizeof(*rec));
	size_t *order = NULL, nl = 0, capl = 0;
	int r = -ENOMEM;

	if (!rec || collect(&l, v->root) < 0)
		goto out;
	order = malloc((l.n ? l.n : 1) * sizeof(*order));
	rec->files = calloc(l.n ? l.n : 1, sizeof(*rec->files));
	rec->name = strdup(v->name);
	if (!order || !rec->files || !rec->name)
		goto out;
	for (size_t i = 0; i < l.n; i++)
		order[i] = i;
	qsort_r(order, l.n, sizeof(*order), cmp_idx, &l);
	rec->state = v->state;
	rec->seq = v->seq;
	rec->created_ns = v->created_ns;
	rec->sealed_ns = v->sealed_ns;
	rec->digest = v->digest;
	if (locs)
		*locs = NULL;
	for (size_t k = 0; k < l.n; k++) {
		struct node *n = l.v[order[k]];
		struct hwfs_frec *f = &rec->files[rec->n_files++];

		f->path = l.path[order[k]];
		l.path[order[k]] = NULL;
		f->mode = n->mode & 07777;
		f->uid = n->uid;
		f->gid = n->gid;
		f->mtime_ns = n->mtime_ns;
		if (n->type == NT_DIR) {
			f->kind = HWFS_K_DIR;
			continue;
		}
		if (n->type == NT_LNK) {
			f->kind = HWFS_K_LNK;
			f->target = strdup(n->target);
			if (!f->target)
				goto out;
			continue;
		}
		f->kind = HWFS_K_REG;
		f->size = n->data.size;
		f->n_ext = n->data.n_ext;
		f->ext = malloc((f->n_ext ? f->n_ext : 1) * sizeof(*f->ext));
		if (!f->ext)
			goto out;
		for (size_t i = 0; i < f->n_ext; i++) {
			const struct fext *e = &n->data.ext[i];

			f->ext[i] = (struct hwfs_extent){e->off, e->len, e->sh->hash};
			if (!locs)
				continue;
			if (nl == capl) {
				size_t ncap = capl ? capl * 2 : 256;
				struct hwfs_shardloc *nlocs = realloc(*locs, ncap * sizeof(**locs));

				if (!nlocs)
					goto out;
				*locs = nlocs;
				capl = ncap;
			}
			(*locs)[nl++] = (struct hwfs_shardloc){e->sh->hash, e->sh->off, e->sh->size};
		}
		if (exposes_tensors(n)) {
			f->tensors = calloc(n->data.n_tensors ? n->data.n_tensors : 1,
					    sizeof(*f->tensors));
			if (!f->tensors)
				goto out;
			for (size_t i = 0; i < n->data.n_tensors; i++) {
				struct hwfs_tensor *t = &f->tensors[i];

				*t = n->data.tensors[i];
				t->name = strdup(t->name);
				t->shape = t->ndim ? malloc(t->ndim * sizeof(uint64_t)) : NULL;
				f->n_tensors++;
				if (!t->name || (t->ndim && !t->shape))
					goto out;
				memcpy(t->shape, n->data.tensors[i].shape, t->ndim * sizeof(uint64_t));
			}
		} else if (ends_with(f->path, ".safetensors")) {
			f->st_error = strdup(n->data.st_error ? n->data.st_error
							      : "not a safetensors file");
			if (!f->st_error)
				goto out;
		}
	}
	if (n_locs)
		*n_locs = nl;
	*out = rec;
	rec = NULL;
	r = 0;
out:
	nodelist_free(&l);
	free(order);
	hwfs_vrec_free(rec);
	if (r < 0 && locs) {
		free(*locs);
		*locs = NULL;
	}
	return r;
}

/* Add tensors/ to a sealed version, and compute its figures (lock held). */
static void version_finish_tree(struct ns *ns, struct version *v)
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
	if (collect(&l, v->root) < 0)
		goto out;
	order = malloc((l.n ? l.n : 1) * sizeof(*order));
	if (!order)
		goto out;
	for (size_t i = 0; i < l.n; i++)
		order[i] = i;
	qsort_r(order, l.n, sizeof(*order), cmp_idx, &l);
	if (!ns_child(v->root, "tensors")) {
		tdir = node_new(ns, NT_TDIR, "tensors", S_IFDIR | 0555, v->root->uid, v->root->gid);
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
		if (!exposes_tensors(f)) {
			if (ends_with(path, ".safetensors")) {
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
			const struct hwfs_tensor *t = &f->data.tensors[i];
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
			tn = node_new(ns, NT_TENSOR, fname, S_IFREG | (f->mode & 0444), f->uid,
				      f->gid);
			free(fname);
			if (!tn)
				continue;
			tn->tensor = t;
			tn->tfile = f;
			tn->mtime_ns = tn->ctime_ns = f->mtime_ns;
			if (kid_insert(tdir, tn) < 0) {
				node_free(ns, tn);
				continue;
			}
			f->pins++;
		}
	}
	if (tdir && tdir->nkids && kid_insert(v->root, tdir) == 0)
		tdir = NULL;
out:
	if (tdir) {
		tdir->detached = 1;
		node_free(ns, tdir);
	}
	nodelist_free(&l);
	free(order);
}

/* ------------------------------------------------------------- start-up */

/* Make (or find) the directory @path inside @v, creating parents. */
static struct node *mkdir_p(struct ns *ns, struct version *v, const char *path)
{
	struct node *dir = v->root;
	char *copy = strdup(path), *save = NULL, *tok;

	if (!copy)
		return NULL;
	for (tok = strtok_r(copy, "/", &save); tok && dir; tok = strtok_r(NULL, "/", &save)) {
		struct node *k = ns_child(dir, tok);

		if (!k) {
			k = node_new(ns, NT_DIR, tok, S_IFDIR | 0755, dir->uid, dir->gid);
			if (k && kid_insert(dir, k) < 0) {
				node_free(ns, k);
				k = NULL;
			}
		}
		dir = k && k->type == NT_DIR ? k : (k && k->type == NT_VROOT ? k : NULL);
	}
	free(copy);
	return dir;
}

/*
 * Build the tree of version @v from @rec (exclusive lock held), taking over
 * rec's strings and tensors.  A shard the store lacks makes *@missing true.
 */
static int tree_from_rec(struct ns *ns, struct version *v, struct hwfs_vrec *rec, int *missing)
{
	for (size_t i = 0; i < rec->n_files; i++) {
		struct hwfs_frec *f = &rec->files[i];
		char *slash = strrchr(f->path, '/');
		const char *base = slash ? slash + 1 : f->path;
		struct node *dir, *n, *old;
		enum ntype t;

		if (slash) {
			*slash = '\0';
			dir = mkdir_p(ns, v, f->path);
			*slash = '/';
		} else {
			dir = v->root;
		}
		if (!dir)
			return -ENOMEM;
		t = f->kind == HWFS_K_DIR ? NT_DIR : f->kind == HWFS_K_LNK ? NT_LNK : NT_REG;
		old = ns_child(dir, base);
		if (old && t == NT_DIR && old->type == NT_DIR) { /* made by mkdir_p */
			old->mode = S_IFDIR | f->mode;
			old->uid = f->uid;
			old->gid = f->gid;
			old->mtime_ns = old->ctime_ns = f->mtime_ns;
			continue;
		}
		n = node_new(ns, t, base,
			     (t == NT_DIR ? S_IFDIR : t == NT_LNK ? S_IFLNK : S_IFREG) | f->mode,
			     f->uid, f->gid);
		if (!n)
			return -ENOMEM;
		n->mtime_ns = n->ctime_ns = f->mtime_ns;
		if (t == NT_LNK) {
			n->target = f->target;
			f->target = NULL;
		}
		if (t == NT_REG) {
			n->data.size = f->size;
			n->data.ext = calloc(f->n_ext ? f->n_ext : 1, sizeof(struct fext));
			if (!n->data.ext) {
				node_free(ns, n);
				return -ENOMEM;
			}
			for (size_t k = 0; k < f->n_ext; k++) {
				struct shard *sh = store_get(ns->st, &f->ext[k].hash);

				if (!sh || sh->size != f->ext[k].len) {
					char hex[HWFS_HASH_HEX];

					if (sh)
						store_unref(ns->st, sh);
					hwfs_hash_hex(&f->ext[k].hash, hex);
					LOG_ERR("version %s: %s: shard %s missing from the store",
						rec->name, f->path, hex);
					*missing = 1;
					break;
				}
				n->data.ext[n->data.n_ext++] =
					(struct fext){f->ext[k].off, f->ext[k].len, sh};
			}
			n->data.tensors = f->tensors;
			n->data.n_tensors = f->n_tensors;
			n->data.st_error = f->st_error;
			f->tensors = NULL;
			f->n_tensors = 0;
			f->st_error = NULL;
		}
		if (kid_insert(dir, n) < 0) {
			n->detached = 1;
			node_free(ns, n);
			LOG_WARN("version %s: duplicate path %s ignored", rec->name, f->path);
		}
	}
	return 0;
}

static int load_version(struct ns *ns, struct hwfs_vrec *rec)
{
	struct version *v;
	int r, missing = 0;

	r = version_new(ns, rec->name, rec->state, rec->seq, 0755, 0, 0, &v);
	if (r < 0)
		return r;
	v->created_ns = rec->created_ns;
	v->sealed_ns = rec->sealed_ns;
	v->digest = rec->digest;
	v->root->mtime_ns = v->root->ctime_ns = rec->sealed_ns;
	r = tree_from_rec(ns, v, rec, &missing);
	if (missing)
		v->state = HWFS_V_DAMAGED;
	version_finish_tree(ns, v);
	return r;
}

int ns_import(struct ns *ns, const char *name, struct hwfs_vrec *rec)
{
	struct version *v;
	int r, missing = 0;

	ns_wrlock(ns);
	r = ns_child(ns->versions, name) ? -EEXIST : 0;
	if (r == 0)
		r = version_new(ns, name, HWFS_V_OPEN, 0, 0755, 0, 0, &v);
	if (r == 0) {
		r = tree_from_rec(ns, v, rec, &missing);
		if (r == 0 && missing)
			r = -ENOENT;
		if (r < 0)
			version_drop(ns, v);
	}
	ns_unlock(ns);
	return r;
}

void ns_set_seal_hook(struct ns *ns, void (*hook)(void *arg, const char *name), void *arg)
{
	ns->seal_hook = hook;
	ns->seal_hook_arg = arg;
}

static int set_current_node(struct ns *ns, const char *name)
{
	struct node *cur = ns_child(ns->root, "current");
	char *target;

	if (asprintf(&target, "versions/%s", name) < 0)
		return -ENOMEM;
	if (!cur) {
		cur = node_new(ns, NT_RLNK, "current", S_IFLNK | 0777, 0, 0);
		if (!cur || kid_insert(ns->root, cur) < 0) {
			free(target);
			if (cur)
				node_free(ns, cur);
			return -ENOMEM;
		}
	}
	free(cur->target);
	cur->target = target;
	cur->mtime_ns = cur->ctime_ns = hwfs_now_ns();
	return 0;
}

int ns_create(struct store *st, struct ns **out)
{
	struct ns *ns = calloc(1, sizeof(*ns));
	struct hwfs_vrec **recs = NULL;
	size_t n_recs = 0, dropped;
	char *cur = NULL;
	int r = -ENOMEM;

	if (!ns)
		return -ENOMEM;
	ns->st = st;
	ns->orphans.orph_next = ns->orphans.orph_prev = &ns->orphans;
	ns->next_ino = 1;
	ns->next_seq = 1;
	pthread_rwlock_init(&ns->lock, NULL);
	ns->root = node_new(ns, NT_ROOT, "", S_IFDIR | 0755, 0, 0);
	ns->versions = node_new(ns, NT_VERSIONS, "versions", S_IFDIR | 0755, 0, 0);
	if (!ns->root || !ns->versions || kid_insert(ns->root, ns->versions) < 0)
		goto fail;
	r = store_load_versions(st, &recs, &n_recs, &cur);
	if (r < 0)
		goto fail;
	for (size_t i = 0; i < n_recs; i++) {
		r = load_version(ns, recs[i]);
		if (r < 0)
			LOG_ERR("version %s could not be loaded: %s", recs[i]->name, strerror(-r));
		hwfs_vrec_free(recs[i]);
	}
	free(recs);
	recs = NULL;
	dropped = store_drop_unreferenced(st);
	if (dropped)
		LOG_INFO("freed %zu unreferenced shards", dropped);
	arena_trim(store_arena(st));
	if (cur && ns_version(ns, cur))
		set_current_node(ns, cur);
	else if (cur)
		LOG_ERR("committed version %s is missing from the index", cur);
	free(cur);
	*out = ns;
	return 0;
fail:
	free(recs);
	ns_destroy(ns);
	return r;
}

/*
 * Shutdown: free the in-memory tree *without* dropping shard references —
 * dropping them would give the shards' arena ranges back (and punch them out),
 * destroying sealed data that the index still points at.  Staging of open
 * versions is given back: open versions are not persisted.
 */
static void free_subtree(struct ns *ns, struct node *n)
{
	for (size_t i = 0; i < n->nkids; i++)
		free_subtree(ns, n->kids[i]);
	n->nkids = 0;
	n->pins = 0;
	__atomic_store_n(&n->nopen, 0, __ATOMIC_RELAXED);
	writer_abort(n->w);
	n->w = NULL;
	n->data.n_ext = 0; /* forget, do not unreference */
	ingest_result_clear(ns->st, &n->data);
	n->tfile = NULL;
	n->detached = 1;
	free(n->kids);
	free(n->target);
	free(n->name);
	if (n->type == NT_REG)
		pthread_mutex_destroy(&n->mu);
	free(n);
}

void ns_destroy(struct ns *ns)
{
	if (!ns)
		return;
	/* tensor nodes first: they pin files */
	for (size_t i = 0; i < ns->nvers; i++) {
		struct node *t = ns_child(ns->vers[i]->root, "tensors");

		if (t && t->type == NT_TDIR) {
			kid_remove(ns->vers[i]->root, t);
			free_subtree(ns, t);
		}
	}
	if (ns->root)
		free_subtree(ns, ns->root);
	else if (ns->versions)
		free_subtree(ns, ns->versions);
	/* tensors first again: they pin their files */
	for (int pass = 0; pass < 2; pass++) {
		struct node *n = ns->orphans.orph_next, *next;

		for (; n != &ns->orphans; n = next) {
			next = n->orph_next;
			if (pass == 0 && n->type != NT_TENSOR)
				continue;
			n->orph_prev->orph_next = n->orph_next;
			n->orph_next->orph_prev = n->orph_prev;
			n->orph_next = n->orph_prev = NULL;
			free_subtree(ns, n);
		}
	}
	for (size_t i = 0; i < ns->nvers; i++)
		version_free(ns->vers[i]);
	while (ns->graveyard) {
		struct version *v = ns->graveyard;

		ns->graveyard = v->next_dead;
		version_free(v);
	}
	free(ns->vers);
	pthread_rwlock_destroy(&ns->lock);
	free(ns);
}

/* ----------------------------------------------------------- tree changes */

/* Bytes of the UTF-8 sequence at @p, or 0 when it is not valid UTF-8. */
static int utf8_len(const unsigned char *p)
{
	int n = p[0] < 0x80 ? 1 : (p[0] & 0xE0) == 0xC0 ? 2 : (p[0] & 0xF0) == 0xE0 ? 3
		: (p[0] & 0xF8) == 0xF0 ? 4 : 0;

	if (n == 2 && p[0] < 0xC2)
		return 0; /* overlong */
	for (int i = 1; i < n; i++)
		if ((p[i] & 0xC0) != 0x80)
			return 0;
	return n;
}

/*
 * Names must survive the manifest (JSON): UTF-8 without control characters,
 * 1..255 bytes, no '/', not "." or "..".
 */
static int valid_name(const char *name)
{
	const unsigned char *p = (const unsigned char *)name;

	if (!*name || !strcmp(name, ".") || !strcmp(name, "..") || strlen(name) > 255)
		return 0;
	while (*p) {
		int n = utf8_len(p);

		if (n == 0 || *p == '/' || *p < 0x20 || *p == 0x7f)
			return 0;
		p += n;
	}
	return 1;
}

/* Where may a new entry go? 0, or the errno to answer. */
static int may_add(const struct node *dir)
{
	switch (dir->type) {
	case NT_VROOT:
	case NT_DIR:
		return ns_writable(dir) ? 0 : -EROFS;
	case NT_TDIR:
		return -EROFS;
	default:
		return -EPERM;
	}
}

/* A new node in a directory of an open version (exclusive lock held). */
static int add_child(struct ns *ns, struct node *dir, enum ntype type, const char *name,
		     uint32_t mode, uint32_t uid, uint32_t gid, struct node **out)
{
	struct node *n;
	int r = may_add(dir);

	if (r < 0)
		return r;
	if (ns_child(dir, name))
		return -EEXIST;
	n = node_new(ns, type, name, mode, uid, gid);
	if (!n)
		return -ENOMEM;
	r = kid_insert(dir, n);
	if (r < 0) {
		node_free(ns, n);
		return r;
	}
	dir->mtime_ns = dir->ctime_ns = n->mtime_ns;
	*out = n;
	return 0;
}

int ns_mkdir(struct ns *ns, struct node *dir, const char *name, uint32_t mode, uint32_t uid,
	     uint32_t gid, struct node **out)
{
	struct node *n = NULL;
	int r;

	if (!valid_name(name))
		return -EINVAL;
	ns_wrlock(ns);
	if (dir->type == NT_VERSIONS) {
		struct version *v;

		r = -EEXIST;
		if (ns_child(dir, name))
			goto out;
		r = version_new(ns, name, HWFS_V_OPEN, 0, mode, uid, gid, &v);
		if (r < 0)
			goto out;
		n = v->root;
	} else {
		r = add_child(ns, dir, NT_DIR, name, S_IFDIR | (mode & 07777), uid, gid, &n);
		if (r < 0)
			goto out;
	}
	ns_lookup_ref(n);
	*out = n;
	r = 0;
out:
	ns_unlock(ns);
	return r;
}

int ns_create_file(struct ns *ns, struct node *dir, const char *name, uint32_t mode,
		   uint32_t uid, uint32_t gid, struct node **out)
{
	struct node *n;
	int r;

	if (!valid_name(name))
		return -EINVAL;
	ns_wrlock(ns);
	r = add_child(ns, dir, NT_REG, name, S_IFREG | (mode & 07777), uid, gid, &n);
	if (r == 0) {
		ns_lookup_ref(n);
		*out = n;
	}
	ns_unlock(ns);
	return r;
}

/* Parse a `current` target: "versions/V" (or "./versions/V", trailing '/'). */
static int current_target_version(const char *target, char *name, size_t len)
{
	const char *p = target;
	size_t n;

	if (!strncmp(p, "./", 2))
		p += 2;
	if (strncmp(p, "versions/", 9))
		return -EINVAL;
	p += 9;
	n = strlen(p);
	while (n && p[n - 1] == '/')
		n--;
	if (n == 0 || n >= len || memchr(p, '/', n))
		return -EINVAL;
	memcpy(name, p, n);
	name[n] = '\0';
	return 0;
}

int ns_check_committable(struct ns *ns, const char *name, char *err, size_t errlen)
{
	struct version *v = ns_version(ns, name);

	if (!v || !strncmp(name, NS_HIDDEN_PREFIX, strlen(NS_HIDDEN_PREFIX))) {
		snprintf(err, errlen, "no such version: %s", name);
		return -ENOENT;
	}
	if (v->state == HWFS_V_OPEN) {
		snprintf(err, errlen, "version %s is open (not sealed): seal it first", name);
		return -EBUSY;
	}
	if (v->state == HWFS_V_DAMAGED) {
		snprintf(err, errlen, "version %s is damaged (hwfs verify failed)", name);
		return -EIO;
	}
	return 0;
}

/* Make `current` point at the version named by @target (lock held). */
static int commit_locked(struct ns *ns, const char *target)
{
	char name[512], err[256];
	int r;

	r = current_target_version(target, name, sizeof(name));
	if (r < 0)
		return r;
	r = ns_check_committable(ns, name, err, sizeof(err));
	if (r < 0) {
		LOG_WARN("commit refused: %s", err);
		return r;
	}
	return store_set_current(ns->st, name);
}

int ns_symlink(struct ns *ns, struct node *dir, const char *name, const char *target,
	       uint32_t uid, uint32_t gid, struct node **out)
{
	struct node *n;
	int r;

	if (!valid_name(name))
		return -EINVAL;
	ns_wrlock(ns);
	r = -EEXIST;
	if (ns_child(dir, name))
		goto out;
	if (dir->type == NT_ROOT) {
		if (!strcmp(name, "current")) {
			r = commit_locked(ns, target);
			if (r < 0)
				goto out;
		}
	} else {
		r = may_add(dir);
		if (r < 0)
			goto out;
	}
	r = -ENOMEM;
	n = node_new(ns, dir->type == NT_ROOT ? NT_RLNK : NT_LNK, name, S_IFLNK | 0777, uid, gid);
	if (!n)
		goto out;
	n->target = strdup(target);
	if (!n->target || kid_insert(dir, n) < 0) {
		node_free(ns, n);
		goto out;
	}
	dir->mtime_ns = dir->ctime_ns = n->mtime_ns;
	ns_lookup_ref(n);
	*out = n;
	r = 0;
out:
	ns_unlock(ns);
	return r;
}

int ns_unlink(struct ns *ns, struct node *dir, const char *name, int is_dir)
{
	struct node *n;
	int r = 0;

	ns_wrlock(ns);
	n = ns_child(dir, name);
	if (!n) {
		r = -ENOENT;
		goto out;
	}
	if (is_dir && !is_dir_type(n->type)) {
		r = -ENOTDIR;
		goto out;
	}
	if (!is_dir && is_dir_type(n->type)) {
		r = -EISDIR;
		goto out;
	}
	switch (dir->type) {
	case NT_ROOT:
		if (n->type != NT_RLNK || !strcmp(name, "current"))
			r = -EPERM;
		break;
	case NT_VERSIONS:
		/* rmdir of an empty open version discards it; sealed ones need `hwfs rm` */
		if (n->ver->state != HWFS_V_OPEN || n->ver->sealing)
			r = -EROFS;
		else if (n->nkids)
			r = -ENOTEMPTY;
		else
			version_drop(ns, n->ver);
		goto out;
	default:
		r = ns_writable(dir) ? 0 : -EROFS;
		if (r == 0 && n->nkids)
			r = -ENOTEMPTY;
	}
	if (r == 0) {
		detach_tree(ns, n);
		dir->mtime_ns = dir->ctime_ns = hwfs_now_ns();
	}
out:
	ns_unlock(ns);
	return r;
}

static int is_ancestor(const struct node *a, const struct node *n)
{
	for (; n; n = n->parent)
		if (n == a)
			return 1;
	return 0;
}

int ns_rename(struct ns *ns, struct node *sdir, const char *sname, struct node *ddir,
	      const char *dname, unsigned flags)
{
	struct node *s, *d;
	int r = 0;

	if (!valid_name(dname))
		return -EINVAL;
	if (flags & ~1u) /* only RENAME_NOREPLACE (1) */
		return -EINVAL;
	if (sdir->type == NT_VERSIONS && ddir->type == NT_VERSIONS) {
		/* renaming an open version seals it under its new name */
		char err[512];

		if (!strcmp(sname, dname))
			return 0;
		r = ns_seal(ns, sname, dname, 0, err, sizeof(err));
		if (r == -EIO)
			LOG_WARN("rename of %s to %s: %s", sname, dname, err);
		return r;
	}
	ns_wrlock(ns);
	s = ns_child(sdir, sname);
	d = ns_child(ddir, dname);
	if (!s) {
		r = -ENOENT;
		goto out;
	}
	if (d && (flags & 1)) {
		r = -EEXIST;
		goto out;
	}
	if (sdir->type == NT_ROOT || ddir->type == NT_ROOT) {
		if (sdir != ddir || s->type != NT_RLNK || !strcmp(sname, "current") ||
		    (d && d->type != NT_RLNK)) {
			r = -EPERM;
			goto out;
		}
		if (!strcmp(dname, "current")) {
			r = commit_locked(ns, s->target);
			if (r < 0)
				goto out;
		}
	} else {
		if (sdir->ver != ddir->ver) {
			r = sdir->ver && ddir->ver ? -EXDEV : -EPERM;
			goto out;
		}
		if (!ns_writable(sdir) || may_add(ddir) < 0) {
			r = may_add(ddir) == -EPERM ? -EPERM : -EROFS;
			goto out;
		}
		if (s == d)
			goto out;
		if (is_dir_type(s->type) && is_ancestor(s, ddir)) {
			r = -EINVAL;
			goto out;
		}
		if (d && is_dir_type(d->type) != is_dir_type(s->type)) {
			r = is_dir_type(d->type) ? -EISDIR : -ENOTDIR;
			goto out;
		}
		if (d && d->nkids) {
			r = -ENOTEMPTY;
			goto out;
		}
	}
	{
		char *nn = strdup(dname);

		if (!nn) {
			r = -ENOMEM;
			goto out;
		}
		if (d)
			detach_tree(ns, d);
		kid_remove(sdir, s);
		free(s->name);
		s->name = nn;
		if (kid_insert(ddir, s) < 0) { /* cannot happen: name checked free */
			r = -EIO;
			goto out;
		}
		s->ctime_ns = sdir->mtime_ns = ddir->mtime_ns = hwfs_now_ns();
		if (!strcmp(dname, "current"))
			s->mtime_ns = s->ctime_ns;
	}
out:
	ns_unlock(ns);
	return r;
}

/* ------------------------------------------------------------------- seal */

static void finish_files(struct ns *ns, struct node *n)
{
	for (size_t i = 0; i < n->nkids; i++) {
		struct node *k = n->kids[i];

		if (k->type == NT_DIR) {
			finish_files(ns, k);
		} else if (k->type == NT_REG) {
			pthread_mutex_lock(&k->mu);
			if (k->w && writer_finish(k->w, &k->data) < 0) {
				LOG_ERR("file %s: out of memory while finishing; data lost", k->name);
				k->write_error = ENOMEM;
			}
			k->w = NULL;
			pthread_mutex_unlock(&k->mu);
		}
	}
}

/*
 * Append to @err (at @*pos, NUL-terminated, @len bytes) "write to PATH failed
 * (REASON)" for every file under @n whose write failed; returns how many there
 * are.  Paths that do not fit are counted, not named.  Lock held.
 */
static size_t failed_writes(const struct node *n, char *err, size_t len, size_t *pos)
{
	size_t count = 0;

	for (size_t i = 0; i < n->nkids; i++) {
		struct node *k = n->kids[i];
		int e;

		if (k->type == NT_DIR) {
			count += failed_writes(k, err, len, pos);
			continue;
		}
		if (k->type != NT_REG)
			continue;
		pthread_mutex_lock(&k->mu);
		e = k->write_error;
		pthread_mutex_unlock(&k->mu);
		if (!e)
			continue;
		if (*pos < len) {
			char *path = node_path(k);
			int w = snprintf(err + *pos, len - *pos, "%swrite to %s failed (%s)",
					 count ? ", " : "", path ? path : k->name, strerror(e));

			free(path);
			*pos = w < 0 ? len : HWFS_MIN(len, *pos + (size_t)w);
		}
		count++;
	}
	return count;
}

int ns_seal(struct ns *ns, const char *name, const char *new_name, unsigned flags, char *err,
	    size_t errlen)
{
	struct hwfs_vrec *rec = NULL;
	struct hwfs_shardloc *locs = NULL;
	size_t n_locs = 0, nfail, pos = 0;
	char why[1024] = "";
	struct version *v;
	int r;

	if (new_name && (!valid_name(new_name) ||
			 !strncmp(new_name, NS_HIDDEN_PREFIX, strlen(NS_HIDDEN_PREFIX))))
		return -EINVAL;
	ns_wrlock(ns);
	v = ns_version(ns, name);
	r = !v ? -ENOENT : v->state != HWFS_V_OPEN ? -EROFS : v->sealing ? -EBUSY : 0;
	if (r == 0 && new_name && ns_child(ns->versions, new_name))
		r = -EEXIST;
	if (r == 0)
		__atomic_store_n(&v->sealing, 1, __ATOMIC_RELAXED);
	ns_unlock(ns);
	if (r < 0)
		return r;

	/*
	 * The version cannot change shape now (sealing refuses every change), so
	 * its files are finished and its record built under the shared lock, and
	 * the index transaction runs with no namespace lock at all: lookups in
	 * other versions never wait on sqlite.
	 */
	ns_rdlock(ns);
	finish_files(ns, v->root);
	nfail = failed_writes(v->root, why, sizeof(why), &pos);
	if (nfail && !(flags & NS_SEAL_FORCE)) {
		ns_unlock(ns);
		if (err)
			snprintf(err, errlen, "refused: %s; rewrite %s, remove %s, or seal with --force",
				 why, nfail > 1 ? "them" : "it", nfail > 1 ? "them" : "it");
		r = -EIO;
		goto out_unsealing;
	}
	if (nfail)
		LOG_WARN("version %s sealed by force despite: %s", name, why);
	v->sealed_ns = hwfs_now_ns();
	r = build_vrec(ns, v, &rec, &locs, &n_locs);
	ns_unlock(ns);
	if (r < 0)
		goto out_unsealing;
	rec->state = HWFS_V_SEALED;
	if (new_name) {
		free(rec->name);
		rec->name = strdup(new_name);
		if (!rec->name) {
			r = -ENOMEM;
			goto out_unsealing;
		}
	}
	r = manifest_digest(rec, &rec->digest);
	if (r < 0)
		goto out_unsealing;
	r = store_put_version(ns->st, rec, locs, n_locs);
	if (r < 0)
		goto out_unsealing;

	ns_wrlock(ns);
	if (new_name) {
		char *nn = strdup(new_name), *vn = strdup(new_name);

		r = !nn || !vn ? -ENOMEM : ns_child(ns->versions, new_name) ? -EEXIST : 0;
		if (r < 0) { /* lost the name (or memory) meanwhile: undo the index */
			free(nn);
			free(vn);
			store_delete_version(ns->st, new_name);
			goto out;
		}
		kid_remove(ns->versions, v->root);
		free(v->root->name);
		v->root->name = nn;
		free(v->name);
		v->name = vn;
		kid_insert(ns->versions, v->root);
	}
	v->digest = rec->digest;
	__atomic_store_n(&v->state, HWFS_V_SEALED, __ATOMIC_RELEASE);
	v->root->mtime_ns = v->root->ctime_ns = v->sealed_ns;
	version_finish_tree(ns, v);
out:
	__atomic_store_n(&v->sealing, 0, __ATOMIC_RELAXED);
	ns_unlock(ns);
	if (r == 0 && ns->seal_hook)
		ns->seal_hook(ns->seal_hook_arg, rec->name);
	hwfs_vrec_free(rec);
	free(locs);
	return r;
out_unsealing:
	__atomic_store_n(&v->sealing, 0, __ATOMIC_RELAXED);
	hwfs_vrec_free(rec);
	free(locs);
	return r;
}

/* ------------------------------------------------------- other operations */

int ns_remove_version(struct ns *ns, const char *name)
{
	struct node *cur;
	struct version *v;
	char cname[512];
	int r = 0;

	ns_wrlock(ns);
	v = ns_version(ns, name);
	if (!v) {
		r = -ENOENT;
		goto out;
	}
	cur = ns_child(ns->root, "current");
	if (cur && current_target_version(cur->target, cname, sizeof(cname)) == 0 &&
	    !strcmp(cname, name)) {
		r = -EBUSY;
		goto out;
	}
	if (v->sealing) {
		r = -EAGAIN;
		goto out;
	}
	if (v->state != HWFS_V_OPEN) {
		r = store_delete_version(ns->st, name);
		if (r < 0 && r != -ENOENT)
			goto out;
		r = 0;
	}
	version_drop(ns, v);
out:
	ns_unlock(ns);
	return r;
}

char *ns_current(struct ns *ns)
{
	struct node *cur;
	char name[512];
	char *s = NULL;

	ns_rdlock(ns);
	cur = ns_child(ns->root, "current");
	if (cur && current_target_version(cur->target, name, sizeof(name)) == 0)
		s = strdup(name);
	ns_unlock(ns);
	return s;
}

int ns_set_state(struct ns *ns, const char *name, enum hwfs_vstate st)
{
	struct version *v;
	int r;

	ns_wrlock(ns);
	v = ns_version(ns, name);
	r = !v ? -ENOENT : v->state == HWFS_V_OPEN ? -EBUSY : 0;
	if (r == 0 && v->state != st) {
		r = store_set_state(ns->st, name, st);
		if (r == 0)
			v->state = st;
	}
	ns_unlock(ns);
	return r;
}

int ns_snapshot(struct ns *ns, const char *name, struct hwfs_vrec **out)
{
	struct version *v;
	int r;

	ns_rdlock(ns);
	v = ns_version(ns, name);
	r = v ? build_vrec(ns, v, out, NULL, NULL) : -ENOENT;
	ns_unlock(ns);
	return r;
}

int ns_list(struct ns *ns, char ***names, size_t *n)
{
	char **v;
	size_t k = 0;

	ns_rdlock(ns);
	v = calloc(ns->nvers + 1, sizeof(*v));
	if (!v) {
		ns_unlock(ns);
		return -ENOMEM;
	}
	for (size_t i = 0; i < ns->nvers; i++)
		if (strncmp(ns->vers[i]->name, NS_HIDDEN_PREFIX, strlen(NS_HIDDEN_PREFIX)))
			v[k++] = strdup(ns->vers[i]->name);
	ns_unlock(ns);
	*names = v;
	*n = k;
	return 0;
}

void ns_stat(struct ns *ns, struct node *n, struct stat *st)
{
	uint64_t size = 0;

	memset(st, 0, sizeof(*st));
	st->st_ino = n->ino;
	st->st_mode = n->mode;
	st->st_uid = n->uid;
	st->st_gid = n->gid;
	st->st_nlink = is_dir_type(n->type) ? 2 : 1;
	switch (n->type) {
	case NT_REG:
		if (n->w) {
			pthread_mutex_lock(&n->mu);
			size = n->w ? writer_size(n->w) : n->data.size;
			pthread_mutex_unlock(&n->mu);
		} else {
			size = n->data.size;
		}
		break;
	case NT_TENSOR:
		size = n->tensor ? n->tensor->len : 0;
		break;
	case NT_LNK:
	case NT_RLNK:
		size = strlen(n->target);
		break;
	default:
		size = 4096;
	}
	st->st_size = (off_t)size;
	st->st_blksize = 1 << 20;
	st->st_blocks = (blkcnt_t)((size + 511) / 512);
	st->st_mtim.tv_sec = n->mtime_ns / 1000000000;
	st->st_mtim.tv_nsec = n->mtime_ns % 1000000000;
	st->st_ctim.tv_sec = n->ctime_ns / 1000000000;
	st->st_ctim.tv_nsec = n->ctime_ns % 1000000000;
	st->st_atim = st->st_mtim;
	(void)ns;
}

/* ---------------------------------------------------------------- file data */

/* Make sure a file of an open version has a writer (n->mu held). */
static int ensure_writer(struct ns *ns, struct node *n)
{
	if (n->w)
		return 0;
	if (n->data.size == 0 && n->data.n_ext == 0) {
		ingest_result_clear(ns->st, &n->data);
		return writer_create(ns->st, &n->w);
	}
	return writer_resume(ns->st, &n->data, &n->w);
}

static int write_common(struct ns *ns, struct node *n, uint64_t off, const void *buf, int fd,
			size_t len)
{
	int r;

	if (n->type != NT_REG)
		return -EBADF;
	pthread_mutex_lock(&n->mu);
	r = ns_writable(n) ? ensure_writer(ns, n) : -EROFS;
	if (r == 0 && buf) {
		r = writer_write(n->w, off, buf, len);
	} else if (r == 0) {
		uint8_t *p;
		size_t done = 0;

		r = writer_reserve(n->w, off, len, &p);
		while (r == 0 && done < len) {
			ssize_t got = pread(fd, p + done, len - done, (off_t)(off + done));

			if (got < 0 && errno == EINTR)
				continue;
			if (got <= 0) {
				r = got < 0 ? -errno : -EIO; /* file shrank under us */
				break;
			}
			done += (size_t)got;
		}
		if (done)
			r = writer_commit(n->w, off, done) ?: r;
	}
	if (r == 0)
		n->mtime_ns = n->ctime_ns = hwfs_now_ns();
	else if (r != -EROFS) /* the writer was told its bytes are not there */
		n->write_error = -r;
	pthread_mutex_unlock(&n->mu);
	return r;
}

int ns_write(struct ns *ns, struct node *n, uint64_t off, const void *buf, size_t len)
{
	return write_common(ns, n, off, buf, -1, len);
}

int ns_write_from_fd(struct ns *ns, struct node *n, uint64_t off, int fd, size_t len)
{
	return write_common(ns, n, off, NULL, fd, len);
}

int ns_truncate(struct ns *ns, struct node *n, uint64_t size)
{
	int r;

	if (n->type != NT_REG)
		return is_dir_type(n->type) ? -EISDIR : -EINVAL;
	pthread_mutex_lock(&n->mu);
	r = ns_writable(n) ? ensure_writer(ns, n) : -EROFS;
	if (r == 0)
		r = writer_truncate(n->w, size);
	if (r == 0)
		n->mtime_ns = n->ctime_ns = hwfs_now_ns();
	if (r == 0 && size == 0) /* a full rewrite starts here */
		n->write_error = 0;
	else if (r < 0 && r != -EROFS)
		n->write_error = -r;
	pthread_mutex_unlock(&n->mu);
	return r;
}

/*
 * Copy [off, off+len) of a finished file (already clamped to its size) into
 * one bounce buffer and emit it as a single iovec.  Used when the span covers
 * more separate arena runs than one reply may carry.  Returns what @emit
 * returns, or -ENOMEM (then @emit is not called).
 */
static int read_bounce(struct ns *ns, const struct ingest_result *d, uint64_t off, size_t len,
		       int (*emit)(void *, const struct iovec *, int), void *arg)
{
	uint8_t *buf = malloc(len ? len : 1);
	struct iovec iov = {buf, 0};
	size_t i;
	int r;

	if (!buf)
		return -ENOMEM;
	for (i = fext_find(d->ext, d->n_ext, off); iov.iov_len < len && i < d->n_ext; i++) {
		const struct fext *e = &d->ext[i];
		size_t n = (size_t)HWFS_MIN((uint64_t)(len - iov.iov_len), e->off + e->len - off);

		memcpy(buf + iov.iov_len, store_shard_data(ns->st, e->sh) + (off - e->off), n);
		iov.iov_len += n;
		off += n;
	}
	r = emit(arg, &iov, 1);
	free(buf);
	return r;
}

/*
 * iovec over the extents of a finished file: [off, off+len) clamped to size.
 * Extents that follow each other in the arena share one iovec (a sequentially
 * written file is one run).  Up to 32 runs need no allocation; @emit never
 * gets more than NS_READ_IOV_MAX iovecs: a span over more runs is copied into
 * a bounce buffer instead (read_bounce).  Returns what @emit returns, or
 * -ENOMEM without calling it.
 */
static int read_extents(struct ns *ns, const struct ingest_result *d, uint64_t off, size_t len,
			int (*emit)(void *, const struct iovec *, int), void *arg)
{
	struct iovec iov_small[32] = {{0}}, *iov = iov_small;
	int cnt = 0, cap = (int)HWFS_ARRAY_SIZE(iov_small), r;
	uint64_t off0 = off;
	size_t i, len0;

	if (off >= d->size)
		return emit(arg, iov, 0);
	len0 = len = (size_t)HWFS_MIN((uint64_t)len, d->size - off);
	i = fext_find(d->ext, d->n_ext, off);
	while (len && i < d->n_ext) {
		const struct fext *e = &d->ext[i++];
		size_t n = (size_t)HWFS_MIN((uint64_t)len, e->off + e->len - off);
		uint8_t *p = (uint8_t *)store_shard_data(ns->st, e->sh) + (off - e->off);

		if (cnt && (uint8_t *)iov[cnt - 1].iov_base + iov[cnt - 1].iov_len == p) {
			iov[cnt - 1].iov_len += n;
		} else {
			if (cnt == NS_READ_IOV_MAX) {
				r = read_bounce(ns, d, off0, len0, emit, arg);
				goto out;
			}
			if (cnt == cap) {
				int ncap = HWFS_MIN(cap * 4, NS_READ_IOV_MAX);
				struct iovec *ni = malloc(sizeof(*ni) * (size_t)ncap);

				if (!ni) {
					r = -ENOMEM;
					goto out;
				}
				memcpy(ni, iov, sizeof(*ni) * (size_t)cnt);
				if (iov != iov_small)
					free(iov);
				iov = ni;
				cap = ncap;
			}
			iov[cnt].iov_base = p;
			iov[cnt++].iov_len = n;
		}
		off += n;
		len -= n;
	}
	r = emit(arg, iov, cnt);
out:
	if (iov != iov_small)
		free(iov);
	return r;
}

int ns_read(struct ns *ns, struct node *n, uint64_t off, size_t len,
	    int (*emit)(void *, const struct iovec *, int), void *arg)
{
	int r;

	if (n->type == NT_TENSOR) {
		const struct hwfs_tensor *t = n->tensor;

		if (!t || !n->tfile)
			return -ESTALE;
		if (off >= t->len)
			return emit(arg, NULL, 0);
		len = (size_t)HWFS_MIN((uint64_t)len, t->len - off);
		return read_extents(ns, &n->tfile->data, t->off + off, len, emit, arg);
	}
	if (n->type != NT_REG)
		return -EISDIR;
	/* Sealed data never changes: no lock on the hot path. */
	if (n->ver && __atomic_load_n(&n->ver->state, __ATOMIC_ACQUIRE) != HWFS_V_OPEN && !n->w)
		return read_extents(ns, &n->data, off, len, emit, arg);
	pthread_mutex_lock(&n->mu);
	if (n->w) {
		uint8_t *buf = malloc(len ? len : 1);
		struct iovec iov;

		if (!buf) {
			r = -ENOMEM;
		} else {
			iov.iov_base = buf;
			iov.iov_len = writer_read(n->w, off, len, buf);
			r = emit(arg, &iov, 1);
			free(buf);
		}
	} else {
		r = read_extents(ns, &n->data, off, len, emit, arg);
	}
	pthread_mutex_unlock(&n->mu);
	return r;
}

int ns_setattr(struct ns *ns, struct node *n, int what, uint32_t mode, uint32_t uid,
	       uint32_t gid, int64_t mtime_ns)
{
	int r = 0;

	ns_wrlock(ns);
	if (n->type == NT_ROOT || n->type == NT_VERSIONS || n->type == NT_RLNK)
		r = -EPERM;
	else if (!ns_writable(n))
		r = -EROFS;
	if (r == 0) {
		if (what & NS_SET_MODE)
			n->mode = (n->mode & S_IFMT) | (mode & 07777);
		if (what & NS_SET_UID)
			n->uid = uid;
		if (what & NS_SET_GID)
			n->gid = gid;
		if (what & NS_SET_MTIME)
			n->mtime_ns = mtime_ns;
		n->ctime_ns = hwfs_now_ns();
	}
	ns_unlock(ns);
	return r;
}

static void usage_walk(struct node *n, uint64_t *bytes, uint64_t *files)
{
	for (size_t i = 0; i < n->nkids; i++) {
		struct node *k = n->kids[i];

		if (k->type == NT_DIR) {
			usage_walk(k, bytes, files);
		} else if (k->type == NT_REG) {
			(*files)++;
			pthread_mutex_lock(&k->mu);
			*bytes += k->w ? writer_size(k->w) : k->data.size;
			pthread_mutex_unlock(&k->mu);
		}
	}
}

void ns_version_usage(struct ns *ns, struct version *v, uint64_t *bytes, uint64_t *files)
{
	(void)ns;
	if (v->state != HWFS_V_OPEN) {
		*bytes = v->bytes;
		*files = v->files;
		return;
	}
	*bytes = *files = 0;
	usage_walk(v->root, bytes, files);
}
