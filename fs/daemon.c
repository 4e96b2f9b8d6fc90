/*
 * daemon.c — the life of one node, and the operations behind the `hwfs`
 * verbs that need the daemon (status, seal, publish, commit, verify, rm, gc,
 * diff, manifest).
 *
 * Threads: the FUSE loop (libfuse's multi-threaded loop, clone_fd), one
 * accept thread for the control socket, and one short-lived thread per
 * control connection.  Control operations that change what the kernel sees
 * go *through the mount* (a rename of a symlink for commit, a rename of a
 * staging version for publish), so inotify watchers see them; they do so
 * from control threads, never from inside a FUSE request, and without holding
 * any namespace or index lock while the kernel calls back into us.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "coord.h"
#include "ctl.h"
#include "daemon.h"
#include "fuse_ops.h"
#include "manifest.h"
#include "ns.h"
#include "proto.h"
#include "tunables.h"

struct conn;

struct daemon {
	const struct daemon_opts *o;
	struct store *st;
	struct ns *ns;
	struct fuse_session *se;
	struct fsctx fsctx;
	char ctl_path[4096];
	char ctl_dir[128];    /* directory of the control socket */
	int ctl_dir_private;  /* ctl_dir is ours alone (mkdtemp): removed at exit */
	uid_t owner;          /* the mount's owner: the uid that mounted */
	char group_name[64];  /* --ctl-group as shown in errors, "" when none */
	int ctl_fd;
	pthread_t ctl_thread;
	int ctl_running;
	/* live control connections: shutdown waits for them before freeing */
	pthread_mutex_t conn_mu;
	pthread_cond_t conn_cv;
	struct conn *conns; /* under conn_mu */
	int stopping;       /* atomic: set once shutdown begins */
	uint64_t counter; /* atomic: unique names for temporary entries */
	struct agent *agent; /* replication, when joined to a coordinator */
	pthread_t coord_thread; /* embedded coordinator (--coordinator) */
	struct coord_opts copts;
	int coord_running;
	volatile int coord_stop;
	char coord_state[4096];
	char coord_ep[256]; /* the embedded coordinator's bound endpoint (coord_opts.bound) */
};

static void *coord_main(void *arg)
{
	struct daemon *d = arg;

	/* the bound endpoint is written before coord_run() reports "ok" */
	d->copts.bound = d->coord_ep;
	d->copts.bound_len = sizeof(d->coord_ep);
	coord_run(&d->copts);
	return NULL;
}

/* Start the embedded coordinator; returns once it listens (or failed). */
static int start_coord(struct daemon *d, char *msg, size_t len)
{
	char buf[512];
	ssize_t n;
	int pfd[2];

	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	snprintf(d->coord_state, sizeof(d->coord_state), "%s/coord", store_dir(d->st));
	d->copts = (struct coord_opts){.listen = d->o->coordinator, .state = d->coord_state,
				       .keys = d->o->keys, .fanout = 1, .notify_fd = pfd[1],
				       .stop = &d->coord_stop};
	if (pthread_create(&d->coord_thread, NULL, coord_main, d) != 0) {
		close(pfd[0]);
		close(pfd[1]);
		return -EAGAIN;
	}
	d->coord_running = 1;
	n = read(pfd[0], buf, sizeof(buf) - 1);
	close(pfd[0]);
	buf[n > 0 ? n : 0] = '\0';
	if (!strncmp(buf, "ok", 2))
		return 0;
	snprintf(msg, len, "error: embedded coordinator: %s", n > 7 ? buf + 7 : "did not start\n");
	return -EIO;
}

/* ----------------------------------------------------------- helpers */

static json_t *err_reply(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static json_t *err_reply(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return json_pack("{s:b, s:s}", "ok", 0, "error", buf);
}

static json_t *ok_reply(void)
{
	return json_pack("{s:b}", "ok", 1);
}

static const char *req_str(json_t *req, const char *key)
{
	json_t *v = json_object_get(req, key);

	return json_is_string(v) ? json_string_value(v) : NULL;
}

/* One version as shown by status and ls (ns lock held). */
static json_t *version_json(struct daemon *d, struct version *v)
{
	uint64_t bytes, files;
	json_t *errs = json_array();

	ns_version_usage(d->ns, v, &bytes, &files);
	for (size_t i = 0; i < v->n_errors; i++)
		json_array_append_new(errs, json_pack("{s:s, s:s}", "file", v->errors[i].file,
						      "error", v->errors[i].error));
	return json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:o, s:o}", "name", v->name, "state",
			 hwfs_vstate_name(v->state), "seq", (json_int_t)v->seq, "bytes",
			 (json_int_t)bytes, "files", (json_int_t)files, "tensors",
			 (json_int_t)v->tensors, "digest",
			 v->state == HWFS_V_OPEN ? json_null() : proto_hash_json(&v->digest), "errors", errs);
}

static json_t *versions_json(struct daemon *d)
{
	json_t *arr = json_array();
	char **names = NULL;
	size_t n = 0;

	if (ns_list(d->ns, &names, &n) < 0)
		return arr;
	ns_rdlock(d->ns);
	for (size_t i = 0; i < n; i++) {
		struct version *v = names[i] ? ns_version(d->ns, names[i]) : NULL;

		if (v)
			json_array_append_new(arr, version_json(d, v));
		free(names[i]);
	}
	ns_unlock(d->ns);
	free(names);
	return arr;
}

/* ----------------------------------------------------------- operations */

static json_t *op_status(struct daemon *d, json_t *req)
{
	uint64_t used, count;
	char *cur = ns_current(d->ns);
	json_t *r;

	store_usage(d->st, &used, &count);
	r = json_pack("{s:b, s:i, s:s, s:{s:s, s:I, s:I, s:I, s:I, s:b}, s:o, s:o}", "ok", 1,
		      "pid", (int)getpid(), "mount", d->o->mountpoint, "store", "path",
		      store_dir(d->st), "used_bytes", (json_int_t)used, "capacity_bytes",
		      (json_int_t)arena_capacity(store_arena(d->st)), "arena_bytes",
		      (json_int_t)arena_used(store_arena(d->st)), "shards", (json_int_t)count,
		      "preallocated", arena_preallocated(store_arena(d->st)),
		      "current", cur ? json_string(cur) : json_null(), "versions",
		      versions_json(d));
	free(cur);
	if (d->agent) {
		uint64_t rx, tx, rq;

		agent_counters(d->agent, &rx, &tx, &rq);
		json_object_set_new(r, "node", json_string(d->o->node));
		json_object_set_new(r, "coordinator",
				    json_string(d->coord_ep[0] ? d->coord_ep : d->o->join));
		json_object_set_new(r, "listen", json_string(agent_endpoint(d->agent)));
		json_object_set_new(r, "replication",
				    json_pack("{s:I, s:I, s:I, s:o}", "bytes_received", (json_int_t)rx,
					      "bytes_sent", (json_int_t)tx, "requests_received",
					      (json_int_t)rq, "pulls",
					      agent_pulls(d->agent) ?: json_array()));
	}
	return r;
}

static json_t *op_ls(struct daemon *d, json_t *req)
{
	return json_pack("{s:b, s:o}", "ok", 1, "versions", versions_json(d));
}

static const char *seal_error(int r)
{
	switch (r) {
	case -ENOENT:
		return "no such version";
	case -EROFS:
		return "version is already sealed";
	case -EBUSY:
		return "version is being sealed";
	case -EEXIST:
		return "a version with that name exists";
	case -EINVAL:
		return "invalid version name";
	default:
		return strerror(-r);
	}
}

static json_t *op_seal(struct daemon *d, json_t *req)
{
	const char *v = req_str(req, "version");
	unsigned flags = json_is_true(json_object_get(req, "force")) ? NS_SEAL_FORCE : 0;
	char err[1024] = "";
	int r;

	if (!v)
		return err_reply("seal: missing version");
	r = ns_seal(d->ns, v, NULL, flags, err, sizeof(err));
	if (r < 0)
		return err_reply("cannot seal %s: %s", v, err[0] ? err : seal_error(r));
	return ok_reply();
}

/*
 * Flip `current` through the mount so inotify watchers see IN_MOVED_TO: a
 * fresh symlink in the root renamed onto `current`.  Never called from a FUSE
 * request handler.  Returns 0 or -errno with a sentence in @err.
 */
static int flip_current(void *arg, const char *v, char *err, size_t errlen)
{
	struct daemon *d = arg;
	char tmp[4096], cur[4096], target[1024];
	int r;

	ns_rdlock(d->ns);
	r = ns_check_committable(d->ns, v, err, errlen);
	ns_unlock(d->ns);
	if (r < 0)
		return r;
	snprintf(target, sizeof(target), "versions/%s", v);
	snprintf(tmp, sizeof(tmp), "%s/.hwfs-commit-%d-%llu", d->o->mountpoint, (int)getpid(),
		 (unsigned long long)__atomic_add_fetch(&d->counter, 1, __ATOMIC_RELAXED));
	snprintf(cur, sizeof(cur), "%s/current", d->o->mountpoint);
	if (symlink(target, tmp) < 0) {
		r = -errno;
		snprintf(err, errlen, "symlink: %s", strerror(errno));
		return r;
	}
	if (rename(tmp, cur) < 0) {
		r = -errno;
		unlink(tmp);
		snprintf(err, errlen, "%s", r == -ENOENT ? "no such version"
					    : r == -EBUSY ? "version is open"
					    : r == -EIO   ? "version is damaged" : strerror(-r));
		return r;
	}
	return 0;
}

/*
 * commit_reply() - the control reply for the coordinator's COMMIT_RES @res
 * (consumed): "outcome" (committed / partial / aborted) and the nodes that
 * "committed", "failed" (node -> reason) and are "unknown" (no answer before
 * the deadline), with "ok" only when every live node committed and an
 * "error" sentence otherwise.  Returns the reply, NULL without memory.
 */
static json_t *commit_reply(const char *v, json_t *res)
{
	const char *outcome = json_string_value(json_object_get(res, "outcome"));
	const char *why = json_string_value(json_object_get(res, "reason"));
	json_t *out;

	if (!outcome) /* a coordinator that predates outcomes */
		outcome = json_is_true(json_object_get(res, "ok")) ? "committed" : "aborted";
	if (!strcmp(outcome, "committed"))
		out = json_pack("{s:b, s:s}", "ok", 1, "current", v);
	else if (!strcmp(outcome, "partial"))
		out = err_reply("commit of %s is partial: %zu node(s) flipped, %zu failed, %zu did "
				"not answer (%s); the others flip when they can",
				v, json_array_size(json_object_get(res, "committed")),
				json_object_size(json_object_get(res, "failed")),
				json_array_size(json_object_get(res, "unknown")), why ? why : "?");
	else
		out = err_reply("commit of %s aborted: %s", v, why ? why : "refused");
	if (out) {
		json_object_set_new(out, "outcome", json_string(outcome));
		json_object_set(out, "nodes", json_object_get(res, "nodes") ?: json_array());
		json_object_set(out, "committed", json_object_get(res, "committed") ?: json_array());
		json_object_set(out, "failed", json_object_get(res, "failed") ?: json_object());
		json_object_set(out, "unknown", json_object_get(res, "unknown") ?: json_array());
	}
	json_decref(res);
	return out;
}

static json_t *op_commit(struct daemon *d, json_t *req)
{
	const char *v = req_str(req, "version");
	int local = json_is_true(json_object_get(req, "local"));
	char err[512];
	json_t *res = NULL;

	if (!v)
		return err_reply("commit: missing version");
	if (d->agent && !local) {
		/* two-phase, cluster-wide: the coordinator decides */
		ns_rdlock(d->ns);
		int r = ns_check_committable(d->ns, v, err, sizeof(err));
		ns_unlock(d->ns);
		if (r < 0)
			return err_reply("cannot commit: %s", err);
		json_t *call = json_pack("{s:s, s:s}", "op", "commit", "version", v);

		r = agent_call(d->agent, call, &res, 30000);
		json_decref(call);
		if (r == -EHOSTUNREACH)
			return err_reply("cannot commit %s: the coordinator is unreachable", v);
		if (r < 0) {
			json_t *e = err_reply("commit of %s: the coordinator %s; the outcome is unknown "
					      "until it is back (see hwfs status --cluster)",
					      v, r == -ECONNRESET ? "went away" : "did not answer");

			json_object_set_new(e, "outcome", json_string("unknown"));
			return e;
		}
		return commit_reply(v, res);
	}
	if (flip_current(d, v, err, sizeof(err)) < 0)
		return err_reply("cannot commit %s: %s", v, err);
	return json_pack("{s:b, s:s}", "ok", 1, "current", v);
}

static json_t *op_cluster(struct daemon *d, json_t *req)
{
	json_t *call, *res = NULL, *out;
	int r;

	if (!d->agent)
		return err_reply("this node is not part of a cluster (mounted without --join)");
	call = json_pack("{s:s}", "op", "cluster");
	r = agent_call(d->agent, call, &res, 10000);
	if (r < 0) {
		json_decref(call);
		return err_reply("the coordinator %s", r == -EHOSTUNREACH ? "is unreachable"
								 : "did not answer");
	}
	json_decref(call);
	out = json_pack("{s:b, s:O}", "ok", 1, "cluster", json_object_get(res, "cluster"));
	json_decref(res);
	return out;
}

/* -- publish: import a directory tree straight into a hidden open version */

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

static int publish_file(struct publish *p, struct node *dir, const char *name, const char *src,
			const struct stat *st)
{
	struct ns *ns = p->d->ns;
	struct node *n;
	uint64_t off = 0;
	int fd, r;

	fd = open(src, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(p->err, sizeof(p->err), "%s: %s", src, strerror(errno));
		return -errno;
	}
	r = ns_create_file(ns, dir, name, st->st_mode, st->st_uid, st->st_gid, &n);
	if (r < 0) {
		snprintf(p->err, sizeof(p->err), "%s: %s", src, strerror(-r));
		close(fd);
		return r;
	}
	ns_open_ref(n);
	ns_forget(ns, n, 1);
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
	return r;
}

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
				ns_forget(ns, k, 1);
				r = publish_tree(p, k, sub);
				if (r == 0)
					ns_setattr(ns, k, NS_SET_MTIME, 0, 0, 0, mtime_of(&st));
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
static json_t *op_publish(struct daemon *d, json_t *req, int fd, const struct ctl_peer *peer)
{
	const char *src = req_str(req, "src"), *v = req_str(req, "version");
	struct publish p = {.d = d, .fd = fd};
	char hidden[600], from[4096], to[4096];
	struct fs_cred cred;
	struct node *root;
	struct stat st;
	int r;

	if (!src || !v)
		return err_reply("publish: missing source or version");
	if (!*v || strchr(v, '/') || !strcmp(v, ".") || !strcmp(v, "..") || strlen(v) > 255 ||
	    !strncmp(v, NS_HIDDEN_PREFIX, strlen(NS_HIDDEN_PREFIX)))
		return err_reply("invalid version name: %s", v);
	if (cred_enter(peer, &cred) < 0)
		return err_reply("permission denied: this daemon (uid %u) cannot read files as "
				 "uid %u", (unsigned)geteuid(), (unsigned)peer->uid);
	if (stat(src, &st) < 0 || !S_ISDIR(st.st_mode)) {
		r = errno;
		cred_leave(&cred);
		return err_reply("%s: %s", src, r == EACCES ? strerror(r) : "not a directory");
	}
	ns_rdlock(d->ns);
	r = ns_version(d->ns, v) ? -EEXIST : 0;
	ns_unlock(d->ns);
	if (r < 0) {
		cred_leave(&cred);
		return err_reply("version %s exists already", v);
	}
	snprintf(hidden, sizeof(hidden), NS_HIDDEN_PREFIX "publish-%d-%llu", (int)getpid(),
		 (unsigned long long)__atomic_add_fetch(&d->counter, 1, __ATOMIC_RELAXED));
	ns_rdlock(d->ns);
	root = ns_child(ns_root(d->ns), "versions");
	ns_unlock(d->ns);
	r = ns_mkdir(d->ns, root, hidden, st.st_mode, st.st_uid, st.st_gid, &root);
	if (r < 0) {
		cred_leave(&cred);
		return err_reply("publish: %s", strerror(-r));
	}
	ns_forget(d->ns, root, 1);
	p.total = tree_bytes(src);
	publish_progress(&p, 1);
	r = publish_tree(&p, root, src);
	cred_leave(&cred); /* the rename below goes through the mount as the daemon */
	if (r == 0) {
		publish_progress(&p, 1);
		/* seal by renaming through the mount: watchers see the version arrive */
		snprintf(from, sizeof(from), "%s/versions/%s", d->o->mountpoint, hidden);
		snprintf(to, sizeof(to), "%s/versions/%s", d->o->mountpoint, v);
		if (rename(from, to) < 0) {
			r = -errno;
			snprintf(p.err, sizeof(p.err), "sealing %s: %s", v,
				 r == -EEXIST || r == -ENOTEMPTY ? "version exists already"
								  : strerror(-r));
		}
	}
	if (r < 0) {
		ns_remove_version(d->ns, hidden);
		return err_reply("publish failed: %s", p.err[0] ? p.err : strerror(-r));
	}
	return json_pack("{s:b, s:s, s:I}", "ok", 1, "version", v, "bytes", (json_int_t)p.done);
}

/* Distinct shard hashes of a snapshot. */
static int cmp_hash(const void *a, const void *b)
{
	return hwfs_hash_cmp(a, b);
}

static hwfs_hash_t *distinct_shards(const struct hwfs_vrec *v, size_t *n)
{
	size_t total = 0, k = 0;
	hwfs_hash_t *h;

	for (size_t i = 0; i < v->n_files; i++)
		total += v->files[i].n_ext;
	h = malloc((total ? total : 1) * sizeof(*h));
	if (!h)
		return NULL;
	for (size_t i = 0; i < v->n_files; i++)
		for (size_t j = 0; j < v->files[i].n_ext; j++)
			h[k++] = v->files[i].ext[j].hash;
	qsort(h, k, sizeof(*h), cmp_hash);
	*n = 0;
	for (size_t i = 0; i < k; i++)
		if (i == 0 || hwfs_hash_cmp(&h[i], &h[*n - 1]))
			h[(*n)++] = h[i];
	return h;
}

static json_t *op_verify(struct daemon *d, json_t *req)
{
	const char *v = req_str(req, "version");
	struct hwfs_vrec *rec = NULL;
	hwfs_hash_t *hs;
	size_t n = 0;
	uint64_t bytes = 0;
	json_t *bad = json_array(), *res;
	int r;

	if (!v)
		return err_reply("verify: missing version");
	r = ns_snapshot(d->ns, v, &rec);
	if (r < 0) {
		json_decref(bad);
		return err_reply("cannot verify %s: %s", v, r == -ENOENT ? "no such version"
							      : strerror(-r));
	}
	hs = distinct_shards(rec, &n);
	for (size_t i = 0; hs && i < n; i++) {
		struct shard *sh = store_get(d->st, &hs[i]);
		hwfs_hash_t h;

		if (sh) {
			hwfs_hash_buf(store_shard_data(d->st, sh), sh->size, &h);
			bytes += sh->size;
			store_unref(d->st, sh);
		}
		if (!sh || hwfs_hash_cmp(&h, &hs[i]))
			json_array_append_new(bad, proto_hash_json(&hs[i]));
	}
	if (rec->state != HWFS_V_OPEN) {
		r = ns_set_state(d->ns, v, json_array_size(bad) ? HWFS_V_DAMAGED : HWFS_V_SEALED);
		if (r < 0)
			LOG_ERR("verify %s: cannot record state: %s", v, strerror(-r));
	}
	res = json_pack("{s:b, s:s, s:b, s:I, s:I, s:o}", "ok", 1, "version", v, "intact",
			json_array_size(bad) == 0, "shards", (json_int_t)n, "bytes",
			(json_int_t)bytes, "bad", bad);
	free(hs);
	hwfs_vrec_free(rec);
	return res;
}

static const char *rm_error(int r)
{
	return r == -ENOENT ? "no such version"
	       : r == -EBUSY ? "it is the committed version (current)"
	       : r == -EAGAIN ? "it is being sealed"
			      : strerror(-r);
}

static int remove_and_invalidate(struct daemon *d, const char *v)
{
	struct node *vers;
	int r = ns_remove_version(d->ns, v);

	if (r == 0) {
		ns_rdlock(d->ns);
		vers = ns_child(ns_root(d->ns), "versions");
		ns_unlock(d->ns);
		fuse_lowlevel_notify_inval_entry(d->se, hwfs_fuse_ino(d->ns, vers), v, strlen(v));
	}
	return r;
}

static json_t *op_rm(struct daemon *d, json_t *req)
{
	const char *v = req_str(req, "version");
	int r;

	if (!v)
		return err_reply("rm: missing version");
	r = remove_and_invalidate(d, v);
	if (r < 0)
		return err_reply("cannot remove %s: %s", v, rm_error(r));
	return ok_reply();
}

static json_t *op_gc(struct daemon *d, json_t *req)
{
	json_t *keep_j = json_object_get(req, "keep"), *removed = json_array();
	json_int_t keep = json_is_integer(keep_j) ? json_integer_value(keep_j) : -1;
	char **names = NULL, *cur = ns_current(d->ns);
	size_t n = 0, kept = 0;

	if (keep < 0) {
		free(cur);
		json_decref(removed);
		return err_reply("gc: --keep N is required (N >= 0)");
	}
	ns_list(d->ns, &names, &n);
	/* newest first: keep the first @keep sealed ones, and current */
	for (size_t i = n; i-- > 0;) {
		struct version *v;
		int sealed;

		ns_rdlock(d->ns);
		v = ns_version(d->ns, names[i]);
		sealed = v && v->state != HWFS_V_OPEN;
		ns_unlock(d->ns);
		if (!sealed || (cur && !strcmp(cur, names[i])))
			continue;
		if (kept < (size_t)keep) {
			kept++;
			continue;
		}
		if (remove_and_invalidate(d, names[i]) == 0)
			json_array_append_new(removed, json_string(names[i]));
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	free(cur);
	return json_pack("{s:b, s:o}", "ok", 1, "removed", removed);
}

/* name -> (hash, len) of every tensor in a snapshot, as a jansson object */
static json_t *tensor_map(const struct hwfs_vrec *v)
{
	json_t *m = json_object();

	for (size_t i = 0; i < v->n_files; i++)
		for (size_t j = 0; j < v->files[i].n_tensors; j++) {
			const struct hwfs_tensor *t = &v->files[i].tensors[j];

			json_object_set_new(m, t->name,
					    json_pack("{s:o, s:I}", "hash", proto_hash_json(&t->hash),
						      "len", (json_int_t)t->len));
		}
	return m;
}

static json_t *op_diff(struct daemon *d, json_t *req)
{
	const char *a = req_str(req, "a"), *b = req_str(req, "b");
	struct hwfs_vrec *va = NULL, *vb = NULL;
	json_t *ma, *mb, *changed, *added, *removed, *val, *res;
	size_t same = 0, na = 0, nb = 0;
	uint64_t bytes_changed = 0, new_bytes = 0;
	hwfs_hash_t *ha = NULL;
	const char *key;
	int r;

	if (!a || !b)
		return err_reply("diff: two versions needed");
	r = ns_snapshot(d->ns, a, &va);
	if (r == 0)
		r = ns_snapshot(d->ns, b, &vb);
	if (r < 0) {
		hwfs_vrec_free(va);
		return err_reply("cannot diff: %s: %s", va ? b : a,
				 r == -ENOENT ? "no such version" : strerror(-r));
	}
	ma = tensor_map(va);
	mb = tensor_map(vb);
	changed = json_array();
	added = json_array();
	removed = json_array();
	json_object_foreach(mb, key, val) {
		json_t *old = json_object_get(ma, key);
		json_int_t len = json_integer_value(json_object_get(val, "len"));

		if (!old) {
			json_array_append_new(added, json_string(key));
			bytes_changed += (uint64_t)len;
		} else if (!json_equal(old, val)) {
			json_array_append_new(changed, json_string(key));
			bytes_changed += (uint64_t)len;
		} else {
			same++;
		}
	}
	json_object_foreach(ma, key, val)
		if (!json_object_get(mb, key))
			json_array_append_new(removed, json_string(key));
	/* bytes of B's shards that A does not have: what moving A -> B costs */
	ha = distinct_shards(va, &na);
	for (size_t i = 0; i < vb->n_files; i++)
		for (size_t j = 0; j < vb->files[i].n_ext; j++) {
			const struct hwfs_extent *e = &vb->files[i].ext[j];

			if (ha && !bsearch(&e->hash, ha, na, sizeof(*ha), cmp_hash))
				new_bytes += e->len;
		}
	{ /* count each new shard once */
		hwfs_hash_t *hb = distinct_shards(vb, &nb);

		new_bytes = 0;
		for (size_t i = 0; hb && ha && i < nb; i++)
			if (!bsearch(&hb[i], ha, na, sizeof(*ha), cmp_hash)) {
				struct shard *sh = store_get(d->st, &hb[i]);

				if (sh) {
					new_bytes += sh->size;
					store_unref(d->st, sh);
				}
			}
		free(hb);
	}
	res = json_pack("{s:b, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "ok", 1,
			"a", a, "b", b, "tensors_same", (json_int_t)same, "tensors_changed",
			(json_int_t)json_array_size(changed), "tensors_added",
			(json_int_t)json_array_size(added), "tensors_removed",
			(json_int_t)json_array_size(removed), "bytes_changed",
			(json_int_t)bytes_changed, "new_shard_bytes", (json_int_t)new_bytes,
			"changed", changed, "added", added, "removed", removed);
	json_decref(ma);
	json_decref(mb);
	free(ha);
	hwfs_vrec_free(va);
	hwfs_vrec_free(vb);
	return res;
}

static json_t *op_manifest(struct daemon *d, json_t *req)
{
	const char *v = req_str(req, "version");
	struct hwfs_vrec *rec = NULL;
	char *js = NULL;
	size_t len;
	json_t *res;
	int r;

	if (!v)
		return err_reply("manifest: missing version");
	r = ns_snapshot(d->ns, v, &rec);
	if (r == 0 && rec->state == HWFS_V_OPEN)
		r = -EBUSY;
	if (r == 0)
		r = manifest_build(rec, &js, &len);
	hwfs_vrec_free(rec);
	if (r < 0)
		return err_reply("no manifest for %s: %s", v,
				 r == -ENOENT ? "no such version"
				 : r == -EBUSY ? "version is open" : strerror(-r));
	res = json_pack("{s:b, s:s%}", "ok", 1, "manifest", js, len);
	free(js);
	return res;
}

/* ----------------------------------------------------------- control socket */

struct conn {
	struct daemon *d;
	int fd;
	struct conn *prev, *next; /* d->conns, under d->conn_mu */
};

/* Take @c off the daemon's list of live connections and wake a waiting shutdown. */
static void conn_done(struct conn *c)
{
	struct daemon *d = c->d;

	pthread_mutex_lock(&d->conn_mu);
	if (c->prev)
		c->prev->next = c->next;
	else
		d->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	close(c->fd);
	free(c);
	pthread_cond_broadcast(&d->conn_cv);
	pthread_mutex_unlock(&d->conn_mu);
}

/* Verbs that change the store, the namespace or `current` (verify records damage). */
static int op_mutates(const char *op)
{
	static const char *const ops[] = {"seal", "publish", "commit", "rm", "gc", "verify"};

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(ops); i++)
		if (!strcmp(op, ops[i]))
			return 1;
	return 0;
}

/*
 * May @p run @op (docs/cli.md, "Permissions")?  Mutating verbs: root, the
 * mount's owner or a member of --ctl-group.  Read-only verbs: those, and
 * whoever the mount's root directory lets read it (only a daemon run as root
 * mounts with allow_other; otherwise nobody else can reach the mount).
 * Returns NULL when allowed, else the error reply.
 */
static json_t *authorize(struct daemon *d, const struct ctl_peer *p, const char *op)
{
	struct node *root;
	uint32_t bit;

	if (p->uid == 0 || p->uid == d->owner ||
	    (d->o->ctl_gid >= 0 && ctl_peer_in_group(p, (gid_t)d->o->ctl_gid)))
		return NULL;
	if (op_mutates(op))
		return d->group_name[0]
			       ? err_reply("permission denied: %s needs root, the mount's owner "
					   "(uid %u) or group %s", op, (unsigned)d->owner, d->group_name)
			       : err_reply("permission denied: %s needs root or the mount's owner "
					   "(uid %u)", op, (unsigned)d->owner);
	ns_rdlock(d->ns);
	root = ns_root(d->ns);
	bit = p->uid == root->uid ? S_IRUSR : ctl_peer_in_group(p, root->gid) ? S_IRGRP : S_IROTH;
	bit &= root->mode;
	ns_unlock(d->ns);
	if (bit && geteuid() == 0)
		return NULL;
	return err_reply("permission denied: %s needs read access to the mount", op);
}

static void *conn_main(void *arg)
{
	struct conn *c = arg;
	struct ctl_reader rd;
	struct ctl_peer peer;
	json_t *req = NULL, *res;
	const char *op;

	ctl_reader_init(&rd, c->fd);
	memset(&peer, 0, sizeof(peer));
	if (ctl_peer(c->fd, &peer) < 0) {
		res = err_reply("permission denied: cannot tell who is calling");
		goto reply;
	}
	if (ctl_recv(&rd, &req) < 0) {
		res = err_reply("malformed request");
		goto reply;
	}
	op = req_str(req, "op");
	if (!op)
		res = err_reply("request without op");
	else if ((res = authorize(c->d, &peer, op)))
		LOG_WARN("control: refused %s to uid %u (pid %d)", op, (unsigned)peer.uid,
			 (int)peer.pid);
	else if (!strcmp(op, "status"))
		res = op_status(c->d, req);
	else if (!strcmp(op, "ls"))
		res = op_ls(c->d, req);
	else if (!strcmp(op, "seal"))
		res = op_seal(c->d, req);
	else if (!strcmp(op, "commit"))
		res = op_commit(c->d, req);
	else if (!strcmp(op, "publish"))
		res = op_publish(c->d, req, c->fd, &peer);
	else if (!strcmp(op, "verify"))
		res = op_verify(c->d, req);
	else if (!strcmp(op, "rm"))
		res = op_rm(c->d, req);
	else if (!strcmp(op, "gc"))
		res = op_gc(c->d, req);
	else if (!strcmp(op, "diff"))
		res = op_diff(c->d, req);
	else if (!strcmp(op, "manifest"))
		res = op_manifest(c->d, req);
	else if (!strcmp(op, "cluster"))
		res = op_cluster(c->d, req);
	else
		res = err_reply("unknown op: %s", op);
reply:
	if (res) {
		ctl_send(c->fd, res);
		json_decref(res);
	}
	json_decref(req);
	ctl_peer_free(&peer);
	ctl_reader_free(&rd);
	conn_done(c);
	return NULL;
}

static void *ctl_main(void *arg)
{
	struct daemon *d = arg;

	for (;;) {
		int fd = accept4(d->ctl_fd, NULL, NULL, SOCK_CLOEXEC);
		struct conn *c;
		pthread_t t;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			break; /* listening socket shut down */
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		c->d = d;
		c->fd = fd;
		pthread_mutex_lock(&d->conn_mu);
		if (__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE) ||
		    pthread_create(&t, NULL, conn_main, c) != 0) {
			pthread_mutex_unlock(&d->conn_mu);
			close(fd);
			free(c);
			continue;
		}
		/* on the list before conn_main can take itself off (it needs conn_mu) */
		c->next = d->conns;
		if (d->conns)
			d->conns->prev = c;
		d->conns = c;
		pthread_detach(t);
		pthread_mutex_unlock(&d->conn_mu);
	}
	return NULL;
}

/*
 * drain_conns() - end every live control connection: shut its socket down
 * (a reader sees EOF, progress sends fail; a publish checks d->stopping and
 * stops) and wait until every connection thread is done, at most
 * hwfs_tun.ctl_drain_ms.  Returns 0, or -ETIMEDOUT when some are still
 * running (then nothing they may use can be freed).
 */
static int drain_conns(struct daemon *d)
{
	struct timespec until;
	int r = 0;

	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += (time_t)(hwfs_tun.ctl_drain_ms / 1000);
	until.tv_nsec += (long)(hwfs_tun.ctl_drain_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&d->conn_mu);
	for (struct conn *c = d->conns; c; c = c->next)
		shutdown(c->fd, SHUT_RDWR);
	while (d->conns && r == 0)
		r = -pthread_cond_timedwait(&d->conn_cv, &d->conn_mu, &until);
	if (d->conns) {
		int n = 0;

		for (struct conn *c = d->conns; c; c = c->next)
			n++;
		LOG_ERR("%d control connection(s) still running after %llu ms", n,
			(unsigned long long)hwfs_tun.ctl_drain_ms);
		r = -ETIMEDOUT;
	} else {
		r = 0;
	}
	pthread_mutex_unlock(&d->conn_mu);
	return r;
}

/* ----------------------------------------------------------- life cycle */

static void notify(const struct daemon_opts *o, const char *msg)
{
	if (o->notify_fd >= 0) {
		if (write(o->notify_fd, msg, strlen(msg)) < 0)
			LOG_WARN("cannot notify the starting process");
		close(o->notify_fd);
		((struct daemon_opts *)o)->notify_fd = -1;
	}
}

/* Raise the mount's read-ahead (bdi) so cold reads stream. */
static void set_read_ahead(struct daemon *d)
{
	struct stat st;
	char path[128], val[32];
	int fd, n;

	if (stat(d->o->mountpoint, &st) < 0)
		return;
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", major(st.st_dev),
		 minor(st.st_dev));
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = snprintf(val, sizeof(val), "%llu", (unsigned long long)hwfs_tun.read_ahead_kb);
	if (write(fd, val, (size_t)n) < 0)
		LOG_WARN("cannot set %s: %s", path, strerror(errno));
	close(fd);
}

/*
 * Choose and make the directory of the control socket, whose file modes never
 * depend on the umask.  A daemon run as root: HWFS_CTL_DIR_ROOT, mode 0755,
 * which must be a root-owned directory (not a symlink); the socket is
 * PID.sock.  Any other user: a private directory made by mkdtemp under
 * $XDG_RUNTIME_DIR (else /tmp), mode 0700, removed at exit.  The socket file
 * itself is chmod'ed to 0666 after bind: who may do what is decided per
 * request from SO_PEERCRED (authorize()), not by file modes.  Returns 0 with
 * d->ctl_path set, or -errno with a sentence in @msg.
 */
static int make_ctl_dir(struct daemon *d, char *msg, size_t len)
{
	const char *base = getenv("XDG_RUNTIME_DIR");
	struct stat st;
	int r;

	if (geteuid() == 0) {
		snprintf(d->ctl_dir, sizeof(d->ctl_dir), "%s", HWFS_CTL_DIR_ROOT);
		if (mkdir(d->ctl_dir, 0755) < 0 && errno != EEXIST)
			goto fail;
		if (lstat(d->ctl_dir, &st) < 0)
			goto fail;
		if (!S_ISDIR(st.st_mode) || st.st_uid != 0) {
			snprintf(msg, len, "error: control directory %s is not a root-owned "
				 "directory; remove it\n", d->ctl_dir);
			return -EPERM;
		}
		if (chmod(d->ctl_dir, 0755) < 0)
			goto fail;
		snprintf(d->ctl_path, sizeof(d->ctl_path), "%s/%d.sock", d->ctl_dir, (int)getpid());
		return 0;
	}
	if (!base || *base != '/' || strlen(base) > 64)
		base = "/tmp";
	snprintf(d->ctl_dir, sizeof(d->ctl_dir), "%s/hwfs-XXXXXX", base);
	if (!mkdtemp(d->ctl_dir) || chmod(d->ctl_dir, 0700) < 0)
		goto fail;
	d->ctl_dir_private = 1;
	snprintf(d->ctl_path, sizeof(d->ctl_path), "%s/ctl.sock", d->ctl_dir);
	return 0;
fail:
	r = -errno;
	snprintf(msg, len, "error: control directory %s: %s\n", d->ctl_dir, strerror(-r));
	return r;
}

static void *post_init(void *arg)
{
	struct daemon *d = arg;

	set_read_ahead(d);
	notify(d->o, "ok\n");
	return NULL;
}

static void on_init(void *arg)
{
	pthread_t t;

	if (pthread_create(&t, NULL, post_init, arg) == 0)
		pthread_detach(t);
}

int daemon_run(const struct daemon_opts *o)
{
	struct daemon d = {.o = o, .ctl_fd = -1, .conn_mu = PTHREAD_MUTEX_INITIALIZER};
	pthread_condattr_t ca;
	struct fuse_loop_config *cfg = NULL;
	char optstr[4096], msg[4352];
	char *argv[] = {"hwfs", "-o", optstr, o->debug ? "-d" : NULL, NULL};
	struct fuse_args args = FUSE_ARGS_INIT(o->debug ? 4 : 3, argv);
	int r, mounted = 0;

	signal(SIGPIPE, SIG_IGN);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d.conn_cv, &ca);
	pthread_condattr_destroy(&ca);
	/*
	 * Shards arrive as messages of up to max_shard bytes, which libzmq
	 * mallocs.  Above glibc's mmap threshold every one would be a fresh
	 * mapping whose pages are faulted in and zeroed, then unmapped.  Keep
	 * buffers up to glibc's limit (32 MiB) on the heap and reuse them.
	 */
	mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's maximum */
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
	r = store_open(o->store, o->capacity, &d.st);
	if (r < 0) {
		snprintf(msg, sizeof(msg), "error: cannot open store %s: %s\n", o->store,
			 r == -EBUSY ? "in use by another hwfs daemon" : strerror(-r));
		goto fail;
	}
	r = ns_create(d.st, &d.ns);
	if (r < 0) {
		snprintf(msg, sizeof(msg), "error: cannot load index: %s\n", strerror(-r));
		goto fail;
	}
	if (o->preallocate) {
		/* After ns_create(): its trim has punched stale pages, these are clean. */
		r = arena_preallocate(store_arena(d.st), 1);
		if (r < 0) {
			snprintf(msg, sizeof(msg), "error: cannot preallocate the %llu-byte arena: %s\n",
				 (unsigned long long)arena_capacity(store_arena(d.st)),
				 r == -ENOSPC ? "not enough memory in its filesystem" : strerror(-r));
			goto fail;
		}
		LOG_INFO("arena: %llu bytes preallocated and locked",
			 (unsigned long long)arena_capacity(store_arena(d.st)));
	}
	d.owner = getuid();
	if (o->ctl_gid >= 0) {
		struct group *g = getgrgid((gid_t)o->ctl_gid);

		if (g)
			snprintf(d.group_name, sizeof(d.group_name), "%s", g->gr_name);
		else
			snprintf(d.group_name, sizeof(d.group_name), "%ld", o->ctl_gid);
	}
	r = make_ctl_dir(&d, msg, sizeof(msg));
	if (r < 0)
		goto fail;
	d.ctl_fd = ctl_listen(d.ctl_path, 0666);
	if (d.ctl_fd < 0) {
		r = d.ctl_fd;
		snprintf(msg, sizeof(msg), "error: control socket %s: %s\n", d.ctl_path,
			 strerror(-r));
		goto fail;
	}
	snprintf(optstr, sizeof(optstr),
		 "fsname=hwfs:%s,subtype=hwfs,max_read=1048576,default_permissions%s",
		 store_dir(d.st), geteuid() == 0 ? ",allow_other" : "");
	d.fsctx = (struct fsctx){d.ns, d.ctl_path, on_init, &d};
	d.se = fuse_session_new(&args, hwfs_fuse_ops(), sizeof(struct fuse_lowlevel_ops), &d.fsctx);
	if (!d.se) {
		r = -EINVAL;
		snprintf(msg, sizeof(msg), "error: cannot create the FUSE session\n");
		goto fail;
	}
	if (fuse_set_signal_handlers(d.se) < 0 || fuse_session_mount(d.se, o->mountpoint) < 0) {
		r = -EIO;
		snprintf(msg, sizeof(msg), "error: cannot mount on %s (see %s/hwfs.log)\n",
			 o->mountpoint, store_dir(d.st));
		goto fail;
	}
	mounted = 1;
	if (pthread_create(&d.ctl_thread, NULL, ctl_main, &d) != 0) {
		r = -EAGAIN;
		snprintf(msg, sizeof(msg), "error: cannot start the control thread\n");
		goto fail;
	}
	d.ctl_running = 1;
	if (o->coordinator) {
		r = start_coord(&d, msg, sizeof(msg));
		if (r < 0)
			goto fail;
	}
	if (o->join) {
		/* joining our own coordinator: at the port it bound (tcp://HOST:* allowed) */
		const char *join = o->coordinator && d.coord_ep[0] ? d.coord_ep : o->join;
		struct agent_opts ao = {o->node, o->listen, join, o->mountpoint, o->keys, d.ns,
					d.st, flip_current, &d};

		r = agent_start(&ao, &d.agent);
		if (r < 0) {
			snprintf(msg, sizeof(msg), "error: cannot join %s: %s\n", o->join,
				 r == -EADDRINUSE ? "listen address in use" : strerror(-r));
			goto fail;
		}
		ns_set_seal_hook(d.ns, agent_sealed, d.agent);
	}
	LOG_INFO("mounted %s (store %s, pid %d)", o->mountpoint, store_dir(d.st), (int)getpid());
	cfg = fuse_loop_cfg_create();
	fuse_loop_cfg_set_clone_fd(cfg, 1);
	fuse_loop_cfg_set_max_threads(cfg, (unsigned)hwfs_tun.max_threads);
	fuse_loop_cfg_set_idle_threads(cfg, (unsigned)HWFS_MIN(hwfs_tun.max_threads, 4));
	r = fuse_session_loop_mt(d.se, cfg);
	fuse_loop_cfg_destroy(cfg);
	LOG_INFO("unmounted %s", o->mountpoint);
	r = 0;
	goto out;
fail:
	LOG_ERR("%.*s", (int)strcspn(msg, "\n"), msg);
	notify(o, msg);
out:
	/*
	 * Control connections first: no new ones, the live ones ended, and
	 * nothing they use (agent, namespace, store) is freed until they are
	 * gone.  The mount goes before the wait, so a commit or publish that
	 * renames through it fails instead of waiting for a loop that has ended.
	 */
	__atomic_store_n(&d.stopping, 1, __ATOMIC_RELEASE);
	if (d.ctl_running) {
		shutdown(d.ctl_fd, SHUT_RDWR);
		pthread_join(d.ctl_thread, NULL);
	}
	if (d.se && mounted) {
		fuse_session_unmount(d.se);
		mounted = 0;
	}
	if (drain_conns(&d) < 0) {
		LOG_ERR("exiting without freeing the namespace and store (still in use)");
		fuse_opt_free_args(&args);
		return r;
	}
	if (d.agent) {
		ns_set_seal_hook(d.ns, NULL, NULL);
		agent_stop(d.agent);
	}
	if (d.coord_running) {
		d.coord_stop = 1;
		pthread_join(d.coord_thread, NULL);
	}
	if (d.ctl_fd >= 0) {
		close(d.ctl_fd);
		unlink(d.ctl_path);
	}
	if (d.ctl_dir_private)
		rmdir(d.ctl_dir);
	if (d.se) {
		fuse_remove_signal_handlers(d.se);
		fuse_session_destroy(d.se);
	}
	pthread_cond_destroy(&d.conn_cv);
	ns_destroy(d.ns);
	store_close(d.st);
	fuse_opt_free_args(&args);
	return r;
}
