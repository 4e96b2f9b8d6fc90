/*
 * daemon_i.h — private declarations shared by the files of the daemon.  In
 * call order (each file calls only those after it):
 *   daemon.c             the life of one node: start-up, shutdown, FUSE session,
 *                        control socket and its connections
 *   daemon_ns_hooks.c    the namespace's seal and current hooks
 *   daemon_ops.c         the table of control operations, the short handlers
 *   daemon_repl.c        the replication adapter: every hook the agent is
 *                        handed (struct agent_hooks), daemon_join, the seal
 *                        announcement
 *   daemon_commit.c      `hwfs commit`, the flip of `current`
 *   daemon_publish.c     `hwfs publish`
 *   daemon_diff.c        `hwfs diff --elements`
 *   daemon_engine_ops.c  map, watch and engine: the long-lived operations of
 *                        docs/engines.md
 *   daemon_gpu.c         load, unload, gpumap (docs/gpu.md), the barrier's
 *                        device-load hook
 *   daemon_lease.c       leases on shards, the end of a long-lived connection
 *   daemon_http.c        /metrics, /healthz, /readyz
 *   daemon_req.c         replies, request members, peers
 *   engine_registry.c    the registry of watchers, engines and leases
 *                        (engine_registry.h), own_mount.c (own_mount.h)
 * Nothing outside those files includes it; the public API is daemon.h.
 */
#ifndef HWFS_DAEMON_I_H
#define HWFS_DAEMON_I_H

#include "agent.h"
#include "coord.h"
#include "ctl.h"
#include "daemon.h"
#include "engine_registry.h"
#include "fuse_ops.h"
#include "gpu.h"
#include "http.h"
#include "metrics.h"
#include "names.h"
#include "ns.h"

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
	struct gpu *gpu;    /* the node's GPU state (gpu/gpu.h): never NULL once the control
			     * thread runs; made after the store, freed after unpinning */
	struct engines *engines; /* watchers, engines, leases: made before the control
				  * thread starts, freed after every connection ended */
	struct devloads *loads;  /* device shadow-loads (gpu/devload.h), made after gpu */
	struct diffs *diffs;     /* element diffs: their limits and kept results
				  * (daemon_diff.c), made before the control thread starts */
	struct agent *agent; /* replication, when joined: set once, after the control
			      * thread started, so read it with daemon_agent() */
	pthread_t coord_thread; /* embedded coordinator (--coordinator) */
	struct coord_opts copts;
	int coord_running;
	volatile int coord_stop;
	char coord_state[4096];
	char coord_ep[256]; /* the embedded coordinator's bound endpoint (coord_opts.bound) */
	/* --http (daemon_http.c): the server, and what a scrape reads without the
	 * namespace lock, refreshed by daemon_http_refresh() when versions change */
	struct http *http;       /* only start-up and shutdown touch it */
	struct health_probe *http_probe; /* /healthz's getxattr of the mount, on its own thread */
	char http_addr[128];     /* the address bound, "" without --http; set before the
				  * control thread starts, never changed (status reads it) */
	pthread_mutex_t http_mu; /* guards http_current; never held on a data path */
	char http_current[256];  /* the current version, "" when none */
	uint64_t http_versions;  /* atomic: sealed and open versions */
	int fuse_up;             /* atomic: FUSE init done (readyz) */
	pthread_t init_thread;   /* post_init(), joined at shutdown when init_started */
	int init_started;        /* atomic: init_thread was started */
	/* commits (daemon_commit.c) */
	pthread_mutex_t commit_mu; /* guards the three below; never held while waiting */
	char rename_version[HWFS_NAME_MAX + 1]; /* a rename onto current waiting for the
						 * cluster's commit of it, "" when none */
	int rename_flip_due;       /* that commit's COMMIT reached this node */
	json_t *last_refused;      /* the last refused commit, NULL when none */
};

/*
 * A control operation's handler: the reply to request @req from @peer, read
 * by @rd from the connection rd->fd (publish sends progress on it), never
 * NULL unless out of memory.  Errors are replies too ({"ok": false, "error":
 * ...}).  A long-lived operation (map, watch, engine) sends its own first
 * reply, keeps the connection (reading more lines with @rd) until the client
 * closes it or shutdown shuts it down, and returns NULL: nothing more is sent.
 */
typedef json_t *(*daemon_op_fn)(struct daemon *d, json_t *req, struct ctl_reader *rd,
				const struct ctl_peer *peer);

/* One row of the table of control operations (daemon_ops.c). */
struct daemon_op {
	const char *name;   /* the request's "op" */
	daemon_op_fn fn;
	int mutates;        /* changes the store, the namespace or `current`: owner only */
	int privileged;     /* owner only although it changes nothing (map: the arena's
			     * bytes; engine: it can hold up commits) */
	const char *names[2]; /* request keys naming an existing version (NULL: unused) */
};

/* daemon_req.c: peers, replies, requests */

/** Is @p root, the mount's owner or a member of --ctl-group?  Returns 1 or 0. */
int daemon_peer_privileged(const struct daemon *d, const struct ctl_peer *p);
/** The rwx bits (0..7) of a node of @mode, @uid, @gid that apply to @p, as the kernel does. */
uint32_t daemon_peer_bits(const struct ctl_peer *p, uint32_t mode, uint32_t uid, uint32_t gid);

/** The row of operation @name, or NULL when there is no such operation. */
const struct daemon_op *daemon_op_find(const char *name);

/**
 * daemon_op_call() - run @op for @req: refuse a request that names a version
 * with the reserved prefix (NS_HIDDEN_PREFIX: the daemon's own staging), and
 * a read-only request of a caller who is not privileged for a version whose
 * files it could not read through the mount; else call the handler.  Returns
 * the reply.
 */
json_t *daemon_op_call(struct daemon *d, const struct daemon_op *op, json_t *req,
		       struct ctl_reader *rd, const struct ctl_peer *peer);

/**
 * daemon_err_reply() - the one way the daemon builds an error reply: {"ok": false,
 * "error": the formatted sentence, "errno": @err}.  @err is the positive
 * errno the client acts on (docs/libhwfs.md, "Errors": clients take it from
 * there and never from the sentence, which may quote their own version
 * name); a value outside 1..4095 (a bug) goes out as EIO, so that no error
 * reply lacks one.  Returns the reply, NULL without memory.
 */
json_t *daemon_err_reply(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** {"ok": true}. */
json_t *daemon_ok_reply(void);
/** String member @key of @req, or NULL when it is missing or not a string. */
const char *daemon_req_str(json_t *req, const char *key);

/**
 * daemon_flip_current() - flip `current` to version @v through the mount
 * (daemon_commit.c): `hwfs commit --local` and the agent's COMMIT
 * (repl_flip_current in daemon_repl.c).  Returns 0 or -errno with @err.
 */
int daemon_flip_current(struct daemon *d, const char *v, char *err, size_t errlen);
/** The control operation commit (daemon_commit.c). */
json_t *daemon_op_commit(struct daemon *d, json_t *req, struct ctl_reader *rd,
			 const struct ctl_peer *peer);
/**
 * daemon_rename_commit() - struct fsctx's commit callback: a rename onto
 * `current` (link @target) by process @pid through the mount is `hwfs
 * commit` (the engine barrier; when joined, the cluster's two phases).
 * Returns 0 once decided for this node (the rename flips), or -errno:
 * EINVAL for a target that names no version, the barrier's or the
 * coordinator's errno otherwise (docs/cli.md, "Committing through the mount").
 */
int daemon_rename_commit(void *arg, const char *target, pid_t pid);
/** The last refused commit as status shows it (a new reference; JSON null when none). */
json_t *daemon_commit_status(struct daemon *d);

/** Seal hook of the namespace (daemon_ns_hooks.c): tell the watchers ("arrived") and the agent. */
void daemon_sealed(void *arg, const char *name);
/** Current hook (daemon_ns_hooks.c): {"event": "current"} to the watchers after a commit. */
void daemon_current(void *arg);

/**
 * daemon_join() - start this node's replication agent (daemon_repl.c), joined
 * to @coordinator, with the hooks that let it reach the namespace, the mount
 * and the engines.  Returns agent_start()'s 0 or -errno.
 */
int daemon_join(struct daemon *d, const char *coordinator, struct agent **out);
/** Version @name was sealed here: the agent announces it, when joined (daemon_repl.c). */
void daemon_repl_sealed(struct daemon *d, const char *name);

/* daemon_engine_ops.c: the long-lived operations (daemon_op_fn) */
json_t *op_map(struct daemon *d, json_t *req, struct ctl_reader *rd, const struct ctl_peer *peer);
json_t *op_watch(struct daemon *d, json_t *req, struct ctl_reader *rd,
		 const struct ctl_peer *peer);
json_t *op_engine(struct daemon *d, json_t *req, struct ctl_reader *rd,
		  const struct ctl_peer *peer);

/*
 * A lease: shard references one connection or load holds (one per extent),
 * so that rm or gc cannot free bytes still being read (daemon_lease.c).
 */
struct map_lease {
	struct shard **sh;
	size_t n;
};
/** Room in @ml for one reference per extent of snapshot @rec.  Returns 0 or -ENOMEM. */
int daemon_map_lease_init(struct map_lease *ml, const struct hwfs_vrec *rec);
/**
 * daemon_map_lease_file() - reference the shard of every extent of @f into @ml, in
 * extent order from ml->n on.  Returns 0, -ENOENT (a shard is gone: the
 * version was removed) or -EIO (an extent that is not its whole shard);
 * references taken stay in @ml either way.
 */
int daemon_map_lease_file(struct daemon *d, const struct hwfs_frec *f, struct map_lease *ml);
/** Drop every reference of @ml and free its array. */
void daemon_map_lease_drop(struct daemon *d, struct map_lease *ml);

/* daemon_lease.c: the end of a long-lived connection */

/**
 * daemon_peer_pidfd() - a descriptor that becomes readable when process @pid exits
 * (close-on-exec), -1 when none can be had (the connection alone tells the
 * end then), -ESRCH when the process exited already.
 */
int daemon_peer_pidfd(pid_t pid);
/**
 * daemon_wait_conn() - wait until connection @fd has something to read (data,
 * EOF, reset, shutdown) or the process of @pidfd (-1: none) exited.  Returns
 * 0 (read @fd now: it does not block), -ESRCH (the process exited), -errno.
 */
int daemon_wait_conn(int fd, int pidfd);
/**
 * daemon_wait_for_close() - block until the client closes connection @fd (or
 * shutdown shuts it down) or the process of @pidfd (-1: none) exits, reading
 * and dropping what it sends.  Returns -ESRCH (the process exited) or 0.
 */
int daemon_wait_for_close(int fd, int pidfd);

/**
 * daemon_vrec_distinct_shards() - the distinct shard hashes of snapshot @v, sorted
 * (hwfs_hash_cmp), their number in *@n (daemon_diff.c; verify uses it too).
 * Returns a malloc'd array or NULL.
 */
hwfs_hash_t *daemon_vrec_distinct_shards(const struct hwfs_vrec *v, size_t *n);

struct diffs;
/** The element diffs' limits and kept results, empty.  Returns 0 or -ENOMEM. */
int daemon_diffs_create(struct diffs **out);
/** Free @g (NULL: nothing), once no control connection is left. */
void daemon_diffs_destroy(struct diffs *g);
/** How many element diffs were computed (not answered from another's computation). */
uint64_t daemon_diffs_computed(struct diffs *g);

/** `hwfs diff A B --elements` (daemon_diff.c), a daemon_op_fn that op_diff hands to. */
json_t *op_diff_elements(struct daemon *d, json_t *req, struct ctl_reader *rd,
			 const struct ctl_peer *peer);

/* daemon_gpu.c: device shadow-load (docs/gpu.md) */
json_t *op_load(struct daemon *d, json_t *req, struct ctl_reader *rd, const struct ctl_peer *peer);
json_t *op_unload(struct daemon *d, json_t *req, struct ctl_reader *rd,
		  const struct ctl_peer *peer);
json_t *op_gpumap(struct daemon *d, json_t *req, struct ctl_reader *rd,
		  const struct ctl_peer *peer);
/* The largest device index a request may name. */
#define DAEMON_GPU_MAX 1023
/**
 * daemon_req_gpu() - (daemon_req.c) the "gpu" member of @req in *@gpu: a device index
 * 0..DAEMON_GPU_MAX; when absent, -1 if @optional, else an error; -1 itself
 * is accepted only when @optional.  Returns 0 or -EINVAL.
 */
int daemon_req_gpu(json_t *req, int optional, int *gpu);
/** `current` moved: unload the barrier's device loads of other versions (daemon_gpu.c). */
void daemon_gpu_current(struct daemon *d);
/** The engines' device-load hook (engines_set_gpu_hook()); @arg is the daemon. */
int daemon_gpu_ready(void *arg, const char *version, int gpu, uint64_t started_ns, char *err,
		     size_t errlen);

/**
 * daemon_http_start() - serve /metrics, /healthz and /readyz on d->o->http
 * (daemon_http.c; nothing without --http).  Returns 0, or -errno with the
 * "error: ...\n" line in @msg.
 */
int daemon_http_start(struct daemon *d, char *msg, size_t len);
/** Stop the HTTP server (waits for its threads); no-op when none runs. */
void daemon_http_stop(struct daemon *d);
/**
 * daemon_http_refresh() - re-read the version count and `current` for the
 * scrape (takes the namespace lock; call it from the hooks that change them,
 * never from a FUSE request or with a namespace lock held).
 */
void daemon_http_refresh(struct daemon *d);

/** `hwfs publish` (daemon_publish.c), a daemon_op_fn. */
json_t *op_publish(struct daemon *d, json_t *req, struct ctl_reader *rd, const struct ctl_peer *peer);

/*
 * The agent, or NULL when the node is not joined (yet).  Control threads run
 * before the agent starts; the release store in daemon_run and this acquire
 * load make the agent they see a fully started one.
 */
static inline struct agent *daemon_agent(struct daemon *d)
{
	return __atomic_load_n(&d->agent, __ATOMIC_ACQUIRE);
}

#endif /* HWFS_DAEMON_I_H */
