/*
 * http.h — a small, bounded HTTP server for /metrics, /healthz, /readyz and
 * the coordinator's status page, on libmicrohttpd.
 *
 * It runs in its own threads (a fixed pool of HWFS_HTTP_THREADS polling
 * threads inside libmicrohttpd) and shares nothing with FUSE, replication or
 * the control socket but the handler it is given.  What a hostile client can
 * cost is bounded, and complete requests are favoured over incomplete ones:
 *
 *   - a connection must send its complete request headers within
 *     http_header_ms of connecting (or of its previous answer, kept alive);
 *     else it is closed, however steadily it trickles;
 *   - at most http_conns connections are served at once and http_conns_per_ip
 *     from one address; a connection past either limit closes the oldest one
 *     still waiting for its headers (of that address, or of all), and is
 *     refused only when every connection counted has sent a complete request;
 *   - a request whose headers do not fit http_conn_memory bytes is answered
 *     431 and closed, an idle or slow connection is closed after
 *     http_timeout_s, and only GET and HEAD without a body are served;
 *   - a `Host:` must name an IP address, localhost, the host of the address
 *     served, or one of the names given to http_start() (DNS rebinding: a web
 *     page of another name must not read the answers); others get 421.  A
 *     request without Host (HTTP/1.0) is served.
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
 * free port) and serve @fn(@arg, ...).  @hosts: the names a `Host:` may give
 * besides IP addresses, localhost and HOST, comma-separated ("*": any name),
 * or NULL (check it first with http_hosts_valid()).  Returns 0 with *@out,
 * or -errno (-EINVAL: bad address or @hosts; -EADDRINUSE; -ENOMEM).
 */
int http_start(const char *hostport, const char *hosts, http_handler fn, void *arg,
	       struct http **out);

/**
 * http_hosts_valid() - is @list a valid @hosts of http_start(): names of 1 to
 * 253 characters of [A-Za-z0-9._-], comma-separated, or "*"?  0 or -EINVAL.
 */
int http_hosts_valid(const char *list);

/**
 * http_hosts_add() - append the names @list (checked with http_hosts_valid())
 * to the comma-separated list in @buf (@len bytes, "" at first): how a command
 * line's repeated --http-host become one list.  0, -EINVAL or -ENAMETOOLONG.
 */
int http_hosts_add(char *buf, size_t len, const char *list);

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
