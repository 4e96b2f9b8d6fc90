/*
 * daemon.c — the life of one node: start-up and shutdown order, the FUSE
 * session, the control socket (its accept loop, one thread per connection,
 * the tracking and draining of live connections), the embedded coordinator
 * and the replication agent.  What each control request does is in
 * daemon_ops.c (the table of operations) and daemon_publish.c (publish).
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
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon_i.h"
#include "own_mount.h"
#include "sdnotify.h"
#include "devload.h"
#include "gpu.h"
#include "tunables.h"

/* The embedded coordinator's thread (--coordinator): coord_run() until d->coord_stop. */
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

	if (pipe2(pfd, O_CLOEXEC) < 0) {
		int e = errno;

		snprintf(msg, len, "error: embedded coordinator: pipe: %s\n", strerror(e));
		return -e;
	}
	snprintf(d->coord_state, sizeof(d->coord_state), "%s/coord", store_dir(d->st));
	d->copts = (struct coord_opts){.listen = d->o->coordinator, .state = d->coord_state,
				       .keys = d->o->keys, .fanout = 1, .notify_fd = pfd[1],
				       .stop = &d->coord_stop};
	if (pthread_create(&d->coord_thread, NULL, coord_main, d) != 0) {
		close(pfd[0]);
		close(pfd[1]);
		snprintf(msg, len, "error: embedded coordinator: no thread\n");
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

/* ----------------------------------------------------------- control socket */

struct conn {
	struct daemon *d;
	int fd;
	int peer_r;               /* ctl_peer()'s result; < 0: the caller is unknown */
	struct ctl_peer peer;     /* the caller, taken once at accept */
	struct conn *prev, *next; /* d->conns, under d->conn_mu */
};

/*
 * Whether the caller of @c (not yet on the list) is over its share of live
 * connections (conn_mu held).  Each connection has a thread: without a cap,
 * any local user could open connections until the daemon cannot start a
 * thread for anyone else.  Root, the mount's owner and --ctl-group are not
 * capped: they may remove every version anyway, and their engines hold one
 * long-lived connection per map, watch and engine, which must never lock
 * them out of their own `hwfs status` or `commit` (docs/security.md).  An
 * unknown caller (uid -1) counts as one user.  Returns 1 (over) or 0.
 */
static int conn_over_limit(struct daemon *d, const struct conn *c)
{
	uid_t uid = c->peer.uid;
	uint64_t n = 0;

	if (c->peer_r == 0 && daemon_peer_privileged(d, &c->peer))
		return 0;
	for (struct conn *o = d->conns; o; o = o->next)
		n += o->peer.uid == uid;
	return n >= hwfs_tun.ctl_conns_per_uid;
}

/* Free @c, closing its socket (it is on no list). */
static void conn_free(struct conn *c)
{
	close(c->fd);
	ctl_peer_free(&c->peer);
	free(c);
}

/* Take @c off the daemon's list of live connections, free it and wake a waiting shutdown. */
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
	conn_free(c);
	pthread_cond_broadcast(&d->conn_cv);
	pthread_mutex_unlock(&d->conn_mu);
}

/*
 * May @p run @op (docs/cli.md, "Permissions")?  Mutating and privileged verbs
 * (@mutates, from the table of operations: its mutates or privileged column):
 * root, the mount's owner or a member of --ctl-group.  Read-only verbs:
 * those, and whoever the mount's root directory lets read it (only a daemon
 * run as root mounts with allow_other; otherwise nobody else can reach the
 * mount).
 * Returns NULL when allowed, else the error reply.
 */
static json_t *authorize(struct daemon *d, const struct ctl_peer *p, const char *op,
			 int mutates)
{
	uint32_t bits, mode, uid, gid;

	if (daemon_peer_privileged(d, p))
		return NULL;
	if (mutates)
		return d->group_name[0]
			       ? daemon_err_reply(EACCES, "permission denied: %s needs root, the mount's "
					   "owner (uid %u) or group %s", op, (unsigned)d->owner,
					   d->group_name)
			       : daemon_err_reply(EACCES, "permission denied: %s needs root or the mount's "
					   "owner (uid %u)", op, (unsigned)d->owner);
	ns_attr(d->ns, ns_root(d->ns), &mode, &uid, &gid);
	bits = daemon_peer_bits(p, mode, uid, gid);
	if ((bits & 4) && geteuid() == 0)
		return NULL;
	return daemon_err_reply(EACCES, "permission denied: %s needs read access to the mount", op);
}

/*
 * One control connection: read one request (at most CTL_MAX_REQUEST bytes:
 * anyone may connect), authorize the caller taken at accept (SO_PEERCRED),
 * run it through the table of operations (daemon_ops.c), send the reply, and
 * take the connection off the live list.  A long-lived operation (map, watch,
 * engine) answers by itself and returns only when the connection ends.
 */
static void *conn_main(void *arg)
{
	struct conn *c = arg;
	struct ctl_reader rd;
	json_t *req = NULL, *res;
	const struct daemon_op *op;
	const char *name;
	int r;

	ctl_reader_init(&rd, c->fd);
	rd.max = CTL_MAX_REQUEST; /* read before we know the verb: see ctl.h */
	if (c->peer_r < 0) {
		res = daemon_err_reply(EACCES, "permission denied: cannot tell who is calling");
		goto reply;
	}
	if ((r = ctl_recv(&rd, &req)) < 0) {
		res = r == -EMSGSIZE ? daemon_err_reply(EMSGSIZE, "request too long (the limit is %u bytes)",
						 CTL_MAX_REQUEST)
				     : daemon_err_reply(EBADMSG, "malformed request");
		goto reply;
	}
	name = daemon_req_str(req, "op");
	op = name ? daemon_op_find(name) : NULL;
	if (!name)
		res = daemon_err_reply(EINVAL, "request without op");
	else if ((res = authorize(c->d, &c->peer, name, op && (op->mutates || op->privileged))))
		LOG_WARN("control: refused %s to uid %u (pid %d)", name, (unsigned)c->peer.uid,
			 (int)c->peer.pid);
	else if (op)
		res = daemon_op_call(c->d, op, req, &rd, &c->peer);
	else
		res = daemon_err_reply(EOPNOTSUPP, "unknown op: %s", name);
reply:
	if (res) {
		ctl_send(c->fd, res);
		json_decref(res);
	}
	json_decref(req);
	ctl_reader_free(&rd);
	conn_done(c);
	return NULL;
}

/*
 * The accept loop of the control socket: learn who calls, refuse a user over
 * ctl_conns_per_uid (with a one-line answer; see conn_over_limit() for who is
 * not capped) and, unless shutdown began, put the connection on the live
 * list and start its thread.  Ends when the
 * listening socket is shut down.
 */
static void *ctl_main(void *arg)
{
	struct daemon *d = arg;

	for (;;) {
		int fd = accept4(d->ctl_fd, NULL, NULL, SOCK_CLOEXEC), over;
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
		c->peer_r = ctl_peer(fd, &c->peer);
		if (c->peer_r < 0)
			c->peer.uid = (uid_t)-1; /* unknown: counted as one user */
		pthread_mutex_lock(&d->conn_mu);
		over = conn_over_limit(d, c);
		if (!over && !__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE) &&
		    pthread_create(&t, NULL, conn_main, c) == 0) {
			/* on the list before conn_main can take itself off (it needs conn_mu) */
			c->next = d->conns;
			if (d->conns)
				d->conns->prev = c;
			d->conns = c;
			pthread_detach(t);
			pthread_mutex_unlock(&d->conn_mu);
			continue;
		}
		pthread_mutex_unlock(&d->conn_mu);
		if (over) {
			json_t *busy = daemon_err_reply(EAGAIN, "too many control connections from this "
						 "user");
			char *line = busy ? json_dumps(busy, JSON_COMPACT) : NULL;

			/* best effort, never blocking the accept loop: a caller that misses
			 * it sees the socket closed; the NUL becomes the line's end */
			if (line) {
				size_t n = strlen(line);

				line[n] = '\n';
				send(fd, line, n + 1, MSG_DONTWAIT | MSG_NOSIGNAL);
			}
			free(line);
			json_decref(busy);
		}
		conn_free(c);
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

/* Write @msg ("ok\n" or "error: ...\n") to the starting process, once: the fd is closed. */
static void notify(const struct daemon_opts *o, const char *msg)
{
	if (o->notify_fd >= 0) {
		if (write(o->notify_fd, msg, strlen(msg)) < 0)
			LOG_WARN("cannot notify the starting process");
		close(o->notify_fd);
		((struct daemon_opts *)o)->notify_fd = -1;
	}
}

/*
 * Tell the starting process something it should show its user before "ok"
 * ("note: @note\n" on the notify pipe, which stays open; `hwfs mount` prints
 * "hwfs: note: ..." on stderr), and log it.  Without a starting process
 * (foreground) the log line is all: it goes to stderr there.
 */
static void notify_note(const struct daemon_opts *o, const char *note)
{
	char line[1100];
	int n;

	LOG_WARN("%s", note);
	if (o->notify_fd < 0)
		return;
	n = snprintf(line, sizeof(line), "note: %.1000s\n", note);
	if (write(o->notify_fd, line, (size_t)n) < 0)
		LOG_WARN("cannot notify the starting process");
}

/*
 * prepare_arena() - --preallocate and --pin (after ns_create(): its trim has
 * punched stale pages, so the ones allocated here are clean).  --pin
 * preallocates without locking (pinned pages must never be punched), then
 * gpu_pin() registers the arena for CUDA, or mlocks it when there is no GPU;
 * --preallocate alone locks it with mlock.  A pin or lock that is refused is
 * said (notify_note) and the mount goes on without it.  Returns 0, or -errno
 * with the "error: ...\n" line in @msg when the arena cannot be preallocated.
 */
static int prepare_arena(struct daemon *d, char *msg, size_t len)
{
	struct arena *a = store_arena(d->st);
	unsigned long long cap = (unsigned long long)arena_capacity(a);
	char pmsg[1024], note[1100];
	int r;

	r = arena_preallocate(a, !d->o->pin);
	if (r < 0) {
		snprintf(msg, len, "error: cannot preallocate the %llu-byte arena: %s\n", cap,
			 r == -ENOSPC ? "not enough memory in its filesystem" : strerror(-r));
		return r;
	}
	if (!d->o->pin) {
		if (arena_locked(a)) {
			LOG_INFO("arena: %llu bytes preallocated and locked", cap);
		} else {
			snprintf(note, sizeof(note), "arena preallocated (%llu bytes) but not locked: "
				 "mlock refused (RLIMIT_MEMLOCK: ulimit -l, or run as root)", cap);
			notify_note(d->o, note);
		}
		return 0;
	}
	r = gpu_pin(d->gpu, arena_base(a), arena_capacity(a), pmsg, sizeof(pmsg));
	if (r < 0) {
		notify_note(d->o, pmsg); /* says what failed; the mount goes on unpinned */
	} else if (!gpu_runtime(d->gpu)) {
		snprintf(note, sizeof(note), "no GPU (%.900s): arena locked with mlock instead of "
			 "pinned for CUDA", gpu_why(d->gpu));
		notify_note(d->o, note);
	} else {
		LOG_INFO("arena: %s", pmsg);
	}
	return 0;
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
 * Remove the sockets in the shared control directory @dir that no daemon
 * listens on any more (left by a daemon killed with SIGKILL).  A socket is
 * judged by connecting to it, not by its name's pid, so the socket of a
 * live daemon in another pid namespace is never taken away.  The connect is
 * non-blocking: a daemon that is alive but stuck (its listen queue full)
 * answers EAGAIN and keeps its socket, and never holds up this start-up.
 */
static void sweep_dead_sockets(const char *dir)
{
	DIR *dh = opendir(dir);
	struct dirent *e;

	if (!dh)
		return;
	while ((e = readdir(dh))) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		size_t n = strlen(e->d_name);
		int fd;

		if (n < 6 || strcmp(e->d_name + n - 5, ".sock") ||
		    (size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s", dir, e->d_name) >=
			    sizeof(sa.sun_path))
			continue;
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			break;
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno == ECONNREFUSED &&
		    unlink(sa.sun_path) == 0)
			LOG_INFO("removed %s (its daemon is gone)", sa.sun_path);
		close(fd);
	}
	closedir(dh);
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
	const char *base = secure_getenv("XDG_RUNTIME_DIR");
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
		sweep_dead_sockets(d->ctl_dir);
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

/* After FUSE init, off the FUSE thread: set the read-ahead, then tell the starter "ok". */
static void *post_init(void *arg)
{
	struct daemon *d = arg;

	set_read_ahead(d);
	__atomic_store_n(&d->fuse_up, 1, __ATOMIC_RELEASE);
	notify(d->o, "ok\n");
	/* under systemd (Type=notify, the daemon in the foreground): ready now */
	hwfs_sd_notify("READY=1\nSTATUS=serving %s", d->o->mountpoint);
	return NULL;
}

/*
 * fsctx's init hook, called inside FUSE's init handler: post_init() stats the
 * mount, which waits for this very handler, so it runs in its own thread,
 * joined at shutdown (it reads the options that are freed after).
 */
static void on_init(void *arg)
{
	struct daemon *d = arg;

	if (pthread_create(&d->init_thread, NULL, post_init, arg) == 0)
		__atomic_store_n(&d->init_started, 1, __ATOMIC_RELEASE);
}

/*
 * Process-wide settings of a daemon: SIGPIPE ignored (a peer that hangs up
 * is an error return, not a signal), the connection condition variable on
 * the monotonic clock, and malloc's thresholds for the replication buffers.
 */
static void daemon_process_setup(struct daemon *d)
{
	pthread_condattr_t ca;

	signal(SIGPIPE, SIG_IGN);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->conn_cv, &ca);
	pthread_condattr_destroy(&ca);
	/*
	 * Shards arrive as messages of up to max_shard bytes, which libzmq
	 * mallocs.  Above glibc's mmap threshold every one would be a fresh
	 * mapping whose pages are faulted in and zeroed, then unmapped.  Keep
	 * buffers up to glibc's limit (32 MiB) on the heap and reuse them.
	 */
	mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's maximum */
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

/*
 * The node's state, before anything is served: the store (its capacity
 * checked first when one was asked for), the namespace loaded from the
 * index, the engine registry and the element diffs, the GPU and its device
 * loads, the hooks that connect them, and the arena prepared (--preallocate,
 * --pin).  Returns 0, or -errno with the "error: ...\n" line in @msg.
 */
static int daemon_open_node(struct daemon *d, char *msg, size_t len)
{
	const struct daemon_opts *o = d->o;
	int r;

	if (o->capacity) { /* asked for: refused past the filesystem, noted past the memory */
		char cmsg[512];

		r = store_check_capacity(o->store, o->capacity, cmsg, sizeof(cmsg));
		if (r == -EFBIG) {
			snprintf(msg, len, "error: %s\n", cmsg);
			return r;
		}
		if (r == 1)
			notify_note(o, cmsg);
	}
	r = store_open(o->store, o->capacity, &d->st);
	if (r < 0) {
		snprintf(msg, len, "error: cannot open store %s: %s\n", o->store,
			 r == -EBUSY ? "in use by another hwfs daemon" : strerror(-r));
		return r;
	}
	r = ns_create(d->st, &d->ns);
	if (r < 0) {
		snprintf(msg, len, "error: cannot load index: %s\n", strerror(-r));
		return r;
	}
	r = engines_create(d->ns, &d->engines);
	if (r == 0)
		r = daemon_diffs_create(&d->diffs);
	if (r < 0) {
		snprintf(msg, len, "error: %s\n", strerror(-r));
		return r;
	}
	/* the GPU (none is not an error) and its table of device loads */
	r = gpu_open(&d->gpu);
	if (r == 0)
		r = devloads_create(gpu_runtime(d->gpu), &d->loads);
	if (r < 0) {
		snprintf(msg, len, "error: %s\n", strerror(-r));
		return r;
	}
	/* engines registered with a GPU are ready when the version is loaded there */
	engines_set_gpu_hook(d->engines, daemon_gpu_ready, d);
	/* seals reach the watchers (and, once joined, the agent): set before FUSE runs */
	ns_set_seal_hook(d->ns, daemon_sealed, d);
	ns_set_current_hook(d->ns, daemon_current, d);
	if (o->preallocate || o->pin)
		return prepare_arena(d, msg, len);
	return 0;
}

/*
 * The control socket and the HTTP endpoint: who owns the daemon (and the
 * name of --ctl-group, for status), the socket's directory and the socket
 * listening, then --http.  Returns 0, or -errno with the line in @msg.
 */
static int daemon_open_control(struct daemon *d, char *msg, size_t len)
{
	const struct daemon_opts *o = d->o;
	int r;

	d->owner = getuid();
	if (o->ctl_gid >= 0) {
		struct group *g = getgrgid((gid_t)o->ctl_gid);

		if (g)
			snprintf(d->group_name, sizeof(d->group_name), "%s", g->gr_name);
		else
			snprintf(d->group_name, sizeof(d->group_name), "%ld", o->ctl_gid);
	}
	r = make_ctl_dir(d, msg, len);
	if (r < 0)
		return r;
	d->ctl_fd = ctl_listen(d->ctl_path, 0666);
	if (d->ctl_fd < 0) {
		r = d->ctl_fd;
		snprintf(msg, len, "error: control socket %s: %s\n", d->ctl_path, strerror(-r));
		return r;
	}
	return daemon_http_start(d, msg, len);
}

/*
 * The FUSE session (with @args, whose -o string is @optstr of @optlen
 * bytes) mounted on the mountpoint; *@mounted is set once it is.  Returns
 * 0, or -errno with the line in @msg.
 */
static int daemon_mount(struct daemon *d, struct fuse_args *args, char *optstr, size_t optlen,
			int *mounted, char *msg, size_t len)
{
	const struct daemon_opts *o = d->o;

	snprintf(optstr, optlen,
		 "fsname=hwfs:%s,subtype=hwfs,max_read=1048576,default_permissions%s",
		 store_dir(d->st), geteuid() == 0 ? ",allow_other" : "");
	d->fsctx = (struct fsctx){d->ns, d->ctl_path, on_init, d, daemon_rename_commit, NULL};
	d->se = fuse_session_new(args, hwfs_fuse_ops(), sizeof(struct fuse_lowlevel_ops), &d->fsctx);
	if (!d->se) {
		snprintf(msg, len, "error: cannot create the FUSE session\n");
		return -EINVAL;
	}
	if (fuse_set_signal_handlers(d->se) < 0 || fuse_session_mount(d->se, o->mountpoint) < 0) {
		snprintf(msg, len, "error: cannot mount on %s (see %s/hwfs.log)\n", o->mountpoint,
			 store_dir(d->st));
		return -EIO;
	}
	*mounted = 1;
	/* the daemon's own renames through the mount run in children without this fd */
	own_mount_set_fd(fuse_session_fd(d->se));
	return 0;
}

/*
 * What runs beside the mount: the control socket's accept thread, the
 * embedded coordinator (--coordinator) and the replication agent (--join;
 * our own coordinator at the port it bound).  Returns 0, or -errno with the
 * line in @msg.
 */
static int daemon_start_threads(struct daemon *d, char *msg, size_t len)
{
	const struct daemon_opts *o = d->o;
	int r;

	if (pthread_create(&d->ctl_thread, NULL, ctl_main, d) != 0) {
		snprintf(msg, len, "error: cannot start the control thread\n");
		return -EAGAIN;
	}
	d->ctl_running = 1;
	if (o->coordinator) {
		r = start_coord(d, msg, len);
		if (r < 0)
			return r;
	}
	if (o->join) {
		/* joining our own coordinator: at the port it bound (tcp://HOST:* allowed) */
		const char *join = o->coordinator && d->coord_ep[0] ? d->coord_ep : o->join;
		struct agent *agent = NULL;

		r = daemon_join(d, join, &agent);
		__atomic_store_n(&d->agent, agent, __ATOMIC_RELEASE);
		if (r < 0) {
			snprintf(msg, len, "error: cannot join %s: %s\n", o->join,
				 r == -EADDRINUSE ? "listen address in use" : strerror(-r));
			return r;
		}
		/* engine reports and disconnects wake the agent's pending barrier */
		engines_set_wake(d->engines, agent_wake, d->agent);
	}
	return 0;
}

/* FUSE's multi-threaded loop (clone_fd, max_threads), until the mount goes. */
static void daemon_serve(struct daemon *d)
{
	struct fuse_loop_config *cfg;

	LOG_INFO("mounted %s (store %s, pid %d)", d->o->mountpoint, store_dir(d->st), (int)getpid());
	cfg = fuse_loop_cfg_create();
	fuse_loop_cfg_set_clone_fd(cfg, 1);
	fuse_loop_cfg_set_max_threads(cfg, (unsigned)hwfs_tun.max_threads);
	fuse_loop_cfg_set_idle_threads(cfg, (unsigned)HWFS_MIN(hwfs_tun.max_threads, 4));
	if (hwfs_readaround_start(&d->fsctx, d->se) < 0)
		LOG_WARN("read-around thread not started: small reads go one request each");
	fuse_session_loop_mt(d->se, cfg);
	hwfs_readaround_stop(&d->fsctx); /* the loop has joined its workers */
	fuse_loop_cfg_destroy(cfg);
	LOG_INFO("unmounted %s", d->o->mountpoint);
}

/*
 * The first steps of shutdown: nothing new starts, then what still uses the
 * node stops coming.  Control connections first: no new ones, the live
 * ones ended, and nothing they use (agent, namespace, store) is freed until
 * they are gone.  The mount goes before the wait, so a commit or publish
 * that renames through it fails instead of waiting for a loop that has
 * ended.  Returns drain_conns()'s answer: < 0 when connections are still
 * live after ctl_drain_ms.
 */
static int daemon_stop(struct daemon *d, int mounted)
{
	__atomic_store_n(&d->stopping, 1, __ATOMIC_RELEASE);
	hwfs_sd_notify("STOPPING=1");
	if (__atomic_load_n(&d->init_started, __ATOMIC_ACQUIRE))
		pthread_join(d->init_thread, NULL);
	daemon_http_stop(d); /* its handler reads the agent, engines and store */
	if (d->loads)
		devloads_stop(d->loads); /* copies end at their next tensor */
	if (d->ctl_running) {
		shutdown(d->ctl_fd, SHUT_RDWR);
		pthread_join(d->ctl_thread, NULL);
	}
	if (d->se && mounted)
		fuse_session_unmount(d->se);
	return drain_conns(d);
}

/*
 * Connections are still live: nothing may be freed.  The barrier's load
 * workers use this stack's struct daemon, the arena and CUDA: returning
 * (then exit(), whose atexit handlers tear CUDA down) while one runs is
 * undefined.  They stop at their next tensor; wait for them a bounded
 * while, else _exit() now.
 */
static void daemon_abandon(struct daemon *d)
{
	unsigned left = 0;

	if (d->loads) {
		engines_set_gpu_hook(d->engines, NULL, NULL);
		devloads_stop(d->loads);
		if (devloads_drain_for(d->loads, (unsigned)hwfs_tun.ctl_drain_ms, &left) < 0) {
			LOG_ERR("%u device load worker(s) still running after %llu ms: exiting "
				"at once (_exit), nothing freed", left,
				(unsigned long long)hwfs_tun.ctl_drain_ms);
			fflush(stderr);
			_exit(1);
		}
	}
	LOG_ERR("exiting without freeing the namespace and store (still in use)");
}

/*
 * The rest of shutdown, once no connection is live: device loads drained,
 * hooks unset, the agent and the coordinator stopped, the control socket
 * and its directory removed, the FUSE session destroyed, then the modules
 * freed in the reverse order of daemon_open_node().
 */
static void daemon_close(struct daemon *d)
{
	if (d->loads) {
		/* no barrier starts a load any more; the loads it started end */
		engines_set_gpu_hook(d->engines, NULL, NULL);
		devloads_drain(d->loads);
	}
	if (d->ns) {
		ns_set_seal_hook(d->ns, NULL, NULL);
		ns_set_current_hook(d->ns, NULL, NULL);
	}
	if (d->agent) {
		engines_set_wake(d->engines, NULL, NULL);
		agent_stop(d->agent);
	}
	if (d->coord_running) {
		__atomic_store_n(&d->coord_stop, 1, __ATOMIC_RELEASE);
		pthread_join(d->coord_thread, NULL);
	}
	if (d->ctl_fd >= 0) {
		close(d->ctl_fd);
		unlink(d->ctl_path);
	}
	if (d->ctl_dir_private)
		rmdir(d->ctl_dir);
	if (d->se) {
		own_mount_set_fd(-1);
		fuse_remove_signal_handlers(d->se);
		fuse_session_destroy(d->se);
	}
	pthread_cond_destroy(&d->conn_cv);
	devloads_destroy(d->loads); /* device memory (copied from the arena), before the runtime goes */
	engines_destroy(d->engines);
	daemon_diffs_destroy(d->diffs);
	ns_destroy(d->ns);
	json_decref(d->last_refused);
	/* unpin, then close the runtime, then unmap the arena */
	gpu_unpin(d->gpu);
	gpu_close(d->gpu);
	store_close(d->st);
}

/*
 * One node from start to shutdown: each step of start-up in order (the
 * first that fails says why to the starter and the log), the FUSE loop,
 * then shutdown in the reverse order.
 */
int daemon_run(const struct daemon_opts *o)
{
	struct daemon d = {.o = o, .ctl_fd = -1, .conn_mu = PTHREAD_MUTEX_INITIALIZER,
			   .http_mu = PTHREAD_MUTEX_INITIALIZER,
			   .commit_mu = PTHREAD_MUTEX_INITIALIZER};
	char optstr[4096], msg[4352];
	char *argv[] = {"hwfs", "-o", optstr, o->debug ? "-d" : NULL, NULL};
	struct fuse_args args = FUSE_ARGS_INIT(o->debug ? 4 : 3, argv);
	int r, mounted = 0;

	daemon_process_setup(&d);
	r = daemon_open_node(&d, msg, sizeof(msg));
	if (r == 0)
		r = daemon_open_control(&d, msg, sizeof(msg));
	if (r == 0)
		r = daemon_mount(&d, &args, optstr, sizeof(optstr), &mounted, msg, sizeof(msg));
	if (r == 0)
		r = daemon_start_threads(&d, msg, sizeof(msg));
	if (r == 0) {
		daemon_serve(&d);
	} else {
		LOG_ERR("%.*s", (int)strcspn(msg, "\n"), msg);
		notify(o, msg);
	}
	if (daemon_stop(&d, mounted) < 0) {
		daemon_abandon(&d);
		fuse_opt_free_args(&args);
		return r;
	}
	daemon_close(&d);
	fuse_opt_free_args(&args);
	return r;
}
