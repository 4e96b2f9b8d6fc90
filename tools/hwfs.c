/*
 * hwfs.c — the `hwfs` command: one binary, one verb per subcommand.
 *
 * `hwfs mount` starts a daemon (fs/daemon.c) and returns once the mount
 * answers; every other verb finds the daemon of a mount through the root
 * xattr `user.hwfs.control` (the control socket) and speaks the JSON-lines
 * protocol of ctl.h.  Output is for people by default and the daemon's JSON
 * with --json.  Exit status: 0 on success, 1 with one `hwfs: error:` line on
 * stderr otherwise, 2 for usage errors.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "coord.h"
#include "ctl.h"
#include "daemon.h"
#include "keys.h"
#include "tunables.h"

#define HWFS_FSTYPE "fuse.hwfs" /* our mounts in mountinfo (subtype=hwfs) */
#define HWFS_MAX_STACKED 64      /* dead mounts cleared at most, one per pass */

static const char *g_mount;
static int g_json;
static int g_local;   /* commit --local */
static int g_force;   /* seal --force */
static int g_cluster; /* status --cluster */
static int g_watch;   /* status --cluster --watch */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "hwfs: error: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void usage_die(const char *usage) __attribute__((noreturn));
static void usage_die(const char *usage)
{
	fprintf(stderr, "usage: %s\n", usage);
	exit(2);
}

static const char *default_mount(void)
{
	const char *m = getenv("HWFS_MOUNT");

	return m && *m ? m : "/hotweights";
}

/* ------------------------------------------------------------ the channel */

static int connect_mount(void)
{
	char path[4096];
	ssize_t n = getxattr(g_mount, "user.hwfs.control", path, sizeof(path) - 1);
	int fd;

	if (n < 0)
		die("%s is not an hwfs mount (or its daemon is gone): %s", g_mount,
		    strerror(errno));
	path[n] = '\0';
	fd = ctl_connect(path);
	if (fd < 0)
		die("cannot reach the daemon of %s at %s: %s", g_mount, path, strerror(-fd));
	return fd;
}

static void draw_progress(uint64_t done, uint64_t total, double t0)
{
	int width = 40, fill = total ? (int)((double)done / (double)total * width) : width;
	double dt = hwfs_mono_s() - t0;
	char a[32], b[32];

	fprintf(stderr, "\r[%.*s%*s] %s / %s  %.2f GB/s ", fill,
		"########################################", width - fill, "",
		hwfs_fmt_size(done, a, sizeof(a)), hwfs_fmt_size(total, b, sizeof(b)),
		dt > 0 ? (double)done / dt / 1e9 : 0.0);
	fflush(stderr);
}

/* Send @req (stolen) and return the final answer; dies on {"ok": false}. */
static json_t *call(json_t *req, int die_on_error)
{
	int fd = connect_mount(), tty = isatty(2), drawn = 0;
	double t0 = hwfs_mono_s();
	struct ctl_reader rd;
	json_t *res = NULL;
	int r;

	r = ctl_send(fd, req);
	json_decref(req);
	if (r < 0)
		die("cannot send to the daemon: %s", strerror(-r));
	ctl_reader_init(&rd, fd);
	for (;;) {
		json_t *prog;

		r = ctl_recv(&rd, &res);
		if (r < 0)
			die("no answer from the daemon: %s",
			    r == -EPIPE ? "connection closed" : strerror(-r));
		prog = json_object_get(res, "progress");
		if (!prog)
			break;
		if (tty) {
			draw_progress((uint64_t)json_integer_value(json_object_get(prog, "done")),
				      (uint64_t)json_integer_value(json_object_get(prog, "total")),
				      t0);
			drawn = 1;
		}
		json_decref(res);
	}
	if (drawn)
		fputc('\n', stderr);
	ctl_reader_free(&rd);
	close(fd);
	if (die_on_error && !json_is_true(json_object_get(res, "ok"))) {
		json_t *e = json_object_get(res, "error");

		die("%s", json_is_string(e) ? json_string_value(e) : "request failed");
	}
	return res;
}

static void print_json(json_t *res)
{
	json_object_del(res, "ok");
	json_dumpf(res, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	fputc('\n', stdout);
}

static int64_t jint(json_t *o, const char *k)
{
	return json_integer_value(json_object_get(o, k));
}

static const char *jstr(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);

	return json_is_string(v) ? json_string_value(v) : "-";
}

/* ------------------------------------------------------------ verbs */

/* Common options of client verbs: -m, --json, --help. Returns optind. */
static int client_opts(int argc, char **argv, const char *usage, int min_args, int max_args,
		       int *keep)
{
	static const struct option lo[] = {
		{"mount", required_argument, NULL, 'm'}, {"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},        {"keep", required_argument, NULL, 'k'},
		{"local", no_argument, NULL, 'L'},       {"cluster", no_argument, NULL, 'C'},
		{"watch", no_argument, NULL, 'W'},       {"force", no_argument, NULL, 'F'},
		{NULL, 0, NULL, 0},
	};
	int c;

	g_mount = default_mount();
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:jhk:", lo, NULL)) != -1) {
		switch (c) {
		case 'm':
			g_mount = optarg;
			break;
		case 'j':
			g_json = 1;
			break;
		case 'k':
			if (!keep)
				usage_die(usage);
			*keep = atoi(optarg);
			if (*keep < 0 || !strchr("0123456789", optarg[0]))
				usage_die(usage);
			break;
		case 'L':
			g_local = 1;
			break;
		case 'C':
			g_cluster = 1;
			break;
		case 'W':
			g_watch = 1;
			break;
		case 'F':
			g_force = 1;
			break;
		case 'h':
			printf("usage: %s\n", usage);
			exit(0);
		default:
			usage_die(usage);
		}
	}
	if (argc - optind < min_args || argc - optind > max_args)
		usage_die(usage);
	return optind;
}

static void print_versions_table(json_t *vers)
{
	size_t i;
	json_t *v;

	printf("%-24s %-8s %6s %8s %12s  %s\n", "VERSION", "STATE", "FILES", "TENSORS", "BYTES",
	       "DIGEST");
	json_array_foreach(vers, i, v) {
		char sz[32];
		json_t *errs = json_object_get(v, "errors"), *e;
		size_t k;

		printf("%-24s %-8s %6lld %8lld %12s  %s\n", jstr(v, "name"), jstr(v, "state"),
		       (long long)jint(v, "files"), (long long)jint(v, "tensors"),
		       hwfs_fmt_size((uint64_t)jint(v, "bytes"), sz, sizeof(sz)),
		       jstr(v, "digest"));
		json_array_foreach(errs, k, e)
			printf("    %s: not parsed as safetensors: %s\n", jstr(e, "file"),
			       jstr(e, "error"));
	}
}

/* Print the cluster table once; returns how many (node, version) are still replicating. */
static int print_cluster(json_t *cl)
{
	int busy = 0;
	json_t *n, *v;
	size_t i, k;

	printf("coordinator %s, committed: %s\n", jstr(cl, "coordinator"),
	       json_is_string(json_object_get(cl, "committed")) ? jstr(cl, "committed") : "(none)");
	json_array_foreach(json_object_get(cl, "nodes"), i, n) {
		printf("%-16s %-5s %s\n", jstr(n, "name"),
		       json_is_true(json_object_get(n, "alive")) ? "up" : "DOWN", jstr(n, "addr"));
		json_array_foreach(json_object_get(n, "versions"), k, v) {
			int64_t held = jint(v, "bytes_held"), need = jint(v, "bytes_needed");
			int complete = json_is_true(json_object_get(v, "complete")), w = 30;
			int fill = complete ? w : need > 0 ? (int)((double)held / (double)need * w) : 0;

			printf("    %-20s [%.*s%*s] %s\n", jstr(v, "name"), fill,
			       "##############################", w - fill, "",
			       complete ? "complete"
			       : json_is_string(json_object_get(v, "waiting")) ? jstr(v, "waiting")
									: "replicating");
			busy += !complete && json_is_true(json_object_get(n, "alive"));
		}
	}
	return busy;
}

/*
 * status --cluster: the coordinator's have-table, through this node.  With
 * --watch, redraw every second until nothing is replicating.
 */
static int status_cluster(void)
{
	for (;;) {
		json_t *res = call(json_pack("{s:s}", "op", "cluster"), 1);
		json_t *cl = json_object_get(res, "cluster");
		int busy;

		if (g_json) {
			json_dumpf(cl, stdout, JSON_INDENT(2));
			fputc('\n', stdout);
			json_decref(res);
			return 0;
		}
		if (g_watch && isatty(1))
			printf("\033[H\033[2J");
		busy = print_cluster(cl);
		json_decref(res);
		fflush(stdout);
		if (!g_watch || !busy)
			return 0;
		sleep(1);
	}
}

static int cmd_status(int argc, char **argv)
{
	json_t *res, *st, *v;
	char a[32], b[32];
	size_t k;

	client_opts(argc, argv, "hwfs status [-m MOUNT] [--json] [--cluster [--watch]]", 0, 0,
		    NULL);
	if (g_cluster)
		return status_cluster();
	res = call(json_pack("{s:s}", "op", "status"), 1);
	if (g_json) {
		print_json(res);
	} else {
		st = json_object_get(res, "store");
		printf("hwfs on %s (pid %lld)\n", jstr(res, "mount"), (long long)jint(res, "pid"));
		printf("store:   %s: %s of shards (%lld) in %s capacity\n", jstr(st, "path"),
		       hwfs_fmt_size((uint64_t)jint(st, "used_bytes"), a, sizeof(a)),
		       (long long)jint(st, "shards"),
		       hwfs_fmt_size((uint64_t)jint(st, "capacity_bytes"), b, sizeof(b)));
		printf("current: %s\n", json_is_string(json_object_get(res, "current"))
						? jstr(res, "current")
						: "(none)");
		print_versions_table(json_object_get(res, "versions"));
		if (json_object_get(res, "node")) {
			json_t *rep = json_object_get(res, "replication");

			printf("node:    %s, coordinator %s; received %s, sent %s\n",
			       jstr(res, "node"), jstr(res, "coordinator"),
			       hwfs_fmt_size((uint64_t)jint(rep, "bytes_received"), a, sizeof(a)),
			       hwfs_fmt_size((uint64_t)jint(rep, "bytes_sent"), b, sizeof(b)));
			json_array_foreach(json_object_get(rep, "pulls"), k, v)
				printf("pulling: %s, %s of %s%s%s\n", jstr(v, "version"),
				       hwfs_fmt_size((uint64_t)jint(v, "bytes_held"), a, sizeof(a)),
				       hwfs_fmt_size((uint64_t)jint(v, "bytes_total"), b, sizeof(b)),
				       json_object_get(v, "waiting") ? "; " : "",
				       json_object_get(v, "waiting") ? jstr(v, "waiting") : "");
		}
	}
	json_decref(res);
	return 0;
}

static int cmd_ls(int argc, char **argv)
{
	json_t *res;

	client_opts(argc, argv, "hwfs ls [-m MOUNT] [--json]", 0, 0, NULL);
	res = call(json_pack("{s:s}", "op", "ls"), 1);
	if (g_json) {
		json_dumpf(json_object_get(res, "versions"), stdout, JSON_INDENT(2));
		fputc('\n', stdout);
	} else {
		print_versions_table(json_object_get(res, "versions"));
	}
	json_decref(res);
	return 0;
}

static int cmd_simple(int argc, char **argv, const char *op, const char *usage,
		      const char *done_fmt)
{
	int i = client_opts(argc, argv, usage, 1, 1, NULL);
	json_t *res = call(json_pack("{s:s, s:s, s:b, s:b}", "op", op, "version", argv[i], "local",
				     g_local, "force", g_force),
			   1);

	if (g_json)
		print_json(res);
	else
		printf(done_fmt, argv[i]);
	json_decref(res);
	return 0;
}

/* Print "LABEL: a, b, c" for the node names in array @a (nothing when empty). */
static void print_nodes(const char *label, json_t *a)
{
	size_t k;
	json_t *v;

	if (!json_array_size(a))
		return;
	printf("%s:", label);
	json_array_foreach(a, k, v)
		printf("%s %s", k ? "," : "", json_string_value(v));
	printf("\n");
}

/*
 * commit: prints what happened on every node and exits 0 only when every live
 * node committed; 1 when nothing flipped (aborted, or refused before), 3 when
 * the commit was decided but some nodes failed to flip or did not answer
 * (partial), 4 when the coordinator went away and the outcome is unknown.
 */
static int cmd_commit(int argc, char **argv)
{
	int i = client_opts(argc, argv, "hwfs commit VERSION [--local] [-m MOUNT] [--json]", 1, 1,
			    NULL);
	json_t *res = call(json_pack("{s:s, s:s, s:b}", "op", "commit", "version", argv[i],
				     "local", g_local),
			   0);
	const char *outcome = jstr(res, "outcome"), *k;
	int ok = json_is_true(json_object_get(res, "ok"));
	int rc = ok ? 0 : !strcmp(outcome, "partial") ? 3 : !strcmp(outcome, "unknown") ? 4 : 1;
	json_t *v;

	if (g_json) {
		print_json(res);
	} else {
		if (ok)
			printf("current -> versions/%s\n", argv[i]);
		print_nodes("committed on", json_object_get(res, "committed"));
		json_object_foreach(json_object_get(res, "failed"), k, v)
			printf("failed on %s: %s\n", k, json_string_value(v));
		print_nodes("no answer from", json_object_get(res, "unknown"));
	}
	if (!ok)
		fprintf(stderr, "hwfs: error: %s\n", jstr(res, "error"));
	json_decref(res);
	return rc;
}

static int cmd_publish(int argc, char **argv)
{
	int i = client_opts(argc, argv, "hwfs publish SRC_DIR VERSION [-m MOUNT] [--json]", 2, 2,
			    NULL);
	char *src = realpath(argv[i], NULL);
	double t0 = hwfs_mono_s(), dt;
	json_t *res;
	char sz[32];

	if (!src)
		die("%s: %s", argv[i], strerror(errno));
	res = call(json_pack("{s:s, s:s, s:s}", "op", "publish", "src", src, "version",
			     argv[i + 1]),
		   1);
	dt = hwfs_mono_s() - t0;
	if (g_json) {
		json_object_set_new(res, "seconds", json_real(dt));
		print_json(res);
	} else {
		printf("published %s: %s in %.2f s (%.2f GB/s)\n", argv[i + 1],
		       hwfs_fmt_size((uint64_t)jint(res, "bytes"), sz, sizeof(sz)), dt,
		       dt > 0 ? (double)jint(res, "bytes") / dt / 1e9 : 0.0);
	}
	free(src);
	json_decref(res);
	return 0;
}

static int cmd_verify(int argc, char **argv)
{
	int i = client_opts(argc, argv, "hwfs verify VERSION [-m MOUNT] [--json]", 1, 1, NULL);
	json_t *res = call(json_pack("{s:s, s:s}", "op", "verify", "version", argv[i]), 1);
	int intact = json_is_true(json_object_get(res, "intact"));
	char sz[32];

	if (g_json)
		print_json(res);
	else if (intact)
		printf("%s: intact (%lld shards, %s re-hashed)\n", argv[i],
		       (long long)jint(res, "shards"),
		       hwfs_fmt_size((uint64_t)jint(res, "bytes"), sz, sizeof(sz)));
	if (!intact)
		fprintf(stderr, "hwfs: error: %s is damaged: %zu of %lld shards do not match their hash\n",
			argv[i], json_array_size(json_object_get(res, "bad")),
			(long long)jint(res, "shards"));
	json_decref(res);
	return intact ? 0 : 1;
}

static int cmd_gc(int argc, char **argv)
{
	int keep = -1;
	json_t *res, *v;
	size_t k;

	client_opts(argc, argv, "hwfs gc --keep N [-m MOUNT] [--json]", 0, 0, &keep);
	if (keep < 0)
		usage_die("hwfs gc --keep N [-m MOUNT] [--json]");
	res = call(json_pack("{s:s, s:i}", "op", "gc", "keep", keep), 1);
	if (g_json)
		print_json(res);
	else
		json_array_foreach(json_object_get(res, "removed"), k, v)
			printf("removed %s\n", json_string_value(v));
	json_decref(res);
	return 0;
}

static int cmd_diff(int argc, char **argv)
{
	int i = client_opts(argc, argv, "hwfs diff A B [-m MOUNT] [--json]", 2, 2, NULL);
	json_t *res = call(json_pack("{s:s, s:s, s:s}", "op", "diff", "a", argv[i], "b",
				     argv[i + 1]),
			   1);
	char a[32], b[32];
	json_t *v;
	size_t k;

	if (g_json) {
		print_json(res);
	} else {
		printf("%s -> %s: %lld tensors changed, %lld added, %lld removed, %lld same\n",
		       argv[i], argv[i + 1], (long long)jint(res, "tensors_changed"),
		       (long long)jint(res, "tensors_added"), (long long)jint(res, "tensors_removed"),
		       (long long)jint(res, "tensors_same"));
		printf("bytes in changed or added tensors: %s; new shard bytes: %s\n",
		       hwfs_fmt_size((uint64_t)jint(res, "bytes_changed"), a, sizeof(a)),
		       hwfs_fmt_size((uint64_t)jint(res, "new_shard_bytes"), b, sizeof(b)));
		json_array_foreach(json_object_get(res, "changed"), k, v)
			printf("  ~ %s\n", json_string_value(v));
		json_array_foreach(json_object_get(res, "added"), k, v)
			printf("  + %s\n", json_string_value(v));
		json_array_foreach(json_object_get(res, "removed"), k, v)
			printf("  - %s\n", json_string_value(v));
	}
	json_decref(res);
	return 0;
}

static int cmd_manifest(int argc, char **argv)
{
	int i = client_opts(argc, argv, "hwfs manifest VERSION [-m MOUNT]", 1, 1, NULL);
	json_t *res = call(json_pack("{s:s, s:s}", "op", "manifest", "version", argv[i]), 1);

	fputs(jstr(res, "manifest"), stdout);
	fputc('\n', stdout);
	json_decref(res);
	return 0;
}

/* ------------------------------------------------------------ mount, umount */

/*
 * Replication is secure by default: without --keys every peer that reaches a
 * port could join, announce and commit, and a loopback port is reachable by
 * every local user, so a keyless cluster needs --insecure wherever it listens.
 */
#define KEYLESS_REFUSED                                                                           \
	"without keys: any process that reaches it (any local user too, on loopback) could join "  \
	"the cluster and commit (use --keys DIR, see hwfs keygen; or --insecure for a keyless "   \
	"test cluster)"

/*
 * spawn_daemon() - run @run(@arg, notify_fd) in a daemon process (new session,
 * cwd /, stdin /dev/null, stdout and stderr appended to @log or /dev/null) and
 * wait until it reports on the notify pipe: "ok" returns its pid, "error: ..."
 * dies with that error.  Paths in @arg must be absolute.
 */
static pid_t spawn_daemon(const char *log, int (*run)(void *arg, int notify_fd), void *arg,
			  const char *what)
{
	char buf[4352];
	ssize_t n, len = 0;
	int pfd[2], logfd;
	pid_t pid;

	if (pipe2(pfd, O_CLOEXEC) < 0)
		die("pipe: %s", strerror(errno));
	logfd = open(log ? log : "/dev/null", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (logfd < 0)
		die("%s: %s", log, strerror(errno));
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		int nullfd = open("/dev/null", O_RDWR);

		close(pfd[0]);
		setsid();
		if (chdir("/") < 0 || nullfd < 0 || dup2(nullfd, 0) < 0 || dup2(logfd, 1) < 0 ||
		    dup2(logfd, 2) < 0)
			_exit(1);
		close(nullfd);
		close(logfd);
		exit(run(arg, pfd[1])); /* exit, not _exit: sanitizer builds report leaks at exit */
	}
	close(pfd[1]);
	close(logfd);
	while ((n = read(pfd[0], buf + len, sizeof(buf) - 1 - (size_t)len)) > 0)
		len += n;
	buf[len] = '\0';
	close(pfd[0]);
	if (!strncmp(buf, "ok", 2))
		return pid;
	buf[strcspn(buf, "\n")] = '\0';
	if (!strncmp(buf, "error: ", 7))
		die("%s", buf + 7);
	die("the %s exited during start-up%s%s", what, log ? "; see " : "", log ? log : "");
}

struct mount_run {
	struct daemon_opts *o;
	char *mnt, *store;
};

static int run_mount(void *arg, int notify_fd)
{
	struct mount_run *m = arg;
	int r;

	m->o->notify_fd = notify_fd;
	r = daemon_run(m->o) < 0 ? 1 : 0;
	free(m->mnt);
	free(m->store);
	return r;
}

static int run_coord(void *arg, int notify_fd)
{
	struct coord_opts *o = arg;

	o->notify_fd = notify_fd;
	return coord_run(o) < 0 ? 1 : 0;
}

/* "chain" -> 1, "tree:K" -> K, "star" -> 0 (unbounded fan-out). */
static int parse_topology(const char *s, unsigned *fanout)
{
	char *end;
	unsigned long k;

	if (!strcmp(s, "chain")) {
		*fanout = 1;
		return 0;
	}
	if (!strcmp(s, "star")) {
		*fanout = 0;
		return 0;
	}
	if (strncmp(s, "tree:", 5))
		return -EINVAL;
	k = strtoul(s + 5, &end, 10);
	if (*end || k < 1 || k > 1024)
		return -EINVAL;
	*fanout = (unsigned)k;
	return 0;
}

static int cmd_keygen(int argc, char **argv)
{
	char pub[KEY_Z85];
	int r;

	if (argc != 2 || argv[1][0] == '-') {
		if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
			printf("usage: hwfs keygen DIR\n");
			return 0;
		}
		usage_die("hwfs keygen DIR");
	}
	r = keys_generate(argv[1], pub);
	if (r == -EEXIST)
		die("%s/key exists already; not overwritten", argv[1]);
	if (r < 0)
		die("keygen %s: %s", argv[1], r == -ENOTSUP ? "libzmq has no CURVE support"
							   : strerror(-r));
	printf("%s\n", pub);
	return 0;
}

static int cmd_coord(int argc, char **argv)
{
	static const char usage[] = "hwfs coord --listen tcp://HOST:PORT [--state DIR] "
				    "[--topology chain|tree:K|star] [--keys DIR] [-f] [--insecure]";
	static const struct option lo[] = {
		{"listen", required_argument, NULL, 'l'}, {"state", required_argument, NULL, 's'},
		{"topology", required_argument, NULL, 't'}, {"foreground", no_argument, NULL, 'f'},
		{"insecure", no_argument, NULL, 'I'},     {"help", no_argument, NULL, 'h'},
		{"keys", required_argument, NULL, 'K'},   {NULL, 0, NULL, 0},
	};
	struct coord_opts o = {.notify_fd = -1, .fanout = 1};
	int c, fg = 0, insecure = 0;
	char buf[4096], *state = NULL, *keys = NULL;
	pid_t pid;

	optind = 1;
	while ((c = getopt_long(argc, argv, "l:s:t:fh", lo, NULL)) != -1) {
		switch (c) {
		case 'l':
			o.listen = optarg;
			break;
		case 's':
			o.state = optarg;
			break;
		case 't':
			if (parse_topology(optarg, &o.fanout) < 0)
				die("unknown topology %s (chain, tree:K with K >= 1, or star)", optarg);
			break;
		case 'f':
			fg = 1;
			break;
		case 'I':
			insecure = 1;
			break;
		case 'K':
			o.keys = optarg;
			break;
		case 'h':
			printf("usage: %s\n", usage);
			return 0;
		default:
			usage_die(usage);
		}
	}
	if (!o.listen || optind != argc)
		usage_die(usage);
	if (!o.keys && !insecure)
		die("refusing to run a coordinator on %s " KEYLESS_REFUSED, o.listen);
	if (hwfs_tunables_load(NULL, 0) < 0) /* node_expiry_s from HWFS_NODE_EXPIRY_S */
		die("bad tunable in the environment (see hwfs mount --help)");
	if (fg)
		return coord_run(&o) < 0 ? 1 : 0;
	if (o.state) {
		if (mkdir(o.state, 0700) < 0 && errno != EEXIST)
			die("state dir %s: %s", o.state, strerror(errno));
		state = realpath(o.state, NULL);
		if (!state)
			die("state dir %s: %s", o.state, strerror(errno));
		o.state = state;
		snprintf(buf, sizeof(buf), "%s/coord.log", state);
	}
	if (o.keys) {
		keys = realpath(o.keys, NULL);
		if (!keys)
			die("keys %s: %s", o.keys, strerror(errno));
		o.keys = keys;
	}
	pid = spawn_daemon(o.state ? buf : NULL, run_coord, &o, "coordinator");
	printf("%d\n", (int)pid);
	free(state);
	free(keys);
	return 0;
}

/* Undo mountinfo's octal escapes (\040 for a space, ...) in place. */
static void unescape_mountinfo(char *s)
{
	char *o = s;

	for (; *s; s++, o++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*o = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*o = *s;
		}
	}
	*o = '\0';
}

/*
 * Is @path a mount point in /proc/self/mountinfo?  With @fstype, only a mount
 * of that filesystem type counts.  Returns 1 or 0 (0 when mountinfo is unreadable).
 */
static int mounted_as(const char *path, const char *fstype)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	char line[8192];
	int found = 0;

	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f)) {
		char mp[4096], type[256];
		const char *sep = strstr(line, " - ");

		if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
			continue;
		unescape_mountinfo(mp);
		if (strcmp(mp, path))
			continue;
		found = !fstype || (sep && sscanf(sep + 3, "%255s", type) == 1 &&
				    !strcmp(type, fstype));
	}
	fclose(f);
	return found;
}

static int is_mounted(const char *path)
{
	return mounted_as(path, NULL);
}

/* Is process @pid still running (a zombie has exited: its files are closed)? */
static int alive(pid_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return kill(pid, 0) == 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* "pid (comm) S ..." — comm may hold spaces */
	return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static char *abs_path(const char *p)
{
	char *r = realpath(p, NULL), cwd[PATH_MAX];

	if (r)
		return r;
	if (p[0] == '/' || !getcwd(cwd, sizeof(cwd)))
		return strdup(p);
	if (asprintf(&r, "%s/%s", cwd, p) < 0)
		return NULL;
	return r;
}

/* A group name or number -> gid, or -1 when there is no such group. */
static long parse_group(const char *s)
{
	struct group *g = getgrnam(s);
	char *end;
	unsigned long v;

	if (g)
		return (long)g->gr_gid;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (!*s || *end || errno || v >= (gid_t)-1 || s[0] == '-')
		return -1;
	return (long)v;
}

/*
 * fusermount_u() - run `fusermount3 -u [-z] MNT` and wait for it.  The child
 * only execs: when the exec fails it says why on stderr and _exit(127)s, so it
 * never returns into the CLI.  Returns 0 when fusermount3 exited 0, else -1.
 */
static int fusermount_u(const char *mnt, int lazy)
{
	int status = 0;
	pid_t c = fork();

	if (c < 0)
		return -1;
	if (c == 0) {
		if (lazy)
			execlp("fusermount3", "fusermount3", "-u", "-z", mnt, (char *)NULL);
		else
			execlp("fusermount3", "fusermount3", "-u", mnt, (char *)NULL);
		fprintf(stderr, "hwfs: cannot run fusermount3: %s\n", strerror(errno));
		_exit(127);
	}
	while (waitpid(c, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* Detach @mnt (umount2 MNT_DETACH, else fusermount3 -u -z). Returns 0 or -1. */
static int lazy_unmount(const char *mnt)
{
	if (umount2(mnt, MNT_DETACH) == 0)
		return 0;
	return fusermount_u(mnt, 1);
}

/*
 * clear_dead_mounts() - detach every hwfs mount at @mnt whose daemon is gone
 * (kill -9 leaves the mount in place: stat may still answer from the kernel's
 * cache, or fail with ENOTCONN), so the new daemon mounts once instead of on
 * top of it.  A mount whose daemon answers is left alone (the caller then
 * refuses with "already an hwfs mount").  Dies when a dead mount cannot be
 * detached.
 */
static void clear_dead_mounts(const char *mnt)
{
	for (int i = 0; i < HWFS_MAX_STACKED && mounted_as(mnt, HWFS_FSTYPE); i++) {
		char buf[32];
		ssize_t n = getxattr(mnt, "user.hwfs.pid", buf, sizeof(buf) - 1);

		if (n > 0) {
			buf[n] = '\0';
			if (alive((pid_t)atoi(buf)))
				return; /* a live daemon */
		} else if (errno != ENOTCONN && errno != ECONNABORTED) {
			return; /* not ours to judge: the checks that follow report it */
		}
		fprintf(stderr, "hwfs: clearing the dead mount on %s (its daemon is gone)\n", mnt);
		if (lazy_unmount(mnt) < 0)
			die("cannot detach the dead mount on %s (umount2 and fusermount3 -u -z "
			    "failed)", mnt);
	}
}

static int cmd_mount(int argc, char **argv)
{
	static const char usage[] =
		"hwfs mount MOUNTPOINT --store DIR [--capacity SIZE] [--preallocate] [-f]\n"
		"       [-o NAME=VALUE,...] [-d] [--ctl-group GROUP]\n"
		"       [--join tcp://COORD:PORT | --coordinator tcp://HOST:PORT] --node NAME\n"
		"       --listen tcp://HOST:PORT [--keys DIR] [--insecure]";
	static const struct option lo[] = {
		{"store", required_argument, NULL, 's'}, {"capacity", required_argument, NULL, 'c'},
		{"foreground", no_argument, NULL, 'f'},  {"help", no_argument, NULL, 'h'},
		{"debug", no_argument, NULL, 'd'},       {"join", required_argument, NULL, 'J'},
		{"node", required_argument, NULL, 'N'},  {"listen", required_argument, NULL, 'l'},
		{"insecure", no_argument, NULL, 'I'},    {"keys", required_argument, NULL, 'K'},
		{"coordinator", required_argument, NULL, 'O'},
		{"preallocate", no_argument, NULL, 'P'}, {"ctl-group", required_argument, NULL, 'G'},
		{NULL, 0, NULL, 0},
	};
	struct daemon_opts o = {.notify_fd = -1, .ctl_gid = -1};
	int insecure = 0;
	const char *store = NULL;
	char *mnt, *opts[64], buf[4096], *keys = NULL;
	size_t n_opts = 0;
	int c, fg = 0;
	struct stat st;

	optind = 1;
	while ((c = getopt_long(argc, argv, "s:c:fho:d", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			store = optarg;
			break;
		case 'c':
			if (hwfs_parse_size(optarg, &o.capacity) < 0 || o.capacity < (1u << 20))
				die("bad --capacity %s (e.g. 512M, 8G; at least 1M)", optarg);
			break;
		case 'f':
			fg = 1;
			break;
		case 'd':
			o.debug = 1;
			fg = 1;
			break;
		case 'J':
			o.join = optarg;
			break;
		case 'N':
			o.node = optarg;
			break;
		case 'l':
			o.listen = optarg;
			break;
		case 'I':
			insecure = 1;
			break;
		case 'K':
			o.keys = optarg;
			break;
		case 'O':
			o.coordinator = optarg;
			break;
		case 'P':
			o.preallocate = 1;
			break;
		case 'G':
			o.ctl_gid = parse_group(optarg);
			if (o.ctl_gid < 0)
				die("--ctl-group %s: no such group", optarg);
			break;
		case 'o':
			for (char *save = NULL, *t = strtok_r(optarg, ",", &save); t;
			     t = strtok_r(NULL, ",", &save))
				if (n_opts < HWFS_ARRAY_SIZE(opts))
					opts[n_opts++] = t;
			break;
		case 'h':
			printf("usage: %s\n\n", usage);
			hwfs_tunables_print(stdout);
			return 0;
		default:
			usage_die(usage);
		}
	}
	if (argc - optind != 1 || !store)
		usage_die(usage);
	if (o.coordinator && !o.join)
		o.join = o.coordinator; /* a node with the coordinator inside joins it */
	if (o.coordinator && !o.keys && !insecure)
		die("refusing to run a coordinator on %s " KEYLESS_REFUSED, o.coordinator);
	if (o.join && (!o.node || !o.listen))
		die("--join needs --node NAME and --listen tcp://HOST:PORT");
	if (!o.join && (o.node || o.listen))
		die("--node and --listen only make sense with --join");
	if (o.join && !o.keys && !insecure)
		die("refusing to join %s and serve shards on %s " KEYLESS_REFUSED, o.join, o.listen);
	if (hwfs_tunables_load((const char *const *)opts, n_opts) < 0)
		die("bad tunable in -o (see hwfs mount --help)");
	mnt = abs_path(argv[optind]);
	if (!mnt)
		die("out of memory");
	clear_dead_mounts(mnt);
	free(mnt);
	mnt = realpath(argv[optind], NULL);
	if (!mnt || stat(mnt, &st) < 0 || !S_ISDIR(st.st_mode))
		die("mount point %s: %s", argv[optind], mnt ? "not a directory" : strerror(errno));
	if (getxattr(mnt, "user.hwfs.pid", buf, sizeof(buf)) > 0)
		die("%s is already an hwfs mount", mnt);
	if (mkdir(store, 0700) < 0 && errno != EEXIST)
		die("store %s: %s", store, strerror(errno));
	o.mountpoint = mnt;
	o.store = store;
	if (fg) {
		c = daemon_run(&o) < 0 ? 1 : 0;
		free(mnt);
		return c;
	}

	{
		struct mount_run m = {&o, mnt, realpath(store, NULL)};

		if (!m.store)
			die("store %s: %s", store, strerror(errno));
		o.store = m.store;
		if (o.keys && !(o.keys = keys = realpath(o.keys, NULL)))
			die("keys: %s", strerror(errno));
		snprintf(buf, sizeof(buf), "%s/hwfs.log", m.store);
		spawn_daemon(buf, run_mount, &m, "daemon");
		free(m.store);
	}
	free(keys);
	free(mnt);
	return 0;
}

static int cmd_umount(int argc, char **argv)
{
	static const char usage[] = "hwfs umount MOUNTPOINT";
	char *mnt, buf[32];
	ssize_t n;
	pid_t pid = 0;

	if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		printf("usage: %s\n", usage);
		return 0;
	}
	if (argc != 2)
		usage_die(usage);
	mnt = abs_path(argv[1]);
	if (!mnt)
		die("out of memory");
	n = getxattr(mnt, "user.hwfs.pid", buf, sizeof(buf) - 1);
	if (n > 0) {
		buf[n] = '\0';
		pid = (pid_t)atoi(buf);
	}
	if (!is_mounted(mnt)) {
		free(mnt);
		return 0; /* already unmounted (e.g. by fusermount3 -u) */
	}
	if (umount2(mnt, 0) < 0) {
		if (errno == EBUSY)
			die("%s is busy (files open, or a process is inside it)", mnt);
		if (errno == EPERM) { /* not root: let fusermount3 do it */
			if (fusermount_u(mnt, 0) < 0)
				die("fusermount3 -u %s failed", mnt);
		} else if (errno == ENOTCONN || errno == EINVAL) {
			if (lazy_unmount(mnt) < 0)
				die("cannot detach %s (umount2 and fusermount3 -u -z failed)", mnt);
		} else {
			die("cannot unmount %s: %s", mnt, strerror(errno));
		}
	}
	/* wait for the daemon to close its store, so a remount can take it */
	for (int i = 0; pid > 0 && i < 3000 && alive(pid); i++) { /* 30 s */
		struct timespec ts = {0, 10 * 1000 * 1000};

		nanosleep(&ts, NULL);
	}
	free(mnt);
	return 0;
}

/* ------------------------------------------------------------ main */

static void usage_all(FILE *f)
{
	fprintf(f,
		"usage: hwfs VERB [ARGS] [-m MOUNT] [--json]\n\n"
		"  mount MOUNTPOINT --store DIR [--capacity SIZE] [--preallocate] [-f]\n"
		"                                                        mount a node\n"
		"  umount MOUNTPOINT                                     unmount cleanly\n"
		"  status [--json]                                       daemon, store, versions\n"
		"  ls [--json]                                           versions\n"
		"  seal V [--force]                                      make V immutable\n"
		"  publish SRC_DIR V                                     import a directory as V\n"
		"  commit V                                              point current at V\n"
		"  diff A B [--json]                                     tensors that differ\n"
		"  verify V [--json]                                     re-hash every shard of V\n"
		"  rm V                                                  remove V\n"
		"  gc --keep N                                           keep N newest versions\n"
		"  manifest V                                            print V's manifest\n"
		"  coord --listen tcp://HOST:PORT [--state DIR]          run a coordinator\n"
		"  keygen DIR                                            make a CURVE key pair\n\n"
		"A node joins a cluster with: hwfs mount ... --join tcp://COORD:PORT --node NAME\n"
		"--listen tcp://HOST:PORT; then commit is cluster-wide (--local: this node only)\n"
		"and status --cluster shows every node.\n\n"
		"MOUNT defaults to $HWFS_MOUNT, else /hotweights.\n");
}

int main(int argc, char **argv)
{
	const char *verb = argc > 1 ? argv[1] : NULL;

	if (!verb || !strcmp(verb, "--help") || !strcmp(verb, "-h") || !strcmp(verb, "help")) {
		usage_all(verb ? stdout : stderr);
		return verb ? 0 : 2;
	}
	argc--;
	argv++;
	if (!strcmp(verb, "mount"))
		return cmd_mount(argc, argv);
	if (!strcmp(verb, "coord"))
		return cmd_coord(argc, argv);
	if (!strcmp(verb, "keygen"))
		return cmd_keygen(argc, argv);
	if (!strcmp(verb, "umount") || !strcmp(verb, "unmount"))
		return cmd_umount(argc, argv);
	if (!strcmp(verb, "status"))
		return cmd_status(argc, argv);
	if (!strcmp(verb, "ls"))
		return cmd_ls(argc, argv);
	if (!strcmp(verb, "seal"))
		return cmd_simple(argc, argv, "seal", "hwfs seal VERSION [--force] [-m MOUNT]", "sealed %s\n");
	if (!strcmp(verb, "commit"))
		return cmd_commit(argc, argv);
	if (!strcmp(verb, "rm"))
		return cmd_simple(argc, argv, "rm", "hwfs rm VERSION [-m MOUNT]", "removed %s\n");
	if (!strcmp(verb, "publish"))
		return cmd_publish(argc, argv);
	if (!strcmp(verb, "verify"))
		return cmd_verify(argc, argv);
	if (!strcmp(verb, "gc"))
		return cmd_gc(argc, argv);
	if (!strcmp(verb, "diff"))
		return cmd_diff(argc, argv);
	if (!strcmp(verb, "manifest"))
		return cmd_manifest(argc, argv);
	fprintf(stderr, "hwfs: error: unknown verb '%s'\n", verb);
	usage_all(stderr);
	return 2;
}
