/*
 * ns_version.c — the life of a version in the namespace: loading from the
 * index at start-up, import of a version that arrived from another node,
 * sealing, removal, state changes, `current` (the commit target) and the
 * plain records (ns_snapshot) that diff, verify and the manifest work from.
 *
 * These are the transitions at which the index is written; everything else in
 * the namespace lives in memory only (see ns.h).  A seal marks the version
 * `sealing` under the exclusive lock, so that it cannot change shape, and then
 * runs its index transaction with no namespace lock held.  A removed version's
 * struct is kept until shutdown (the graveyard): nodes that survive it, open
 * or still known to the kernel, point at it, and the lock-free read path looks
 * at its state.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "manifest.h"
#include "ns_i.h"
#include "names.h"

/* --------------------------------------------------------------- versions */

void ns_version_free(struct version *v)
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
int ns_version_new(struct ns *ns, const char *name, enum hwfs_vstate state, uint64_t seq,
		uint32_t mode, uint32_t uid, uint32_t gid, struct version **out)
{
	struct version *v = calloc(1, sizeof(*v));
	struct node *root = NULL;
	int r = -ENOMEM;

	if (!v)
		return -ENOMEM;
	v->name = strdup(name);
	root = ns_node_new(ns, NT_VROOT, name, S_IFDIR | (mode & 07777), uid, gid);
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
	r = ns_kid_insert(ns->versions, root);
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
		ns_node_free(ns, root);
	if (v)
		ns_version_free(v);
	return r;
}

/* Forget version @v: detach its tree (exclusive lock held). */
void ns_version_drop(struct ns *ns, struct version *v)
{
	size_t i;

	for (i = 0; i < ns->nvers && ns->vers[i] != v; i++)
		;
	if (i < ns->nvers) {
		memmove(ns->vers + i, ns->vers + i + 1, (ns->nvers - i - 1) * sizeof(*ns->vers));
		ns->nvers--;
	}
	ns_detach_tree(ns, v->root);
	/*
	 * Nodes that survive (open, or still known to the kernel) point at @v,
	 * and the lock-free read path looks at v->state: keep the struct until
	 * shutdown rather than count references to it.
	 */
	v->next_dead = ns->graveyard;
	ns->graveyard = v;
}

/* ---------------------------------------------------------------- loading */

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
			k = ns_node_new(ns, NT_DIR, tok, S_IFDIR | 0755, dir->uid, dir->gid);
			if (k && ns_kid_insert(dir, k) < 0) {
				ns_node_free(ns, k);
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
		n = ns_node_new(ns, t, base,
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
				ns_node_free(ns, n);
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
		if (ns_kid_insert(dir, n) < 0) {
			n->detached = 1;
			ns_node_free(ns, n);
			LOG_WARN("version %s: duplicate path %s ignored", rec->name, f->path);
		}
	}
	return 0;
}

int ns_load_version(struct ns *ns, struct hwfs_vrec *rec)
{
	struct version *v;
	int r, missing = 0;

	r = ns_version_new(ns, rec->name, rec->state, rec->seq, 0755, 0, 0, &v);
	if (r < 0)
		return r;
	v->created_ns = rec->created_ns;
	v->sealed_ns = rec->sealed_ns;
	v->digest = rec->digest;
	v->root->mtime_ns = v->root->ctime_ns = rec->sealed_ns;
	r = tree_from_rec(ns, v, rec, &missing);
	if (missing)
		v->state = HWFS_V_DAMAGED;
	ns_version_finish_tree(ns, v);
	return r;
}

int ns_import(struct ns *ns, const char *name, struct hwfs_vrec *rec)
{
	struct version *v;
	int r, missing = 0;

	ns_wrlock(ns);
	r = ns_child(ns->versions, name) ? -EEXIST : 0;
	if (r == 0)
		r = ns_version_new(ns, name, HWFS_V_OPEN, 0, 0755, 0, 0, &v);
	if (r == 0) {
		r = tree_from_rec(ns, v, rec, &missing);
		if (r == 0 && missing)
			r = -ENOENT;
		if (r < 0)
			ns_version_drop(ns, v);
	}
	ns_unlock(ns);
	return r;
}

/* ---------------------------------------------------------------- records */

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

	if (!rec || ns_collect(&l, v->root) < 0)
		goto out;
	order = malloc((l.n ? l.n : 1) * sizeof(*order));
	rec->files = calloc(l.n ? l.n : 1, sizeof(*rec->files));
	rec->name = strdup(v->name);
	if (!order || !rec->files || !rec->name)
		goto out;
	for (size_t i = 0; i < l.n; i++)
		order[i] = i;
	qsort_r(order, l.n, sizeof(*order), ns_cmp_idx, &l);
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
		if (ns_exposes_tensors(n)) {
			f->tensors = calloc(n->data.n_tensors ? n->data.n_tensors : 1,
					    sizeof(*f->tensors));
			if (!f->tensors)
				goto out;
			for (size_t i = 0; i < n->data.n_tensors; i++) {
				struct hwfs_trec *t = &f->tensors[i];

				*t = n->data.tensors[i];
				t->name = strdup(t->name);
				t->shape = t->ndim ? malloc(t->ndim * sizeof(uint64_t)) : NULL;
				f->n_tensors++;
				if (!t->name || (t->ndim && !t->shape))
					goto out;
				if (t->ndim) /* a scalar has no shape (and NULL pointers) */
					memcpy(t->shape, n->data.tensors[i].shape,
					       t->ndim * sizeof(uint64_t));
			}
		} else if (ns_ends_with(f->path, ".safetensors")) {
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
	ns_nodelist_free(&l);
	free(order);
	hwfs_vrec_free(rec);
	if (r < 0 && locs) {
		free(*locs);
		*locs = NULL;
	}
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
		if (!ns_hidden_name(ns->vers[i]->name))
			v[k++] = strdup(ns->vers[i]->name);
	ns_unlock(ns);
	*names = v;
	*n = k;
	return 0;
}

/*
 * The regular files below @n and their live bytes (a writer's size while one
 * is being written) into *@files and *@bytes; with @writing, only the files
 * being written.  Lock held.
 */
static void usage_walk(struct node *n, int writing, uint64_t *bytes, uint64_t *files)
{
	for (size_t i = 0; i < n->nkids; i++) {
		struct node *k = n->kids[i];

		if (k->type == NT_DIR) {
			usage_walk(k, writing, bytes, files);
		} else if (k->type == NT_REG) {
			pthread_mutex_lock(&k->mu);
			if (!writing || k->w) {
				(*files)++;
				*bytes += k->w ? writer_size(k->w) : k->data.size;
			}
			pthread_mutex_unlock(&k->mu);
		}
	}
}

void ns_version_usage(struct version *v, uint64_t *bytes, uint64_t *files)
{
	if (v->state != HWFS_V_OPEN) {
		*bytes = v->bytes;
		*files = v->files;
		return;
	}
	*bytes = *files = 0;
	usage_walk(v->root, 0, bytes, files);
}

/*
 * What open files hold: the orphans (detached: of a removed version, or
 * unlinked) still open keep their bytes (a tensors/ entry, its tensor's);
 * files being written in open versions (a writer lives from the first write
 * to the last close) keep theirs.
 */
void ns_held(struct ns *ns, struct ns_held *h)
{
	*h = (struct ns_held){0};
	ns_rdlock(ns);
	for (struct node *n = ns->orphans.orph_next; n != &ns->orphans; n = n->orph_next) {
		if (!__atomic_load_n(&n->nopen, __ATOMIC_ACQUIRE))
			continue;
		if (n->type == NT_REG) {
			pthread_mutex_lock(&n->mu);
			h->removed_bytes += n->w ? writer_size(n->w) : n->data.size;
			pthread_mutex_unlock(&n->mu);
		} else if (n->type == NT_TENSOR && n->tensor) {
			h->removed_bytes += n->tensor->len;
		} else {
			continue;
		}
		h->removed_files++;
	}
	for (size_t i = 0; i < ns->nvers; i++)
		if (ns->vers[i]->state == HWFS_V_OPEN)
			usage_walk(ns->vers[i]->root, 1, &h->writing_bytes, &h->writing_files);
	ns_unlock(ns);
}

/* ------------------------------------------------------------------- seal */

/*
 * Finish every file under @n (each one's writer, under its mutex), and append
 * to @err (at @*pos, NUL-terminated, @len bytes) "write to PATH failed
 * (REASON)" for every file whose write failed; returns how many there are.
 * Paths that do not fit are counted, not named.  Lock held.
 */
static size_t finish_files(struct node *n, char *err, size_t len, size_t *pos)
{
	size_t count = 0;

	for (size_t i = 0; i < n->nkids; i++) {
		struct node *k = n->kids[i];
		int e;

		if (k->type == NT_DIR) {
			count += finish_files(k, err, len, pos);
			continue;
		}
		if (k->type != NT_REG)
			continue;
		pthread_mutex_lock(&k->mu);
		ns_node_finish_writer(k);
		e = k->write_error;
		pthread_mutex_unlock(&k->mu);
		if (!e)
			continue;
		if (*pos < len) {
			char *path = ns_node_path(k);
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

	if (new_name && (!hwfs_valid_name(new_name) || ns_hidden_name(new_name)))
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
	nfail = finish_files(v->root, why, sizeof(why), &pos);
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
		ns_kid_remove(ns->versions, v->root);
		free(v->root->name);
		v->root->name = nn;
		free(v->name);
		v->name = vn;
		ns_kid_insert(ns->versions, v->root);
	}
	v->digest = rec->digest;
	__atomic_store_n(&v->state, HWFS_V_SEALED, __ATOMIC_RELEASE);
	v->root->mtime_ns = v->root->ctime_ns = v->sealed_ns;
	ns_version_finish_tree(ns, v);
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

void ns_set_seal_hook(struct ns *ns, void (*hook)(void *arg, const char *name), void *arg)
{
	ns->seal_hook = hook;
	ns->seal_hook_arg = arg;
}

/* ---------------------------------------------------------------- current */

/*
 * Parse a `current` target: "versions/V" (or "./versions/V", trailing '/'),
 * or the bare name "V" (`ln -sfn V current`).
 */
static int current_target_version(const char *target, char *name, size_t len)
{
	const char *p = target;
	size_t n;

	if (!strncmp(p, "./", 2))
		p += 2;
	if (!strncmp(p, "versions/", 9))
		p += 9;
	else if (strchr(p, '/') && strspn(strchr(p, '/'), "/") != strlen(strchr(p, '/')))
		return -EINVAL; /* another directory than versions/ */
	n = strlen(p);
	while (n && p[n - 1] == '/')
		n--;
	if (n == 0 || n >= len || memchr(p, '/', n))
		return -EINVAL;
	memcpy(name, p, n);
	name[n] = '\0';
	return 0;
}

char *ns_current_target(const char *target)
{
	char name[HWFS_NAME_MAX + 1], *out;

	if (current_target_version(target, name, sizeof(name)) < 0 || !hwfs_valid_name(name) ||
	    asprintf(&out, "versions/%s", name) < 0)
		return NULL;
	return out;
}

int ns_set_current_node(struct ns *ns, const char *name)
{
	struct node *cur = ns_child(ns->root, "current");
	char *target;

	if (asprintf(&target, "versions/%s", name) < 0)
		return -ENOMEM;
	if (!cur) {
		cur = ns_node_new(ns, NT_RLNK, "current", S_IFLNK | 0777, 0, 0);
		if (!cur || ns_kid_insert(ns->root, cur) < 0) {
			free(target);
			if (cur)
				ns_node_free(ns, cur);
			return -ENOMEM;
		}
	}
	free(cur->target);
	cur->target = target;
	cur->mtime_ns = cur->ctime_ns = hwfs_now_ns();
	return 0;
}

int ns_check_committable_locked(struct ns *ns, const char *name, char *err, size_t errlen)
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

int ns_check_committable(struct ns *ns, const char *name, hwfs_hash_t *digest, char *err,
			 size_t errlen)
{
	int r;

	ns_rdlock(ns);
	r = ns_check_committable_locked(ns, name, err, errlen);
	if (r == 0 && digest)
		*digest = ns_version(ns, name)->digest;
	ns_unlock(ns);
	return r;
}

/* Make `current` point at the version named by @target (lock held). */
int ns_commit_locked(struct ns *ns, const char *target)
{
	char name[512], err[256];
	int r;

	r = current_target_version(target, name, sizeof(name));
	if (r < 0)
		return r;
	r = ns_check_committable_locked(ns, name, err, sizeof(err));
	if (r < 0) {
		LOG_WARN("commit refused: %s", err);
		return r;
	}
	r = store_set_current(ns->st, name);
	if (r == 0) {
		ns->commit_hook_due = 1;
		ns->commits++;
	}
	return r;
}

void ns_unlock_commit(struct ns *ns)
{
	void (*hook)(void *) = ns->current_hook;
	void *arg = ns->current_hook_arg;
	int due = ns->commit_hook_due;

	ns->commit_hook_due = 0;
	ns_unlock(ns);
	if (due && hook)
		hook(arg);
}

void ns_set_current_hook(struct ns *ns, void (*hook)(void *arg), void *arg)
{
	ns->current_hook = hook;
	ns->current_hook_arg = arg;
}

char *ns_current(struct ns *ns)
{
	uint64_t gen;

	return ns_current_gen(ns, &gen);
}

/* The committed version's name and the commit count, read together (see ns.h). */
char *ns_current_gen(struct ns *ns, uint64_t *gen)
{
	struct node *cur;
	char name[512];
	char *s = NULL;

	ns_rdlock(ns);
	cur = ns_child(ns->root, "current");
	if (cur && current_target_version(cur->target, name, sizeof(name)) == 0)
		s = strdup(name);
	*gen = ns->commits;
	ns_unlock(ns);
	return s;
}

/* ----------------------------------------------------------------- states */

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
	ns_version_drop(ns, v);
out:
	ns_unlock(ns);
	return r;
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

int ns_version_state(struct ns *ns, const char *name, enum hwfs_vstate *state, uint64_t *seq,
		     hwfs_hash_t *digest)
{
	struct version *v;

	ns_rdlock(ns);
	v = ns_version(ns, name);
	if (v) {
		if (state)
			*state = __atomic_load_n(&v->state, __ATOMIC_ACQUIRE);
		if (seq)
			*seq = v->seq;
		if (digest)
			*digest = v->digest;
	}
	ns_unlock(ns);
	return v ? 0 : -ENOENT;
}

void ns_vinfo_free(struct ns_vinfo *vi)
{
	for (size_t i = 0; i < vi->n_errors; i++) {
		free(vi->errors[i].file);
		free(vi->errors[i].error);
	}
	free(vi->errors);
	free(vi->name);
	*vi = (struct ns_vinfo){0};
}

/* Copy @v's figures into *@vi (lock held): 0 or -ENOMEM (*@vi freed). */
static int vinfo_fill(struct version *v, struct ns_vinfo *vi)
{
	*vi = (struct ns_vinfo){.state = v->state, .seq = v->seq, .digest = v->digest,
				.tensors = v->tensors};
	ns_version_usage(v, &vi->bytes, &vi->files);
	vi->name = strdup(v->name);
	vi->errors = v->n_errors ? calloc(v->n_errors, sizeof(*vi->errors)) : NULL;
	if (!vi->name || (v->n_errors && !vi->errors))
		goto nomem;
	for (; vi->n_errors < v->n_errors; vi->n_errors++) {
		struct ns_vinfo_error *e = &vi->errors[vi->n_errors];

		e->file = strdup(v->errors[vi->n_errors].file);
		e->error = strdup(v->errors[vi->n_errors].error);
		if (!e->file || !e->error) {
			vi->n_errors++;
			goto nomem;
		}
	}
	return 0;
nomem:
	ns_vinfo_free(vi);
	return -ENOMEM;
}

int ns_version_info(struct ns *ns, const char *name, struct ns_vinfo *out)
{
	struct version *v;
	int r = -ENOENT;

	*out = (struct ns_vinfo){0};
	ns_rdlock(ns);
	v = ns_version(ns, name);
	if (v)
		r = vinfo_fill(v, out);
	ns_unlock(ns);
	return r;
}

/* Could the caller of @bits read everything below @n (lock held)?  1 or 0. */
static int tree_readable(const struct node *n,
			 uint32_t (*bits)(void *arg, uint32_t mode, uint32_t uid, uint32_t gid),
			 void *arg)
{
	switch (n->type) {
	case NT_LNK:
	case NT_RLNK:
		return 1;
	case NT_REG:
	case NT_TENSOR:
	case NT_TPFILE:
		return (bits(arg, n->mode, n->uid, n->gid) & 4) != 0;
	default:
		if ((bits(arg, n->mode, n->uid, n->gid) & 5) != 5)
			return 0;
		for (size_t i = 0; i < n->nkids; i++)
			if (!tree_readable(n->kids[i], bits, arg))
				return 0;
		return 1;
	}
}

int ns_version_readable(struct ns *ns, const char *name,
			uint32_t (*bits)(void *arg, uint32_t mode, uint32_t uid, uint32_t gid),
			void *arg)
{
	const struct node *root = ns->root, *vers = ns->versions;
	struct version *v;
	int r;

	ns_rdlock(ns);
	v = ns_version(ns, name);
	if (!v)
		r = -ENOENT;
	else
		r = (bits(arg, root->mode, root->uid, root->gid) & 1) &&
		    (bits(arg, vers->mode, vers->uid, vers->gid) & 1) &&
		    tree_readable(v->root, bits, arg);
	ns_unlock(ns);
	return r;
}
