/*
 * daemon_engine_ops.c — the long-lived control operations of docs/engines.md:
 * `map` (a read-only descriptor of the arena, the version's extents and
 * tensors, and a lease on its shards: daemon_lease.c), `watch` (events) and
 * `engine` (events, prepare, reports), on the engine registry
 * (engine_registry.c).  The hooks that feed the registry on seals and commits
 * are the namespace's (daemon_ns_hooks.c).
 *
 * Each operation runs on its connection's thread (daemon.c, conn_main): it
 * sends its first reply itself, then waits on the connection until the
 * client closes it (or dies: the kernel closes it) or shutdown shuts it down,
 * cleans up and returns NULL, so that nothing more is sent.  Reading is how
 * the end is noticed; what a map or watch client sends is read and dropped.
 * A map and an engine also end when the process that opened them exits,
 * even if a child it forked still holds the socket: they poll a pidfd of
 * the peer beside the connection (Linux 5.3+; without one, the connection
 * alone tells).  A lease outlives a stopping daemon: its references are not
 * dropped then (see op_map).
 *
 * Error replies carry "errno" (daemon_err_reply()), so that clients never guess
 * it from the sentence, which may quote their own version names.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon_i.h"
#include "names.h"

/* ----------------------------------------------------------- map */

/*
 * One regular file of a snapshot as `map` describes it: path, size, extents
 * [[file_off, len, arena_off], ...] (each extent is one whole shard, whose
 * reference is taken into @ml) and tensors.  Returns the object, or NULL with
 * *@r = -ENOENT (a shard is gone: the version was removed meanwhile), -EIO
 * (an extent that is not its whole shard) or -ENOMEM.
 */
static json_t *map_file(struct daemon *d, const struct hwfs_frec *f, struct map_lease *ml,
			int *r)
{
	json_t *ext = json_array(), *tens = json_array(), *out = NULL;
	size_t first = ml->n;

	*r = -ENOMEM;
	if (!ext || !tens)
		goto out;
	*r = daemon_map_lease_file(d, f, ml);
	if (*r < 0)
		goto out;
	*r = -ENOMEM;
	for (size_t i = 0; i < f->n_ext; i++) {
		const struct hwfs_extent *e = &f->ext[i];
		const struct shard *sh = ml->sh[first + i];

		if (json_array_append_new(ext, json_pack("[I, I, I]", (json_int_t)e->off,
							 (json_int_t)e->len, (json_int_t)sh->off)))
			goto out;
	}
	for (size_t i = 0; i < f->n_tensors; i++) {
		const struct hwfs_trec *t = &f->tensors[i];
		json_t *shape = json_array();

		for (uint32_t k = 0; shape && k < t->ndim; k++)
			json_array_append_new(shape, json_integer((json_int_t)t->shape[k]));
		if (!shape || json_array_append_new(tens, json_pack("{s:s, s:s, s:o, s:I, s:I, s:o}",
								   "name", t->name, "dtype",
								   t->dtype, "shape", shape, "off",
								   (json_int_t)t->off, "len",
								   (json_int_t)t->len, "hash",
								   hwfs_hash_json(&t->hash))))
			goto out;
	}
	out = json_pack("{s:s, s:I, s:O, s:O}", "path", f->path, "size", (json_int_t)f->size,
			"extents", ext, "tensors", tens);
	*r = out ? 0 : -ENOMEM;
out:
	json_decref(ext);
	json_decref(tens);
	return out;
}

/*
 * Open the arena file read-only for a client: by its path in the store (not
 * a dup of our read-write descriptor), checked to be the very file the
 * daemon maps.  Returns the descriptor or -errno.
 */
static int open_arena_ro(struct daemon *d)
{
	char path[4096];
	struct stat a, b;
	int fd;

	snprintf(path, sizeof(path), "%s/arena", store_dir(d->st));
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &a) < 0 || fstat(arena_fd(store_arena(d->st)), &b) < 0 ||
	    a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
		close(fd);
		return -ESTALE;
	}
	return fd;
}

/*
 * op_map() - {"op": "map", "version": V}: a sealed, intact version's layout
 * in the arena and a read-only descriptor of the arena, and a lease on its
 * shards until the connection closes or the process that opened it exits
 * (docs/engines.md).  The references are taken before the reply, so the bytes
 * the client is told about can never be freed or reused while it may read
 * them.  When the daemon is stopping the references are kept, not dropped:
 * dropping the last one of a removed version's shard would punch its pages
 * out of the arena file under the client's mapping, while keeping them costs
 * nothing (the process exits; store_close() frees the shards without giving
 * their ranges back).  Returns an error reply (with "errno"), NULL when the
 * caller is gone before the reply, or NULL once the lease ended (the reply
 * was sent here).
 */
json_t *op_map(struct daemon *d, json_t *req, struct ctl_reader *rd, const struct ctl_peer *peer)
{
	const char *v = daemon_req_str(req, "version");
	struct map_lease ml = {NULL, 0};
	struct hwfs_vrec *rec = NULL;
	struct lease *l = NULL;
	json_t *files = NULL, *res = NULL;
	char err[512];
	int afd = -1, pidfd = -1, r;

	if (!v)
		return daemon_err_reply(EINVAL, "map: missing version");
	r = ns_check_committable(d->ns, v, NULL, err, sizeof(err));
	if (r < 0)
		return daemon_err_reply(-r, "cannot map %s: %s", v, err);
	pidfd = daemon_peer_pidfd(peer->pid);
	if (pidfd == -ESRCH)
		return NULL; /* the caller is gone: nobody to lease to */
	r = ns_snapshot(d->ns, v, &rec);
	if (r == 0 && rec->state != HWFS_V_SEALED)
		r = rec->state == HWFS_V_OPEN ? -EBUSY : -EIO; /* changed meanwhile */
	if (r < 0)
		goto fail;
	r = daemon_map_lease_init(&ml, rec);
	files = json_array();
	if (r == 0 && !files)
		r = -ENOMEM;
	for (size_t i = 0; r == 0 && i < rec->n_files; i++) {
		json_t *f;

		if (rec->files[i].kind != HWFS_K_REG)
			continue;
		f = map_file(d, &rec->files[i], &ml, &r);
		if (f)
			json_array_append_new(files, f);
	}
	if (r < 0)
		goto fail;
	afd = open_arena_ro(d);
	if (afd < 0) {
		r = afd;
		goto fail;
	}
	r = engines_lease_add(d->engines, v, peer->pid, &l);
	if (r < 0)
		goto fail;
	res = json_pack("{s:b, s:s, s:o, s:I, s:I, s:O}", "ok", 1, "version", v, "digest",
			hwfs_hash_json(&rec->digest), "arena_size",
			(json_int_t)arena_capacity(store_arena(d->st)), "page_size",
			(json_int_t)sysconf(_SC_PAGESIZE), "files", files);
	if (!res) {
		r = -ENOMEM;
		goto fail;
	}
	r = ctl_send_fd(rd->fd, res, afd);
	json_decref(res);
	res = NULL;
	close(afd);
	afd = -1;
	/* the lease lives as long as the connection and the process that opened it */
	if (r == 0 && daemon_wait_for_close(rd->fd, pidfd) == -ESRCH)
		LOG_INFO("engines: lease of %s ended: its process %d exited (a child of it may still "
			 "hold the connection)", v, (int)peer->pid);
	goto out;
fail:
	res = daemon_err_reply(-r, "cannot map %s: %s", v,
			r == -ENOENT   ? "no such version (it was removed)"
			: r == -EBUSY  ? "version is open (not sealed)"
			: r == -EIO    ? "version is damaged"
			: r == -ESTALE ? "the arena file in the store was replaced"
				       : strerror(-r));
out:
	if (afd >= 0)
		close(afd);
	if (pidfd >= 0)
		close(pidfd);
	engines_lease_del(d->engines, l);
	if (__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE)) {
		free(ml.sh); /* keep the references: the bytes stay under the client's mapping */
		ml.sh = NULL;
	} else {
		daemon_map_lease_drop(d, &ml);
	}
	json_decref(files);
	hwfs_vrec_free(rec);
	return res;
}

/* ----------------------------------------------------------- watch, engine */

/*
 * Register the connection as a watcher (@name NULL) or engine @name and keep
 * it until it ends: until the client closes it, shutdown shuts it down, or,
 * for an engine, the process that registered exits (pidfd; a child that
 * inherited the socket does not keep an engine alive).  An engine's lines are
 * its reports (at most CTL_MAX_REQUEST bytes each), read only when the
 * connection is readable, so the pidfd is watched between any two reads.  A
 * line that is not JSON is ignored (the first one is logged); a longer one
 * ends the connection, since the stream cannot be read on after it.  Returns
 * an error reply (with "errno"), or NULL when the connection ended after the
 * first reply (or the caller was gone before it).
 */
static json_t *watch_conn(struct daemon *d, struct ctl_reader *rd, const struct ctl_peer *peer,
			  const char *name, int gpu)
{
	struct watcher *w = NULL;
	json_t *res = NULL;
	int pidfd = name ? daemon_peer_pidfd(peer->pid) : -1, logged = 0, r;

	if (pidfd == -ESRCH)
		return NULL; /* the engine's process is gone already */
	r = engines_watch_gpu(d->engines, rd->fd, peer->pid, name, gpu, &w);
	if (r == -EINVAL)
		res = daemon_err_reply(EINVAL, "invalid engine name (1-%d characters of A-Z a-z 0-9 . _ -)",
				HWFS_ENGINE_NAME_MAX);
	else if (r == -EEXIST)
		res = daemon_err_reply(EEXIST, "an engine named %s is already registered on this node",
				name);
	else if (r == -ENOMEM)
		res = daemon_err_reply(ENOMEM, "out of memory");
	if (r < 0) /* any other error: the client is gone already */
		goto close;
	if (!name) {
		daemon_wait_for_close(rd->fd, -1);
		goto out;
	}
	rd->max = CTL_MAX_REQUEST;
	for (;;) {
		json_t *msg = NULL;

		if (!ctl_reader_has_line(rd)) {
			ssize_t n;

			if (daemon_wait_conn(rd->fd, pidfd) == -ESRCH) {
				LOG_INFO("engines: engine %s unregistered: its process %d exited (a "
					 "child of it may still hold the connection)", name,
					 (int)peer->pid);
				break;
			}
			n = ctl_reader_fill(rd);
			if (n == -EMSGSIZE)
				LOG_WARN("engines: engine %s (pid %d) sent a line over %u bytes; "
					 "dropped", name, (int)peer->pid, CTL_MAX_REQUEST);
			if (n <= 0)
				break; /* EOF, shutdown, or the line above */
			continue;
		}
		r = ctl_recv(rd, &msg); /* a whole line is buffered: no read */
		if (r == 0) {
			engines_report(d->engines, w, msg);
			json_decref(msg);
			continue;
		}
		if (r == -EBADMSG) {
			if (!logged++)
				LOG_WARN("engines: engine %s (pid %d) sent a line that is not a JSON "
					 "object; ignored (later ones silently)", name, (int)peer->pid);
			continue;
		}
		break; /* out of memory */
	}
out:
	engines_unwatch(d->engines, w);
close:
	if (pidfd >= 0)
		close(pidfd);
	return res;
}

/* op_watch() - {"op": "watch"}: events until the connection closes (docs/engines.md). */
json_t *op_watch(struct daemon *d, json_t *req, struct ctl_reader *rd, const struct ctl_peer *peer)
{
	return watch_conn(d, rd, peer, NULL, -1);
}

/*
 * op_engine() - {"op": "engine", "name": N}: register engine N on this node
 * until the connection closes; its reports feed the commit barrier.  With
 * "gpu": G, its readiness is the device load of the version on GPU G
 * instead (daemon_gpu.c, docs/gpu.md).
 */
json_t *op_engine(struct daemon *d, json_t *req, struct ctl_reader *rd,
		  const struct ctl_peer *peer)
{
	const char *name = daemon_req_str(req, "name");
	int gpu;

	if (!name)
		return daemon_err_reply(EINVAL, "engine: missing name");
	if (daemon_req_gpu(req, 1, &gpu) < 0)
		return daemon_err_reply(EINVAL, "engine: \"gpu\" must be a device index (an integer "
				 "0-%d)", DAEMON_GPU_MAX);
	return watch_conn(d, rd, peer, name, gpu);
}
