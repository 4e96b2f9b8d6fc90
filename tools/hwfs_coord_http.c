/*
 * hwfs_coord_http.c — `hwfs coord --http HOST:PORT`: the stand-alone
 * coordinator with the HTTP endpoint of docs/operations.md beside it
 * (/metrics with the hwfs_coord_* instruments of fs/common/metrics.h,
 * /healthz, /readyz), served by the bounded server of fs/common/http.c in its
 * own threads while coord_run() serves the nodes.
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
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "coord.h"
#include "http.h"
#include "hwfs_cli.h"
#include "metrics.h"

struct coord_http {
	int ready;     /* atomic: coord_run() reported "ok" */
	int up_fd;     /* the starter's notify pipe, or -1 */
	int relay_fd;  /* our end of the interposed pipe */
};

/* The HTTP handler of a coordinator. */
static void route(void *arg, const char *path, struct http_resp *r)
{
	struct coord_http *c = arg;

	if (!strcmp(path, "/metrics")) {
		struct mbuf b = {0};

		metrics_build_info(&b);
		metrics_coord(&b);
		if (b.oom) {
			free(b.p);
			http_text(r, 500, "out of memory");
			return;
		}
		r->status = 200;
		r->type = "text/plain; version=0.0.4; charset=utf-8";
		r->body = b.p;
		r->len = b.len;
	} else if (!strcmp(path, "/healthz")) {
		http_text(r, 200, "ok");
	} else if (!strcmp(path, "/readyz")) {
		if (__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE))
			http_text(r, 200, "ready");
		else
			http_text(r, 503, "starting: the coordinator does not listen yet");
	} else {
		http_text(r, 404, "not found (try /metrics, /healthz, /readyz)");
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
			sd_notify(0, "READY=1\nSTATUS=coordinator listening");
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

int coord_serve(struct coord_opts *o, const char *hostport)
{
	struct coord_http c = {.up_fd = o->notify_fd, .relay_fd = -1};
	struct http *h = NULL;
	pthread_t t;
	char line[512];
	int pfd[2], r;

	r = hostport ? http_start(hostport, route, &c, &h) : 0;
	if (r < 0) {
		snprintf(line, sizeof(line), "error: --http %s: %s\n", hostport,
			 r == -EINVAL ? "not HOST:PORT" : strerror(-r));
		report(o->notify_fd, line);
		return 1;
	}
	if (h)
		LOG_INFO("coord: http on %s (/metrics, /healthz, /readyz)", http_bound(h));
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
	r = coord_run(o);
	pthread_join(t, NULL);
	http_stop(h);
	return r < 0 ? 1 : 0;
}
