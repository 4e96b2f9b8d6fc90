/*
 * hwfs_coord_http.c — `hwfs coord --http HOST:PORT`: the stand-alone
 * coordinator with the HTTP endpoint of docs/operations.md beside it: the
 * status page (/, tools/dashboards/status_page.html), /api/status (the JSON of `hwfs
 * status --cluster --json`, from the status the coordinator hands over every
 * COORD_STATUS_MS), /metrics (hwfs_coord_nodes and the hwfs_coord_*
 * instruments of fs/common/metrics.h), /healthz and /readyz, served by the
 * bounded server of fs/common/http.c in its own threads while coord_run()
 * serves the nodes (its limits, header deadline and Host: rule are http.h's;
 * --http-host adds names).  No request touches the coordinator's state.
 *
 * Readiness is the coordinator's own start-up report: coord_run() writes
 * "ok" (or "error: ...") on its notify pipe once it listens.  That pipe is
 * interposed here (with or without --http): a relay thread reads it, marks
 * the coordinator ready (/readyz; READY=1 to systemd when NOTIFY_SOCKET is
 * set) and passes the line on to whoever started it (the `hwfs coord`
 * parent, or nobody in the foreground).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "http.h"
#include "hwfs_cli.h"
#include "metrics.h"
#include "sdnotify.h"

struct coord_http {
	int ready;     /* atomic: coord_run() reported "ok" */
	int up_fd;     /* the starter's notify pipe, or -1 */
	int relay_fd;  /* our end of the interposed pipe */
	/* the last status from the coordinator's thread (coord_opts.status) */
	pthread_mutex_t mu; /* guards status; held only to swap or copy it */
	char *status;       /* what `hwfs status --cluster --json` prints, or NULL */
	uint64_t alive, dead; /* atomic: nodes by state, from the same status */
};

/*
 * coord_opts.status, on the coordinator's thread: keep the status as the
 * text /api/status serves (rendered here, so a request never waits for the
 * coordinator) and count the nodes by state for /metrics.
 */
static void on_status(void *arg, json_t *cluster)
{
	struct coord_http *c = arg;
	char *text = json_dumps(cluster, JSON_COMPACT), *old;
	uint64_t alive = 0, dead = 0;
	json_t *n;
	size_t i;

	json_array_foreach(json_object_get(cluster, "nodes"), i, n) {
		if (json_is_true(json_object_get(n, "alive")))
			alive++;
		else
			dead++;
	}
	__atomic_store_n(&c->alive, alive, __ATOMIC_RELAXED);
	__atomic_store_n(&c->dead, dead, __ATOMIC_RELAXED);
	if (!text)
		return;
	pthread_mutex_lock(&c->mu);
	old = c->status;
	c->status = text;
	pthread_mutex_unlock(&c->mu);
	free(old);
}

/* /metrics of a coordinator. */
static void coord_metrics(struct coord_http *c, struct http_resp *r)
{
	struct mbuf b = {0};
	size_t len;

	metrics_build_info(&b);
	metrics_family(&b, "hwfs_coord_nodes", "gauge",
		       "nodes the coordinator knows, by state (alive: heard within node_dead_ms)");
	metrics_sample_u64(&b, "hwfs_coord_nodes", "state", "alive",
			   __atomic_load_n(&c->alive, __ATOMIC_RELAXED));
	metrics_sample_u64(&b, "hwfs_coord_nodes", "state", "dead",
			   __atomic_load_n(&c->dead, __ATOMIC_RELAXED));
	metrics_coord(&b);
	len = b.len;
	http_body(r, HWFS_METRICS_TYPE, mbuf_take(&b), len);
}

/* /api/status: the last status the coordinator handed over. */
static void api_status(struct coord_http *c, struct http_resp *r)
{
	char *copy = NULL;
	int have;

	pthread_mutex_lock(&c->mu);
	have = c->status != NULL;
	if (have)
		copy = strdup(c->status);
	pthread_mutex_unlock(&c->mu);
	if (!have)
		http_text(r, 503, "no status yet (the coordinator is starting)");
	else
		http_body(r, "application/json", copy, copy ? strlen(copy) : 0);
}

/* The HTTP handler of a coordinator. */
static void route(void *arg, const char *path, struct http_resp *r)
{
	struct coord_http *c = arg;

	if (!strcmp(path, "/metrics")) {
		coord_metrics(c, r);
	} else if (!strcmp(path, "/api/status")) {
		api_status(c, r);
	} else if (!strcmp(path, "/")) {
		http_body(r, "text/html; charset=utf-8", strdup(hwfs_status_page),
			  strlen(hwfs_status_page));
	} else if (!strcmp(path, "/healthz")) {
		http_text(r, 200, "ok");
	} else if (!strcmp(path, "/readyz")) {
		if (__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE))
			http_text(r, 200, "ready");
		else
			http_text(r, 503, "starting: the coordinator does not listen yet");
	} else {
		http_text(r, 404, "not found (try /, /api/status, /metrics, /healthz, /readyz)");
	}
}

/* Relay the coordinator's start-up report to the starter, noting "ok". */
static void *relay(void *arg)
{
	struct coord_http *c = arg;
	char buf[4096];
	ssize_t n;

	while ((n = read(c->relay_fd, buf, sizeof(buf))) > 0) {
		if (!strncmp(buf, "ok", 2)) {
			__atomic_store_n(&c->ready, 1, __ATOMIC_RELEASE);
			/* under systemd (Type=notify, -f): listening now */
			hwfs_sd_notify("READY=1\nSTATUS=coordinator listening");
		}
		if (c->up_fd >= 0 && write(c->up_fd, buf, (size_t)n) < 0)
			break;
	}
	if (c->up_fd >= 0)
		close(c->up_fd);
	close(c->relay_fd);
	return NULL;
}

/* Tell the starter @line ("error: ...\n") when there is one, else stderr. */
static void report(int fd, const char *line)
{
	if (fd < 0 || write(fd, line, strlen(line)) < 0)
		fprintf(stderr, "hwfs: %s", line);
}

int coord_serve(struct coord_opts *o, const char *hostport, const char *hosts)
{
	struct coord_http c = {.up_fd = o->notify_fd, .relay_fd = -1,
			       .mu = PTHREAD_MUTEX_INITIALIZER};
	struct http *h = NULL;
	pthread_t t;
	char line[512];
	int pfd[2], r;

	r = hostport ? http_start(hostport, hosts, route, &c, &h) : 0;
	if (r < 0) {
		snprintf(line, sizeof(line), "error: --http %s: %s\n", hostport,
			 r == -EINVAL ? "not HOST:PORT" : strerror(-r));
		report(o->notify_fd, line);
		return 1;
	}
	if (h)
		LOG_INFO("coord: http on %s (/, /api/status, /metrics, /healthz, /readyz)",
			 http_bound(h));
	if (pipe2(pfd, O_CLOEXEC) < 0) {
		http_stop(h);
		report(o->notify_fd, "error: pipe failed\n");
		return 1;
	}
	c.relay_fd = pfd[0];
	if (pthread_create(&t, NULL, relay, &c) != 0) {
		close(pfd[0]);
		close(pfd[1]);
		http_stop(h);
		report(o->notify_fd, "error: cannot start a thread\n");
		return 1;
	}
	o->notify_fd = pfd[1]; /* coord_run() reports on it and closes it, on every path */
	if (h) {
		o->status = on_status;
		o->status_arg = &c;
	}
	r = coord_run(o);
	pthread_join(t, NULL);
	http_stop(h);
	free(c.status);
	return r < 0 ? 1 : 0;
}
