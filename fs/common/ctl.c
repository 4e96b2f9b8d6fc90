/*
 * ctl.c — framing of the control channel (see ctl.h): JSON objects, one per
 * line, over a unix stream socket.  Reads are buffered per connection and
 * bounded by the reader's max (CTL_MAX_LINE, CTL_MAX_REQUEST in the daemon);
 * the reader consumes exactly one line, so a connection can carry progress
 * lines followed by the answer.  Who calls is the kernel's word (ctl_peer).
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctl.h"

static int make_addr(const char *path, struct sockaddr_un *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	strcpy(sa->sun_path, path);
	return 0;
}

int ctl_errno(json_t *res)
{
	json_t *en = json_object_get(res, "errno");
	json_int_t n = json_is_integer(en) ? json_integer_value(en) : 0;

	return n >= 1 && n <= CTL_ERRNO_MAX ? (int)n : 0;
}

int ctl_listen(const char *path, mode_t mode)
{
	struct sockaddr_un sa;
	int fd, r = make_addr(path, &sa);

	if (r < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	unlink(path);
	/* bind() gives the socket file 0777 & ~umask: set the mode explicitly */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(path, mode) < 0 ||
	    listen(fd, 64) < 0) {
		r = -errno;
		unlink(path);
		close(fd);
		return r;
	}
	return fd;
}

int ctl_peer(int fd, struct ctl_peer *p)
{
	struct ucred uc;
	socklen_t len = sizeof(uc);
	gid_t *g = NULL;
	int r = 0;

	memset(p, 0, sizeof(*p));
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		return -errno;
	p->pid = uc.pid;
	p->uid = uc.uid;
	p->gid = uc.gid;
	len = 0;
	/* first ask for the size: ERANGE with the length needed */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, NULL, &len) < 0 && errno != ERANGE) {
		r = -errno;
		goto out;
	}
	if (len) {
		g = malloc(len);
		if (!g) {
			r = -ENOMEM;
			goto out;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
			r = -errno;
			goto out;
		}
	}
	p->groups = g;
	p->n_groups = len / sizeof(gid_t);
	g = NULL;
out:
	free(g);
	return r;
}

void ctl_peer_free(struct ctl_peer *p)
{
	free(p->groups);
	p->groups = NULL;
	p->n_groups = 0;
}

int ctl_peer_in_group(const struct ctl_peer *p, gid_t gid)
{
	if (p->gid == gid)
		return 1;
	for (size_t i = 0; i < p->n_groups; i++)
		if (p->groups[i] == gid)
			return 1;
	return 0;
}

int ctl_connect(const char *path)
{
	struct sockaddr_un sa;
	int fd, r = make_addr(path, &sa);

	if (r < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

/*
 * Write all of @s (@len bytes) to @fd, waiting for room when a non-blocking
 * @fd is full; the first sendmsg() carries @passfd as SCM_RIGHTS when it is
 * >= 0.  Returns 0 or -errno.
 */
static int send_all(int fd, const char *s, size_t len, int passfd)
{
	size_t done = 0;

	while (done < len) {
		union {
			char buf[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} u;
		struct iovec iov = {(void *)(s + done), len - done};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
		ssize_t n;

		if (passfd >= 0 && done == 0) {
			struct cmsghdr *cm;

			memset(&u, 0, sizeof(u));
			mh.msg_control = u.buf;
			mh.msg_controllen = sizeof(u.buf);
			cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &passfd, sizeof(int));
		}
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			struct pollfd p = {.fd = fd, .events = POLLOUT};

			if (poll(&p, 1, -1) < 0 && errno != EINTR)
				return -errno;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		done += (size_t)n;
	}
	return 0;
}

int ctl_send_fd(int fd, json_t *msg, int passfd)
{
	char *s = json_dumps(msg, JSON_COMPACT);
	size_t len;
	int r;

	if (!s)
		return -ENOMEM;
	len = strlen(s);
	s[len] = '\n'; /* replace the NUL: we write len + 1 bytes */
	r = send_all(fd, s, len + 1, passfd);
	free(s);
	return r;
}

int ctl_send(int fd, json_t *msg)
{
	return ctl_send_fd(fd, msg, -1);
}

void ctl_reader_init(struct ctl_reader *rd, int fd)
{
	memset(rd, 0, sizeof(*rd));
	rd->fd = fd;
	rd->max = CTL_MAX_LINE;
	rd->passed_fd = -1;
}

void ctl_reader_free(struct ctl_reader *rd)
{
	free(rd->buf);
	rd->buf = NULL;
	rd->len = rd->cap = 0;
	if (rd->passed_fd >= 0)
		close(rd->passed_fd);
	rd->passed_fd = -1;
}

/*
 * One read into @buf: recvmsg() that, when rd->accept_fds is set, keeps the
 * first descriptor passed with SCM_RIGHTS in rd->passed_fd; every other one
 * is closed at once (a peer cannot make us leak descriptors, nor hold its
 * files open: the daemon's readers accept none).  Returns the byte count, 0
 * at EOF, or -1/errno.
 */
static ssize_t read_some(struct ctl_reader *rd, char *buf, size_t len)
{
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {buf, len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf)};
	ssize_t n = recvmsg(rd->fd, &mh, MSG_CMSG_CLOEXEC);

	if (n < 0)
		return n;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		size_t nfd;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < nfd; i++) {
			int f;

			memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (rd->accept_fds && rd->passed_fd < 0)
				rd->passed_fd = f;
			else
				close(f);
		}
	}
	return n;
}

int ctl_take_fd(struct ctl_reader *rd)
{
	int f = rd->passed_fd;

	rd->passed_fd = -1;
	return f;
}

ssize_t ctl_reader_fill(struct ctl_reader *rd)
{
	ssize_t n;

	if (rd->len >= rd->max)
		return -EMSGSIZE;
	if (rd->len == rd->cap) {
		size_t ncap = HWFS_MIN(rd->cap ? rd->cap * 2 : 65536, rd->max);
		char *nb = realloc(rd->buf, ncap);

		if (!nb)
			return -ENOMEM;
		rd->buf = nb;
		rd->cap = ncap;
	}
	do
		n = read_some(rd, rd->buf + rd->len, rd->cap - rd->len);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	rd->len += (size_t)n;
	return n;
}

int ctl_reader_has_line(const struct ctl_reader *rd)
{
	return rd->len && memchr(rd->buf, '\n', rd->len) != NULL;
}

int ctl_recv(struct ctl_reader *rd, json_t **msg)
{
	size_t scan = 0;
	json_error_t jerr;
	char *nl;

	for (;;) {
		ssize_t n;

		nl = rd->len ? memchr(rd->buf + scan, '\n', rd->len - scan) : NULL;
		if (nl)
			break;
		scan = rd->len;
		n = ctl_reader_fill(rd);
		if (n < 0)
			return (int)n;
		if (n == 0) { /* a last line cut short is malformed, once; then EOF */
			if (!rd->len)
				return -EPIPE;
			rd->len = 0;
			return -EBADMSG;
		}
	}
	*msg = json_loadb(rd->buf, (size_t)(nl - rd->buf), JSON_REJECT_DUPLICATES, &jerr);
	rd->len -= (size_t)(nl + 1 - rd->buf);
	memmove(rd->buf, nl + 1, rd->len);
	if (*msg && json_is_object(*msg))
		return 0;
	if (*msg)
		json_decref(*msg);
	return -EBADMSG;
}
