/*
 * agent_commit.c — the node's side of the cluster's two-phase commit (see
 * agent.h for the model, docs/protocol.md §4 for the messages).
 *
 * PREPARE: may this node flip to the version (here, sealed, intact, with the
 * cluster's digest), and are its engines ready (the barrier hook, which may
 * take a while: the PREPARE then waits in struct agent_commit and READY goes
 * out from commit_barrier_check(), on a later pass of the loop)?  READY says
 * yes, or no with a reason and an errno.  COMMIT: flip, record the decision
 * as applied, ACK (with the errno of a failed flip).  ABORT: forget the
 * PREPARE that waits.  The cluster's decision also comes with every WELCOME
 * and PONG (commit_learn()): a decision this node has not applied is applied
 * now, or once the version arrives (commit_arrived(), the pull's arrival
 * hook).
 *
 * Called by agent.c only; calls agent_pull.c (agent_send_coord()) and the
 * node's hooks.  Runs on the agent thread only.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "agent_i.h"

/*
 * flip_to() - point current at the cluster's committed @version (nothing to
 * do when it does already).  Returns 0 or the -errno of the flip, logged once
 * until a flip succeeds again (it is retried on every heartbeat answer).
 */
static int flip_to(struct agent *a, const char *version)
{
	char err[256];
	char *cur = a->o.hooks->current(a->o.arg);
	int same = cur && !strcmp(cur, version), r = 0;

	free(cur);
	if (same)
		goto out;
	r = a->o.hooks->flip_current(a->o.arg, version, err, sizeof(err));
	if (r < 0 && !a->commit.flip_failing)
		LOG_ERR("agent: cannot flip current to %s, committed by the cluster: %s (retried "
			"on every heartbeat; logged once)", version, err);
	else if (r == 0)
		LOG_INFO("agent: current -> %s (committed by the cluster)", version);
out:
	a->commit.flip_failing = r < 0;
	return r;
}

/* Where the applied decision is kept in the store: "EPOCH VERSION". */
#define APPLIED_KEY "cluster_applied"

/*
 * Remember the cluster decision (@version, @epoch) as applied here, in memory
 * and in the store: a node restarted after a `commit --local` override must
 * not take the decision it had already applied for one it missed.
 */
static void set_applied(struct agent *a, const char *version, uint64_t epoch)
{
	char *v = strdup(version), buf[64 + 4096];

	if (!v)
		return; /* retried on the next heartbeat answer */
	free(a->commit.applied);
	a->commit.applied = v;
	a->commit.applied_epoch = epoch;
	snprintf(buf, sizeof(buf), "%llu %s", (unsigned long long)epoch, version);
	if (store_meta_set(a->o.st, APPLIED_KEY, buf) < 0)
		LOG_WARN("agent: cannot record the applied commit %s in the store", version);
}

/* The decision applied before a restart (see set_applied), if any. */
void commit_load_applied(struct agent *a)
{
	char *val = NULL, *sp;
	unsigned long long epoch;

	if (store_meta_get(a->o.st, APPLIED_KEY, &val) < 0)
		return;
	sp = strchr(val, ' ');
	if (sp && sp[1] && sscanf(val, "%llu ", &epoch) == 1) {
		a->commit.applied = strdup(sp + 1);
		a->commit.applied_epoch = epoch;
	}
	free(val);
}

/*
 * Flip to the cluster's committed @version (decision @epoch) and, once that
 * worked, record it as applied: nothing is pending any more.  A failed flip
 * leaves everything as it was (retried on the next heartbeat answer).
 */
static void apply_commit(struct agent *a, const char *version, uint64_t epoch)
{
	if (flip_to(a, version) < 0)
		return;
	set_applied(a, version, epoch);
	free(a->commit.pending_commit);
	a->commit.pending_commit = NULL;
}

/*
 * commit_learn() - the coordinator's last decision (@committed, @epoch) from
 * a WELCOME or PONG.  A decision this node has not applied yet is applied:
 * flip now if the version is here complete, else once it arrives
 * (pending_commit).  A flip that fails is retried on the next answer.
 */
void commit_learn(struct agent *a, const char *committed, uint64_t epoch)
{
	struct agent_commit *c = &a->commit;
	enum hwfs_vstate state;
	hwfs_hash_t digest;

	if (!committed || (c->applied && !strcmp(c->applied, committed) && c->applied_epoch == epoch))
		return;
	if (a->o.hooks->lookup(a->o.arg, committed, &state, &digest) < 0 ||
	    state != HWFS_V_SEALED) {
		if (!c->pending_commit || strcmp(c->pending_commit, committed)) {
			free(c->pending_commit);
			c->pending_commit = strdup(committed);
			c->pending_epoch = epoch;
			LOG_INFO("agent: the cluster committed %s; flipping once it is here", committed);
		}
		return;
	}
	apply_commit(a, committed, epoch);
}

/*
 * commit_arrived() - version @name just arrived complete: if it is the
 * cluster's committed version this node was waiting for, flip to it and
 * record the decision as applied (a failed flip is retried on heartbeats).
 */
void commit_arrived(struct agent *a, const char *name)
{
	if (a->commit.pending_commit && !strcmp(a->commit.pending_commit, name))
		apply_commit(a, name, a->commit.pending_epoch);
}

/* Microseconds from @since_ns (hwfs_mono_ns) to now: a node's share of a commit. */
static json_int_t us_since(uint64_t since_ns)
{
	uint64_t now = hwfs_mono_ns();

	return now > since_ns ? (json_int_t)((now - since_ns) / 1000) : 0;
}

/*
 * Answer PREPARE @txid of @name: READY, ready when @r is 0, else not because
 * of @reason with errno -@r (the coordinator relays it to the requester),
 * with the microseconds since the PREPARE arrived (@since_ns): the checks and
 * the engine barrier here, what the coordinator's commit record shows per node.
 */
static void send_ready(struct agent *a, uint64_t txid, const char *name, int r,
		       const char *reason, uint64_t since_ns)
{
	json_t *f = json_pack("{s:I, s:s, s:b, s:s, s:I}", "txid", (json_int_t)txid, "version",
			      name, "ok", r == 0, "reason", r == 0 ? "ready" : reason, "prepare_us",
			      us_since(since_ns));

	if (f && r < 0)
		json_object_set_new(f, "errno", json_integer(-r));
	agent_send_coord(a, P_READY, f, NULL, 0);
}

/* Forget the PREPARE waiting for the engine barrier, if any. */
static void prep_clear(struct agent *a)
{
	free(a->commit.prep_version);
	a->commit.prep_version = NULL;
}

/*
 * prepare_check() - may this node flip to @name, the cluster's version with
 * @digest: here, sealed, intact and with that digest?  Run on PREPARE, and
 * again when the engine barrier let it wait (hwfs rm, a new version of the
 * name or hwfs verify may have changed it meanwhile).  Returns 0, or -errno
 * with the reason in @err.
 */
static int prepare_check(struct agent *a, const char *name, const hwfs_hash_t *digest, char *err,
			 size_t errlen)
{
	return a->o.hooks->committable(a->o.arg, name, digest, err, errlen);
}

/*
 * commit_barrier_check() - the PREPARE that waits, if any (every pass of the
 * loop, and at once when agent_wake() says an engine reported): while its
 * version is on its way here, check whether it arrived; then ask the engine
 * barrier; once that is decided, check the version again (the wait may have
 * been long), answer READY and forget it.
 */
void commit_barrier_check(struct agent *a)
{
	struct agent_commit *c = &a->commit;
	char err[600];
	int r = 0;

	if (!c->prep_version)
		return;
	if (!c->prep_barrier_ns) {
		r = prepare_check(a, c->prep_version, &c->prep_digest, err, sizeof(err));
		if (r == -ENOENT)
			return; /* still on its way: the coordinator's deadline bounds the wait */
		if (r == 0) {
			c->prep_barrier_ns = hwfs_mono_ns();
			LOG_INFO("agent: %s arrived for the commit that waits for it", c->prep_version);
		}
	}
	if (r == 0 && a->o.hooks->barrier) {
		r = a->o.hooks->barrier(a->o.arg, c->prep_version, c->prep_barrier_ns, err,
					sizeof(err));
		if (r == -EINPROGRESS)
			return;
		if (r == 0)
			r = prepare_check(a, c->prep_version, &c->prep_digest, err, sizeof(err));
	}
	if (r < 0)
		LOG_INFO("agent: not ready for %s: %s", c->prep_version, err);
	send_ready(a, c->prep_txid, c->prep_version, r, err, c->prep_started);
	prep_clear(a);
}

/*
 * commit_on_prepare() - the coordinator asks whether this node can flip to a
 * version: it must be here sealed, intact and with the cluster's digest, and
 * then every engine registered here must have it loaded (the barrier hook,
 * which may take a while: READY is then sent by commit_barrier_check()).
 * A version the coordinator knows (it has its digest) but that is not here
 * yet is on its way (its announcement or its shards are still travelling):
 * the READY waits for it (commit_barrier_check()), and the coordinator's
 * deadline bounds that wait.  A newer PREPARE replaces one still waiting (the coordinator runs one
 * commit at a time).
 */
void commit_on_prepare(struct agent *a, struct proto_msg *m)
{
	const char *name = proto_str(m, "version");
	uint64_t txid = proto_int(m, "txid"), t0 = hwfs_mono_ns();
	hwfs_hash_t digest;
	char err[256] = "";
	int r;

	if (!name) {
		LOG_WARN("agent: PREPARE without a version ignored");
		return;
	}
	prep_clear(a);
	if (proto_hash(m, "digest", &digest) < 0) {
		r = -EINVAL;
		snprintf(err, sizeof(err), "PREPARE of %s without a valid digest", name);
	} else {
		r = prepare_check(a, name, &digest, err, sizeof(err));
	}
	if (r == 0 || r == -ENOENT) {
		a->commit.prep_version = strdup(name);
		if (a->commit.prep_version) {
			a->commit.prep_digest = digest;
			a->commit.prep_txid = txid;
			a->commit.prep_started = t0;
			a->commit.prep_barrier_ns = r == 0 ? t0 : 0;
			if (r == -ENOENT)
				LOG_INFO("agent: PREPARE of %s: not here yet; waiting for it", name);
			commit_barrier_check(a); /* with no engine: READY right now, as before */
			return;
		}
		r = -ENOMEM;
		snprintf(err, sizeof(err), "out of memory");
	}
	send_ready(a, txid, name, r, err, t0);
}

/*
 * commit_on_commit() - the cluster decided @name: flip, record the decision as
 * applied, ACK with the outcome and the microseconds that took here
 * ("flip_us": the flip through the mount and the store's record).
 */
void commit_on_commit(struct agent *a, struct proto_msg *m)
{
	const char *name = proto_str(m, "version");
	char err[256] = "flipped";
	uint64_t t0 = hwfs_mono_ns();
	int r = a->o.hooks->flip_current(a->o.arg, name, err, sizeof(err));
	json_t *ack;

	if (r == 0) {
		free(a->commit.pending_commit);
		a->commit.pending_commit = NULL;
		if (json_object_get(m->h, "epoch"))
			set_applied(a, name, proto_int(m, "epoch"));
	}
	ack = json_pack("{s:I, s:s, s:b, s:s, s:I}", "txid", (json_int_t)proto_int(m, "txid"),
			"version", name, "ok", r == 0, "reason", err, "flip_us", us_since(t0));
	if (ack && r < 0) /* the coordinator keeps it with the node's reason */
		json_object_set_new(ack, "errno", json_integer(-r));
	agent_send_coord(a, P_ACK, ack, NULL, 0);
}

void commit_on_abort(struct agent *a, struct proto_msg *m)
{
	LOG_INFO("agent: commit of %s aborted: %s (%s)", proto_str(m, "version"),
		 proto_str(m, "reason"), strerror(proto_errno(m, ECANCELED)));
	if (a->commit.prep_version && proto_int(m, "txid") == a->commit.prep_txid)
		prep_clear(a); /* decided: no READY is wanted any more */
}

double commit_wait_left(const struct agent *a, double left)
{
	if (a->commit.prep_version && a->commit.prep_barrier_ns) {
		uint64_t due = a->commit.prep_barrier_ns + hwfs_tun.engine_deadline_ms * 1000000ull;
		uint64_t now = hwfs_mono_ns();

		left = HWFS_MIN(left, due > now ? (double)(due - now) / 1e9 : 0.0);
	}
	return left;
}

void commit_free(struct agent *a)
{
	free(a->commit.pending_commit);
	free(a->commit.prep_version);
	free(a->commit.applied);
}
