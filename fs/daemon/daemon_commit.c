/*
 * daemon_commit.c — commits: `hwfs commit` (the control operation), a rename
 * onto `current` through the mount (`ln -sfn V current`: the same commit),
 * and the flip of `current` that ends both.
 *
 * A commit of a node that is not joined waits for this node's engines to
 * have the version loaded (the barrier, docs/engines.md) and flips; a joined
 * node asks the coordinator, which runs the two phases on every node
 * (docs/protocol.md) and makes each flip, this one included, on COMMIT.
 *
 * A rename onto `current` reaches daemon_rename_commit() on a FUSE worker
 * while the kernel holds the mount's root directory locked for it; the
 * rename itself is this node's flip, made when the callback returns 0.  So
 * the cluster's COMMIT for that version, on this node, does not flip through
 * the mount (that would wait for the root's lock): it marks the flip as the
 * rename's and returns.  The daemon's own flips (flip_now(), through a child
 * of the daemon, own_mount.h) pass the callback at once: their commit is
 * decided.  Refusals are logged, counted (hwfs_commits_total{outcome=
 * "refused"}) and kept as status's last_refused_commit.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon_i.h"
#include "names.h"
#include "own_mount.h"
#include "tunables.h"

/*
 * note_refused() - a commit of @v was refused with errno @e for @why: log it
 * and keep it as status's "last_refused_commit" (names and reasons cleaned
 * of control characters).
 */
static void note_refused(struct daemon *d, const char *v, int e, const char *why)
{
	char *cv = hwfs_clean_text(v, HWFS_NAME_MAX), *cw = hwfs_clean_text(why, 512);
	json_t *rec;

	LOG_WARN("commit of %s refused (%s): %s", cv ? cv : "?", strerror(e), cw ? cw : "?");
	rec = json_pack("{s:s, s:s, s:i, s:I}", "version", cv ? cv : "?", "reason", cw ? cw : "?",
			"errno", e, "at", (json_int_t)time(NULL));
	free(cv);
	free(cw);
	if (!rec)
		return;
	pthread_mutex_lock(&d->commit_mu);
	json_decref(d->last_refused);
	d->last_refused = rec;
	pthread_mutex_unlock(&d->commit_mu);
}

json_t *daemon_commit_status(struct daemon *d)
{
	json_t *r;

	pthread_mutex_lock(&d->commit_mu);
	r = d->last_refused ? json_deep_copy(d->last_refused) : json_null();
	pthread_mutex_unlock(&d->commit_mu);
	return r;
}

/*
 * Flip `current` through the mount so inotify watchers see IN_MOVED_TO: a
 * fresh symlink in the root renamed onto `current` (the namespace's current
 * hook then tells the watchers and engines, {"event": "current"}).  Never
 * called from a FUSE request handler.  Returns 0 or -errno with a sentence in
 * @err.
 *
 * The symlink is made in the namespace directly, not through the mount: the
 * kernel learns of it when the rename looks it up.  Made through the mount
 * it cost three FUSE requests more per flip (the root's attributes, the
 * name's negative lookup, SYMLINK), on every node of every commit, and a
 * check of where it landed (docs/benchmarks.md, "Commit latency", issue 29).
 * Only the rename goes through the mount, made by a child (own_mount.h).  A
 * mount taken away from outside (umount(2)) before the daemon knows it stops
 * cannot get a `current` in the bare mountpoint directory: the rename finds
 * no symlink there (ENOENT).
 */
static int flip_now(struct daemon *d, const char *v, char *err, size_t errlen)
{
	char name[64], tmp[4096], cur[4096], target[1024];
	struct node *root = ns_root(d->ns), *n;
	int r;

	r = ns_check_committable(d->ns, v, NULL, err, errlen);
	if (r < 0)
		return r;
	snprintf(target, sizeof(target), "versions/%s", v);
	snprintf(name, sizeof(name), ".hwfs-commit-%d-%llu", (int)getpid(),
		 (unsigned long long)__atomic_add_fetch(&d->counter, 1, __ATOMIC_RELAXED));
	snprintf(tmp, sizeof(tmp), "%s/%s", d->o->mountpoint, name);
	snprintf(cur, sizeof(cur), "%s/current", d->o->mountpoint);
	r = ns_symlink(d->ns, root, name, target, (uint32_t)getuid(), (uint32_t)getgid(), &n);
	if (r < 0) {
		snprintf(err, errlen, "symlink: %s", strerror(-r));
		return r;
	}
	ns_forget(d->ns, n, 1); /* the kernel's reference ns_symlink counted: it has none */
	/*
	 * Shutdown sets d->stopping before it unmounts: a rename made after
	 * that would find no mount (or a bare directory without the symlink).
	 */
	if (__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE))
		r = -ESHUTDOWN;
	else if (own_mount_rename(tmp, cur) < 0)
		r = -errno;
	if (r == 0)
		return 0;
	ns_unlink(d->ns, root, name, 0); /* not renamed: the temporary goes */
	/*
	 * Why the rename failed: the namespace's own sentence when the version
	 * stopped being committable meanwhile (removed, damaged), else the
	 * path's (the mount taken away from outside: ENOENT).
	 */
	if (r == -ESHUTDOWN || __atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE))
		snprintf(err, errlen, "the daemon is shutting down");
	else if (ns_check_committable(d->ns, v, NULL, err, errlen) == 0)
		snprintf(err, errlen, "rename onto %s: %s%s", cur, strerror(-r),
			 r == -ENOENT ? " (is the mount still there?)" : "");
	return r;
}

/*
 * daemon_flip_current() - flip_now(), counted for /metrics: the node is "updating"
 * meanwhile (readyz), the flip's duration goes to
 * hwfs_commit_duration_seconds{phase="flip"} and its outcome to
 * hwfs_commits_total (committed, or refused when the version cannot be
 * committed, else failed).  The flip of a commit that a rename onto
 * `current` asked for is that rename's (see below).
 */
int daemon_flip_current(struct daemon *d, const char *v, char *err, size_t errlen)
{
	uint64_t t0 = hwfs_mono_ns();
	int r, deferred;

	/*
	 * A rename onto `current` through the mount asked for this commit and
	 * waits for it (daemon_rename_commit()): the kernel holds the root
	 * directory locked for it, so a flip through the mount would wait for
	 * that rename, which waits for this flip.  That rename is the flip:
	 * it is made the moment the commit's outcome reaches it.
	 */
	pthread_mutex_lock(&d->commit_mu);
	deferred = d->rename_version[0] && !strcmp(d->rename_version, v);
	if (deferred)
		d->rename_flip_due = 1;
	pthread_mutex_unlock(&d->commit_mu);
	if (deferred) {
		LOG_INFO("commit of %s: flipped by the rename onto current that asked for it", v);
		hwfs_count(&hwfs_nm.commits[HWFS_COMMIT_OK], 1);
		return 0;
	}
	hwfs_count(&hwfs_nm.updating, 1);
	r = flip_now(d, v, err, errlen);
	hwfs_hist_observe_ns(&hwfs_nm.commit_flip, hwfs_mono_ns() - t0);
	hwfs_count(&hwfs_nm.commits[r == 0 ? HWFS_COMMIT_OK : HWFS_COMMIT_FAILED], 1);
	__atomic_fetch_sub(&hwfs_nm.updating, 1, __ATOMIC_RELAXED);
	return r; /* the current hook refreshed /metrics' snapshot (daemon_current) */
}

/*
 * commit_reply() - the control reply for the coordinator's COMMIT_RES @res
 * (consumed): "outcome" (committed / partial / aborted) and the nodes that
 * "committed", "failed" (node -> reason) and are "unknown" (no answer before
 * the deadline), with "ok" only when every live node committed and an
 * "error" sentence otherwise, whose "errno" is the coordinator's (a
 * coordinator that predates it: EINPROGRESS for partial, ECANCELED for
 * aborted).  Returns the reply, NULL without memory.
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
		out = daemon_err_reply(ctl_errno(res) ?: EINPROGRESS,
				"commit of %s is partial: %zu node(s) flipped, %zu failed, %zu did "
				"not answer (%s); the others flip when they can",
				v, json_array_size(json_object_get(res, "committed")),
				json_object_size(json_object_get(res, "failed")),
				json_array_size(json_object_get(res, "unknown")), why ? why : "?");
	else
		out = daemon_err_reply(ctl_errno(res) ?: ECANCELED, "commit of %s aborted: %s", v,
				why ? why : "refused");
	if (out) {
		json_object_set_new(out, "outcome", json_string(outcome));
		/* the coordinator's lists, or empty ones it did not send (one reference each) */
		json_object_set_new(out, "nodes", json_incref(json_object_get(res, "nodes")) ?: json_array());
		json_object_set_new(out, "committed",
				    json_incref(json_object_get(res, "committed")) ?: json_array());
		json_object_set_new(out, "failed",
				    json_incref(json_object_get(res, "failed")) ?: json_object());
		json_object_set_new(out, "unknown",
				    json_incref(json_object_get(res, "unknown")) ?: json_array());
	}
	json_decref(res);
	return out;
}


/*
 * local_prepare() - the first phase of a node that is not joined: @v can be
 * committed and every engine of this node has it loaded (the barrier).
 * @force: the engines are not waited for (`hwfs commit --local --force`: they
 * get the "current" event and may refuse to swap).  Counted for /metrics
 * (hwfs_commit_duration_seconds{phase="prepare"}, a refusal in
 * hwfs_commits_total).  Returns 0 or -errno with a sentence in
 * @err.
 */
static int local_prepare(struct daemon *d, const char *v, int force, char *err, size_t errlen)
{
	uint64_t t0 = hwfs_mono_ns();
	int r;

	r = ns_check_committable(d->ns, v, NULL, err, errlen);
	if (r == 0 && !force)
		r = engines_barrier_wait(d->engines, v, err, errlen);
	hwfs_hist_observe_ns(&hwfs_nm.commit_prepare, hwfs_mono_ns() - t0);
	if (r < 0)
		hwfs_count(&hwfs_nm.commits[HWFS_COMMIT_REFUSED], 1);
	return r;
}

/*
 * cluster_commit() - ask the coordinator to commit @v on every node and wait
 * (commit_wait_ms) for its outcome.  Returns the control reply (commit_reply()'s,
 * or an error reply), NULL without memory.
 */
static json_t *cluster_commit(struct daemon *d, struct agent *agent, const char *v)
{
	char err[512];
	json_t *call, *res = NULL;
	int r;

	r = ns_check_committable(d->ns, v, NULL, err, sizeof(err));
	if (r < 0)
		return daemon_err_reply(-r, "cannot commit: %s", err);
	call = json_pack("{s:s, s:s}", "op", "commit", "version", v);
	r = agent_call(agent, call, &res, (int)hwfs_tun.commit_wait_ms);
	json_decref(call);
	if (r == -EHOSTUNREACH)
		return daemon_err_reply(EHOSTUNREACH, "cannot commit %s: the coordinator is unreachable",
					v);
	if (r < 0) {
		json_t *e = daemon_err_reply(-r, "commit of %s: the coordinator %s; the outcome is "
					     "unknown until it is back (see hwfs status --cluster)",
					     v, r == -ECONNRESET ? "went away" : "did not answer");

		json_object_set_new(e, "outcome", json_string("unknown"));
		return e;
	}
	return commit_reply(v, res);
}

/* The errno and sentence of control reply @rep (EIO, "?" when it has none). */
static int reply_errno(json_t *rep, const char **why)
{
	const char *w = json_string_value(json_object_get(rep, "error"));

	*why = w ? w : "?";
	return ctl_errno(rep) ?: EIO;
}

json_t *daemon_op_commit(struct daemon *d, json_t *req, struct ctl_reader *rd,
			 const struct ctl_peer *peer)
{
	const char *v = daemon_req_str(req, "version"), *why;
	int local = json_is_true(json_object_get(req, "local"));
	int force = json_is_true(json_object_get(req, "force"));
	struct agent *agent = daemon_agent(d);
	char err[512];
	json_t *rep;
	int r;

	if (!v)
		return daemon_err_reply(EINVAL, "commit: missing version");
	if (force && agent && !local)
		return daemon_err_reply(EINVAL, "commit --force flips one node: add --local");
	if (agent && !local) { /* two-phase, cluster-wide: the coordinator decides */
		rep = cluster_commit(d, agent, v);
		if (rep && !json_is_true(json_object_get(rep, "ok")) &&
		    strcmp(json_string_value(json_object_get(rep, "outcome")) ?: "", "partial")) {
			r = reply_errno(rep, &why);
			note_refused(d, v, r, why);
		}
		return rep;
	}
	/* this node only: its engines must have @v loaded first (docs/engines.md) */
	hwfs_count(&hwfs_nm.updating, 1);
	r = local_prepare(d, v, force, err, sizeof(err));
	if (r == 0)
		r = daemon_flip_current(d, v, err, sizeof(err));
	else
		note_refused(d, v, -r, err);
	__atomic_fetch_sub(&hwfs_nm.updating, 1, __ATOMIC_RELAXED);
	if (r < 0)
		return daemon_err_reply(-r, "cannot commit %s: %s", v, err);
	return json_pack("{s:b, s:s}", "ok", 1, "current", v);
}

/*
 * rename_cluster_commit() - the cluster's commit of @v for a rename onto
 * `current` on this node: its flip on this node is the rename's (see
 * daemon_flip_current()).  Returns 0 when the commit was decided and this
 * node was told to flip (a partial outcome, logged, included: the decision
 * stands and the other nodes flip when they can), else -errno.
 */
static int rename_cluster_commit(struct daemon *d, struct agent *agent, const char *v)
{
	const char *why = "?", *outcome;
	json_t *rep;
	int due, ok, r = 0;

	pthread_mutex_lock(&d->commit_mu);
	snprintf(d->rename_version, sizeof(d->rename_version), "%s", v);
	d->rename_flip_due = 0;
	pthread_mutex_unlock(&d->commit_mu);
	rep = cluster_commit(d, agent, v);
	pthread_mutex_lock(&d->commit_mu);
	due = d->rename_flip_due;
	d->rename_version[0] = '\0';
	pthread_mutex_unlock(&d->commit_mu);
	if (!rep)
		return -ENOMEM;
	ok = json_is_true(json_object_get(rep, "ok"));
	outcome = json_string_value(json_object_get(rep, "outcome")) ?: "";
	if (!ok) {
		r = -reply_errno(rep, &why);
		if (due && !strcmp(outcome, "partial")) {
			LOG_WARN("%s; this node flips with the rename onto current", why);
			r = 0;
		} else {
			note_refused(d, v, -r, why);
		}
	}
	json_decref(rep);
	return r;
}

int daemon_rename_commit(void *arg, const char *target, pid_t pid)
{
	struct daemon *d = arg;
	struct agent *agent = daemon_agent(d);
	char err[512], *canon;
	const char *v;
	int r;

	if (own_mount_is_child(pid))
		return 0; /* the daemon's own flip (flip_now()): its commit is decided */
	canon = ns_current_target(target);
	if (!canon) {
		snprintf(err, sizeof(err), "a rename onto current commits a version: its link must "
			 "name versions/V or V, not \"%s\"", target);
		note_refused(d, target, EINVAL, err);
		return -EINVAL;
	}
	v = canon + strlen("versions/");
	if (agent) {
		r = rename_cluster_commit(d, agent, v);
	} else {
		hwfs_count(&hwfs_nm.updating, 1);
		r = local_prepare(d, v, 0, err, sizeof(err));
		if (r == 0)
			hwfs_count(&hwfs_nm.commits[HWFS_COMMIT_OK], 1);
		else
			note_refused(d, v, -r, err);
		__atomic_fetch_sub(&hwfs_nm.updating, 1, __ATOMIC_RELAXED);
	}
	if (r == 0)
		LOG_INFO("commit of %s through the mount (rename onto current by pid %d)", v, (int)pid);
	free(canon);
	return r;
}
