/*
 * http.c — the bounded HTTP server of http.h: a listening socket bound here
 * (so port 0 resolves and the address can be reported), handed to
 * libmicrohttpd, which serves it from a fixed pool of polling threads with
 * limits on per-connection memory (which bounds the headers a client may
 * send) and idle time.
 *
 * The connection budget is kept here, not by libmicrohttpd: its own limits
 * refuse the newcomer once full, so 32 slow connections from one address (or
 * a few hundred from 30 loopback addresses) shut every prober out for as
 * long as they stay, and its idle timeout restarts with every byte.  Each
 * connection libmicrohttpd accepts is recorded (MHD_OPTION_NOTIFY_CONNECTION)
 * as "waiting" (for its request headers, since it connected or since its
 * previous answer) or "busy" (headers complete: being answered).  A waiting
 * connection past http_header_ms is closed by the reaper thread; a newcomer
 * past http_conns_per_ip or http_conns closes the oldest waiting connection
 * of its address, or of all, and is itself refused only when none waits.  A
 * prober's complete request therefore always finds room, and an attacker
 * must send complete requests to keep a connection.
 *
 * A connection is closed with shutdown(2) on its socket, under http.mu:
 * libmicrohttpd then sees the end of the stream and closes it itself,
 * telling us first (MHD_CONNECTION_NOTIFY_CLOSED, which takes http.mu and
 * forgets the record) and only then close(2)ing the descriptor, so the
 * descriptor shut down is always still the connection's.
 *
 * libmicrohttpd is loaded with dlopen() when the first server starts, not
 * linked: build/hwfs is the daemon and the CLI in one program, and linking it
 * made every `hwfs commit`, `hwfs status`, ... load libmicrohttpd's GnuTLS
 * and its ten libraries and run their constructors (2.0 -> 5.0 ms of CPU per
 * command here, docs/benchmarks.md "Commit latency").  Only the handful of
 * calls below are used, through the table mhd.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hwfs_common.h"
#include "http.h"
#include "tunables.h"

/* libmicrohttpd's polling threads: scrapes are rare and cheap, and two
 * threads keep one slow handler from holding up every other request. */
#define HWFS_HTTP_THREADS 2

/* The shared library dlopen()ed (the soname libmicrohttpd-dev links against). */
#define HTTP_MHD_SONAME "libmicrohttpd.so.12"

/* The libmicrohttpd calls used here, resolved once by mhd_load(). */
static struct {
	__typeof__(&MHD_create_response_from_buffer) create_response_from_buffer;
	__typeof__(&MHD_create_response_from_buffer_with_free_callback) create_response_free_cb;
	__typeof__(&MHD_add_response_header) add_response_header;
	__typeof__(&MHD_queue_response) queue_response;
	__typeof__(&MHD_destroy_response) destroy_response;
	__typeof__(&MHD_start_daemon) start_daemon;
	__typeof__(&MHD_stop_daemon) stop_daemon;
	__typeof__(&MHD_get_connection_info) get_connection_info;
	__typeof__(&MHD_lookup_connection_value) lookup_connection_value;
	int err; /* 0 loaded, -errno when it cannot be */
} mhd;
static pthread_once_t mhd_once = PTHREAD_ONCE_INIT;

static void mhd_load_once(void)
{
	void *so = dlopen(HTTP_MHD_SONAME, RTLD_NOW | RTLD_LOCAL);

#define MHD_SYM(field, name)                                                                      \
	do {                                                                                       \
		if (so && !(*(void **)&mhd.field = dlsym(so, name)))                               \
			so = NULL;                                                                 \
	} while (0)
	if (!so)
		LOG_ERR("http: cannot load %s: %s", HTTP_MHD_SONAME, dlerror());
	MHD_SYM(create_response_from_buffer, "MHD_create_response_from_buffer");
	MHD_SYM(create_response_free_cb, "MHD_create_response_from_buffer_with_free_callback");
	MHD_SYM(add_response_header, "MHD_add_response_header");
	MHD_SYM(queue_response, "MHD_queue_response");
	MHD_SYM(destroy_response, "MHD_destroy_response");
	MHD_SYM(start_daemon, "MHD_start_daemon");
	MHD_SYM(stop_daemon, "MHD_stop_daemon");
	MHD_SYM(get_connection_info, "MHD_get_connection_info");
	MHD_SYM(lookup_connection_value, "MHD_lookup_connection_value");
#undef MHD_SYM
	mhd.err = so ? 0 : -ELIBACC; /* the library stays loaded for the process's life */
}

/* libmicrohttpd loaded and resolved: 0, or -ELIBACC (logged once). */
static int mhd_load(void)
{
	pthread_once(&mhd_once, mhd_load_once);
	return mhd.err;
}

/* Where a connection stands (struct http_conn.state). */
enum conn_state {
	CONN_WAITING, /* on http.waiting: its request headers are not complete yet */
	CONN_BUSY,    /* on http.busy: a complete request, being answered */
	CONN_GONE,    /* on no list: shut down here, libmicrohttpd has yet to close it */
};

/* One connection libmicrohttpd accepted (its socket context), until it closes it. */
struct http_conn {
	struct http_conn *prev, *next;
	int fd;
	enum conn_state state;
	uint64_t since_ns; /* CONN_WAITING: when it started waiting (connected, or answered) */
	struct sockaddr_storage addr;
};

/* A list of connections, oldest first. */
struct conn_list {
	struct http_conn *head, *tail;
	size_t n;
};

struct http {
	struct MHD_Daemon *mhd;
	int fd;
	http_handler fn;
	void *arg;
	char bound[128];
	char name[256];   /* HOST of the address served, when a name ("" for "*") */
	char *hosts;      /* more names a Host: may give, comma-separated, or NULL */
	int any_host;     /* hosts is "*" */
	uint64_t header_ns; /* http_header_ms */
	size_t conns, per_ip; /* http_conns, http_conns_per_ip */
	pthread_t reaper;
	int reaper_running;
	pthread_mutex_t mu; /* guards the lists, the records' states and stop; never
			     * held while calling libmicrohttpd */
	pthread_cond_t cv;  /* (CLOCK_MONOTONIC) wakes the reaper */
	struct conn_list waiting, busy;
	int stop;
	pthread_mutex_t log_mu; /* guards the three below (on_mhd_log()) */
	uint64_t log_window_ns; /* when the current window began */
	unsigned log_n;         /* messages logged in it */
	uint64_t log_dropped;   /* messages left out of it */
};

/* Append @c to @l. */
static void list_add(struct conn_list *l, struct http_conn *c)
{
	c->next = NULL;
	c->prev = l->tail;
	if (l->tail)
		l->tail->next = c;
	else
		l->head = c;
	l->tail = c;
	l->n++;
}

/* Take @c off @l. */
static void list_del(struct conn_list *l, struct http_conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		l->head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		l->tail = c->prev;
	c->prev = c->next = NULL;
	l->n--;
}

/* The list @c is on (CONN_WAITING or CONN_BUSY). */
static struct conn_list *list_of(struct http *h, const struct http_conn *c)
{
	return c->state == CONN_WAITING ? &h->waiting : &h->busy;
}

/* Do @a and @b come from the same address (the port aside)? */
static int same_addr(const struct http_conn *a, const struct http_conn *b)
{
	if (a->addr.ss_family != b->addr.ss_family)
		return 0;
	if (a->addr.ss_family == AF_INET)
		return ((const struct sockaddr_in *)&a->addr)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)&b->addr)->sin_addr.s_addr;
	if (a->addr.ss_family == AF_INET6)
		return !memcmp(&((const struct sockaddr_in6 *)&a->addr)->sin6_addr,
			       &((const struct sockaddr_in6 *)&b->addr)->sin6_addr,
			       sizeof(struct in6_addr));
	return 1; /* another family: one budget for all of it */
}

/*
 * Close @c (h->mu held; CONN_WAITING or CONN_BUSY): off its list and shut
 * down.  libmicrohttpd sees the end of the stream and closes it, which
 * on_connection() hears before the descriptor is closed.
 */
static void conn_close(struct http *h, struct http_conn *c)
{
	list_del(list_of(h, c), c);
	c->state = CONN_GONE;
	shutdown(c->fd, SHUT_RDWR);
}

/* Make @c wait for a request's headers from now on (h->mu held). */
static void conn_wait(struct http *h, struct http_conn *c)
{
	c->state = CONN_WAITING;
	c->since_ns = hwfs_mono_ns();
	list_add(&h->waiting, c);
	if (h->waiting.n == 1) /* the reaper may be waiting with no deadline */
		pthread_cond_signal(&h->cv);
}

/*
 * Admit the new connection @c (h->mu held): within the budget, it waits for
 * its headers; past the per-address or the total limit, the oldest waiting
 * connection (of its address, or of all) is closed for it, and when none
 * waits, @c itself is refused.
 */
static void conn_admit(struct http *h, struct http_conn *c)
{
	struct http_conn *victim = NULL, *p;
	size_t mine = 0;

	for (p = h->waiting.head; p; p = p->next) {
		if (!same_addr(p, c))
			continue;
		if (!mine++)
			victim = p; /* the oldest waiting one of this address */
	}
	for (p = h->busy.head; p; p = p->next)
		mine += same_addr(p, c);
	if (mine < h->per_ip) {
		victim = NULL;
		if (h->waiting.n + h->busy.n >= h->conns && !(victim = h->waiting.head))
			goto refuse;
	} else if (!victim) {
		goto refuse;
	}
	if (victim)
		conn_close(h, victim);
	conn_wait(h, c);
	return;
refuse:
	c->state = CONN_GONE;
	shutdown(c->fd, SHUT_RDWR);
}

/* The record of @c (its socket context), or NULL. */
static struct http_conn *conn_of(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
		mhd.get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

/* @c has sent a complete request: busy until answered (not closed for the budget). */
static void conn_busy(struct http *h, struct MHD_Connection *c)
{
	struct http_conn *hc = conn_of(c);

	if (!hc)
		return;
	pthread_mutex_lock(&h->mu);
	if (hc->state == CONN_WAITING) {
		list_del(&h->waiting, hc);
		hc->state = CONN_BUSY;
		list_add(&h->busy, hc);
	}
	pthread_mutex_unlock(&h->mu);
}

/* MHD_OPTION_NOTIFY_CONNECTION: record a new connection, forget a closed one. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	struct http *h = cls;
	struct http_conn *hc = *socket_context;
	const union MHD_ConnectionInfo *fd, *addr;

	if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (!hc)
			return;
		pthread_mutex_lock(&h->mu);
		if (hc->state != CONN_GONE)
			list_del(list_of(h, hc), hc);
		pthread_mutex_unlock(&h->mu);
		*socket_context = NULL;
		free(hc);
		return;
	}
	if (code != MHD_CONNECTION_NOTIFY_STARTED)
		return;
	fd = mhd.get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	addr = mhd.get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (!fd)
		return;
	hc = calloc(1, sizeof(*hc));
	if (!hc) { /* not counted, so not kept */
		shutdown(fd->connect_fd, SHUT_RDWR);
		return;
	}
	hc->fd = fd->connect_fd;
	if (addr && addr->client_addr)
		memcpy(&hc->addr, addr->client_addr,
		       addr->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
		       : addr->client_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
								  : sizeof(sa_family_t));
	pthread_mutex_lock(&h->mu);
	conn_admit(h, hc);
	pthread_mutex_unlock(&h->mu);
	*socket_context = hc;
}

/* MHD_OPTION_NOTIFY_COMPLETED: answered; a kept-alive connection waits for its next request. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode code)
{
	struct http *h = cls;
	struct http_conn *hc = conn_of(c);

	if (!hc)
		return;
	pthread_mutex_lock(&h->mu);
	if (hc->state == CONN_BUSY) {
		list_del(&h->busy, hc);
		conn_wait(h, hc);
	}
	pthread_mutex_unlock(&h->mu);
}

/* The reaper: close every connection that waited for its headers past http_header_ms. */
static void *reaper(void *arg)
{
	struct http *h = arg;
	struct http_conn *c;
	struct timespec ts;
	uint64_t at;

	pthread_mutex_lock(&h->mu);
	while (!h->stop) {
		uint64_t now = hwfs_mono_ns();

		while ((c = h->waiting.head) && c->since_ns + h->header_ns <= now)
			conn_close(h, c);
		if (!c) {
			pthread_cond_wait(&h->cv, &h->mu);
			continue;
		}
		at = c->since_ns + h->header_ns;
		ts.tv_sec = (time_t)(at / 1000000000u);
		ts.tv_nsec = (long)(at % 1000000000u);
		pthread_cond_timedwait(&h->cv, &h->mu, &ts);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/* libmicrohttpd's messages logged per HTTP_LOG_WINDOW_S, the rest counted. */
#define HTTP_LOG_BURST 10
#define HTTP_LOG_WINDOW_S 60

/*
 * MHD_OPTION_EXTERNAL_LOGGER: libmicrohttpd's messages (one per connection a
 * client breaks off, among others) go to the log, at most HTTP_LOG_BURST per
 * HTTP_LOG_WINDOW_S seconds and server, so that a flood of connections
 * cannot fill the disk with them; the number left out is said with the first
 * message of the next window.
 */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	struct http *h = cls;
	char line[512];
	uint64_t now = hwfs_mono_ns(), dropped = 0;
	int say;

	pthread_mutex_lock(&h->log_mu);
	if (now - h->log_window_ns >= HTTP_LOG_WINDOW_S * 1000000000ull) {
		dropped = h->log_dropped;
		h->log_window_ns = now;
		h->log_n = 0;
		h->log_dropped = 0;
	}
	say = h->log_n < HTTP_LOG_BURST;
	if (say)
		h->log_n++;
	else
		h->log_dropped++;
	pthread_mutex_unlock(&h->log_mu);
	if (dropped)
		LOG_WARN("http %s: %llu more libmicrohttpd messages left out", h->bound,
			 (unsigned long long)dropped);
	if (!say)
		return;
	vsnprintf(line, sizeof(line), fmt, ap);
	LOG_WARN("http %s: %.*s", h->bound, (int)strcspn(line, "\n"), line);
}

/* Is @p "" or ":PORT" (what may follow the name in a Host:)? */
static int host_port_ok(const char *p)
{
	return !*p || (p[0] == ':' && p[1] && strspn(p + 1, "0123456789") == strlen(p + 1));
}

/* Is @name (@n bytes, no NUL needed) one of the comma-separated @list? */
static int name_listed(const char *list, const char *name, size_t n)
{
	while (list && *list) {
		size_t k = strcspn(list, ",");

		if (k == n && !strncasecmp(list, name, n))
			return 1;
		list += k + (list[k] == ',');
	}
	return 0;
}

/*
 * May a request with "Host: @host" be served?  An IP address (v4, or [v6]),
 * with or without a port: such a page cannot be rebound to us by DNS.  A
 * name: localhost, the host of the address served, or a name of h->hosts
 * (case aside, one final dot allowed).
 */
static int host_allowed(const struct http *h, const char *host)
{
	char name[256];
	const char *end;
	struct in6_addr a6;
	struct in_addr a4;
	size_t n;

	if (h->any_host)
		return 1;
	if (host[0] == '[') {
		end = strchr(host, ']');
		if (!end || !host_port_ok(end + 1) || (n = (size_t)(end - host - 1)) >= sizeof(name))
			return 0;
		memcpy(name, host + 1, n);
		name[n] = '\0';
		return inet_pton(AF_INET6, name, &a6) == 1;
	}
	n = strcspn(host, ":");
	if (n == 0 || n >= sizeof(name) || !host_port_ok(host + n))
		return 0;
	memcpy(name, host, n);
	name[n] = '\0';
	if (n > 1 && name[n - 1] == '.')
		name[--n] = '\0';
	if (inet_pton(AF_INET, name, &a4) == 1)
		return 1;
	return !strcasecmp(name, "localhost") || (h->name[0] && !strcasecmp(name, h->name)) ||
	       name_listed(h->hosts, name, n);
}

int http_hosts_valid(const char *list)
{
	static const char ok[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";

	if (!list || !strcmp(list, "*"))
		return 0;
	for (;;) {
		size_t k = strcspn(list, ",");

		if (k == 0 || k > 253 || strspn(list, ok) != k)
			return -EINVAL;
		if (!list[k])
			return 0;
		list += k + 1;
	}
}

int http_hosts_add(char *buf, size_t len, const char *list)
{
	size_t used = strlen(buf);

	if (http_hosts_valid(list) < 0)
		return -EINVAL;
	if (used + !!used + strlen(list) + 1 > len)
		return -ENAMETOOLONG;
	snprintf(buf + used, len - used, "%s%s", used ? "," : "", list);
	return 0;
}

void http_text(struct http_resp *r, int status, const char *fmt, ...)
{
	va_list ap;
	char *s = NULL, *t;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	r->status = status;
	r->type = "text/plain; charset=utf-8";
	free(r->body);
	r->body = NULL;
	r->len = 0;
	if (n < 0)
		return;
	t = realloc(s, (size_t)n + 2);
	if (!t) {
		free(s);
		return;
	}
	t[n] = '\n';
	t[n + 1] = '\0';
	r->body = t;
	r->len = (size_t)n + 1;
}

void http_body(struct http_resp *r, const char *type, char *body, size_t len)
{
	if (!body) {
		http_text(r, 500, "out of memory");
		return;
	}
	free(r->body);
	r->status = 200;
	r->type = type;
	r->body = body;
	r->len = len;
}

/* Queue @status with the static text @msg on @c. */
static enum MHD_Result reply_static(struct MHD_Connection *c, unsigned status, const char *msg)
{
	struct MHD_Response *res =
		mhd.create_response_from_buffer(strlen(msg), (void *)msg, MHD_RESPMEM_PERSISTENT);
	enum MHD_Result r;

	if (!res)
		return MHD_NO;
	mhd.add_response_header(res, "Content-Type", "text/plain; charset=utf-8");
	r = mhd.queue_response(c, status, res);
	mhd.destroy_response(res);
	return r;
}

/* Does the request on @c announce a body (which is never read)? */
static int has_body(struct MHD_Connection *c)
{
	const char *len = mhd.lookup_connection_value(c, MHD_HEADER_KIND,
						      MHD_HTTP_HEADER_CONTENT_LENGTH);

	return mhd.lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) ||
	       (len && strspn(len, "0") != strlen(len));
}

/*
 * libmicrohttpd's access handler.  First call (the headers complete): the
 * connection is busy, and a method other than GET or HEAD, a Host: not
 * allowed or an announced body is answered at once.  Second call: the
 * handler's answer.
 */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_len, void **con_cls)
{
	static int first_call_marker;
	struct http *h = cls;
	struct http_resp r = {500, "text/plain; charset=utf-8", NULL, 0};
	struct MHD_Response *res;
	const char *host;
	enum MHD_Result ret;

	if (*con_cls == NULL) { /* the headers are complete */
		*con_cls = &first_call_marker;
		conn_busy(h, c);
		if (strcmp(method, "GET") && strcmp(method, "HEAD"))
			return reply_static(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
		host = mhd.lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
		if (host && !host_allowed(h, host))
			return reply_static(c, MHD_HTTP_MISDIRECTED_REQUEST,
					    "unknown name in Host: (allowed: IP addresses, localhost, "
					    "the --http host and --http-host names)\n");
		if (has_body(c))
			return reply_static(c, MHD_HTTP_BAD_REQUEST, "no request body expected\n");
		return MHD_YES;
	}
	if (*upload_len) /* a body after all: not read, refused */
		return reply_static(c, MHD_HTTP_BAD_REQUEST, "no request body expected\n");
	h->fn(h->arg, url, &r);
	res = mhd.create_response_free_cb(r.len, r.body, free);
	if (!res) {
		free(r.body);
		return MHD_NO;
	}
	mhd.add_response_header(res, "Content-Type", r.type ? r.type : "text/plain");
	mhd.add_response_header(res, "Cache-Control", "no-store");
	ret = mhd.queue_response(c, (unsigned)r.status, res);
	mhd.destroy_response(res);
	return ret;
}

/* Split "HOST:PORT" / "[V6]:PORT" into @host and @port.  0 or -EINVAL. */
static int split_hostport(const char *s, char *host, size_t hlen, char *port, size_t plen)
{
	const char *colon;
	size_t n;

	if (s[0] == '[') {
		const char *end = strchr(s, ']');

		if (!end || end[1] != ':')
			return -EINVAL;
		n = (size_t)(end - s - 1);
		colon = end + 1;
		s++;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return -EINVAL;
		n = (size_t)(colon - s);
	}
	if (n == 0 || n >= hlen || strlen(colon + 1) == 0 || strlen(colon + 1) >= plen ||
	    strspn(colon + 1, "0123456789") != strlen(colon + 1))
		return -EINVAL;
	memcpy(host, s, n);
	host[n] = '\0';
	snprintf(port, plen, "%s", colon + 1);
	return 0;
}

/*
 * Bind and listen on @hostport; the address bound into @bound, its HOST into
 * @name (@nlen bytes) when it is a name, not "*".  fd or -errno.
 */
static int bind_listen(const char *hostport, char *bound, size_t blen, char *name, size_t nlen)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
	struct addrinfo *ai = NULL, *p;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[256], port[16], h[INET6_ADDRSTRLEN], sv[16];
	int fd = -1, r, one = 1;

	if (split_hostport(hostport, host, sizeof(host), port, sizeof(port)) < 0)
		return -EINVAL;
	snprintf(name, nlen, "%s", strcmp(host, "*") ? host : "");
	if (getaddrinfo(strcmp(host, "*") ? host : NULL, port, &hints, &ai) != 0)
		return -EINVAL;
	r = -EADDRNOTAVAIL;
	for (p = ai; p; p = p->ai_next) {
		fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0) {
			r = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, p->ai_addr, p->ai_addrlen) == 0 && listen(fd, 128) == 0)
			break;
		r = -errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0)
		return r;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0 ||
	    getnameinfo((struct sockaddr *)&ss, sl, h, sizeof(h), sv, sizeof(sv),
			NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
		r = -errno ?: -EIO;
		close(fd);
		return r;
	}
	snprintf(bound, blen, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, sv);
	return fd;
}

/* Free @h and what it holds (the server stopped or never started). */
static void http_free(struct http *h)
{
	if (h->fd >= 0)
		close(h->fd);
	pthread_cond_destroy(&h->cv);
	pthread_mutex_destroy(&h->mu);
	pthread_mutex_destroy(&h->log_mu);
	free(h->hosts);
	free(h);
}

int http_start(const char *hostport, const char *hosts, http_handler fn, void *arg,
	       struct http **out)
{
	struct http *h = calloc(1, sizeof(*h));
	pthread_condattr_t ca;
	int fd;

	if (!h)
		return -ENOMEM;
	h->fd = -1;
	pthread_mutex_init(&h->mu, NULL);
	pthread_mutex_init(&h->log_mu, NULL);
	h->log_window_ns = hwfs_mono_ns();
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (http_hosts_valid(hosts) < 0) {
		http_free(h);
		return -EINVAL;
	}
	h->any_host = hosts && !strcmp(hosts, "*");
	if (hosts && !(h->hosts = strdup(hosts))) {
		http_free(h);
		return -ENOMEM;
	}
	if (mhd_load() < 0) {
		http_free(h);
		return -ELIBACC;
	}
	fd = bind_listen(hostport, h->bound, sizeof(h->bound), h->name, sizeof(h->name));
	if (fd < 0) {
		http_free(h);
		return fd;
	}
	h->fd = fd;
	h->fn = fn;
	h->arg = arg;
	h->header_ns = hwfs_tun.http_header_ms * 1000000ull;
	h->conns = (size_t)hwfs_tun.http_conns;
	h->per_ip = (size_t)hwfs_tun.http_conns_per_ip;
	if (pthread_create(&h->reaper, NULL, reaper, h) != 0) {
		http_free(h);
		return -EAGAIN;
	}
	h->reaper_running = 1;
	/*
	 * libmicrohttpd's own limit only backs ours up (connections shut down
	 * here and not closed yet): twice the budget, which its thread pool
	 * shares out; no per-address limit of its own (it refuses newcomers).
	 */
	h->mhd = mhd.start_daemon(
		MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, h,
		MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h, /* first, or some go to stderr */
		MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)HWFS_HTTP_THREADS,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)(2 * h->conns),
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)hwfs_tun.http_timeout_s,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)hwfs_tun.http_conn_memory,
		MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
		MHD_OPTION_LISTEN_BACKLOG_SIZE, 128u, MHD_OPTION_END);
	/*
	 * The listening socket is libmicrohttpd's now: MHD_stop_daemon() closes
	 * it (closing it here as well closed whatever descriptor had taken its
	 * number meanwhile), and a failed start may have closed it: left alone.
	 */
	h->fd = -1;
	if (!h->mhd) {
		http_stop(h);
		return -EIO;
	}
	*out = h;
	return 0;
}

const char *http_bound(const struct http *h)
{
	return h->bound;
}

void http_stop(struct http *h)
{
	if (!h)
		return;
	if (h->reaper_running) {
		pthread_mutex_lock(&h->mu);
		h->stop = 1;
		pthread_cond_signal(&h->cv);
		pthread_mutex_unlock(&h->mu);
		pthread_join(h->reaper, NULL);
	}
	if (h->mhd)
		mhd.stop_daemon(h->mhd); /* closes every connection: on_connection() frees them */
	http_free(h);
}
