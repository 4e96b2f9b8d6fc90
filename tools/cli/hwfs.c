/*
 * hwfs.c — the `hwfs` command: one binary, one verb per subcommand.  This
 * file holds main(), the table of verbs (verbs[] at the bottom: the one place
 * that names a verb, its function and its line in `hwfs --help`), the
 * channel to a mount's daemon and the client verbs but `hwfs status`
 * (hwfs_status.c; what the two share is hwfs_client.h); starting and
 * stopping daemons (mount, umount, coord, keygen) is in hwfs_launch.c, and
 * what all of them share is declared in hwfs_cli.h.  build/hwfs is this
 * file and hwfs_status.c (with libhwfs): a verb of another file is run by
 * build/hwfs-core, the whole program beside it (run_core(); hwfs_cli.h says
 * why).
 *
 * `hwfs mount` starts a daemon (fs/daemon/daemon.c) and returns once the mount
 * answers; every other verb asks the daemon of a mount through libhwfs
 * (include/hwfs.h: hwfs_open finds it by the root xattr `user.hwfs.control`,
 * hwfs_call sends one request of the JSON-lines protocol of ctl.h), and
 * `hwfs watch` (hwfs_watch.c) follows its events.  Output is for people by
 * default and the daemon's JSON with --json.  Exit status: 0 on success, 1
 * with one `hwfs: error:` line on stderr otherwise, 2 for usage errors.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <time.h>
#include <unistd.h>

#include "hwfs_api.h" /* first: the public API beside hwfs_common.h */
#include "hwfs_cli.h"
#include "hwfs_client.h"
#include "names.h"

#ifndef HWFS_VERSION /* the Makefile's LIBHWFS_VERSION, passed with -D */
#define HWFS_VERSION "unknown"
#endif

static const char *g_mount;
int cli_json;         /* --json (hwfs_client.h) */
static int g_local;   /* commit --local */
static int g_force;   /* seal --force */
int cli_cluster;      /* status --cluster */
int cli_watch;        /* status --cluster --watch */
static int g_elements; /* diff --elements */
static const char *g_gpu; /* load/unload --gpu N (as given: checked by gpu_arg()) */

void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "hwfs: error: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

void usage_die(const char *usage)
{
	fprintf(stderr, "usage: %s\n", usage);
	exit(2);
}

static const char *default_mount(void)
{
	const char *m = secure_getenv("HWFS_MOUNT");

	return m && *m ? m : "/hotweights";
}

/*
 * @s as it may be printed: hwfs_clean_text() blanks its control characters,
 * so a tensor name (or a sentence quoting one) cannot move the cursor, set a
 * title or split a line.  Valid until the fourth cli_call after this one (one
 * printf may show three); "?" without memory.
 */
const char *cli_shown(const char *s)
{
	static char *ring[4];
	static unsigned k;
	char **slot = &ring[k++ % HWFS_ARRAY_SIZE(ring)];

	free(*slot);
	*slot = hwfs_clean_text(s, SIZE_MAX);
	return *slot ? *slot : "?";
}

/* ------------------------------------------------------------ the channel */

/* The progress bar of one request: when it started, whether it was drawn. */
struct progress {
	double t0;
	int tty, drawn;
};

/* libhwfs progress callback: redraw the bar on a terminal. */
static void draw_progress(void *arg, uint64_t done, uint64_t total)
{
	struct progress *p = arg;
	int width = 40, fill = total ? (int)((double)done / (double)total * width) : width;
	double dt = hwfs_mono_s() - p->t0;
	char a[32], b[32];

	if (!p->tty)
		return;
	fprintf(stderr, "\r[%.*s%*s] %s / %s  %.2f GB/s ", fill,
		"########################################", width - fill, "",
		hwfs_fmt_size(done, a, sizeof(a)), hwfs_fmt_size(total, b, sizeof(b)),
		dt > 0 ? (double)done / dt / 1e9 : 0.0);
	fflush(stderr);
	p->drawn = 1;
}

/* The handle on g_mount's daemon, opened on first use; dies when it is no hwfs mount. */
static struct hwfs *mount_handle(void)
{
	static struct hwfs *h;

	if (!h && hwfs_open(g_mount, &h) < 0)
		die("%s", hwfs_errmsg());
	return h;
}

/*
 * Send @req (stolen) through hwfs_call() and return the final answer; dies
 * when the daemon cannot be asked and, with @die_on_error, on {"ok": false}.
 */
json_t *cli_call(json_t *req, int die_on_error)
{
	struct progress p = {hwfs_mono_s(), isatty(2), 0};
	char *line = json_dumps(req, JSON_COMPACT), *reply = NULL;
	json_t *res;
	int r;

	json_decref(req);
	if (!line)
		die("out of memory");
	r = hwfs_call(mount_handle(), line, draw_progress, &p, &reply);
	free(line);
	if (p.drawn)
		fputc('\n', stderr);
	if (r < 0)
		die("%s", hwfs_errmsg());
	res = json_loads(reply, 0, NULL);
	free(reply);
	if (!res)
		die("malformed answer from the daemon");
	if (die_on_error && !json_is_true(json_object_get(res, "ok"))) {
		json_t *e = json_object_get(res, "error");
		char msg[1024];

		snprintf(msg, sizeof(msg), "%s", json_is_string(e) ? cli_shown(json_string_value(e))
								   : "request failed");
		json_decref(res); /* die() exits: nothing may stay allocated (LeakSanitizer) */
		die("%s", msg);
	}
	return res;
}

/* Print @res without its "ok", indented. */
void cli_print_json(json_t *res)
{
	json_object_del(res, "ok");
	json_dumpf(res, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	fputc('\n', stdout);
}

/* Integer member @k of @o, 0 when none. */
int64_t cli_jint(json_t *o, const char *k)
{
	return json_integer_value(json_object_get(o, k));
}

/* String member @k of @o, "-" when none. */
const char *cli_jstr(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);

	return json_is_string(v) ? json_string_value(v) : "-";
}

/* String member @k of @o as it may be printed: cli_shown(cli_jstr()). */
const char *cli_jshown(json_t *o, const char *k)
{
	return cli_shown(cli_jstr(o, k));
}

/* ------------------------------------------------------------ verbs */

/*
 * @v, when it may be a version name (hwfs_valid_name()); else die in one
 * line.  A name with a control character can name no version, and publish
 * would read the whole source before the daemon found that out.
 */
static const char *version_arg(const char *v)
{
	if (!hwfs_valid_name(v))
		die("invalid version name '%s' (1-%d bytes of UTF-8, no '/', no control "
		    "character, not . or ..)", cli_shown(v), HWFS_NAME_MAX);
	return v;
}


/* Common options of client verbs: -m, --json, --help. Returns optind. */
int cli_opts(int argc, char **argv, const char *usage, int min_args, int max_args, int *keep)
{
	static const struct option lo[] = {
		{"mount", required_argument, NULL, 'm'}, {"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},        {"keep", required_argument, NULL, 'k'},
		{"local", no_argument, NULL, 'L'},       {"cluster", no_argument, NULL, 'C'},
		{"watch", no_argument, NULL, 'W'},       {"force", no_argument, NULL, 'F'},
		{"elements", no_argument, NULL, 'E'},    {"gpu", required_argument, NULL, 'g'},
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
			cli_json = 1;
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
			cli_cluster = 1;
			break;
		case 'W':
			cli_watch = 1;
			break;
		case 'F':
			g_force = 1;
			break;
		case 'E':
			g_elements = 1;
			break;
		case 'g':
			g_gpu = optarg;
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

static int cmd_ls(int argc, char **argv)
{
	json_t *res;

	cli_opts(argc, argv, "hwfs ls [-m MOUNT] [--json]", 0, 0, NULL);
	res = cli_call(json_pack("{s:s}", "op", "ls"), 1);
	if (cli_json) {
		json_dumpf(json_object_get(res, "versions"), stdout, JSON_INDENT(2));
		fputc('\n', stdout);
	} else {
		cli_print_versions(json_object_get(res, "versions"));
	}
	json_decref(res);
	return 0;
}

static int cmd_simple(int argc, char **argv, const char *op, const char *usage,
		      const char *done_fmt)
{
	int i = cli_opts(argc, argv, usage, 1, 1, NULL);
	json_t *res = cli_call(json_pack("{s:s, s:s, s:b, s:b}", "op", op, "version",
				     version_arg(argv[i]), "local",
				     g_local, "force", g_force),
			   1);

	if (cli_json)
		cli_print_json(res);
	else
		printf(done_fmt, argv[i]);
	json_decref(res);
	return 0;
}

static int cmd_seal(int argc, char **argv)
{
	return cmd_simple(argc, argv, "seal", "hwfs seal VERSION [--force] [-m MOUNT]", "sealed %s\n");
}

static int cmd_rm(int argc, char **argv)
{
	return cmd_simple(argc, argv, "rm", "hwfs rm VERSION [-m MOUNT]", "removed %s\n");
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
	int i = cli_opts(argc, argv, "hwfs commit VERSION [--local [--force]] [-m MOUNT] [--json]",
			    1, 1, NULL);
	json_t *res = cli_call(json_pack("{s:s, s:s, s:b, s:b}", "op", "commit", "version",
				     version_arg(argv[i]), "local", g_local, "force", g_force),
			   0);
	const char *outcome = cli_jstr(res, "outcome"), *k;
	int ok = json_is_true(json_object_get(res, "ok"));
	int rc = ok ? 0 : !strcmp(outcome, "partial") ? 3 : !strcmp(outcome, "unknown") ? 4 : 1;
	json_t *v;

	if (cli_json) {
		cli_print_json(res);
	} else {
		if (ok)
			printf("current -> versions/%s\n", argv[i]);
		print_nodes("committed on", json_object_get(res, "committed"));
		json_object_foreach(json_object_get(res, "failed"), k, v)
			printf("failed on %s: %s\n", k, json_string_value(v));
		print_nodes("no answer from", json_object_get(res, "unknown"));
	}
	if (!ok)
		fprintf(stderr, "hwfs: error: %s\n", cli_jshown(res, "error"));
	json_decref(res);
	return rc;
}

static int cmd_publish(int argc, char **argv)
{
	int i = cli_opts(argc, argv, "hwfs publish SRC_DIR VERSION [-m MOUNT] [--json]", 2, 2,
			    NULL);
	const char *v = version_arg(argv[i + 1]);
	char *src = realpath(argv[i], NULL);
	double t0 = hwfs_mono_s(), dt;
	json_t *res;
	char sz[32];

	if (!src)
		die("%s: %s", argv[i], strerror(errno));
	res = cli_call(json_pack("{s:s, s:s, s:s}", "op", "publish", "src", src, "version", v), 1);
	dt = hwfs_mono_s() - t0;
	if (cli_json) {
		json_object_set_new(res, "seconds", json_real(dt));
		cli_print_json(res);
	} else {
		printf("published %s: %s in %.2f s (%.2f GB/s)\n", v,
		       hwfs_fmt_size((uint64_t)cli_jint(res, "bytes"), sz, sizeof(sz)), dt,
		       dt > 0 ? (double)cli_jint(res, "bytes") / dt / 1e9 : 0.0);
	}
	free(src);
	json_decref(res);
	return 0;
}

/*
 * The device index of --gpu N: a non-negative decimal integer (at most 1023,
 * the daemon's limit); -1 when --gpu was not given and @required is 0.  A
 * missing or malformed one is a usage error (exit 2, one line).
 */
static int gpu_arg(const char *verb, int required, const char *usage)
{
	const char *p = g_gpu;
	long n = 0;

	if (!p) {
		if (!required)
			return -1;
		fprintf(stderr, "hwfs: error: %s needs --gpu N (the device index, 0 for the first "
			"GPU)\nusage: %s\n", verb, usage);
		exit(2);
	}
	for (; *p >= '0' && *p <= '9' && n <= 1023; p++)
		n = n * 10 + (*p - '0');
	if (p == g_gpu || *p || n > 1023) {
		fprintf(stderr, "hwfs: error: %s: --gpu %s is not a device index (an integer "
			"0-1023)\nusage: %s\n", verb, g_gpu, usage);
		exit(2);
	}
	return (int)n;
}

/*
 * load: copy a sealed version into the memory of one GPU (docs/gpu.md); the
 * daemon sends progress (a bar on a terminal).  Through hwfs_call() with the
 * request of the control protocol.
 */
static int cmd_load(int argc, char **argv)
{
	static const char usage[] = "hwfs load VERSION --gpu N [-m MOUNT] [--json]";
	int i = cli_opts(argc, argv, usage, 1, 1, NULL);
	int gpu = gpu_arg("load", 1, usage);
	json_t *res = cli_call(json_pack("{s:s, s:s, s:i}", "op", "load", "version",
				     version_arg(argv[i]), "gpu", gpu),
			   1);
	double dt = json_real_value(json_object_get(res, "seconds"));
	char sz[32];

	if (cli_json) {
		cli_print_json(res);
	} else if (json_is_true(json_object_get(res, "already"))) {
		printf("%s is loaded on GPU %d already (%s in %lld buckets)\n", argv[i], gpu,
		       hwfs_fmt_size((uint64_t)cli_jint(res, "bytes"), sz, sizeof(sz)),
		       (long long)cli_jint(res, "buckets"));
	} else {
		printf("loaded %s on GPU %d: %s, %lld tensors in %lld buckets, %.2f s (%.2f GB/s "
		       "from %s memory)\n", argv[i], gpu,
		       hwfs_fmt_size((uint64_t)cli_jint(res, "bytes"), sz, sizeof(sz)),
		       (long long)cli_jint(res, "tensors"), (long long)cli_jint(res, "buckets"), dt,
		       dt > 0 ? (double)cli_jint(res, "bytes") / dt / 1e9 : 0.0, cli_jstr(res, "source"));
	}
	json_decref(res);
	return 0;
}

/* unload: free a version's device copy on one GPU (--gpu N) or on every one. */
static int cmd_unload(int argc, char **argv)
{
	static const char usage[] = "hwfs unload VERSION [--gpu N] [-m MOUNT] [--json]";
	int i = cli_opts(argc, argv, usage, 1, 1, NULL);
	int gpu = gpu_arg("unload", 0, usage);
	json_t *res = cli_call(json_pack("{s:s, s:s, s:i}", "op", "unload", "version",
				     version_arg(argv[i]), "gpu", gpu),
			   1);
	char sz[32], where[32] = "every GPU";

	if (gpu >= 0)
		snprintf(where, sizeof(where), "GPU %d", gpu);
	if (cli_json) {
		cli_print_json(res);
	} else {
		printf("unloaded %s from %s: %s freed", argv[i], where,
		       hwfs_fmt_size((uint64_t)cli_jint(res, "freed_bytes"), sz, sizeof(sz)));
		if (cli_jint(res, "pending_maps"))
			printf(", the rest when its %lld open map(s) close",
			       (long long)cli_jint(res, "pending_maps"));
		printf("\n");
	}
	json_decref(res);
	return 0;
}

static int cmd_verify(int argc, char **argv)
{
	int i = cli_opts(argc, argv, "hwfs verify VERSION [-m MOUNT] [--json]", 1, 1, NULL);
	json_t *res = cli_call(json_pack("{s:s, s:s}", "op", "verify", "version", version_arg(argv[i])),
			   1);
	int intact = json_is_true(json_object_get(res, "intact"));
	char sz[32];

	if (cli_json)
		cli_print_json(res);
	else if (intact)
		printf("%s: intact (%lld shards, %s re-hashed)\n", argv[i],
		       (long long)cli_jint(res, "shards"),
		       hwfs_fmt_size((uint64_t)cli_jint(res, "bytes"), sz, sizeof(sz)));
	if (!intact)
		fprintf(stderr, "hwfs: error: %s is damaged: %zu of %lld shards do not match their hash\n",
			argv[i], json_array_size(json_object_get(res, "bad")),
			(long long)cli_jint(res, "shards"));
	json_decref(res);
	return intact ? 0 : 1;
}

static int cmd_gc(int argc, char **argv)
{
	int keep = -1;
	json_t *res, *v;
	size_t k;

	cli_opts(argc, argv, "hwfs gc --keep N [-m MOUNT] [--json]", 0, 0, &keep);
	if (keep < 0)
		usage_die("hwfs gc --keep N [-m MOUNT] [--json]");
	res = cli_call(json_pack("{s:s, s:i}", "op", "gc", "keep", keep), 1);
	if (cli_json)
		cli_print_json(res);
	else
		json_array_foreach(json_object_get(res, "removed"), k, v)
			printf("removed %s\n", json_string_value(v));
	json_decref(res);
	return 0;
}

/* "12.34%" of @f (a fraction) into @buf; returns @buf. */
static const char *pct(double f, char *buf, size_t len)
{
	snprintf(buf, len, "%.2f%%", f * 100.0);
	return buf;
}

/*
 * diff --elements: one line per changed tensor of B (identical ones are only
 * counted), then the total: elements changed, bytes of B and what a node
 * holding A would receive with deltas.
 */
static void print_diff_elements(const char *a, const char *b, json_t *res)
{
	json_t *tot = json_object_get(res, "total"), *t;
	char s1[32], s2[32], p1[32], p2[32];
	size_t k;

	printf("%s -> %s: %lld of %lld tensors changed, %lld identical, %lld removed\n", a, b,
	       (long long)cli_jint(tot, "tensors_changed"), (long long)cli_jint(tot, "tensors"),
	       (long long)cli_jint(tot, "tensors_identical"), (long long)cli_jint(tot, "tensors_removed"));
	if (cli_jint(tot, "tensors_changed"))
		printf("%-24s %-32s %-8s %12s %12s %8s %11s %11s  %s\n", "FILE", "TENSOR", "DTYPE",
		       "ELEMENTS", "CHANGED", "FRACTION", "BYTES", "DELTA", "BASE");
	json_array_foreach(json_object_get(res, "tensors"), k, t) {
		int matched = json_is_true(json_object_get(t, "matched"));

		if (matched && !cli_jint(t, "changed_elements"))
			continue;
		printf("%-24s %-32s %-8s %12lld %12lld %8s %11s %11s  %s\n", cli_jshown(t, "file"),
		       cli_jshown(t, "tensor"), cli_jshown(t, "dtype"), (long long)cli_jint(t, "elements"),
		       (long long)cli_jint(t, "changed_elements"),
		       pct(json_real_value(json_object_get(t, "changed_fraction")), p1, sizeof(p1)),
		       hwfs_fmt_size((uint64_t)cli_jint(t, "bytes"), s1, sizeof(s1)),
		       hwfs_fmt_size((uint64_t)cli_jint(t, "delta_bytes"), s2, sizeof(s2)),
		       matched ? "A" : "none");
	}
	printf("total: %lld of %lld elements changed (%s); %s in B, %s to send with deltas (%s)\n",
	       (long long)cli_jint(tot, "changed_elements"), (long long)cli_jint(tot, "elements"),
	       pct(json_real_value(json_object_get(tot, "changed_fraction")), p1, sizeof(p1)),
	       hwfs_fmt_size((uint64_t)cli_jint(tot, "bytes"), s1, sizeof(s1)),
	       hwfs_fmt_size((uint64_t)cli_jint(tot, "delta_bytes"), s2, sizeof(s2)),
	       pct(json_real_value(json_object_get(tot, "delta_ratio")), p2, sizeof(p2)));
}

static int cmd_diff(int argc, char **argv)
{
	int i = cli_opts(argc, argv, "hwfs diff A B [--elements] [-m MOUNT] [--json]", 2, 2,
			    NULL);
	json_t *res = cli_call(json_pack("{s:s, s:s, s:s, s:b}", "op", "diff", "a",
				     version_arg(argv[i]), "b", version_arg(argv[i + 1]), "elements",
				     g_elements),
			   1);
	char a[32], b[32];
	json_t *v;
	size_t k;

	if (cli_json) {
		cli_print_json(res);
	} else if (g_elements) {
		print_diff_elements(argv[i], argv[i + 1], res);
	} else {
		printf("%s -> %s: %lld tensors changed, %lld added, %lld removed, %lld same\n",
		       argv[i], argv[i + 1], (long long)cli_jint(res, "tensors_changed"),
		       (long long)cli_jint(res, "tensors_added"), (long long)cli_jint(res, "tensors_removed"),
		       (long long)cli_jint(res, "tensors_same"));
		printf("bytes in changed or added tensors: %s; new shard bytes: %s\n",
		       hwfs_fmt_size((uint64_t)cli_jint(res, "bytes_changed"), a, sizeof(a)),
		       hwfs_fmt_size((uint64_t)cli_jint(res, "new_shard_bytes"), b, sizeof(b)));
		json_array_foreach(json_object_get(res, "changed"), k, v)
			printf("  ~ %s\n", cli_shown(json_string_value(v)));
		json_array_foreach(json_object_get(res, "added"), k, v)
			printf("  + %s\n", cli_shown(json_string_value(v)));
		json_array_foreach(json_object_get(res, "removed"), k, v)
			printf("  - %s\n", cli_shown(json_string_value(v)));
	}
	json_decref(res);
	return 0;
}

/*
 * Print @m, a canonical manifest from the daemon, on @f with a newline: byte
 * for byte, except that a control character, which JSON allows raw in a
 * string when it is DEL or C1 (U+0080-U+009F: a tensor name's CSI, 0xC2 0x9B,
 * is one) and a terminal obeys, is written as its JSON escape \u00NN (upper
 * case hex, as jansson writes C0; C0 too, which a daemon never sends raw).
 * The output parses to the same JSON; its bytes are those the digest is over
 * unless a name holds such a character.
 */
static void print_manifest(FILE *f, const char *m)
{
	for (const unsigned char *p = (const unsigned char *)m; *p; p++) {
		if (*p < 0x20 || *p == 0x7f)
			fprintf(f, "\\u%04X", *p);
		else if (p[0] == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F)
			fprintf(f, "\\u%04X", *++p);
		else
			fputc(*p, f);
	}
	fputc('\n', f);
}

static int cmd_manifest(int argc, char **argv)
{
	int i = cli_opts(argc, argv, "hwfs manifest VERSION [-m MOUNT]", 1, 1, NULL);
	json_t *res = cli_call(json_pack("{s:s, s:s}", "op", "manifest", "version",
				     version_arg(argv[i])),
			   1);

	print_manifest(stdout, cli_jstr(res, "manifest"));
	json_decref(res);
	return 0;
}

/* ------------------------------------------------------------ main */

/*
 * Every verb, in the order of `hwfs --help`: its function, and its argument
 * summary and one-line description there (a NULL summary: an alias, not
 * listed).  Adding a verb is one row.
 */
static const struct verb {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *args, *summary;
} verbs[] = {
	{"mount", cmd_mount, "MOUNTPOINT --store DIR [--capacity SIZE] [--preallocate] [-f]",
	 "mount a node"},
	{"umount", cmd_umount, "MOUNTPOINT", "unmount cleanly"},
	{"unmount", cmd_umount, NULL, NULL},
	{"status", cmd_status, "[--json]", "daemon, store, versions"},
	{"ls", cmd_ls, "[--json]", "versions"},
	{"seal", cmd_seal, "V [--force]", "make V immutable"},
	{"publish", cmd_publish, "SRC_DIR V", "import a directory as V"},
	{"commit", cmd_commit, "V", "point current at V"},
	{"diff", cmd_diff, "A B [--elements] [--json]", "tensors (or elements) that differ"},
	{"verify", cmd_verify, "V [--json]", "re-hash every shard of V"},
	{"rm", cmd_rm, "V", "remove V"},
	{"gc", cmd_gc, "--keep N", "keep N newest versions"},
	{"manifest", cmd_manifest, "V", "print V's manifest"},
	{"load", cmd_load, "V --gpu N [--json]", "copy V into GPU N's memory"},
	{"unload", cmd_unload, "V [--gpu N]", "free V's copy on GPU N (or every GPU)"},
	{"watch", cmd_watch, "[--engine NAME] [--on-arrive CMD] [--on-commit CMD]",
	 "follow events; run hooks; be an engine"},
	{"coord", cmd_coord, "--listen tcp://HOST:PORT [--state DIR]", "run a coordinator"},
	{"keygen", cmd_keygen, "DIR", "make a CURVE key pair"},
	{"sim", cmd_sim, "[--nodes N] [--size B] [--link R] [--json] ...",
	 "simulate replication (docs/sim.md)"},
};

#define USAGE_COL 54 /* width of the "VERB ARGS" column of `hwfs --help` */

/* Print `hwfs --help` to @f: one line per listed row of verbs[], then the notes. */
static void usage_all(FILE *f)
{
	fprintf(f, "usage: hwfs VERB [ARGS] [-m MOUNT] [--json]\n\n");
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(verbs); i++) {
		char left[256];

		if (!verbs[i].summary)
			continue;
		snprintf(left, sizeof(left), "%s %s", verbs[i].name, verbs[i].args);
		if (strlen(left) < USAGE_COL)
			fprintf(f, "  %-*s%s\n", USAGE_COL, left, verbs[i].summary);
		else
			fprintf(f, "  %s\n  %-*s%s\n", left, USAGE_COL, "", verbs[i].summary);
	}
	fprintf(f,
		"\n"
		"A node joins a cluster with: hwfs mount ... --join tcp://COORD:PORT --node NAME\n"
		"--listen tcp://HOST:PORT; then commit is cluster-wide (--local: this node only)\n"
		"and status --cluster shows every node.\n\n"
		"MOUNT defaults to $HWFS_MOUNT, else /hotweights. hwfs --version prints the version.\n");
}

/*
 * run_core() - hand the whole command (@argv as main() got it: argv[0] is
 * kept, so mount.hwfs stays mount(8)'s helper) to build/hwfs-core, the
 * program beside this one's executable that has every verb.  Returns only on
 * failure, by dying.
 */
static __attribute__((noreturn)) void run_core(char **argv)
{
	char exe[PATH_MAX], core[PATH_MAX + 16];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n < 0)
		die("cannot find this program (/proc/self/exe): %s", strerror(errno));
	exe[n] = '\0';
	snprintf(core, sizeof(core), "%s/hwfs-core", dirname(exe));
	execv(core, argv);
	die("cannot run %s: %s", core, strerror(errno));
}

/*
 * Was this program started with privileges its caller does not have: setuid,
 * setgid, or file capabilities (AT_SECURE)?  hwfs takes its mount, its store,
 * hooks and tunables from its caller's arguments and environment, so under a
 * set-id bit any user could make it mount, unmount or publish as root.  It is
 * run by root or by the user it acts for, never set-id.  Returns 1 or 0.
 */
static int set_id(void)
{
	return getauxval(AT_SECURE) || getuid() != geteuid() || getgid() != getegid();
}

int main(int argc, char **argv)
{
	const char *verb = argc > 1 ? argv[1] : NULL;
	const char *self = strrchr(argv[0], '/');

	if (set_id()) {
		fprintf(stderr, "hwfs: error: refusing to run setuid or setgid (uid %u, euid %u, gid %u, "
			"egid %u): run hwfs as the user it acts for\n", (unsigned)getuid(),
			(unsigned)geteuid(), (unsigned)getgid(), (unsigned)getegid());
		return 1;
	}
	if (!strcmp(self ? self + 1 : argv[0], "mount.hwfs")) { /* mount(8)'s helper */
		if (!mount_helper_main)
			run_core(argv);
		return mount_helper_main(argc, argv);
	}
	if (verb && !strcmp(verb, "--version")) {
		/* the core verbs are linked into build/hwfs-core only (hwfs_cli.h) */
		printf("%s %s\n", cmd_mount ? "hwfs-core" : "hwfs", HWFS_VERSION);
		return 0;
	}
	if (!verb || !strcmp(verb, "--help") || !strcmp(verb, "-h") || !strcmp(verb, "help")) {
		usage_all(verb ? stdout : stderr);
		return verb ? 0 : 2;
	}
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(verbs); i++) {
		if (strcmp(verb, verbs[i].name))
			continue;
		if (!verbs[i].fn) /* a verb of build/hwfs-core (hwfs_cli.h) */
			run_core(argv);
		return verbs[i].fn(argc - 1, argv + 1);
	}
	fprintf(stderr, "hwfs: error: unknown verb '%s'\n", verb);
	usage_all(stderr);
	return 2;
}
