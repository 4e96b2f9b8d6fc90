/*
 * daemon_ops.c — the control operations behind the `hwfs` verbs that need the
 * daemon (status, ls, seal, commit, cluster, verify, rm, gc, diff, manifest),
 * and the one table that names them.
 *
 * The table (ops[] below) is the one place that says which operation exists,
 * which handler answers it, whether it changes the node or is privileged
 * (then only root, the mount's owner or --ctl-group may call it, see
 * authorize() in daemon.c) and which request keys name an existing version
 * (names with the reserved prefix, the daemon's own staging, are refused
 * there for every operation).  daemon.c's connection threads dispatch through
 * it; publish lives in daemon_publish.c, commit in daemon_commit.c, and the
 * long-lived map, watch and engine in daemon_engine_ops.c.  Handlers run on control threads,
 * never inside a FUSE request, and hold no namespace lock while the kernel
 * calls back into the daemon (commit renames through the mount).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_i.h"
#include "devload.h"
#include "manifest.h"
#include "own_mount.h"
#include "names.h"
#include "tunables.h"

/* One version as shown by status and ls. */
static json_t *version_json(const struct ns_vinfo *v)
{
	json_t *errs = json_array();

	for (size_t i = 0; i < v->n_errors; i++)
		json_array_append_new(errs, json_pack("{s:s, s:s}", "file", v->errors[i].file,
						      "error", v->errors[i].error));
	return json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:o, s:o}", "name", v->name, "state",
			 hwfs_vstate_name(v->state), "seq", (json_int_t)v->seq, "bytes",
			 (json_int_t)v->bytes, "files", (json_int_t)v->files, "tensors",
			 (json_int_t)v->tensors, "digest",
			 v->state == HWFS_V_OPEN ? json_null() : hwfs_hash_json(&v->digest), "errors", errs);
}

static json_t *versions_json(struct daemon *d)
{
	json_t *arr = json_array();
	char **names = NULL;
	size_t n = 0;

	if (ns_list(d->ns, &names, &n) < 0)
		return arr;
	for (size_t i = 0; i < n; i++) {
		struct ns_vinfo vi;

		if (names[i] && ns_version_info(d->ns, names[i], &vi) == 0) {
			json_array_append_new(arr, version_json(&vi));
			ns_vinfo_free(&vi);
		}
		free(names[i]);
	}
	free(names);
	return arr;
}

/* ----------------------------------------------------------- operations */

/*
 * status's GPU fields into @r: "gpu" (gpu_json(): null without a usable GPU),
 * "gpu_note" (why there is none; "" when there is one), and under "store" how
 * the arena is pinned: "pinned" ("cuda" registered by --pin, "mlock" by --pin
 * without a GPU or by --preallocate, "none") and "pinned_bytes".
 */
static void status_gpu(struct daemon *d, json_t *r)
{
	struct arena *a = store_arena(d->st);
	json_t *st = json_object_get(r, "store"), *g = gpu_json(d->gpu);
	const char *mode = gpu_pin_mode(d->gpu);
	uint64_t pinned = gpu_pinned_bytes(d->gpu);

	if (!strcmp(mode, "none") && arena_locked(a)) {
		mode = "mlock"; /* --preallocate's own mlock */
		pinned = arena_capacity(a);
	}
	json_object_set_new(st, "pinned", json_string(mode));
	json_object_set_new(st, "pinned_bytes", json_integer((json_int_t)pinned));
	if (g) /* the device loads, inside the gpu object (null without a GPU) */
		json_object_set_new(g, "loads", devloads_json(d->loads) ?: json_array());
	json_object_set_new(r, "gpu", g ?: json_null());
	json_object_set_new(r, "gpu_note", json_string(gpu_why(d->gpu)));
}

static json_t *op_status(struct daemon *d, json_t *req, struct ctl_reader *rd,
			 const struct ctl_peer *peer)
{
	struct agent *agent = daemon_agent(d);
	struct ns_held held;
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
	if (d->http_addr[0])
		json_object_set_new(r, "http", json_string(d->http_addr));
	status_gpu(d, r);
	json_object_set_new(r, "engines", engines_json(d->engines) ?: json_array());
	json_object_set_new(r, "leases", engines_leases_json(d->engines) ?: json_array());
	json_object_set_new(r, "last_refused_commit", daemon_commit_status(d) ?: json_null());
	ns_held(d->ns, &held);
	json_object_set_new(r, "held", json_pack("{s:I, s:I, s:I, s:I}", "removed_files",
						 (json_int_t)held.removed_files, "removed_bytes",
						 (json_int_t)held.removed_bytes, "writing_files",
						 (json_int_t)held.writing_files, "writing_bytes",
						 (json_int_t)held.writing_bytes));
	json_object_set_new(r, "diffs", json_pack("{s:I}", "computed",
						  (json_int_t)daemon_diffs_computed(d->diffs)));
	if (agent) {
		json_t *rep = agent_counters(agent);

		json_object_set_new(r, "node", json_string(d->o->node));
		json_object_set_new(r, "coordinator",
				    json_string(d->coord_ep[0] ? d->coord_ep : d->o->join));
		json_object_set_new(r, "listen", json_string(agent_endpoint(agent)));
		if (rep)
			json_object_set_new(rep, "pulls", agent_pulls(agent) ?: json_array());
		json_object_set_new(r, "replication", rep ?: json_object());
	}
	return r;
}

static json_t *op_ls(struct daemon *d, json_t *req, struct ctl_reader *rd,
		     const struct ctl_peer *peer)
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

static json_t *op_seal(struct daemon *d, json_t *req, struct ctl_reader *rd,
		       const struct ctl_peer *peer)
{
	const char *v = daemon_req_str(req, "version");
	unsigned flags = json_is_true(json_object_get(req, "force")) ? NS_SEAL_FORCE : 0;
	char err[1024] = "";
	int r;

	if (!v)
		return daemon_err_reply(EINVAL, "seal: missing version");
	r = ns_seal(d->ns, v, NULL, flags, err, sizeof(err));
	if (r < 0)
		return daemon_err_reply(-r, "cannot seal %s: %s", v, err[0] ? err : seal_error(r));
	return daemon_ok_reply();
}

static json_t *op_cluster(struct daemon *d, json_t *req, struct ctl_reader *rd,
			  const struct ctl_peer *peer)
{
	struct agent *agent = daemon_agent(d);
	json_t *call, *res = NULL, *out;
	int r;

	if (!agent)
		return daemon_err_reply(ENOTCONN, "this node is not part of a cluster (mounted without "
				 "--join)");
	call = json_pack("{s:s}", "op", "cluster");
	r = agent_call(agent, call, &res, (int)hwfs_tun.status_wait_ms);
	json_decref(call);
	if (r < 0)
		return daemon_err_reply(-r, "the coordinator %s",
				 r == -EHOSTUNREACH ? "is unreachable" : "did not answer");
	out = json_pack("{s:b, s:O}", "ok", 1, "cluster", json_object_get(res, "cluster"));
	json_decref(res);
	return out;
}

/* bsearch comparator over hwfs_hash_t. */
static int cmp_hash(const void *a, const void *b)
{
	return hwfs_hash_cmp(a, b);
}

static json_t *op_verify(struct daemon *d, json_t *req, struct ctl_reader *rd,
			 const struct ctl_peer *peer)
{
	const char *v = daemon_req_str(req, "version");
	struct hwfs_vrec *rec = NULL;
	hwfs_hash_t *hs;
	size_t n = 0;
	uint64_t bytes = 0;
	json_t *bad, *res;
	int r;

	if (!v)
		return daemon_err_reply(EINVAL, "verify: missing version");
	bad = json_array();
	r = ns_snapshot(d->ns, v, &rec);
	if (r < 0) {
		json_decref(bad);
		return daemon_err_reply(-r, "cannot verify %s: %s", v,
				 r == -ENOENT ? "no such version" : strerror(-r));
	}
	hs = daemon_vrec_distinct_shards(rec, &n);
	for (size_t i = 0; hs && i < n; i++) {
		struct shard *sh = store_get(d->st, &hs[i]);
		hwfs_hash_t h;

		if (sh) {
			hwfs_hash_buf(store_shard_data(d->st, sh), sh->size, &h);
			bytes += sh->size;
			store_unref(d->st, sh);
		}
		if (!sh || hwfs_hash_cmp(&h, &hs[i]))
			json_array_append_new(bad, hwfs_hash_json(&hs[i]));
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

/*
 * Remove version @v (rm, gc), drop the kernel's entry of it and tell the
 * watchers ({"event": "removed"}).  A leased version's shards stay until the
 * lease ends (the map handler holds references).  Returns 0 or -errno.
 */
static int remove_and_invalidate(struct daemon *d, const char *v)
{
	int r = ns_remove_version(d->ns, v);

	if (r == 0) {
		fuse_lowlevel_notify_inval_entry(d->se, hwfs_fuse_ino(d->ns, ns_versions_dir(d->ns)),
						 v, strlen(v));
		engines_event(d->engines, "removed", v);
		devloads_removed(d->loads, v); /* device copies stay until unloaded */
		daemon_http_refresh(d);
	}
	return r;
}

static json_t *op_rm(struct daemon *d, json_t *req, struct ctl_reader *rd,
		     const struct ctl_peer *peer)
{
	const char *v = daemon_req_str(req, "version");
	int r;

	if (!v)
		return daemon_err_reply(EINVAL, "rm: missing version");
	r = remove_and_invalidate(d, v);
	if (r < 0)
		return daemon_err_reply(-r, "cannot remove %s: %s", v, rm_error(r));
	return daemon_ok_reply();
}

static json_t *op_gc(struct daemon *d, json_t *req, struct ctl_reader *rd,
		     const struct ctl_peer *peer)
{
	json_t *keep_j = json_object_get(req, "keep"), *removed = json_array();
	json_int_t keep = json_is_integer(keep_j) ? json_integer_value(keep_j) : -1;
	char **names = NULL, *cur = ns_current(d->ns);
	size_t n = 0, kept = 0;

	if (keep < 0) {
		free(cur);
		json_decref(removed);
		return daemon_err_reply(EINVAL, "gc: --keep N is required (N >= 0)");
	}
	ns_list(d->ns, &names, &n);
	/* newest first: keep the first @keep sealed ones, and current */
	for (size_t i = n; i-- > 0;) {
		enum hwfs_vstate state;
		int sealed;

		sealed = ns_version_state(d->ns, names[i], &state, NULL, NULL) == 0 &&
			 state != HWFS_V_OPEN;
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

/*
 * Add to @dup (name -> true) the tensor names of @v that two of its files
 * use; @first maps each name to the first file seen with it.
 */
static void shared_names(const struct hwfs_vrec *v, json_t *first, json_t *dup)
{
	for (size_t i = 0; i < v->n_files; i++)
		for (size_t j = 0; j < v->files[i].n_tensors; j++) {
			const char *name = v->files[i].tensors[j].name;
			json_t *f = json_object_get(first, name);

			if (!f)
				json_object_set_new(first, name, json_string(v->files[i].path));
			else if (strcmp(json_string_value(f), v->files[i].path))
				json_object_set_new(dup, name, json_true());
		}
}

/*
 * name -> (hash, len) of every tensor in a snapshot, as a jansson object; a
 * name in @dup (used by two files of A or of B) is qualified "name@path", as
 * in tensors/, so that each tensor is compared with the one of its own file.
 */
static json_t *tensor_map(const struct hwfs_vrec *v, json_t *dup)
{
	json_t *m = json_object();

	for (size_t i = 0; i < v->n_files; i++)
		for (size_t j = 0; j < v->files[i].n_tensors; j++) {
			const struct hwfs_trec *t = &v->files[i].tensors[j];
			char *q = NULL;

			if (json_object_get(dup, t->name) &&
			    asprintf(&q, "%s@%s", t->name, v->files[i].path) < 0)
				q = NULL;
			json_object_set_new(m, q ? q : t->name,
					    json_pack("{s:o, s:I}", "hash", hwfs_hash_json(&t->hash),
						      "len", (json_int_t)t->len));
			free(q);
		}
	return m;
}

static json_t *op_diff(struct daemon *d, json_t *req, struct ctl_reader *rd,
		       const struct ctl_peer *peer)
{
	const char *a = daemon_req_str(req, "a"), *b = daemon_req_str(req, "b");
	struct hwfs_vrec *va = NULL, *vb = NULL;
	json_t *ma, *mb, *changed, *added, *removed, *val, *res, *first, *dup;
	size_t same = 0, na = 0, nb = 0;
	uint64_t bytes_changed = 0, new_bytes = 0;
	hwfs_hash_t *ha = NULL, *hb = NULL;
	const char *key;
	int r;

	if (!a || !b)
		return daemon_err_reply(EINVAL, "diff: two versions needed");
	if (json_is_true(json_object_get(req, "elements")))
		return op_diff_elements(d, req, rd, peer);
	r = ns_snapshot(d->ns, a, &va);
	if (r == 0)
		r = ns_snapshot(d->ns, b, &vb);
	if (r < 0) {
		hwfs_vrec_free(va);
		return daemon_err_reply(-r, "cannot diff: %s: %s", va ? b : a,
				 r == -ENOENT ? "no such version" : strerror(-r));
	}
	first = json_object();
	dup = json_object();
	shared_names(va, first, dup);
	json_object_clear(first);
	shared_names(vb, first, dup);
	ma = tensor_map(va, dup);
	mb = tensor_map(vb, dup);
	json_decref(first);
	json_decref(dup);
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
	/* bytes of B's distinct shards that A does not have: what moving A -> B costs */
	ha = daemon_vrec_distinct_shards(va, &na);
	hb = daemon_vrec_distinct_shards(vb, &nb);
	for (size_t i = 0; hb && ha && i < nb; i++)
		if (!bsearch(&hb[i], ha, na, sizeof(*ha), cmp_hash)) {
			struct shard *sh = store_get(d->st, &hb[i]);

			if (sh) {
				new_bytes += sh->size;
				store_unref(d->st, sh);
			}
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
	free(hb);
	hwfs_vrec_free(va);
	hwfs_vrec_free(vb);
	return res;
}

static json_t *op_manifest(struct daemon *d, json_t *req, struct ctl_reader *rd,
			   const struct ctl_peer *peer)
{
	const char *v = daemon_req_str(req, "version");
	struct hwfs_vrec *rec = NULL;
	char *js = NULL;
	size_t len;
	json_t *res;
	int r;

	if (!v)
		return daemon_err_reply(EINVAL, "manifest: missing version");
	r = ns_snapshot(d->ns, v, &rec);
	if (r == 0 && rec->state == HWFS_V_OPEN)
		r = -EBUSY;
	if (r == 0)
		r = manifest_build(rec, &js, &len);
	hwfs_vrec_free(rec);
	if (r < 0)
		return daemon_err_reply(-r, "no manifest for %s: %s", v,
				 r == -ENOENT ? "no such version"
				 : r == -EBUSY ? "version is open" : strerror(-r));
	res = json_pack("{s:b, s:s%}", "ok", 1, "manifest", js, len);
	free(js);
	return res;
}

/* ----------------------------------------------------------- who may read a version */

/* daemon_peer_bits() for ns_version_readable(): @arg is the peer. */
static uint32_t peer_bits_of(void *arg, uint32_t mode, uint32_t uid, uint32_t gid)
{
	return daemon_peer_bits(arg, mode, uid, gid);
}

/*
 * May @p, who is not privileged, see the manifest of version @name (names,
 * sizes, modes, tensor names, shard hashes)?  Only when it could read all of
 * it through the mount: search the root and versions/, read every directory
 * and file of the version.  An unknown version is left to the handler (it
 * answers "no such version").  Returns 1 or 0.
 */
static int peer_may_read_version(struct daemon *d, const struct ctl_peer *p, const char *name)
{
	int r = ns_version_readable(d->ns, name, peer_bits_of, (void *)p);

	return r != 0; /* 1, or -ENOENT: unknown */
}

/* ----------------------------------------------------------- the table */

/*
 * Every control operation.  mutates: changes the store, the namespace or
 * `current` (verify records damage), so only root, the mount's owner or
 * --ctl-group may run it (docs/cli.md, "Permissions").  privileged: changes
 * nothing but needs the same callers (map hands out the arena, which holds
 * every version's bytes; a registered engine can hold up commits).  names:
 * the request keys that name an existing version; publish's "version" is a
 * new name, checked by publish itself.
 */
static const struct daemon_op ops[] = {
	/* name       handler      mutates privileged  names */
	{"status", op_status, 0, 0, {NULL, NULL}},
	{"ls", op_ls, 0, 0, {NULL, NULL}},
	{"seal", op_seal, 1, 0, {"version", NULL}},
	{"commit", daemon_op_commit, 1, 0, {"version", NULL}},
	{"publish", op_publish, 1, 0, {NULL, NULL}},
	{"verify", op_verify, 1, 0, {"version", NULL}},
	{"rm", op_rm, 1, 0, {"version", NULL}},
	{"gc", op_gc, 1, 0, {NULL, NULL}},
	{"diff", op_diff, 0, 0, {"a", "b"}},
	{"manifest", op_manifest, 0, 0, {"version", NULL}},
	{"cluster", op_cluster, 0, 0, {NULL, NULL}},
	/* long-lived (docs/engines.md): the connection stays open */
	{"map", op_map, 0, 1, {"version", NULL}},
	{"watch", op_watch, 0, 0, {NULL, NULL}},
	{"engine", op_engine, 0, 1, {NULL, NULL}},
	/* device shadow-load (docs/gpu.md): device memory and IPC handles, owner only */
	{"load", op_load, 0, 1, {"version", NULL}},
	{"unload", op_unload, 0, 1, {"version", NULL}},
	{"gpumap", op_gpumap, 0, 1, {"version", NULL}}, /* long-lived, like map */
};

/* The row of @name in ops[], or NULL. */
const struct daemon_op *daemon_op_find(const char *name)
{
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(ops); i++)
		if (!strcmp(ops[i].name, name))
			return &ops[i];
	return NULL;
}

/*
 * Run @op for @req.  A version name from the client that no version can have
 * (hwfs_valid_name: a control character, '/', empty, "." or "..") is refused
 * as EINVAL "invalid version name", as the CLI refuses it, for every
 * operation and without quoting it: "no such version" with the name echoed
 * sent its C1 controls back raw (JSON leaves them as they are).  A name
 * that starts with NS_HIDDEN_PREFIX names a staging version of the daemon (a
 * publish or a replicated version in progress): removing, sealing or reading
 * it under its writer would pull its nodes away, so it is refused here for
 * every operation, whether or not such a version exists.  A read-only operation
 * (diff, manifest) shows every name, size and shard hash of a version, so a
 * caller who is not privileged (daemon_peer_privileged) gets it only for a
 * version it could read whole through the mount.  Returns the reply.
 */
json_t *daemon_op_call(struct daemon *d, const struct daemon_op *op, json_t *req,
		       struct ctl_reader *rd, const struct ctl_peer *peer)
{
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(op->names) && op->names[i]; i++) {
		const char *v = daemon_req_str(req, op->names[i]);

		if (v && !hwfs_valid_name(v))
			return daemon_err_reply(EINVAL, "%s: invalid version name (1-%d bytes of UTF-8, "
						"no '/', no control character, not . or ..)", op->name,
						HWFS_NAME_MAX);
		if (v && ns_hidden_name(v))
			return daemon_err_reply(EINVAL, "%s %s: reserved name (%s* are the daemon's staging "
					 "versions)", op->name, v, NS_HIDDEN_PREFIX);
		if (v && !op->mutates && !daemon_peer_privileged(d, peer) &&
		    !peer_may_read_version(d, peer, v))
			return daemon_err_reply(EACCES, "permission denied: %s %s needs read access to every "
					 "file of %s", op->name, v, v);
	}
	return op->fn(d, req, rd, peer);
}
