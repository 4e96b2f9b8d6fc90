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
 */
#define _GNU_SOURCE
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

int mount_helper_main(int argc, char **argv)
{
	static const char usage[] = "mount.hwfs STORE_DIR MOUNTPOINT [-sfnv] [-o OPTIONS]";
	char *av[256], *opts = NULL, *tun = NULL, *save = NULL, *pos[2] = {NULL, NULL};
	size_t tlen = 0;
	int ac = 0, npos = 0, fake = 0, r;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-o") && i + 1 < argc) {
			opts = argv[++i];
		} else if (!strncmp(argv[i], "-o", 2) && argv[i][2]) {
			opts = argv[i] + 2;
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
	av[ac++] = "mount";
	av[ac++] = pos[1];
	av[ac++] = "--store";
	av[ac++] = pos[0];
	opts = opts ? strdup(opts) : NULL;
	for (char *o = opts ? strtok_r(opts, ",", &save) : NULL; o; o = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(o, '=');
		size_t n = eq ? (size_t)(eq - o) : strlen(o);
		int done = 0;

		if (ac > (int)HWFS_ARRAY_SIZE(av) - 4)
			die("mount.hwfs: too many options");
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
	r = fake ? 0 : cmd_mount(ac, av);
	if (!fake && r == 0 && answers(pos[1]) < 0)
		die("mount.hwfs: %s was mounted but does not answer", pos[1]);
	free(opts);
	free(tun);
	return r;
}
