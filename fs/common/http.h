/*
 * http.h — a small, bounded HTTP server for /metrics, /healthz, /readyz and
 * the coordinator's status page, on libmicrohttpd.
 *
 * It runs in its own threads (a fixed pool of HWFS_HTTP_THREADS polling
 * threads inside libmicrohttpd) and shares nothing with FUSE, replication or
 * the control socket but the handler it is given.  What a hostile client can
 * cost is bounded: at most http_conns connections in all and http_conns_per_ip
 * from one address (more are refused at accept), a request whose headers do
 * not fit http_conn_memory bytes is answered 431 and closed, an idle or slow
 * connection is closed after http_timeout_s, and only GET and HEAD are served
 * (no request body is ever read).
 */
#ifndef HWFS_HTTP_H
#define HWFS_HTTP_H

#include <stddef.h>

struct http;

/* What a handler answers: status, content type (static string) and a malloc'd body. */
struct http_resp {
	int status;
	const char *type;
	char *body; /* freed by the server; NULL: empty */
	size_t len;
};

/**
 * An HTTP handler: fill @r for a GET of @path (no query string).  Runs on
 * one of the server's threads, possibly several at once: it must not block
 * on anything a hostile client or a stuck data path controls.
 */
typedef void (*http_handler)(void *arg, const char *path, struct http_resp *r);

/**
 * http_start() - listen on @hostport ("HOST:PORT", "[V6]:PORT"; port 0: any
 * free port) and serve @fn(@arg, ...).  Returns 0 with *@out, or -errno
 * (-EINVAL: bad address; -EADDRINUSE; -ENOMEM).
 */
int http_start(const char *hostport, http_handler fn, void *arg, struct http **out);

/** The address bound, "HOST:PORT" with the port resolved; valid until http_stop(). */
const char *http_bound(const struct http *h);

/** Stop serving (waits for the server's threads) and free. NULL is a no-op. */
void http_stop(struct http *h);

/**
 * http_body() - set @r to 200 with @body (malloc'd, @len bytes: the server
 * frees it) of content type @type; a NULL @body (out of memory) is a 500.
 */
void http_body(struct http_resp *r, const char *type, char *body, size_t len);

/** Set @r to @status with a one-line text/plain body (@fmt, newline added). */
void http_text(struct http_resp *r, int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif /* HWFS_HTTP_H */
