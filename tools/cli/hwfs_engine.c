/*
 * hwfs_engine.c — hwfs-engine, an inference engine in C built on libhwfs's
 * public API alone (include/hwfs.h): the reference for the third way of
 * docs/engines.md, and what the tests and the demo run on every node.
 *
 *   hwfs-engine -m MOUNT --name NAME --listen PATH [--load-delay-ms N]
 *
 * It registers on the node as engine NAME, loads the version `current` names
 * (if any) and serves it; every version that arrives (or that a commit
 * prepares) is shadow-loaded beside the served one and reported loaded or
 * refused; when `current` flips, the served pointer is swapped (the pause,
 * in microseconds, is reported).  The version served before stays mapped as
 * the standby, reported loaded again, so a commit back to it (a rollback) is
 * ready at once; the standby before it is unmapped, and so is any version
 * removed from the node.
 *
 * Loading a version is hwfs_map() (zero-copy: the tensors are the daemon's
 * arena pages) and a pass over every byte: each tensor's XXH3-128 must be its
 * hash.  The first version loaded fixes the model (each tensor's dtype and
 * shape); a later version that lacks one of its tensors or changes a dtype or
 * shape is refused ("tensor NAME: shape [..] does not match the model's
 * [..]").  --load-delay-ms N waits N ms before reporting a shadow-loaded
 * version loaded, like the copy into spare device memory a GPU engine would
 * do (the version served at start-up is served at once).
 *
 * Serving: each line received on the unix socket PATH is answered with one
 * JSON line computed from the served mapping at that moment:
 *   {"version": V, "digest": D, "tensors": N, "bytes": B, "checksum": HEX}
 * where checksum is the XXH3-64 of every tensor's bytes in map order (the
 * engine's "logits"; {"version": null, ...} while nothing is served).  V is
 * a JSON string whatever the version's name (json_escape).
 *
 * Threads: the main thread follows events and loads; one server thread
 * answers requests.  The served version is a pointer under a mutex, with a
 * count of requests reading it: a swap only exchanges the pointer, and the
 * old version is unmapped once no request reads it.  Each event is logged on
 * stderr with a UTC timestamp.  SIGTERM/SIGINT: unregister, unmap, remove the
 * socket, exit 0; the daemon going away: exit 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "hwfs.h"

#define USAGE "hwfs-engine -m MOUNT --name NAME --listen PATH [--load-delay-ms N]"
#define MAX_CLIENTS 64    /* connections served at once; more wait in the backlog */
#define REQUEST_MAX 4096  /* longest request line; a longer one closes the connection */
#define REASON_MAX 512    /* longest refusal reason */
#define VERSION_NAME_MAX sizeof(((struct hwfs_event *)0)->version) /* a name and its NUL */
#define ESCAPED_MAX (6 * VERSION_NAME_MAX) /* a name as a JSON string body: "\\u00XX" per byte at most */
#define ANSWER_MAX (ESCAPED_MAX + 256) /* longest answer line */

/* One version mapped and verified. */
struct loaded {
	struct hwfs_map *m;
	uint64_t bytes;
	int readers; /* requests computing from it right now (under engine.lock) */
	int standby; /* the version served before the last swap, kept for a rollback */
	int removed; /* the node removed the version: never kept as the standby */
};

/* A tensor of the model: what every version must keep. */
struct model_tensor {
	const char *name;
	char *dtype;
	uint32_t ndim;
	uint64_t *shape;
};

/* A version this engine refused, and why (re-sent when a commit prepares it). */
struct refusal {
	char version[sizeof(((struct hwfs_event *)0)->version)];
	char reason[REASON_MAX];
};

struct engine {
	const char *mount, *name, *listen_path;
	long load_delay_ms;
	struct hwfs *h;
	struct hwfs_watch *w;
	int sigfd, listen_fd, wake[2];
	int stop; /* SIGTERM/SIGINT, or the daemon is gone */
	int gone; /* the daemon closed the connection: exit 1 */
	pthread_t server;

	pthread_mutex_t lock;  /* served and every loaded's readers */
	pthread_cond_t idle;   /* a request finished reading a version */
	struct loaded *served;

	struct loaded **shadows; /* loaded, not served (main thread only) */
	size_t n_shadows;
	struct refusal *refused;
	size_t n_refused;
	struct model_tensor *model; /* fixed by the first version loaded */
	size_t n_model;
};

/*
 * Log one line on stderr: "2026-01-02T03:04:05.678Z hwfs-engine[NAME]: ...".
 * The daemon's line format (hwfs_log in fs/common/util.c), written again here on
 * purpose: this engine uses include/hwfs.h alone, and the library keeps its
 * logger internal.
 */
static void logf_(struct engine *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(struct engine *e, const char *fmt, ...)
{
	char when[40], msg[1024];
	struct timespec ts;
	struct tm tm;
	va_list ap;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s.%03ldZ hwfs-engine[%s]: %s\n", when, ts.tv_nsec / 1000000,
		e->name ? e->name : "-", msg);
}

/* Nanoseconds of the monotonic clock. */
static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* "[4096, 4096]" for @t's shape, into @buf. */
static const char *shape_str(uint32_t ndim, const uint64_t *shape, char *buf, size_t len)
{
	size_t at = (size_t)snprintf(buf, len, "[");

	for (uint32_t i = 0; i < ndim && at < len; i++)
		at += (size_t)snprintf(buf + at, len - at, "%s%llu", i ? ", " : "",
				       (unsigned long long)shape[i]);
	if (at < len)
		snprintf(buf + at, len - at, "]");
	return buf;
}

/* Send a report; a daemon that is gone stops the engine (it then exits 1). */
static void report(struct engine *e, enum hwfs_report what, const char *version,
		   const char *reason, uint64_t pause_us)
{
	if (e->gone)
		return;
	if (hwfs_engine_report(e->w, what, version, reason, pause_us) < 0) {
		logf_(e, "cannot report to the node: %s", hwfs_errmsg());
		e->gone = e->stop = 1;
	}
}

/* ------------------------------------------------------------ the model */

/*
 * Does map @m fit the model?  "" into @why when it does (or when there is no
 * model yet), else the first tensor that does not.
 */
static void check_model(struct engine *e, const struct hwfs_map *m, char why[REASON_MAX])
{
	char a[256], b[256];

	why[0] = '\0';
	for (size_t i = 0; i < e->n_model; i++) {
		const struct model_tensor *mt = &e->model[i];
		const struct hwfs_tensor *t = hwfs_map_find(m, mt->name);

		if (!t) {
			snprintf(why, REASON_MAX, "tensor %s: missing (the model has it, %s %s)",
				 mt->name, mt->dtype, shape_str(mt->ndim, mt->shape, a, sizeof(a)));
			return;
		}
		if (strcmp(t->dtype, mt->dtype)) {
			snprintf(why, REASON_MAX, "tensor %s: dtype %s does not match the model's %s",
				 mt->name, t->dtype, mt->dtype);
			return;
		}
		if (t->ndim != mt->ndim ||
		    memcmp(t->shape, mt->shape, t->ndim * sizeof(*t->shape))) {
			snprintf(why, REASON_MAX, "tensor %s: shape %s does not match the model's %s",
				 mt->name, shape_str(t->ndim, t->shape, a, sizeof(a)),
				 shape_str(mt->ndim, mt->shape, b, sizeof(b)));
			return;
		}
	}
}

/* The first version loaded fixes the model: a copy of @m's names, dtypes and shapes. */
static int fix_model(struct engine *e, const struct hwfs_map *m)
{
	size_t n = hwfs_map_count(m);

	e->model = calloc(n + 1, sizeof(*e->model));
	if (!e->model)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const struct hwfs_tensor *t = hwfs_map_tensor(m, i);
		struct model_tensor *mt = &e->model[i];

		mt->name = strdup(t->name);
		mt->dtype = strdup(t->dtype);
		mt->ndim = t->ndim;
		mt->shape = malloc((t->ndim + 1) * sizeof(*mt->shape));
		e->n_model = i + 1;
		if (!mt->name || !mt->dtype || !mt->shape)
			return -ENOMEM;
		if (t->ndim)
			memcpy(mt->shape, t->shape, t->ndim * sizeof(*t->shape));
	}
	return 0;
}

/* Free the model fix_model() made. */
static void free_model(struct engine *e)
{
	for (size_t i = 0; i < e->n_model; i++) {
		free((char *)e->model[i].name);
		free(e->model[i].dtype);
		free(e->model[i].shape);
	}
	free(e->model);
}

/* ------------------------------------------------------------ loading */

/*
 * Check every tensor of @m against its hash (this reads every byte).  ""
 * into @why when all match, else the first that does not.  *@bytes: the
 * bytes read.
 */
static void verify(const struct hwfs_map *m, char why[REASON_MAX], uint64_t *bytes)
{
	why[0] = '\0';
	*bytes = 0;
	for (size_t i = 0; i < hwfs_map_count(m); i++) {
		const struct hwfs_tensor *t = hwfs_map_tensor(m, i);
		XXH128_canonical_t c;

		XXH128_canonicalFromHash(&c, XXH3_128bits(t->data, t->len));
		*bytes += t->len;
		if (memcmp(c.digest, t->hash, sizeof(t->hash))) {
			snprintf(why, REASON_MAX, "tensor %s: its bytes do not match its hash",
				 t->name);
			return;
		}
	}
}

/* The refusal recorded for @version, or NULL. */
static struct refusal *find_refusal(struct engine *e, const char *version)
{
	for (size_t i = 0; i < e->n_refused; i++)
		if (!strcmp(e->refused[i].version, version))
			return &e->refused[i];
	return NULL;
}

/* Record that @version was refused for @why (reported again on prepare). */
static void remember_refusal(struct engine *e, const char *version, const char *why)
{
	struct refusal *r = find_refusal(e, version), *n;

	if (!r) {
		n = realloc(e->refused, (e->n_refused + 1) * sizeof(*n));
		if (!n)
			return; /* only a re-send on prepare is lost: it loads again then */
		e->refused = n;
		r = &e->refused[e->n_refused++];
		snprintf(r->version, sizeof(r->version), "%s", version);
	}
	snprintf(r->reason, sizeof(r->reason), "%s", why);
}

/* The shadow holding @version (its index), or -1. */
static long find_shadow(struct engine *e, const char *version)
{
	for (size_t i = 0; i < e->n_shadows; i++)
		if (!strcmp(hwfs_map_version(e->shadows[i]->m), version))
			return (long)i;
	return -1;
}

/* Make room for one more shadow. Returns 0 or -ENOMEM. */
static int grow_shadows(struct engine *e)
{
	struct loaded **ns = realloc(e->shadows, (e->n_shadows + 1) * sizeof(*ns));

	if (!ns)
		return -ENOMEM;
	e->shadows = ns;
	return 0;
}

/* Take shadow @i out of the shadow list (the last one fills its place) and return it. */
static struct loaded *take_shadow(struct engine *e, size_t i)
{
	struct loaded *l = e->shadows[i];

	e->shadows[i] = e->shadows[--e->n_shadows];
	return l;
}

/* Wait @ms milliseconds, or less if SIGTERM/SIGINT arrives (e->stop is set then). */
static void delay(struct engine *e, long ms)
{
	uint64_t end = mono_ns() + (uint64_t)ms * 1000000u;

	while (!e->stop) {
		struct pollfd p = {.fd = e->sigfd, .events = POLLIN};
		uint64_t now = mono_ns();
		struct signalfd_siginfo si;

		if (now >= end)
			return;
		if (poll(&p, 1, (int)((end - now + 999999) / 1000000)) > 0 &&
		    read(e->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
			e->stop = 1;
	}
}

/*
 * Shadow-load @version: report loading, map it, check it against the model,
 * verify every byte, wait --load-delay-ms (not at @startup: the version
 * `current` names is served at once), report loaded (it joins the shadows)
 * or refused.  Returns the loaded version, or NULL (refused, or stopped by a
 * signal).
 */
static struct loaded *load(struct engine *e, const char *version, int startup)
{
	char why[REASON_MAX] = "";
	struct loaded *l = calloc(1, sizeof(*l));
	uint64_t t0 = mono_ns();

	report(e, HWFS_LOADING, version, NULL, 0);
	logf_(e, "loading %s", version);
	if (!l) {
		snprintf(why, sizeof(why), "out of memory");
		goto refuse;
	}
	if (hwfs_map(e->h, version, &l->m) < 0) {
		snprintf(why, sizeof(why), "cannot map %s: %s", version, hwfs_errmsg());
		goto refuse;
	}
	check_model(e, l->m, why);
	if (!why[0])
		verify(l->m, why, &l->bytes);
	if (why[0])
		goto refuse;
	if (!e->model && fix_model(e, l->m) < 0) {
		snprintf(why, sizeof(why), "out of memory");
		goto refuse;
	}
	if (grow_shadows(e) < 0) {
		snprintf(why, sizeof(why), "out of memory");
		goto refuse;
	}
	if (e->load_delay_ms > 0 && !startup)
		delay(e, e->load_delay_ms);
	if (e->stop) {
		hwfs_unmap(l->m);
		free(l);
		return NULL;
	}
	e->shadows[e->n_shadows++] = l;
	report(e, HWFS_LOADED, version, NULL, 0);
	logf_(e, "loaded %s: %zu tensors, %llu bytes verified in %.1f ms", version,
	      hwfs_map_count(l->m), (unsigned long long)l->bytes, (double)(mono_ns() - t0) / 1e6);
	return l;
refuse:
	if (l)
		hwfs_unmap(l->m);
	free(l);
	remember_refusal(e, version, why);
	report(e, HWFS_REFUSED, version, why, 0);
	logf_(e, "refused %s: %s", version, why);
	return NULL;
}

/*
 * Make sure @version is shadow-loaded (or served, or known refused); with
 * @resend, a version already handled is reported again (a commit prepares
 * it); @startup is load()'s.  Returns the shadow, or NULL.
 */
static struct loaded *ensure_loaded(struct engine *e, const char *version, int resend,
				    int startup)
{
	struct refusal *r = find_refusal(e, version);
	long i = find_shadow(e, version);
	int serving;

	pthread_mutex_lock(&e->lock);
	serving = e->served && !strcmp(hwfs_map_version(e->served->m), version);
	pthread_mutex_unlock(&e->lock);
	if (serving || i >= 0) {
		if (resend)
			report(e, HWFS_LOADED, version, NULL, 0);
		return i >= 0 ? e->shadows[i] : NULL;
	}
	if (r) {
		if (resend)
			report(e, HWFS_REFUSED, version, r->reason, 0);
		return NULL;
	}
	return load(e, version, startup);
}

/* Unmap @l once no request reads it any more. */
static void retire(struct engine *e, struct loaded *l)
{
	pthread_mutex_lock(&e->lock);
	while (l->readers)
		pthread_cond_wait(&e->idle, &e->lock);
	pthread_mutex_unlock(&e->lock);
	logf_(e, "unmapped %s", hwfs_map_version(l->m));
	hwfs_unmap(l->m);
	free(l);
}

/*
 * @old was served until a swap: keep it mapped as the standby (a rollback to
 * it needs no load) and tell the node it is loaded; the previous standby is
 * unmapped.  Without room in the shadow list it is unmapped instead.
 */
static void keep_standby(struct engine *e, struct loaded *old)
{
	if (old->removed) {
		retire(e, old);
		return;
	}
	for (size_t i = 0; i < e->n_shadows; i++)
		if (e->shadows[i]->standby) {
			retire(e, take_shadow(e, i));
			break;
		}
	if (grow_shadows(e) < 0) {
		retire(e, old);
		return;
	}
	old->standby = 1;
	e->shadows[e->n_shadows++] = old;
	report(e, HWFS_LOADED, hwfs_map_version(old->m), NULL, 0);
	logf_(e, "standby %s", hwfs_map_version(old->m));
}

/*
 * `current` names @version: serve it.  A shadow is swapped in (the pause is
 * the time the served pointer is locked), one not loaded yet is loaded
 * first; a refused one is not served (the old one stays).  Reports swapped
 * (@startup: pause 0) and unmaps the version served before.
 */
static void swap_to(struct engine *e, const char *version, int startup)
{
	struct loaded *l, *old;
	uint64_t t0, pause_us;

	pthread_mutex_lock(&e->lock);
	old = e->served;
	pthread_mutex_unlock(&e->lock);
	if (old && !strcmp(hwfs_map_version(old->m), version)) {
		report(e, HWFS_SWAPPED, version, NULL, 0);
		return;
	}
	l = ensure_loaded(e, version, 0, startup);
	if (!l) {
		struct refusal *r = find_refusal(e, version);

		if (!e->stop)
			logf_(e, "not serving %s (%s); still serving %s", version,
			      r ? r->reason : "not loaded",
			      old ? hwfs_map_version(old->m) : "nothing");
		return;
	}
	take_shadow(e, (size_t)find_shadow(e, version)); /* l, a shadow: found */
	l->standby = 0;
	t0 = mono_ns();
	pthread_mutex_lock(&e->lock);
	old = e->served;
	e->served = l;
	pthread_mutex_unlock(&e->lock);
	/* in whole microseconds, rounded up: a swap that happened paused more than 0 */
	pause_us = startup ? 0 : (mono_ns() - t0 + 999) / 1000;
	report(e, HWFS_SWAPPED, version, NULL, pause_us);
	logf_(e, "swapped %s -> %s: pause %llu us", old ? hwfs_map_version(old->m) : "nothing",
	      version, (unsigned long long)pause_us);
	if (old)
		keep_standby(e, old);
}

/* @version was removed: drop its shadow (a served one stays mapped until swapped out). */
static void removed(struct engine *e, const char *version)
{
	struct refusal *r = find_refusal(e, version);
	long i = find_shadow(e, version);

	if (r)
		*r = e->refused[--e->n_refused];
	if (e->served && !strcmp(hwfs_map_version(e->served->m), version))
		e->served->removed = 1; /* main thread only, like the standby flag */
	if (i >= 0)
		retire(e, take_shadow(e, (size_t)i));
}

/* ------------------------------------------------------------ serving */

/*
 * @s as the body of a JSON string into @out (@len bytes, at least 1): '"'
 * and '\\' escaped, control characters as \\u00XX, every other byte (UTF-8
 * included) as it is.  A string that does not fit is cut before the escape
 * that would not fit.  Returns @out.
 */
static const char *json_escape(const char *s, char *out, size_t len)
{
	size_t at = 0;

	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		char e[8];
		int n = *p == '"' || *p == '\\' ? snprintf(e, sizeof(e), "\\%c", *p)
			: *p < 0x20 || *p == 0x7f ? snprintf(e, sizeof(e), "\\u%04x", *p)
						  : snprintf(e, sizeof(e), "%c", *p);

		if (at + (size_t)n >= len)
			break;
		memcpy(out + at, e, (size_t)n);
		at += (size_t)n;
	}
	out[at] = '\0';
	return out;
}

/* The answer to one request, from the version served now, into @out. */
static void answer(struct engine *e, char *out, size_t len)
{
	char name[ESCAPED_MAX];
	struct loaded *l;
	XXH3_state_t *st;

	pthread_mutex_lock(&e->lock);
	l = e->served;
	if (l)
		l->readers++;
	pthread_mutex_unlock(&e->lock);
	if (!l) {
		snprintf(out, len, "{\"version\":null,\"digest\":null,\"tensors\":0,\"bytes\":0,"
				   "\"checksum\":null}\n");
		return;
	}
	st = XXH3_createState();
	if (st) {
		XXH3_64bits_reset(st);
		for (size_t i = 0; i < hwfs_map_count(l->m); i++) {
			const struct hwfs_tensor *t = hwfs_map_tensor(l->m, i);

			XXH3_64bits_update(st, t->data, t->len);
		}
		snprintf(out, len,
			 "{\"version\":\"%s\",\"digest\":\"%s\",\"tensors\":%zu,\"bytes\":%llu,"
			 "\"checksum\":\"%016llx\"}\n",
			 json_escape(hwfs_map_version(l->m), name, sizeof(name)),
			 hwfs_map_digest(l->m), hwfs_map_count(l->m),
			 (unsigned long long)l->bytes,
			 (unsigned long long)XXH3_64bits_digest(st));
		XXH3_freeState(st);
	} else {
		snprintf(out, len, "{\"error\":\"out of memory\"}\n");
	}
	pthread_mutex_lock(&e->lock);
	l->readers--;
	pthread_cond_broadcast(&e->idle);
	pthread_mutex_unlock(&e->lock);
}

/* A client connection of the server thread and its partial request line. */
struct client {
	int fd;
	size_t used;
	char buf[REQUEST_MAX];
};

/*
 * Read what client @c sent and answer every whole line.  Returns 0, or -1
 * when the connection is to be closed (EOF, error, a line too long, an
 * answer it does not take).
 */
static int serve_client(struct engine *e, struct client *c)
{
	ssize_t n = read(c->fd, c->buf + c->used, sizeof(c->buf) - c->used);
	char out[ANSWER_MAX], *nl;

	if (n <= 0)
		return n < 0 && errno == EINTR ? 0 : -1;
	c->used += (size_t)n;
	while ((nl = memchr(c->buf, '\n', c->used))) {
		size_t line = (size_t)(nl - c->buf) + 1;

		answer(e, out, sizeof(out));
		if (send(c->fd, out, strlen(out), MSG_NOSIGNAL | MSG_DONTWAIT) !=
		    (ssize_t)strlen(out))
			return -1;
		memmove(c->buf, c->buf + line, c->used - line);
		c->used -= line;
	}
	return c->used == sizeof(c->buf) ? -1 : 0;
}

/* The server thread: accept clients and answer their lines until woken to stop. */
static void *server_main(void *arg)
{
	struct engine *e = arg;
	struct client *cl = calloc(MAX_CLIENTS, sizeof(*cl));
	size_t n = 0;

	if (!cl) {
		logf_(e, "server: out of memory");
		return NULL;
	}
	for (;;) {
		struct pollfd p[MAX_CLIENTS + 2];

		p[0] = (struct pollfd){.fd = e->wake[0], .events = POLLIN};
		p[1] = (struct pollfd){.fd = e->listen_fd, .events = n < MAX_CLIENTS ? POLLIN : 0};
		for (size_t i = 0; i < n; i++)
			p[i + 2] = (struct pollfd){.fd = cl[i].fd, .events = POLLIN};
		if (poll(p, n + 2, -1) < 0 && errno != EINTR)
			break;
		if (p[0].revents)
			break;
		for (size_t i = n; i-- > 0;) {
			if (!p[i + 2].revents || serve_client(e, &cl[i]) == 0)
				continue;
			close(cl[i].fd);
			cl[i] = cl[--n];
		}
		if (p[1].revents & POLLIN) {
			int fd = accept4(e->listen_fd, NULL, NULL, SOCK_CLOEXEC);

			if (fd >= 0)
				cl[n++] = (struct client){.fd = fd};
		}
	}
	for (size_t i = 0; i < n; i++)
		close(cl[i].fd);
	free(cl);
	return NULL;
}

/* Listen on unix socket @path (a stale one is replaced). Returns the fd or -errno. */
static int listen_unix(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	unlink(path);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, MAX_CLIENTS) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

/* ------------------------------------------------------------ main */

/* Print the usage line on @f and exit with @status. */
static void usage_exit(FILE *f, int status) __attribute__((noreturn));
static void usage_exit(FILE *f, int status)
{
	fprintf(f, "usage: %s\n", USAGE);
	exit(status);
}

/* Parse the command line into @e. Exits 2 on a usage error. */
static void parse_args(int argc, char **argv, struct engine *e)
{
	static const struct option lo[] = {
		{"mount", required_argument, NULL, 'm'},
		{"name", required_argument, NULL, 'n'},
		{"listen", required_argument, NULL, 'l'},
		{"load-delay-ms", required_argument, NULL, 'd'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	char *end;
	int c;

	while ((c = getopt_long(argc, argv, "m:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm':
			e->mount = optarg;
			break;
		case 'n':
			e->name = optarg;
			break;
		case 'l':
			e->listen_path = optarg;
			break;
		case 'd':
			errno = 0;
			e->load_delay_ms = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || e->load_delay_ms < 0)
				usage_exit(stderr, 2);
			break;
		case 'h':
			usage_exit(stdout, 0);
		default:
			usage_exit(stderr, 2);
		}
	}
	if (optind != argc || !e->name || !e->listen_path)
		usage_exit(stderr, 2);
}

/* Act on one event. */
static void handle(struct engine *e, const struct hwfs_event *ev)
{
	switch (ev->type) {
	case HWFS_EV_ARRIVED:
		logf_(e, "arrived %s", ev->version);
		ensure_loaded(e, ev->version, 0, 0);
		break;
	case HWFS_EV_PREPARE:
		logf_(e, "prepare %s", ev->version);
		ensure_loaded(e, ev->version, 1, 0);
		break;
	case HWFS_EV_CURRENT:
		logf_(e, "current %s", ev->version);
		swap_to(e, ev->version, 0);
		break;
	case HWFS_EV_REMOVED:
		logf_(e, "removed %s", ev->version);
		removed(e, ev->version);
		break;
	}
}

/* Follow events until a signal (returns 0) or the daemon goes away (returns 1). */
static int run(struct engine *e)
{
	struct hwfs_event ev;
	int r;

	while (!e->stop) {
		struct pollfd p[2] = {{.fd = hwfs_watch_fd(e->w), .events = POLLIN},
				      {.fd = e->sigfd, .events = POLLIN}};
		struct signalfd_siginfo si;

		while (!e->stop && ((r = hwfs_watch_next(e->w, 0, &ev)) == 0 || r == -EPROTO)) {
			if (r == 0)
				handle(e, &ev);
			else /* a malformed event, dropped by the library: log it, read on */
				logf_(e, "%s", hwfs_errmsg());
		}
		if (e->stop)
			break;
		if (r != -ETIMEDOUT) {
			logf_(e, "%s", hwfs_errmsg());
			return 1;
		}
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			return 1;
		if ((p[1].revents & POLLIN) && read(e->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
			e->stop = 1;
	}
	logf_(e, "stopping");
	return e->gone;
}

/*
 * Listen, register, serve `current`, follow events; on the way out stop the
 * server thread, unregister, unmap every version and remove the socket.
 * Exit status: 0 after a signal, 1 when setting up failed or the daemon went
 * away, 2 for a usage error.
 */
int main(int argc, char **argv)
{
	struct engine e = {.sigfd = -1, .listen_fd = -1, .wake = {-1, -1}};
	char *cur = NULL;
	sigset_t sigs;
	int rc = 1, started = 0;

	parse_args(argc, argv, &e);
	pthread_mutex_init(&e.lock, NULL);
	pthread_cond_init(&e.idle, NULL);
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	/* blocked before the server thread starts, so only the signalfd sees them */
	if (pthread_sigmask(SIG_BLOCK, &sigs, NULL) ||
	    (e.sigfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK)) < 0 ||
	    pipe2(e.wake, O_CLOEXEC) < 0) {
		logf_(&e, "cannot set up: %s", strerror(errno));
		goto out;
	}
	e.listen_fd = listen_unix(e.listen_path);
	if (e.listen_fd < 0) {
		logf_(&e, "cannot listen on %s: %s", e.listen_path, strerror(-e.listen_fd));
		goto out;
	}
	if (hwfs_open(e.mount, &e.h) < 0 || hwfs_watch_open(e.h, e.name, &cur, &e.w) < 0) {
		logf_(&e, "%s", hwfs_errmsg());
		goto out;
	}
	logf_(&e, "registered on %s (current: %s), serving on %s", hwfs_mountpoint(e.h),
	      cur ? cur : "none", e.listen_path);
	if (pthread_create(&e.server, NULL, server_main, &e)) {
		logf_(&e, "cannot start the server thread");
		goto out;
	}
	started = 1;
	if (cur)
		swap_to(&e, cur, 1);
	rc = e.gone ? 1 : run(&e);
out:
	if (started) {
		if (write(e.wake[1], "x", 1) != 1)
			logf_(&e, "cannot wake the server thread: %s", strerror(errno));
		pthread_join(e.server, NULL);
	}
	hwfs_watch_close(e.w); /* unregisters */
	for (size_t i = 0; i < e.n_shadows; i++) {
		hwfs_unmap(e.shadows[i]->m);
		free(e.shadows[i]);
	}
	if (e.served) {
		hwfs_unmap(e.served->m);
		free(e.served);
	}
	if (e.listen_fd >= 0) {
		close(e.listen_fd);
		unlink(e.listen_path);
	}
	free(e.shadows);
	free(e.refused);
	free_model(&e);
	free(cur);
	hwfs_close(e.h);
	return rc;
}
