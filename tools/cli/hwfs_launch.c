/*
 * hwfs_launch.c — the verbs of `hwfs` that start and stop processes rather
 * than talk to a running daemon: mount (check the options, clear a dead mount
 * left by kill -9, start the daemon of fs/daemon/daemon.c in its own session and
 * wait until it answers), umount (and wait until the daemon has let go of its
 * store), coord (a stand-alone coordinator) and keygen (CURVE keys).  They
 * live apart from the client verbs of hwfs.c because they share the spawning
 * and mount-table helpers below and nothing of the control protocol.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "coord.h"
#include "daemon.h"
#include "http.h"
#include "hwfs_cli.h"
#include "keys.h"
#include "tunables.h"

#define HWFS_MAX_STACKED 64      /* dead mounts cleared at most, one per pass */

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
 * dies with that error.  "note: ..." lines before either are printed on stderr
 * as "hwfs: note: ...".  Paths in @arg must be absolute.
 */
static pid_t spawn_daemon(const char *log, int (*run)(void *arg, int notify_fd), void *arg,
			  const char *what)
{
	char buf[8192], *p;
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
	for (p = buf; !strncmp(p, "note: ", 6) && strchr(p, '\n'); p = strchr(p, '\n') + 1)
		fprintf(stderr, "hwfs: %.*s\n", (int)strcspn(p, "\n"), p);
	if (!strncmp(p, "ok", 2))
		return pid;
	p[strcspn(p, "\n")] = '\0';
	if (!strncmp(p, "error: ", 7))
		die("%s", p + 7);
	die("the %s exited during start-up%s%s", what, log ? "; see " : "", log ? log : "");
}

/* What the daemon process of `hwfs mount` runs with; it frees the two paths. */
struct mount_run {
	struct daemon_opts *o;
	char *mnt, *store;
};

/* spawn_daemon()'s @run for `hwfs mount`: the node's daemon (fs/daemon/daemon.c). */
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

/* `hwfs coord --http HOST:PORT`, or NULL (for run_coord() in the child) */
static const char *coord_http;
/* `hwfs coord --http-host NAME...`: the names, comma-separated, "" when none */
static char coord_http_hosts[1024];

/* Add --http-host @arg to @buf (@len bytes); dies on a bad name or too many. */
static void add_http_host(char *buf, size_t len, const char *arg)
{
	int r = http_hosts_add(buf, len, arg);

	if (r == -ENAMETOOLONG)
		die("--http-host: too many names (at most %zu bytes in all)", len - 1);
	if (r < 0)
		die("bad --http-host %s (host names of A-Z a-z 0-9 . _ -, comma-separated, or *)",
		    arg);
}

/* spawn_daemon()'s @run for `hwfs coord`: a stand-alone coordinator. */
static int run_coord(void *arg, int notify_fd)
{
	struct coord_opts *o = arg;

	o->notify_fd = notify_fd;
	return coord_serve(o, coord_http, coord_http_hosts[0] ? coord_http_hosts : NULL);
}

int parse_topology(const char *s, unsigned *fanout)
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

int cmd_keygen(int argc, char **argv)
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

int cmd_coord(int argc, char **argv)
{
	static const char usage[] = "hwfs coord --listen tcp://HOST:PORT [--state DIR] "
				    "[--topology chain|tree:K|star] [--keys DIR] [-f] [--insecure] "
				    "[--http HOST:PORT] [--http-host NAME]...";
	static const struct option lo[] = {
		{"listen", required_argument, NULL, 'l'}, {"state", required_argument, NULL, 's'},
		{"topology", required_argument, NULL, 't'}, {"foreground", no_argument, NULL, 'f'},
		{"insecure", no_argument, NULL, 'I'},     {"help", no_argument, NULL, 'h'},
		{"keys", required_argument, NULL, 'K'},   {"http", required_argument, NULL, 'H'},
		{"http-host", required_argument, NULL, 'A'},
		{NULL, 0, NULL, 0},
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
		case 'H':
			coord_http = optarg;
			break;
		case 'A':
			add_http_host(coord_http_hosts, sizeof(coord_http_hosts), optarg);
			break;
		case 'h':
			printf("usage: %s\n\n", usage);
			hwfs_tunables_print(stdout); /* the coordinator reads the same table */
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
		return coord_serve(&o, coord_http, coord_http_hosts[0] ? coord_http_hosts : NULL);
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

int hwfs_mount_source(const char *path, const char *fstype, char *src, size_t len)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	char line[8192];
	int found = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		char mp[4096], type[256], source[4096];
		const char *sep = strstr(line, " - ");
		int n;

		if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
			continue;
		unescape_mountinfo(mp);
		if (strcmp(mp, path))
			continue;
		n = sep ? sscanf(sep + 3, "%255s %4095s", type, source) : 0;
		if (fstype && (n < 1 || strcmp(type, fstype)))
			continue;
		found = 1; /* the last one listed is the one on top */
		if (src && len) {
			if (n < 2)
				source[0] = '\0';
			unescape_mountinfo(source);
			snprintf(src, len, "%s", source);
		}
	}
	fclose(f);
	return found;
}

/*
 * Is @path a mount point in /proc/self/mountinfo?  With @fstype, only a mount
 * of that filesystem type counts.  Returns 1 or 0 (0 when mountinfo is unreadable).
 */
static int mounted_as(const char *path, const char *fstype)
{
	return hwfs_mount_source(path, fstype, NULL, 0);
}

/*
 * The pid of the daemon serving @mnt, from its root xattr user.hwfs.pid
 * (0 when unparsable), or -errno when @mnt does not answer it (ENODATA: not
 * an hwfs mount; ENOTCONN or ECONNABORTED: a mount whose daemon is gone).
 */
static pid_t mount_pid(const char *mnt)
{
	char buf[32];
	ssize_t n = getxattr(mnt, "user.hwfs.pid", buf, sizeof(buf) - 1);

	if (n <= 0)
		return n < 0 ? -errno : -ENODATA;
	buf[n] = '\0';
	return (pid_t)atoi(buf);
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

/* @p made absolute (resolved when it exists, else joined to the cwd); NULL without memory. */
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
		pid_t pid = mount_pid(mnt);

		if (pid >= 0) {
			if (alive(pid))
				return; /* a live daemon */
		} else if (pid != -ENOTCONN && pid != -ECONNABORTED) {
			return; /* not ours to judge: the checks that follow report it */
		}
		fprintf(stderr, "hwfs: clearing the dead mount on %s (its daemon is gone)\n", mnt);
		if (lazy_unmount(mnt) < 0)
			die("cannot detach the dead mount on %s (umount2 and fusermount3 -u -z "
			    "failed)", mnt);
	}
}

/* `hwfs mount`'s usage line, and what --help adds to it before the tunables. */
static const char mount_usage[] =
	"hwfs mount MOUNTPOINT --store DIR [--capacity SIZE] [--preallocate] [--pin] [-f]\n"
	"       [-o NAME=VALUE,...] [-d] [--ctl-group GROUP]\n"
	"       [--join tcp://COORD:PORT | --coordinator tcp://HOST:PORT] --node NAME\n"
	"       --listen tcp://HOST:PORT [--keys DIR] [--insecure] [--http HOST:PORT]\n"
	"       [--http-host NAME[,NAME...]]...";
static const char mount_help[] =
	"  --preallocate  allocate, touch and mlock the whole arena at start-up\n"
	"  --pin          preallocate, then pin the arena for CUDA (cudaHostRegister, so\n"
	"                 a load copies to the GPU with no staging copy); without a GPU\n"
	"                 the arena is locked with mlock instead (a note says so)\n"
	"  --http HOST:PORT  serve /metrics, /healthz, /readyz there (port 0: any free\n"
	"                 port, shown by hwfs status); use loopback or a private address\n"
	"  --http-host NAME  a name clients may give in Host: besides IP addresses,\n"
	"                 localhost and the --http host (others get 421); repeatable\n";

/* What the options of `hwfs mount` ask for. */
struct mount_args {
	struct daemon_opts o;
	char http_hosts[1024]; /* the --http-host names, comma-separated (o.http_hosts) */
	int insecure, fg;
	const char *store;
	char *opts[64];        /* the -o NAME=VALUE tunables */
	size_t n_opts;
};

/*
 * Read `hwfs mount`'s options into @a (a bad one dies with the usage or its
 * sentence).  Returns 1 when --help was printed, else 0.
 */
static int mount_parse(int argc, char **argv, struct mount_args *a)
{
	static const struct option lo[] = {
		{"store", required_argument, NULL, 's'}, {"capacity", required_argument, NULL, 'c'},
		{"foreground", no_argument, NULL, 'f'},  {"help", no_argument, NULL, 'h'},
		{"debug", no_argument, NULL, 'd'},       {"join", required_argument, NULL, 'J'},
		{"node", required_argument, NULL, 'N'},  {"listen", required_argument, NULL, 'l'},
		{"insecure", no_argument, NULL, 'I'},    {"keys", required_argument, NULL, 'K'},
		{"coordinator", required_argument, NULL, 'O'},
		{"preallocate", no_argument, NULL, 'P'}, {"ctl-group", required_argument, NULL, 'G'},
		{"pin", no_argument, NULL, 'p'},         {"http", required_argument, NULL, 'H'},
		{"http-host", required_argument, NULL, 'A'},
		{NULL, 0, NULL, 0},
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "s:c:fho:d", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			a->store = optarg;
			break;
		case 'c':
			if (hwfs_parse_size(optarg, &a->o.capacity) < 0 || a->o.capacity < (1u << 20))
				die("bad --capacity %s (e.g. 512M, 8G; at least 1M)", optarg);
			break;
		case 'f':
			a->fg = 1;
			break;
		case 'd':
			a->o.debug = 1;
			a->fg = 1;
			break;
		case 'J':
			a->o.join = optarg;
			break;
		case 'N':
			a->o.node = optarg;
			break;
		case 'l':
			a->o.listen = optarg;
			break;
		case 'I':
			a->insecure = 1;
			break;
		case 'K':
			a->o.keys = optarg;
			break;
		case 'O':
			a->o.coordinator = optarg;
			break;
		case 'P':
			a->o.preallocate = 1;
			break;
		case 'H':
			a->o.http = optarg;
			break;
		case 'A':
			add_http_host(a->http_hosts, sizeof(a->http_hosts), optarg);
			a->o.http_hosts = a->http_hosts;
			break;
		case 'p':
			a->o.pin = 1; /* implies preallocation (fs/daemon/daemon.c, prepare_arena) */
			break;
		case 'G':
			a->o.ctl_gid = parse_group(optarg);
			if (a->o.ctl_gid < 0)
				die("--ctl-group %s: no such group", optarg);
			break;
		case 'o':
			for (char *save = NULL, *t = strtok_r(optarg, ",", &save); t;
			     t = strtok_r(NULL, ",", &save)) {
				if (a->n_opts == HWFS_ARRAY_SIZE(a->opts))
					die("too many -o tunables (at most %zu)", HWFS_ARRAY_SIZE(a->opts));
				a->opts[a->n_opts++] = t;
			}
			break;
		case 'h':
			printf("usage: %s\n\n%s\n", mount_usage, mount_help);
			hwfs_tunables_print(stdout);
			return 1;
		default:
			usage_die(mount_usage);
		}
	}
	if (argc - optind != 1 || !a->store)
		usage_die(mount_usage);
	return 0;
}

/*
 * The options that go together (a coordinator's node joins it; --join with
 * --node and --listen; keys unless --insecure), then the -o tunables
 * loaded.  Dies with the sentence of the first that does not hold.
 */
static void mount_check(struct mount_args *a)
{
	struct daemon_opts *o = &a->o;

	if (o->coordinator && !o->join)
		o->join = o->coordinator; /* a node with the coordinator inside joins it */
	if (o->coordinator && !o->keys && !a->insecure)
		die("refusing to run a coordinator on %s " KEYLESS_REFUSED, o->coordinator);
	if (o->join && (!o->node || !o->listen))
		die("--join needs --node NAME and --listen tcp://HOST:PORT");
	if (!o->join && (o->node || o->listen))
		die("--node and --listen only make sense with --join");
	if (o->join && !o->keys && !a->insecure)
		die("refusing to join %s and serve shards on %s " KEYLESS_REFUSED, o->join, o->listen);
	if (hwfs_tunables_load((const char *const *)a->opts, a->n_opts) < 0)
		die("bad tunable in -o (see hwfs mount --help)");
}

/*
 * The mount point @arg made ready: a dead hwfs mount there cleared, then
 * resolved (a directory, not already an hwfs mount), and the store @store
 * made.  Returns the mount point's real path (the caller frees it); dies
 * with the sentence of what is wrong.
 */
static char *mount_point(const char *arg, const char *store)
{
	struct stat st;
	char *mnt = abs_path(arg);

	if (!mnt)
		die("out of memory");
	clear_dead_mounts(mnt);
	free(mnt);
	mnt = realpath(arg, NULL);
	if (!mnt || stat(mnt, &st) < 0 || !S_ISDIR(st.st_mode))
		die("mount point %s: %s", arg, mnt ? "not a directory" : strerror(errno));
	if (mount_pid(mnt) >= 0)
		die("%s is already an hwfs mount", mnt);
	if (mkdir(store, 0700) < 0 && errno != EEXIST)
		die("store %s: %s", store, strerror(errno));
	return mnt;
}

int cmd_mount(int argc, char **argv)
{
	struct mount_args a = {.o = {.notify_fd = -1, .ctl_gid = -1}};
	struct daemon_opts *o = &a.o;
	char *mnt, buf[4096], *keys = NULL;
	int c;

	if (mount_parse(argc, argv, &a))
		return 0;
	mount_check(&a);
	mnt = mount_point(argv[optind], a.store);
	o->mountpoint = mnt;
	o->store = a.store;
	if (a.fg) {
		c = daemon_run(o) < 0 ? 1 : 0;
		free(mnt);
		return c;
	}

	{
		struct mount_run m = {o, mnt, realpath(a.store, NULL)};

		if (!m.store)
			die("store %s: %s", a.store, strerror(errno));
		o->store = m.store;
		if (o->keys && !(o->keys = keys = realpath(o->keys, NULL)))
			die("keys: %s", strerror(errno));
		snprintf(buf, sizeof(buf), "%s/hwfs.log", m.store);
		spawn_daemon(buf, run_mount, &m, "daemon");
		free(m.store);
	}
	free(keys);
	free(mnt);
	return 0;
}

int cmd_umount(int argc, char **argv)
{
	static const char usage[] = "hwfs umount MOUNTPOINT";
	char *mnt;
	pid_t pid;

	if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		printf("usage: %s\n", usage);
		return 0;
	}
	if (argc != 2)
		usage_die(usage);
	mnt = abs_path(argv[1]);
	if (!mnt)
		die("out of memory");
	pid = mount_pid(mnt);
	if (!mounted_as(mnt, NULL)) {
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
