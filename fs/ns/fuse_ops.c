/*
 * fuse_ops.c — FUSE low-level operations (the `hwfs_` prefix stands for the
 * mount; each op is one function ending in exactly one reply).
 *
 * Caching: sealed data and tensors are immutable, so their entries and
 * attributes are cached for a day and their pages are kept across opens
 * (keep_cache).  Open versions, `versions/` and the root change, so they get
 * one second.  Reads of sealed files reply straight from arena memory with
 * fuse_reply_iov: one copy, into the kernel's page cache.  A small read of
 * sealed data also has its window stored into the page cache
 * (fuse_readaround.c), so random readers pay one round trip per window.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "fuse_ops.h"
#include "metrics.h"
#include "names.h"
#include "ns_i.h"
#include "tunables.h"

#define TTL_SEALED 86400.0
#define TTL_LIVE 1.0

static struct fsctx *CTX(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct node *N(fuse_req_t req, fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID ? ns_root(CTX(req)->ns) : (struct node *)(uintptr_t)ino;
}

fuse_ino_t hwfs_fuse_ino(struct ns *ns, struct node *n)
{
	return n == ns_root(ns) ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
}

static double ttl_of(const struct node *n)
{
	if (n->type == NT_TENSOR || n->type == NT_TDIR || n->type == NT_TPFILE)
		return TTL_SEALED;
	if (n->ver && n->type != NT_VROOT && n->ver->state != HWFS_V_OPEN)
		return TTL_SEALED;
	return TTL_LIVE;
}

/* Fill @e for @n and count the kernel's new reference (lock held). */
static void fill_entry(fuse_req_t req, struct node *n, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = hwfs_fuse_ino(CTX(req)->ns, n);
	e->generation = n->ino;
	ns_stat(CTX(req)->ns, n, &e->attr);
	e->attr_timeout = e->entry_timeout = ttl_of(n);
}

static void hwfs_init(void *userdata, struct fuse_conn_info *conn)
{
	struct fsctx *c = userdata;

	conn->max_write = 1 << 20;
	conn->max_read = 1 << 20;
	conn->max_readahead = 1 << 20;
	conn->max_background = (unsigned)hwfs_tun.max_background;
	conn->congestion_threshold = (unsigned)hwfs_tun.max_background * 3 / 4;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
	if (c->on_init)
		c->on_init(c->arg);
}

static void hwfs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	hwfs_count_fuse(HWFS_FOP_lookup);
	struct ns *ns = CTX(req)->ns;
	struct fuse_entry_param e;
	struct node *n;

	ns_rdlock(ns);
	n = ns_child(N(req, parent), name);
	if (n && n->why) { /* a TP size that cannot be served: tp/README says why */
		ns_unlock(ns);
		return (void)fuse_reply_err(req, EINVAL);
	}
	if (n) {
		ns_lookup_ref(n);
		fill_entry(req, n, &e);
	}
	ns_unlock(ns);
	if (!n)
		return (void)fuse_reply_err(req, ENOENT);
	fuse_reply_entry(req, &e);
}

static void hwfs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	hwfs_count_fuse(HWFS_FOP_forget);
	ns_forget(CTX(req)->ns, N(req, ino), nlookup);
	fuse_reply_none(req);
}

static void hwfs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f)
{
	hwfs_count_fuse(HWFS_FOP_forget);
	for (size_t i = 0; i < count; i++)
		ns_forget(CTX(req)->ns, N(req, f[i].ino), f[i].nlookup);
	fuse_reply_none(req);
}

static void hwfs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_getattr);
	struct ns *ns = CTX(req)->ns;
	struct node *n = N(req, ino);
	struct stat st;
	double ttl;

	ns_rdlock(ns);
	ns_stat(ns, n, &st);
	ttl = ttl_of(n);
	ns_unlock(ns);
	fuse_reply_attr(req, &st, ttl);
}

static void hwfs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			 struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_setattr);
	struct ns *ns = CTX(req)->ns;
	struct node *n = N(req, ino);
	int what = 0, r = 0;
	int64_t mtime = 0;

	if (to_set & FUSE_SET_ATTR_SIZE)
		r = ns_truncate(ns, n, (uint64_t)attr->st_size);
	if (to_set & FUSE_SET_ATTR_MODE)
		what |= NS_SET_MODE;
	if (to_set & FUSE_SET_ATTR_UID)
		what |= NS_SET_UID;
	if (to_set & FUSE_SET_ATTR_GID)
		what |= NS_SET_GID;
	if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
		what |= NS_SET_MTIME;
		mtime = hwfs_now_ns();
	} else if (to_set & FUSE_SET_ATTR_MTIME) {
		what |= NS_SET_MTIME;
		mtime = (int64_t)attr->st_mtim.tv_sec * 1000000000 + attr->st_mtim.tv_nsec;
	}
	/* atime is not kept; accepting it keeps `touch` and `cp -p` quiet */
	if (r == 0 && (what || (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW |
					   FUSE_SET_ATTR_CTIME))))
		r = ns_setattr(ns, n, what, attr->st_mode, attr->st_uid, attr->st_gid, mtime);
	if (r < 0)
		return (void)fuse_reply_err(req, -r);
	hwfs_getattr(req, ino, fi);
}

static void hwfs_readlink(fuse_req_t req, fuse_ino_t ino)
{
	hwfs_count_fuse(HWFS_FOP_readlink);
	struct ns *ns = CTX(req)->ns;
	struct node *n = N(req, ino);
	char *t = NULL;

	ns_rdlock(ns);
	if (n->target)
		t = strdup(n->target);
	ns_unlock(ns);
	if (!t)
		return (void)fuse_reply_err(req, n->target ? ENOMEM : EINVAL);
	fuse_reply_readlink(req, t);
	free(t);
}

/*
 * Whether @name in @dir is reserved for the daemon: `versions/.hwfs-*` is the
 * staging of publish and of replicated versions, which the daemon creates
 * through ns.c directly, never through a FUSE request.  Requests that would
 * create such an entry get EPERM, and readdir does not list it (renaming a
 * staging version *away* from the prefix is how the daemon seals it, so the
 * source name is not checked).
 */
static int reserved_name(const struct node *dir, const char *name)
{
	return dir->type == NT_VERSIONS && ns_hidden_name(name);
}

static void reply_new(fuse_req_t req, int r, struct node *n)
{
	struct fuse_entry_param e;

	if (r < 0)
		return (void)fuse_reply_err(req, -r);
	ns_rdlock(CTX(req)->ns);
	fill_entry(req, n, &e);
	ns_unlock(CTX(req)->ns);
	fuse_reply_entry(req, &e);
}

static void hwfs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	hwfs_count_fuse(HWFS_FOP_mkdir);
	const struct fuse_ctx *c = fuse_req_ctx(req);
	struct node *n = NULL;
	int r = reserved_name(N(req, parent), name)
			? -EPERM
			: ns_mkdir(CTX(req)->ns, N(req, parent), name, mode & ~c->umask, c->uid,
				   c->gid, &n);

	reply_new(req, r, n);
}

static void hwfs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		       dev_t rdev)
{
	hwfs_count_fuse(HWFS_FOP_mknod);
	const struct fuse_ctx *c = fuse_req_ctx(req);
	struct node *n = NULL;
	int r;

	if (!S_ISREG(mode) || reserved_name(N(req, parent), name))
		return (void)fuse_reply_err(req, EPERM);
	r = ns_create_file(CTX(req)->ns, N(req, parent), name, mode & ~c->umask, c->uid, c->gid, &n);
	reply_new(req, r, n);
}

/* Does no version hold `current` yet? */
static int no_current(struct ns *ns)
{
	char *cur = ns_current(ns);

	free(cur);
	return cur == NULL;
}

static void hwfs_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	hwfs_count_fuse(HWFS_FOP_symlink);
	const struct fuse_ctx *c = fuse_req_ctx(req);
	struct fsctx *fc = CTX(req);
	struct node *n = NULL;
	int r = reserved_name(N(req, parent), name) ? -EPERM : 0;

	/* `ln -s V current` while there is none: the first commit, gated like a rename */
	if (r == 0 && N(req, parent) == ns_root(fc->ns) && !strcmp(name, "current") && fc->commit &&
	    no_current(fc->ns))
		r = fc->commit(fc->arg, link, c->pid);
	if (r == 0)
		r = ns_symlink(fc->ns, N(req, parent), name, link, c->uid, c->gid, &n);
	reply_new(req, r, n);
}

static void hwfs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	hwfs_count_fuse(HWFS_FOP_unlink);
	fuse_reply_err(req, -ns_unlink(CTX(req)->ns, N(req, parent), name, 0));
}

static void hwfs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	hwfs_count_fuse(HWFS_FOP_rmdir);
	fuse_reply_err(req, -ns_unlink(CTX(req)->ns, N(req, parent), name, 1));
}

/*
 * commit_gate() - a rename of root symlink @name onto `current` is a commit:
 * hand its target to the daemon's commit callback (struct fsctx), which
 * returns once the commit is decided.  0: the rename may flip; -errno: not.
 */
static int commit_gate(fuse_req_t req, struct node *root, const char *name)
{
	struct fsctx *c = CTX(req);
	struct node *s;
	char *target = NULL;
	int found, link, r;

	if (!c->commit)
		return 0;
	ns_rdlock(c->ns);
	s = ns_child(root, name);
	found = s != NULL;
	link = s && s->type == NT_RLNK;
	if (link && s->target)
		target = strdup(s->target);
	ns_unlock(c->ns);
	if (!found)
		return -ENOENT;
	if (!link) /* ns_rename refuses it */
		return 0;
	if (!target)
		return -ENOMEM;
	r = c->commit(c->arg, target, fuse_req_ctx(req)->pid);
	free(target);
	return r;
}

static void hwfs_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
			const char *newname, unsigned int flags)
{
	struct node *root = ns_root(CTX(req)->ns);
	int r;

	hwfs_count_fuse(HWFS_FOP_rename);
	if (reserved_name(N(req, newparent), newname))
		return (void)fuse_reply_err(req, EPERM);
	if (N(req, parent) == root && N(req, newparent) == root && !strcmp(newname, "current") &&
	    strcmp(name, "current") && (r = commit_gate(req, root, name)) < 0)
		return (void)fuse_reply_err(req, -r);
	fuse_reply_err(req, -ns_rename(CTX(req)->ns, N(req, parent), name, N(req, newparent),
				       newname, flags));
}

static void hwfs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	hwfs_count_fuse(HWFS_FOP_link);
	fuse_reply_err(req, EPERM);
}

/* Checks shared by open and create; takes the open reference. */
static int do_open(struct ns *ns, struct node *n, struct fuse_file_info *fi)
{
	int wr = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
	int r;

	if (n->type != NT_REG && n->type != NT_TENSOR && n->type != NT_TPFILE)
		return n->type == NT_RLNK || n->type == NT_LNK ? -ELOOP : -EISDIR;
	r = ns_open(ns, n); /* -ENOENT once removed */
	if (r < 0)
		return r;
	r = wr && !ns_writable(n) ? -EROFS : 0;
	if (r == 0 && (fi->flags & O_TRUNC))
		r = ns_truncate(ns, n, 0);
	if (r < 0) {
		ns_release(ns, n);
		return r;
	}
	fi->fh = (uint64_t)(uintptr_t)n;
	fi->keep_cache = !ns_writable(n);
	/*
	 * A write-only writer (cp, rsync's final pass, safetensors, torch) gains
	 * nothing from the page cache: direct I/O hands its buffer straight to
	 * ingest, saving a copy and the page allocations.  Read-write opens keep
	 * the page cache so that mmap works on them.
	 */
	fi->direct_io = (fi->flags & O_ACCMODE) == O_WRONLY && ns_writable(n);
	return 0;
}

static void hwfs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_open);
	int r = do_open(CTX(req)->ns, N(req, ino), fi);

	if (r < 0)
		return (void)fuse_reply_err(req, -r);
	fuse_reply_open(req, fi);
}

static void hwfs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
			struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_create);
	const struct fuse_ctx *c = fuse_req_ctx(req);
	struct ns *ns = CTX(req)->ns;
	struct fuse_entry_param e;
	struct node *n = NULL;
	int r = reserved_name(N(req, parent), name)
			? -EPERM
			: ns_create_file(ns, N(req, parent), name, mode & ~c->umask, c->uid,
					 c->gid, &n);

	if (r == -EEXIST && !(fi->flags & O_EXCL)) { /* lost a race with another creator */
		ns_rdlock(ns);
		n = ns_child(N(req, parent), name);
		if (n)
			ns_lookup_ref(n);
		ns_unlock(ns);
		r = n ? 0 : -ENOENT;
	}
	if (r == 0) {
		r = do_open(ns, n, fi);
		if (r < 0)
			ns_forget(ns, n, 1);
	}
	if (r < 0)
		return (void)fuse_reply_err(req, -r);
	ns_rdlock(ns);
	fill_entry(req, n, &e);
	ns_unlock(ns);
	fuse_reply_create(req, &e, fi);
}

struct read_reply {
	fuse_req_t req;
	int replied;
};

/*
 * The read reply: @cnt iovecs (at most NS_READ_IOV_MAX, which ns_read
 * guarantees, so writev() accepts them).  A reply libfuse fails to send has
 * still consumed the request (libfuse frees it), so there is nothing left to
 * answer: the failure is logged.  Returns what libfuse returns.
 */
static int emit_reply(void *arg, const struct iovec *iov, int cnt)
{
	struct read_reply *rr = arg;
	size_t len = 0;
	int r;

	/* counted before the reply: the reader may look at /metrics as soon as it has it */
	for (int i = 0; i < cnt; i++)
		len += iov[i].iov_len;
	hwfs_count(&hwfs_nm.fuse_read_bytes, len);
	rr->replied = 1;
	r = cnt == 0 ? fuse_reply_buf(rr->req, NULL, 0) : fuse_reply_iov(rr->req, iov, cnt);
	if (r < 0) {
		__atomic_fetch_sub(&hwfs_nm.fuse_read_bytes, len, __ATOMIC_RELAXED);
		LOG_ERR("read reply of %d iovecs not sent: %s", cnt, strerror(-r));
	}
	return r;
}

static void hwfs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		      struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_read);
	struct node *n = (struct node *)(uintptr_t)fi->fh;
	struct read_reply rr = {req, 0};
	int r;

	hwfs_readaround_note(CTX(req), n, ino, (uint64_t)off, size); /* a small read: its window follows */
	r = ns_read(CTX(req)->ns, n, (uint64_t)off, size, emit_reply, &rr);

	if (r < 0 && !rr.replied)
		fuse_reply_err(req, -r);
}

static void hwfs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_write);
	struct node *n = (struct node *)(uintptr_t)fi->fh;
	int r = ns_write(CTX(req)->ns, n, (uint64_t)off, buf, size);

	if (r < 0)
		return (void)fuse_reply_err(req, -r);
	fuse_reply_write(req, size);
}

static void hwfs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_flush);
	fuse_reply_err(req, 0);
}

static void hwfs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_release);
	ns_release(CTX(req)->ns, (struct node *)(uintptr_t)fi->fh);
	fuse_reply_err(req, 0);
}

static void hwfs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_fsync);
	fuse_reply_err(req, 0);
}

static void hwfs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_opendir);
	struct node *n = N(req, ino);

	if (!S_ISDIR(n->mode))
		return (void)fuse_reply_err(req, ENOTDIR);
	fi->cache_readdir = 0;
	fuse_reply_open(req, fi);
}

static void hwfs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			 struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_readdir);
	struct ns *ns = CTX(req)->ns;
	struct node *n = N(req, ino);
	char *buf = malloc(size);
	size_t pos = 0;

	if (!buf)
		return (void)fuse_reply_err(req, ENOMEM);
	ns_rdlock(ns);
	for (off_t i = off; ; i++) {
		struct stat st = {0};
		const char *name;
		size_t len;

		if (i == 0) {
			name = ".";
			st.st_ino = n->ino;
			st.st_mode = S_IFDIR;
		} else if (i == 1) {
			name = "..";
			st.st_ino = n->parent ? n->parent->ino : n->ino;
			st.st_mode = S_IFDIR;
		} else if ((size_t)(i - 2) < n->nkids) {
			struct node *k = n->kids[i - 2];

			if (!ns_listed(n, k)) /* staging versions, tp/ and its bad sizes */
				continue;
			name = k->name;
			st.st_ino = k->ino;
			st.st_mode = k->mode & S_IFMT;
		} else {
			break;
		}
		len = fuse_add_direntry(req, buf + pos, size - pos, name, &st, i + 1);
		if (len > size - pos)
			break;
		pos += len;
	}
	ns_unlock(ns);
	fuse_reply_buf(req, buf, pos);
	free(buf);
}

static void hwfs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	hwfs_count_fuse(HWFS_FOP_releasedir);
	fuse_reply_err(req, 0);
}

static void hwfs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	hwfs_count_fuse(HWFS_FOP_statfs);
	struct store *st = ns_store(CTX(req)->ns);
	struct arena *a = store_arena(st);
	struct statvfs s = {0};
	uint64_t cap = arena_capacity(a), used = arena_used(a);

	s.f_bsize = s.f_frsize = 4096;
	s.f_blocks = cap / 4096;
	s.f_bfree = s.f_bavail = (cap - HWFS_MIN(used, cap)) / 4096;
	s.f_namemax = HWFS_NAME_MAX;
	fuse_reply_statfs(req, &s);
}

/* The value of xattr @name of @n into @buf (lock held); -ENODATA if none. */
static int xattr_value(fuse_req_t req, struct node *n, const char *name, char *buf, size_t len)
{
	if (n->type == NT_ROOT && !strcmp(name, "user.hwfs.control"))
		return snprintf(buf, len, "%s", CTX(req)->ctl_path);
	if (n->type == NT_ROOT && !strcmp(name, "user.hwfs.pid"))
		return snprintf(buf, len, "%d", (int)getpid());
	if (n->type == NT_VROOT && !strcmp(name, "user.hwfs.state"))
		return snprintf(buf, len, "%s", hwfs_vstate_name(n->ver->state));
	if (n->type == NT_VROOT && !strcmp(name, "user.hwfs.digest") &&
	    n->ver->state != HWFS_V_OPEN) {
		char hex[HWFS_HASH_HEX];

		hwfs_hash_hex(&n->ver->digest, hex);
		return snprintf(buf, len, "%s", hex);
	}
	if (n->type == NT_TENSOR && n->tensor) {
		const struct hwfs_trec *t = n->tensor;

		if (!strcmp(name, "user.hwfs.dtype"))
			return snprintf(buf, len, "%s", t->dtype);
		if (!strcmp(name, "user.hwfs.hash")) {
			char hex[HWFS_HASH_HEX];

			hwfs_hash_hex(&t->hash, hex);
			return snprintf(buf, len, "%s", hex);
		}
		if (!strcmp(name, "user.hwfs.shape")) {
			int pos = snprintf(buf, len, "[");

			for (uint32_t i = 0; i < t->ndim && (size_t)pos < len; i++)
				pos += snprintf(buf + pos, len - (size_t)pos, "%s%llu", i ? "," : "",
						(unsigned long long)t->shape[i]);
			if ((size_t)pos < len)
				pos += snprintf(buf + pos, len - (size_t)pos, "]");
			return pos;
		}
	}
	return -ENODATA;
}

static const char *xattr_names(const struct node *n)
{
	static const char root[] = "user.hwfs.control\0user.hwfs.pid\0";
	static const char vroot[] = "user.hwfs.state\0user.hwfs.digest\0";
	static const char tensor[] = "user.hwfs.dtype\0user.hwfs.shape\0user.hwfs.hash\0";

	switch (n->type) {
	case NT_ROOT:
		return root;
	case NT_VROOT:
		return vroot;
	case NT_TENSOR:
		return tensor;
	default:
		return NULL;
	}
}

static void hwfs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	hwfs_count_fuse(HWFS_FOP_getxattr);
	struct ns *ns = CTX(req)->ns;
	char buf[8192];
	int len;

	ns_rdlock(ns);
	len = xattr_value(req, N(req, ino), name, buf, sizeof(buf));
	ns_unlock(ns);
	if (len < 0)
		return (void)fuse_reply_err(req, -len);
	if ((size_t)len >= sizeof(buf))
		return (void)fuse_reply_err(req, E2BIG);
	if (size == 0)
		return (void)fuse_reply_xattr(req, (size_t)len);
	if (size < (size_t)len)
		return (void)fuse_reply_err(req, ERANGE);
	fuse_reply_buf(req, buf, (size_t)len);
}

static void hwfs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	hwfs_count_fuse(HWFS_FOP_listxattr);
	const char *names = xattr_names(N(req, ino));
	size_t len = 0;

	/* names is a list of NUL-terminated strings ending in an empty one */
	if (names)
		for (const char *p = names; *p; p += strlen(p) + 1)
			len += strlen(p) + 1;
	if (size == 0)
		return (void)fuse_reply_xattr(req, len);
	if (size < len)
		return (void)fuse_reply_err(req, ERANGE);
	fuse_reply_buf(req, names, len);
}

static void hwfs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			  size_t size, int flags)
{
	hwfs_count_fuse(HWFS_FOP_setxattr);
	fuse_reply_err(req, ENOTSUP);
}

static void hwfs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	hwfs_count_fuse(HWFS_FOP_removexattr);
	fuse_reply_err(req, ENOTSUP);
}

static const struct fuse_lowlevel_ops ops = {
	.init = hwfs_init,
	.lookup = hwfs_lookup,
	.forget = hwfs_forget,
	.forget_multi = hwfs_forget_multi,
	.getattr = hwfs_getattr,
	.setattr = hwfs_setattr,
	.readlink = hwfs_readlink,
	.mknod = hwfs_mknod,
	.mkdir = hwfs_mkdir,
	.unlink = hwfs_unlink,
	.rmdir = hwfs_rmdir,
	.symlink = hwfs_symlink,
	.rename = hwfs_rename,
	.link = hwfs_link,
	.open = hwfs_open,
	.read = hwfs_read,
	.write = hwfs_write,
	.flush = hwfs_flush,
	.release = hwfs_release,
	.fsync = hwfs_fsync,
	.opendir = hwfs_opendir,
	.readdir = hwfs_readdir,
	.releasedir = hwfs_releasedir,
	.statfs = hwfs_statfs,
	.setxattr = hwfs_setxattr,
	.getxattr = hwfs_getxattr,
	.listxattr = hwfs_listxattr,
	.removexattr = hwfs_removexattr,
	.create = hwfs_create,
};

const struct fuse_lowlevel_ops *hwfs_fuse_ops(void)
{
	return &ops;
}
