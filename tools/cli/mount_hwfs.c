/*
 * mount_hwfs.c — `mount.hwfs`, the mount(8) helper (`mount -t hwfs`, fstab).
 *
 * mount(8) runs it as `mount.hwfs STORE_DIR MOUNTPOINT [-sfnv] [-o OPTIONS]`.
 * It is the `hwfs` binary itself under another name (build/mount.hwfs and
 * /sbin/mount.hwfs are links to it): main() in hwfs.c hands over here when
 * argv[0]'s base name is "mount.hwfs".  The options become `hwfs mount`
 * flags (see mount_opts[] and docs/operations.md), then cmd_mount() runs as
 * if typed: it returns only after the daemon reported its FUSE session
 * initialised, and this helper also checks that the mount answers (the root's
 * user.hwfs.pid) before it exits 0.  Any failure is one line on stderr and a
 * non-zero exit.  `umount MOUNTPOINT` needs no helper: the daemon sees its
 * session end and shuts down cleanly.
 *
 * Idempotent (issue 26): `mount -a` skips what mountinfo shows mounted, but
 * an hwfs mount's source there is `hwfs:STORE` while fstab says `STORE`, so
 * mount(8) runs the helper again; a mount point that is already a live hwfs
 * mount of the same store is then a note and exit 0 (it was exit 32, "already
 * an hwfs mount").  Another store there still fails, naming it.
 *
 * Several -o are joined, as mount(8) joins its own.  The arguments handed to
 * cmd_mount() are an array sized from the options given (each option is at
 * most two arguments), not a fixed one: an fstab line of any length cannot
 * write past it.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "hwfs_cli.h"
#include "tunables.h"

/* A mount option that becomes a `hwfs mount` flag: NAME=VALUE -> --flag VALUE, NAME -> --flag. */
static const struct {
	const char *name;
	const char *flag;
	int has_value;
} mount_opts[] = {
	{"capacity", "--capacity", 1},   {"join", "--join", 1},
	{"node", "--node", 1},           {"listen", "--listen", 1},
	{"keys", "--keys", 1},           {"http", "--http", 1},
	{"http_host", "--http-host", 1}, {"http-host", "--http-host", 1},
	{"coordinator", "--coordinator", 1}, {"ctl_group", "--ctl-group", 1},
	{"ctl-group", "--ctl-group", 1}, {"pin", "--pin", 0},
	{"preallocate", "--preallocate", 0}, {"insecure", "--insecure", 0},
};

/* Options of mount(8), fstab and systemd that mean nothing to hwfs: accepted and dropped. */
static int dropped(const char *o)
{
	static const char *const names[] = {"_netdev", "nofail", "noauto", "auto", "user",
					    "nouser", "users", "owner", "group", "rw", "defaults",
					    "dev", "nodev", "suid", "nosuid", "exec", "noexec",
					    "atime", "noatime", "relatime", "strictatime", "async"};

	if (!strncmp(o, "x-", 2) || !strncmp(o, "comment=", 8))
		return 1;
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(names); i++)
		if (!strcmp(o, names[i]))
			return 1;
	return 0;
}

/* Is @o NAME=VALUE with NAME a tunable (hwfs mount -o NAME=VALUE)? */
static int is_tunable(const char *o)
{
	const char *eq = strchr(o, '=');
	char name[64];

	if (!eq || (size_t)(eq - o) >= sizeof(name))
		return 0;
	memcpy(name, o, (size_t)(eq - o));
	name[eq - o] = '\0';
	return hwfs_tunable_known(name);
}

/* Wait (up to 5 s) until @mnt answers the daemon's user.hwfs.pid.  0 or -1. */
static int answers(const char *mnt)
{
	char buf[32];

	for (int i = 0; i < 500; i++) {
		struct timespec ts = {0, 10 * 1000 * 1000};

		if (getxattr(mnt, "user.hwfs.pid", buf, sizeof(buf)) > 0)
			return 0;
		nanosleep(&ts, NULL);
	}
	return -1;
}

/*
 * already_mounted() - whether @mnt is already a live hwfs mount of @store:
 * 1 (the note printed), 0 when it is not an hwfs mount (or a dead one, which
 * cmd_mount() clears); another store there dies, naming both.
 */
static int already_mounted(const char *store, const char *mnt)
{
	char *m = realpath(mnt, NULL), *s = realpath(store, NULL), src[4096], pid[32];
	int r = 0;

	if (!m || !hwfs_mount_source(m, HWFS_FSTYPE, src, sizeof(src)) ||
	    getxattr(m, "user.hwfs.pid", pid, sizeof(pid)) <= 0)
		goto out;
	if (strncmp(src, "hwfs:", 5) || !s || strcmp(src + 5, s))
		die("mount.hwfs: %s is already an hwfs mount of %s, not of %s", m,
		    strncmp(src, "hwfs:", 5) ? src : src + 5, s ? s : store);
	fprintf(stderr, "mount.hwfs: %s is already mounted from %s; nothing to do\n", m, s);
	r = 1;
out:
	free(m);
	free(s);
	return r;
}

/*
 * Append @o (one -o's list) to *@opts, joined by ',' (*@opts NULL: none yet).
 * Dies without memory.
 */
static void add_opts(char **opts, const char *o)
{
	char *j = NULL;

	if (asprintf(&j, "%s%s%s", *opts ? *opts : "", *opts ? "," : "", o) < 0)
		die("out of memory");
	free(*opts);
	*opts = j;
}

/*
 * mount_helper_main() - main() of `mount.hwfs STORE_DIR MOUNTPOINT [-sfnv]
 * [-o OPTIONS]...`: the options as `hwfs mount` flags, then cmd_mount() (not
 * with -f).  Returns cmd_mount()'s exit status; dies with one line on a bad
 * option or a mount that does not answer.
 */
int mount_helper_main(int argc, char **argv)
{
	static const char usage[] = "mount.hwfs STORE_DIR MOUNTPOINT [-sfnv] [-o OPTIONS]";
	char **av, *opts = NULL, *tun = NULL, *save = NULL, *pos[2] = {NULL, NULL};
	size_t tlen = 0, nopt = 1;
	int ac = 0, npos = 0, fake = 0, r;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-o") && i + 1 < argc) {
			add_opts(&opts, argv[++i]);
		} else if (!strncmp(argv[i], "-o", 2) && argv[i][2]) {
			add_opts(&opts, argv[i] + 2);
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			printf("usage: %s\n(options: docs/operations.md, man mount.hwfs)\n", usage);
			return 0;
		} else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
			i++; /* the type: hwfs, whatever mount(8) says */
		} else if (argv[i][0] == '-') {
			/* -s sloppy, -n no mtab, -v verbose: nothing to do; -f fake: do nothing */
			if (strchr(argv[i], 'f'))
				fake = 1;
			if (argv[i][1] == 'N') /* -N NAMESPACE: not supported */
				die("mount.hwfs: -N (mount namespaces) is not supported");
		} else if (npos < 2) {
			pos[npos++] = argv[i];
		} else {
			usage_die(usage);
		}
	}
	if (npos != 2)
		usage_die(usage);
	for (const char *c = opts; c && *c; c++)
		nopt += *c == ',';
	/* "mount MNT --store DIR", two per option at most, "-o TUNABLES", NULL */
	av = calloc(4 + 2 * nopt + 3, sizeof(*av));
	if (!av)
		die("out of memory");
	av[ac++] = "mount";
	av[ac++] = pos[1];
	av[ac++] = "--store";
	av[ac++] = pos[0];
	for (char *o = opts ? strtok_r(opts, ",", &save) : NULL; o; o = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(o, '=');
		size_t n = eq ? (size_t)(eq - o) : strlen(o);
		int done = 0;

		if (dropped(o))
			continue;
		if (!strcmp(o, "ro"))
			die("mount.hwfs: ro is not supported (versions are read-only once sealed)");
		for (size_t k = 0; k < HWFS_ARRAY_SIZE(mount_opts) && !done; k++) {
			if (strlen(mount_opts[k].name) != n || strncmp(o, mount_opts[k].name, n))
				continue;
			if (mount_opts[k].has_value != !!eq)
				die("mount.hwfs: option %s %s", mount_opts[k].name,
				    eq ? "takes no value" : "needs a value (NAME=VALUE)");
			av[ac++] = (char *)mount_opts[k].flag;
			if (eq)
				av[ac++] = eq + 1;
			done = 1;
		}
		if (done)
			continue;
		if (!is_tunable(o))
			die("mount.hwfs: unknown option %s (see man mount.hwfs)", o);
		/* tunables go on as one -o NAME=VALUE,... */
		tun = realloc(tun, tlen + strlen(o) + 2);
		if (!tun)
			die("out of memory");
		tlen += (size_t)sprintf(tun + tlen, "%s%s", tlen ? "," : "", o);
	}
	if (tun) {
		av[ac++] = "-o";
		av[ac++] = tun;
	}
	av[ac] = NULL;
	if (!fake && already_mounted(pos[0], pos[1])) {
		free(av);
		free(opts);
		free(tun);
		return 0;
	}
	r = fake ? 0 : cmd_mount(ac, av);
	if (!fake && r == 0 && answers(pos[1]) < 0)
		die("mount.hwfs: %s was mounted but does not answer", pos[1]);
	free(av);
	free(opts);
	free(tun);
	return r;
}
