/*
 * ns_tree.c — changes to the tree through FUSE: mkdir, create, symlink,
 * unlink/rmdir, rename and setattr, with the permission rules of the hwfs
 * model (ns.h): only open versions change (EROFS for sealed data), the fixed
 * parts (root, versions/, `current`) refuse with EPERM, and names must
 * survive the manifest (valid_name).  Three operations on the fixed parts are
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

/* ------------------------------------------------------------------ names */

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
int valid_name(const char *name)
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
