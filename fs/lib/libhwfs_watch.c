/*
 * libhwfs_watch.c — events and engines (docs/engines.md): {"op": "watch"}
 * and {"op": "engine"} keep their connection open, and the open connection
 * is the watch (and the engine's registration).  A GPU engine
 * (hwfs_watch_open_gpu) is the same engine request with "gpu": N: the node
 * then loads a prepared version on that device itself and counts the engine
 * ready once it is resident (docs/gpu.md).  The daemon writes one event
 * per line; an engine writes its reports on the same connection.
 *
 * The socket is non-blocking once the first answer is read: hwfs_watch_next()
 * waits with poll() for at most its timeout, and a line that arrives in
 * several reads is kept in the reader until it is whole.  Reports may come
 * from another thread than the one reading events; they are written under a
 * mutex so that two reports never interleave (ctl_send() waits for room on
 * the non-blocking socket).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "libhwfs_i.h"

struct hwfs_watch {
	int fd;
	struct ctl_reader rd;
	int engine;                /* registered as an engine: reports allowed */
	pthread_mutex_t send_lock; /* one report on the wire at a time */
};

int lib_watch_open(struct hwfs *h, json_t *req, int engine, char **current,
		   struct hwfs_watch **out)
{
	struct hwfs_watch *w = calloc(1, sizeof(*w));
	json_t *res = NULL;
	const char *cur;
	char *cur_copy = NULL;
	int r, fl;

	if (!w)
		return lib_fail(-ENOMEM, "out of memory");
	w->fd = -1;
	ctl_reader_init(&w->rd, -1);
	pthread_mutex_init(&w->send_lock, NULL);
	w->engine = engine;
	w->fd = lib_connect(h);
	if (w->fd < 0) {
		r = w->fd;
		goto out;
	}
	w->rd.fd = w->fd;
	r = lib_exchange(w->fd, &w->rd, req, NULL, NULL, &res);
	if (r < 0 || (r = lib_check(res)) < 0)
		goto out;
	/* events are short lines: never buffer more than a request's worth */
	w->rd.max = CTL_MAX_REQUEST;
	fl = fcntl(w->fd, F_GETFL);
	if (fl < 0 || fcntl(w->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		r = lib_fail(-errno, "cannot set up the watch: %s", strerror(errno));
		goto out;
	}
	cur = lib_jstr(res, "current");
	if (cur && !lib_valid_name(cur)) {
		r = lib_fail(-EPROTO, "malformed answer from the daemon: `current` names an "
				      "invalid version name");
		goto out;
	}
	if (current && cur && !(cur_copy = strdup(cur))) {
		r = lib_fail(-ENOMEM, "out of memory");
		goto out;
	}
	if (current)
		*current = cur_copy;
	*out = w;
	w = NULL;
out:
	json_decref(res);
	hwfs_watch_close(w);
	return r;
}

int hwfs_watch_open(struct hwfs *h, const char *engine, char **current, struct hwfs_watch **out)
{
	json_t *req = engine ? json_pack("{s:s, s:s}", "op", "engine", "name", engine)
			     : json_pack("{s:s}", "op", "watch");
	int r;

	lib_clear_error();
	if (!req)
		return lib_fail(-ENOMEM, "out of memory");
	r = lib_watch_open(h, req, engine != NULL, current, out);
	json_decref(req);
	return r;
}

int hwfs_watch_open_gpu(struct hwfs *h, const char *engine, int gpu, char **current,
			struct hwfs_watch **out)
{
	json_t *req;
	int r;

	if (gpu == -1)
		return hwfs_watch_open(h, engine, current, out);
	lib_clear_error();
	if (!engine || !*engine)
		return lib_fail(-EINVAL, "a GPU engine needs a name");
	if (gpu < 0)
		return lib_fail(-EINVAL, "invalid GPU %d (a device index, or -1)", gpu);
	req = json_pack("{s:s, s:s, s:i}", "op", "engine", "name", engine, "gpu", gpu);
	if (!req)
		return lib_fail(-ENOMEM, "out of memory");
	r = lib_watch_open(h, req, 1, current, out);
	json_decref(req);
	return r;
}

int hwfs_watch_fd(const struct hwfs_watch *w)
{
	return w->fd;
}

/* Milliseconds left until @end (CLOCK_MONOTONIC), at least 0. */
static int ms_left(const struct timespec *end)
{
	struct timespec now;
	int64_t ms;

	clock_gettime(CLOCK_MONOTONIC, &now);
	ms = (int64_t)(end->tv_sec - now.tv_sec) * 1000 + (end->tv_nsec - now.tv_nsec) / 1000000;
	return ms < 0 ? 0 : ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/*
 * Fill @ev from event line @msg.  Returns 0, 1 for a line that is no event
 * this library knows (skipped: a newer daemon may say more), -EPROTO (the
 * sentence set) for an event without a valid version name (lib_valid_name:
 * a path such as "../../etc" never reaches the caller).
 */
static int parse_event(json_t *msg, struct hwfs_event *ev)
{
	static const struct {
		const char *name;
		enum hwfs_event_type type;
	} types[] = {
		{"arrived", HWFS_EV_ARRIVED},
		{"current", HWFS_EV_CURRENT},
		{"prepare", HWFS_EV_PREPARE},
		{"removed", HWFS_EV_REMOVED},
	};
	const char *e = lib_jstr(msg, "event"), *v = lib_jstr(msg, "version");

	if (!e)
		return 1;
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(types); i++) {
		if (strcmp(e, types[i].name))
			continue;
		if (!v)
			return lib_fail(-EPROTO, "malformed %s event from the daemon: no version", e);
		if (!lib_valid_name(v) || strlen(v) >= sizeof(ev->version))
			return lib_fail(-EPROTO, "malformed %s event from the daemon: invalid version "
						 "name (dropped)", e);
		ev->type = types[i].type;
		strcpy(ev->version, v);
		return 0;
	}
	return 1;
}

int hwfs_watch_next(struct hwfs_watch *w, int timeout_ms, struct hwfs_event *ev)
{
	struct timespec end;
	json_t *msg;
	int r;

	lib_clear_error();
	clock_gettime(CLOCK_MONOTONIC, &end);
	if (timeout_ms > 0) {
		end.tv_sec += timeout_ms / 1000;
		end.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (end.tv_nsec >= 1000000000) {
			end.tv_sec++;
			end.tv_nsec -= 1000000000;
		}
	}
	for (;;) {
		struct pollfd p = {.fd = w->fd, .events = POLLIN};
		int wait;

		r = ctl_recv(&w->rd, &msg);
		if (r == 0) {
			r = parse_event(msg, ev);
			json_decref(msg);
			if (r <= 0)
				return r;
			continue;
		}
		if (r == -EPIPE)
			return lib_fail(-EPIPE, "the daemon closed the event stream (unmounted or "
						"stopped)");
		if (r == -EBADMSG || r == -EMSGSIZE)
			return lib_fail(-EPROTO, "malformed event from the daemon");
		if (r != -EAGAIN)
			return lib_fail(r, "cannot read events: %s", strerror(-r));
		wait = timeout_ms < 0 ? -1 : timeout_ms == 0 ? 0 : ms_left(&end);
		if (wait == 0)
			return lib_fail(-ETIMEDOUT, "no event within %d ms", timeout_ms);
		r = poll(&p, 1, wait);
		if (r < 0)
			return lib_fail(-errno, "waiting for events: %s", strerror(errno));
		if (r == 0)
			return lib_fail(-ETIMEDOUT, "no event within %d ms", timeout_ms);
	}
}

/* One report; @drain_us and @swap_us (SWAPPED only) are left out when negative. */
static int engine_report(struct hwfs_watch *w, enum hwfs_report what, const char *version,
			 const char *reason, uint64_t pause_us, int64_t drain_us, int64_t swap_us)
{
	static const char *const names[] = {
		[HWFS_LOADING] = "loading",
		[HWFS_LOADED] = "loaded",
		[HWFS_REFUSED] = "refused",
		[HWFS_SWAPPED] = "swapped",
	};
	json_t *msg;
	int r;

	lib_clear_error();
	if (!w->engine)
		return lib_fail(-EINVAL, "not an engine: this watch was opened without a name");
	if ((unsigned)what >= HWFS_ARRAY_SIZE(names) || !names[what] || !version || !*version)
		return lib_fail(-EINVAL, "invalid report");
	msg = json_pack("{s:s, s:s}", "report", names[what], "version", version);
	if (msg && what == HWFS_REFUSED)
		json_object_set_new(msg, "reason", json_string(reason ? reason : "no reason given"));
	if (msg && what == HWFS_SWAPPED)
		json_object_set_new(msg, "pause_us", json_integer((json_int_t)pause_us));
	if (msg && what == HWFS_SWAPPED && drain_us >= 0)
		json_object_set_new(msg, "drain_us", json_integer((json_int_t)drain_us));
	if (msg && what == HWFS_SWAPPED && swap_us >= 0)
		json_object_set_new(msg, "swap_us", json_integer((json_int_t)swap_us));
	if (!msg)
		return lib_fail(-ENOMEM, "out of memory");
	pthread_mutex_lock(&w->send_lock);
	r = ctl_send(w->fd, msg); /* the socket is non-blocking: it waits for room */
	pthread_mutex_unlock(&w->send_lock);
	json_decref(msg);
	if (r == -ECONNRESET)
		r = -EPIPE; /* the daemon is gone */
	if (r < 0)
		lib_fail(r, "cannot report to the daemon: %s",
			 r == -EPIPE    ? "it closed the connection"
			 : r == -ENOMEM ? "out of memory"
					: strerror(-r));
	return r;
}

int hwfs_engine_report(struct hwfs_watch *w, enum hwfs_report what, const char *version,
		       const char *reason, uint64_t pause_us)
{
	return engine_report(w, what, version, reason, pause_us, -1, -1);
}

int hwfs_engine_report_swap(struct hwfs_watch *w, const char *version, uint64_t pause_us,
			    uint64_t drain_us, uint64_t swap_us)
{
	return engine_report(w, HWFS_SWAPPED, version, NULL, pause_us,
			     drain_us > INT64_MAX ? INT64_MAX : (int64_t)drain_us,
			     swap_us > INT64_MAX ? INT64_MAX : (int64_t)swap_us);
}

void hwfs_watch_close(struct hwfs_watch *w)
{
	if (!w)
		return;
	if (w->fd >= 0)
		close(w->fd);
	ctl_reader_free(&w->rd);
	pthread_mutex_destroy(&w->send_lock);
	free(w);
}
