/*
 * ns.c — the namespace core (see ns.h for the model, ns_i.h for the
 * locking): nodes, directories, references, inode numbers, orphans, the lock.
 * The other jobs of the namespace live beside it and share its private
 * declarations through ns_i.h: the life cycle (ns_life.c), versions
 * (ns_version.c), the tensors/ view (ns_tensors.c), the tp/ view (ns_tp.c,
 * ns_tp_file.c), tree changes through FUSE (ns_tree.c) and file data
 * (ns_io.c).  Of those it calls only ns_tp_file.c (a view file's size and
 * end).
 *
 * Directories keep their children in an array sorted by name (strcmp; the
 * directories of the tp/ view by number, so `ls -U tp/` reads 1 2 4 8 16),
 * which gives binary-search lookups and readdir offsets that stay meaningful
 * while a directory changes (the offset is an index; a change between two
 * readdir calls may repeat or skip an entry, as POSIX allows).
 *
 * Node lifetime: a node lives while it is attached to the tree, looked up by
 * the kernel (nlookup) or open (nopen).  "Release" (giving back the shards of
 * a file) happens earlier than "free" (the struct itself): as soon as a
 * detached node is closed, so that `hwfs rm` frees memory when the last reader
 * closes even if the kernel keeps the inode cached.  A tensor node reads
 * through its file node and pins it while it may be read.  Detached nodes
 * that are still referenced sit on the orphan list until their last reference
 * goes, or until ns_destroy().
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "ns_i.h"

/* ------------------------------------------------------------------ nodes */

uint64_t ns_next_ino(struct ns *ns)
{
	return __atomic_add_fetch(&ns->next_ino, 1, __ATOMIC_RELAXED);
}

struct node *ns_node_new(struct ns *ns, enum ntype type, const char *name, uint32_t mode,
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

int ns_is_dir_type(enum ntype t)
{
	return t == NT_ROOT || t == NT_VERSIONS || t == NT_VROOT || t == NT_DIR || t == NT_TDIR;
}

/* Whether @s is a non-empty run of decimal digits. */
static int all_digits(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return 0;
	return 1;
}

/*
 * The order of a by_number directory: digit strings first, shorter first and
 * then by strcmp (numeric order for numbers without leading zeros, a total
 * order for any), then every other name by strcmp.
 */
static int name_cmp_num(const char *a, const char *b)
{
	int da = all_digits(a), db = all_digits(b);
	size_t la, lb;

	if (da != db)
		return da ? -1 : 1;
	if (da) {
		la = strlen(a);
		lb = strlen(b);
		if (la != lb)
			return la < lb ? -1 : 1;
	}
	return strcmp(a, b);
}

/* Position of @name in @dir's sorted children (or where it would go). */
static size_t kid_pos(const struct node *dir, const char *name, int *found)
{
	size_t lo = 0, hi = dir->nkids;

	*found = 0;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = dir->by_number ? name_cmp_num(dir->kids[mid]->name, name)
				       : strcmp(dir->kids[mid]->name, name);

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

	if (!ns_is_dir_type(dir->type))
		return NULL;
	i = kid_pos(dir, name, &found);
	return found ? dir->kids[i] : NULL;
}

int ns_listed(const struct node *dir, const struct node *k)
{
	if (dir->type == NT_VERSIONS && ns_hidden_name(k->name))
		return 0;
	if (k->why)
		return 0;
	/* the computed views of a version (tensors/, tp/): by path only, so that
	 * cp -r, rsync -a, du and backups of versions/V see the checkpoint */
	return !(dir->type == NT_VROOT && k->type == NT_TDIR);
}

int ns_kid_insert(struct node *dir, struct node *n)
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

void ns_kid_remove(struct node *dir, struct node *n)
{
	int found;
	size_t i = kid_pos(dir, n->name, &found);

	if (!found || dir->kids[i] != n)
		return;
	memmove(dir->kids + i, dir->kids + i + 1, (dir->nkids - i - 1) * sizeof(*dir->kids));
	dir->nkids--;
	n->parent = NULL;
}

static void unpin_file(struct ns *ns, struct node *f);

/* Give back the bytes of a detached, closed node. */
static void node_release_data(struct ns *ns, struct node *n)
{
	if (n->type == NT_REG) {
		if (n->pins)
			return;
		/*
		 * Under the file's mutex: a truncate by path (setattr, no open
		 * handle to count) may be using the writer; it finishes first,
		 * and any later one sees the node detached (EROFS).
		 */
		pthread_mutex_lock(&n->mu);
		writer_abort(n->w);
		node_set_writer(n, NULL);
		ingest_result_clear(ns->st, &n->data);
		pthread_mutex_unlock(&n->mu);
	} else if (n->type == NT_TENSOR && n->tfile) {
		struct node *f = n->tfile;

		n->tfile = NULL;
		n->tensor = NULL;
		unpin_file(ns, f);
	} else if (n->type == NT_TPFILE && n->tp) {
		struct tp_file *t = n->tp;
		struct node **pins;
		size_t np = tp_pins(t, &pins);

		n->tp = NULL;
		for (size_t i = 0; i < np; i++)
			unpin_file(ns, pins[i]);
		tp_file_free(t);
	}
}

/* Drop a tensor's or view's pin on file @f; free its data, then it, when nothing holds it. */
static void unpin_file(struct ns *ns, struct node *f)
{
	f->pins--;
	if (f->detached && __atomic_load_n(&f->nopen, __ATOMIC_ACQUIRE) == 0) {
		node_release_data(ns, f);
		if (__atomic_load_n(&f->nlookup, __ATOMIC_ACQUIRE) == 0)
			ns_node_free(ns, f);
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

void ns_node_free(struct ns *ns, struct node *n)
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
	free(n->why);
	free(n->name);
	free(n);
}

/* Detach @n and its whole subtree (exclusive lock held). */
void ns_detach_tree(struct ns *ns, struct node *n)
{
	if (n->parent)
		ns_kid_remove(n->parent, n);
	/* atomic: ns_writable() reads it without the namespace lock */
	__atomic_store_n(&n->detached, 1, __ATOMIC_RELEASE);
	for (size_t i = 0; i < n->nkids; i++) {
		n->kids[i]->parent = NULL;
		ns_detach_tree(ns, n->kids[i]);
	}
	n->nkids = 0;
	if (__atomic_load_n(&n->nopen, __ATOMIC_ACQUIRE) == 0)
		node_release_data(ns, n);
	if (node_freeable(n)) {
		ns_node_free(ns, n);
	} else if (!n->orph_next) { /* still open or known to the kernel */
		n->orph_next = ns->orphans.orph_next;
		n->orph_prev = &ns->orphans;
		ns->orphans.orph_next->orph_prev = n;
		ns->orphans.orph_next = n;
	}
}

/* ------------------------------------------------------------- references */

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
		ns_node_free(ns, n);
	ns_unlock(ns);
}

void ns_open_ref(struct node *n)
{
	__atomic_add_fetch(&n->nopen, 1, __ATOMIC_ACQ_REL);
}

/*
 * Finish the writer of file @n, if it has one (n->mu held): its tail is cut
 * and its data final.  Out of memory there loses the data: that is logged
 * and kept in n->write_error, so the version will not seal without --force.
 */
void ns_node_finish_writer(struct node *n)
{
	if (!n->w)
		return;
	if (writer_finish(n->w, &n->data) < 0) {
		LOG_ERR("file %s: out of memory while finishing; data lost", n->name);
		n->write_error = ENOMEM;
	}
	node_set_writer(n, NULL);
}

/*
 * Take an open reference on @n unless it is detached (removed).  The shared
 * lock orders this against ns_detach_tree() (exclusive lock): either the removal
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
		if (__atomic_load_n(&n->nopen, __ATOMIC_ACQUIRE) == 1)
			ns_node_finish_writer(n);
		pthread_mutex_unlock(&n->mu);
	}
	/*
	 * The count drops under the exclusive lock, which excludes ns_open()
	 * (shared lock) and ns_detach_tree(): the value left is exact, so exactly
	 * one of "the removal" and "the last close" gives the data back.
	 */
	ns_wrlock(ns);
	left = __atomic_sub_fetch(&n->nopen, 1, __ATOMIC_ACQ_REL);
	if (n->detached && left == 0) {
		node_release_data(ns, n);
		if (node_freeable(n))
			ns_node_free(ns, n);
	}
	ns_unlock(ns);
}

/* -------------------------------------------------------------- namespace */

struct store *ns_store(struct ns *ns)
{
	return ns->st;
}

struct node *ns_root(struct ns *ns)
{
	return ns->root;
}

struct node *ns_versions_dir(struct ns *ns)
{
	return ns->versions;
}

void ns_attr(struct ns *ns, struct node *n, uint32_t *mode, uint32_t *uid, uint32_t *gid)
{
	ns_rdlock(ns);
	if (mode)
		*mode = n->mode;
	if (uid)
		*uid = n->uid;
	if (gid)
		*gid = n->gid;
	ns_unlock(ns);
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
	       n->type != NT_TDIR && n->type != NT_TENSOR && n->type != NT_TPFILE;
}

void ns_stat(struct ns *ns, struct node *n, struct stat *st)
{
	uint64_t size = 0;
	int64_t mtime, ctime;

	memset(st, 0, sizeof(*st));
	st->st_ino = n->ino;
	st->st_mode = n->mode;
	st->st_uid = n->uid;
	st->st_gid = n->gid;
	st->st_nlink = ns_is_dir_type(n->type) ? 2 : 1;
	switch (n->type) {
	case NT_REG:
		if (node_writer(n)) {
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
	case NT_TPFILE:
		size = tp_size(n);
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
	/* atomic: a write to an open file updates them under the file's mutex only */
	mtime = __atomic_load_n(&n->mtime_ns, __ATOMIC_RELAXED);
	ctime = __atomic_load_n(&n->ctime_ns, __ATOMIC_RELAXED);
	st->st_mtim.tv_sec = mtime / 1000000000;
	st->st_mtim.tv_nsec = mtime % 1000000000;
	st->st_ctim.tv_sec = ctime / 1000000000;
	st->st_ctim.tv_nsec = ctime % 1000000000;
	st->st_atim = st->st_mtim;
	(void)ns;
}

/* ------------------------------------------------------------------ walks */

/* Path of @n relative to its version root, malloc'd. */
char *ns_node_path(const struct node *n)
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

/*
 * Collect a version's nodes below @n (tensors/ left out) with their paths, in
 * depth-first order; sort an index array with ns_cmp_idx for path order.
 */
int ns_collect(struct nodelist *l, struct node *n)
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
		l->path[l->n] = ns_node_path(k);
		if (!l->path[l->n])
			return -ENOMEM;
		l->v[l->n++] = k;
		if (k->type == NT_DIR && ns_collect(l, k) < 0)
			return -ENOMEM;
	}
	return 0;
}

void ns_nodelist_free(struct nodelist *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->path[i]);
	free(l->path);
	free(l->v);
}

int ns_cmp_idx(const void *a, const void *b, void *ctx)
{
	const struct nodelist *l = ctx;

	return strcmp(l->path[*(const size_t *)a], l->path[*(const size_t *)b]);
}
