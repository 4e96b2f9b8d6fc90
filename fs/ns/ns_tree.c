/*
 * ns_tree.c — changes to the tree through FUSE: mkdir, create, symlink,
 * unlink/rmdir, rename and setattr, with the permission rules of the hwfs
 * model (ns.h): only open versions change (EROFS for sealed data), the fixed
 * parts (root, versions/, `current`) refuse with EPERM, and names must
 * survive the manifest (hwfs_valid_name).  Three operations on the fixed parts are
 * version operations in disguise: mkdir in versions/ opens a version, rmdir
 * of an empty open version discards it, and renaming a version seals it;
 * making or renaming onto `current` commits (see ns_version.c).
 *
 * Every change takes the exclusive namespace lock itself.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "ns_i.h"
#include "names.h"

/* ---------------------------------------------------------------- changes */

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

/*
 * May entry @name of @type go in @dir (exclusive lock held)?  0, or the errno
 * to answer.  A file or directory needs a directory it may go in, then a free
 * name.  A symlink needs a free name first; in the root it is a version link,
 * which may go there, and named `current` it commits the version @target names.
 */
static int may_add_entry(struct ns *ns, struct node *dir, enum ntype type, const char *name,
			 const char *target)
{
	int r;

	if (type != NT_LNK) {
		r = may_add(dir);
		return r < 0 ? r : ns_child(dir, name) ? -EEXIST : 0;
	}
	if (ns_child(dir, name))
		return -EEXIST;
	if (dir->type != NT_ROOT)
		return may_add(dir);
	return strcmp(name, "current") ? 0 : ns_commit_locked(ns, target);
}

/*
 * A new node in @dir that may_add_entry() allowed (exclusive lock held).
 * @target: a symlink's target (copied), NULL for other types.  Returns 0
 * with *@out, or -ENOMEM.
 */
static int add_child(struct ns *ns, struct node *dir, enum ntype type, const char *name,
		     uint32_t mode, uint32_t uid, uint32_t gid, const char *target,
		     struct node **out)
{
	struct node *n = ns_node_new(ns, type, name, mode, uid, gid);
	int r;

	if (!n)
		return -ENOMEM;
	/* `current` always reads versions/V, whatever form the commit named it in */
	n->target = !target ? NULL
		    : dir->type == NT_ROOT && !strcmp(name, "current") ? ns_current_target(target)
								       : strdup(target);
	r = target && !n->target ? -ENOMEM : ns_kid_insert(dir, n);
	if (r < 0) {
		ns_node_free(ns, n);
		return r;
	}
	dir->mtime_ns = dir->ctime_ns = n->mtime_ns;
	*out = n;
	return 0;
}

/*
 * A new directory, file or symlink for the kernel: @name checked, the entry
 * added under the exclusive lock (a symlink in the root is a version link)
 * and returned with one lookup reference.  Returns 0 or -errno.
 */
static int new_entry(struct ns *ns, struct node *dir, enum ntype type, const char *name,
		     uint32_t mode, uint32_t uid, uint32_t gid, const char *target,
		     struct node **out)
{
	struct node *n;
	int r;

	if (!hwfs_valid_name(name))
		return -EINVAL;
	ns_wrlock(ns);
	r = may_add_entry(ns, dir, type, name, target);
	if (r == 0)
		r = add_child(ns, dir, type == NT_LNK && dir->type == NT_ROOT ? NT_RLNK : type,
			      name, mode, uid, gid, target, &n);
	if (r == 0) {
		ns_lookup_ref(n);
		*out = n;
	}
	ns_unlock_commit(ns);
	return r;
}

int ns_mkdir(struct ns *ns, struct node *dir, const char *name, uint32_t mode, uint32_t uid,
	     uint32_t gid, struct node **out)
{
	struct version *v;
	int r;

	if (dir->type != NT_VERSIONS)
		return new_entry(ns, dir, NT_DIR, name, S_IFDIR | (mode & 07777), uid, gid, NULL,
				 out);
	/* mkdir in versions/ opens a version */
	if (!hwfs_valid_name(name))
		return -EINVAL;
	ns_wrlock(ns);
	r = ns_child(dir, name) ? -EEXIST
				: ns_version_new(ns, name, HWFS_V_OPEN, 0, mode, uid, gid, &v);
	if (r == 0) {
		ns_lookup_ref(v->root);
		*out = v->root;
	}
	ns_unlock(ns);
	return r;
}

int ns_create_file(struct ns *ns, struct node *dir, const char *name, uint32_t mode,
		   uint32_t uid, uint32_t gid, struct node **out)
{
	return new_entry(ns, dir, NT_REG, name, S_IFREG | (mode & 07777), uid, gid, NULL, out);
}

int ns_symlink(struct ns *ns, struct node *dir, const char *name, const char *target,
	       uint32_t uid, uint32_t gid, struct node **out)
{
	return new_entry(ns, dir, NT_LNK, name, S_IFLNK | 0777, uid, gid, target, out);
}

/*
 * A removal in or of version @v was refused with EROFS (`rm -rf versions/V`
 * of a sealed version): rm(1) can only print "Read-only file system" for each
 * entry, so the daemon's log says once per version what to do instead
 * (decision, issue 26; exclusive lock held).
 */
static void rm_hint(struct version *v)
{
	if (!v || v->state == HWFS_V_OPEN || v->rm_hinted)
		return;
	v->rm_hinted = 1;
	LOG_INFO("versions/%s is sealed: its files cannot be removed one by one (EROFS); "
		 "remove the version with `hwfs rm %s`", v->name, v->name);
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
	if (is_dir && !ns_is_dir_type(n->type)) {
		r = -ENOTDIR;
		goto out;
	}
	if (!is_dir && ns_is_dir_type(n->type)) {
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
		if (n->ver->state != HWFS_V_OPEN || n->ver->sealing) {
			r = -EROFS;
			rm_hint(n->ver);
		} else if (n->nkids)
			r = -ENOTEMPTY;
		else
			ns_version_drop(ns, n->ver);
		goto out;
	default:
		r = ns_writable(dir) ? 0 : -EROFS;
		if (r == -EROFS)
			rm_hint(dir->ver);
		if (r == 0 && n->nkids)
			r = -ENOTEMPTY;
	}
	if (r == 0) {
		ns_detach_tree(ns, n);
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

	if (!hwfs_valid_name(dname))
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
			char *canon = ns_current_target(s->target);

			r = canon ? ns_commit_locked(ns, s->target) : -EINVAL;
			if (r < 0) {
				free(canon);
				goto out;
			}
			free(s->target); /* `current` always reads versions/V */
			s->target = canon;
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
		if (ns_is_dir_type(s->type) && is_ancestor(s, ddir)) {
			r = -EINVAL;
			goto out;
		}
		if (d && ns_is_dir_type(d->type) != ns_is_dir_type(s->type)) {
			r = ns_is_dir_type(d->type) ? -EISDIR : -ENOTDIR;
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
			ns_detach_tree(ns, d);
		ns_kid_remove(sdir, s);
		free(s->name);
		s->name = nn;
		if (ns_kid_insert(ddir, s) < 0) { /* cannot happen: name checked free */
			r = -EIO;
			goto out;
		}
		s->ctime_ns = sdir->mtime_ns = ddir->mtime_ns = hwfs_now_ns();
		if (!strcmp(dname, "current"))
			s->mtime_ns = s->ctime_ns;
	}
out:
	ns_unlock_commit(ns);
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
		if (what & NS_SET_MTIME) /* atomic: see ns_touch() */
			__atomic_store_n(&n->mtime_ns, mtime_ns, __ATOMIC_RELAXED);
		__atomic_store_n(&n->ctime_ns, hwfs_now_ns(), __ATOMIC_RELAXED);
	}
	ns_unlock(ns);
	return r;
}
