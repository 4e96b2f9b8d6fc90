/*
 * daemon_publish.c — `hwfs publish`: import a directory tree straight into a
 * hidden open version (NS_HIDDEN_PREFIX "publish-PID-N" under versions/),
 * then seal it by renaming it to its name through the mount, so inotify
 * watchers see the version arrive whole.
 *
 * It lives apart from the other operations (daemon_ops.c) because it is the
 * one long one: it streams files in hwfs_tun.publish_io reads, sends progress
 * on the control connection, stops when the daemon shuts down, and reads the
 * source *as the caller* (cred_enter: fsuid, fsgid and groups of the calling
 * thread only), so a caller may not make the daemon read what it could not
 * read itself.
 *
 * The staging version is the daemon's: client verbs refuse its name
 * (daemon_op_call), but a removal through the mount can still take it away
 * while publish works outside the namespace lock.  Publish therefore keeps
 * the lookup reference that ns_mkdir/ns_create_file return on every node it
 * still uses, until it is done with it: a removed node is detached but not
 * freed, and every later change to it fails (EROFS) instead of touching freed
 * memory.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon_i.h"
#include "own_mount.h"
#include "tunables.h"
#include "names.h"

struct publish {
	struct daemon *d;
	int fd; /* the control connection, for progress */
	uint64_t total, done;
	double last;
	char err[1024];
};

static void publish_progress(struct publish *p, int force)
{
	double now = hwfs_mono_s();
	json_t *m;

	if (!force && now - p->last < 0.1)
		return;
	p->last = now;
	m = json_pack("{s:{s:I, s:I}}", "progress", "done", (json_int_t)p->done, "total",
		      (json_int_t)p->total);
	ctl_send(p->fd, m);
	json_decref(m);
}

static int scan_filter(const struct dirent *e)
{
	return strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
}

static uint64_t tree_bytes(const char *path)
{
	struct dirent **ents;
	uint64_t sum = 0;
	int n = scandir(path, &ents, scan_filter, alphasort);

	for (int i = 0; i < n; i++) {
		char *sub;
		struct stat st;

		if (asprintf(&sub, "%s/%s", path, ents[i]->d_name) >= 0) {
			if (lstat(sub, &st) == 0)
				sum += S_ISDIR(st.st_mode) ? tree_bytes(sub)
				       : S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
			free(sub);
		}
		free(ents[i]);
	}
	if (n >= 0)
		free(ents);
	return sum;
}

static int64_t mtime_of(const struct stat *st)
{
	return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/*
 * publish_file() - copy regular file @src (stat @st) into @dir as @name, in
 * hwfs_tun.publish_io reads, and give it @src's mtime.  The new node's lookup
 * reference is held until the last use (see the top of this file).  Returns 0,
 * or -errno with a sentence in p->err.
 */
static int publish_file(struct publish *p, struct node *dir, const char *name, const char *src,
			const struct stat *st)
{
	struct ns *ns = p->d->ns;
	struct node *n;
	struct stat now;
	uint64_t off = 0;
	int fd, r;

	/*
	 * The entry may have been swapped since the walk's lstat (a symlink, a
	 * FIFO that would block for ever, another file whose owner and mode the
	 * version would then record): open without following or blocking, and
	 * go on only with the very file that was looked at.
	 */
	fd = open(src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		r = -errno;
		snprintf(p->err, sizeof(p->err), "%s: %s", src, strerror(-r));
		return r;
	}
	if (fstat(fd, &now) < 0 || !S_ISREG(now.st_mode) || now.st_dev != st->st_dev ||
	    now.st_ino != st->st_ino) {
		snprintf(p->err, sizeof(p->err), "%s: changed while it was being published", src);
		close(fd);
		return -EAGAIN;
	}
	r = ns_create_file(ns, dir, name, st->st_mode, st->st_uid, st->st_gid, &n);
	if (r < 0) {
		snprintf(p->err, sizeof(p->err), "%s: %s", src, strerror(-r));
		close(fd);
		return r;
	}
	ns_open_ref(n);
	while (off < (uint64_t)st->st_size) {
		size_t chunk = (size_t)HWFS_MIN(hwfs_tun.publish_io, (uint64_t)st->st_size - off);

		if (__atomic_load_n(&p->d->stopping, __ATOMIC_ACQUIRE)) {
			r = -ESHUTDOWN;
			snprintf(p->err, sizeof(p->err), "the daemon is shutting down");
			break;
		}
		r = ns_write_from_fd(ns, n, off, fd, chunk);
		if (r < 0) {
			snprintf(p->err, sizeof(p->err), "%s: %s", src, strerror(-r));
			break;
		}
		off += chunk;
		p->done += chunk;
		publish_progress(p, 0);
	}
	close(fd);
	ns_release(ns, n); /* the last close finishes the file */
	if (r == 0)
		r = ns_setattr(ns, n, NS_SET_MTIME, 0, 0, 0, mtime_of(st));
	if (r < 0 && !p->err[0])
		snprintf(p->err, sizeof(p->err), "%s: %s", src, strerror(-r));
	ns_forget(ns, n, 1);
	return r;
}

/*
 * publish_tree() - copy the entries of directory @src into @dir, depth first
 * in name order: directories (with their mtime), symlinks and regular files;
 * anything else is skipped with a warning.  Stops at the first error.
 * Returns 0, or -errno with a sentence in p->err.
 */
static int publish_tree(struct publish *p, struct node *dir, const char *src)
{
	struct ns *ns = p->d->ns;
	struct dirent **ents;
	int n = scandir(src, &ents, scan_filter, alphasort), r = 0;

	if (n < 0) {
		snprintf(p->err, sizeof(p->err), "%s: %s", src, strerror(errno));
		return -errno;
	}
	for (int i = 0; i < n; i++) {
		const char *name = ents[i]->d_name;
		struct stat st;
		struct node *k;
		char *sub = NULL;

		if (r < 0 || asprintf(&sub, "%s/%s", src, name) < 0)
			goto next;
		if (lstat(sub, &st) < 0) {
			r = -errno;
			snprintf(p->err, sizeof(p->err), "%s: %s", sub, strerror(errno));
		} else if (S_ISDIR(st.st_mode)) {
			r = ns_mkdir(ns, dir, name, st.st_mode, st.st_uid, st.st_gid, &k);
			if (r == 0) {
				r = publish_tree(p, k, sub);
				if (r == 0)
					ns_setattr(ns, k, NS_SET_MTIME, 0, 0, 0, mtime_of(&st));
				ns_forget(ns, k, 1);
			} else {
				snprintf(p->err, sizeof(p->err), "%s: %s", sub, strerror(-r));
			}
		} else if (S_ISLNK(st.st_mode)) {
			char target[4096];
			ssize_t len = readlink(sub, target, sizeof(target) - 1);

			if (len < 0) {
				r = -errno;
				snprintf(p->err, sizeof(p->err), "%s: %s", sub, strerror(errno));
			} else {
				target[len] = '\0';
				r = ns_symlink(ns, dir, name, target, st.st_uid, st.st_gid, &k);
				if (r == 0)
					ns_forget(ns, k, 1);
				else
					snprintf(p->err, sizeof(p->err), "%s: %s", sub, strerror(-r));
			}
		} else if (S_ISREG(st.st_mode)) {
			r = publish_file(p, dir, name, sub, &st);
		} else {
			LOG_WARN("publish: %s is not a file, directory or symlink; skipped", sub);
		}
next:
		free(sub);
		free(ents[i]);
	}
	free(ents);
	return r;
}

/* The daemon thread's file-access identity, saved by cred_enter(). */
struct fs_cred {
	int switched;
	uid_t fsuid;
	gid_t fsgid;
	gid_t *groups;
	int n_groups;
};

/*
 * Put back the identity that cred_enter() saved in @s (no-op when it did not
 * switch).  Raw system calls, like cred_enter().
 */
static void cred_leave(struct fs_cred *s)
{
	if (!s->switched)
		return;
	syscall(SYS_setfsuid, s->fsuid);
	syscall(SYS_setfsgid, s->fsgid);
	syscall(SYS_setgroups, (size_t)s->n_groups, s->groups);
	free(s->groups);
	s->groups = NULL;
	s->switched = 0;
}

/*
 * Access files as @p in the calling thread only: fsuid, fsgid and the
 * supplementary groups are set through the raw system calls (glibc's wrappers
 * would change every thread of the daemon), so the kernel checks the caller's
 * permissions, not root's.  A root caller, or a caller with the daemon's own
 * uid, keeps the daemon's identity.  Returns 0, or -EPERM (nothing changed)
 * when the daemon cannot take the caller's identity (it is not root).
 */
static int cred_enter(const struct ctl_peer *p, struct fs_cred *s)
{
	int n;

	memset(s, 0, sizeof(*s));
	if (p->uid == 0 || p->uid == geteuid())
		return 0;
	if (geteuid() != 0)
		return -EPERM;
	n = getgroups(0, NULL);
	s->groups = malloc(sizeof(gid_t) * (size_t)(n > 0 ? n : 1));
	if (n < 0 || !s->groups || getgroups(n, s->groups) != n) {
		free(s->groups);
		s->groups = NULL;
		return -EPERM;
	}
	s->n_groups = n;
	s->fsuid = (uid_t)syscall(SYS_setfsuid, (uid_t)-1); /* -1: returns the current one */
	s->fsgid = (gid_t)syscall(SYS_setfsgid, (gid_t)-1);
	s->switched = 1;
	if (syscall(SYS_setgroups, p->n_groups, p->groups) < 0)
		goto fail;
	syscall(SYS_setfsgid, p->gid);
	syscall(SYS_setfsuid, p->uid);
	if ((uid_t)syscall(SYS_setfsuid, (uid_t)-1) != p->uid ||
	    (gid_t)syscall(SYS_setfsgid, (gid_t)-1) != p->gid)
		goto fail;
	return 0;
fail:
	cred_leave(s);
	return -EPERM;
}

/*
 * publish: the source tree is read with the caller's permissions (cred_enter),
 * so a caller may not make the daemon read what it could not read itself.
 */
static json_t *publish(struct daemon *d, json_t *req, struct ctl_reader *rd,
		       const struct ctl_peer *peer)
{
	const char *src = daemon_req_str(req, "src"), *v = daemon_req_str(req, "version");
	struct publish p = {.d = d, .fd = rd->fd};
	char hidden[600], from[4096], to[4096];
	struct fs_cred cred;
	struct node *root;
	struct stat st;
	int r;

	if (!src || !v)
		return daemon_err_reply(EINVAL, "publish: missing source or version");
	/* before anything is read: a name the namespace would refuse at the very end */
	if (!hwfs_valid_name(v))
		return daemon_err_reply(EINVAL, "invalid version name (1-%d bytes of UTF-8, no '/', "
				 "no control character, not . or ..)", HWFS_NAME_MAX);
	if (ns_hidden_name(v))
		return daemon_err_reply(EINVAL, "invalid version name: %s", v);
	r = cred_enter(peer, &cred);
	if (r < 0)
		return daemon_err_reply(-r, "permission denied: this daemon (uid %u) cannot read files as "
				 "uid %u", (unsigned)geteuid(), (unsigned)peer->uid);
	r = stat(src, &st) < 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
	if (r) {
		cred_leave(&cred);
		return daemon_err_reply(r, "%s: %s", src, strerror(r));
	}
	if (ns_version_state(d->ns, v, NULL, NULL, NULL) == 0) {
		cred_leave(&cred);
		return daemon_err_reply(EEXIST, "version %s exists already", v);
	}
	snprintf(hidden, sizeof(hidden), NS_HIDDEN_PREFIX "publish-%d-%llu", (int)getpid(),
		 (unsigned long long)__atomic_add_fetch(&d->counter, 1, __ATOMIC_RELAXED));
	r = ns_mkdir(d->ns, ns_versions_dir(d->ns), hidden, st.st_mode, st.st_uid, st.st_gid, &root);
	if (r < 0) {
		cred_leave(&cred);
		return daemon_err_reply(-r, "publish: %s", strerror(-r));
	}
	p.total = tree_bytes(src);
	publish_progress(&p, 1);
	r = publish_tree(&p, root, src);
	cred_leave(&cred); /* the rename below goes through the mount as the daemon */
	if (r == 0) {
		publish_progress(&p, 1);
		/* seal by renaming through the mount: watchers see the version arrive */
		snprintf(from, sizeof(from), "%s/versions/%s", d->o->mountpoint, hidden);
		snprintf(to, sizeof(to), "%s/versions/%s", d->o->mountpoint, v);
		if (own_mount_rename(from, to) < 0) {
			r = -errno;
			snprintf(p.err, sizeof(p.err), "sealing %s: %s", v,
				 r == -EEXIST || r == -ENOTEMPTY ? "version exists already"
								  : strerror(-r));
		}
	}
	if (r < 0) {
		ns_remove_version(d->ns, hidden);
		ns_forget(d->ns, root, 1);
		return daemon_err_reply(-r, "publish failed: %s", p.err[0] ? p.err : strerror(-r));
	}
	ns_forget(d->ns, root, 1);
	return json_pack("{s:b, s:s, s:I}", "ok", 1, "version", v, "bytes", (json_int_t)p.done);
}

/*
 * `hwfs publish`, counted for /metrics: the node is "updating" meanwhile
 * (readyz), and a publish that sealed its version adds its duration to
 * hwfs_publish_duration_seconds.
 */
json_t *op_publish(struct daemon *d, json_t *req, struct ctl_reader *rd, const struct ctl_peer *peer)
{
	uint64_t t0 = hwfs_mono_ns();
	json_t *res;

	hwfs_count(&hwfs_nm.updating, 1);
	res = publish(d, req, rd, peer);
	if (res && json_is_true(json_object_get(res, "ok")))
		hwfs_hist_observe_ns(&hwfs_nm.publish, hwfs_mono_ns() - t0);
	__atomic_fetch_sub(&hwfs_nm.updating, 1, __ATOMIC_RELAXED);
	return res;
}
