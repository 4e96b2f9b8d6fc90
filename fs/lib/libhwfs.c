/*
 * libhwfs.c — the client library's handle, errors and plain requests: find a
 * mount's daemon (hwfs_open), send it one request and read the answer
 * (hwfs_call), list versions, read `current`.  Mapping is libhwfs_map.c,
 * events and engines are libhwfs_watch.c, the GPU plane (device loads and
 * maps) libhwfs_gpu.c and DLPack tensors libhwfs_dlpack.c.
 *
 * Every request opens its own connection to the control socket named by the
 * mount root's xattr `user.hwfs.control` and speaks the JSON lines of
 * fs/common/ctl.h; the xattr is read anew for each connection, so a handle survives
 * a remount.  Errors: functions return 0 or -errno and leave one sentence for
 * the calling thread in a thread-local buffer (hwfs_errmsg).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "libhwfs_i.h"

static __thread char t_errmsg[LIB_ERRMSG_MAX];

int lib_fail(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(t_errmsg, sizeof(t_errmsg), fmt, ap);
	va_end(ap);
	return err;
}

void lib_clear_error(void)
{
	t_errmsg[0] = '\0';
}

const char *hwfs_errmsg(void)
{
	return t_errmsg;
}

const char *lib_jstr(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_string(v) ? json_string_value(v) : NULL;
}

int lib_valid_name(const char *name)
{
	size_t n = name ? strlen(name) : 0;

	if (n == 0 || n > HWFS_NAME_MAX || !strcmp(name, ".") || !strcmp(name, ".."))
		return 0;
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		if (*p == '/' || *p < 0x20 || *p == 0x7f)
			return 0;
	return 1;
}

/*
 * Read the control socket's path of the mount at @mount into @path (@len
 * bytes).  Returns 0, -ENOTSUP (no such xattr: not an hwfs mount),
 * -ECONNREFUSED (a dead FUSE mount: its daemon is gone), -errno, with the
 * sentence set.
 */
static int control_path(const char *mount, char *path, size_t len)
{
	ssize_t n = getxattr(mount, LIB_CONTROL_XATTR, path, len - 1);

	if (n >= 0) {
		path[n] = '\0';
		return 0;
	}
	if (errno == ENODATA || errno == ENOTSUP)
		return lib_fail(-ENOTSUP, "%s is not an hwfs mount", mount);
	if (errno == ENOTCONN)
		return lib_fail(-ECONNREFUSED, "the daemon of %s is gone (the mount is dead)",
				mount);
	return lib_fail(-errno, "%s is not an hwfs mount (or its daemon is gone): %s", mount,
			strerror(errno));
}

int lib_connect(const struct hwfs *h)
{
	char path[PATH_MAX];
	int fd, r = control_path(h->mount, path, sizeof(path));

	if (r < 0)
		return r;
	fd = ctl_connect(path);
	if (fd < 0)
		return lib_fail(fd == -ENOENT ? -ECONNREFUSED : fd,
				"cannot reach the daemon of %s at %s: %s", h->mount, path,
				strerror(-fd));
	return fd;
}

int lib_exchange(int fd, struct ctl_reader *rd, json_t *req, hwfs_progress_fn progress,
		 void *arg, json_t **res)
{
	json_t *msg = NULL, *prog;
	int r = ctl_send(fd, req);

	if (r < 0)
		return lib_fail(r, "cannot send to the daemon: %s", strerror(-r));
	for (;;) {
		r = ctl_recv(rd, &msg);
		if (r == -EPIPE)
			return lib_fail(-EPIPE, "no answer from the daemon: connection closed");
		if (r == -EBADMSG || r == -EMSGSIZE)
			return lib_fail(-EPROTO, "malformed answer from the daemon: %s",
					r == -EBADMSG ? "not a JSON object" : "line too long");
		if (r < 0)
			return lib_fail(r, "no answer from the daemon: %s", strerror(-r));
		prog = json_object_get(msg, "progress");
		if (!prog)
			break;
		if (progress)
			progress(arg, (uint64_t)json_integer_value(json_object_get(prog, "done")),
				 (uint64_t)json_integer_value(json_object_get(prog, "total")));
		json_decref(msg);
	}
	*res = msg;
	return 0;
}

int lib_check(json_t *res)
{
	const char *e = lib_jstr(res, "error");
	int num = ctl_errno(res);

	if (json_is_true(json_object_get(res, "ok")))
		return 0;
	return lib_fail(num ? -num : -EPROTO, "%s",
			e ? e : "the daemon refused the request (no reason given)");
}

int hwfs_open(const char *mount, struct hwfs **out)
{
	char path[PATH_MAX], *abs = NULL;
	struct hwfs *h = NULL;
	int r;

	lib_clear_error();
	if (!mount || !*mount)
		mount = secure_getenv("HWFS_MOUNT");
	if (!mount || !*mount)
		mount = LIB_DEFAULT_MOUNT;
	abs = realpath(mount, NULL);
	if (!abs) {
		r = lib_fail(-errno, "%s: %s", mount, strerror(errno));
		goto out;
	}
	r = control_path(abs, path, sizeof(path));
	if (r < 0)
		goto out;
	h = calloc(1, sizeof(*h));
	if (!h) {
		r = lib_fail(-ENOMEM, "out of memory");
		goto out;
	}
	h->mount = abs;
	abs = NULL;
	*out = h;
out:
	free(abs);
	return r;
}

void hwfs_close(struct hwfs *h)
{
	if (!h)
		return;
	free(h->mount);
	free(h);
}

const char *hwfs_mountpoint(const struct hwfs *h)
{
	return h->mount;
}

int lib_call(struct hwfs *h, json_t *req, hwfs_progress_fn progress, void *arg, json_t **res)
{
	struct ctl_reader rd;
	int r, fd = lib_connect(h);

	if (fd < 0)
		return fd;
	ctl_reader_init(&rd, fd);
	r = lib_exchange(fd, &rd, req, progress, arg, res);
	ctl_reader_free(&rd);
	close(fd);
	return r;
}

int hwfs_call(struct hwfs *h, const char *request, hwfs_progress_fn progress, void *arg,
	      char **reply)
{
	json_t *req = NULL, *res = NULL;
	json_error_t jerr;
	char *s;
	int r;

	lib_clear_error();
	req = json_loads(request, JSON_REJECT_DUPLICATES, &jerr);
	if (!req || !json_is_object(req)) {
		r = lib_fail(-EINVAL, "the request is not a JSON object: %s",
			     req ? "another JSON value" : jerr.text);
		goto out;
	}
	r = lib_call(h, req, progress, arg, &res);
	if (r < 0)
		goto out;
	s = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);
	if (!s) {
		r = lib_fail(-ENOMEM, "out of memory");
		goto out;
	}
	*reply = s;
out:
	json_decref(req);
	json_decref(res);
	return r;
}

int hwfs_versions(struct hwfs *h, struct hwfs_version **out, size_t *n)
{
	json_t *req = json_pack("{s:s}", "op", "status"), *res = NULL, *vers, *v;
	struct hwfs_version *arr = NULL;
	const char *cur;
	size_t i, count = 0;
	int r;

	lib_clear_error();
	if (!req) {
		r = lib_fail(-ENOMEM, "out of memory");
		goto out;
	}
	r = lib_call(h, req, NULL, NULL, &res);
	if (r < 0 || (r = lib_check(res)) < 0)
		goto out;
	vers = json_object_get(res, "versions");
	cur = lib_jstr(res, "current");
	if (!json_is_array(vers)) {
		r = lib_fail(-EPROTO, "malformed answer from the daemon: no versions");
		goto out;
	}
	arr = calloc(json_array_size(vers) + 1, sizeof(*arr));
	if (!arr) {
		r = lib_fail(-ENOMEM, "out of memory");
		goto out;
	}
	json_array_foreach(vers, i, v) {
		const char *name = lib_jstr(v, "name"), *state = lib_jstr(v, "state");

		if (!name || !state) {
			r = lib_fail(-EPROTO, "malformed answer from the daemon: a version "
					      "without name or state");
			goto out;
		}
		arr[count].name = strdup(name);
		arr[count].state = strdup(state);
		count++;
		if (!arr[count - 1].name || !arr[count - 1].state) {
			r = lib_fail(-ENOMEM, "out of memory");
			goto out;
		}
		arr[count - 1].bytes = (uint64_t)json_integer_value(json_object_get(v, "bytes"));
		arr[count - 1].is_current = cur && !strcmp(cur, name);
	}
	*out = arr;
	*n = count;
	arr = NULL;
out:
	hwfs_versions_free(arr, count);
	json_decref(req);
	json_decref(res);
	return r;
}

void hwfs_versions_free(struct hwfs_version *v, size_t n)
{
	if (!v)
		return;
	for (size_t i = 0; i < n; i++) {
		free((char *)v[i].name);
		free((char *)v[i].state);
	}
	free(v);
}

int hwfs_current(struct hwfs *h, char **out)
{
	static const char prefix[] = "versions/";
	char link[PATH_MAX], target[PATH_MAX];
	ssize_t n;
	char *s;

	lib_clear_error();
	snprintf(link, sizeof(link), "%s/current", h->mount);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0 && errno == ENOENT)
		return lib_fail(-ENOENT, "nothing was committed on %s yet", h->mount);
	if (n < 0)
		return lib_fail(-errno, "%s: %s", link, strerror(errno));
	target[n] = '\0';
	if (strncmp(target, prefix, sizeof(prefix) - 1) || !target[sizeof(prefix) - 1] ||
	    strchr(target + sizeof(prefix) - 1, '/'))
		return lib_fail(-EPROTO, "%s points at %s, not at versions/NAME", link, target);
	s = strdup(target + sizeof(prefix) - 1);
	if (!s)
		return lib_fail(-ENOMEM, "out of memory");
	*out = s;
	return 0;
}
