/*
 * http.c — the bounded HTTP server of http.h: a listening socket bound here
 * (so port 0 resolves and the address can be reported), handed to
 * libmicrohttpd, which serves it from a fixed pool of epoll threads with
 * limits on connections (in all and per address), per-connection memory
 * (which bounds the headers a client may send) and idle time.
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
#include <sys/socket.h>
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
#undef MHD_SYM
	mhd.err = so ? 0 : -ELIBACC; /* the library stays loaded for the process's life */
}

/* libmicrohttpd loaded and resolved: 0, or -ELIBACC (logged once). */
static int mhd_load(void)
{
	pthread_once(&mhd_once, mhd_load_once);
	return mhd.err;
}

struct http {
	struct MHD_Daemon *mhd;
	int fd;
	http_handler fn;
	void *arg;
	char bound[128];
};

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

/* libmicrohttpd's access handler: GET/HEAD only, no body, then the handler. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_len, void **con_cls)
{
	static int first_call_marker;
	struct http *h = cls;
	struct http_resp r = {500, "text/plain; charset=utf-8", NULL, 0};
	struct MHD_Response *res;
	enum MHD_Result ret;

	if (strcmp(method, "GET") && strcmp(method, "HEAD"))
		return reply_static(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
	if (*con_cls == NULL) { /* headers only so far: answer when the request is complete */
		*con_cls = &first_call_marker;
		return MHD_YES;
	}
	if (*upload_len) /* a GET with a body: not read, refused */
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

/* Bind and listen on @hostport; the address bound into @bound.  fd or -errno. */
static int bind_listen(const char *hostport, char *bound, size_t blen)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
	struct addrinfo *ai = NULL, *p;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[256], port[16], h[INET6_ADDRSTRLEN], sv[16];
	int fd = -1, r, one = 1;

	if (split_hostport(hostport, host, sizeof(host), port, sizeof(port)) < 0)
		return -EINVAL;
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

int http_start(const char *hostport, http_handler fn, void *arg, struct http **out)
{
	struct http *h = calloc(1, sizeof(*h));
	int fd;

	if (!h)
		return -ENOMEM;
	if (mhd_load() < 0) {
		free(h);
		return -ELIBACC;
	}
	fd = bind_listen(hostport, h->bound, sizeof(h->bound));
	if (fd < 0) {
		free(h);
		return fd;
	}
	h->fd = fd;
	h->fn = fn;
	h->arg = arg;
	h->mhd = mhd.start_daemon(
		MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, h,
		MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)HWFS_HTTP_THREADS,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)hwfs_tun.http_conns,
		MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)hwfs_tun.http_conns_per_ip,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)hwfs_tun.http_timeout_s,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)hwfs_tun.http_conn_memory,
		MHD_OPTION_LISTEN_BACKLOG_SIZE, 128u, MHD_OPTION_END);
	if (!h->mhd) {
		close(fd);
		free(h);
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
	mhd.stop_daemon(h->mhd);
	close(h->fd);
	free(h);
}
