/*
 * daemon_req.c — what every control operation uses to read its request and
 * write its reply: the error and ok replies (every error reply carries
 * "errno", docs/libhwfs.md "Errors"), the members of a request, and who the
 * peer is (privileged or not, the permission bits that apply to it).  The
 * bottom of the daemon's files: it calls none of them.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_i.h"

/* ----------------------------------------------------------- replies */

json_t *daemon_err_reply(int err, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (err <= 0 || err > CTL_ERRNO_MAX)
		err = EIO;
	return json_pack("{s:b, s:s, s:i}", "ok", 0, "error", buf, "errno", err);
}

json_t *daemon_ok_reply(void)
{
	return json_pack("{s:b}", "ok", 1);
}

/* ----------------------------------------------------------- requests */

/* String member @key of @req, or NULL (daemon_i.h). */
const char *daemon_req_str(json_t *req, const char *key)
{
	json_t *v = json_object_get(req, key);

	return json_is_string(v) ? json_string_value(v) : NULL;
}

/* The "gpu" member of @req (daemon_i.h): 0 or -EINVAL. */
int daemon_req_gpu(json_t *req, int optional, int *gpu)
{
	json_t *g = json_object_get(req, "gpu");
	json_int_t n;

	if (!g || json_is_null(g)) {
		*gpu = -1;
		return optional ? 0 : -EINVAL;
	}
	if (!json_is_integer(g))
		return -EINVAL;
	n = json_integer_value(g);
	if (n == -1 && optional) {
		*gpu = -1;
		return 0;
	}
	if (n < 0 || n > DAEMON_GPU_MAX)
		return -EINVAL;
	*gpu = (int)n;
	return 0;
}

/* ----------------------------------------------------------- peers */

/* Is @p root, the mount's owner or a member of --ctl-group?  Returns 1 or 0. */
int daemon_peer_privileged(const struct daemon *d, const struct ctl_peer *p)
{
	return p->uid == 0 || p->uid == d->owner ||
	       (d->o->ctl_gid >= 0 && ctl_peer_in_group(p, (gid_t)d->o->ctl_gid));
}

/* The rwx bits (0..7) of a node of @mode, @uid and @gid that apply to @p (see daemon_i.h). */
uint32_t daemon_peer_bits(const struct ctl_peer *p, uint32_t mode, uint32_t uid, uint32_t gid)
{
	if (p->uid == uid)
		return (mode >> 6) & 7;
	if (ctl_peer_in_group(p, gid))
		return (mode >> 3) & 7;
	return mode & 7;
}
