/*
 * daemon_repl.c — the replication adapter: everything between the daemon and
 * the replication agent in one file.  The hooks the agent is handed
 * (replicator/agent.h, struct agent_hooks: versions, lookup, snapshot,
 * current, committable, import, flip_current, barrier, engines), joining a
 * cluster (daemon_join), and the one call the other way, the announcement of
 * a version sealed here (daemon_repl_sealed, from the namespace's seal hook).
 *
 * The replicator sits below the namespace and the daemon in the layers
 * (docs/design.md, "Module map") and includes nothing of theirs: whatever it
 * needs of the node — which versions are here, their records and digests,
 * `current`, building and sealing a version that arrived, flipping current,
 * the engine barrier and the engines for the heartbeat — it asks through
 * these hooks, which adapt the namespace (fs/ns), the daemon's own calls
 * through its mount (own_mount.h) and the engine registry (engine_registry.h).
 * Every hook runs on the agent thread.  Of the daemon's files it calls only
 * daemon_commit.c (the flip of `current`).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_i.h"
#include "names.h"
#include "own_mount.h"

/* The sealed versions here, [{"name", "digest"}] in creation order (hidden ones left out). */
static json_t *repl_versions(void *arg)
{
	struct daemon *d = arg;
	json_t *out = json_array();
	char **names = NULL;
	size_t n = 0;

	if (ns_list(d->ns, &names, &n) < 0)
		n = 0;
	for (size_t i = 0; i < n; i++) {
		enum hwfs_vstate state;
		hwfs_hash_t digest;

		if (out && ns_version_state(d->ns, names[i], &state, NULL, &digest) == 0 &&
		    state == HWFS_V_SEALED)
			json_array_append_new(out, json_pack("{s:s, s:o}", "name", names[i], "digest",
							     hwfs_hash_json(&digest)));
		free(names[i]);
	}
	free(names);
	return out;
}

/* Version @name's state and digest: 0, or -ENOENT. */
static int repl_lookup(void *arg, const char *name, enum hwfs_vstate *state, hwfs_hash_t *digest)
{
	struct daemon *d = arg;

	return ns_version_state(d->ns, name, state, NULL, digest);
}

/* A record of version @name; the daemon's hidden staging versions are not the cluster's. */
static int repl_snapshot(void *arg, const char *name, struct hwfs_vrec **out)
{
	struct daemon *d = arg;

	if (ns_hidden_name(name))
		return -ENOENT;
	return ns_snapshot(d->ns, name, out);
}

static char *repl_current(void *arg)
{
	struct daemon *d = arg;

	return ns_current(d->ns);
}

/* Sealed, intact and with the cluster's @digest?  0 or -errno with @err. */
static int repl_committable(void *arg, const char *name, const hwfs_hash_t *digest, char *err,
			   size_t errlen)
{
	struct daemon *d = arg;
	hwfs_hash_t here;
	int r;

	r = ns_check_committable(d->ns, name, &here, err, errlen);
	if (r == 0 && hwfs_hash_cmp(&here, digest)) {
		r = -EINVAL;
		snprintf(err, errlen, "%s here differs from the cluster's", name);
	}
	return r;
}

/*
 * repl_import() - every shard of @rec is here: build it as a hidden open
 * version, rename it into versions/ through the mount (that seals it, and
 * inotify watchers see it arrive), then check its digest against the
 * manifest's.  A version that fails is removed.
 */
static int repl_import(void *arg, struct hwfs_vrec *rec, char *err, size_t errlen)
{
	struct daemon *d = arg;
	char hidden[128], from[4096], to[4096], *name = strdup(rec->name);
	hwfs_hash_t want = rec->digest, got;
	int r, ok;

	if (!name) {
		snprintf(err, errlen, "cannot build %s: %s", rec->name, strerror(ENOMEM));
		return -ENOMEM;
	}
	snprintf(hidden, sizeof(hidden), NS_HIDDEN_PREFIX "repl-%d-%llu", (int)getpid(),
		 (unsigned long long)__atomic_add_fetch(&d->counter, 1, __ATOMIC_RELAXED));
	r = ns_import(d->ns, hidden, rec); /* takes over rec's strings */
	if (r < 0) {
		snprintf(err, errlen, "cannot build %s: %s", name, strerror(-r));
		goto out;
	}
	snprintf(from, sizeof(from), "%s/versions/%s", d->o->mountpoint, hidden);
	snprintf(to, sizeof(to), "%s/versions/%s", d->o->mountpoint, name);
	if (own_mount_rename(from, to) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot seal %s: %s", name, strerror(errno));
		ns_remove_version(d->ns, hidden);
		goto out;
	}
	ok = ns_version_state(d->ns, name, NULL, NULL, &got) == 0 && !hwfs_hash_cmp(&got, &want);
	if (!ok) {
		r = -EBADMSG;
		snprintf(err, errlen, "%s arrived with a digest that does not match its manifest; "
			 "removed", name);
		ns_remove_version(d->ns, name);
	}
out:
	free(name);
	return r;
}

/*
 * The agent's barrier hook: engines_barrier() on this daemon's registry,
 * timed for /metrics: a "not yet" marks the node updating (hwfs_updating()),
 * an answer ends the commit's prepare phase (a refusal is counted).
 */
static int repl_barrier(void *arg, const char *version, uint64_t started_ns, char *err,
			size_t errlen)
{
	struct daemon *d = arg;
	int r = engines_barrier(d->engines, version, started_ns, err, errlen);
	uint64_t now = hwfs_mono_ns();

	__atomic_store_n(&hwfs_nm.preparing_ns, r == -EINPROGRESS ? now : 0, __ATOMIC_RELAXED);
	if (r != -EINPROGRESS) {
		hwfs_hist_observe_ns(&hwfs_nm.commit_prepare, now > started_ns ? now - started_ns : 0);
		if (r < 0)
			hwfs_count(&hwfs_nm.commits[HWFS_COMMIT_REFUSED], 1);
	}
	return r;
}

/* The agent's HELLO hook: this node's engines, a new array (NULL without memory). */
static json_t *repl_engines(void *arg)
{
	struct daemon *d = arg;

	return engines_json(d->engines);
}

/* The agent's COMMIT: flip `current` to @version through the mount (daemon_commit.c). */
static int repl_flip_current(void *arg, const char *version, char *err, size_t errlen)
{
	return daemon_flip_current(arg, version, err, errlen);
}

static const struct agent_hooks repl_hooks = {
	.versions = repl_versions,
	.lookup = repl_lookup,
	.snapshot = repl_snapshot,
	.current = repl_current,
	.committable = repl_committable,
	.import = repl_import,
	.flip_current = repl_flip_current,
	.barrier = repl_barrier,
	.engines = repl_engines,
};

int daemon_join(struct daemon *d, const char *coordinator, struct agent **out)
{
	struct agent_opts ao = {
		.node = d->o->node,
		.listen = d->o->listen,
		.coordinator = coordinator,
		.keys = d->o->keys,
		.st = d->st,
		.hooks = &repl_hooks,
		.arg = d,
	};

	return agent_start(&ao, out);
}

/* A version was sealed here: the agent announces it to the coordinator (when joined). */
void daemon_repl_sealed(struct daemon *d, const char *name)
{
	struct agent *agent = daemon_agent(d);

	if (agent)
		agent_sealed(agent, name);
}
