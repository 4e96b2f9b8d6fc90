/*
 * ctl.c — framing of the control channel (see ctl.h): JSON objects, one per
 * line, over a unix stream socket.  Reads are buffered per connection and
 * bounded by the reader's max (CTL_MAX_LINE, CTL_MAX_REQUEST in the daemon);
 * the reader consumes exactly one line, so a connection can carry progress
 * lines followed by the answer.  Who calls is the kernel's word (ctl_peer).
 */
#define _GNU_SOURCE
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

int ctl_send(int fd, json_t *msg)
{
	char *s = json_dumps(msg, JSON_COMPACT);
	size_t len, done = 0;
	int r = 0;

	if (!s)
		return -ENOMEM;
	len = strlen(s);
	s[len] = '\n'; /* replace the NUL: we write len + 1 bytes */
	while (done < len + 1) {
		ssize_t n = send(fd, s + done, len + 1 - done, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		done += (size_t)n;
	}
	free(s);
	return r;
}

void ctl_reader_init(struct ctl_reader *rd, int fd)
{
	memset(rd, 0, sizeof(*rd));
	rd->fd = fd;
	rd->max = CTL_MAX_LINE;
}

void ctl_reader_free(struct ctl_reader *rd)
{
	free(rd->buf);
	rd->buf = NULL;
	rd->len = rd->cap = 0;
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
		if (rd->len >= rd->max)
			return -EMSGSIZE;
		if (rd->len == rd->cap) {
			size_t ncap = HWFS_MIN(rd->cap ? rd->cap * 2 : 65536, rd->max);
			char *nb;

			nb = realloc(rd->buf, ncap);
			if (!nb)
				return -ENOMEM;
			rd->buf = nb;
			rd->cap = ncap;
		}
		n = read(rd->fd, rd->buf + rd->len, rd->cap - rd->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return rd->len ? -EBADMSG : -EPIPE;
		rd->len += (size_t)n;
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
