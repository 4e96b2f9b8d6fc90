/*
 * daemon_gpu.c — the control operations of device shadow-load (docs/gpu.md):
 * `load` (copy a sealed version into device memory, with progress lines),
 * `unload`, `gpumap` (long-lived: the IPC handles and tensor layout of a
 * loaded version, one reference for the life of the connection), and the
 * engines' device-load hook that makes an engine registered with a GPU ready
 * when the version is resident (the commit barrier, engine_registry.h).
 *
 * The table of loads and the copy are gpu/devload.c; this file finds the
 * bytes: a snapshot of the sealed version, a reference on every shard it
 * uses (held while the copy reads them, so rm or gc cannot free them), and
 * for each tensor of each safetensors file (file then offset order) its
 * pieces in the arena, one per extent it crosses.
 *
 * Threads: load runs on its connection's thread; a load the barrier asks for
 * runs in a detached worker (devloads_worker_enter/exit: shutdown waits for
 * it).  Whichever thread ran it wakes the barrier (engines_kick()) when a
 * load ends, loaded or failed: a commit may wait on a manual `hwfs load`.  The hook runs
 * under the registry lock, so it only looks and starts: never copies.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cudart.h"
#include "daemon_i.h"
#include "devload.h"
#include "gpu.h"
#include "names.h"
#include "tunables.h"

/*
 * Can device @gpu be used at all?  Returns 0, or -ENODEV with the reason in
 * @err ("no CUDA device: ...", "this node has 1 GPU").
 */
static int gpu_usable(struct daemon *d, int gpu, char *err, size_t errlen)
{
	int n = gpu_devices(d->gpu);

	if (!gpu_runtime(d->gpu)) {
		snprintf(err, errlen, "%s", gpu_why(d->gpu)[0] ? gpu_why(d->gpu) : "no CUDA device");
		return -ENODEV;
	}
	if (gpu >= n) {
		snprintf(err, errlen, "this node has %d GPU%s", n, n == 1 ? "" : "s");
		return -ENODEV;
	}
	return 0;
}

/* The seq of sealed version @v in *@seq.  Returns 0 or -ENOENT. */
static int sealed_seq(struct daemon *d, const char *v, uint64_t *seq)
{
	return ns_version_state(d->ns, v, NULL, seq, NULL);
}

/* ----------------------------------------------------------- the source */

/* What a load copies from, and the shard references it holds meanwhile. */
struct load_src {
	struct devload_src s;
	struct map_lease ml;
	uint64_t *lens;
	size_t *piece_at;
	struct devload_piece *pieces;
	json_t *tensors;
	struct hwfs_vrec *rec;
};

static void load_src_free(struct daemon *d, struct load_src *ls)
{
	if (ls->ml.sh)
		daemon_map_lease_drop(d, &ls->ml);
	free(ls->lens);
	free(ls->piece_at);
	free(ls->pieces);
	json_decref(ls->tensors);
	hwfs_vrec_free(ls->rec);
	memset(ls, 0, sizeof(*ls));
}

/* The layout object of tensor @t of file @f, without bucket and offset. */
static json_t *tensor_json(const struct hwfs_frec *f, const struct hwfs_trec *t)
{
	json_t *shape = json_array();

	for (uint32_t k = 0; shape && k < t->ndim; k++)
		json_array_append_new(shape, json_integer((json_int_t)t->shape[k]));
	if (!shape)
		return NULL;
	return json_pack("{s:s, s:s, s:s, s:o, s:I, s:o}", "name", t->name, "file", f->path,
			 "dtype", t->dtype, "shape", shape, "len", (json_int_t)t->len, "hash",
			 hwfs_hash_json(&t->hash));
}

/*
 * Build the source of a load of sealed version @v, seq @seq (the one its
 * table entry was begun with): snapshot, references on its shards, every
 * tensor's length, pieces and layout.  Returns 0, -EAGAIN when @v is
 * another version by now (removed and published again since the entry was
 * begun), or -ENOENT/-EBUSY/-EIO/-ENOMEM with the sentence in @err (as map
 * says them).
 */
static int load_src_make(struct daemon *d, const char *v, uint64_t seq, struct load_src *ls,
			 char *err, size_t errlen)
{
	size_t nt = 0, npmax = 0, np = 0, k = 0, extmax = 0;
	uint64_t *ext_at = NULL;
	int r;

	memset(ls, 0, sizeof(*ls));
	r = ns_check_committable(d->ns, v, NULL, err, errlen);
	if (r < 0)
		return r;
	r = ns_snapshot(d->ns, v, &ls->rec);
	if (r == 0 && ls->rec->seq != seq) { /* the entry would name one, the bytes another */
		snprintf(err, errlen, "%s changed while loading (removed and made again); try again",
			 v);
		r = -EAGAIN;
		goto fail_said;
	}
	if (r == 0 && ls->rec->state != HWFS_V_SEALED)
		r = ls->rec->state == HWFS_V_OPEN ? -EBUSY : -EIO; /* changed meanwhile */
	if (r == 0)
		r = daemon_map_lease_init(&ls->ml, ls->rec);
	for (size_t i = 0; r == 0 && i < ls->rec->n_files; i++) {
		const struct hwfs_frec *f = &ls->rec->files[i];

		if (f->kind != HWFS_K_REG)
			continue;
		nt += f->n_tensors;
		/* a tensor crosses at most all extents; pieces of all tensors: tensors + extents */
		npmax += f->n_tensors + f->n_ext;
		extmax = HWFS_MAX(extmax, f->n_ext);
	}
	if (r < 0)
		goto fail;
	ls->lens = calloc(nt ? nt : 1, sizeof(*ls->lens));
	ls->piece_at = calloc(nt + 1, sizeof(*ls->piece_at));
	ls->pieces = calloc(npmax ? npmax : 1, sizeof(*ls->pieces));
	ls->tensors = json_array();
	ext_at = calloc(extmax ? extmax : 1, sizeof(*ext_at));
	if (!ls->lens || !ls->piece_at || !ls->pieces || !ls->tensors || !ext_at) {
		r = -ENOMEM;
		goto fail;
	}
	for (size_t i = 0; i < ls->rec->n_files; i++) {
		const struct hwfs_frec *f = &ls->rec->files[i];
		size_t first = ls->ml.n, e0 = 0;

		if (f->kind != HWFS_K_REG)
			continue;
		r = daemon_map_lease_file(d, f, &ls->ml);
		if (r < 0)
			goto fail;
		for (size_t e = 0; e < f->n_ext; e++)
			ext_at[e] = ls->ml.sh[first + e]->off;
		for (size_t j = 0; j < f->n_tensors; j++, k++) {
			const struct hwfs_trec *t = &f->tensors[j];
			json_t *tj;

			ls->piece_at[k] = np;
			ls->lens[k] = t->len;
			r = devload_tensor_pieces(f, ext_at, t, &e0, ls->pieces, npmax, &np);
			if (r == -E2BIG) { /* only a peer's manifest could say so: refuse it */
				snprintf(err, errlen, "version is damaged: the tensors of %s overlap",
					 f->path);
				r = -EIO;
				goto fail_said;
			}
			if (r < 0)
				goto fail;
			tj = tensor_json(f, t);
			if (!tj || json_array_append_new(ls->tensors, tj)) {
				r = -ENOMEM;
				goto fail;
			}
		}
	}
	ls->piece_at[k] = np;
	ls->s = (struct devload_src){
		.arena_base = arena_base(store_arena(d->st)),
		.n_tensors = nt,
		.lens = ls->lens,
		.piece_at = ls->piece_at,
		.pieces = ls->pieces,
		.tensors = ls->tensors,
		.digest = ls->rec->digest,
		.pinned = !strcmp(gpu_pin_mode(d->gpu), "cuda"),
	};
	free(ext_at);
	return 0;
fail:
	snprintf(err, errlen, "%s", r == -ENOENT ? "no such version (it was removed)"
				    : r == -EBUSY ? "version is open (not sealed)"
				    : r == -EIO   ? "version is damaged"
						  : strerror(-r));
fail_said:
	free(ext_at);
	load_src_free(d, ls);
	return r;
}

/*
 * Fill entry @l (devloads_begin() of @v, @seq, on device @gpu) with version
 * @v: source, copy, references dropped; the device is marked used (status may
 * then ask its memory).  Returns 0 (*@summary: load's figures) or -errno with
 * @err.
 */
static int load_entry(struct daemon *d, struct devload *l, const char *v, uint64_t seq, int gpu,
		      devload_progress_fn progress, void *arg, json_t **summary, char *err,
		      size_t errlen)
{
	struct load_src ls;
	int r = load_src_make(d, v, seq, &ls, err, errlen);

	if (r < 0) {
		devloads_fail(d->loads, l, err);
		return r;
	}
	gpu_mark_used(d->gpu, gpu); /* the copy makes a context there: status may ask it */
	r = devloads_run(d->loads, l, &ls.s, (unsigned)hwfs_tun.gpu_mem_pct,
			 (int)hwfs_tun.gpu_streams, hwfs_tun.gpu_bucket_bytes, progress, arg,
			 summary, err, errlen);
	load_src_free(d, &ls);
	return r;
}

/* ----------------------------------------------------------- load */

/*
 * Progress lines of a load on its connection, as publish sends them (at most
 * 10 a second).  They are sent on the copying thread, so they never block
 * it: a line the socket cannot take now is dropped (the client misses one
 * update).  A line the socket took only part of is finished, waiting at most
 * LOAD_PROGRESS_FINISH_MS; a client that does not read even then loses its
 * connection (the load goes on; its reply has nowhere to go).
 */
#define LOAD_PROGRESS_FINISH_MS 1000

struct load_progress {
	int fd;
	double last;
	int dead; /* the connection was shut down: no more lines */
};

/* The rest of a line sent in part: 0, or -ETIMEDOUT/-errno (then the connection is shut). */
static int progress_finish(int fd, const char *s, size_t len)
{
	double until = hwfs_mono_s() + LOAD_PROGRESS_FINISH_MS / 1000.0;

	while (len) {
		struct pollfd pf = {.fd = fd, .events = POLLOUT};
		double left = until - hwfs_mono_s();
		ssize_t n;

		if (left <= 0)
			return -ETIMEDOUT;
		if (poll(&pf, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR)
			return -errno;
		n = send(fd, s, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			continue;
		if (n < 0)
			return -errno;
		s += n;
		len -= (size_t)n;
	}
	return 0;
}

static void load_progress(void *arg, uint64_t done, uint64_t total)
{
	struct load_progress *p = arg;
	double now = hwfs_mono_s();
	char line[128];
	ssize_t n;
	int len;

	if (p->dead || (done < total && now - p->last < 0.1))
		return;
	p->last = now;
	len = snprintf(line, sizeof(line), "{\"progress\":{\"done\":%llu,\"total\":%llu}}\n",
		       (unsigned long long)done, (unsigned long long)total);
	n = send(p->fd, line, (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (n < 0 || n == len)
		return; /* sent, or dropped (full: EAGAIN), or the peer went (the reply says) */
	if (progress_finish(p->fd, line + n, (size_t)(len - n)) < 0) {
		LOG_WARN("gpu: a load's client does not read its progress lines: connection closed "
			 "(the load goes on)");
		shutdown(p->fd, SHUT_RDWR);
		p->dead = 1;
	}
}

/* load's error reply: "cannot load V on GPU N: <why>" with "errno": @r. */
static json_t *load_error(const char *v, int gpu, int r, const char *why)
{
	return daemon_err_reply(-r, "cannot load %s on GPU %d: %s", v, gpu, why);
}

/*
 * op_load() - {"op": "load", "version": V, "gpu": N}: copy sealed version V
 * into device N (docs/gpu.md), sending progress lines, then the reply
 * {"ok", "version", "gpu", "bytes", "tensors", "buckets", "seconds",
 * "source", "already"}.  A version loaded there already answers at once
 * ("already": true); one being loaded is waited for.
 */
static json_t *load(struct daemon *d, json_t *req, struct ctl_reader *rd,
		    const struct ctl_peer *peer)
{
	const char *v = daemon_req_str(req, "version");
	struct load_progress lp = {rd->fd, 0, 0};
	struct devload *l = NULL;
	json_t *sum = NULL, *res;
	char err[1024];
	uint64_t seq = 0;
	int gpu, r, already = 0;

	if (!v)
		return daemon_err_reply(EINVAL, "load: missing version");
	if (daemon_req_gpu(req, 0, &gpu) < 0)
		return daemon_err_reply(EINVAL, "load: \"gpu\" must be a device index (an integer "
				 "0-%d)", DAEMON_GPU_MAX);
	/* the version first, then the device: an open, damaged or missing version is
	 * refused the same way with or without a GPU */
	r = ns_check_committable(d->ns, v, NULL, err, sizeof(err));
	if (r == 0)
		r = sealed_seq(d, v, &seq);
	if (r < 0)
		return load_error(v, gpu, r, r == -ENOENT ? "no such version" : err);
	r = gpu_usable(d, gpu, err, sizeof(err));
	if (r < 0)
		return load_error(v, gpu, r, err);
	r = devloads_begin(d->loads, v, seq, gpu, 0, &l);
	if (r == 0) {
		r = load_entry(d, l, v, seq, gpu, load_progress, &lp, &sum, err, sizeof(err));
		/* a commit barrier may be waiting on this very load: it ended, either way */
		engines_kick(d->engines);
	} else if (r == -EALREADY || r == -EINPROGRESS) {
		already = 1;
		r = devloads_wait(d->loads, v, gpu, &sum, err, sizeof(err));
		if (r == -ECANCELED)
			r = -EIO;
	} else if (r == -EEXIST) {
		snprintf(err, sizeof(err), "GPU %d holds an earlier %s (removed since): unload it "
			 "first (hwfs unload %s --gpu %d)", gpu, v, v, gpu);
	} else {
		snprintf(err, sizeof(err), "%s", r == -ESHUTDOWN ? "the daemon is shutting down"
								: strerror(-r));
	}
	if (r < 0)
		return load_error(v, gpu, r, err);
	if (!sum)
		return load_error(v, gpu, -ENOMEM, "out of memory");
	LOG_INFO("gpu: %s %s on GPU %d", v, already ? "was loaded already" : "loaded", gpu);
	res = json_pack("{s:b, s:s, s:i, s:b}", "ok", 1, "version", v, "gpu", gpu, "already",
			already);
	if (res)
		json_object_update(res, sum);
	json_decref(sum);
	return res;
}

/* ----------------------------------------------------------- unload */

/*
 * op_unload() - {"op": "unload", "version": V, "gpu": N} (N absent or -1:
 * every device): {"ok", "freed_bytes", "pending_maps"}; not loaded: ENOENT.
 */
json_t *op_unload(struct daemon *d, json_t *req, struct ctl_reader *rd,
		  const struct ctl_peer *peer)
{
	const char *v = daemon_req_str(req, "version");
	uint64_t freed = 0, pending = 0;
	char where[64];
	int gpu, r;

	if (!v)
		return daemon_err_reply(EINVAL, "unload: missing version");
	if (daemon_req_gpu(req, 1, &gpu) < 0)
		return daemon_err_reply(EINVAL, "unload: \"gpu\" must be a device index (an integer "
				 "0-%d) or -1 for every device", DAEMON_GPU_MAX);
	if (gpu >= 0)
		snprintf(where, sizeof(where), "on GPU %d", gpu);
	else
		snprintf(where, sizeof(where), "on any GPU");
	r = devloads_unload(d->loads, v, gpu, &freed, &pending);
	if (r == -ENOENT)
		return daemon_err_reply(ENOENT, "cannot unload %s: it is not loaded %s", v, where);
	if (r == -EBUSY)
		return daemon_err_reply(EBUSY, "cannot unload %s: it is being loaded %s; unload it "
				 "when the load ends", v, where);
	LOG_INFO("gpu: %s unloaded %s (%llu bytes freed, %llu map(s) pending)", v, where,
		 (unsigned long long)freed, (unsigned long long)pending);
	return json_pack("{s:b, s:I, s:I}", "ok", 1, "freed_bytes", (json_int_t)freed,
			 "pending_maps", (json_int_t)pending);
}

/* ----------------------------------------------------------- gpumap */

/*
 * op_gpumap() - {"op": "gpumap", "version": V, "gpu": N}: the buckets' IPC
 * handles and the tensor layout of V loaded on device N, and a reference
 * that keeps that device memory until the connection closes or the process
 * that opened it exits (like map's lease).  Returns an error reply (with
 * "errno"), or NULL once the connection ended (the reply was sent here).
 */
json_t *op_gpumap(struct daemon *d, json_t *req, struct ctl_reader *rd,
		  const struct ctl_peer *peer)
{
	const char *v = daemon_req_str(req, "version");
	struct devload *ref = NULL;
	json_t *res = NULL;
	char err[512];
	int gpu, pidfd, r;

	if (!v)
		return daemon_err_reply(EINVAL, "gpumap: missing version");
	if (daemon_req_gpu(req, 0, &gpu) < 0)
		return daemon_err_reply(EINVAL, "gpumap: \"gpu\" must be a device index (an integer "
				 "0-%d)", DAEMON_GPU_MAX);
	r = gpu_usable(d, gpu, err, sizeof(err));
	if (r < 0)
		return daemon_err_reply(-r, "cannot map %s on GPU %d: %s", v, gpu, err);
	pidfd = daemon_peer_pidfd(peer->pid);
	if (pidfd == -ESRCH)
		return NULL; /* the caller is gone: nobody to hold it for */
	r = devloads_map(d->loads, v, gpu, &res, &ref);
	if (r < 0) {
		if (pidfd >= 0)
			close(pidfd);
		if (r == -ENOENT)
			return daemon_err_reply(ENOENT, "%s is not loaded on GPU %d (hwfs load %s --gpu "
					 "%d)", v, gpu, v, gpu);
		return daemon_err_reply(-r, "cannot map %s on GPU %d: %s", v, gpu, strerror(-r));
	}
	{
		/* the device's PCI bus id: the client finds it in its own numbering */
		struct cudart *rt = gpu_runtime(d->gpu);
		char pci[64] = "";

		if (rt && rt->DeviceGetPCIBusId(pci, (int)sizeof(pci) - 1, gpu) == CUDART_SUCCESS &&
		    pci[0]) {
			for (char *p = pci; *p; p++)
				*p = (char)tolower((unsigned char)*p);
			json_object_set_new(res, "pci", json_string(pci));
		}
	}
	r = ctl_send(rd->fd, res);
	json_decref(res);
	/* the reference lives as long as the connection and the process that opened it */
	if (r == 0 && daemon_wait_for_close(rd->fd, pidfd) == -ESRCH)
		LOG_INFO("gpu: map of %s on GPU %d ended: its process %d exited", v, gpu,
			 (int)peer->pid);
	if (pidfd >= 0)
		close(pidfd);
	devloads_unmap(d->loads, ref);
	return NULL;
}

/* ----------------------------------------------------------- the barrier's hook */

/*
 * `current` moved (daemon_current()): the loads the barrier made of other
 * versions go (docs/gpu.md, "Commit barrier with device loads"): one an
 * engine still maps is freed when its last map ends; manual loads stay.
 */
void daemon_gpu_current(struct daemon *d)
{
	char *cur;
	uint64_t freed = 0;
	size_t n;

	if (!d->loads)
		return;
	cur = ns_current(d->ns);
	n = devloads_unload_auto(d->loads, cur, &freed);
	if (n)
		LOG_INFO("gpu: current is %s: unloaded %zu load(s) the commit barrier made of other "
			 "versions (%llu bytes freed now; mapped ones when their last map ends)",
			 cur ? cur : "(none)", n, (unsigned long long)freed);
	free(cur);
}

/* A load the barrier started, for its worker thread. */
struct gpu_job {
	struct daemon *d;
	struct devload *l;
	char *version;
	uint64_t seq;
	int gpu;
};

/* The worker: copy, log, wake the barrier, leave. */
static void *gpu_job_main(void *arg)
{
	struct gpu_job *j = arg;
	struct daemon *d = j->d;
	char err[1024];
	int r;

	r = load_entry(d, j->l, j->version, j->seq, j->gpu, NULL, NULL, NULL, err, sizeof(err));
	if (r < 0)
		LOG_WARN("gpu: loading %s on GPU %d for the commit barrier failed: %s", j->version,
			 j->gpu, err);
	else
		LOG_INFO("gpu: %s loaded on GPU %d for the commit barrier", j->version, j->gpu);
	engines_kick(d->engines);
	free(j->version);
	free(j);
	devloads_worker_exit(d->loads);
	return NULL;
}

/*
 * The engines' device-load hook (engines_set_gpu_hook()), under the registry
 * lock: is @version resident on @gpu?  0 yes; -EINPROGRESS while a worker
 * loads it (started here when none does, or when the last load failed before
 * the barrier began at @started_ns); -ECANCELED with the reason in @err when
 * it cannot be (no GPU, no such device, the load failed during this barrier).
 */
int daemon_gpu_ready(void *arg, const char *version, int gpu, uint64_t started_ns, char *err,
		     size_t errlen)
{
	struct daemon *d = arg;
	struct gpu_job *j = NULL;
	struct devload *l = NULL;
	pthread_t t;
	uint64_t seq = 0;
	int r;

	if (gpu_usable(d, gpu, err, errlen) < 0)
		return -ECANCELED;
	if (sealed_seq(d, version, &seq) < 0) {
		snprintf(err, errlen, "no such version");
		return -ECANCELED;
	}
	r = devloads_ready(d->loads, version, seq, gpu, started_ns, err, errlen);
	if (r != -ENOENT)
		return r;
	if (devloads_worker_enter(d->loads) < 0) {
		snprintf(err, errlen, "the daemon is shutting down");
		return -ECANCELED;
	}
	r = devloads_begin(d->loads, version, seq, gpu, 1, &l);
	if (r != 0) {
		devloads_worker_exit(d->loads);
		if (r == -EALREADY || r == -EINPROGRESS)
			return r == -EALREADY ? 0 : -EINPROGRESS;
		snprintf(err, errlen, "%s", r == -EEXIST ? "an earlier version of that name is "
							   "loaded (removed since): unload it first"
					    : r == -ESHUTDOWN ? "the daemon is shutting down"
							      : strerror(-r));
		return -ECANCELED;
	}
	j = calloc(1, sizeof(*j));
	if (j && (j->version = strdup(version))) {
		j->d = d;
		j->l = l;
		j->seq = seq;
		j->gpu = gpu;
		if (pthread_create(&t, NULL, gpu_job_main, j) == 0) {
			pthread_detach(t);
			LOG_INFO("gpu: loading %s on GPU %d for the commit barrier", version, gpu);
			return -EINPROGRESS;
		}
		free(j->version);
	}
	free(j);
	devloads_fail(d->loads, l, "cannot start the loading thread");
	devloads_worker_exit(d->loads);
	snprintf(err, errlen, "cannot start the loading thread");
	return -ECANCELED;
}

/* `hwfs load`, counted for /metrics: the node is "updating" meanwhile (readyz). */
json_t *op_load(struct daemon *d, json_t *req, struct ctl_reader *rd, const struct ctl_peer *peer)
{
	json_t *res;

	hwfs_count(&hwfs_nm.updating, 1);
	res = load(d, req, rd, peer);
	__atomic_fetch_sub(&hwfs_nm.updating, 1, __ATOMIC_RELAXED);
	return res;
}
